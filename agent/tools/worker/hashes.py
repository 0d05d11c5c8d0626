"""Every hash kinv keys a measurement by, in one module: the timing harness's code, a kernel's source, its
reference (and metric) definitions.

A hash reads the files as they are on disk at each call, and hashes a Python file's code
(:func:`code_text`): rewording a comment or a docstring changes no hash, any change to code does.

Imports: the standard library only (the benchmark worker imports it on a GPU machine that has nothing else of
kinv's dependencies); kernels are resolved by name through :mod:`kinv.kernels.adapter`, imported when asked.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

#: the files whose code is the timing harness: what runs in a worker or the judge between the kernel and the number
#: (or the verdict on its outputs) stored
HARNESS_FILES = ("bench_worker.py", "refresh.py", "shared.py", "judging.py", "gate.py", "compare.py", "tamper.py")


def code_text(text: str) -> str:
    """A Python file's code without what never runs: comments, docstrings, blank lines and trailing spaces.

    Rewording a docstring or a comment leaves a file's hash, and so the recordings keyed by it, as they were;
    any change to code changes it.  Positions come from ``tokenize`` (comments) and ``ast`` (docstrings),
    which agree across Python versions, so a GPU worker and a CPU machine hash the same file alike.  Text
    that does not parse is returned whole (hashed byte for byte)."""
    import ast
    import io
    import tokenize

    try:
        tree = ast.parse(text)
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (SyntaxError, tokenize.TokenError, ValueError):
        return text
    cuts = [(t.start, t.end) for t in tokens if t.type == tokenize.COMMENT]
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and body:
            first = body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                cuts.append(((first.lineno, first.col_offset), (first.end_lineno, first.end_col_offset)))
    lines = text.splitlines()
    for (r0, c0), (r1, c1) in sorted(cuts, reverse=True):
        head, tail = lines[r0 - 1][:c0], lines[r1 - 1][c1:]
        lines[r0 - 1 : r1] = [head + tail]
    return "\n".join(line.rstrip() for line in lines if line.strip())


_PARSE_LOCK = threading.Lock()  # CPython 3.11's ast.parse is not safe in threads at once (arms open in threads)
_CODE_HASHES: dict[bytes, str] = {}  # a file's bytes digest -> its code hash (a file is parsed once per content)


def file_hash(path: Path) -> str:
    """Hash of a file as it runs: a Python file's code (:func:`code_text`), any other file's bytes."""
    data = path.read_bytes()
    if path.suffix != ".py":
        return hashlib.sha256(data).hexdigest()[:12]
    digest = hashlib.sha256(data).digest()
    with _PARSE_LOCK:
        if digest not in _CODE_HASHES:
            code = code_text(data.decode("utf-8", errors="surrogateescape"))
            _CODE_HASHES[digest] = hashlib.sha256(code.encode("utf-8", errors="surrogateescape")).hexdigest()[:12]
        return _CODE_HASHES[digest]


def harness_hash() -> str:
    """Hash of the timing harness: the code of the worker's files (:data:`HARNESS_FILES`), in that order."""
    here = Path(__file__).parent
    h = hashlib.sha256()
    for name in HARNESS_FILES:
        h.update(f"{name}:{file_hash(here / name)}\0".encode())
    return h.hexdigest()[:12]


def source_on_disk(path: Path, qualname: str) -> str:
    """The source of a function or method as its file says NOW (not what was imported)."""
    import ast

    try:
        text = path.read_text()
        with _PARSE_LOCK:
            nodes = ast.parse(text).body
    except (OSError, SyntaxError) as exc:
        return f"<{path.name} unreadable: {type(exc).__name__}>"
    node = None
    for part in qualname.split("."):
        node = next((n for n in nodes if isinstance(n, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef)
                     and n.name == part), None)  # fmt: skip
        if node is None:
            return f"<{qualname} missing from {path.name}>"
        nodes = node.body
    return ast.get_source_segment(text, node) or ""


def reference_hash(adapter, root: Path | None = None) -> str:
    """Hash of the adapter's reference and metric definitions, read from disk at each call."""
    root = root or adapter.root()
    src = "".join(source_on_disk(root / f, q) for f, q in adapter.reference_parts)
    return hashlib.sha256(src.encode()).hexdigest()[:12]


def kernel_source_hash(adapter, root: Path | None = None) -> str:
    """Hash of the kernel's source files' code as it is on disk (what a source patch changes; a comment or a
    docstring does not: :func:`code_text`)."""
    root = root or adapter.root()
    h = hashlib.sha256()
    for f in adapter.kernel_files:
        h.update(file_hash(root / f).encode())
    return h.hexdigest()[:12]


_REFERENCE_HASHES: dict[bytes, str] = {}  # the reference files' bytes digest -> their reference hash


def _reference_files(adapter) -> bytes:
    h = hashlib.sha256()
    for f, qualname in adapter.reference_parts:
        path = adapter.root() / f
        h.update(f"{f}:{qualname}\0".encode() + (path.read_bytes() if path.is_file() else b"<missing>"))
    return h.digest()


def kernel_reference_hash(kernel: str) -> str:
    """:func:`reference_hash` of the kernel named ``kernel``, as its files are on disk now.  The files are read at
    every call; their sources are parsed again only when their bytes changed (a run asks at every measurement)."""
    from kinv.kernels.adapter import get_adapter

    adapter = get_adapter(kernel)
    before = _reference_files(adapter)
    if before not in _REFERENCE_HASHES:
        value = reference_hash(adapter)
        if _reference_files(adapter) != before:  # edited while it was parsed: do not keep it under either text
            return value
        _REFERENCE_HASHES[before] = value
    return _REFERENCE_HASHES[before]


def kernel_hash(kernel: str) -> str:
    """:func:`kernel_source_hash` of the kernel named ``kernel`` (a source patch changes it)."""
    from kinv.kernels.adapter import get_adapter

    return kernel_source_hash(get_adapter(kernel))


__all__ = ["HARNESS_FILES", "code_text", "file_hash", "harness_hash", "kernel_hash", "kernel_reference_hash",
           "kernel_source_hash", "reference_hash", "source_on_disk"]
