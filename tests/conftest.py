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


# --------------------------------------------------------------------------- #
# One closed #3a (and one #3a paused at its first approval), built once per test run and shared
#
# A replay `kinv run plans/3a-attention-occupancy.yaml --approval auto` takes about a minute on 2 cores; the
# tests that only read what such a run leaves (report, export, views, show, compare, history, status, todos, the
# MCP server's reads, the doctor) share one, each on a copy of its own.  Under pytest-xdist the workers share
# it too: the first to need it builds it under a lock in the run's own temporary root, the others wait for it.

PLAN_3A = "plans/3a-attention-occupancy.yaml"


def _build_state(where, approval: str, want_rc: int):
    """A state dir and live-config dir that a replay run of #3a under ``approval`` left (exit ``want_rc``)."""
    import subprocess
    import sys

    from tests.utils import ROOT, replay_env

    where.mkdir(parents=True, exist_ok=True)
    env = replay_env(where, where / "state")
    r = subprocess.run([sys.executable, "-m", "kinv.agent.cli", "run", PLAN_3A, "--backend", "replay",
                        "--approval", approval], env=env, cwd=ROOT, capture_output=True, text=True, timeout=1200)  # fmt: skip
    if r.returncode != want_rc:
        raise RuntimeError(f"the shared #3a run under --approval {approval} exited {r.returncode}, not {want_rc}:\n"
                           f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}")  # fmt: skip
    (where / "run.out").write_text(r.stdout)
    (where / "done").write_text("ok")


def _shared(tmp_path_factory, request, name: str, approval: str, want_rc: int):
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    if getattr(request.config, "workerinput", None) is not None:  # xdist: <run root>/popen-gwN
        root = root.parent  # this run's own root, shared by its workers (never another run's)
    where = root / name
    with FileLock(str(root / f"{name}.lock")):
        if not (where / "done").exists():
            _build_state(where, approval, want_rc)
    return where


def _copy(source, tmp_path, state_dir) -> str:
    import shutil

    shutil.copytree(source / "state", state_dir, symlinks=True)
    shutil.copytree(source / "configs", tmp_path / "configs", dirs_exist_ok=True)
    return (source / "run.out").read_text()


@pytest.fixture(scope="session")
def closed_3a_source(tmp_path_factory, request):
    """The shared closed #3a (--approval auto).  Never write to it: ``closed_3a`` gives a copy."""
    return _shared(tmp_path_factory, request, "closed-3a", "auto", 0)


@pytest.fixture(scope="session")
def paused_3a_source(tmp_path_factory, request):
    """The shared #3a paused at V1's approval (--approval ask).  Never write to it: ``paused_3a`` gives a copy."""
    return _shared(tmp_path_factory, request, "paused-3a", "ask", 3)


@pytest.fixture
def closed_3a(closed_3a_source, tmp_path, state_dir):
    """This test's own copy of a closed replay run of #3a: its state dir is ``state_dir`` and its live config dir
    ``tmp_path / "configs"``, where tests.utils.replay_env puts them, so ``replay_env(tmp_path, state_dir)``
    reads it.  Returns what the run printed.  For reading what a run leaves; a test about the run itself runs
    one (and is slow)."""
    return _copy(closed_3a_source, tmp_path, state_dir)


@pytest.fixture
def paused_3a(paused_3a_source, tmp_path, state_dir):
    """This test's own copy of a replay run of #3a paused at V1's approval (exit 3), as ``closed_3a``.  Its
    checkpoints name the source's paths: never resume it (a test that resumes runs its own)."""
    return _copy(paused_3a_source, tmp_path, state_dir)
