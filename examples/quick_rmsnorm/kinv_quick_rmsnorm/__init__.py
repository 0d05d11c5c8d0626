"""A Triton row-wise RMSNorm as a kinv plugin (see adapter.py): a small, memory-bound kernel."""
