"""Two revisions of a git checkout, read without touching it: which kernels differ between them, and a snapshot of
each revision's kernel package for the arms of ``kinv regress``.

Nothing here switches, stashes, resets or writes into the checkout: a committed revision is read with ``git
archive`` (its files streamed into a temporary folder), the working tree by reading its files.  Each revision's
package becomes a snapshot (:mod:`kinv.agent.tools.files.snapshot`) named by its kernel source hash, the layout a
baseline snapshot has: put first on a worker's PYTHONPATH it shadows the live package, and the worker proves it
imported that very source (its reported kernel hash must be the snapshot's name).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kinv.agent.tools.files.snapshot import SKIP_DIRS, materialize
from kinv.kernels.errors import BadInput, StepFailed

WORKTREE = "the working tree"
"""How ``kinv regress`` names HEAD when none is given: the checkout's files as they are now, uncommitted changes
included."""


def _git(repo: Path, *args: str, binary: bool = False) -> str | bytes:
    try:
        r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, timeout=120)
    except FileNotFoundError:
        raise StepFailed("git is not installed here: kinv regress reads the two revisions with git") from None
    except subprocess.TimeoutExpired:
        raise StepFailed(f"git {' '.join(args[:2])} in {repo} took over 120 s") from None
    if r.returncode != 0:
        said = r.stderr.decode(errors="replace").strip().splitlines()
        raise StepFailed(
            f"git {' '.join(args[:2])} failed in {repo}: {said[-1] if said else 'exit ' + str(r.returncode)}"
        )
    return r.stdout if binary else r.stdout.decode(errors="replace")


def repo_root(where: Path | str | None = None) -> Path:
    """The top of the git checkout that holds ``where`` (default: the working directory); BadInput outside one."""
    where = Path(where or os.getcwd())
    if not where.is_dir():
        raise BadInput(f"--repo {where} is not a directory: name a git checkout")
    try:
        r = subprocess.run(["git", "-C", str(where), "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                           timeout=30)  # fmt: skip
    except FileNotFoundError:
        raise StepFailed("git is not installed here: kinv regress reads the two revisions with git") from None
    if r.returncode != 0:
        raise BadInput(f"{where} is not in a git checkout: kinv regress compares two revisions of one (run it in "
                       "the checkout, or name it with --repo)")  # fmt: skip
    return Path(r.stdout.strip()).resolve()


@dataclass(frozen=True)
class Revision:
    """One side of a comparison: ``name`` as the user gave it, ``sha`` the commit (for the working tree: the commit
    it sits on, ``dirty`` when it holds uncommitted changes)."""

    name: str
    sha: str
    worktree: bool = False
    dirty: bool = False
    date: str = ""  # the commit's date (ISO 8601)

    @property
    def label(self) -> str:
        if self.worktree:
            return f"{WORKTREE} (on {self.sha[:10]}{', with uncommitted changes' if self.dirty else ''})"
        return self.name if self.name.startswith(self.sha[:7]) else f"{self.name} ({self.sha[:10]})"


def resolve(repo: Path, name: str | None) -> Revision:
    """The revision ``name`` of ``repo`` (None: the working tree); BadInput naming it when git knows no such
    commit."""
    if name is None:
        sha = _git(repo, "rev-parse", "--verify", "HEAD^{commit}").strip()
        dirty = bool(_git(repo, "status", "--porcelain", "--untracked-files=no").strip())
        return Revision(WORKTREE, sha, worktree=True, dirty=dirty, date=_date(repo, sha))
    from kinv.agent.ids import shown

    if not name.strip() or name.startswith("-") or any(c in name for c in "\0\n\r"):
        raise BadInput(f"revision {shown(name, 80)} is not valid: name a commit, branch or tag (e.g. main, HEAD~1)")
    r = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{name}^{{commit}}"],
                       capture_output=True, text=True, timeout=30)  # fmt: skip
    if r.returncode != 0:
        raise BadInput(f"revision {shown(name, 80)} is not a commit of {repo}: name a commit, branch or tag "
                       "(git log --oneline lists them)")  # fmt: skip
    sha = r.stdout.strip()
    return Revision(name, sha, date=_date(repo, sha))


def _date(repo: Path, sha: str) -> str:
    return _git(repo, "show", "-s", "--format=%cI", sha).strip()


# --------------------------------------------------------------------------- #
# a revision's files
# --------------------------------------------------------------------------- #
def package_at(repo: Path, rev: Revision, rel: str) -> dict[str, bytes]:
    """The files of the package at ``rel`` (a folder of ``repo``) in ``rev``, as a snapshot holds them (sources and
    ``configs/``; never recordings or other JSON): relative path -> bytes.  Empty when the revision has no such
    folder."""
    out: dict[str, bytes] = {}
    if rev.worktree:
        src = repo / rel
        if not src.is_dir():
            return {}
        for dirpath, dirnames, filenames in os.walk(src):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            for f in sorted(filenames):
                p = Path(dirpath) / f
                sub = p.relative_to(src)
                if _kept(sub):
                    out[sub.as_posix()] = p.read_bytes()
        return out
    listed = _git(repo, "ls-tree", "-r", "--name-only", rev.sha, "--", rel).split("\n")
    if not any(listed):
        return {}
    data = _git(repo, "archive", "--format=tar", rev.sha, "--", rel, binary=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for m in tar.getmembers():
            if not m.isfile():
                continue
            sub = Path(m.name).relative_to(rel)
            if _kept(sub):
                out[sub.as_posix()] = tar.extractfile(m).read()
    return out


def tree_at(repo: Path, rev: Revision) -> dict[str, bytes]:
    """Every file of ``rev`` (a commit's tracked files; the working tree's tracked and untracked files that git does
    not ignore): what a command benchmark runs from, each revision from its own checkout.  Relative path -> bytes."""
    if not rev.worktree:
        data = _git(repo, "archive", "--format=tar", rev.sha, binary=True)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    listed = _git(repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    return {f: (repo / f).read_bytes() for f in listed if f and (repo / f).is_file()}


def write_tree(files: dict[str, bytes], where: Path) -> Path:
    """A revision's files written as a checkout of their own (``where/<digest>``, kept if complete); returns it."""
    import shutil

    dest = where / files_digest(files)
    if dest.is_dir():
        return dest
    tmp = where / f"{dest.name}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    for rel, data in files.items():
        f = tmp / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(data)
    tmp.rename(dest)
    return dest


def changed(base: dict[str, bytes], head: dict[str, bytes]) -> list[str]:
    """The paths whose bytes differ between two trees (added and removed ones included), sorted."""
    return sorted(f for f in set(base) | set(head) if base.get(f) != head.get(f))


def _kept(sub: Path) -> bool:
    """What a snapshot keeps of a package (agent/tools/files/snapshot.py's rule): sources and configs."""
    if any(part in SKIP_DIRS for part in sub.parts[:-1]) or sub.name.endswith((".pyc", ".kinv-lock")):
        return False
    return not (sub.name.endswith(".json") and sub.parts[0] != "configs")


def package_rel(repo: Path, adapter) -> str | None:
    """Where ``adapter``'s package sits in ``repo``: its path there when this process imported it from the checkout,
    else its path relative to the adapter's root (``kernels`` for kinv's own) when ``repo`` has such a folder."""
    pkg = adapter.package_dir()
    try:
        return pkg.resolve().relative_to(repo).as_posix()
    except ValueError:
        pass
    rel = pkg.relative_to(adapter.root()).as_posix()
    return rel if (repo / rel).is_dir() or _git(repo, "ls-tree", "--name-only", "HEAD", "--", rel).strip() else None


# --------------------------------------------------------------------------- #
# what differs
# --------------------------------------------------------------------------- #
def own_files(adapter) -> set[str]:
    """The package-relative files that belong to ``adapter``'s kernel alone: its kernel sources, its reference
    files, its adapter module and its config."""
    pkg_rel = adapter.package_dir().relative_to(adapter.root()).as_posix()

    def in_pkg(f: str) -> str:
        return f.removeprefix(pkg_rel + "/")

    files = {in_pkg(f) for f in adapter.kernel_files} | {in_pkg(f) for f, _ in adapter.reference_parts}
    files.add(Path(type(adapter).__module__.replace(".", "/")).name + ".py")
    files.add(f"configs/{adapter.name}.json")
    return files


def config_of(files: dict[str, bytes], kernel: str) -> dict | None:
    """The kernel's config in a package's files (its description dropped), None when it has none or it is not
    JSON."""
    raw = files.get(f"configs/{kernel}.json")
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return {k: v for k, v in data.items() if k != "description"} if isinstance(data, dict) else None


def differences(adapter, base: dict[str, bytes], head: dict[str, bytes], others: set[str],
                same_code: Callable[[bytes, bytes], bool] = bytes.__eq__) -> list[str]:  # fmt: skip
    """What differs for ``adapter``'s kernel between two revisions' package files (``others``: the files of the
    package's other kernels, which do not concern this one): ``["kernel source", "config", "adapter", ...]``, empty
    when nothing that runs it differs.  The kernel's sources are compared by ``same_code`` (the caller's: the
    kernel source hash's rule, where comments do not count); a config by its values (its description does not
    count)."""
    pkg_rel = adapter.package_dir().relative_to(adapter.root()).as_posix()
    kernel_files = {f.removeprefix(pkg_rel + "/") for f in adapter.kernel_files}
    refs = {f.removeprefix(pkg_rel + "/") for f, _ in adapter.reference_parts}
    cfg = f"configs/{adapter.name}.json"
    said: list[str] = []
    for f in sorted(set(base) | set(head)):
        a, b = base.get(f), head.get(f)
        if a == b or (f in others and f not in kernel_files):
            continue
        if f in kernel_files:
            if a is not None and b is not None and same_code(a, b):
                continue
            what = "kernel source"
        elif f == cfg:
            if config_of(base, adapter.name) == config_of(head, adapter.name):
                continue
            what = "config"
        elif f in refs:
            what = "reference"
        elif f.startswith("configs/"):
            continue  # another kernel's config
        else:
            what = f"{f}"
        if what not in said:
            said.append(what)
    return said


def snapshot(files: dict[str, bytes], where: Path, adapter, kernel_source_hash: Callable) -> Path:
    """Materialize a revision's package files under ``where`` as the snapshot its arms import
    (``where/<kernel source hash>/<package as dotted name>``, the hash by ``kernel_source_hash(adapter, root)``, the
    one a worker reports); returns the folder to put first on PYTHONPATH."""
    name = adapter.package_name()
    staging = materialize(files, where / "staging", name)
    root = staging / Path(*name.split(".")).parent  # what the adapter's root() is inside the copy
    khash = kernel_source_hash(adapter, root)
    dest = where / khash
    if dest.exists():
        import shutil

        shutil.rmtree(staging, ignore_errors=True)
        return dest
    staging.rename(dest)
    return dest


def files_digest(files: dict[str, bytes]) -> str:
    """A short digest of a package's files (what a snapshot holds), for the record."""
    h = hashlib.sha256()
    for k in sorted(files):
        h.update(k.encode() + b"\0" + hashlib.sha256(files[k]).digest())
    return h.hexdigest()[:12]


__all__ = ["WORKTREE", "Revision", "changed", "config_of", "differences", "files_digest", "own_files", "package_at",
           "package_rel", "repo_root", "resolve", "snapshot", "tree_at", "write_tree"]  # fmt: skip
