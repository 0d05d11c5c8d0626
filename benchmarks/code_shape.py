"""The shape of kinv's code: lines per folder, import circles, imports that climb, re-export facades.

    python benchmarks/code_shape.py            # the figures, from the repository this script sits in
    python benchmarks/code_shape.py --root DIR

Standard library only (ast): nothing of kinv is imported, so it runs in a second on any checkout.

- lines: the lines of every tracked-looking ``.py`` file, per top folder (agent/tools is its own row).
- circles: strongly connected components of more than one module in kinv's import graph. Every import
  counts, an import inside a function too: a lazy import still ties the two modules together.
- climbs: an import from a module to a module on a higher floor of ``FLOORS`` (top to bottom).
- facades: a module that imports a name from another kinv module and never uses it itself (a re-export;
  an ``__init__`` that lists it in ``__all__`` is one too), and every caller that imports a name from a module
  that only imported it instead of from the module that defines it.
- long modules: product modules (agent/, kernels/) over ``LONG`` lines.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
from collections import defaultdict

# The rooms, top to bottom, as path prefixes relative to the repository root: one room per folder, as a reader
# sees the tree (a folder is never split into two floors, so an import inside it is never hidden as a climb and
# an import from a room below into it always counts). A module may import from its own room and the rooms below
# it. A move of files into new folders updates this table.
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    ("cli", ("agent/cli/",)),
    ("campaign", ("agent/campaign/",)),
    ("workstream", ("agent/workstream/",)),
    ("report", ("agent/report/", "agent/plan_reference.py")),
    ("runners", ("agent/tools/runners/",)),
    ("measure", ("agent/tools/measure/",)),
    ("backends", ("agent/tools/backends/",)),
    ("worker", ("agent/tools/worker/",)),
    ("files", ("agent/tools/files/",)),
    ("store", ("agent/store/",)),
    ("plan", ("agent/plan.py", "agent/plan_file.py", "agent/plan_sections.py")),
    ("kernel interface", ("kernels/adapter.py", "kernels/launch_config.py", "kernels/tunables.py", "kernels/quick.py",
                          "kernels/command_adapter.py", "kernels/devices.py", "kernels/hashes.py")),
    ("errors, words, ids", ("agent/errors.py", "agent/words.py", "agent/ids.py", "agent/logs.py", "agent/signals.py",
                            "agent/faults.py", "agent/fmt.py", "kernels/errors.py", "kernels/moved.py")),
]

# the product's packages: folder -> the dotted name it installs as
PACKAGES = {"agent": "kinv.agent", "kernels": "kinv.kernels"}
LONG = 500
SKIP_DIRS = {".git", ".venv", "venv", "__pycache__", "node_modules", "state", ".pytest_cache", "build"}


def py_files(root: str) -> list[str]:
    """Every ``.py`` file under root (relative paths, sorted), skipping environments and caches, and the frozen
    plugins under tests/plugins/ (outside packages written against an old kinv, whose old imports are the point)."""
    out = []
    for d, dirs, files in os.walk(root):
        frozen = os.path.relpath(d, root).replace(os.sep, "/") == "tests/plugins"
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS and not x.endswith(".egg-info")
                         and not (frozen and os.path.isfile(os.path.join(d, x, "pyproject.toml"))))
        out += [os.path.relpath(os.path.join(d, f), root) for f in files if f.endswith(".py")]
    return sorted(p.replace(os.sep, "/") for p in out)


def module_name(path: str) -> str | None:
    """The dotted name a product file imports as (``agent/tools/runners/bench.py`` -> ``kinv.agent.tools.runners.bench``)."""
    top = path.split("/", 1)[0]
    if top not in PACKAGES:
        return None
    rest = path[len(top) + 1:-3].split("/")
    if rest[-1] == "__init__":
        rest = rest[:-1]
    return ".".join([PACKAGES[top], *[r for r in rest if r]])


def floor_of(path: str) -> int | None:
    for i, (_, prefixes) in enumerate(FLOORS):
        if any(path == p or (p.endswith("/") and path.startswith(p)) for p in prefixes):
            return i
    return None


class Module:
    def __init__(self, path: str, name: str | None, tree: ast.Module, is_package: bool):
        self.path, self.name, self.tree, self.is_package = path, name, tree, is_package
        self.defined: set[str] = set()           # names bound here other than by an import
        self.imported: dict[str, str] = {}       # name bound by a top-level `from m import x` -> m
        self.edges: set[str] = set()             # kinv modules it imports (anywhere in the file)
        self.from_imports: list[tuple[str, str, int]] = []  # (module, name, line), anywhere in the file
        self.aliases: dict[str, str] = {}        # local name -> kinv module it is bound to
        self.attr_uses: list[tuple[str, str, int]] = []  # (module, attribute, line): `alias.attribute`
        self.used: set[str] = set()              # names read in this module's own code (not in __all__)


def resolve_from(mod: Module, node: ast.ImportFrom) -> str | None:
    if not node.level:
        return node.module
    if mod.name is None:
        return None
    parts = mod.name.split(".")
    base = parts if mod.is_package else parts[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def load(root: str) -> tuple[dict[str, Module], dict[str, int]]:
    modules: dict[str, Module] = {}
    lines: dict[str, int] = {}
    for path in py_files(root):
        with open(os.path.join(root, path), encoding="utf-8") as fh:
            text = fh.read()
        lines[path] = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
        try:
            tree = ast.parse(text, filename=path)
        except SyntaxError:
            continue
        modules[path] = Module(path, module_name(path), tree, path.endswith("__init__.py"))
    by_name = {m.name: m for m in modules.values() if m.name}

    def target(dotted: str) -> str | None:
        """The kinv module a dotted import reaches (its longest known prefix)."""
        while dotted:
            if dotted in by_name:
                return dotted
            dotted = dotted.rpartition(".")[0]
        return None

    for mod in modules.values():
        for node in mod.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                mod.defined.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name):
                            mod.defined.add(n.id)
            if isinstance(node, ast.ImportFrom):
                src = resolve_from(mod, node)
                for a in node.names:
                    if src and src.startswith("kinv.") and a.name != "*":
                        mod.imported[a.asname or a.name] = src
        for node in ast.walk(mod.tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    t = target(a.name)
                    if t:
                        mod.edges.add(t)
                        if a.asname and t == a.name:
                            mod.aliases[a.asname] = t
            elif isinstance(node, ast.ImportFrom):
                src = resolve_from(mod, node)
                if not src:
                    continue
                for a in node.names:
                    # `from kinv.agent.workstream import graph` imports the module kinv.agent.workstream.graph
                    t = target(f"{src}.{a.name}") if f"{src}.{a.name}" in by_name else target(src)
                    if t:
                        mod.edges.add(t)
                        mod.from_imports.append((src, a.name, node.lineno))
                        if f"{src}.{a.name}" in by_name:
                            mod.aliases[a.asname or a.name] = f"{src}.{a.name}"
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr == "import_module" and node.args
                  and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                t = target(node.args[0].value)
                if t:
                    mod.edges.add(t)
        mod.edges.discard(mod.name)
        mod.used = {n.id for n in ast.walk(mod.tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        for node in ast.walk(mod.tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in mod.aliases):
                mod.attr_uses.append((mod.aliases[node.value.id], node.attr, node.lineno))
    return modules, lines


def circles(modules: dict[str, Module]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    graph = {m.name: sorted(m.edges) for m in modules.values() if m.name}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on.add(v)
            succ = graph.get(v, [])
            if i < len(succ):
                work.append((v, i + 1))
                w = succ[i]
                if w not in index:
                    work.append((w, 0))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return sorted(out)


def climbs(modules: dict[str, Module]) -> list[str]:
    path_of = {m.name: m.path for m in modules.values() if m.name}
    out = []
    for mod in modules.values():
        here = floor_of(mod.path)
        if here is None:
            continue
        for t in sorted(mod.edges):
            there = floor_of(path_of[t])
            if there is not None and there < here:
                out.append(f"{mod.path} ({FLOORS[here][0]}) -> {path_of[t]} ({FLOORS[there][0]})")
    return out


def facades(modules: dict[str, Module]) -> list[str]:
    """Re-exports (a name imported from another kinv module and never used where it is imported, ``__all__``
    or not), and callers that import a name from a module that only imported it (not from where it is
    defined)."""
    by_name = {m.name: m for m in modules.values() if m.name}
    out = []
    for mod in modules.values():
        if mod.name is None:
            continue
        reexported = sorted(n for n, src in mod.imported.items()
                            if n not in mod.used and n not in mod.defined and f"{src}.{n}" not in by_name)
        if reexported:
            out.append(f"{mod.path} re-exports {len(reexported)} names: {', '.join(reexported)}")
        for src, name, line in [*mod.from_imports, *mod.attr_uses]:
            via = by_name.get(src)
            if via is None or f"{src}.{name}" in by_name:
                continue  # not a kinv module, or a submodule import
            if name in via.imported and name not in via.defined:
                out.append(f"{mod.path}:{line} imports {name} from {via.path} (defined in {via.imported[name]})")
    return sorted(out)


def lines_per_folder(lines: dict[str, int]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for path, n in lines.items():
        parts = path.split("/")
        key = "/".join(parts[:2]) if parts[:2] == ["agent", "tools"] and len(parts) > 2 else (
            parts[0] if len(parts) > 1 else ".")
        out[key] += n
    return dict(sorted(out.items()))


def shape(root: str) -> dict:
    modules, lines = load(root)
    return {
        "lines": lines_per_folder(lines),
        "circles": circles(modules),
        "climbs": climbs(modules),
        "facades": facades(modules),
        "long": sorted((p, n) for p, n in lines.items() if p.split("/")[0] in PACKAGES and n > LONG),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    help="the repository root (default: the one this script sits in)")
    args = ap.parse_args(argv)
    if not os.path.isdir(os.path.join(args.root, "agent")):
        print(f"--root {args.root!r} is not a kinv checkout (no agent/ folder in it)", file=sys.stderr)
        return 2
    s = shape(args.root)
    product = sum(n for k, n in s["lines"].items() if k.split("/")[0] in PACKAGES)
    print("lines per folder:")
    for k, n in s["lines"].items():
        print(f"  {k:<22} {n:>6}")
    print(f"  {'product (agent, kernels)':<22} {product:>6}")
    print(f"circles: {len(s['circles'])}")
    for c in s["circles"]:
        print("  " + " <-> ".join(c))
    print(f"climbs: {len(s['climbs'])}")
    for c in s["climbs"]:
        print("  " + c)
    reexports = [f for f in s["facades"] if " re-exports " in f]
    through = [f for f in s["facades"] if " re-exports " not in f]
    print(f"facades: {len(reexports)} modules re-export names; {len(through)} imports through a module that "
          f"only imported the name")
    for f in s["facades"]:
        print("  " + f)
    print(f"modules over {LONG} lines: {len(s['long'])}")
    for p, n in s["long"]:
        print(f"  {p} {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
