"""A state dir this user may read but not write (its permissions, or a read-only mount): the reading commands read
it, create and change nothing in it, and a command that must write says it is a matter of permissions, not of
space.

As root, permission bits stop no write (CAP_DAC_OVERRIDE): there the commands run under ``setpriv`` without that
capability, so the bits bind as they do for any other user.  Where neither works the test is skipped (it checks
by trying to create a file first)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.agent.test_one_process import quick_plan
from tests.utils import kinv_in_process, replay_env

ROOT = Path(__file__).resolve().parents[3]
DROP = ["setpriv", "--inh-caps=-dac_override,-dac_read_search", "--bounding-set=-dac_override,-dac_read_search"]


def _as_user() -> list[str]:
    return DROP if os.geteuid() == 0 and shutil.which("setpriv") else []


def _files(state: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(state)): (p.stat().st_size, p.stat().st_mtime_ns) for p in state.rglob("*")}


@pytest.fixture
def read_only_state(tmp_path):
    """#11a paused at its approval and #11b closed out, in a state dir then made read-only."""
    env = replay_env(tmp_path, tmp_path / "state")
    for ws, approval, rc in (("#11a", "ask", 3), ("#11b", "auto", 0)):
        path = tmp_path / f"{ws[1:]}.yaml"
        path.write_text(yaml.safe_dump(quick_plan(ws, {"T1": "1"})))
        r = kinv_in_process(env, "run", str(path), "--backend", "command", "--approval", approval)
        assert r.returncode == rc, r.stdout[-2000:] + r.stderr[-2000:]
    state = tmp_path / "state"
    for p in sorted(state.rglob("*"), reverse=True) + [state]:
        p.chmod(0o555 if p.is_dir() else 0o444)
    probe = subprocess.run([*_as_user(), "touch", str(state / "probe")], capture_output=True)
    if probe.returncode == 0:
        (state / "probe").chmod(0o644)
        pytest.skip("this user writes a state dir whatever its permission bits (root without setpriv)")
    yield env, state
    for p in [state, *state.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)


def _kinv(env, *args):
    return subprocess.run([*_as_user(), sys.executable, "-m", "kinv.agent.cli.app", *map(str, args)], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip


def test_reading_commands_read_a_read_only_state_dir_and_leave_it_as_it_was(read_only_state):
    env, state = read_only_state
    before = _files(state)
    status = _kinv(env, "status", "--json")
    assert status.returncode == 0, status.stderr
    assert {w["id"]: w["status"] for w in json.loads(status.stdout)["workstreams"]}["#11b"] == "closed"
    for args in (("todos", "11b"), ("report", "11b"), ("experiments", "11b"), ("show", "1"), ("pending",)):
        r = _kinv(env, *args)
        assert r.returncode == 0 and not r.stderr.strip(), (args, r.stderr)
    assert "11a-T1" in _kinv(env, "pending").stdout  # what waits is shown, read-only
    doctor = json.loads(_kinv(env, "doctor", "--json").stdout)
    assert any(f["check"] == "state dir" and "not writable" in f["detail"] for f in doctor)
    assert not [f for f in doctor if f["status"] == "bad"], doctor  # a healthy kinv.db is not called damaged
    assert _files(state) == before  # nothing created (no -shm, no lock file, no log), nothing changed


def test_a_command_that_must_write_a_read_only_state_dir_names_permissions_not_space(read_only_state):
    env, state = read_only_state
    r = _kinv(env, "reject", "11a-T1-3", "--reason", "not now")
    line = r.stderr.strip()
    assert r.returncode == 1 and len(line.splitlines()) == 1, r.stderr
    assert "permission denied or a read-only file system" in line and "free space" not in line, line


@pytest.mark.parametrize("code, says, not_says", [
    (errno.EACCES, "make it writable", "free space"), (errno.EROFS, "make it writable", "free space"),
    (errno.ENOSPC, "free space", "make it writable")])  # fmt: skip
def test_an_os_failure_names_its_cause(code, says, not_says):
    from kinv.agent.cli.app import _os_failure

    line = _os_failure(OSError(code, os.strerror(code), "/state/kinv.log"))
    assert line.startswith("cannot write /state/kinv.log: ") and says in line and not_says not in line
