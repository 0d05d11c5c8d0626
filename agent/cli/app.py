"""kinv's command line: thin commands over the library.

The library raises the kinds of kinv.agent.errors and returns typed outcomes; here, and only here, each
becomes one line and an exit code (:func:`main`, and agent/cli/common.py's ``EXIT_OF_END`` for how a
run ended): 2 bad input, 1 a failed step or damaged state, 3 a run paused for an approval, 130 interrupted,
and for a bug 1, "internal error" and its traceback in the state dir's kinv.log.  The log never costs the
one line: a log that cannot be written is given up on silently.  Read commands never import torch, triton
or langgraph.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from pathlib import Path

import typer

from kinv.agent import faults, logs, signals
from kinv.agent.cli.common import Exit, app
from kinv.agent.errors import EXIT_BAD_INPUT, EXIT_FAIL, EXIT_INTERRUPTED, EXIT_OK
from kinv.kernels.errors import KinvError

for _group in ("running", "measuring", "reading"):  # registers the commands in the order `kinv --help` lists them
    importlib.import_module(f"kinv.agent.cli.{_group}")


# --------------------------------------------------------------------------- #
_ARGV: list[str] | None = None
log = logging.getLogger("kinv.agent.cli.app")  # not __name__: `python -m kinv.agent.cli.app` runs it as __main__


def main(argv=None) -> int:
    """Entry point, and the one place errors become exits: a :class:`KinvError` is one line and its exit code
    (2 bad input, 1 a failed step, 3 paused); a usage error is bad input; anything else is a bug: one line
    naming the log, the traceback in the state dir's kinv.log, exit 1."""
    global _ARGV
    _ARGV = None if argv is None else list(argv)
    # SIGINT, SIGTERM and SIGHUP once a run has closed, and while the process exits (its exit hooks stopping
    # the kept workers): noted, the exit code decided standing.  Called without argv, main is the process's
    # entry point (the kinv script, python -m): the process ends with it.
    handler = logs.attach(_log_dir() or _temp_dir() / "kinv-no-state")
    release_signals = signals.take()
    code = EXIT_FAIL  # a bug that escapes _run: Python's own exit code for it
    try:
        code = int(_run(argv, handler))  # a plain int for sys.exit and callers, whatever the code's enum
        return code
    finally:
        release_signals(exiting=argv is None, code=code)
        logs.detach(handler)


def _run(argv, handler) -> int:
    try:
        faults.check_environment()
        app(args=argv, standalone_mode=False)
        return EXIT_OK
    except KinvError as e:  # Exit included: a command's own exit with its line
        if isinstance(e, Exit):
            if e.exit_code == EXIT_BAD_INPUT:
                handler.discard()
            if e.message:
                (print if e.exit_code == EXIT_OK else _err)(e.message)
            return e.exit_code
        line = _first_line(e)
        if os.environ.get("KINV_DEBUG"):
            raise
        if e.exit_code == EXIT_BAD_INPUT:
            handler.discard()  # bad input leaves no trace
        else:
            log.error("exit %d: %s", e.exit_code, line)
        _err(line)
        return e.exit_code
    except KeyboardInterrupt:
        _err("interrupted")
        return EXIT_INTERRUPTED
    except Exception as e:  # click usage errors, SQLite's and the OS's own failures, bugs
        import click

        # typer >= 0.2x raises its own vendored click's exceptions (typer.TyperException, typer.Exit,
        # typer.Abort), which are not click's: check both, or every usage error would exit 1
        if isinstance(e, click.exceptions.Exit | typer.Exit):
            if e.exit_code == EXIT_INTERRUPTED and isinstance(e.__cause__, KeyboardInterrupt):
                _err("interrupted")  # typer's own Exit(130) for a Ctrl-C: one line, as below
            return e.exit_code
        if type(e).__name__ == "NoArgsIsHelpError" and getattr(e, "ctx", None) is not None:
            print(e.ctx.get_help())  # `kinv` alone lists the commands
            return EXIT_OK
        if isinstance(e, click.ClickException) or (isinstance(e, typer.TyperException)
                                                   and hasattr(e, "format_message")):  # fmt: skip
            # an enum option's bad value: "Invalid value for '--backend': 'gpu' is not one of 'auto', ..."
            _err((e.format_message().splitlines() or [type(e).__name__])[0].replace(": Value error, ", ": "))
            handler.discard()
            return EXIT_BAD_INPUT
        if isinstance(e, click.exceptions.Abort | typer.Abort):
            _err("aborted")
            return EXIT_FAIL
        if os.environ.get("KINV_DEBUG"):
            raise
        named = _db_failure(e) or _os_failure(e)
        if named:  # the disk or a database failed under kinv: named, with what to do
            log.error("%s", named, exc_info=e)
            _err(named)
        else:  # a bug: one line here, the whole traceback in a log a person can attach to an issue
            _err(f"internal error: {type(e).__name__}: {_first_line(e)}; traceback in {_log_traceback(e, handler)}")
        return EXIT_FAIL


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e).strip() else type(e).__name__


def _log_dir() -> Path | None:
    """The state dir this command names (--state-dir, else $KINV_STATE_DIR, else ./state), or None when it
    is bad input (the command itself refuses it)."""
    from kinv.agent.store.state import state_dir

    if "KINV_STATE_DIR" in os.environ and not os.environ["KINV_STATE_DIR"].strip() and _state_dir_arg() is None:
        return None
    try:
        return state_dir(_state_dir_arg())
    except (KinvError, OSError):
        return None


def _temp_dir() -> Path:
    import tempfile  # only where a command has no state dir: a read command never pays for it

    return Path(tempfile.gettempdir())


def _log_traceback(e: BaseException, handler: logs.StateDirLog) -> str:
    """The traceback into the state dir's kinv.log (the temp dir's where this command has no state dir)."""
    if not (handler.directory / logs.STATE_FILE).is_file():
        handler.retarget(_temp_dir())
    log.error("internal error in kinv %s", " ".join(sys.argv[1:] if _ARGV is None else _ARGV), exc_info=e)
    handler.flush()
    if handler.failed is not None or not handler.path.is_file():
        return "(the log could not be written; set KINV_DEBUG=1 to see the traceback)"
    return str(handler.path)


def _state_dir_arg() -> Path | None:
    """The --state-dir the command line gave (the error log goes there, as everything else of the run)."""
    args = sys.argv[1:] if _ARGV is None else _ARGV
    for i, a in enumerate(args):
        if a == "--state-dir" and i + 1 < len(args):
            return Path(args[i + 1])
        if a.startswith("--state-dir="):
            return Path(a.split("=", 1)[1])
    return None


def _os_failure(e: BaseException) -> str | None:
    """One line for a full, read-only or failing disk under a write kinv makes (its own files: a missing
    file a user named is refused as bad input where it is read)."""
    import errno

    if not isinstance(e, OSError) or e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO,
                                                     errno.EACCES, errno.EPERM):  # fmt: skip
        return None
    where = f" {e.filename}" if e.filename else ""
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):  # the cause is permissions, not space
        return (f"cannot write{where}: {e.strerror or e}; make it writable for this user (or name another state dir "
                "with --state-dir) and run again")  # fmt: skip
    fix = "free space there" if e.errno in (errno.ENOSPC, errno.EDQUOT) else "check the disk"
    return f"cannot write{where}: {e.strerror or e}; {fix} and run again"


def _db_failure(e: BaseException) -> str | None:
    """One line for SQLite's own failures that escaped the store's open checks: a full or failing disk, a
    database damaged mid-run.  Names the state dir and what to do."""
    import sqlite3

    if not isinstance(e, sqlite3.DatabaseError):
        return None
    from kinv.agent.store.state import state_dir

    where = state_dir(_state_dir_arg())
    msg = str(e)
    if "readonly" in msg:
        return (f"cannot write the kinv state in {where}: permission denied or a read-only file system ({msg}); make "
                "it writable for this user (or name another state dir with --state-dir) and run again")  # fmt: skip
    if "full" in msg or "disk I/O" in msg:
        return (f"cannot write the kinv state in {where}: the disk is full or failing ({msg}); free space there and "
                "run again (what was recorded before is kept)")  # fmt: skip
    if "malformed" in msg or "not a database" in msg:
        return f"a database in {where} is damaged ({msg}): kinv doctor names it and the way back"
    return None


def _err(msg: str) -> None:
    print(f"kinv: {msg}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
