"""Benchmark backends as plugins: each is one module here (or anywhere importable) and one registration.

* ``cuda`` (:mod:`.cuda`): live on this machine's GPU, a worker subprocess per arm;
* ``replay`` (:mod:`.replay`): samples recorded on a real GPU, served without one;
* ``command`` (:mod:`.command`): a plan's own command, one run per sample (``kernel: command`` plans);
* ``auto``: cuda when a GPU is visible, replay otherwise;
* ``ray`` (:mod:`.ray`): the arms of any of them hosted on Ray actors, one per GPU (built by the Ray
  executor around the backend it wraps, not by name).

Adding a backend: subclass :class:`~.base.Backend` (and :class:`~.base.Arm`) honouring the arm contract in
:mod:`.base`, then ``register_backend("name", "package.module:Class")`` (or the class itself).  A registered
name is a valid ``--backend`` at once (:data:`BACKENDS`).
"""

from __future__ import annotations

import importlib

from kinv.agent.errors import BackendError
from kinv.agent.tools.backends.base import Backend, gpu_visible

_REGISTRY: dict[str, object] = {}
BACKENDS: list[str] = ["auto"]
"""Every valid ``--backend`` name, ``auto`` first; :func:`register_backend` adds to it in place."""


def register_backend(name: str, cls) -> None:
    """Make ``name`` a backend: ``cls`` is a :class:`Backend` subclass or ``"module:Class"`` (imported when
    first asked for).  Built with no arguments by :func:`get_backend`."""
    if name == "auto":
        raise ValueError("'auto' is not a backend's name: it picks cuda or replay")
    _REGISTRY[name] = cls
    if name not in BACKENDS:
        BACKENDS.append(name)


def backend_class(name: str) -> type[Backend]:
    cls = _REGISTRY[name]
    if isinstance(cls, str):
        module, _, attr = cls.partition(":")
        cls = _REGISTRY[name] = getattr(importlib.import_module(module), attr)
    return cls


def get_backend(name: str) -> Backend:
    """Resolve a backend name (``auto``: cuda when a GPU is visible, replay otherwise; it says which it picked
    through ``.loud``)."""
    if name not in BACKENDS:
        raise BackendError(f"unknown backend {name!r}; valid: {', '.join(BACKENDS)}")
    if name == "auto":
        name = "cuda" if gpu_visible() else "replay"
    return backend_class(name)()


register_backend("cuda", "kinv.agent.tools.backends.cuda:CudaBackend")
register_backend("replay", "kinv.agent.tools.backends.replay:ReplayBackend")
register_backend("command", "kinv.agent.tools.backends.command:CommandBackend")
