"""Every exception kinv raises on purpose, and the exit codes (standard library only, importable from every layer).

The kinds a kernel or a plugin raises (``KinvError``, ``BadInput``, ``StepFailed``, ``ConfigError``,
``UnknownKernelError``) and ``ExitCode`` are defined in :mod:`kinv.kernels.errors`, below ``kinv.agent``; this module
builds the others on them and imports them, so both paths name the same classes.

A handful of kinds, each carrying the exit code the command line ends with.  The library raises them; only
the command line (``kinv.agent.cli.app``) turns one into one line on stderr and ``exit_code``:

- :class:`BadInput` (exit 2): input a user gave that kinv cannot use (a plan, a config file, an id, an option,
  an environment variable, a state dir).  The message names the bad value and what is valid; nothing was
  created or changed.  It is a ``ValueError``, so that code validating with ``except ValueError`` keeps working.
- :class:`StepFailed` (exit 1): a step that failed for a reason kinv names (a broken harness, an environment
  that moved, a lock held, a worker that died, a measurement that decided nothing).
- :class:`StateDamaged` (exit 1): kinv's own state (kinv.db, the journal, a checkpoint file) is damaged or
  unreadable; the message names the way back (``kinv doctor``).
- :class:`Interrupted` (exit 130): SIGINT, SIGTERM or SIGHUP; a ``KeyboardInterrupt``, so that Ctrl-C and a
  routed signal end a run the same way.
- a bug: any other exception, a bare ``ValueError`` or ``OSError`` included: exit 1, "internal error", its
  traceback in the state dir's kinv.log.

The subclasses below exist because code catches them by type; every other refusal raises its kind.
"""

from __future__ import annotations

from collections.abc import Sequence

# the kinds a kernel or a plugin raises are defined below kinv.agent, in kinv.kernels.errors (kinv.kernels imports
# nothing from kinv.agent); those this module builds on are imported, the others read through __getattr__ (below)
from kinv.kernels.errors import BadInput, ExitCode, KinvError, StepFailed

EXIT_OK, EXIT_FAIL, EXIT_BAD_INPUT = ExitCode.OK, ExitCode.FAIL, ExitCode.BAD_INPUT
EXIT_PAUSED, EXIT_INTERRUPTED = ExitCode.PAUSED, ExitCode.INTERRUPTED
EXIT_REGRESSED, EXIT_UNDECIDED = ExitCode.REGRESSED, ExitCode.UNDECIDED


# --------------------------------------------------------------------------- #
# the kinds (KinvError, BadInput, StepFailed: kinv.kernels.errors)
# --------------------------------------------------------------------------- #
class StateDamaged(KinvError, RuntimeError):
    """kinv's own state is damaged, empty, missing or unreadable (kinv.db, its journal, checkpoints.db) while the
    state dir shows earlier runs: nothing may start over on it; the message names the way back."""

    exit_code = ExitCode.FAIL


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP, raised where the run is: state restored, resumable, exit 130."""

    exit_code = ExitCode.INTERRUPTED

    def __init__(self, signame: str):
        super().__init__(signame)
        self.signame = signame


# --------------------------------------------------------------------------- #
# bad input that code catches by type
# --------------------------------------------------------------------------- #
class PlanError(BadInput):
    """A plan that cannot be used; the message is one line naming the field."""


class PatchError(BadInput):
    """A patch that cannot be applied; nothing was changed.  One line naming the bad value."""


class NotFound(BadInput):
    """An id (workstream, experiment, approval) that the store does not hold; the message names those it does."""


class TooBig(BadInput):
    """A plan's YAML that would expand past kinv's limits (aliases, nesting, size) while it is read."""


# --------------------------------------------------------------------------- #
# failed steps that code catches by type
# --------------------------------------------------------------------------- #
class StoreError(StepFailed):
    """A state-store problem a user can act on (a lock held, a state dir in use); the message says how."""


class NoState(StoreError, BadInput):
    """A read or a decision named a state dir that holds no kinv state: the input is what is wrong (exit 2)."""

    exit_code = ExitCode.BAD_INPUT


class BackendError(StepFailed):
    """A backend cannot serve this request; one line, names what is valid."""


class NoRecording(BackendError, BadInput):
    """Replay cannot serve what was asked (a level, an env value, a config): bad input, exit 2."""

    exit_code = ExitCode.BAD_INPUT


class NoDevice(BackendError, BadInput):
    """The backend asked for cannot run here (--backend cuda without a GPU): bad input, exit 2."""

    exit_code = ExitCode.BAD_INPUT


class VariantFailed(BackendError):
    """The variant's worker crashed or the variant failed its gate: the variant's failure, not kinv's."""


class Incorrect(VariantFailed):
    """A timed output the judge refused (a capture checked on new inputs, an input set other than the first): the
    variant is incorrect, as if the gate had refused it."""


class Tampered(VariantFailed):
    """The variant changed, in the process that times it, code the harness relies on (its timer, a function it
    calls): nothing that process timed can be believed, and the verdict is void."""


class WorkerCrashed(StepFailed):
    """The worker died (crash, illegal address, out of memory) or broke protocol."""


class WorkerError(StepFailed):
    """The worker answered a request with an error; it is still alive."""


class JudgeFailed(StepFailed):
    """The judge's process died or could not judge (not the variant's fault: a failed step)."""


class IncumbentFailed(StepFailed):
    """The incumbent's own worker failed: the shard has no reference to pair its candidates with."""


class HarnessBroken(StepFailed):
    """The A/A shows two arms of the same config confidently further apart than the threshold."""

    def __init__(self, message: str, levels: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.levels = list(levels)


class EnvMismatch(StepFailed):
    """A worker or process does not have the expected environment; one line naming var, expected, seen
    (``mismatches``: envcheck's ``Mismatch`` records)."""

    def __init__(self, message: str, mismatches: list) -> None:
        super().__init__(message)
        self.mismatches = mismatches


class RevertError(StepFailed):
    """A file could not be restored to its recorded baseline."""


class LockedElsewhere(StepFailed):
    """Another kinv run (possibly of another state dir) holds the kernel's live config file."""


class ExecutorError(StepFailed):
    """The executor cannot run (Ray missing, no GPU in the cluster, every actor lost); one line."""


class InvestigationError(StepFailed):
    """The investigation cannot go on; one line says why."""


class CampaignError(StepFailed):
    """A campaign cannot go on; one line saying why."""


class AdoptError(StepFailed):
    """The adoption's step failed (the state moved on since the variant was measured, the confirming A/B could
    not run or decided nothing); nothing was written; the message says why."""


class BudgetSpent(StepFailed):
    """A comparison's GPU seconds or wall time ran out mid-measurement (``kinv regress --budget``): what was
    measured so far stands, and its levels stay undecided."""


class NoGain(AdoptError):
    """Measured against the live file, the variant improves on it at no level: nothing to write."""


def __getattr__(name: str):
    """``ConfigError`` and ``UnknownKernelError``, importable from here as at 0.2.0, with a DeprecationWarning naming
    their public path (kinv.kernels.moved)."""
    from kinv.kernels.moved import moved

    return moved(__name__, name)
