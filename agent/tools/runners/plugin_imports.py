"""What a plugin imports from kinv, read from its source: the lines ``kinv check`` prints about them.

A plugin's public API is one module, :mod:`kinv.plugin`.  This reads every ``.py`` file of the plugin's package
(``ast``: nothing is imported or run) and returns, in file and line order:

- for each name imported from an old path (:data:`kinv.kernels.moved.MOVED`), the ``DeprecationWarning`` that
  import raises, one line each, as Python prints a warning (``file:line: DeprecationWarning: ...``);
- for each import of a kinv module other than ``kinv.plugin`` (``kinv.agent.*``, ``kinv.kernels.*``), one line naming
  the public replacement of what it imports, where there is one.

kinv's own adapters import its internals by design, and get no lines.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from kinv.kernels.moved import MOVED, message

PUBLIC = "kinv.plugin"
MAX_FILES = 400  # a plugin's package, not a whole tree
MAX_BYTES = 1 << 20
SKIP_DIRS = {"__pycache__", "build", "dist", ".git", ".venv", "venv", "node_modules"}


def _public_names() -> set[str]:
    import kinv.plugin

    return set(kinv.plugin.__all__)


def _is_private(module: str) -> bool:
    return (module == "kinv" or module.startswith("kinv.")) and module != PUBLIC


def _replacement(module: str, name: str, public: set[str]) -> str | None:
    """What a plugin imports from kinv.plugin instead of ``module.name``, or None where nothing public replaces it."""
    m = MOVED.get((module, name))
    if m is not None:
        return m.public.rpartition(".")[2] if m.public.startswith(PUBLIC + ".") else None
    if module == "kinv.kernels" and name == "quick":
        return "kernel, from_autotune"
    if module == "kinv" and name == PUBLIC.rpartition(".")[2]:
        return name
    return name if name in public else None


def files_of(adapter) -> tuple[Path, list[Path]]:
    """The plugin's source files (its top package's, or its module's alone when it is not in a package) and the
    folder they are shown relative to."""
    top = type(adapter).__module__.split(".")[0]
    mod = sys.modules.get(top)
    dirs = [Path(p) for p in getattr(mod, "__path__", [])]
    if not dirs:
        path = Path(getattr(sys.modules.get(type(adapter).__module__), "__file__", "") or "")
        return path.parent, [path] if path.is_file() else []
    out: list[Path] = []
    for d in dirs:
        for p in sorted(d.rglob("*.py")):
            if not SKIP_DIRS & set(p.relative_to(d).parts[:-1]) and not any(
                    part.endswith(".egg-info") for part in p.parts):  # fmt: skip
                out.append(p)
    return dirs[0].parent, out[:MAX_FILES]


def _lines_of(tree: ast.AST, where, public: set[str]) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    modules: dict[str, str] = {}  # a local name bound to a kinv module -> that module (for `alias.Name` uses)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level and _is_private(node.module or ""):
            src = node.module
            for a in node.names:
                if (src, a.name) in MOVED:
                    out.append((node.lineno, f"{where(node)}: DeprecationWarning: {message(src, a.name)}"))
                if a.name.isidentifier() and f"{src}.{a.name}".startswith("kinv."):
                    modules[a.asname or a.name] = f"{src}.{a.name}"
            names = [a.name for a in node.names]
            if src == "kinv" and names == [PUBLIC.rpartition(".")[2]]:
                continue  # from kinv import plugin
            found = [(n, _replacement(src, n, public)) for n in names]
            has = [r for _, r in found if r]
            lacks = [n for n, r in found if not r]
            said = f"{where(node)}: private import from {src}:"
            if has:
                said += f" import {', '.join(dict.fromkeys(has))} from {PUBLIC}"
            if lacks:
                said += (";" if has else "") + (f" {', '.join(lacks)} {'has' if len(lacks) == 1 else 'have'} no public "
                                                "replacement (internal: it may change in any release)")  # fmt: skip
            out.append((node.lineno, said))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if _is_private(a.name):
                    out.append((node.lineno, f"{where(node)}: private import of {a.name}: import what the plugin uses "
                                             f"from {PUBLIC}"))  # fmt: skip
                    if a.asname:
                        modules[a.asname] = a.name
    for node in ast.walk(tree):  # `import kinv.kernels.launch_config as lc` ... `lc.Restriction`
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                and (modules[node.value.id], node.attr) in MOVED):  # fmt: skip
            out.append((node.lineno, f"{where(node)}: DeprecationWarning: {message(modules[node.value.id], node.attr)}"))
    return out


def scan(adapter) -> list[str]:
    """The lines ``kinv check`` prints about the plugin's kinv imports (the module docstring); empty for kinv's own
    kernels and for a plugin that imports only :mod:`kinv.plugin`."""
    if type(adapter).__module__.split(".")[0] == "kinv":
        return []
    base, paths = files_of(adapter)
    public = _public_names()
    out: list[str] = []
    for path in paths:
        try:
            if path.stat().st_size > MAX_BYTES:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue  # the import of the adapter said what was wrong with a file it needs
        try:
            shown = path.relative_to(base).as_posix()
        except ValueError:
            shown = str(path)
        out += [line for _, line in sorted(_lines_of(tree, lambda n, s=shown: f"{s}:{n.lineno}", public),
                                           key=lambda x: x[0])]  # fmt: skip
    return out
