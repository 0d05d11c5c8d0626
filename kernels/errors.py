"""The errors a kernel, an adapter or a plugin raises, with the exit codes they end a command with.

Standard library only, at the bottom of the house: ``kinv.kernels`` imports nothing from ``kinv.agent``, so the
kinds a kernel raises are defined here and :mod:`kinv.agent.errors` builds every other kind on them (it imports these,
so ``from kinv.agent.errors import BadInput`` is the same class).  A plugin imports them from :mod:`kinv.plugin`.

- :class:`BadInput` (exit 2): input a user gave that kinv cannot use; one line naming the value and what is valid.
  A ``ValueError``, so that code validating with ``except ValueError`` keeps working.
- :class:`ConfigError` (exit 2): a launch config that cannot be used; names the field.
- :class:`UnknownKernelError` (exit 2): a kernel name or ``package.module:Class`` that names no adapter.
- :class:`StepFailed` (exit 1): a step that failed for a reason kinv names (a plugin's harness that cannot run here).
"""

from __future__ import annotations

from enum import IntEnum

from kinv.kernels.moved import moved


class ExitCode(IntEnum):
    """The exit codes of every kinv command (defined here only)."""

    OK = 0
    FAIL = 1  # a step failed for a named reason, damaged state, or an internal error (a bug)
    BAD_INPUT = 2  # one line naming the bad value and what is valid; nothing created or changed
    PAUSED = 3  # a run waits for a person's approval
    REGRESSED = 4  # kinv regress: a kernel regressed beyond its margin at some level (or HEAD broke it)
    UNDECIDED = 5  # kinv regress: nothing regressed, but some level is undecided within the budget (retry)
    INTERRUPTED = 130  # Ctrl-C, SIGTERM or SIGHUP: state restored, resumable


class KinvError(Exception):
    """An error kinv raises on purpose: its message is one line for a person, ``exit_code`` the command's exit."""

    exit_code: int = ExitCode.FAIL


class BadInput(KinvError, ValueError):
    """Input a user gave that kinv cannot use; the message is one line naming the value and what is valid."""

    exit_code = ExitCode.BAD_INPUT


class StepFailed(KinvError, RuntimeError):
    """A step that failed for a reason kinv names; the message is one line saying why and what to do."""

    exit_code = ExitCode.FAIL


class ConfigError(BadInput):
    """A launch config that cannot be used; the message names the field."""


class UnknownKernelError(BadInput):
    """A kernel name or ``package.module:Class`` that names no adapter; the message lists the known ones."""


def __getattr__(name: str):
    # names this module held at 0.2.0 that live elsewhere now: the EXIT_ constants (kinv.kernels.moved)
    return moved(__name__, name)
