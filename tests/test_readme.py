"""Every command the README and docs/usage.md show works on a fresh clone, with the exit code they document.

The command blocks of both pages (their lines indented by four spaces) are read here, every ``kinv`` command in
them is looked up in :data:`EXPECT` (its documented exit code, and how it is run), and the test fails when a page
shows a command the table does not cover, or the table names one neither page shows any more.  Set-up lines
(``python3 -m venv ... pip install ...``) are excluded by name: they install kinv, which this test runs already.

Each command runs on replay (``KINV_FORCE_NO_GPU=1``: the answer is the same on a GPU machine) in a copy of the
project's kernels/, kinv/ and plans/ with its own ``./state``, the way a new user runs it from a fresh clone;
nothing under the real checkout is written.  Quick commands (no earlier command needed) each run alone, on a
fresh clone of their own, in the default lane.  The blocks also run as the sessions they are, in order, each on
a fresh clone of its own, in the slow lane: the README's "One run, one approval" (#3a paused, approved, resumed
and closed out) followed by usage.md's command tour, the campaign, your own command, several workstreams, and Ray.
Those sessions share nothing, so they start together when the module starts and run beside each other and the
quick tests (a fixture); each slow test waits for its block.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
USAGE = ROOT / "docs" / "usage.md"  # the command tour

QUICK, SESSION = "quick", "session"  # quick: runs alone (and in its session); session: needs the commands before it
GPU_ONLY = "GPU only: on a machine without one it refuses with one line (bad input, exit 2)"

# README command -> (documented exit code, lane, what the README says it does)
EXPECT: dict[str, tuple[int, str, str]] = {
    # README: ## One run, one approval, then usage.md: ## The command tour (one session, in this order)
    "kinv run plans/3a-attention-occupancy.yaml --approval ask": (3, SESSION, "pauses (exit 3) at V1's kernel edit"),
    "kinv pending": (0, SESSION, "what waits for you"),
    "kinv approve 3a-V1-3": (0, SESSION, "approves V1's edit"),
    "kinv resume 3a": (3, SESSION, "continues; pauses again (exit 3) at V2's edit"),
    "kinv approve 3a-V2-4": (0, SESSION, "approves V2's edit"),
    "kinv resume 3a --approval auto": (0, SESSION, "closes #3a out"),
    "kinv status": (0, SESSION, "every workstream"),
    "kinv todos 3a --format claude": (0, SESSION, "the todos for Claude Code"),
    "kinv experiments 3a": (0, SESSION, "#3a's experiments"),
    "kinv show 3": (0, SESSION, "experiment 3: #3a's V1"),
    "kinv profile 3": (0, SESSION, "V1's recorded profile and the sentence that explains its verdict"),
    "kinv report 3a": (0, SESSION, "#3a's close-out"),
    "kinv backups": (0, SESSION, "backups taken before each patch"),
    "kinv history 3a": (0, SESSION, "the graph nodes that ran"),
    "kinv kernels": (0, QUICK, "the registered kernels"),
    "kinv check examples/quick_matmul/plan-uninstalled.yaml": (0, QUICK, "the plugin's gates on CPU, nothing timed"),
    "kinv bench --backend cuda": (2, QUICK, GPU_ONLY),
    "kinv bench --variant num_warps=8 --backend replay": (0, QUICK, "one A/B on replay, with a verdict"),
    "kinv run plans/4a-expert-gemm-tiles.yaml --approval auto": (0, SESSION, "the MoE kernel's workstream"),
    "kinv noise --backend replay": (0, QUICK, "the A/A of 4 baseline workers on replay"),
    "kinv run plans/6a-fault-drill.yaml --approval auto": (0, SESSION, "the fault drill closes out"),
    "kinv run plans/3c-null-batch-aware.yaml --approval auto": (0, SESSION, "the null drill closes out"),
    "kinv run plans/6b-source-null.yaml --backend cuda --approval auto": (2, QUICK, GPU_ONLY),
    "kinv run plans/3b-tile-shape.yaml --approval auto": (0, SESSION, "#3b closes out with a winner"),
    "kinv adopt 3b V1": (1, SESSION, "the confirming A/B against the shipped file: BT32 loses at every level"),
    "kinv adopt 3b V1 --yes": (1, SESSION, "nothing to adopt: the live file stays byte for byte"),
    "kinv export 3a --csv": (0, SESSION, "#3a's per-level effects as CSV"),
    "kinv compare 3 4": (0, SESSION, "#3a's V1 and V2 side by side"),
    "kinv report 3a --json": (0, SESSION, "the close-out as JSON"),
    "kinv env --json": (1, QUICK, "exit 1: a fresh shell lacks the plan's TARGET_CTAS=512"),
    "kinv run plans/3a-attention-occupancy.yaml --new-version": (3, SESSION, "a new version; pauses at V1's edit"),
    "kinv revert --to-plan plans/3a-attention-occupancy.yaml": (0, QUICK, "the shipped file back with no state dir"),
    "kinv doctor": (0, QUICK, "a healthy state dir"),
    # README: ## One campaign (one session)
    "kinv campaign plans/7-decode-ceiling.yaml --approval auto-config": (
        0, SESSION, "ends: its config loses to the shipped file at every level, nothing to adopt"),
    "kinv campaign plans/7-decode-ceiling.yaml --json": (0, SESSION, "the summary as JSON"),
    # usage.md: ## Many GPUs
    "kinv campaign plans/7-decode-ceiling.yaml --backend cuda --executor ray": (2, QUICK, GPU_ONLY),
    "kinv campaign plans/7-decode-ceiling.yaml --executor ray --ray-address HOST:6379": (
        -1, SESSION, "skipped: HOST:6379 stands for the user's own Ray cluster"),
    "kinv campaign plans/7-decode-ceiling.yaml --backend replay --executor ray --ray-actors 2 --approval auto-config": (
        0, SESSION, "the campaign on 2 CPU Ray actors"),
    # usage.md: ## Several workstreams at once
    "kinv run plans/3a-attention-occupancy.yaml plans/4a-expert-gemm-tiles.yaml --approval auto": (
        0, SESSION, "#3a and #4a at once, each in its own process"),
    # README: ## Your own command (one session)
    "kinv run plans/cpu-matmul-threads.yaml --approval auto": (0, SESSION, "the CPU matmul's threads, measured here"),
    "kinv report 11a": (0, SESSION, "its close-out"),
    # usage.md: ## Coding agents
    "kinv mcp --print-config claude > .mcp.json": (0, QUICK, "writes .mcp.json"),
    "kinv mcp --print-config opencode": (0, QUICK, "prints opencode's registration"),
}

# lines of the README's blocks that are not kinv commands: set-up, excluded by name (they install kinv)
SETUP_PREFIX = "python3 -m venv .venv && . .venv/bin/activate && pip install "


def readme_blocks(page: Path | None = None) -> list[tuple[str, list[str]]]:
    """(section heading, its commands in order) for every section with a command block, of ``page`` or of the
    README and then docs/usage.md.  A line indented by exactly four spaces is a block line; its ``  # comment``
    is dropped and `` ; `` separates commands."""
    if page is None:
        return readme_blocks(README) + readme_blocks(USAGE)
    sections: list[tuple[str, list[str]]] = []
    heading = ""
    in_fence = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
        if in_fence:
            continue
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
            continue
        m = re.match(r"^    (\S.*)$", line)
        if not m:
            continue
        text = m.group(1)
        if text.startswith(SETUP_PREFIX):
            continue
        assert text.startswith("kinv "), f"{page.name} block line is neither a kinv command nor set-up: {text!r}"
        text = re.split(r"\s+#\s", text, maxsplit=1)[0].strip()
        if not sections or sections[-1][0] != heading:
            sections.append((heading, []))
        sections[-1][1].extend(c.strip() for c in text.split(" ; "))
    return sections


def readme_commands() -> list[str]:
    return [c for _, cmds in readme_blocks() for c in cmds]


def test_every_readme_command_is_in_the_table_and_the_table_is_the_readme():
    shown = readme_commands()
    assert len(shown) > 30
    missing = [c for c in shown if c not in EXPECT]
    assert not missing, f"README commands the table does not cover (add each with its documented exit code): {missing}"
    stale = [c for c in EXPECT if c not in shown]
    assert not stale, f"table entries the README no longer shows: {stale}"
    setup = [ln for ln in README.read_text().splitlines() if ln.startswith("    " + SETUP_PREFIX)]
    assert len(setup) == 2, setup  # the main job and the tests: excluded by name, nothing else is
    assert not [ln for ln in USAGE.read_text().splitlines() if SETUP_PREFIX in ln]
    # a command that needs the ones before it runs in a session: none is left out of every session
    in_sessions = {c for name in SESSIONS for c in _session(name)}
    orphans = [c for c in shown if EXPECT[c][1] == SESSION and c not in in_sessions]
    assert not orphans, f"session commands in a section no session runs: {orphans}"


def test_the_readme_is_short_and_its_lines_are_readable():
    lines = README.read_text().splitlines()
    assert len(lines) <= 150, len(lines)
    for page in (README, USAGE):
        long = [ln for ln in page.read_text().splitlines() if len(ln) > 200 and not ln.startswith("    kinv ")]
        assert not long, (page.name, [ln[:80] for ln in long])
    # every page a link names is there, and every anchor a heading of it
    for page in (README, USAGE):
        for target in re.findall(r"\]\(([^)#\s]+)(?:#([^)\s]+))?\)", page.read_text()):
            path, anchor = page.parent / target[0], target[1]
            assert path.exists(), (page.name, target)
            if anchor:
                slugs = {re.sub(r"[^a-z0-9 -]", "", h.lstrip("#").strip().lower()).replace(" ", "-")
                         for h in path.read_text().splitlines() if h.startswith("#")}  # fmt: skip
                assert anchor in slugs, (page.name, target)
    # the test command CI runs (.ci/run) is the README's, verbatim
    ci = (ROOT / ".ci" / "run").read_text()
    test_line = next(ln for ln in lines if "python -m pytest" in ln).split("pip install -q torch", 1)[1]
    assert "pip install -q torch" + test_line in ci


def test_the_readme_documents_the_exit_codes_the_table_asserts():
    text = README.read_text()
    assert "kinv run plans/3a-attention-occupancy.yaml --approval ask   # pauses (exit 3)" in text
    assert "exit 3" in text.split("kinv resume 3a ")[1].splitlines()[0]
    assert "Exit codes: 0 done, 1 a step failed" in text and "3 paused for an approval" in text
    usage = USAGE.read_text()
    env_line = next(ln for ln in usage.splitlines() if "kinv env --json" in ln)
    assert "exit 1" in env_line and "TARGET_CTAS" in env_line
    # the exit codes and signals have a section of their own, every code in it
    section = usage.split("## Exit codes and signals", 1)[1].split("\n## ", 1)[0]
    for code in ("| 0 |", "| 1 |", "| 2 |", "| 3 |", "| 130 |"):
        assert code in section, code
    assert "SIGTERM" in section and "SIGHUP" in section


# --------------------------------------------------------------------------- #
def _project(tmp_path: Path) -> tuple[Path, dict]:
    """A fresh copy of the project a new user would run from (its own ./state), and the environment for it (with
    kinv's kept copies of files of record under ``tmp_path``, never the home dir)."""
    root = tmp_path / "clone"
    root.mkdir()
    skip = shutil.ignore_patterns("__pycache__", "*.kinv-lock")
    shutil.copytree(ROOT / "kernels", root / "kernels", ignore=skip)
    shutil.copytree(ROOT / "kinv", root / "kinv", ignore=skip)
    shutil.copytree(ROOT / "plans", root / "plans", ignore=shutil.ignore_patterns("closeouts", "campaigns"))
    shutil.copytree(ROOT / "examples", root / "examples", ignore=skip)  # own commands
    (root / "state").mkdir()  # a clone has the repository's empty state/ (state/.gitkeep)
    (root / "state" / ".gitkeep").touch()
    git = ["git", "-c", "user.name=kinv test", "-c", "user.email=test@kinv", "-c", "commit.gpgsign=false"]
    for step in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "a fresh clone"]):  # a clone is a git checkout
        subprocess.run([*git, *step], cwd=root, check=True, capture_output=True)
    env = {k: v for k, v in os.environ.items() if k not in ("KINV_STATE_DIR", "TARGET_CTAS", "COLUMNS")}
    env.update(KINV_CONFIG_DIR=str(root / "kernels" / "configs"), KINV_RECORDINGS=str(ROOT / "kernels" / "recordings"),
               TRITON_INTERPRET="1", KINV_FORCE_NO_GPU="1", PYTHONPATH=os.pathsep.join([str(root), str(ROOT)]),
               XDG_STATE_HOME=str(tmp_path / "xdg-state"))  # fmt: skip
    return root, env


def _run(root: Path, env: dict, command: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """The README's command line, as a shell runs it, with `kinv` this checkout's CLI."""
    script = f'kinv() {{ "{sys.executable}" -m kinv.agent.cli.app "$@"; }}\n{command}\n'
    return subprocess.run(["bash", "-c", script], cwd=root, env=env, capture_output=True, text=True, timeout=timeout)


def _tree_hash(d: Path) -> str:
    """One hash of every file under ``d`` (its path and bytes), caches left out."""
    import hashlib

    h = hashlib.sha256()
    for f in sorted(d.rglob("*")):
        if f.is_file() and "__pycache__" not in f.parts and not f.name.endswith(".kinv-lock"):
            h.update(str(f.relative_to(d)).encode() + f.read_bytes())
    return h.hexdigest()


def _check(command: str, r: subprocess.CompletedProcess) -> str | None:
    """What is wrong with one command's run, or None."""
    code, _, what = EXPECT[command]
    err = r.stderr.strip()
    if r.returncode != code:
        return f"{command!r}: exit {r.returncode}, the README documents {code} ({what}); stderr: {err[-600:]}"
    if "Traceback" in r.stderr or "internal error" in r.stderr:
        return f"{command!r}: {err[-600:]}"
    if what == GPU_ONLY and (len(err.splitlines()) != 1 or not err.startswith("kinv: ") or "GPU" not in err):
        return f"{command!r}: a refusal is one line naming the missing GPU, not {err!r}"
    return None


@pytest.mark.parametrize("command", [c for c, (code, lane, _) in EXPECT.items() if lane == QUICK])
def test_a_quick_readme_command_works_on_a_fresh_clone(tmp_path, command, blocks):
    """Alone on a fresh clone; or, where this run also runs a session that shows the command (the slow lane), as
    that session ran it, on its fresh clone, so that no command runs twice in one test run."""
    session = next((b for b in blocks.values() if command in b.commands), None)
    if session is not None:
        session.join()
        if session.error is None and command in dict(session.results):
            # the same checks, on the session's run of it
            r = dict(session.results)[command]
            assert _check(command, r) is None, _check(command, r)
            if EXPECT[command][2] == GPU_ONLY:  # refused: no kernel file written
                assert session.untouched[command], command
            if command.startswith("kinv mcp --print-config claude"):
                assert '"mcpServers"' in (session.root / ".mcp.json").read_text()
            return
    root, env = _project(tmp_path)
    shipped = (root / "kernels" / "configs" / "mla_decode.json").read_bytes()
    r = _run(root, env, command, timeout=300)
    assert _check(command, r) is None, _check(command, r)
    if EXPECT[command][2] == GPU_ONLY:  # refused: no kernel file written
        assert (root / "kernels" / "configs" / "mla_decode.json").read_bytes() == shipped
    if command.startswith("kinv mcp --print-config claude"):
        assert '"mcpServers"' in (root / ".mcp.json").read_text()


class _Block(threading.Thread):
    """One README block run as the session it is, in order, on a fresh clone of its own, in the background: the
    slow blocks share no state, so they run beside each other (and beside the quick tests) instead of one after
    another.  ``results`` pairs each command with its run; ``error`` is what stopped the block, if anything."""

    def __init__(self, name: str, where: Path, lock: Path | None = None):
        super().__init__(name=f"readme-{name.split()[0]}", daemon=True)
        self.commands = _session(name)
        self.root, self.env = _project(where)  # built here, in the main thread: tests change os.environ later
        self.shipped = (self.root / "kernels" / "configs" / "mla_decode.json").read_bytes()
        self.lock = lock
        self.locked = threading.Event()
        self.results: list[tuple[str, subprocess.CompletedProcess]] = []
        self.untouched: dict[str, bool] = {}  # command -> it left the live config as it found it
        self.kernels_untouched: dict[str, bool] = {}  # command -> every file under kernels/ as it found it
        self.error: BaseException | None = None

    def run(self):
        try:
            if self.lock is None:
                self.locked.set()
                self._commands()
                return
            from filelock import FileLock

            # the Ray block starts a local Ray cluster: it holds the ray lock (tests/conftest.py) while it runs
            with FileLock(str(self.lock)):
                self.locked.set()
                self._commands()
        except BaseException as exc:  # raised in the test that reads the block
            self.error = exc
        finally:
            self.locked.set()

    def _commands(self):
        live = self.root / "kernels" / "configs" / "mla_decode.json"
        for command in self.commands:
            if EXPECT[command][0] >= 0:
                before, tree = live.read_bytes(), _tree_hash(self.root / "kernels")
                self.results.append((command, _run(self.root, self.env, command)))
                self.untouched[command] = live.read_bytes() == before  # the live config as the command found it
                self.kernels_untouched[command] = _tree_hash(self.root / "kernels") == tree

    def outcome(self) -> tuple[list[str], str]:
        """(what went wrong, everything the block's commands printed), once the block is done."""
        self.join()
        if self.error is not None:
            raise self.error
        ran = [c for c, _ in self.results]
        assert ran == [c for c in self.commands if EXPECT[c][0] >= 0], ran
        return [p for c, r in self.results for p in [_check(c, r)] if p], "".join(r.stdout for _, r in self.results)


# each session and the sections it runs, in order: the README's and then usage.md's
SESSIONS = {
    "Using it": ("One run, one approval", "The command tour"),
    "Campaigns": ("One campaign",),
    "Many GPUs": ("Many GPUs",),
    "Your own benchmark": ("Your own command",),
    "Several workstreams": ("Several workstreams",),
}


def _session(name: str) -> list[str]:
    """The commands of session ``name``: its sections' blocks, in order (each section must exist)."""
    sections = readme_blocks()
    commands: list[str] = []
    for prefix in SESSIONS[name]:
        commands += next(cmds for s, cmds in sections if s.startswith(prefix))
    return commands


# the slow tests and the session each one runs
SLOW_BLOCKS = {
    "test_the_using_it_block_runs_as_a_session_on_a_fresh_clone": "Using it",
    "test_the_campaign_block_runs_as_a_session_on_a_fresh_clone": "Campaigns",
    "test_the_ray_block_runs_on_cpu_actors": "Many GPUs",
    "test_the_own_benchmark_block_runs_a_real_command_on_a_fresh_clone": "Your own benchmark",
    "test_the_several_workstreams_block_runs_two_kernels_at_once": "Several workstreams",
    # the session's own runs of the fault drill, the null drill and #4a, checked beyond their exit codes
    "test_the_fault_drill_stops_each_planted_fault_at_its_gate_and_leaves_the_kernel_files_as_they_were": "Using it",
    "test_the_null_drill_says_the_null_holds_and_the_sessions_runs_decide_exactly_as_pinned": "Using it",
}


@pytest.fixture(scope="module", autouse=True)
def blocks(request, tmp_path_factory):
    """The slow blocks this test run selected, started when the module starts (the longest, "Using it", first),
    each on its own fresh clone; every slow test waits for its own.  Torn down only when all are done."""
    import importlib.util

    from tests.conftest import _run_root

    wanted = {SLOW_BLOCKS[item.originalname] for item in request.session.items
              if item.module is request.module and item.originalname in SLOW_BLOCKS}  # fmt: skip
    if importlib.util.find_spec("ray") is None:
        wanted.discard("Many GPUs")
    started: dict[str, _Block] = {}
    for prefix in [p for p in dict.fromkeys(SLOW_BLOCKS.values()) if p in wanted]:
        lock = _run_root(tmp_path_factory, request.config) / "ray.lock" if prefix == "Many GPUs" else None
        block = _Block(prefix, tmp_path_factory.mktemp(prefix.split()[0].lower()), lock)
        block.start()
        started[prefix] = block
    for block in started.values():
        block.locked.wait()  # the Ray block holds the ray lock before the ray test's own turn comes
    yield started
    for block in started.values():
        block.join()


@pytest.mark.slow
def test_the_using_it_block_runs_as_a_session_on_a_fresh_clone(blocks):
    block = blocks["Using it"]
    problems, _ = block.outcome()
    assert not problems, "\n".join(problems)
    # its last steps: `kinv revert --to-plan` put the shipped file back, byte for byte
    assert (block.root / "kernels" / "configs" / "mla_decode.json").read_bytes() == block.shipped


def _json(block: _Block, command: str):
    """What ``command`` (a kinv command with --json) prints on the block's clone, after the block is done."""
    import json

    r = _run(block.root, block.env, command)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


@pytest.mark.slow
def test_the_fault_drill_stops_each_planted_fault_at_its_gate_and_leaves_the_kernel_files_as_they_were(blocks):
    """The session's fault drill: each planted fault is stopped at its gate and recorded with its reason, never
    timed; every kernel file (sources, configs) is byte for byte as before; the sound variant is decided; every
    number it decided and measured is as pinned."""
    from tests.agent.workstream.test_replay_outcomes import _pinned, outcome

    block = blocks["Using it"]
    block.outcome()
    assert block.kernels_untouched["kinv run plans/6a-fault-drill.yaml --approval auto"]
    # every patch and backup of the session was of the clone's files, never of the checkout it was made from
    files = {b["path"] for b in _json(block, "kinv backups --json")}
    assert files and all(f.startswith(str(block.root)) for f in files), files
    exps = {e["variant"]: e for e in _json(block, "kinv experiments 6a --json")}
    assert exps["F1"]["verdict"] == "failed" and "compile" in exps["F1"]["reason"]
    assert exps["F2"]["verdict"] == "infeasible" and "shared memory" in exps["F2"]["reason"] and "227.0 KB" in exps["F2"]["reason"]
    assert exps["F3"]["verdict"] == "incorrect" and "outside atol" in exps["F3"]["reason"]  # fast but wrong: never timed
    assert exps["F4"]["verdict"] == "crashed" and "signal 11" in exps["F4"]["reason"]
    # edits the reference: a source patch may only touch the adapter's kernel_files, so it is refused before
    # anything runs (integrity would void it if it ever ran: tests/agent/workstream/test_faults.py)
    assert exps["F5"]["verdict"] in ("failed", "void", "not measured") and exps["F5"]["samples"] == 0
    assert "kernels/mla_decode_ref.py" in exps["F5"]["reason"] and "may only patch" in exps["F5"]["reason"]
    # lazy: writes nothing; its output buffer was poisoned with NaN, so no earlier result can pass for it
    assert exps["F6"]["verdict"] == "incorrect" and "not finite" in exps["F6"]["reason"]
    assert exps["V1"]["verdict"] == "accept"
    assert exps["F7"]["verdict"] == "failed" and "patch failed" in exps["F7"]["reason"]  # stale patch: no wedge
    # the known ways to fool a benchmark that a CPU check can show are failed at the gate, with what caught them
    assert exps["F9"]["verdict"] == "incorrect" and "rewritten in place at the same addresses" in exps["F9"]["reason"]
    assert exps["F10"]["verdict"] == "incorrect" and "outside atol" in exps["F10"]["reason"]
    assert exps["F11"]["verdict"] == "incorrect" and "replaced the harness's timer" in exps["F11"]["reason"]
    # a side stream (no stream on CPU) and a subset wrong past 2048 tokens (the stand-in has 64) pass the CPU
    # check; the recordings hold no times for their source, so neither gets a verdict (live, the GPU gate fails them)
    for fid in ("F8", "F12"):
        assert exps[fid]["verdict"] in ("not measured", "failed", "void"), exps[fid]
    for fid in ("F1", "F3", "F4", "F5", "F6", "F7", "F8", "F9", "F10", "F11", "F12"):
        assert exps[fid]["samples"] == 0, f"{fid} was timed"
    closeout = (block.root / "state" / "reports" / "6a-closeout.md").read_text()
    assert "**F5** (edits the reference it is judged against): **failed**" in closeout
    assert "may only patch the kernel's files" in closeout
    ws = next(w for w in _json(block, "kinv status --json")["workstreams"] if w["id"] == "#6a")
    assert ws["status"] == "closed" and not ws["pending_approvals"]
    _pinned("6a", outcome(_json(block, "kinv report 6a --json")))


@pytest.mark.slow
def test_the_null_drill_says_the_null_holds_and_the_sessions_runs_decide_exactly_as_pinned(blocks):
    """#3c predicts no change at b1 and b8 (expect: no_change): its close-out says whether the null held there,
    not that "the hypothesis is refuted" because nothing won.  The session's #3c and #4a decide and measure every
    number as pinned (replay is deterministic)."""
    from tests.agent.workstream.test_replay_outcomes import _pinned, outcome

    block = blocks["Using it"]
    block.outcome()
    text = (block.root / "state" / "reports" / "3c-closeout.md").read_text()
    assert "- The null holds: equivalent at b1, b8 for every measured variant." in text
    assert "refuted" not in text.split("## Where this was measured")[0]
    for ws in ("3c", "4a"):
        _pinned(ws, outcome(_json(block, f"kinv report {ws} --json")))


@pytest.mark.slow
def test_the_campaign_block_runs_as_a_session_on_a_fresh_clone(blocks):
    block = blocks["Campaigns"]
    problems, said = block.outcome()
    assert not problems, "\n".join(problems)
    # the campaign's config was measured against the shipped file, lost everywhere, and nothing was written
    assert "nothing to adopt" in said and "improves on the live file" in said, said[-2000:]
    assert (block.root / "kernels" / "configs" / "mla_decode.json").read_bytes() == block.shipped


@pytest.mark.slow
def test_the_own_benchmark_block_runs_a_real_command_on_a_fresh_clone(blocks):
    block = blocks["Your own benchmark"]
    problems, said = block.outcome()
    assert not problems, "\n".join(problems)
    # which thread count wins depends on the machine's load (tests/agent/tools/backends/test_command_backend.py); that T1 was decided does not
    assert "COMMAND backend" in said and "T1: " in said and "close-out written" in said, said[-2000:]
    # both arms ran in their own environment, confirmed in every process; a whole command has no launch resources
    assert "with OMP_NUM_THREADS=1 in its processes" in said, said[-2000:]
    text = (block.root / "state" / "reports" / "11a-closeout.md").read_text()
    assert "OMP_NUM_THREADS=1 in its processes (the baseline's: 2)" in text and "GFLOP/s" in text
    assert "Environment expected and confirmed in every worker: OMP_NUM_THREADS=2" in text
    assert "Predicted change" not in text
    assert list((block.root / "state" / "commands").glob("e*-T1-n512-r*.log"))  # every run's output kept


def _levels(block: _Block) -> dict:
    """The chosen config per level of the campaign the block ran, as `kinv campaign PLAN --json` prints it."""
    import json

    command = "kinv campaign plans/7-decode-ceiling.yaml --json"
    r = next((r for c, r in block.results if c == command), None) or _run(block.root, block.env, command)
    assert r.returncode == 0, r.stderr[-2000:]
    return {level: v["config"] for level, v in json.loads(r.stdout)["levels"].items()}


@pytest.mark.slow
@pytest.mark.ray
def test_the_ray_block_runs_on_cpu_actors(blocks):
    pytest.importorskip("ray")
    block = blocks["Many GPUs"]
    problems, said = block.outcome()
    assert not problems, "\n".join(problems)
    # on 2 CPU actors the campaign ends as it does in one process: nothing to adopt, nothing written
    assert "nothing to adopt" in said and "improves on the live file" in said, said[-2000:]
    assert (block.root / "kernels" / "configs" / "mla_decode.json").read_bytes() == block.shipped
    if "Campaigns" in blocks:  # and it chose the single-process campaign's config at every level
        assert _levels(block) == _levels(blocks["Campaigns"])


# --------------------------------------------------------------------------- #
# what the commands say: hints that run as printed, --json everywhere, a state dir that is a file
# --------------------------------------------------------------------------- #
def _kinv(capsys, *args) -> tuple[int, str, str]:
    from kinv.agent.cli.app import main

    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def demo_dir(tmp_path, monkeypatch):
    """A state dir named with --state-dir (KINV_STATE_DIR points elsewhere), holding the #3a demo store."""
    from benchmarks.demo_store import populate_demo
    from kinv.agent.store.db import Store

    d = tmp_path / "elsewhere"
    store = Store(d)
    populate_demo(store, n_experiments=3, n_samples=60)
    store.add_approval(id="3a-V1-3", workstream="#3a", todo="#3a.V1", variant="V1", kind="config", diff="",
                       resources="{}", hypothesis="")  # fmt: skip
    store.close()
    monkeypatch.setenv("KINV_STATE_DIR", str(tmp_path / "state"))
    return d


def test_export_takes_json_as_every_read_command_does(capsys, demo_dir):
    import json

    code, out, err = _kinv(capsys, "export", "3a", "--json", "--state-dir", demo_dir)
    assert code == 0, err
    rows = json.loads(out)
    assert rows and {"level", "change", "verdict"} <= set(rows[0])
    assert _kinv(capsys, "export", "3a", "--state-dir", demo_dir)[1] == out  # JSON is the default
    code, out, err = _kinv(capsys, "export", "3a", "--csv", "--json", "--state-dir", demo_dir)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--csv" in err and not out


def test_approve_names_the_resume_with_the_state_dir_it_was_given(capsys, demo_dir):
    code, out, err = _kinv(capsys, "approve", "3a-V1-3", "--state-dir", demo_dir)
    assert code == 0, err
    assert f"Continue with: kinv resume 3a --state-dir {demo_dir}" in out
    code, out, err = _kinv(capsys, "report", "3b", "--state-dir", demo_dir)  # no close-out yet: the way on
    assert code == 1 and f"run: kinv resume 3b --state-dir {demo_dir}" in err


def test_a_paused_or_interrupted_run_names_commands_with_its_state_dir(tmp_path, demo_dir):
    from rich.console import Console

    from kinv.agent.ids import continue_command
    from kinv.agent.store.db import Store
    from kinv.agent.workstream.investigation import _paused

    store = Store(demo_dir)
    store.add_approval(id="3a-V2-4", workstream="#3a", todo="#3a.V2", variant="V2", kind="config", diff="",
                       resources="{}", hypothesis="")  # fmt: skip
    import io

    out = _paused(store, "3a-V2-4", Console(file=io.StringIO()), str(demo_dir), "#3a")
    line = out.message
    assert out.end == "paused"
    assert f"kinv approve 3a-V2-4 --state-dir {demo_dir}" in line
    assert f"kinv reject 3a-V2-4 --reason ... --state-dir {demo_dir}" in line
    assert line.endswith(f"then kinv resume 3a --state-dir {demo_dir}")
    assert continue_command(store, "#3a", None) == "kinv resume 3a"  # none given: none printed


def test_approving_a_campaigns_adoption_names_the_campaign_not_its_closed_workstream(capsys, tmp_path, monkeypatch):
    """`kinv approve 7-adopt` said "kinv resume 7c", which answers "#7c is already closed out" and writes nothing;
    the command that writes the approved config is `kinv campaign PLAN`."""
    from kinv.agent.store.db import Store

    monkeypatch.chdir(ROOT)
    d = tmp_path / "s"
    store = Store(d)
    store.upsert_campaign({"id": "#7", "plan_path": str(ROOT / "plans" / "7-decode-ceiling.yaml"), "status": "paused",
                           "kernel": "mla_decode", "steps": "[]"})  # fmt: skip
    store.upsert_workstream({"id": "#7c", "parent": "#7", "title": "final", "kernel": "mla_decode", "status": "closed",
                             "campaign": "#7"})  # fmt: skip
    store.add_approval(id="7-adopt", workstream="#7c", todo="#7c.adopt", variant="V1", kind="adopt", diff="",
                       resources="{}", hypothesis="")  # fmt: skip
    store.close()
    code, out, err = _kinv(capsys, "approve", "7-adopt", "--state-dir", d)
    assert code == 0, err
    assert f"Continue with: kinv campaign plans/7-decode-ceiling.yaml --state-dir {d}" in out
    assert "resume" not in out


STATE_DIR_COMMANDS = [
    ["doctor"], ["status"], ["pending"], ["backups"], ["experiments", "3a"], ["show", "1"], ["export", "3a"],
    ["todos", "3a"], ["history", "3a"], ["report", "3a"], ["approve", "3a-V1-3"], ["reject", "3a-V1-3", "--reason", "x"],
    ["resume", "3a"], ["revert"], ["revert", "--to-plan", "plans/3a-attention-occupancy.yaml"],
    ["run", "plans/3a-attention-occupancy.yaml", "--backend", "replay"], ["bench", "--backend", "replay"],
    ["noise", "--backend", "replay"], ["mcp", "--print-config", "claude"], ["compare", "1", "2"],
    ["adopt", "3b", "V1"], ["campaign", "plans/7-decode-ceiling.yaml", "--backend", "replay"], ["env", "--pid", str(os.getpid())],
]  # fmt: skip


@pytest.mark.parametrize("how", ["--state-dir", "KINV_STATE_DIR"])
def test_a_state_dir_that_is_a_file_is_bad_input_for_every_command(capsys, tmp_path, monkeypatch, how):
    monkeypatch.chdir(ROOT)
    cfg_dir = tmp_path / "configs"  # should a command write a config after all, it writes a copy
    shutil.copytree(ROOT / "kernels" / "configs", cfg_dir)
    monkeypatch.setenv("KINV_CONFIG_DIR", str(cfg_dir))
    f = tmp_path / "afile"
    f.write_text("not a directory\n")
    cfg = (cfg_dir / "mla_decode.json").read_bytes()
    for args in STATE_DIR_COMMANDS:
        if how == "KINV_STATE_DIR":
            monkeypatch.setenv("KINV_STATE_DIR", str(f))
            argv = args
        else:
            argv = [*args, "--state-dir", str(f)]
        code, out, err = _kinv(capsys, *argv)
        assert code == 2, (argv, code, out, err)
        assert len(err.strip().splitlines()) == 1 and "is a file, not a directory" in err and str(f) in err, (argv, err)
        assert "Errno" not in err and f.read_text() == "not a directory\n"
    code, out, err = _kinv(capsys, "status", "--state-dir", f / "sub")  # under a file: said so too
    assert code == 2 and f"{f} is a file" in err
    assert (cfg_dir / "mla_decode.json").read_bytes() == cfg


def test_a_replay_without_a_recording_says_what_the_user_can_do(tmp_path):
    """The advice of a missing recording names what a user can run (a GPU, a recorded config), not a GPU script."""
    import json

    root, env = _project(tmp_path)
    cfg = tmp_path / "odd.json"
    cfg.write_text(json.dumps({"kernel": "mla_decode", "BLOCK_T": 128, "BLOCK_H": 16, "num_warps": 2, "num_stages": 5,
                               "overrides": [{"batch_max": 1, "num_warps": 8}]}))  # a conditional config, unrecorded
    r = _run(root, env, f"kinv bench --backend replay --samples 2 --config {cfg}", timeout=120)
    assert r.returncode == 2, r.stderr
    err = r.stderr.strip().splitlines()[-1]
    assert "record.py" not in err and "--backend cuda" in err and "--config" in err, err


@pytest.mark.slow
def test_the_several_workstreams_block_runs_two_kernels_at_once(blocks):
    block = blocks["Several workstreams"]
    problems, said = block.outcome()
    assert not problems, "\n".join(problems)
    assert "2 workstreams in 2 group(s)" in said and "#3a exit 0, #4a exit 0" in said, said[-2000:]
    for ws in ("3a", "4a"):  # each ran in its own process, with its own log ending in its close-out
        assert (block.root / "state" / "runs" / f"{ws}.log").read_text().strip().splitlines()[-1].startswith("close-out:")
    assert (block.root / "kernels" / "configs" / "mla_decode.json").read_bytes() == block.shipped
