"""Test set-up shared by every test.

- GPU tests carry ``@pytest.mark.gpu`` and are skipped, in this one place,
  when no CUDA device is visible.  Without a GPU, Triton kernels run in the
  interpreter (TRITON_INTERPRET=1), set here before triton is imported.
- Every test gets a temporary state dir through KINV_STATE_DIR.
"""

from __future__ import annotations

import os

import pytest


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


HAS_GPU = _has_gpu()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped without one)")


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="no CUDA GPU visible")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch):
    """A fresh, empty kinv state dir for every test."""
    d = tmp_path / "state"
    monkeypatch.setenv("KINV_STATE_DIR", str(d))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg-state"))  # kinv's kept copies of files of record
    return d
