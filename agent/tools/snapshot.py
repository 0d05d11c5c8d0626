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


def materialize(files: dict[str, bytes], root: Path, package_name: str) -> Path:
    """Write ``files`` as package ``package_name`` under ``root`` (atomically: a half-written copy is never
    used); an existing complete copy is kept.  Returns ``root`` (what goes first on PYTHONPATH)."""
    pkg = Path(*package_name.split("."))
    if (root / pkg / "__init__.py").exists():
        return root
    tmp = root.with_name(f"{root.name}.tmp{os.getpid()}-{threading.get_ident()}")
    shutil.rmtree(tmp, ignore_errors=True)
    for rel, data in files.items():
        dest = tmp / pkg / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
    shutil.rmtree(root, ignore_errors=True)
    tmp.rename(root)
    return root
