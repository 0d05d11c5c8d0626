"""Names a plugin could import from ``kinv.kernels.*`` at 0.2.0 that have moved since: still importable from the old
path until :data:`REMOVED_IN`, each with a ``DeprecationWarning`` naming the new path and that release.

One table, :data:`MOVED`, serves the old modules' ``__getattr__`` (the warning a plugin's import raises) and
``kinv check`` (which reads a plugin's imports and prints the same line, whatever the plugin imported first).

Standard library only; the object a moved name stands for is looked up in the module that defines it now, when it is
asked for.
"""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass

DEPRECATED_IN = "0.3.0"
#: the release that removes every old path below (two minor releases after :data:`DEPRECATED_IN`)
REMOVED_IN = "0.5.0"


@dataclass(frozen=True)
class Move:
    """Where an old name is now: ``public`` is what a plugin uses instead (a dotted path it imports, or a phrase such as
    ``KernelAdapter.params_for(config, level)``; empty: nothing public replaces it, and ``note`` says what to do),
    ``home`` and ``attr`` the module and attribute that define it (a dotted ``attr`` reads a member: ``ExitCode.OK``)."""

    public: str
    home: str
    attr: str
    note: str = ""


_TUNABLES, _ERRORS = "kinv.kernels.tunables", "kinv.kernels.errors"
_ADAPTER, _DEVICES, _QUICK_ADAPTER = "kinv.kernels.adapter", "kinv.kernels.devices", "kinv.kernels.quick_adapter"

#: (old module, old name) -> where it is now
MOVED: dict[tuple[str, str], Move] = {
    # the tunables moved out of the config module when the house was rebuilt
    ("kinv.kernels.launch_config", "Restriction"): Move("kinv.plugin.Restriction", _TUNABLES, "Restriction"),
    ("kinv.kernels.launch_config", "Tunable"): Move("kinv.plugin.Tunable", _TUNABLES, "Tunable"),
    ("kinv.kernels.launch_config", "MAX_DIM"): Move("", _TUNABLES, "MAX_DIM",
                                                    "leave an override's bound out, which leaves it open to 2**30"),
    ("kinv.kernels.launch_config", "resolve"): Move("KernelAdapter.params_for(config, level)",
                                                    "kinv.kernels.launch_config", "_resolve"),
    ("kinv.kernels.launch_config", "BadInput"): Move("kinv.plugin.BadInput", _ERRORS, "BadInput"),
    ("kinv.kernels.tunables", "LaunchParams"): Move("kinv.plugin.Params", _TUNABLES, "Params"),
    ("kinv.kernels.adapter", "ConfigError"): Move("kinv.plugin.ConfigError", _ERRORS, "ConfigError"),
    # error classes of their own that became the one bad-input kind
    ("kinv.kernels.devices", "UnknownDeviceError"): Move("kinv.plugin.BadInput", _ERRORS, "BadInput"),
    ("kinv.kernels.quick", "QuickError"): Move("kinv.plugin.BadInput", _ERRORS, "BadInput"),
    # the quick adapter's class and its restriction grammar, in modules of their own since 0.3.0
    **{("kinv.kernels.quick", n): Move(f"kinv.plugin.{n}", home, n) for n, home in (
        ("KernelAdapter", _ADAPTER), ("Level", _ADAPTER), ("Resources", _ADAPTER), ("Params", _TUNABLES),
        ("DeviceSpec", _DEVICES), ("occupancy", _DEVICES))},
    ("kinv.kernels.quick", "CPU_CAP"): Move("", _QUICK_ADAPTER, "CPU_CAP",
                                            "kernel(..., stand_in={...}) caps a level's dimensions on CPU"),
    ("kinv.kernels.quick", "TOLERANCE"): Move("", _QUICK_ADAPTER, "TOLERANCE",
                                              "kernel(..., tolerance=(atol, rtol)) sets a kernel's own"),
    ("kinv.kernels.quick", "parse_restriction"): Move("", "kinv.kernels.restriction_grammar", "parse_restriction",
                                                      "give a restriction's text to kinv.plugin.kernel(restrictions=)"),
    # the kinds a plugin raises, defined below kinv.agent since 0.3.0
    ("kinv.agent.errors", "ConfigError"): Move("kinv.plugin.ConfigError", _ERRORS, "ConfigError"),
    ("kinv.agent.errors", "UnknownKernelError"): Move("", _ERRORS, "UnknownKernelError",
                                                      "kinv raises it for a kernel name nobody registered"),
    # the exit codes, which only the command line uses
    **{("kinv.kernels.errors", f"EXIT_{c}"): Move(f"kinv.agent.errors.EXIT_{c}", _ERRORS, f"ExitCode.{c}")
       for c in ("OK", "FAIL", "BAD_INPUT", "PAUSED", "INTERRUPTED")},
}  # fmt: skip

#: the errors of kinv's own steps that sat in kinv.kernels.errors for one day of 0.2.0's development and live in
#: kinv.agent.errors: kinv.kernels imports nothing from kinv.agent, so the old path names the new one and fails
AGENT_ERRORS = (
    "StateDamaged", "Interrupted", "PlanError", "PatchError", "NotFound", "TooBig", "StoreError", "NoState",
    "BackendError", "NoRecording", "NoDevice", "VariantFailed", "Incorrect", "Tampered", "WorkerCrashed", "WorkerError",
    "JudgeFailed", "IncumbentFailed", "HarnessBroken", "EnvMismatch", "RevertError", "LockedElsewhere", "ExecutorError",
    "InvestigationError", "CampaignError", "AdoptError", "NoGain",
)  # fmt: skip


def message(module: str, name: str) -> str:
    """The one line a moved name's warning says: the old path, the new one, and the release that removes the old."""
    m = MOVED[(module, name)]
    new_module, _, new_name = m.public.rpartition(".")
    if not m.public:
        instead = f"it has no public replacement ({m.note})"
    elif new_module.startswith("kinv.") and new_name == name:
        instead = f"import {name} from {new_module}"
    else:
        instead = f"use {m.public}"
    return (f"{module}.{name} is deprecated since {DEPRECATED_IN}: {instead} (the old path is removed in "
            f"{REMOVED_IN})")  # fmt: skip


def moved(module: str, name: str, stacklevel: int = 3):
    """The object ``module.name`` stands for, with a DeprecationWarning; AttributeError for a name never moved.
    Called from the old module's ``__getattr__``, so the warning points at the line that imported the name."""
    if (module, name) not in MOVED:
        if module == _ERRORS and name in AGENT_ERRORS:
            raise AttributeError(f"{module}.{name} moved to kinv.agent.errors.{name} in 0.2.0 (an error of kinv's own "
                                 "steps, which a plugin does not raise)")  # fmt: skip
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    m = MOVED[(module, name)]
    warnings.warn(message(module, name), DeprecationWarning, stacklevel=stacklevel)
    obj = importlib.import_module(m.home)
    for part in m.attr.split("."):
        obj = getattr(obj, part)
    return obj
