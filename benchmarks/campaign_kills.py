"""Kill harness of a campaign: SIGKILL `kinv campaign` at random points of its search, its screening, its
confirmation workstream and its final A/B, again and again, and check that every next start continues it.

What it checks: after every kill the next `kinv campaign` (the same command) either finishes or is killed again,
never refuses to go on; the campaign that finishes has screened every point of its grid once (none lost, none
timed twice), left no trial of its search study asked and never told, chose the same environment as an
uninterrupted run, and `kinv doctor` finds nothing bad in its state dir.

The campaign (built here from plans/cpu-matmul-threads.yaml) screens two environment variables of a command that
ends within milliseconds (its rate: the threads it is given, times 1.2 when BOOST=1): a grid of 6 points, every
one screened, then a confirmation workstream and the campaign's final A/B.  Its best point is
OMP_NUM_THREADS=4, BOOST=1, by far more than its noise.

Where it kills (the fault points of agent/faults.py, ``KINV_CRASH_AT=k``): the first start of each fresh campaign
dies at a point of one phase, in turn: where the search has just created a trial and set none of its parameters
(``search.trial-created``), inside the final A/B, the screening, the confirmation workstream (the phase of each
point is read from kinv.db while the uninterrupted run passes it; a first start passes the same points).  Each
later start dies at a point k uniform over the first quarter of the uninterrupted run's points, so the chain of
kills walks through the rest of the campaign; after 4 kills a campaign runs to its end.  The phase of every kill
is read from kinv.db after it.

Example:
    python benchmarks/campaign_kills.py --kills 24 --seed 1 --kind env      (a command's environment, seconds)
    python benchmarks/campaign_kills.py --kills 8 --kind config              (campaign #7 cut small, replay)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from crash_harness import CrashInvariantError, last_point, snapshot  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BASE_PLAN = ROOT / "plans" / "cpu-matmul-threads.yaml"
CAMPAIGN_7 = ROOT / "plans" / "7-decode-ceiling.yaml"
SEED_CONFIG = {"kernel": "mla_decode", "description": "Baseline of workstream #3a (the seed's BT16/w4/s2).",
               "BLOCK_T": 16, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2}  # the live file a campaign starts from
RUN_TIMEOUT_S = 600
WINDOW = 0.25
TRIAL_POINT = "search.trial-created"
AIMS = ["trial creation", "final A/B", "screening", "confirmation"]  # where each fresh campaign's first kill aims
MAX_KILLS_PER_CAMPAIGN = 4
QUICK = ("import os, json, random; n = int(os.environ['OMP_NUM_THREADS']); b = 1.2 if os.environ['BOOST'] == '1' "
         "else 1.0; print(json.dumps({{'rate': 100.0 * n * b * (1 + random.gauss(0, 0.002))}}))  # {n}")


def env_plan(dst: Path) -> Path:
    """A campaign over two environment variables of a command: a grid of 6 points, a confirmation workstream."""
    data = yaml.safe_load(BASE_PLAN.read_text())
    data["workstream"].update(id="#13a", parent="#13", parent_title="Threads and a boost, searched")
    data["workload"] = {"command": ["{python}", "-I", "-S", "-c", QUICK], "levels": [{"n": 1}], "timeout_s": 30,
                        "metric": {"json_key": "rate", "unit": "runs/s"}, "warmup": 0}  # fmt: skip
    data["environment"] = {"OMP_NUM_THREADS": "2", "BOOST": "0"}
    data["variants"] = []
    data["stats"].update(aa_rounds=8, aa_arms=2, quick_rounds=2, step_rounds=2, max_rounds=4, threshold=0.05)
    data["campaign"] = {"budget": {"gpu_seconds": 300, "wall_seconds": 1800}, "per_level": True, "seed": 1,
                        "screen": {"trials": 8, "rounds": 2, "finalists": 2, "min_gain": 0.05},
                        "max_workstreams": 1}  # fmt: skip
    data["backlog"] = [{"id": "THREADS", "title": "Threads and boost", "targets": "elsewhere",
                        "rationale": "more threads, and the boost", "env": {"OMP_NUM_THREADS": ["1", "2", "4"],
                                                                            "BOOST": ["0", "1"]}}]  # fmt: skip
    dst.write_text(yaml.safe_dump(data, sort_keys=False))
    return dst


def config_plan(dst: Path) -> Path:
    """Campaign #7 cut to its token-tile sweep at b1 and b96 on replay: a grid screening, a confirmation
    workstream, the final A/B of the campaign's config against the start, and its adoption."""
    data = yaml.safe_load(CAMPAIGN_7.read_text())
    data["backlog"] = [b for b in data["backlog"] if b["id"] == "BTSWEEP"]
    data["workload"]["levels"] = [1, 96]
    data["campaign"]["goal"]["levels"] = ["b96"]
    data["campaign"]["screen"]["trials"] = 4
    # a killed experiment's samples stay charged, and the next start measures it again: room for four re-runs, so
    # a chain of kills is compared with the uninterrupted run on its choice, not on a budget the kills spent
    data["campaign"]["budget"]["gpu_seconds"] = 4 * data["campaign"]["budget"]["gpu_seconds"]
    dst.write_text(yaml.safe_dump(data, sort_keys=False))
    return dst


KINDS = {"env": (env_plan, "command"), "config": (config_plan, "replay")}


class Chain:
    """One campaign's fresh state dir, started again after every kill until it finishes."""

    def __init__(self, root: Path, plan: Path, code: Path, backend: str):
        root.mkdir(parents=True)
        self.root, self.plan, self.code, self.state, self.backend = root, plan, code, root / "state", backend
        (root / "configs").mkdir()
        (root / "configs" / "mla_decode.json").write_text(json.dumps(SEED_CONFIG, indent=2) + "\n")
        self.env = dict(os.environ, KINV_STATE_DIR=str(self.state), KINV_CONFIG_DIR=str(root / "configs"),
                        TRITON_INTERPRET="1", KINV_FORCE_NO_GPU="1", PYTHONPATH=str(code),
                        XDG_STATE_HOME=str(root / "xdg"))  # fmt: skip
        for k in ("KINV_CRASH_AT", "KINV_COUNT_POINTS", "KINV_STOP_AT"):
            self.env.pop(k, None)
        self.runs = 0

    def kinv(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "kinv.agent.cli.app", *args], env=self.env, cwd=self.code,
                              capture_output=True, text=True, timeout=RUN_TIMEOUT_S)  # fmt: skip

    def start(self, crash_at: int | None, watch=None) -> tuple[int, Path, str]:
        """One `kinv campaign` (killed at its ``crash_at``-th fault point, if given); ``watch(points)`` is called
        every 20 ms while it runs."""
        self.runs += 1
        points, log = self.root / f"run{self.runs}.points", self.root / f"run{self.runs}.log"
        env = dict(self.env, KINV_COUNT_POINTS=str(points))
        if crash_at:
            env["KINV_CRASH_AT"] = str(crash_at)
        with open(log, "w") as out:
            proc = subprocess.Popen([sys.executable, "-m", "kinv.agent.cli.app", "campaign", str(self.plan),
                                     "--backend", self.backend, "--approval", "auto"], env=env, cwd=self.code,
                                    stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
            deadline = time.time() + RUN_TIMEOUT_S
            while proc.poll() is None:
                if watch is not None:
                    watch(points)
                if time.time() > deadline:
                    proc.kill()
                    proc.wait()
                    raise CrashInvariantError(f"{self.root}: run {self.runs} neither ended nor died in {RUN_TIMEOUT_S} s")
                time.sleep(0.02)
        return proc.returncode, points, log.read_text()[-3000:]

    def _query(self, db: str, sql: str) -> list[tuple]:
        path = self.state / db
        if not path.exists():
            return []
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
        try:
            return conn.execute(sql).fetchall()
        except sqlite3.OperationalError:  # killed before its schema was created
            return []
        finally:
            conn.close()

    def phase(self, point: str) -> str:
        """Where the kill fell: trial creation, the screening, the confirmation workstream, the final A/B, or
        the campaign's own steps (planning, adoption)."""
        if point == TRIAL_POINT:
            return "trial creation"
        rows = self._query("kinv.db", "select steps from campaigns")
        steps = json.loads(rows[0][0] or "[]") if rows else []
        last = steps[-1] if steps else {}
        if last.get("phase") == "screen":
            return "screening"
        if last.get("phase") == "confirm":
            return "final A/B" if last.get("item") == "final" else "confirmation"
        return "campaign steps"

    def outcome(self) -> dict:
        summary = self.kinv("campaign", str(self.plan), "--backend", self.backend, "--json")
        if summary.returncode:
            raise CrashInvariantError(f"{self.root}: the summary failed: {summary.stderr.strip()}")
        s = json.loads(summary.stdout)
        screened = self._query("kinv.db", "select config_hash, asked, status from screened")
        untold = self._query("optuna.db", "select count(*) from trials where state in ('RUNNING', 'WAITING')")
        doctor = json.loads(self.kinv("doctor", "--json").stdout)
        return {"levels": {k: v.get("config") for k, v in s["levels"].items()}, "adopted": bool(s.get("adopted")),
                "environment": json.dumps(s.get("environment_found"), sort_keys=True),
                "screened": len({h for h, _a, st in screened if st in ("measured", "incumbent")}),
                "untold_trials": untold[0][0] if untold else 0,
                "bad": [f"{f['check']}: {f['detail']}" for f in doctor if f["status"] == "bad"]}


@dataclass
class Totals:
    kills: list[tuple[int, str, str]] = field(default_factory=list)  # (point, its name, phase)
    campaigns: int = 0
    runs: int = 0


def reference(work: Path, plan: Path, code: Path, backend: str) -> dict:
    """The uninterrupted campaign: its outcome, its fault points, and which phase each point it was seen at fell
    in (kinv.db read every 20 ms while it runs): a fresh campaign's first start passes the same points, so a kill
    can be aimed at a phase."""
    ch = Chain(work / "reference", plan, code, backend)
    t0 = time.time()
    phase_at: dict[int, str] = {}

    def watch(points: Path) -> None:
        n = len(points.read_text().splitlines()) if points.exists() else 0
        if n:
            phase_at.setdefault(n, ch.phase(""))

    rc, points, out = ch.start(None, watch)
    if rc != 0:
        raise RuntimeError(f"the uninterrupted campaign failed (exit {rc}): {out}")
    names = points.read_text().splitlines()
    by_phase: dict[str, list[int]] = {}
    for n, phase in phase_at.items():
        by_phase.setdefault(phase, []).append(n)
    by_phase["trial creation"] = [int(n) for n, name in (ln.split(" ", 1) for ln in names) if name == TRIAL_POINT]
    return {**ch.outcome(), "points": len(names), "seconds": time.time() - t0, "backend": backend,
            "by_phase": {k: v for k, v in by_phase.items() if v}}


def run_chains(kills: int, seed: int, work: Path, plan: Path, code: Path, ref: dict, log=print,
               per_campaign: int = MAX_KILLS_PER_CAMPAIGN) -> Totals:  # fmt: skip
    """Fresh campaigns, each killed again and again until it finishes: its first start at a point of the next phase
    in turn (``AIMS``), the later ones at a point uniform over the first quarter of the reference's; after
    ``per_campaign`` kills it runs to its end."""
    rng, totals = random.Random(seed), Totals()
    aims = [a for a in AIMS if ref["by_phase"].get(a)]
    while len(totals.kills) < kills:
        totals.campaigns += 1
        ch = Chain(work / f"campaign{totals.campaigns}", plan, code, ref["backend"])
        aim = aims[(totals.campaigns - 1) % len(aims)]
        here = 0
        while True:
            crash_at = None
            if len(totals.kills) < kills and here < per_campaign:
                crash_at = (rng.choice(ref["by_phase"][aim]) if here == 0
                            else rng.randint(1, max(2, int(ref["points"] * WINDOW))))  # fmt: skip
                here += 1
            rc, points, out = ch.start(crash_at)
            totals.runs += 1
            where = f"campaign {totals.campaigns} run {ch.runs} (KINV_CRASH_AT={crash_at})"
            if rc == -9:
                k, name = last_point(points)
                if k != crash_at:
                    raise CrashInvariantError(f"{where}: killed at point {k}, expected {crash_at}")
                totals.kills.append((k, name, ch.phase(name)))
                continue
            if rc != 0:
                raise CrashInvariantError(f"{where}: the next start could not continue (exit {rc}): {out}")
            got = ch.outcome()
            for key in ("levels", "adopted", "environment", "screened"):
                if got[key] != ref[key]:
                    raise CrashInvariantError(f"{where}: {key} {got[key]} differ from the uninterrupted run's "
                                              f"{ref[key]} ({ch.root})")  # fmt: skip
            if got["untold_trials"] or got["bad"]:
                raise CrashInvariantError(f"{where}: finished with {got['untold_trials']} trial(s) never told, "
                                          f"doctor: {got['bad']}")  # fmt: skip
            log(f"campaign {totals.campaigns} finished after {ch.runs - 1} kill(s): same choice, "
                f"{got['screened']} points screened")  # fmt: skip
            break
    return totals


def run_harness(kills: int = 24, seed: int = 0, work: Path | None = None, log=print, kind: str = "env",
                per_campaign: int = MAX_KILLS_PER_CAMPAIGN) -> dict:  # fmt: skip
    t0, cpu0 = time.time(), resource.getrusage(resource.RUSAGE_CHILDREN)
    own = work is None
    work = Path(tempfile.mkdtemp(prefix="kinv-campaign-kills-")) if own else Path(work)
    work.mkdir(parents=True, exist_ok=True)
    try:
        make, backend = KINDS[kind]
        plan = make(work / f"campaign-{kind}.yaml")
        code = snapshot(work / "code")
        ref = reference(work, plan, code, backend)
        log(f"reference: {ref['points']} fault points in {ref['seconds']:.1f} s, {ref['screened']} points screened, "
            f"adopted {ref['adopted']}, choice {ref['levels']}")  # fmt: skip
        log(f"reference points by phase: { {k: len(v) for k, v in ref['by_phase'].items()} }")
        totals = run_chains(kills, seed, work, plan, code, ref, log, per_campaign)
        cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
        phases: dict[str, int] = {}
        for _k, _name, phase in totals.kills:
            phases[phase] = phases.get(phase, 0) + 1
        return {"kind": kind, "kills": len(totals.kills), "held": len(totals.kills), "campaigns_completed": totals.campaigns,
                "runs": totals.runs, "seed": seed, "reference_points": ref["points"],
                "reference_seconds": round(ref["seconds"], 1), "kills_by_phase": phases,
                "distinct_points": len({name for _k, name, _p in totals.kills}),
                "wall_s": round(time.time() - t0, 1),
                "cpu_s": round(cpu.ru_utime + cpu.ru_stime - cpu0.ru_utime - cpu0.ru_stime, 1)}  # fmt: skip
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=24, help="SIGKILLs to make in all (default 24)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kind", choices=sorted(KINDS), default="env", help="env: a command's environment searched "
                    "(seconds a campaign); config: campaign #7's token-tile sweep on replay, with its final A/B")
    ap.add_argument("--work", type=Path, default=None, help="keep the states here (default: a temp dir, removed)")
    args = ap.parse_args(argv)
    try:
        s = run_harness(args.kills, args.seed, args.work, kind=args.kind)
    except CrashInvariantError as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(s, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
