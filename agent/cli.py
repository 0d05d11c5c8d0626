"""kinv's command line: thin commands over the library.

Every domain error becomes one line and an exit code in one place
(:func:`main`): 2 for bad input, 1 for a failed investigation step,
3 when a run pauses for an approval.  Read commands never import torch,
triton or langgraph.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import typer

from kinv.agent.commands.common import EXIT_BAD_INPUT, EXIT_FAIL, EXIT_INTERRUPTED, EXIT_OK, Exit, app

for _group in ("running", "measuring", "reading"):  # registers the commands in the order `kinv --help` lists them
    importlib.import_module(f"kinv.agent.commands.{_group}")


# --------------------------------------------------------------------------- #
_ARGV: list[str] | None = None


def main(argv=None) -> int:
    """Entry point: one line and an exit code for every domain error, never a traceback."""
    global _ARGV
    _ARGV = None if argv is None else list(argv)
    try:
        app(args=argv, standalone_mode=False)
        return EXIT_OK
    except Exit as e:
        if e.message:
            (print if e.code == EXIT_OK else _err)(e.message)
        return e.code
    except KeyboardInterrupt:
        _err("interrupted")
        return EXIT_INTERRUPTED
    except Exception as e:  # click usage errors, domain errors of the tools
        import click

        # typer >= 0.2x raises its own vendored click's exceptions (typer.TyperException, typer.Exit,
        # typer.Abort), which are not click's: check both, or every usage error would exit 1
        if isinstance(e, click.exceptions.Exit | typer.Exit):
            return e.exit_code
        if type(e).__name__ == "NoArgsIsHelpError" and getattr(e, "ctx", None) is not None:
            print(e.ctx.get_help())  # `kinv` alone lists the commands
            return EXIT_OK
        if isinstance(e, click.ClickException) or (isinstance(e, typer.TyperException)
                                                   and hasattr(e, "format_message")):  # fmt: skip
            _err((e.format_message().splitlines() or [type(e).__name__])[0])
            return EXIT_BAD_INPUT
        if isinstance(e, click.exceptions.Abort | typer.Abort):
            _err("aborted")
            return EXIT_FAIL
        from kinv.kernels.errors import BadInput

        # bad input is one type (unknown ids, kernels, devices, formats, patches, a missing recording, no
        # GPU for --backend cuda); a failed step is named by its class; any other exception, a ValueError
        # included, is a bug: an internal error with its traceback in the log.
        bad_input = isinstance(e, BadInput)
        line = str(e).splitlines()[0] if str(e) else type(e).__name__
        if os.environ.get("KINV_DEBUG"):
            raise
        if bad_input or _expected_failure(e):
            _err(line)
        elif _db_failure(e):
            _err(_db_failure(e))
        else:  # a bug: one line here, the whole traceback in a log a person can attach to an issue
            _err(f"internal error: {type(e).__name__}: {line}; traceback in {_log_traceback(e)}")
        return EXIT_BAD_INPUT if bad_input else EXIT_FAIL


_STEP_FAILURES = {"InvestigationError", "HarnessBroken", "StoreError", "BackendError", "LockedElsewhere",
                  "RevertError", "EnvMismatch", "LockHeld", "Unreadable", "NotFound", "OSError"}


def _expected_failure(e: BaseException) -> bool:
    """A step that failed for a reason kinv names (a broken harness, an env mismatch, a lock held, ...).
    Matched by class name along the MRO, so a read command's error path imports nothing heavy."""
    return any(c.__name__ in _STEP_FAILURES for c in type(e).__mro__)


def _log_traceback(e: BaseException) -> str:
    import tempfile
    import time
    import traceback

    path = _state_dir_arg() or Path(os.environ.get("KINV_STATE_DIR") or "state")
    path = path / "kinv-errors.log" if path.is_dir() else Path(tempfile.gettempdir()) / "kinv-errors.log"
    try:
        with open(path, "a") as fh:
            fh.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%SZ', time.gmtime())} kinv {' '.join(sys.argv[1:])}\n")
            fh.write("".join(traceback.format_exception(e)))
    except OSError:
        return "(the log could not be written; set KINV_DEBUG=1 to see the traceback)"
    return str(path)


def _state_dir_arg() -> Path | None:
    """The --state-dir the command line gave (the error log goes there, as everything else of the run)."""
    args = sys.argv[1:] if _ARGV is None else _ARGV
    for i, a in enumerate(args):
        if a == "--state-dir" and i + 1 < len(args):
            return Path(args[i + 1])
        if a.startswith("--state-dir="):
            return Path(a.split("=", 1)[1])
    return None


def _db_failure(e: BaseException) -> str | None:
    """One line for SQLite's own failures that escaped the store's open checks: a full or failing disk, a
    database damaged mid-run.  Names the state dir and what to do."""
    import sqlite3

    if not isinstance(e, sqlite3.DatabaseError):
        return None
    from kinv.agent.store import state_dir

    where = state_dir(_state_dir_arg())
    msg = str(e)
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
