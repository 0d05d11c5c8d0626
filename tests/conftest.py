"""Test set-up shared by every test.

- GPU tests carry ``@pytest.mark.gpu`` and are skipped, in this one place,
  when no CUDA device is visible.  Without a GPU, Triton kernels run in the
  interpreter (TRITON_INTERPRET=1), set here before triton is imported.
- Every test gets a temporary state dir through KINV_STATE_DIR.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


HAS_GPU = _has_gpu()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped without one)")
    # the suite tests kinv as a terminal runs it: a suite started under nohup, or as a background job of a script,
    # inherits SIGHUP or SIGINT ignored, and kinv rightly leaves an inherited ignore alone (agent/signals.py), so the
    # signal tests would see nothing; their default actions are put back for this process and what it starts
    import signal

    for sig, default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGHUP, signal.SIG_DFL)):
        if signal.getsignal(sig) is signal.SIG_IGN:
            signal.signal(sig, default)
    # the suite starts about 1,300 Python processes that import kinv from this checkout; where
    # PYTHONDONTWRITEBYTECODE is set (as on the CI machine) none leaves its bytecode behind, so each would compile
    # the same sources again: they are compiled once, here, before any worker starts (a source a test patches is
    # newer than its bytecode, which Python then ignores)
    if getattr(config, "workerinput", None) is None:
        import compileall

        root = Path(__file__).resolve().parents[1]
        for folder in ("agent", "kernels", "kinv", "tests", "examples"):
            compileall.compile_dir(root / folder, quiet=2)


def _run_root(tmp_path_factory, config):
    """This test run's own temporary root: under pytest-xdist the workers' common parent, else the basetemp."""
    root = tmp_path_factory.getbasetemp()
    if getattr(config, "workerinput", None) is not None:  # xdist: <run root>/popen-gwN
        root = root.parent  # this run's, shared by its workers (never another run's)
    return root


@pytest.fixture(scope="session", autouse=True)
def _no_kept_copies_in_the_home_dir(tmp_path_factory):
    """kinv keeps copies of config files' bytes of record under $XDG_STATE_HOME (~/.local/state when unset):
    fixtures shared by many tests (a module's, a session's) keep theirs in this run's temporary dir, never
    in the home dir; every test gets its own besides (``state_dir``)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_STATE_HOME", str(tmp_path_factory.getbasetemp() / "xdg-state"))
        yield


_ray_locks: dict = {}  # path -> this process's one FileLock on it (reentrant: a module's turn holds a test's)


def _ray_turn(request, tmp_path_factory):
    from filelock import FileLock

    path = str(_run_root(tmp_path_factory, request.config) / "ray.lock")
    return _ray_locks.setdefault(path, FileLock(path))


@pytest.fixture(autouse=True)
def _one_ray_cluster_at_a_time(request, tmp_path_factory):
    """Tests marked ``ray`` start a local Ray cluster or stop every one (``ray stop --force``): under
    pytest-xdist they take turns, so one never stops another's cluster."""
    if request.node.get_closest_marker("ray") is None:
        yield
        return
    with _ray_turn(request, tmp_path_factory):
        yield


@pytest.fixture(scope="module")
def ray_module_turn(request, tmp_path_factory):
    """The ``ray`` marker's turn held for a whole module, for a Ray cluster that the module's tests share: no other
    worker's ray test runs until the module is done with it."""
    with _ray_turn(request, tmp_path_factory):
        yield


# the files with the longest chains of whole runs (the README's sessions, the SIGKILL harness, the Ray campaigns,
# the campaigns killed and resumed), longest first
LONG_FILES = ("test_readme.py", "test_crash.py", "test_ray_executor.py", "test_campaign.py")


def pytest_collection_modifyitems(config, items):
    # the long files, then the other files with slow tests, then the rest: under `--dist loadfile` the workers
    # start the long files at once and fill in with the short ones, instead of one worker finishing a long file
    # alone at the end (a stable sort: each file's tests keep their order; every worker collects the same order)
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}

    def rank(item):
        name = item.path.name
        return (LONG_FILES.index(name) if name in LONG_FILES else len(LONG_FILES)) + (item.path not in slow_files)

    items.sort(key=rank)
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="no CUDA GPU visible")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch):
    """A fresh, empty kinv state dir for every test."""
    d = tmp_path / "state"
    monkeypatch.setenv("KINV_STATE_DIR", str(d))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg-state"))  # kinv's kept copies of files of record
    return d


# --------------------------------------------------------------------------- #
# One closed #3a (and one #3a paused at its first approval, one closed #3b, one closed campaign #7), built once
# per test run and shared
#
# A replay `kinv run plans/3a-attention-occupancy.yaml --approval auto` takes about a minute on 2 cores, the whole
# campaign #7 a few; the tests that only read what such a run leaves (report, export, views, show, compare,
# history, status, todos, the MCP server's reads, the doctor, a campaign's summary) share one, each on a copy of
# its own.  Under pytest-xdist the workers share it too: the first to need it builds it under a lock in the run's
# own temporary root, the others wait for it.

PLAN_3A = "plans/3a-attention-occupancy.yaml"


def _build_state(where, argv: list[str], want_rc: int, base_env: dict):
    """A state dir and live-config dir that the replay command ``kinv ARGV`` left (exit ``want_rc``, its stdout
    in ``run.out``), run under ``base_env`` with its own state dir, live config (the seed's) and kept copies, in
    ``where``."""
    import subprocess
    import sys

    from tests.utils import ROOT, write_seed_config

    (where / "configs").mkdir(parents=True, exist_ok=True)
    write_seed_config(where / "configs")
    env = dict(base_env, KINV_STATE_DIR=str(where / "state"), KINV_CONFIG_DIR=str(where / "configs"),
               XDG_STATE_HOME=str(where / "xdg-state"), TRITON_INTERPRET="1", KINV_FORCE_NO_GPU="1",
               PYTHONPATH=str(ROOT))  # fmt: skip
    r = subprocess.run([sys.executable, "-m", "kinv.agent.cli.app", *argv], env=env, cwd=ROOT, capture_output=True,
                       text=True, timeout=1200)  # fmt: skip
    if r.returncode != want_rc:
        raise RuntimeError(f"the shared run `kinv {' '.join(argv)}` exited {r.returncode}, not {want_rc}:\n"
                           f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}")  # fmt: skip
    (where / "run.out").write_text(r.stdout)
    (where / "done").write_text("ok")


PLAN_7 = "plans/7-decode-ceiling.yaml"
# name -> (the kinv command line, the exit code it ends with, the fixture that copies it)
SHARED_RUNS = {
    "closed-3a": (["run", PLAN_3A, "--backend", "replay", "--approval", "auto"], 0, "closed_3a"),
    "paused-3a": (["run", PLAN_3A, "--backend", "replay", "--approval", "ask"], 3, "paused_3a"),
    "closed-3b": (["run", "plans/3b-tile-shape.yaml", "--backend", "replay", "--approval", "auto"], 0, "closed_3b"),
    "closed-7": (["campaign", PLAN_7, "--backend", "replay", "--approval", "auto", "--json"], 0, "closed_7"),
}
_builds: dict = {}  # name -> the thread that makes sure it exists (one per process)


def pytest_sessionfinish(session):
    """A worker that is done waits for the shared runs it started: another worker may be waiting for one."""
    for t in _builds.values():
        t.join()


def _ensure(root, name: str, base_env: dict) -> None:
    from filelock import FileLock

    argv, want_rc, _ = SHARED_RUNS[name]
    with FileLock(str(root / f"{name}.lock")):
        if not (root / name / "done").exists():
            _build_state(root / name, argv, want_rc, base_env)


def _start(tmp_path_factory, request, also=()) -> None:
    """Start building, each in a thread under its own lock, the shared runs this session's tests use (and
    ``also``) that this process has not started: they build at the same time instead of one after another, and
    a second xdist worker waits for the one it needs instead of building it again."""
    import threading

    root = _run_root(tmp_path_factory, request.config)
    # the environment as the session started, read here in the main thread (tests change os.environ later;
    # none of a test's KINV_* settings, fault points included, reaches a shared run)
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("KINV_")}
    wanted = {n for n, (*_, fixture) in SHARED_RUNS.items()
              if any(f in getattr(item, "fixturenames", ()) for f in (fixture, f"{fixture}_source")
                     for item in request.session.items)}  # fmt: skip
    for n in sorted(wanted | set(also)):
        if n not in _builds:
            errors: list = []

            def build(n=n, errors=errors):
                try:
                    _ensure(root, n, base_env)
                except BaseException as exc:  # raised in the test that asks for it
                    errors.append(exc)

            t = threading.Thread(target=build, name=f"kinv-shared-{n}", daemon=True)
            t.errors = errors
            t.start()
            _builds[n] = t


@pytest.fixture(scope="session", autouse=True)
def _shared_runs_start_at_the_first_test(tmp_path_factory, request):
    """The shared runs this session's tests use start building when its first test starts, beside whatever that
    test runs (a slow test's own run, say), not when a test first asks for one."""
    _start(tmp_path_factory, request)


def _shared(tmp_path_factory, request, name: str):
    """The shared run ``name``, built once per test run (see ``_start``); waits for it."""
    _start(tmp_path_factory, request, {name})
    _builds[name].join()
    if _builds[name].errors:
        raise _builds[name].errors[0]
    return _run_root(tmp_path_factory, request.config) / name


def _copy(source, tmp_path, state_dir) -> str:
    """The shared run's state dir copied to ``state_dir``, its live config dir to ``tmp_path / "configs"``, and
    kinv's kept copies of those files' bytes of record (outside any state dir, keyed by the file's path) re-kept
    for the copies, under this test's $XDG_STATE_HOME."""
    import json
    import os
    import shutil

    from kinv.agent.tools.files.record import record_path

    shutil.copytree(source / "state", state_dir, symlinks=True)
    shutil.copytree(source / "configs", tmp_path / "configs", dirs_exist_ok=True)
    assert os.environ["XDG_STATE_HOME"] == str(tmp_path / "xdg-state")  # the state_dir fixture's
    for rec_file in (source / "xdg-state" / "kinv" / "records").glob("*.json"):
        rec = json.loads(rec_file.read_text())
        name = os.path.basename(rec["path"])
        mine = (tmp_path / "configs" / name).resolve()
        if Path(rec["path"]) == (source / "configs" / name).resolve():
            dest = record_path(mine)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(json.dumps({**rec, "path": str(mine)}))
    return (source / "run.out").read_text()


@pytest.fixture(scope="session")
def closed_3a_source(tmp_path_factory, request):
    """The shared closed #3a (--approval auto).  Never write to it: ``closed_3a`` gives a copy."""
    return _shared(tmp_path_factory, request, "closed-3a")


@pytest.fixture(scope="session")
def paused_3a_source(tmp_path_factory, request):
    """The shared #3a paused at V1's approval (--approval ask).  Never write to it: ``paused_3a`` gives a copy."""
    return _shared(tmp_path_factory, request, "paused-3a")


@pytest.fixture(scope="session")
def closed_3b_source(tmp_path_factory, request):
    """The shared closed #3b (--approval auto, the live file at the seed's).  ``closed_3b`` gives a copy."""
    return _shared(tmp_path_factory, request, "closed-3b")


@pytest.fixture
def closed_3a(closed_3a_source, tmp_path, state_dir):
    """This test's own copy of a closed replay run of #3a: its state dir is ``state_dir`` and its live config dir
    ``tmp_path / "configs"``, where tests.utils.replay_env puts them, so ``replay_env(tmp_path, state_dir)``
    reads it.  Returns what the run printed.  For reading what a run leaves; a test about the run itself runs
    one (and is slow)."""
    return _copy(closed_3a_source, tmp_path, state_dir)


@pytest.fixture
def closed_3b(closed_3b_source, tmp_path, state_dir):
    """This test's own copy of a closed replay run of #3b, as ``closed_3a``."""
    return _copy(closed_3b_source, tmp_path, state_dir)


@pytest.fixture
def paused_3a(paused_3a_source, tmp_path, state_dir):
    """This test's own copy of a replay run of #3a paused at V1's approval (exit 3), as ``closed_3a``.  Its
    checkpoints name the source's paths: never resume it (a test that resumes runs its own)."""
    return _copy(paused_3a_source, tmp_path, state_dir)


@pytest.fixture(scope="session")
def closed_7_source(tmp_path_factory, request):
    """The shared closed campaign #7 (--approval auto, from the seed's live file; its ``run.out`` is the summary
    `--json` printed).  Never write to it: ``closed_7`` gives a copy."""
    return _shared(tmp_path_factory, request, "closed-7")


@pytest.fixture
def closed_7(closed_7_source, tmp_path, state_dir):
    """This test's own copy of a closed replay campaign #7, as ``closed_3a``; returns its summary (a dict).  Its
    records name the source's close-outs: a test about the campaign's adoption or resumption runs its own."""
    import json

    return json.loads(_copy(closed_7_source, tmp_path, state_dir))
