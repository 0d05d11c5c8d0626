"""A Triton tiled matmul as a kinv plugin (see adapter.py and adapter_autotune.py)."""
