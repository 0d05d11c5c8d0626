"""Copies of a kernel package that a worker imports instead of the live one.

Two users: the graph's baseline snapshot (``<state>/snapshots/<kernel hash>/``, the baseline arm's source while
a variant's source patch is on disk) and a Ray actor's own copy (each actor materializes the package it is
sent, so kernels on several GPUs share nothing on disk and a patch or an edit in the checkout never reaches a
worker mid-measurement).  A copy holds the package's sources and its ``configs/`` (never recordings, caches, or
other JSON), laid out under the package's dotted name, so that putting the copy's root first on PYTHONPATH
shadows the live package (kinv/__init__.py builds ``kinv``'s search path in that order).
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

SKIP_DIRS = {"recordings", "__pycache__"}


def package_files(src: Path) -> dict[str, bytes]:
    """The files of a package directory that a copy holds: relative path -> bytes."""
    out: dict[str, bytes] = {}
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        rel_dir = Path(dirpath).relative_to(src)
        for f in sorted(filenames):
            rel = rel_dir / f
            if f.endswith(".json") and rel.parts[0] != "configs":
                continue
            out[rel.as_posix()] = (Path(dirpath) / f).read_bytes()
    return out


PARENT_SHIM = """# kinv snapshot: package {name!r} as installed, with this copy's sub-package first on its path.
# A copy of a sub-package must shadow the live one, and an ``__init__``-less folder never shadows a regular
# package: this file runs the live package's own __init__ and puts the live folder after this one.
__path__.append({live!r})
__file__ = {init!r}
exec(compile(open({init!r}, "rb").read(), {init!r}, "exec"))
"""


def parent_shims(package_name: str) -> dict[str, bytes]:
    """The ``__init__.py`` of each parent package of a plugin in a sub-package (``mypkg`` of ``mypkg.kernels``):
    a shim that runs the live parent's own ``__init__`` and keeps its other modules importable, so that the copy
    of the sub-package is what ``import mypkg.kernels`` finds.  None for kinv's own kernels (kinv/__init__.py
    builds its search path from every portion) or a top-level package."""
    import importlib

    parts = package_name.split(".")
    if parts[0] == "kinv" or len(parts) == 1:
        return {}
    out = {}
    for i in range(1, len(parts)):
        name = ".".join(parts[:i])
        mod = importlib.import_module(name)
        init = getattr(mod, "__file__", None)
        if not init:  # a namespace package: an __init__-less copy joins it as a portion, first on the path
            continue
        live = os.path.dirname(os.path.abspath(init))
        out["/".join(parts[:i]) + "/__init__.py"] = PARENT_SHIM.format(name=name, live=live, init=init).encode()
    return out


def materialize(files: dict[str, bytes], root: Path, package_name: str) -> Path:
    """Write ``files`` as package ``package_name`` under ``root`` (atomically: a half-written copy is never
    used), with :func:`parent_shims` for a sub-package; an existing complete copy is kept.  Returns ``root``
    (what goes first on PYTHONPATH)."""
    pkg = Path(*package_name.split("."))
    if (root / pkg / "__init__.py").exists():
        return root
    tmp = root.with_name(f"{root.name}.tmp{os.getpid()}-{threading.get_ident()}")
    shutil.rmtree(tmp, ignore_errors=True)
    for rel, data in parent_shims(package_name).items():
        dest = tmp / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
    for rel, data in files.items():
        dest = tmp / pkg / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
    shutil.rmtree(root, ignore_errors=True)
    tmp.rename(root)
    return root
