"""What a variant could tamper with in the process that times it: the fingerprints of every function kinv relies on
inside a worker (its timers, the judge's helpers, torch's and the standard library's functions it calls, the worker's
own handlers).  Taken before any kernel module is imported and compared after each set-up and sample; standard
library only (torch is imported where a fingerprint needs it)."""

from __future__ import annotations

#: what the harness times with, and what a kernel module must never replace (a timer patched at import is a
#: known way to fool a benchmark): (owner, attribute) pairs, resolved when first snapshotted
TIMERS = (("torch.cuda.Event", "elapsed_time"), ("torch.cuda.Event", "record"), ("torch.cuda.CUDAGraph", "replay"),
          ("torch.cuda", "synchronize"), ("time", "perf_counter"), ("time", "time"))

#: everything else in a worker that times or judges a variant, by (module, attribute path): a variant imported into
#: the same process could change any of these, by rebinding it or by changing its code in place
WATCHED = (
    ("torch.cuda", "Event.__init__"), ("torch.cuda", "Event.query"), ("torch.cuda", "Event.wait"),
    ("torch.cuda", "Event.synchronize"), ("torch.cuda", "CUDAGraph.capture_begin"),
    ("torch.cuda", "CUDAGraph.capture_end"), ("torch.cuda", "graph.__enter__"), ("torch.cuda", "graph.__exit__"),
    ("torch.cuda", "current_stream"), ("torch.cuda", "empty_cache"), ("torch", "Tensor.copy_"),
    ("torch", "Tensor.fill_"), ("torch", "Tensor.clone"), ("torch", "Tensor.cpu"), ("torch", "empty"),
    ("torch", "empty_like"), ("torch", "save"), ("statistics", "median"), ("json", "dumps"),
    ("json.encoder", "JSONEncoder.encode"), ("json.encoder", "JSONEncoder.iterencode"), ("math", "ceil"),
    ("kinv.agent.tools.worker.compare", "judge"), ("kinv.agent.tools.worker.compare", "_compare"),
    ("kinv.agent.tools.worker.compare", "_poison"), ("kinv.agent.tools.worker.compare", "_clone"),
    ("kinv.agent.tools.worker.gate", "_check_level"), ("kinv.agent.tools.worker.gate", "check"),
    ("kinv.agent.tools.worker.tamper", "code_changed"), ("kinv.agent.tools.worker.tamper", "code_snapshot"),
    ("kinv.agent.tools.worker.tamper", "_fingerprint"),
    ("kinv.agent.tools.worker.shared", "yardstick"), ("kinv.agent.tools.worker.shared", "share"),
    ("kinv.agent.tools.worker.shared", "empty_like"), ("kinv.agent.tools.worker.refresh", "fill"),
    ("kinv.agent.tools.worker.refresh", "moments"), ("kinv.agent.tools.worker.refresh", "counter"),
    ("kinv.agent.tools.worker.refresh", "_fill_kernel.fn"), ("kinv.agent.tools.worker.refresh", "_mix.fn"),
)


def _owner(path: str):
    import importlib

    if path == "time":
        return importlib.import_module("time")
    obj = importlib.import_module("torch")
    for part in path.split(".")[1:]:
        obj = getattr(obj, part)
    return obj


def timer_snapshot() -> dict[str, object]:
    """The harness's timers as they are now (take it before any kernel module is imported)."""
    return {f"{o}.{a}": getattr(_owner(o), a, None) for o, a in TIMERS}


def _code_digest(code, h) -> None:
    """Feed a code object (and the code objects nested in its constants) into ``h``."""
    h.update(code.co_code)
    h.update(repr(code.co_names).encode())
    h.update(repr(code.co_varnames).encode())
    for c in code.co_consts:
        if hasattr(c, "co_code"):
            _code_digest(c, h)
        else:
            h.update(repr(c).encode(errors="replace"))


def _fingerprint(obj) -> tuple:
    """What a callable is now: its identity, and for Python code its code, defaults and closure's contents (a
    function whose ``__code__`` or defaults are changed in place keeps its identity, not its fingerprint)."""
    import hashlib

    fn = getattr(obj, "__func__", obj)
    code = getattr(fn, "__code__", None)
    if code is None:
        return (id(obj),)
    h = hashlib.sha256()
    _code_digest(code, h)
    h.update(repr(getattr(fn, "__defaults__", None)).encode(errors="replace"))
    h.update(repr(getattr(fn, "__kwdefaults__", None)).encode(errors="replace"))
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            inner = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        h.update(repr(_fingerprint(inner) if callable(inner) else id(inner)).encode())
    return (id(obj), h.hexdigest())


def _watched() -> dict[str, object]:
    import importlib
    import sys

    out = timer_snapshot()
    for mod, path in WATCHED:
        if mod.startswith("kinv.") and mod not in sys.modules:
            continue
        try:
            obj = importlib.import_module(mod)
            for part in path.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError):
            continue
        out[f"{mod}.{path}"] = obj
    worker = sys.modules.get("kinv.agent.tools.worker.bench_worker")
    main = sys.modules.get("__main__")
    if main is not None and getattr(main, "__spec__", None) and main.__spec__.name == "kinv.agent.tools.worker.bench_worker":
        worker = main  # a worker runs as ``python -m kinv.agent.tools.worker.bench_worker``: its module is __main__
    if worker is not None and hasattr(worker, "Worker"):  # the worker's own request handlers and timing code
        for cls in worker.Worker.__mro__[:-1]:  # its own and those it takes from kinv's (the judge's requests)
            for name, fn in vars(cls).items():
                if callable(fn) or isinstance(fn, staticmethod):
                    out[f"bench_worker.{cls.__name__}.{name}"] = getattr(worker.Worker, name)
        for name in ("main", "_graph_token"):
            if hasattr(worker, name):
                out[f"bench_worker.{name}"] = getattr(worker, name)
    return out


def code_snapshot() -> dict[str, tuple]:
    """The fingerprint of every function kinv relies on inside a worker (its timers, the judge's helpers, torch's
    and the standard library's functions it calls, the worker's own handlers), as they are now.  Take it before
    any kernel module is imported; :func:`code_changed` compares a later state with it."""
    return {name: _fingerprint(obj) for name, obj in _watched().items()}


def code_changed(snapshot: dict[str, tuple] | None = None) -> list[str]:
    """The names whose object or code differs from ``snapshot`` (default: the first snapshot this process took):
    rebound, or changed in place."""
    snap = snapshot if snapshot is not None else _FIRST_SNAPSHOT
    if not snap:
        return []
    now = code_snapshot()
    return [name for name, fp in snap.items() if now.get(name) != fp]


_FIRST_SNAPSHOT: dict[str, tuple] | None = None


def timers_replaced(snapshot: dict | None = None) -> list[str]:
    """The harness functions changed since ``snapshot`` (default: the first this process took), by name."""
    return code_changed(snapshot)


def _take_first_snapshot() -> None:
    global _FIRST_SNAPSHOT
    if _FIRST_SNAPSHOT is None:
        _FIRST_SNAPSHOT = code_snapshot()

