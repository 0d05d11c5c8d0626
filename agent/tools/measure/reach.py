"""The static screen of a source patch: code that reaches past the kernel into the harness that times and judges it.

A kernel module runs inside the benchmark worker that times it, so its code can reach the worker's state: walk the
garbage collector to the timing dict, read its caller's frame, patch a module the harness imports, install a trace
hook or a signal handler, stop the other arm's process.  A source patch whose code holds one of these constructs
(:class:`~kinv.agent.words.HarnessReach`) is refused at ``kinv check`` and at a run's gate, before anything is timed,
with one line per construct naming its file and line.  A plan allows one for a variant whose kernel needs it with
``allow_harness_reach: [CONSTRUCT]``; the close-out then names each construct it allowed.

What is screened: the patched file (the baseline file with the variant's diff applied, as the patch step applies
it), parsed with :mod:`ast`, against the baseline file.  A construct the baseline kernel already holds is not the
patch's doing: a finding counts only where the patched file holds more of (construct, line text) than the
baseline does.  Moved lines are not flagged; a construct that an added line makes of an old one (an import that
turns an old ``x.y = 1`` into a write on a module) is.  A patched file that does not parse is the compile gate's
to report, not this screen's.

This is a second line, never the only one: it reads what is written, and code built at run time (``exec``,
``__import__``, a ``getattr`` on ``sys`` with a computed name) is refused as ``dynamic_code`` because it is out of
its sight.  The worker's own checks (the harness's code fingerprinted, the judge in another process, the
timed replays judged) stay what stops a trick this screen cannot see.

Why not KernelGuard (MIT, on PyPI, a rule-based detector of hacked GPU-kernel competition submissions): weighed
(version 0.3.2) and not used.  Its rules are written for the GPU MODE competition harness (its entry point
``custom_kernel``, its ``main.time_kernel``, its printed "Ranked Benchmark" lines, score anomalies per problem)
and classify a whole submission file, with no line numbers and no notion of a baseline the patch is applied to.
Run on three of the constructs this screen exists for -- a ``gc.get_objects()`` walk, ``ctypes.memmove`` and
``signal.setitimer`` -- it classified each as "valid".  Its detector is one 10,600-line module in a 0.x series.
"""

from __future__ import annotations

import ast
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from kinv.agent.words import HarnessReach as R

WHY = {
    R.GC: "the garbage collector hands out every live object, the harness's timing state too",
    R.CTYPES: "raw memory and C calls reach any object in the process",
    R.FRAMES: "a frame holds its callers' variables, the harness's too, to read and to write",
    R.FUNCTION_INTERNALS: "a function's code, globals and closure are shared with every caller, the harness too",
    R.TRACING: "a trace, profile or audit hook runs inside the harness's own code",
    R.THREADS: "the process's other threads are the harness's, and a thread of the kernel's own runs beside "
               "the timed work",
    R.SIGNALS: "a handler or a timer interrupts the harness at a moment the kernel picks",
    R.KILL: "a signal can stop, continue or end kinv's other workers and its judge",
    R.PROCESSES: "a process of the kernel's own runs work beside the timed arm, on the GPU too",
    R.MODULE_WRITE: "a module or object the kernel imported is shared with the harness, which reads it too",
    R.SYS_MODULES: "the table of imported modules holds the harness's modules",
    R.BUILTINS: "the builtins are every module's names, the harness's too",
    R.RELOAD: "a reload swaps the code that other modules hold",
    R.DYNAMIC_CODE: "code built at run time is out of this screen's sight",
    R.HARNESS_IMPORT: "the harness that times and judges the kernel is not the kernel's to import",
    R.PROC_FILES: "/proc holds the process's memory and the state of kinv's other processes",
}

# an import of one of these modules (or of one under it) reaches for the harness by itself
MODULES = {"gc": R.GC, "ctypes": R.CTYPES, "_ctypes": R.CTYPES, "cffi": R.CTYPES, "inspect": R.FRAMES,
           "_thread": R.THREADS, "faulthandler": R.SIGNALS, "builtins": R.BUILTINS, "subprocess": R.PROCESSES,
           "_posixsubprocess": R.PROCESSES, "multiprocessing": R.PROCESSES, "runpy": R.DYNAMIC_CODE,
           "kinv.agent": R.HARNESS_IMPORT}  # fmt: skip

# a use of one of these names (an attribute chain from an import, or a from-import of it), or of a name under it
NAMES = {
    "sys._getframe": R.FRAMES, "sys._getframemodulename": R.FRAMES, "sys._current_exceptions": R.FRAMES,
    "traceback.walk_stack": R.FRAMES, "traceback.walk_tb": R.FRAMES,
    "sys._current_frames": R.THREADS, "threading.enumerate": R.THREADS, "threading.main_thread": R.THREADS,
    "threading._active": R.THREADS, "threading._main_thread": R.THREADS, "threading.Thread": R.THREADS,
    "threading.Timer": R.THREADS, "concurrent.futures.ThreadPoolExecutor": R.THREADS,
    "sys.settrace": R.TRACING, "sys.setprofile": R.TRACING, "sys.monitoring": R.TRACING, "sys.addaudithook": R.TRACING,
    "sys.call_tracing": R.TRACING, "threading.settrace": R.TRACING, "threading.setprofile": R.TRACING,
    "threading.settrace_all_threads": R.TRACING, "threading.setprofile_all_threads": R.TRACING,
    "signal.signal": R.SIGNALS, "signal.setitimer": R.SIGNALS, "signal.alarm": R.SIGNALS,
    "signal.set_wakeup_fd": R.SIGNALS, "signal.siginterrupt": R.SIGNALS, "signal.raise_signal": R.SIGNALS,
    "signal.pthread_sigmask": R.SIGNALS,
    "os.kill": R.KILL, "os.killpg": R.KILL, "signal.pthread_kill": R.KILL, "os.pidfd_open": R.KILL,
    "os.fork": R.PROCESSES, "os.forkpty": R.PROCESSES, "os.system": R.PROCESSES, "os.popen": R.PROCESSES,
    "os.posix_spawn": R.PROCESSES, "os.posix_spawnp": R.PROCESSES, "concurrent.futures.ProcessPoolExecutor": R.PROCESSES,
    "sys.modules": R.SYS_MODULES,
    "importlib.reload": R.RELOAD, "imp.reload": R.RELOAD,
    "importlib.import_module": R.DYNAMIC_CODE, "importlib.__import__": R.DYNAMIC_CODE,
    "importlib.util.spec_from_file_location": R.DYNAMIC_CODE, "importlib.util.module_from_spec": R.DYNAMIC_CODE,
}  # fmt: skip
PREFIXES = {"os.exec": R.PROCESSES, "os.spawn": R.PROCESSES}  # os.execv, os.spawnlp, ...

# attributes whose access alone reaches for the harness, whatever they are read from
ATTRS = {"f_back": R.FRAMES, "f_locals": R.FRAMES, "f_globals": R.FRAMES, "f_builtins": R.FRAMES,
         "tb_frame": R.FRAMES, "gi_frame": R.FRAMES, "cr_frame": R.FRAMES, "ag_frame": R.FRAMES,
         "__code__": R.FUNCTION_INTERNALS, "__globals__": R.FUNCTION_INTERNALS, "__closure__": R.FUNCTION_INTERNALS,
         "__defaults__": R.FUNCTION_INTERNALS, "__kwdefaults__": R.FUNCTION_INTERNALS,
         "__builtins__": R.BUILTINS, "__subclasses__": R.GC}  # fmt: skip

BUILTIN_CALLS = {"exec": R.DYNAMIC_CODE, "eval": R.DYNAMIC_CODE, "compile": R.DYNAMIC_CODE,
                 "__import__": R.DYNAMIC_CODE, "breakpoint": R.FRAMES}  # fmt: skip
MUTATORS = {"__setattr__", "__delattr__", "__setitem__", "__delitem__", "update", "setdefault", "pop", "popitem",
            "clear"}  # fmt: skip
COMPUTED_GETATTR_ON = {"sys", "os", "gc", "signal", "threading", "importlib", "builtins", "ctypes", "inspect"}


@dataclass(frozen=True)
class Finding:
    """One construct on one line of a patched file."""

    file: str
    line: int
    construct: R
    what: str  # the code, as written (``import gc``, ``sys._getframe``, ``torch.cuda.Event.elapsed_time =``)
    text: str = ""  # the line's source, stripped: what a baseline comparison matches on

    def refused(self) -> str:
        return (f"{self.file}:{self.line}: {self.construct} reaches for the harness ({self.what}: "
                f"{WHY[self.construct]}); refused — a plan may allow it with `allow_harness_reach: "
                f"[{self.construct}]`")  # fmt: skip

    def allowed(self) -> str:
        return (f"{self.file}:{self.line}: {self.construct} reaches for the harness ({self.what}: "
                f"{WHY[self.construct]}); allowed by the plan (allow_harness_reach: [{self.construct}])")


@dataclass
class Screened:
    """What the screen found in a variant's source patch: the findings it refuses and the ones the plan allows."""

    refused: list[Finding] = field(default_factory=list)
    allowed: list[Finding] = field(default_factory=list)

    def reason(self) -> str:
        """The refusal, one line per finding joined with `` | `` (empty: nothing refused)."""
        return " | ".join(f.refused() for f in self.refused)


# --------------------------------------------------------------------------- #
# the screen of one source
# --------------------------------------------------------------------------- #
EXEMPT = ("kinv.agent.errors",)  # the error classes a kernel's adapter raises: vocabulary, not the harness's state


def _module(name: str) -> R | None:
    """The construct of a module whose import reaches for the harness by itself (``name`` or one above it)."""
    if any(name == e or name.startswith(e + ".") for e in EXEMPT):
        return None
    return next((c for key, c in MODULES.items() if name == key or name.startswith(key + ".")), None)


def _match(name: str) -> R | None:
    if any(name == e or name.startswith(e + ".") for e in EXEMPT):
        return None
    for table in (MODULES, NAMES):
        for key, construct in table.items():
            if name == key or name.startswith(key + "."):
                return construct
    return next((c for p, c in PREFIXES.items() if name.startswith(p)), None)


class _Screen(ast.NodeVisitor):
    def __init__(self, source: str, file: str, package: str):
        self.lines, self.file, self.package = source.splitlines(), file, package
        self.bound: dict[str, str] = {}  # a name an import binds -> the dotted name of what it binds
        self.found: dict[tuple[int, R], Finding] = {}

    # ---- bookkeeping ----------------------------------------------------------------
    def add(self, node: ast.AST, construct: R, what: str) -> None:
        line = getattr(node, "lineno", 0)
        text = self.lines[line - 1].strip() if 0 < line <= len(self.lines) else ""
        self.found.setdefault((line, construct), Finding(self.file, line, construct, what, text))

    def bind_imports(self, tree: ast.AST) -> None:
        """Every name an import binds, anywhere in the file (the screen is not scope-aware: a name imported in one
        function is a module in every one)."""
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    self.bound[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom):
                base = self.absolute(node)
                for a in node.names:
                    if a.name != "*":
                        self.bound[a.asname or a.name] = f"{base}.{a.name}" if base else a.name

    def absolute(self, node: ast.ImportFrom) -> str:
        """The dotted name a from-import reads from (a relative one resolved against the file's package)."""
        if not node.level:
            return node.module or ""
        parts = self.package.split(".") if self.package else []
        parts = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
        return ".".join([*parts, *([node.module] if node.module else [])])

    def dotted(self, node: ast.AST) -> str | None:
        """``a.b.c`` with ``a`` resolved through the imports (None: not rooted at an import)."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            inner = self.dotted(node.args[0])
            return ".".join([inner, node.args[1].value, *reversed(parts)]) if inner else None
        if isinstance(node, ast.Name) and node.id in self.bound:
            return ".".join([self.bound[node.id], *reversed(parts)])
        return None

    def root(self, node: ast.AST) -> str | None:
        """The import-bound name a write target hangs from (``torch`` of ``torch.cuda.Event.x``), if any."""
        while True:
            if isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
                node = node.value
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("vars", "getattr") \
                    and node.args:  # fmt: skip
                node = node.args[0]
            elif isinstance(node, ast.Name):
                return node.id if node.id in self.bound else None
            else:
                return None

    def write(self, node: ast.AST, target: ast.AST) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                self.write(node, t)
        elif isinstance(target, (ast.Attribute, ast.Subscript)) and self.root(target):
            self.add(node, R.MODULE_WRITE, f"{_short(target)} = …")

    # ---- visitors -------------------------------------------------------------------
    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            c = _match(a.name)
            if c:
                self.add(node, c, f"import {a.name}")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = self.absolute(node)
        for a in node.names:
            c = _match(base) or _match(f"{base}.{a.name}")
            if c:
                self.add(node, c, f"from {'.' * node.level}{node.module or ''} import {a.name}")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        name = self.dotted(node)
        c = _match(name) if name and not _module(name) else None  # a module's import is flagged, not each use
        if c:
            self.add(node, c, name)
        elif node.attr in ATTRS:
            self.add(node, ATTRS[node.attr], f".{node.attr}")
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id == "__builtins__":
            self.add(node, R.BUILTINS, "__builtins__")
        elif node.id in self.bound:
            name = self.bound[node.id]
            c = _match(name) if not _module(name) else None
            if c:
                self.add(node, c, name)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and node.value.startswith("/proc/"):
            self.add(node, R.PROC_FILES, repr(node.value[:40]))

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        if isinstance(f, ast.Name) and f.id in BUILTIN_CALLS and f.id not in self.bound:
            self.add(node, BUILTIN_CALLS[f.id], f"{f.id}(…)")
        elif isinstance(f, ast.Name) and f.id in ("setattr", "delattr") and node.args and self.root(node.args[0]):
            self.add(node, R.MODULE_WRITE, f"{f.id}({_short(node.args[0])}, …)")
        elif isinstance(f, ast.Name) and f.id == "getattr" and len(node.args) >= 2:
            if not isinstance(node.args[1], ast.Constant):
                base = self.dotted(node.args[0])
                if base and base.split(".")[0] in COMPUTED_GETATTR_ON:
                    self.add(node, R.DYNAMIC_CODE, f"getattr({_short(node.args[0])}, <computed name>)")
            elif isinstance(node.args[1].value, str) and node.args[1].value in ATTRS:
                self.add(node, ATTRS[node.args[1].value], f"getattr(…, {node.args[1].value!r})")
        elif isinstance(f, ast.Attribute) and f.attr in MUTATORS and self.root(f.value) \
                and (isinstance(f.value, ast.Attribute) or f.attr.startswith("__")
                     or (isinstance(f.value, ast.Name) and "." in self.bound.get(f.value.id, ""))):  # fmt: skip
            self.add(node, R.MODULE_WRITE, f"{_short(f)}(…)")
        elif isinstance(f, ast.Attribute) and f.attr in ("__setattr__", "__delattr__") and node.args \
                and self.root(node.args[0]):  # fmt: skip
            self.add(node, R.MODULE_WRITE, f"{_short(f)}({_short(node.args[0])}, …)")
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        for t in node.targets:
            self.write(node, t)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.write(node, node.target)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.write(node, node.target)
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for t in node.targets:
            self.write(node, t)
        self.generic_visit(node)


def _short(node: ast.AST, limit: int = 60) -> str:
    text = ast.unparse(node)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def screen_source(source: str, file: str, package: str = "") -> list[Finding]:
    """Every construct in ``source`` that reaches for the harness, in line order (one per line and construct).
    ``package``: the dotted package the file belongs to, which resolves its relative imports.  A source that does
    not parse has none (the compile gate reports it)."""
    try:
        tree = ast.parse(source, filename=file)
    except (SyntaxError, ValueError):
        return []
    s = _Screen(source, file, package)
    s.bind_imports(tree)
    s.visit(tree)
    return sorted(s.found.values(), key=lambda f: (f.line, str(f.construct)))


def screen_patch(before: str, after: str, file: str, package: str = "") -> list[Finding]:
    """The findings of ``after`` that ``before`` does not hold: by (construct, line text), counted, so a construct
    already in the baseline kernel, moved or not, is not the patch's."""
    left = Counter((f.construct, f.text) for f in screen_source(before, file, package))
    out = []
    for f in screen_source(after, file, package):
        if left[(f.construct, f.text)] > 0:
            left[(f.construct, f.text)] -= 1
        else:
            out.append(f)
    return out


# --------------------------------------------------------------------------- #
# a variant's source patch
# --------------------------------------------------------------------------- #
def screen_variant(adapter, variant, baseline: str | Path | None = None) -> Screened:
    """Screen ``variant``'s source patch: the target file with the diff applied, against the baseline file --
    the live file (``kinv check``, nothing patched) or its copy in the baseline snapshot ``baseline`` (a run's
    gate, the patch on disk).  Findings the variant's ``allow_harness_reach`` names are allowed, the rest
    refused.  The patch step runs first and reports a patch that does not apply."""
    from kinv.agent.plan import source_patch_text
    from kinv.agent.tools.files.config_text import apply_unified_diff

    if not getattr(variant, "source_patch", None):
        return Screened()
    _, diff = source_patch_text(adapter, variant.source_patch)
    target = next((ln[4:].strip() for ln in diff.splitlines() if ln.startswith("+++ ")), "")
    target = target[2:] if target.startswith("b/") else target
    if not target.endswith(".py"):
        return Screened()
    live = (adapter.root() / target).resolve()
    rel = live.relative_to(adapter.package_dir())
    base_file = live if baseline is None else Path(baseline, *adapter.package_name().split("."), rel)
    before = base_file.read_text()
    after = apply_unified_diff(before, diff, live)
    module = ".".join([adapter.package_name(), *rel.with_suffix("").parts])
    found = screen_patch(before, after, target, package=module.rpartition(".")[0])
    allow = set(getattr(variant, "allow_harness_reach", ()) or ())
    return Screened(refused=[f for f in found if f.construct not in allow],
                    allowed=[f for f in found if f.construct in allow])  # fmt: skip


def refusal(adapter, variant, *, baseline: str | Path | None = None, allowed=None) -> str:
    """The one call of ``kinv check`` and of a run's gate: ``variant``'s source patch screened
    (:func:`screen_variant`); ``allowed(line)`` is called with each finding the plan allows.  Returns the
    refusal (one line per finding, joined with `` | ``), or "" when nothing is refused."""
    s = screen_variant(adapter, variant, baseline)
    for f in s.allowed:
        if allowed is not None:
            allowed(f.allowed())
    return s.reason()
