"""What every kinv command shares: the typer app, the --state-dir and --json options, the exit codes, and
the helpers that check ids and state dirs before anything is opened."""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer

from kinv.agent.errors import EXIT_BAD_INPUT, EXIT_FAIL, EXIT_INTERRUPTED, EXIT_OK, EXIT_PAUSED
from kinv.kernels.errors import KinvError

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="kinv: kernel-optimization investigations with todo tracking, approvals and close-outs.\n\n"
                       "Example: kinv run plans/3a-attention-occupancy.yaml --approval auto")  # fmt: skip


def _state_dir_ok(value):
    """--state-dir naming a file is bad input for every command, refused before anything runs."""
    if value:
        from kinv.agent.store.state import state_dir

        state_dir(value)  # BadInput (a ValueError): exit 2, one line
    return value


StateOpt = typer.Option(None, "--state-dir", callback=_state_dir_ok,
                        help="state directory (default ./state or $KINV_STATE_DIR)")
JsonOpt = typer.Option(False, "--json", help="print the documented JSON instead of tables")
BACKEND_HELP = "where samples come from (auto: cuda when a GPU is visible, else replay)"
APPROVAL_HELP = ("who approves kernel edits (ask: a person, every edit; auto-config: config edits within the "
                 "plan's bounds go ahead; auto: every edit goes ahead)")


class Exit(KinvError):
    """A command's end: its exit code and the line it prints (stdout for exit 0, stderr otherwise)."""

    def __init__(self, code: int, message: str = ""):
        super().__init__(message)
        self.exit_code, self.message = code, message


#: how a run or a campaign's pass ended (RunOutcome.end, CampaignOutcome.end) -> the command's exit code
EXIT_OF_END = {"closed": EXIT_OK, "done": EXIT_OK, "paused": EXIT_PAUSED, "interrupted": EXIT_INTERRUPTED,
               "failed": EXIT_FAIL, "refused": EXIT_BAD_INPUT}  # fmt: skip


def _ended(outcome) -> Exit:
    """The command's end for a run's or a campaign's outcome: its exit code and its one line."""
    return Exit(EXIT_OF_END[outcome.end], outcome.message)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("kinv")
        except PackageNotFoundError:
            v = "(not installed)"
        print(f"kinv {v}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="print kinv's version and exit")):  # fmt: skip
    """kinv: kernel-optimization investigations with todo tracking, approvals and close-outs."""


def _console():
    from kinv.agent.report.render import console

    return console()  # a terminal's width; piped, wide: no line is wrapped or cut


def _state_dir(state_dir) -> Path:
    """The state dir a command names (--state-dir, else $KINV_STATE_DIR, else ./state), refused as bad input
    (exit 2, nothing created) when $KINV_STATE_DIR is set but empty or the path is something other than a
    directory.  Every command that takes --state-dir checks it here, before anything is opened."""
    from kinv.agent.ids import shown
    from kinv.agent.store.state import state_dir as resolve

    if state_dir is None and "KINV_STATE_DIR" in os.environ and not os.environ["KINV_STATE_DIR"].strip():
        raise Exit(EXIT_BAD_INPUT, "KINV_STATE_DIR is set but empty: unset it (the default is ./state) or name "
                                   "a directory")  # fmt: skip
    if state_dir is not None and not str(state_dir).strip():
        raise Exit(EXIT_BAD_INPUT, "--state-dir is empty: name a directory (the default is ./state)")
    path = resolve(state_dir)
    if path.exists() and not path.is_dir():
        raise Exit(EXIT_BAD_INPUT, f"state dir {shown(str(path), 200)} is a file, not a directory: name a directory "
                                   "(kinv creates it) with --state-dir or KINV_STATE_DIR")  # fmt: skip
    return path


def _store(state_dir, create=False):
    from kinv.agent.store.db import Store

    return Store(_state_dir(state_dir), create=create)


def _id(value: str, what: str) -> str:
    """An id from the command line: no whitespace or control characters, no 100 KB echoed back."""
    from kinv.agent.ids import check_id

    try:
        return check_id(value, what)
    except ValueError as exc:
        raise Exit(EXIT_BAD_INPUT, str(exc)) from None


def _exp_id(value: int) -> int:
    if not 0 < value < 1 << 63:
        raise Exit(EXIT_BAD_INPUT, f"experiment id {value if len(str(value)) <= 30 else str(value)[:30] + '...'} is "
                                   f"out of range: experiment ids are positive integers (kinv experiments WS lists them)")
    return value


def _emit(model, as_json: bool, render) -> None:
    if as_json:
        from pydantic import BaseModel

        if isinstance(model, list):
            print(json.dumps([m.model_dump(mode="json") if isinstance(m, BaseModel) else m for m in model], indent=2))
        else:
            print(model.model_dump_json(indent=2))
        return
    render(_console(), model)
