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


class HarnessReach(StrEnum):
    """A construct in a kernel's source that reaches past the kernel into the process that times and judges it
    (agent/tools/measure/reach.py screens a source patch for them): a plan may allow one for a variant with
    ``allow_harness_reach``."""

    GC = "gc"  # the garbage collector and object-graph walks
    CTYPES = "ctypes"  # raw memory and C calls: ctypes, _ctypes, cffi
    FRAMES = "frames"  # frame introspection: inspect, sys._getframe, f_back, f_locals, tb_frame
    FUNCTION_INTERNALS = "function_internals"  # __code__, __globals__, __closure__, __defaults__
    TRACING = "tracing"  # trace, profile, monitoring and audit hooks
    THREADS = "threads"  # _thread, threading's introspection, threads of the kernel's own
    SIGNALS = "signals"  # signal handlers, timers and faulthandler
    KILL = "kill"  # signals sent to processes: os.kill, os.killpg, signal.pthread_kill
    PROCESSES = "processes"  # processes of the kernel's own: subprocess, multiprocessing, os.fork, os.system
    MODULE_WRITE = "module_write"  # attribute or item writes on a module or object the kernel imported
    SYS_MODULES = "sys_modules"  # the table of every imported module
    BUILTINS = "builtins"  # the builtins every module shares
    RELOAD = "reload"  # importlib.reload
    DYNAMIC_CODE = "dynamic_code"  # exec, eval, compile, __import__, importlib.import_module
    HARNESS_IMPORT = "harness_import"  # an import of kinv's harness (kinv.agent)
    PROC_FILES = "proc_files"  # /proc paths: the process's memory and the other processes' state
