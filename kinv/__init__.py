"""kinv: agent-driven GPU kernel optimization investigations.

kinv installs one namespace, ``kinv``: ``kinv.agent`` (the planner, the CLI, the store) and
``kinv.kernels`` (the kernel adapters and kinv's own Triton kernels), so that no top-level ``agent`` or
``kernels`` package collides with other distributions (the Hugging Face ``kernels`` package, for one).

The folders stay where the project layout puts them (``agent/``, ``agent/tools/``, ``kernels/`` at the
repository root).  A wheel maps them under ``kinv/`` (setuptools ``package-dir``).  In a source checkout,
this file sits in ``kinv/`` beside those folders and adds the checkout root to the package's search path,
so ``python -m kinv.agent.cli.app`` runs from a checkout with nothing installed (the GPU box runs it so).

The search path is built in ``sys.path`` order from every ``kinv`` portion found there.  A baseline
snapshot (``<state>/snapshots/<hash>/kinv/kernels``) put first on PYTHONPATH therefore shadows the live
kernel package, and a copy of the project (the fault drill's) shadows the checkout it was copied from.
"""

from __future__ import annotations

import os
import sys

__version__ = "0.3.0"


def _search_path(own: list[str]) -> list[str]:
    portions: list[str] = []
    for entry in [*sys.path, *own]:
        base = os.path.abspath(entry or os.getcwd())
        d = base if entry in own else os.path.join(base, "kinv")
        if not os.path.isdir(d) or d in portions:
            continue
        portions.append(d)
        # a source checkout: agent/ and kernels/ sit beside kinv/, not inside it (a copy of the project may
        # hold only kernels/: its kinv.kernels is the copy's, and kinv.agent comes from a later portion)
        parent = os.path.dirname(d)
        if (os.path.isfile(os.path.join(d, "__init__.py")) and not os.path.isdir(os.path.join(d, "agent"))
                and any(os.path.isfile(os.path.join(parent, sub, "__init__.py")) for sub in ("agent", "kernels"))):
            portions.append(parent)
    return portions


__path__ = _search_path(list(__path__))  # noqa: F821 (set by the import system)

# the directory to put on a child process's PYTHONPATH so that it imports this same kinv
IMPORT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
