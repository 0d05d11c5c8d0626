"""The words kinv stores and takes on the command line, each defined once (standard library only).

They are ``StrEnum`` members, so they compare equal to (and are stored in kinv.db as) their plain strings:
``Verdict.ACCEPT == "accept"``.  Where one is a command-line option, typer offers its values as the choices
and refuses any other as a usage error (one line, exit 2).
"""

from __future__ import annotations

from enum import StrEnum


class BackendName(StrEnum):
    """Where samples come from: ``auto`` picks cuda when a GPU is visible, else replay (a plan of ``kernel:
    command``: the command backend, which runs the plan's own command)."""

    AUTO = "auto"
    CUDA = "cuda"
    REPLAY = "replay"
    COMMAND = "command"


class Approval(StrEnum):
    """Who approves a kernel edit: a person (``ask``), kinv for config edits (``auto-config``), or kinv for all."""

    ASK = "ask"
    AUTO_CONFIG = "auto-config"
    AUTO = "auto"


class LevelVerdict(StrEnum):
    """One level's verdict of an A/B (``unmeasured``: the summary's word for a level that got no samples)."""

    IMPROVED = "improved"
    REGRESSED = "regressed"
    EQUIVALENT = "equivalent"
    UNDECIDED = "undecided"
    UNMEASURED = "unmeasured"


class Verdict(StrEnum):
    """A variant's verdict: the four an A/B gives, then the ones of a variant that was never (validly) timed."""

    ACCEPT = "accept"
    REJECT = "reject"
    MIXED = "mixed"
    INCONCLUSIVE = "inconclusive"
    INFEASIBLE = "infeasible"
    INCORRECT = "incorrect"
    CRASHED = "crashed"
    FAILED = "failed"
    VOID = "void"


class Phase(StrEnum):
    """A campaign step's phase: screening candidates, confirming a finalist with the full A/B, done."""

    SCREEN = "screen"
    CONFIRM = "confirm"
    DONE = "done"


MEASURED_VERDICTS = (Verdict.ACCEPT, Verdict.REJECT, Verdict.MIXED, Verdict.INCONCLUSIVE)


class Target(StrEnum):
    """The lever a variant pulls (its ``targets``): each names a premise kinv can measure from the compiled kernel
    and the profile -- warps per SM and achieved occupancy, stages in flight, the tile and MMA shape, CTAs, waves
    and splits, bytes per item -- or, for ``roofline_gap`` and ``elsewhere``, none.  A kernel's adapter may
    declare premises of its own (``KernelAdapter.premises``)."""

    OCCUPANCY = "occupancy"
    PIPELINING = "pipelining"
    TILE_SHAPE = "tile_shape"
    PARALLELISM = "parallelism"
    BYTES_MOVED = "bytes_moved"
    ROOFLINE_GAP = "roofline_gap"
    ELSEWHERE = "elsewhere"


class Expect(StrEnum):
    """What one variant predicts against the baseline."""

    IMPROVE = "improve"
    NO_CHANGE = "no_change"
    REGRESS = "regress"


class PremiseOutcome(StrEnum):
    """Whether a decided variant moved the quantity its ``targets`` names: in the predicted direction (``tested``),
    the other way, not at all (then its verdict says nothing about the hypothesis), or unknown (no compiled or
    profiled figures)."""

    TESTED = "tested"
    OPPOSITE = "moved the other way"
    NOT_MOVED = "not moved"
    NOT_MEASURED = "not measured"
