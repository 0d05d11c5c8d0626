"""The shape of kinv's code: lines per folder, import circles, imports that climb, re-export facades.

    python benchmarks/code_shape.py            # the figures, from the repository this script sits in
    python benchmarks/code_shape.py --root DIR

Standard library only (ast): nothing of kinv is imported, so it runs in a second on any checkout.

- lines: the lines of every tracked-looking ``.py`` file, per top folder (agent/tools is its own row).
- circles: strongly connected components of more than one module in kinv's import graph. Every import
  counts, an import inside a function too: a lazy import still ties the two modules together.
- climbs: an import from a module to a module on a higher floor of ``FLOORS`` (top to bottom).
- facades: a module that imports a name from another kinv module, and a caller that imports that name
  from it instead of from the module that defines it. A package whose ``__init__`` lists the name in
  ``__all__`` declares it as the package's interface (agent/store, agent/campaign): not a facade.
- long modules: product modules (agent/, kernels/) over ``LONG`` lines.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
from collections import defaultdict

# The floors, top to bottom, as path prefixes relative to the repository root. A module may import from its
# own floor and the floors below it. A later move of files into new folders updates this table.
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    ("cli", ("agent/cli/",)),
    ("campaign", ("agent/campaign/",)),
    ("workstream", ("agent/workstream/investigation.py", "agent/workstream/graph.py", "agent/workstream/check.py")),
    ("workstream parts", ("agent/workstream/context.py", "agent/workstream/adopt.py", "agent/workstream/collect.py")),
    ("report", ("agent/report/", "agent/plan_reference.py")),
    ("planner", ("agent/workstream/planner.py",)),
    ("measure", ("agent/tools/measure/protocol.py", "agent/tools/measure/sequential.py", "agent/tools/measure/bench.py",
                 "agent/tools/measure/screening.py", "agent/tools/measure/executor.py",
                 "agent/tools/measure/placement.py", "agent/tools/measure/plausibility.py",
                 "agent/tools/measure/noise.py", "agent/tools/measure/regress.py")),
    ("backends", ("agent/tools/backends/",)),
    ("worker", ("agent/tools/worker/bench_worker.py", "agent/tools/worker/pool.py")),
    ("checks and figures", ("agent/tools/measure/", "agent/tools/worker/client.py")),
    ("files", ("agent/tools/files/",)),
    ("store", ("agent/store/",)),
    ("plan", ("agent/plan.py", "agent/plan_file.py", "agent/plan_sections.py")),
    ("kernel interface", ("kernels/adapter.py", "kernels/launch_config.py", "kernels/tunables.py", "kernels/quick.py",
                          "kernels/command_adapter.py", "kernels/devices.py", "kernels/hashes.py")),
    ("errors, words, ids", ("agent/errors.py", "agent/words.py", "agent/ids.py", "agent/logs.py", "agent/signals.py",
                            "agent/faults.py", "agent/fmt.py")),
]

# the product's packages: folder -> the dotted name it installs as
PACKAGES = {"agent": "kinv.agent", "kernels": "kinv.kernels"}
LONG = 500
SKIP_DIRS = {".git", ".venv", "venv", "__pycache__", "node_modules", "state", ".pytest_cache", "build"}


def py_files(root: str) -> list[str]:
    """Every ``.py`` file under root (relative paths, sorted), skipping environments and caches."""
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS and not x.endswith(".egg-info"))
        out += [os.path.relpath(os.path.join(d, f), root) for f in files if f.endswith(".py")]
    return sorted(p.replace(os.sep, "/") for p in out)


def module_name(path: str) -> str | None:
    """The dotted name a product file imports as (``agent/tools/measure/bench.py`` -> ``kinv.agent.tools.measure.bench``)."""
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
        self.exported: set[str] = set()          # a package's declared interface (its __init__'s __all__)


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
            if (mod.is_package and isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
                    and isinstance(node.value, (ast.List, ast.Tuple))):
                mod.exported |= {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
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
    """Callers that import a name from a module that only imported it (not from where it is defined)."""
    by_name = {m.name: m for m in modules.values() if m.name}
    out = []
    for mod in modules.values():
        for src, name, line in [*mod.from_imports, *mod.attr_uses]:
            via = by_name.get(src)
            if via is None or f"{src}.{name}" in by_name:
                continue  # not a kinv module, or a submodule import
            if name in via.imported and name not in via.defined and name not in via.exported:
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
    print(f"facades: {len(s['facades'])} imports through {len({f.split(' from ')[1].split(' ')[0] for f in s['facades']})} modules")
    for f in s["facades"]:
        print("  " + f)
    print(f"modules over {LONG} lines: {len(s['long'])}")
    for p, n in s["long"]:
        print(f"  {p} {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
