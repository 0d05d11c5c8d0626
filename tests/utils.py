"""Helpers shared by tests."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def assert_verbose_allclose(actual, expected, atol: float, rtol: float, max_print: int = 5) -> None:
    """allclose that says how many elements differ, where, and by how much."""
    import torch

    actual = actual.float().cpu()
    expected = expected.float().cpu()
    assert actual.shape == expected.shape, f"shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    nonfinite = ~torch.isfinite(actual)
    diff = (actual - expected).abs()
    bad = (diff > atol + rtol * expected.abs()) | nonfinite
    if bad.any():
        idx = bad.nonzero()[:max_print].tolist()
        where = "; ".join(
            f"{tuple(i)}: got {actual[tuple(i)].item():.5g} want {expected[tuple(i)].item():.5g}" for i in idx
        )
        raise AssertionError(
            f"{int(bad.sum())} of {bad.numel()} elements differ (max abs diff {diff.max().item():.3g}, "
            f"{int(nonfinite.sum())} non-finite); first: {where}"
        )


# The live MLA config these tests start from: the seed's BT16/w4/s2, the file #3a-#3c, #6a-b and campaign 7 were
# written against (kinv ships #8b's config; those plans measure the seed's from the plan).
SEED_MLA_CONFIG = ('{\n  "kernel": "mla_decode",\n  "description": "Baseline of workstream #3a (the seed\'s BT16/w4/s2).",\n'
                   '  "BLOCK_T": 16,\n  "BLOCK_H": 16,\n  "num_warps": 4,\n  "num_stages": 2\n}\n')


def write_seed_config(cfg_dir) -> None:
    """A live MLA config file at the seed's BT16/w4/s2 in ``cfg_dir``."""
    from pathlib import Path

    (Path(cfg_dir) / "mla_decode.json").write_text(SEED_MLA_CONFIG)


def project_copy(where) -> tuple[Path, str]:
    """A copy of the project's kernels/, kinv/ and plans/ in ``where`` and the PYTHONPATH that runs kinv from it:
    its ``kinv.kernels`` is the copy's (kinv/__init__.py), so a source patch a run plants (the fault drill's)
    lands in the copy, never in this checkout, and the test can run beside any other.  Run kinv there as a
    subprocess (``run_kinv(..., cwd=root)``): an in-process command imports this checkout's kernels."""
    import os
    import shutil

    root = Path(where)
    root.mkdir(parents=True, exist_ok=True)
    skip = shutil.ignore_patterns("__pycache__", "*.kinv-lock")
    for sub in ("kernels", "kinv", "plans"):
        shutil.copytree(ROOT / sub, root / sub, ignore=skip, dirs_exist_ok=True)
    return root, os.pathsep.join([str(root), str(ROOT)])


def replay_env(tmp_path, state_dir, *, seed_config: bool = True, **extra) -> dict:
    """Environment for a `kinv` subprocess on replay: its own state dir and a live MLA config at the seed's
    (``seed_config=False``: the live config dir as it is, a copied run's)."""
    import os
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    cfg_dir = Path(tmp_path) / "configs"
    cfg_dir.mkdir(exist_ok=True)
    if seed_config:
        write_seed_config(cfg_dir)
    env = dict(os.environ, KINV_STATE_DIR=str(state_dir), KINV_CONFIG_DIR=str(cfg_dir), TRITON_INTERPRET="1",
               KINV_FORCE_NO_GPU="1", PYTHONPATH=str(root))  # fmt: skip
    env.update(extra)  # PYTHONPATH too: a copy of the project first (project_copy)
    return env


def run_kinv(env: dict, *args, timeout: float = 300, cwd=None):
    """`python3 -m kinv.agent.cli.app ARGS` in a subprocess (from the project root unless ``cwd``)."""
    import subprocess
    import sys
    from pathlib import Path

    return subprocess.run([sys.executable, "-m", "kinv.agent.cli.app", *map(str, args)], env=env,
                          cwd=cwd or Path(__file__).resolve().parents[1], capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def leave_kinv_patch_live(cfg, changes: dict) -> None:
    """What a killed run whose state dir was then lost leaves behind: kinv's patch of the live config ``cfg``
    (``changes`` over its config), journaled in a state dir that is then deleted.  kinv kept the file's bytes
    of record before writing, as before every write."""
    import shutil
    import tempfile
    from pathlib import Path

    from kinv.agent.store.db import Store
    from kinv.agent.tools.files import configs
    from kinv.kernels.launch_config import load_config

    lost = Path(tempfile.mkdtemp(prefix="kinv-lost-state-"))
    try:
        configs.patch_config(Store(lost, create=True), cfg, {**load_config(cfg), **changes}, None)
    finally:
        shutil.rmtree(lost, ignore_errors=True)


def kinv_in_process(env: dict, *args, cwd=None, timeout=None):
    """What :func:`run_kinv` returns, without a new process: ``kinv.agent.cli.app.main(ARGS)`` in this one, under
    ``env`` as the whole environment and ``cwd`` (the project root unless given) as the working directory, its
    stdout and stderr captured (piped, as a subprocess's are).  For tests about what a command prints, exits
    and records; tests about processes (signals, crashes, a fresh clone) keep :func:`run_kinv`."""
    import contextlib
    import io
    import os
    import subprocess
    import sys
    import traceback

    from kinv.agent import faults
    from kinv.agent.cli.app import main

    argv = [str(a) for a in args]
    saved_env, saved_cwd, saved_stdin = dict(os.environ), os.getcwd(), sys.stdin
    out, err = io.StringIO(), io.StringIO()
    try:
        os.environ.clear()
        os.environ.update({k: str(v) for k, v in env.items()})
        os.chdir(cwd or ROOT)
        faults.reset()  # fault points read this environment, not an earlier one
        sys.stdin = io.StringIO("")  # nothing typed: a prompt reads end of file, as a child with no input does
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as e:  # a command that exits by itself
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except Exception:  # KINV_DEBUG=1 re-raises: what the process would print before it exits 1
                traceback.print_exc()
                code = 1
    finally:
        sys.stdin = saved_stdin
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        faults.reset()
    return subprocess.CompletedProcess(["kinv", *argv], code, out.getvalue(), err.getvalue())
