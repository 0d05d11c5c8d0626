"""Record paired A/B and A/A samples on a GPU for the replay backend.

    python benchmarks/record.py --plan plans/3a-attention-occupancy.yaml --plan plans/3b-tile-shape.yaml \
        --rounds 32 --aa-rounds 16 --out kernels/recordings/h200/mla_decode-v4flash.jsonl.gz

The recording follows the protocol of a live investigation (agent/tools/measure/protocol.py), so a replayed
investigation sees the same statistics as a live one:

* every sample re-sets its arm (fresh inputs, outputs and scratch at a new placement, the graph
  captured again; agent/tools/worker/bench_worker.py), so rounds are independent replicates;
* each variant is paired with a baseline worker of its own ("independent baseline rounds per
  variant"): round r of pair V holds the baseline and V timed back to back, in ABBA order;
* the A/A has ``--aa-arms`` baseline workers, all timed in every round;
* nothing wraps around: the replay backend refuses a round the recording does not have.

Rounds run on the protocol's round loop (agent.tools.protocol.RoundLoop): at each level of round r, every pair
(ABBA within it) in a rotated order and then the A/A's arms, rotated, so slow drifts spread over all of them.

``--sweep PLAN`` records a campaign's whole space instead (plans/7-decode-ceiling.yaml): every config of
``campaign.space`` that the resource model passes, as ``--replicas`` independent workers each, all timed in
every round at every level (round r draws seed round_seed(r) for every arm, the order rotated per round).  Any two
configs' workers then form a paired A/B (round r against round r), replica j of one config is arm j of its
A/A, and the means over all rounds are the exhaustive sweep a campaign is judged against
(benchmarks/campaign_truth.py).  Slots are ``("sw", <config hash>, "R<j>")``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kinv.agent.tools.backends.base import round_seed  # noqa: E402
from kinv.agent.tools.measure import protocol  # noqa: E402
from kinv.agent.tools.worker.client import WorkerProcess  # noqa: E402
from kinv.kernels.launch_config import config_hash, describe  # noqa: E402


def from_plans(paths: list[str]):
    """(kernel ref, adapter, baseline, {variant title: config}, levels, env) from one or more plans of one
    kernel and baseline (every config-only variant; source patches are measured live, never replayed)."""
    from kinv.agent.plan_file import load_plan

    plans = [load_plan(p)[0] for p in paths]
    first = plans[0]
    adapter = first.adapter
    base = {**first.baseline, "kernel": adapter.name}
    variants: dict[str, dict] = {}
    for plan in plans:
        if plan.adapter.name != adapter.name or {**plan.baseline, "kernel": adapter.name} != base:
            raise SystemExit(f"{plan.ws}: every plan recorded together needs the kernel and baseline of {first.ws}")
        for v in plan.variants:
            if v.source_patch:
                continue
            cfg = plan.variant_config(v)
            if config_hash(cfg) != config_hash(base) and cfg not in variants.values():
                variants[f"{plan.ws} {v.id} {v.title}"] = cfg
    return first.kernel, adapter, base, variants, first.levels(), dict(first.environment)


class Worker:
    """One recorded arm: a benchmark worker and its setups at each level, sampled as the round loop asks
    (agent.tools.protocol.RoundLoop: round r draws seed protocol.round_seed(r) for every arm)."""

    def __init__(self, name: str, w: WorkerProcess, hello: dict, sets: dict[str, dict]) -> None:
        self.name, self.w, self.hello, self.sets = name, w, hello, sets

    def sample(self, level, round_index: int) -> dict:
        t_req = time.perf_counter()
        smp = self.w.request("sample", key=self.sets[level.key]["key"], seed=round_seed(round_index))
        return {**smp, "request_wall_s": time.perf_counter() - t_req}

    def line(self, kind: str, pair: str, role: str, chash: str, level: str, r: int, smp: dict) -> dict:
        """The recording's line of one sample."""
        s = self.sets[level]
        return {
            "type": "sample", "kind": kind, "pair": pair, "role": role, "arm": self.name, "round": r,
            "config_hash": chash, "level": s["level"], "us": smp["us"], "us_min": smp["us_min"],
            "us_max": smp["us_max"], "replays": smp["replays"], "gpu_s": smp["gpu_s"], "reset_s": smp["reset_s"],
            "request_wall_s": smp["request_wall_s"], "t": smp["t"], "env": self.hello["env"],
            "derived_env": s["derived_env"], "launches": s["launches_per_replay"], "pid": self.hello["pid"],
        }  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=32, help="A/B rounds per variant")
    ap.add_argument("--aa-rounds", type=int, default=16)
    ap.add_argument("--aa-arms", type=int, default=4)
    ap.add_argument("--plan", action="append", default=[],
                    help="plan whose baseline, config variants, levels and environment to record (repeatable)")
    ap.add_argument("--sweep", help="campaign plan whose whole space to record (every feasible config)")
    ap.add_argument("--configs", nargs="+", metavar="CONFIG",
                    help="with one --plan: record these config files (or inline JSON), level-conditional ones "
                         "resolved per level, as a sweep at the plan's levels and environment, so that the replay "
                         "backend serves them (kernels/configs/<kernel>.json: the shipped file)")
    ap.add_argument("--variant", action="append", default=[], metavar="KEY=VALUE[,KEY=VALUE]",
                    help="with --configs: also record the first config with these tunable changes (repeatable; "
                         "what `kinv bench --variant` times against it)")
    ap.add_argument("--replicas", type=int, default=2, help="--sweep, --configs: workers per config")
    ap.add_argument("--space", metavar="CAMPAIGN_PLAN",
                    help="with --configs: also record every feasible config of this campaign plan's space in the "
                         "same session, so that any config a campaign picks pairs with the given files on replay")
    ap.add_argument("--space-replicas", type=int, default=2, help="--space: workers per config of the space")
    ap.add_argument("--jobs", type=int, default=8, help="--sweep: workers set up (compiled) at once")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.sweep:
        return record_sweep(args)
    if args.configs:
        return record_configs(args)
    if not args.plan:
        ap.error("give --plan (paired A/B recordings) or --sweep (a campaign's space)")

    kernel, adapter, base, var, level_objs, env = from_plans(args.plan)
    # arm name -> (kind, pair, role, config)
    arms: dict[str, tuple[str, str, str, dict]] = {}
    for name, cfg in var.items():
        arms[f"{name}: baseline"] = ("ab", config_hash(cfg), "base", base)
        arms[f"{name}: variant"] = ("ab", config_hash(cfg), "variant", cfg)
    for j in range(args.aa_arms):
        arms[f"A/A arm {j}"] = ("aa", "aa", f"A{j}", base)
    levels = [lv.to_dict() for lv in level_objs]

    t0 = time.time()
    workers, setups, header = {}, {}, None
    for name, (_kind, _pair, _role, cfg) in arms.items():
        w = WorkerProcess(env=env, label=name)
        hello = w.request("hello", env_keys=sorted(env))
        if header is None:
            header = {"type": "header", "version": 2, "kernel": adapter.name, "fingerprint": hello["fingerprint"],
                      "harness_hash": hello["harness_hash"], "env": hello["env"], "rounds": args.rounds,
                      "aa_rounds": args.aa_rounds, "aa_arms": args.aa_arms, "levels": levels,
                      "protocol": "every sample re-sets its arm; one baseline worker per variant; ABBA",
                      "configs": {"baseline": base, **var}, "created": time.time()}  # fmt: skip
            header["copy_gbps"] = w.request("copy_bandwidth", mib=2048)["gbps"]
        workers[name] = (w, hello)
        for lv in levels:
            s = w.request("setup", kernel=kernel, config=cfg, level=lv, seed=zlib.crc32(name.encode()) % 100000)
            if not s["correct"]:
                raise SystemExit(f"{name} incorrect at {lv}: rel err {s['rel_err']}")
            setups[(name, s["level"])] = s
            header.setdefault("kernel_hash", s["kernel_hash"])
            header.setdefault("reference_hash", s["reference_hash"])
        print(f"# set up {name} ({describe(cfg)}) pid {hello['pid']} at {time.time() - t0:.0f}s", flush=True)
    header["setup_s"] = time.time() - t0

    lines = [header]
    every = [Worker(name, w, hello, {k: s for (n, k), s in setups.items() if n == name})
             for name, (w, hello) in workers.items()]  # fmt: skip
    at = {wk.name: j for j, wk in enumerate(every)}
    names = list(var)

    def order(r: int) -> list[int]:
        """Round r: every pair (ABBA within it) in a rotated order, then the A/A's arms rotated."""
        out = []
        if r < args.rounds:
            for name in protocol.rotated(names, r):
                ab = [f"{name}: baseline", f"{name}: variant"]
                out += [at[ab[j]] for j in protocol.round_order(2, r, abba=True)]
        if r < args.aa_rounds and args.aa_arms:
            out += protocol.rotated([at[f"A/A arm {j}"] for j in range(args.aa_arms)], r)
        return out

    def stored(rnd: protocol.Round) -> None:
        for lv in lvs:
            for j, smp in rnd.kept(lv.key).items():
                kind, pair, role, cfg = arms[every[j].name]
                lines.append(every[j].line(kind, pair, role, config_hash(cfg), lv.key, rnd.index, smp))
        print(f"# round {rnd.index + 1} at {time.time() - t0:.0f}s", flush=True)

    lvs = [adapter.level(lv) for lv in levels]
    protocol.RoundLoop(every, lvs, whole=False, order=order).run(range(max(args.rounds, args.aa_rounds)), stored)
    resources = [{"arm": n, "level": lv, "resources": s["resources"], "compile_s": s["compile_s"],
                  "rel_err": s["rel_err"], "l2": s.get("l2")} for (n, lv), s in setups.items()]  # fmt: skip
    for w, _ in workers.values():
        w.close()
    return write(args.out, lines, resources, t0)


def write(out: str, lines: list[dict], resources: list[dict], t0: float) -> int:
    """The recording file: header, samples, then the resources line."""
    lines.append({"type": "resources", "items": resources, "wall_s": time.time() - t0})
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(out, "wt") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
    print(f"# wrote {len(lines) - 2} samples to {out} in {time.time() - t0:.0f}s")
    return 0


def record_sweep(args) -> int:

    from kinv.agent.plan_file import load_plan
    from kinv.agent.tools.runners.space import feasibility, space_configs

    plan = load_plan(args.sweep)[0]
    if plan.campaign is None:
        raise SystemExit(f"{args.sweep} has no campaign: section (its space is what --sweep records)")
    configs, pruned = [], []
    for cfg in space_configs(plan):
        ok, why = feasibility(plan, cfg)
        (configs if ok else pruned).append(cfg if ok else {"config": cfg, "reason": why})
    return _sweep(args, plan, configs, pruned, args.sweep)


def record_configs(args) -> int:
    """A sweep of the uniform configs that the given config files run at each level of one plan.

    A level-conditional config (one with ``overrides``) is served by the replay backend level by level from
    the sweep's worker of the config that runs there (agent/tools/runners/bench.py), so recording the per-level
    configs of the shipped file, and of the variants timed against it, makes ``kinv bench``, ``kinv noise``
    and ``kinv bench --variant`` replayable.  Every config is timed at every level, as in ``--sweep``, so
    any two of them form a pair of one recording session.
    """
    from kinv.agent.plan_file import load_plan
    from kinv.kernels.launch_config import config_hash as chash
    from kinv.kernels.launch_config import effective

    if len(args.plan) != 1:
        raise SystemExit("--configs takes exactly one --plan (its levels and environment)")
    plan = load_plan(args.plan[0])[0]
    adapter = plan.adapter
    given = []
    for item in args.configs:
        text = Path(item).read_text() if Path(item).is_file() else item
        given.append(adapter.validate_config({**json.loads(text), "kernel": adapter.name}))
    for spec in args.variant:
        change = {}
        for kv in spec.split(","):
            k, _, v = kv.partition("=")
            change[k.strip()] = int(v)
        given.append(adapter.validate_config({**given[0], **change}))
    configs: dict[str, dict] = {}
    for cfg in given:
        for lv in plan.levels():
            eff = effective(adapter, cfg, lv)
            configs.setdefault(chash(eff), eff)
    replicas = dict.fromkeys(configs, args.replicas)
    pruned = []
    if args.space:
        from kinv.agent.tools.runners.space import feasibility, space_configs

        space_plan = load_plan(args.space)[0]
        for cfg in space_configs(space_plan):
            ok, why = feasibility(space_plan, cfg)
            if not ok:
                pruned.append({"config": cfg, "reason": why})
            elif chash(cfg) not in configs:
                configs[chash(cfg)] = cfg
                replicas[chash(cfg)] = args.space_replicas
    return _sweep(args, plan, list(configs.values()), pruned, args.plan[0], replicas)


def _sweep(args, plan, configs: list[dict], pruned: list[dict], plan_name: str,
           replicas: dict[str, int] | None = None) -> int:
    """Every config x its workers (``replicas[hash]``, else ``--replicas``) timed in every round at every level."""
    from concurrent.futures import ThreadPoolExecutor

    adapter, env = plan.adapter, dict(plan.environment)
    levels = [lv.to_dict() for lv in plan.levels()]
    n_of = {config_hash(c): (replicas or {}).get(config_hash(c), args.replicas) for c in configs}
    arms = {f"{describe(c)} R{j}": (config_hash(c), f"R{j}", c) for c in configs for j in range(n_of[config_hash(c)])}
    t0 = time.time()
    print(f"# sweep of {len(configs)} configs, {len(arms)} workers ({len(pruned)} pruned by the resource "
          f"model), {len(levels)} levels, {args.rounds} rounds", flush=True)

    def start(item):
        name, (_h, _role, cfg) = item
        w = WorkerProcess(env=env, label=name)
        try:
            hello = w.request("hello", env_keys=sorted(env))
            sets = {}
            for lv in levels:
                s = w.request("setup", kernel=adapter.name, config=cfg, level=lv,
                              seed=zlib.crc32(name.encode()) % 100000)
                if not s["correct"]:
                    raise RuntimeError(f"incorrect at {s['level']}: rel err {s['rel_err']}")
                sets[s["level"]] = s
            return name, w, hello, sets, None
        except Exception as exc:  # noqa: BLE001 - a config that fails on the GPU is recorded as failed
            w.close()
            return name, None, None, None, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"

    workers, failed = {}, {}
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        for name, w, hello, sets, err in pool.map(start, arms.items()):
            if err:
                failed[arms[name][0]] = err
                print(f"# {name} failed: {err}", flush=True)
            else:
                workers[name] = (w, hello, sets)
    arms = {n: a for n, a in arms.items() if n in workers and a[0] not in failed}
    for n in [n for n in workers if n not in arms]:
        workers.pop(n)[0].close()
    if not workers:
        raise SystemExit(f"every config failed to set up; the first: {next(iter(failed.values()), '?')}")
    w0, hello0, sets0 = next(iter(workers.values()))
    header = {"type": "header", "version": 2, "kernel": adapter.name, "fingerprint": hello0["fingerprint"],
              "harness_hash": hello0["harness_hash"], "env": hello0["env"], "rounds": args.rounds, "aa_rounds": 0,
              "aa_arms": 0, "replicas": args.replicas, "levels": levels, "sweep": True, "plan": plan_name,
              "protocol": "every sample re-sets its arm; every config x replica timed in every round (sweep)",
              "configs": {describe(c): c for c in configs if config_hash(c) not in failed},
              "pruned": [{"config": describe(p["config"]), "reason": p["reason"]} for p in pruned],
              "failed": {describe(c): failed[config_hash(c)] for c in configs if config_hash(c) in failed},
              "kernel_hash": next(iter(sets0.values()))["kernel_hash"],
              "reference_hash": next(iter(sets0.values()))["reference_hash"],
              "created": time.time(), "setup_s": time.time() - t0}  # fmt: skip
    header["copy_gbps"] = w0.request("copy_bandwidth", mib=2048)["gbps"]
    print(f"# {len(workers)} workers set up in {header['setup_s']:.0f}s", flush=True)
    lines = [header]
    every = [Worker(name, *workers[name]) for name in arms]

    def stored(rnd: protocol.Round) -> None:
        for lv in lvs:
            for j, smp in rnd.kept(lv.key).items():
                chash, role, _cfg = arms[every[j].name]
                lines.append(every[j].line("sw", chash, role, chash, lv.key, rnd.index, smp))
        print(f"# round {rnd.index + 1} at {time.time() - t0:.0f}s", flush=True)

    lvs = [adapter.level(lv) for lv in levels]
    protocol.RoundLoop(every, lvs, whole=False).run(range(args.rounds), stored)  # every worker, rotated per round
    resources = [{"arm": n, "level": lv, "resources": s["resources"], "compile_s": s["compile_s"],
                  "rel_err": s["rel_err"]} for n, (_w, _h, sets) in workers.items() for lv, s in sets.items()]  # fmt: skip
    for w, _h, _s in workers.values():
        w.close()
    return write(args.out, lines, resources, t0)


if __name__ == "__main__":
    sys.exit(main())
