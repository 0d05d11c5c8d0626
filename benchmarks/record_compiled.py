"""Record, on a GPU, what the replay backend serves beside the samples: the compiler's resources of every
recorded config at every recorded level, and Nsight Compute profiles of a plan's baseline and config variants.

    python benchmarks/record_compiled.py --out kernels/recordings/h200 \
        --profile plans/3a-attention-occupancy.yaml@b64

``compiled.json`` is ``{kernel: {config hash: {level key: figures}}}`` (agent/tools/backends/compiled.py's compiled_figures):
each config is compiled and launched once per level in a worker that sees its recording's environment (no
timing).  ``profiles.json`` has the same layout and holds :func:`kinv.agent.tools.backends.profile.summarize` of ncu's
raw page.  ``--profile PLAN@LABEL[,LABEL]`` profiles the plan's baseline and every config variant at the levels
with those labels (the levels of the largest effects: a replayed profile step looks up exactly those).  Existing
files are merged into, so one kernel or one plan can be re-recorded alone.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kinv.agent.tools.backends.compiled import compiled_figures  # noqa: E402
from kinv.agent.tools.worker.client import WorkerProcess  # noqa: E402
from kinv.kernels.launch_config import config_hash, describe  # noqa: E402

RECORDINGS = Path(__file__).resolve().parents[1] / "kernels" / "recordings" / "h200"


def headers(directory: Path) -> list[dict]:
    """The header of every recording in ``directory`` (kernel, configs, levels, environment)."""
    out = []
    for f in sorted(directory.glob("*.jsonl.gz")):
        with gzip.open(f, "rt") as fh:
            out.append(json.loads(fh.readline()))
    return out


def record_compiled(directory: Path) -> dict:
    got: dict = {}
    for h in headers(directory):
        kernel, env = h["kernel"], {k: str(v) for k, v in (h.get("env") or {}).items()}
        configs = {config_hash(c): c for c in h.get("configs", {}).values()}
        todo = [(ch, c) for ch, c in configs.items() if any(lv_key(kernel, lv) not in got.get(kernel, {}).get(ch, {})
                                                         for lv in h["levels"])]  # fmt: skip
        if not todo:
            continue
        t0 = time.perf_counter()
        with WorkerProcess(env=env, label="compile") as w:
            for ch, cfg in todo:
                for lv in h["levels"]:
                    try:
                        r = w.request("compile", kernel=kernel, config=cfg, level=lv)
                    except Exception as exc:  # an infeasible config is recorded as such, not as figures
                        print(f"# {kernel} {describe(cfg)} at {lv}: {exc}", file=sys.stderr)
                        continue
                    figs = compiled_figures(r["resources"])
                    if figs:
                        got.setdefault(kernel, {}).setdefault(ch, {})[r["level"]] = figs
        print(f"# compiled {len(todo)} {kernel} configs x {len(h['levels'])} levels in {time.perf_counter() - t0:.1f} s")
    return got


def lv_key(kernel: str, dims: dict) -> str:
    from kinv.kernels.adapter import get_adapter

    return get_adapter(kernel).level_key(dims)


def record_profiles(spec: str) -> dict:
    from kinv.agent.plan_file import load_plan
    from kinv.agent.tools.backends import profile

    path, _, labels = spec.partition("@")
    plan, _ = load_plan(path)
    adapter = plan.adapter
    want = set(labels.split(",")) if labels else None
    levels = [lv for lv in plan.levels() if want is None or lv.label in want]
    arms = [("baseline", {**plan.baseline, "kernel": adapter.name})]
    arms += [(v.id, plan.variant_config(v)) for v in plan.variants if not v.source_patch]
    got: dict = {}
    for lv in levels:
        for arm, cfg in arms:
            figs, why, secs = profile.run(adapter, cfg, lv, plan.environment)
            print(f"# profile {arm} ({describe(cfg)}) at {lv.label}: "
                  f"{f'{secs:.1f} s' if figs else why}")  # fmt: skip
            if figs:
                got.setdefault(adapter.name, {}).setdefault(config_hash(cfg), {})[lv.key] = {**figs, "seconds": round(secs, 1)}
    return got


def merge(path: Path, new: dict) -> None:
    old = json.loads(path.read_text()) if path.is_file() else {}
    for kernel, by_cfg in new.items():
        for ch, by_lv in by_cfg.items():
            old.setdefault(kernel, {}).setdefault(ch, {}).update(by_lv)
    path.write_text(json.dumps(old, indent=1, sort_keys=True) + "\n")
    print(f"# wrote {path}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recordings", type=Path, default=RECORDINGS, help="the recordings whose configs to compile")
    ap.add_argument("--out", type=Path, default=RECORDINGS, help="where compiled.json and profiles.json go")
    ap.add_argument("--no-compiled", action="store_true", help="profiles only")
    ap.add_argument("--profile", action="append", default=[], metavar="PLAN@LABELS")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    if not a.no_compiled:
        merge(a.out / "compiled.json", record_compiled(a.recordings))
    for spec in a.profile:
        merge(a.out / "profiles.json", record_profiles(spec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
