"""kinv's exceptions and exit codes (standard library only, importable from every layer).

Every exception kinv raises on purpose is a :class:`KinvError` and carries the exit code the command line
ends with; the CLI maps them in one place (``kinv.agent.cli.main``): one line on stderr and
``exit_code``.  :class:`BadInput` (exit 2) is input a user gave that kinv cannot use: a plan, a config
file, an id, an option, an environment variable or a state dir.  Any other ``KinvError`` (exit 1) is a
step that failed for a reason kinv names (a broken harness, an env mismatch, a lock held, a damaged state).
Any other exception, a bare ``ValueError`` or ``OSError`` included, is a bug: exit 1, "internal error" and
its traceback in the state dir's log.  A ``BadInput`` is a ``ValueError`` so that code which validates
with ``except ValueError`` keeps working.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """The exit codes of every kinv command (defined here only)."""

    OK = 0
    FAIL = 1  # a step failed for a named reason, or an internal error (a bug)
    BAD_INPUT = 2  # one line naming the bad value and what is valid; nothing created or changed
    PAUSED = 3  # a run waits for a person's approval
    INTERRUPTED = 130  # Ctrl-C, SIGTERM or SIGHUP: state restored, resumable


EXIT_OK, EXIT_FAIL, EXIT_BAD_INPUT = ExitCode.OK, ExitCode.FAIL, ExitCode.BAD_INPUT
EXIT_PAUSED, EXIT_INTERRUPTED = ExitCode.PAUSED, ExitCode.INTERRUPTED


class KinvError(Exception):
    """An error kinv raises on purpose: its message is one line for a person, ``exit_code`` the command's exit
    (1 unless a subclass says otherwise: a failed step, named)."""

    exit_code: int = ExitCode.FAIL


class BadInput(KinvError, ValueError):
    """Input a user gave that kinv cannot use; the message is one line naming the value and what is valid."""

    exit_code = ExitCode.BAD_INPUT


class ConfigError(BadInput):
    """A launch config that cannot be used; the message names the field."""
