"""kinv adapters for Triton kernels that ship inside PyTorch: imported from the installed torch, never copied."""
