"""Crash harness: SIGKILL `kinv run` at random fault points, again and again, and check every recovery.

What it checks: "A test harness kills `kinv run` with SIGKILL at 100 or more
random points across an investigation (replay backend).  After every kill,
the next start recovers, and all of these hold: the kernel config and any
patched source are byte-identical to the baseline; the journal has no
dangling entry; no committed sample is lost; the investigation finishes with
the same verdicts as an uninterrupted run."

How (the fault points are in agent/faults.py, agent/store/, agent/tools/files/configs.py):

1. A reference run of a small copy of the 3a plan (levels 1 and 96, short
   stats) in a fresh state counts its fault points M (KINV_COUNT_POINTS) and
   records its todos and experiments (`kinv todos 3a --json`,
   `kinv experiments 3a --json`).
2. In a fresh state (its own copy of kernels/configs), `kinv run` starts with
   KINV_CRASH_AT=k, k uniform in [1, W] with W = M/4, and dies by SIGKILL at
   its k-th write point.  Every restart resumes from the last checkpoint, so
   the chain of kills walks through the whole investigation in random steps
   (setup, baseline, noise, each variant's patch, gate, rounds and revert,
   the close-out), about a dozen kills per investigation; a restart spends
   5-30 points getting back to where it was, so W must stay above that.  Right after the kill the harness notes the sample
   ids committed so far and whether the kernel file was left patched.
3. The next start runs with KINV_STOP_AT=recover.done: it stops itself
   (SIGSTOP) the moment its start-up recovery has finished, before it writes
   anything else.  With it frozen the harness checks: the config bytes equal
   the baseline's, no temp file is left beside it, the journal has no intent
   or applied row, every sample id committed before the kill is still there.
   Then SIGCONT, and that run dies at its own k (or finishes).
4. A run that finishes (exit 0) ends the investigation: the config is the
   baseline, the journal is clean, every restart resumed the graph (one
   LangGraph 'input' checkpoint: it never began the investigation again), and
   its todos and verdicts equal the reference's.  A fresh state starts the next investigation, until the
   requested number of kills is reached (the last investigation is then run
   to its end and compared too).

Lanes run independent chains side by side (each with its own state and
config copy).  Every process runs a snapshot of agent/ and kernels/ taken when
the harness starts, so an edit to the working tree during the minutes the
harness runs cannot change a verdict (the graph voids a variant whose
harness or reference hash changed mid-investigation, as it should).

Example:
    python benchmarks/crash_harness.py --kills 100 --seed 1            (lanes: cores + 1, at most 4)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "plans" / "3a-attention-occupancy.yaml"
CONFIG = ROOT / "kernels" / "configs" / "mla_decode.json"
RUN_TIMEOUT_S = 300
MAX_KILLS_PER_INVESTIGATION = 40  # then it runs to its end without a kill
WINDOW = 0.25  # k is uniform in [1, WINDOW * the reference's fault points]


class CrashInvariantError(AssertionError):
    """An invariant did not hold after a kill; the message says which, where and after what."""


def snapshot(dst: Path) -> Path:
    """A copy of the code the runs execute (kinv/, agent/, kernels/ with its recordings): kinv/ too, or the
    runs would import the installed kinv instead of the copy."""
    for pkg in ("kinv", "agent", "kernels"):
        shutil.copytree(ROOT / pkg, dst / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dst


def tiny_plan(dst: Path) -> Path:
    """The 3a plan at two levels with short statistics (still V1, V2, and V3 with its requires)."""
    text = PLAN.read_text()
    for old, new in (("levels: [1, 8, 32, 64, 96]", "levels: [1, 96]"), ("aa_rounds: 16", "aa_rounds: 8"),
                     ("aa_arms: 4 ", "aa_arms: 2 "), ("quick_rounds: 8", "quick_rounds: 2"),
                     ("step_rounds: 4", "step_rounds: 2"), ("max_rounds: 32", "max_rounds: 6")):  # fmt: skip
        if old not in text:
            raise RuntimeError(f"{PLAN} no longer contains {old!r}; update benchmarks/crash_harness.py")
        text = text.replace(old, new)
    dst.write_text(text)
    return dst


# --------------------------------------------------------------------------- #
# one investigation's state
# --------------------------------------------------------------------------- #
class Investigation:
    """A fresh state dir and its own copy of kernels/configs."""

    def __init__(self, root: Path, plan: Path, code: Path = ROOT):
        root.mkdir(parents=True)
        self.root, self.plan, self.code = root, plan, code
        self.state = root / "state"
        self.configs = root / "configs"
        self.configs.mkdir()
        shutil.copy(CONFIG, self.configs)
        self.config = self.configs / CONFIG.name
        self.baseline = self.config.read_bytes()
        self.env = dict(os.environ, KINV_STATE_DIR=str(self.state), KINV_CONFIG_DIR=str(self.configs),
                        TRITON_INTERPRET="1", KINV_FORCE_NO_GPU="1", PYTHONPATH=str(code))  # fmt: skip
        for k in ("KINV_CRASH_AT", "KINV_COUNT_POINTS", "KINV_STOP_AT"):
            self.env.pop(k, None)
        self.runs = 0

    def kinv(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "kinv.agent.cli.app", *args], env=self.env, cwd=self.code,
                              capture_output=True, text=True, timeout=RUN_TIMEOUT_S)  # fmt: skip

    def start(self, crash_at: int | None = None, stop_at: str | None = None) -> tuple[subprocess.Popen, Path, Path]:
        """Start `kinv run` in the background; its output and fault-point log go to files."""
        self.runs += 1
        points = self.root / f"run{self.runs}.points"
        log = self.root / f"run{self.runs}.log"
        env = dict(self.env, KINV_COUNT_POINTS=str(points))
        if crash_at:
            env["KINV_CRASH_AT"] = str(crash_at)
        if stop_at:
            env["KINV_STOP_AT"] = stop_at
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "kinv.agent.cli.app", "run", str(self.plan), "--backend", "replay",
                                     "--approval", "auto"], env=env, cwd=self.code, stdout=out,
                                    stderr=subprocess.STDOUT)  # fmt: skip
        return proc, points, log

    # ---- read-only looks at the state ------------------------------------------
    def _db(self) -> sqlite3.Connection | None:
        path = self.state / "kinv.db"
        if not path.exists():
            return None
        conn = sqlite3.connect(str(path), timeout=30)
        conn.execute("PRAGMA busy_timeout = 30000")
        return conn

    def sample_ids(self) -> set[int]:
        conn = self._db()
        if conn is None:
            return set()
        try:
            return {r[0] for r in conn.execute("select id from samples")}
        except sqlite3.OperationalError:  # killed before the schema was created
            return set()
        finally:
            conn.close()

    def dangling(self) -> list[tuple]:
        conn = self._db()
        if conn is None:
            return []
        try:
            return conn.execute("select id, state, path from patches where state in ('intent', 'applied')").fetchall()
        except sqlite3.OperationalError:
            return []
        finally:
            conn.close()

    def phase(self) -> str:
        """The todo in progress (baseline, noise, V1, ...), 'after X' between todos, 'setup' before any."""
        conn = self._db()
        if conn is None:
            return "setup"
        try:
            rows = conn.execute("select id, status from todos order by updated").fetchall()
        except sqlite3.OperationalError:
            return "setup"
        finally:
            conn.close()
        running = [i for i, st in rows if st == "in_progress"]
        if running:
            return running[-1].rsplit(".", 1)[-1]
        done = [i for i, st in rows if st in ("completed", "cancelled")]
        return f"after {done[-1].rsplit('.', 1)[-1]}" if done else "setup"

    def fresh_starts(self) -> int:
        """How many times the graph was started from its beginning (LangGraph 'input' checkpoints)."""
        path = self.state / "checkpoints.db"
        if not path.exists():
            return 0
        conn = sqlite3.connect(str(path), timeout=30)
        try:
            return conn.execute("select count(*) from checkpoints where checkpoint_ns = '' and "
                                "json_extract(metadata, '$.source') = 'input'").fetchone()[0]  # fmt: skip
        except sqlite3.OperationalError:
            return 0
        finally:
            conn.close()

    def stray_files(self) -> list[str]:
        return sorted(p.name for p in self.configs.iterdir() if p.name != self.config.name)

    def outcome(self) -> dict:
        """What an investigation decided: todos (status, reason) and, per variant, its final experiment."""
        t = self.kinv("todos", "3a", "--json")
        e = self.kinv("experiments", "3a", "--json")
        if t.returncode or e.returncode:
            raise CrashInvariantError(f"read commands failed: {t.stderr.strip()} {e.stderr.strip()}")
        norm = str(self.state)
        todos = {x["id"]: (x["status"], (x["reason"] or "").replace(norm, "<state>")) for x in json.loads(t.stdout)}
        exps = json.loads(e.stdout)
        final = {}
        for x in exps:  # the last experiment of each variant that got past 'running'
            if x["status"] != "running":
                final[x["variant"]] = (x["kind"], x["status"], x["verdict"], x["reason"], x["rounds"], x["samples"])
        orphans = [x["id"] for x in exps if x["status"] == "running"]
        per: dict[tuple, int] = {}
        for x in exps:  # a todo measured twice (a node re-run after a kill that did its work again)
            per[(x["variant"], x["kind"])] = per.get((x["variant"], x["kind"]), 0) + 1
        dups = sum(n - 1 for n in per.values() if n > 1)
        return {"todos": todos, "experiments": final, "orphans": orphans, "duplicates": dups}


def wait_stop_or_exit(proc: subprocess.Popen, timeout: float = RUN_TIMEOUT_S,
                      kill_after: float | None = None) -> tuple[str, int | None]:
    """('stopped', None) when the child stopped itself (SIGSTOP), else ('exited', return code).  With
    ``kill_after`` (wall-clock mode) a run still going after that many seconds is SIGKILLed (('exited', -9))."""
    deadline = time.time() + (kill_after if kill_after is not None else timeout)
    while True:
        pid, status = os.waitpid(proc.pid, os.WNOHANG | os.WUNTRACED)
        if pid:
            if os.WIFSTOPPED(status):
                return "stopped", None
            proc.returncode = os.waitstatus_to_exitcode(status)
            return "exited", proc.returncode
        if time.time() > deadline:
            proc.kill()
            proc.wait()
            if kill_after is not None:
                return "exited", proc.returncode
            raise CrashInvariantError(f"kinv run pid {proc.pid} neither stopped nor exited in {timeout:.0f} s")
        time.sleep(0.005)


def last_point(points: Path) -> tuple[int, str]:
    lines = points.read_text().splitlines() if points.exists() else []
    if not lines:
        return 0, "-"
    n, name = lines[-1].split(" ", 1)
    return int(n), name


# --------------------------------------------------------------------------- #
# the chain
# --------------------------------------------------------------------------- #
@dataclass
class Kill:
    lane: int
    investigation: int
    k: int  # the fault point (per process) it died at
    name: str  # that point's name
    phase: str  # the todo in progress when it died (setup, baseline, noise, V1, V2, closeout)
    samples_done: float  # samples committed when it died, as a fraction of the reference's
    patched_at_death: bool  # the config file held other bytes than the baseline's when it died
    dangling_at_death: int  # journal rows in intent/applied when it died


@dataclass
class Totals:
    kills: list[Kill] = field(default_factory=list)
    recoveries_checked: int = 0
    investigations: int = 0
    runs: int = 0
    orphan_experiments: int = 0
    duplicated_experiments: int = 0
    failed: bool = False  # a lane broke an invariant: the others stop at their next run
    lock: threading.Lock = field(default_factory=threading.Lock)


def reference(work: Path, plan: Path, code: Path) -> dict:
    inv = Investigation(work / "reference", plan, code)
    t0 = time.time()
    proc, points, log = inv.start()
    state, rc = wait_stop_or_exit(proc)
    if rc != 0:
        raise RuntimeError(f"the reference run failed (exit {rc}): {log.read_text()[-2000:]}")
    out = inv.outcome()
    out["points"] = last_point(points)[0]
    out["samples"] = len(inv.sample_ids())
    out["seconds"] = time.time() - t0
    if inv.config.read_bytes() != inv.baseline or inv.dangling():
        raise CrashInvariantError("the uninterrupted reference run left the config patched or the journal dangling")
    return out


def check_recovered(inv: Investigation, committed: set[int], where: str) -> set[int]:
    """The invariants that must hold once a start's recovery is done (the run is frozen there)."""
    problems = []
    if inv.config.read_bytes() != inv.baseline:
        problems.append(f"config {inv.config.name} differs from the baseline bytes")
    if inv.stray_files():
        problems.append(f"stray files beside the config: {inv.stray_files()}")
    if inv.dangling():
        problems.append(f"dangling journal rows: {inv.dangling()}")
    ids = inv.sample_ids()
    if lost := committed - ids:
        problems.append(f"{len(lost)} committed sample(s) lost: ids {sorted(lost)[:10]}")
    if problems:
        raise CrashInvariantError(f"{where}: " + "; ".join(problems))
    return ids


def chain(lane: int, work: Path, plan: Path, code: Path, ref: dict, target: int, rng: random.Random,
          totals: Totals, log=print, wall_clock: bool = False,
          max_kills: int = MAX_KILLS_PER_INVESTIGATION) -> None:  # fmt: skip
    """Kill investigations in this lane until ``target`` kills were made (over all lanes).  ``wall_clock``: a
    SIGKILL at a random moment (uniform over the reference run's length after recovery), not at a fault point."""
    m = ref["points"]
    n_inv = 0
    while True:
        with totals.lock:
            if len(totals.kills) >= target or totals.failed:
                return
        n_inv += 1
        inv = Investigation(work / f"lane{lane}" / f"inv{n_inv}", plan, code)
        committed: set[int] = set()
        kills_here = 0
        while True:
            with totals.lock:
                enough = len(totals.kills) >= target
                if totals.failed:
                    return
            crash_at = kill_after = None
            if not enough and kills_here < max_kills:
                if wall_clock:
                    # a run spends its first seconds starting (imports, the checks of setup), so the moments
                    # span past the reference's length: some kills land deep in a variant, some never come
                    kill_after = rng.uniform(0.25, 1.1) * ref["seconds"]
                else:
                    crash_at = rng.randint(1, max(2, int(m * WINDOW)))
            proc, points, runlog = inv.start(crash_at=crash_at, stop_at="recover.done")
            with totals.lock:
                totals.runs += 1
            where = (f"lane {lane} investigation {n_inv} run {inv.runs} "
                     + (f"(SIGKILL after {kill_after:.2f} s)" if kill_after else f"(KINV_CRASH_AT={crash_at})"))
            state, rc = wait_stop_or_exit(proc)
            checked = state == "stopped"
            if checked:  # its start-up recovery is done: check, then let it go on
                try:
                    committed = check_recovered(inv, committed, f"after recovery, {where}")
                finally:
                    os.kill(proc.pid, signal.SIGCONT)
                with totals.lock:
                    totals.recoveries_checked += 1
                state, rc = wait_stop_or_exit(proc, kill_after=kill_after)
            if rc == -signal.SIGKILL:
                k, name = last_point(points)
                if kill_after:
                    name = f"wall clock, after {name}"
                elif k != crash_at:
                    raise CrashInvariantError(f"{where}: killed at point {k}, expected {crash_at}")
                ids = inv.sample_ids()
                if lost := committed - ids:
                    raise CrashInvariantError(f"{where}: {len(lost)} committed sample(s) vanished at the kill")
                committed = ids
                kill = Kill(lane, n_inv, k, name, inv.phase(), len(ids) / ref["samples"],
                            inv.config.read_bytes() != inv.baseline, len(inv.dangling()))  # fmt: skip
                kills_here += 1
                with totals.lock:
                    totals.kills.append(kill)
                continue
            if rc != 0:
                raise CrashInvariantError(f"{where}: exit {rc}: {runlog.read_text()[-3000:]}")
            # finished: the investigation must end clean and agree with the uninterrupted run
            if not checked:
                raise CrashInvariantError(f"{where}: finished without stopping at recover.done (no start-up recovery?)")
            if inv.config.read_bytes() != inv.baseline or inv.dangling() or inv.stray_files():
                raise CrashInvariantError(f"{where}: finished but the config or journal is not clean")
            if lost := committed - inv.sample_ids():
                raise CrashInvariantError(f"{where}: finished, {len(lost)} committed sample(s) lost")
            if (starts := inv.fresh_starts()) != 1:  # every restart must resume, never begin again
                raise CrashInvariantError(
                    f"{where}: the graph was started from its beginning {starts} times; a restart after a kill "
                    f"began the investigation again instead of resuming it (see {inv.root}/run*.log)"
                )
            out = inv.outcome()
            for key in ("todos", "experiments"):
                if out[key] != ref[key]:
                    diff = {k: (out[key].get(k), ref[key].get(k)) for k in set(out[key]) | set(ref[key])
                            if out[key].get(k) != ref[key].get(k)}  # fmt: skip
                    raise CrashInvariantError(f"{where}: {key} differ from the uninterrupted run: {diff}")
            with totals.lock:
                totals.investigations += 1
                totals.orphan_experiments += len(out["orphans"])
                totals.duplicated_experiments += out["duplicates"]
            log(f"lane {lane}: investigation {n_inv} finished after {kills_here} kill(s), verdicts match")
            break


def run_harness(kills: int = 100, lanes: int = 2, seed: int = 0, work: Path | None = None, log=print,
                wall_clock: bool = False, max_kills: int = MAX_KILLS_PER_INVESTIGATION) -> dict:
    """Run the whole harness; raises CrashInvariantError on the first broken invariant; returns a summary."""
    t0 = time.time()
    own = work is None
    work = Path(tempfile.mkdtemp(prefix="kinv-crash-")) if own else Path(work)
    work.mkdir(parents=True, exist_ok=True)
    try:
        plan = tiny_plan(work / "plan.yaml")
        code = snapshot(work / "code")
        ref = reference(work, plan, code)
        log(f"reference: {ref['points']} fault points, {ref['seconds']:.1f} s, "
            f"verdicts {{{', '.join(f'{v}: {e[2]}' for v, e in ref['experiments'].items() if e[2])}}}")  # fmt: skip
        totals = Totals()
        errors: list[BaseException] = []

        def lane_main(i: int) -> None:
            try:
                chain(i, work, plan, code, ref, kills, random.Random(seed * 1000 + i), totals, log, wall_clock,
                      max_kills)
            except BaseException as exc:  # noqa: BLE001 - reported by the caller
                errors.append(exc)
                totals.failed = True

        threads = [threading.Thread(target=lane_main, args=(i,)) for i in range(lanes)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        ks = totals.kills
        names: dict[str, int] = {}
        for k in ks:
            names[k.name] = names.get(k.name, 0) + 1
        sample_deciles, phases = [0] * 10, {}
        for k in ks:
            sample_deciles[min(int(k.samples_done * 10), 9)] += 1
            phases[k.phase] = phases.get(k.phase, 0) + 1
        return {
            "kills": len(ks), "recoveries_checked": totals.recoveries_checked,
            "investigations_completed": totals.investigations, "runs": totals.runs, "lanes": lanes, "seed": seed,
            "reference_points": ref["points"], "reference_samples": ref["samples"], "reference_seconds": round(ref["seconds"], 2),
            "kill_point_min": min(k.k for k in ks), "kill_point_max": max(k.k for k in ks),
            "samples_done_deciles": sample_deciles, "kills_by_phase": phases,
            "distinct_point_names": len(names),
            "killed_with_config_patched": sum(k.patched_at_death for k in ks),
            "killed_with_dangling_journal": sum(k.dangling_at_death > 0 for k in ks),
            "orphan_running_experiments": totals.orphan_experiments,
            "duplicated_experiments": totals.duplicated_experiments, "mode": "wall clock" if wall_clock else "fault points",
            "configs_byte_identical_after_next_start": totals.recoveries_checked,
            "kills_by_point": dict(sorted(names.items(), key=lambda kv: -kv[1])),
            "wall_s": round(time.time() - t0, 1),
        }  # fmt: skip
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=100, help="SIGKILLs to make in all (default 100)")
    ap.add_argument("--lanes", type=int, default=min(4, (os.cpu_count() or 1) + 1), help="chains side by side")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--wall-clock", action="store_true", help="SIGKILL at random moments instead of fault points")
    ap.add_argument("--max-kills-per-investigation", type=int, default=MAX_KILLS_PER_INVESTIGATION,
                    help="then an investigation runs to its end (fewer: more investigations per kill)")
    ap.add_argument("--work", type=Path, default=None, help="keep the states here (default: a temp dir, removed)")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = ap.parse_args(argv)
    quiet = (lambda *a, **k: None) if args.json else print
    try:
        s = run_harness(args.kills, args.lanes, args.seed, args.work, log=quiet, wall_clock=args.wall_clock,
                        max_kills=args.max_kills_per_investigation)
    except CrashInvariantError as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(s, indent=2))
        return 0
    print(
        f"kills survived: {s['kills']} (recoveries checked at start-up: {s['recoveries_checked']}) in {s['runs']} runs"
    )
    print(f"investigations completed: {s['investigations_completed']}, every one with the reference's verdicts")
    print(f"kill point per process: min {s['kill_point_min']}, max {s['kill_point_max']} "
          f"(the reference passes {s['reference_points']} points in {s['reference_seconds']} s)")  # fmt: skip
    print(f"kills by phase: {s['kills_by_phase']}")
    print(f"kills by samples committed (deciles of the reference's {s['reference_samples']}): "
          f"{s['samples_done_deciles']}; {s['distinct_point_names']} distinct points")  # fmt: skip
    print(f"killed with the config patched: {s['killed_with_config_patched']}, with a dangling journal row: "
          f"{s['killed_with_dangling_journal']}")  # fmt: skip
    print(f"experiments left 'running' by killed runs: {s['orphan_running_experiments']}; duplicated experiments: "
          f"{s['duplicated_experiments']} (mode: {s['mode']})")
    print(f"wall time: {s['wall_s']} s on {s['lanes']} lane(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
