"""Ctrl-C, SIGTERM and SIGHUP end a run cleanly: kernel files restored, the workstream marked interrupted,
a line saying how to resume, exit 130; `kinv resume` then finishes under the policy the run started with."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.utils import replay_env, run_kinv

pytestmark = pytest.mark.slow  # the slow lane: kills, races, fuzzing, drills (python -m pytest -m slow)

ROOT = Path(__file__).resolve().parents[3]
PLAN = ROOT / "plans" / "3a-attention-occupancy.yaml"


@pytest.fixture
def env(tmp_path, state_dir):
    return replay_env(tmp_path, state_dir, PYTHONUNBUFFERED="1")


def _kinv(env, *args, timeout=300):
    return run_kinv(env, *args, timeout=timeout)


def _run_until_patched(env) -> subprocess.Popen:
    """Start #3a on replay and return once V1's patch is on disk (the worst moment to be stopped)."""
    proc = subprocess.Popen([sys.executable, "-m", "kinv.agent.cli.app", "run", str(PLAN), "--backend", "replay",
                             "--approval", "auto"], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    deadline = time.time() + 240
    seen = []
    while time.time() < deadline:
        line = proc.stdout.readline()
        seen.append(line)
        if "V1: patched" in line:
            return proc
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError("the run never reached V1's patch:\n" + "".join(seen))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_restores_the_kernel_marks_interrupted_exits_130_and_resume_finishes(env, sig):
    cfg = Path(env["KINV_CONFIG_DIR"]) / "mla_decode.json"
    before = cfg.read_bytes()
    proc = _run_until_patched(env)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    assert "interrupted" in out and "kinv resume 3a" in out
    assert cfg.read_bytes() == before  # V1's num_warps 8 is not left on disk
    status = json.loads(_kinv(env, "status", "--json").stdout)
    ws = next(w for w in status["workstreams"] if w["id"] == "#3a")
    assert ws["status"] == "interrupted"
    if sig != signal.SIGINT:
        return  # every signal leaves the same interrupted state: one resume (after ^C) shows it finishes
    r = _kinv(env, "resume", "3a", "--backend", "replay")  # no --approval: keeps 'auto', so it never pauses
    assert r.returncode == 0, r.stdout + r.stderr
    assert cfg.read_bytes() == before
    exps = {e["variant"]: e for e in json.loads(_kinv(env, "experiments", "3a", "--json").stdout)}
    assert exps["V1"]["verdict"] == "reject" and exps["V2"]["verdict"] == "inconclusive"


def test_reject_needs_a_reason(env):
    r = _kinv(env, "reject", "3a-V1-3", "--reason", "   ")
    assert r.returncode == 2 and "--reason" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_version_help_and_no_arguments():
    e = dict(os.environ, PYTHONPATH=str(ROOT))
    v = subprocess.run([sys.executable, "-m", "kinv.agent.cli.app", "--version"], env=e, capture_output=True, text=True)
    assert v.returncode == 0 and v.stdout.startswith("kinv ")
    h = subprocess.run([sys.executable, "-m", "kinv.agent.cli.app", "-h"], env=e, capture_output=True, text=True)
    assert h.returncode == 0 and "run" in h.stdout and "kernels" in h.stdout
    bare = subprocess.run([sys.executable, "-m", "kinv.agent.cli.app"], env=e, capture_output=True, text=True)
    assert "Commands" in bare.stdout + bare.stderr and "resume" in bare.stdout + bare.stderr


def test_json_commands_print_json_only_on_stdout(env):
    for args in (("noise", "--backend", "replay", "--json"),
                 ("bench", "--variant", "num_warps=8", "--backend", "replay", "--json")):  # fmt: skip
        r = _kinv(env, *args)
        assert r.returncode == 0, r.stderr
        data = json.loads(r.stdout)  # nothing but the JSON: the replay banner went to stderr
        assert data and "REPLAY" in r.stderr


def test_a_signal_whose_interrupt_was_swallowed_still_stops_the_run_at_the_next_event():
    """Python drops an exception raised inside a finalizer; the signal is remembered and raised again at the
    next event the graph emits, so the run cannot close out as if it had not come."""
    import gc

    from kinv.agent import signals

    restore = signals.install()
    try:

        class Finalized:
            def __del__(self):
                os.kill(os.getpid(), signal.SIGHUP)  # the handler's KeyboardInterrupt is raised in __del__ ...

        Finalized()
        gc.collect()  # ... and dropped ("Exception ignored in ...")
        with pytest.raises(KeyboardInterrupt) as got:
            signals.check()
        assert got.value.signame == "SIGHUP"
    finally:
        restore()
    signals.check()  # handled: nothing pending once the run has dealt with it


def test_under_nohup_a_hangup_stays_ignored():
    """`nohup kinv run ...` ignores SIGHUP; kinv keeps that, and still routes SIGTERM to a clean stop."""
    from kinv.agent import signals

    old = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    restore = signals.install()
    try:
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGHUP)  # ignored: no KeyboardInterrupt, nothing pending
        time.sleep(0.05)
        signals.check()
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN)
    finally:
        restore()
        signal.signal(signal.SIGHUP, old)
    assert signal.getsignal(signal.SIGHUP) is old


def test_a_hangup_under_nohup_does_not_stop_the_run(env):
    cfg = Path(env["KINV_CONFIG_DIR"]) / "mla_decode.json"
    before = cfg.read_bytes()
    proc = subprocess.Popen(["nohup", sys.executable, "-m", "kinv.agent.cli.app", "run", str(PLAN), "--backend", "replay",
                             "--approval", "ask"], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    seen = []
    for line in proc.stdout:  # the run is under way (its signal handlers installed): the baseline's check
        seen.append(line)
        if "correctness check" in line:
            break
    proc.send_signal(signal.SIGHUP)
    out, _ = proc.communicate(timeout=240)
    out = "".join(seen) + out
    assert proc.returncode == 3, out  # went on to V1's approval, as if no hang-up had come
    assert "interrupted" not in out and cfg.read_bytes() == before
