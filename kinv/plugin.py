"""kinv's public API for plugin authors: everything a kernel adapter needs, from one module.

    from kinv.plugin import KernelAdapter, Level, Params, Resources, TunableSpec, Tunable, occupancy

A plugin imports from here and nowhere else in kinv.  Every name below is kept, with its signature, for the whole
0.x series unless docs/plugin-api.md's stability promise says otherwise: a minor release may add names, and add
keyword arguments with defaults; it removes or changes a name only after two minor releases of a
``DeprecationWarning`` that names the new path and the release that removes the old one, and the CHANGELOG records
it.  ``kinv check`` prints those warnings, and a line for every import of a kinv module other than this one.

The building blocks of an adapter:

- :class:`KernelAdapter`: the abstract class a kernel's adapter subclasses (one per kernel).
- :class:`Level`: one workload level (named dimensions, a key, a label).
- :class:`Params`: a config resolved at a level, as the launch sees it (``params.BLOCK_T``).
- :class:`Tunable`, :class:`Restriction`, :class:`TunableSpec`: the tunables a kernel declares.
- :class:`Resources`, :class:`DeviceSpec`, :func:`occupancy`, :func:`get_device`: what a config costs on a device.
- :class:`Premise`: a quantity of the kernel's own that a variant's ``targets`` may name.
- :func:`check_level_values`: the usual check of a workload's swept values.

The short path, a whole adapter class from declarations:

- :func:`kernel` (``kinv.kernels.quick.kernel`` before 0.3.0) and :func:`from_autotune` (from a
  ``@triton.autotune`` kernel).

The errors a plugin raises (each ends a command with its exit code):

- :class:`BadInput` (exit 2), :class:`ConfigError` (exit 2, a config), :class:`StepFailed` (exit 1), and their base
  :class:`KinvError`.
"""

from __future__ import annotations

from kinv.kernels.adapter import KernelAdapter, Level, Premise, Resources, check_level_values
from kinv.kernels.devices import DeviceSpec, get_device, occupancy
from kinv.kernels.errors import BadInput, ConfigError, KinvError, StepFailed
from kinv.kernels.quick import from_autotune, kernel
from kinv.kernels.tunables import Params, Restriction, Tunable, TunableSpec

__all__ = [
    # the adapter
    "KernelAdapter",
    "Level",
    "Params",
    "Premise",
    "Resources",
    "check_level_values",
    # the tunables
    "Restriction",
    "Tunable",
    "TunableSpec",
    # the device
    "DeviceSpec",
    "get_device",
    "occupancy",
    # the short path
    "kernel",
    "from_autotune",
    # the errors
    "KinvError",
    "BadInput",
    "ConfigError",
    "StepFailed",
]
