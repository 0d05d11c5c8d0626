"""Errors and the log: every kinv exception is a KinvError carrying its exit code, the command line maps them in
one place, an internal error is a bug (one line, its traceback in the state dir's kinv.log, exit 1), and bad
input writes no log and creates no state dir."""

from __future__ import annotations

import ast
import errno
import importlib
import inspect
import os
import tempfile
from pathlib import Path

import pytest

from kinv.agent.errors import NoRecording

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch, tmp_path):
    monkeypatch.delenv("KINV_DEBUG", raising=False)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # a log with no state dir goes here, not to /tmp


def _exception_classes():
    """Every exception class defined in agent/ and kernels/ (found in the source, checked on the imported class)."""
    found = []
    for path in sorted([*ROOT.glob("agent/**/*.py"), *ROOT.glob("kernels/**/*.py")]):
        tree = ast.parse(path.read_text())
        names = [n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.bases]
        if not names:
            continue
        module = importlib.import_module("kinv." + ".".join(path.relative_to(ROOT).with_suffix("").parts))
        for name in names:
            cls = getattr(module, name, None)
            if inspect.isclass(cls) and issubclass(cls, BaseException) and cls.__module__ == module.__name__:
                found.append(cls)
    return found


def test_every_exception_kinv_raises_is_defined_in_one_module_with_its_exit_code():
    """agent/errors.py defines every exception kinv raises on purpose (the command line's own Exit aside), each
    a kind with its exit code: bad input 2, a failed step 1, damaged state 1, interrupted 130; the kinds a kernel
    raises are defined below it, in kernels/errors.py, and agent/errors.py names the same classes."""
    from kinv.agent import errors
    from kinv.agent.errors import Interrupted, StateDamaged
    from kinv.kernels import errors as kernel_errors
    from kinv.kernels.errors import BadInput, KinvError, StepFailed
    homes = ("kinv.agent.errors", "kinv.kernels.errors")
    elsewhere = [f"{c.__module__}.{c.__qualname__}" for c in _exception_classes()
                 if c.__module__ not in homes and c.__qualname__ != "Exit"]  # fmt: skip
    assert not elsewhere, f"define these in agent/errors.py (or kernels/errors.py for a kernel's): {elsewhere}"
    assert (BadInput.exit_code, StepFailed.exit_code, StateDamaged.exit_code, Interrupted.exit_code) == (2, 1, 1, 130)
    for name in ("KinvError", "BadInput", "StepFailed", "ConfigError", "UnknownKernelError", "ExitCode"):
        assert getattr(errors, name) is getattr(kernel_errors, name), name  # one class, two import paths
    for cls in [*vars(errors).values(), *vars(kernel_errors).values()]:
        if inspect.isclass(cls) and issubclass(cls, Exception) and cls.__module__ in homes:
            assert issubclass(cls, KinvError), cls
            assert cls.exit_code == (2 if issubclass(cls, BadInput) else 1), cls
    assert errors.NoRecording.exit_code == errors.NoDevice.exit_code == errors.NoState.exit_code == 2  # bad input wins
    assert issubclass(errors.AdoptError, StepFailed) and errors.AdoptError.exit_code == 1  # a failed step, not input
    assert issubclass(Interrupted, KeyboardInterrupt)  # a routed signal ends a run the way Ctrl-C does


def test_the_exit_codes_are_defined_once():
    from kinv.agent import errors
    from kinv.agent.cli import app as cli
    from kinv.agent.cli import common
    from kinv.agent.workstream import investigation

    for mod in (cli, common):
        for name in ("EXIT_OK", "EXIT_FAIL", "EXIT_BAD_INPUT"):
            assert getattr(mod, name) is getattr(errors, name), (mod, name)
    assert not any(n.startswith("EXIT_") for n in vars(investigation)), "the library decides no exit code"
    assert (errors.EXIT_OK, errors.EXIT_FAIL, errors.EXIT_BAD_INPUT, errors.EXIT_PAUSED) == (0, 1, 2, 3)


@pytest.mark.parametrize("backend, approval, plan, needle", [
    ("replay", "sometimes", "plans/3a-attention-occupancy.yaml", "--approval 'sometimes' is not valid; use ask"),
    ("gpu", "auto", "plans/3a-attention-occupancy.yaml", "--backend 'gpu' is not valid; use auto"),
    ("replay", "auto", "plans/7-decode-ceiling.yaml", "is a campaign plan (no variants of its own): run it with kinv campaign"),
])  # fmt: skip
def test_run_plan_raises_bad_input_with_exit_2_and_creates_no_state_dir(state_dir, backend, approval, plan, needle):
    """A library caller of run_plan gets a BadInput (exit 2) naming the bad value and what is valid, not a
    returned code; nothing is created."""
    from rich.console import Console

    from kinv.agent.workstream.investigation import run_plan
    from kinv.kernels.errors import BadInput, ExitCode

    with pytest.raises(BadInput) as got:
        run_plan(str(ROOT / plan), backend, approval, str(state_dir), Console(quiet=True))
    assert got.value.exit_code == ExitCode.BAD_INPUT == 2
    assert needle in str(got.value) and len(str(got.value).splitlines()) == 1
    assert not state_dir.exists()


def test_only_the_command_line_decides_an_exit_code():
    """Library code raises or returns typed results; ExitCode and the EXIT_ names appear only in the command line
    (agent/cli/app.py, agent/cli/) and where they are defined."""
    users = []
    for path in sorted([*ROOT.glob("agent/**/*.py"), *ROOT.glob("kernels/**/*.py")]):
        rel = path.relative_to(ROOT).as_posix()
        if rel in ("agent/cli/app.py", "agent/errors.py", "kernels/errors.py") or rel.startswith("agent/cli/"):
            continue
        tree = ast.parse(path.read_text())
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        names |= {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        if names & {"ExitCode", "EXIT_OK", "EXIT_FAIL", "EXIT_BAD_INPUT", "EXIT_PAUSED", "EXIT_INTERRUPTED"}:
            users.append(rel)
    assert not users, users


def test_run_plan_returns_a_typed_outcome_for_a_closed_workstream(closed_3a, tmp_path, state_dir, monkeypatch):
    """Running a closed workstream again ends normally: a RunOutcome (closed, its one line, the workstream id); the
    exit code is the command line's."""
    from rich.console import Console

    from kinv.agent.workstream.investigation import RunOutcome, run_plan
    from tests.utils import replay_env

    for k, v in replay_env(tmp_path, state_dir).items():
        monkeypatch.setenv(k, v)
    out = run_plan(str(ROOT / "plans/3a-attention-occupancy.yaml"), "replay", "auto", str(state_dir),
                   Console(quiet=True))  # fmt: skip
    assert isinstance(out, RunOutcome) and out.closed
    assert (out.end, out.workstream) == ("closed", "#3a")
    assert out.message.startswith("#3a is already closed out: ") and out.message.endswith("-closeout.md")


def test_an_internal_error_is_one_line_and_its_traceback_in_the_state_dirs_log(tmp_path, state_dir, monkeypatch,
                                                                               capsys):  # fmt: skip
    """A ValueError that is no BadInput is a bug: exit 1 (never 2), one line naming <--state-dir>/kinv.log,
    where the traceback is; $KINV_STATE_DIR's dir is not touched."""
    from kinv.agent.cli.app import main
    from kinv.agent.report import views
    from kinv.agent.store.db import Store

    other = tmp_path / "other-state"
    Store(other).close()

    def broken(store):
        raise ValueError("a bug, not bad input")

    monkeypatch.setattr(views, "status", broken)
    rc = main(["status", "--state-dir", str(other)])
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert rc == 1 and len(lines) == 1 and "Traceback" not in out.err, out.err
    assert lines[0].startswith("kinv: internal error: ValueError: a bug, not bad input; traceback in ")
    assert lines[0].endswith(str(other / "kinv.log")), lines
    log = (other / "kinv.log").read_text()
    assert "Traceback (most recent call last)" in log and "ValueError: a bug, not bad input" in log
    assert "status --state-dir" in log  # the command that failed
    assert not state_dir.exists()


def test_an_internal_error_where_no_state_dir_exists_creates_none(state_dir, monkeypatch, capsys):
    from kinv.agent.cli.app import main
    from kinv.agent.tools.files import doctor

    def broken(directory):
        raise KeyError("missing")

    monkeypatch.setattr(doctor, "diagnose", broken)
    rc = main(["doctor"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and "internal error: KeyError" in err[0], err
    log = Path(tempfile.gettempdir()) / "kinv.log"
    assert err[0].endswith(str(log)) and "KeyError: 'missing'" in log.read_text()
    assert not state_dir.exists()


@pytest.mark.parametrize(
    "raised, code, line",
    [
        ("StateDamaged", 1, "kinv: kinv.db is damaged: kinv doctor names the way back"),
        ("NoRecording", 2, "kinv: kinv.db is damaged: kinv doctor names the way back"),
        ("ENOSPC", 1, "kinv: cannot write /x/kinv.db: No space left on device; free space there"),
    ],
)
def test_a_named_failure_is_its_one_line_and_exit_code(state_dir, monkeypatch, capsys, raised, code, line):
    """A KinvError (or a full disk) is its own line and its exit code, no 'internal error', no log written where
    no state dir exists."""
    from kinv.agent.cli.app import main
    from kinv.agent.errors import StateDamaged
    from kinv.agent.tools.files import doctor

    exc = {"StateDamaged": StateDamaged("kinv.db is damaged: kinv doctor names the way back"),
           "NoRecording": NoRecording("kinv.db is damaged: kinv doctor names the way back"),
           "ENOSPC": OSError(errno.ENOSPC, "No space left on device", "/x/kinv.db")}[raised]  # fmt: skip

    def broken(directory):
        raise exc

    monkeypatch.setattr(doctor, "diagnose", broken)
    rc = main(["doctor"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == code and len(err) == 1 and err[0].startswith(line) and "internal error" not in err[0], err
    assert not state_dir.exists() and not (Path(tempfile.gettempdir()) / "kinv.log").exists()


def test_bad_input_writes_no_log_and_creates_no_state_dir(tmp_path, state_dir, capsys):
    from kinv.agent.cli.app import main

    assert main(["run", str(tmp_path / "nope.yaml"), "--backend", "replay"]) == 2
    assert main(["show", "3"]) == 2  # a read command on no state: bad input
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "nope.yaml does not exist" in err[0] and "no kinv state" in err[1], err
    assert not state_dir.exists() and not (Path(tempfile.gettempdir()) / "kinv.log").exists()
    from kinv.agent.store.db import Store

    Store(state_dir).close()  # an existing state: bad input leaves no line in its log either
    assert main(["run", str(tmp_path / "nope.yaml"), "--backend", "replay"]) == 2
    assert main(["resume", "9z", "--backend", "replay"]) == 2
    assert main(["run", str(tmp_path / "nope.yaml"), "--backend", "gpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and "unknown workstream '#9z'" in err[1] and "'gpu' is not one of 'auto', 'cuda'" in err[2], err
    assert not (state_dir / "kinv.log").exists()


def test_the_log_holds_the_records_from_before_the_state_dir_existed(tmp_path):
    """A command that creates its state dir (its kinv.db) logs from its first line; one that never does writes
    nothing."""
    import logging

    from kinv.agent import logs

    made, never = tmp_path / "made", tmp_path / "never"
    for d in (made, never):
        h = logs.attach(d)
        try:
            logging.getLogger("kinv.agent.test").info("first, before the dir %s exists", d.name)
            if d is made:
                d.mkdir()
                (d / "kinv.db").touch()  # a state dir is one with a kinv.db (an empty ./state is not)
                logging.getLogger("kinv.agent.test").info("second")
        finally:
            logs.detach(h)
    text = (made / "kinv.log").read_text().splitlines()
    assert len(text) == 2 and "INFO kinv.agent.test" in text[0] and "first, before the dir made" in text[0], text
    assert text[1].endswith("second") and not never.exists()
    assert not logging.getLogger("kinv").handlers  # detached: the library in-process logs nowhere


def _unopenable_log(state_dir: Path) -> None:
    """A kinv.log kinv cannot open (a directory in its place): what a read-only state dir is to a process that
    can still read it, and the same for a root that chmod does not stop."""
    log = state_dir / "kinv.log"
    if log.exists():
        log.unlink()
    log.mkdir()


@pytest.mark.parametrize("argv, code", [(["status"], 0), (["resume", "3a", "--backend", "replay"], 0),
                                        (["revert"], 0)])  # fmt: skip
def test_a_log_that_cannot_be_opened_costs_a_command_nothing(closed_3a, tmp_path, state_dir, argv, code):
    """status, resume and revert on a state dir whose kinv.log cannot be opened end as they would with it: their
    exit code and at most their own one line on stderr, never a traceback from the log."""
    from tests.utils import replay_env, run_kinv

    _unopenable_log(state_dir)
    r = run_kinv(replay_env(tmp_path, state_dir, seed_config=False), *argv)
    assert "Traceback" not in r.stderr and "Logging error" not in r.stderr, r.stderr[-3000:]
    assert r.returncode == code and len(r.stderr.strip().splitlines()) <= 1, (r.returncode, r.stderr)


def test_a_failed_step_on_a_state_dir_whose_log_cannot_be_opened_is_its_one_line(state_dir, monkeypatch, capsys):
    """A failed step is logged before its line is printed: a log that cannot be opened (a read-only state dir)
    leaves the line and the exit code as they are."""
    from kinv.agent.cli.app import main
    from kinv.agent.errors import StateDamaged
    from kinv.agent.report import views
    from kinv.agent.store.db import Store

    Store(state_dir).close()
    _unopenable_log(state_dir)

    def broken(store):
        raise StateDamaged("kinv.db is damaged: kinv doctor names the way back")

    monkeypatch.setattr(views, "status", broken)
    rc = main(["status"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and err == ["kinv: kinv.db is damaged: kinv doctor names the way back"], err


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes a read-only dir anyway")
def test_a_read_only_state_dir_gets_its_one_line(state_dir, monkeypatch, capsys):
    from kinv.agent.cli.app import main
    from kinv.agent.errors import StateDamaged
    from kinv.agent.report import views
    from kinv.agent.store.db import Store

    Store(state_dir).close()
    state_dir.chmod(0o555)
    try:
        monkeypatch.setattr(views, "status", lambda store: (_ for _ in ()).throw(StateDamaged("damaged")))
        rc = main(["status"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 1 and err == ["kinv: damaged"], err
    finally:
        state_dir.chmod(0o755)


def test_a_full_disk_is_one_line_even_when_the_log_cannot_be_written(state_dir, monkeypatch, capsys):
    """On a full disk the log fails too (here: kinv.log is /dev/full): the "cannot write" line stays the one
    line, no traceback from writing or closing the log follows it."""
    from kinv.agent.cli.app import main
    from kinv.agent.store.db import Store
    from kinv.agent.tools.files import doctor

    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    Store(state_dir).close()
    (state_dir / "kinv.log").symlink_to("/dev/full")

    def broken(directory):
        raise OSError(errno.ENOSPC, "No space left on device", str(state_dir / "kinv.db"))

    monkeypatch.setattr(doctor, "diagnose", broken)
    rc = main(["doctor"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1, err
    assert err[0].startswith(f"kinv: cannot write {state_dir / 'kinv.db'}: No space left on device; free space"), err


def test_a_log_write_that_fails_is_given_up_silently(tmp_path, capsys):
    """The handler's own stream failing (ENOSPC) on write, flush and close: nothing on stderr, the reason kept."""
    import logging

    from kinv.agent import logs

    class Full:
        def write(self, *args):
            raise OSError(errno.ENOSPC, "No space left on device")

        flush = close = write

    (tmp_path / "kinv.db").touch()
    h = logs.attach(tmp_path)
    try:
        logging.getLogger("kinv.agent.test").error("one")
        h.stream.close()
        h.stream = Full()
        logging.getLogger("kinv.agent.test").error("two")
        logging.getLogger("kinv.agent.test").error("three")
    finally:
        logs.detach(h)
    assert capsys.readouterr().err == ""
    assert h.failed is not None and h.failed.errno == errno.ENOSPC
    assert (tmp_path / "kinv.log").read_text().count("ERROR") == 1
