"""A workstream's store as a finished run leaves it, built directly (no GPU, no replay, no graph): the verdicts,
todos and noise a close-out reads, so a test renders a close-out in well under a second."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

from kinv.agent.plan_file import load_plan
from kinv.agent.store.db import Store
from kinv.agent.tools.backends.base import Backend

ROOT = Path(__file__).resolve().parents[1]


class FakeReplay:
    """The parts of the replay backend a close-out reads, with recordings' headers as given."""

    name = "replay"
    time_word = Backend.time_word
    each_sample = Backend.each_sample

    def __init__(self, headers: list[dict] | None = None, copy_gbps: float = 4100.0):
        self.headers = headers or [{"fingerprint": {"gpu": "NVIDIA H200", "sms": 132, "l2_bytes": 62914560}}]
        self.recording = SimpleNamespace(headers=self.headers, fingerprint=self.headers[0]["fingerprint"])
        fp = self.headers[0]["fingerprint"]
        self.loud = f"REPLAY backend: no GPU is measured; serving samples recorded on {fp.get('gpu')}"
        self._copy = copy_gbps

    def ceilings(self):
        return {"copy_gbps": self._copy, "yard_gbps": None, "matrix_tflops": {}, "measured": False,
                "source": "replayed: recorded on the headers' GPU, not measured here"}  # fmt: skip

    def for_kernel(self, kernel):
        return self.recording

    def copy_bandwidth(self):
        return self._copy


def level_row(key: str, verdict: str, change: float, lo: float, hi: float, threshold: float = 0.01,
              base_us: float = 100.0) -> dict:
    """A verdicts-table row: ``change``, ``lo``, ``hi`` as throughput changes (0.01 = +1%)."""
    e = math.log1p(change)
    return {"level": key, "n": 16, "base_us": base_us, "variant_us": base_us / (1 + change), "effect": e,
            "ci_low": math.log1p(lo), "ci_high": math.log1p(hi), "ratio": 1 + change, "threshold": threshold,
            "verdict": verdict, "conf": 0.9995}  # fmt: skip


def build(tmp_path, plan_file: str = "3a-attention-occupancy.yaml", measured: dict | None = None,
          cancelled: dict | None = None, failed: dict | None = None, live: str | None = None, version: int = 1,
          backend=None, plan_edit=None, gpu_s: float = 1.0):
    """(store, plan, state, ctx) for a close-out of ``plan_file``.

    ``measured``: variant id -> (verdict word, {level label: (level verdict, change, ci low, ci high)});
    ``cancelled``: variant id -> the todo's reason ("moot: ...", "rejected by a person: ...");
    ``failed``: variant id -> (verdict word, reason) for one never timed (incorrect, infeasible, void).
    """
    import yaml

    src = yaml.safe_load((ROOT / "plans" / plan_file).read_text())
    if plan_edit:
        plan_edit(src)
    path = tmp_path / plan_file
    path.write_text(yaml.safe_dump(src))
    plan, plan_hash = load_plan(path)
    store = Store(tmp_path / "state")
    ws = plan.ws
    store.upsert_workstream({"id": ws, "title": plan.workstream.title, "kernel": plan.kernel, "status": "running",
                             "plan_path": str(path), "plan_hash": plan_hash, "version": version})  # fmt: skip
    from kinv.agent.workstream import planner

    planner.init_todos(store, plan)
    by_label = {lv.label: lv.key for lv in plan.levels()}
    noise = store.new_experiment(workstream=ws, todo=f"{ws}.noise", variant="baseline", kind="noise",
                                 status="done", version=version, gpu_s=gpu_s, rounds=4)  # fmt: skip
    store.add_noise(noise, ws, [{"level": k, "band": 0.005, "cv": 0.002, "n_pairs": 6, "equivalent": 1,
                                 "effect": 0.0, "ci_low": -0.001, "ci_high": 0.001} for k in by_label.values()])
    store.new_experiment(workstream=ws, todo=f"{ws}.baseline", variant="baseline", kind="baseline", status="done",
                         version=version, gpu_s=0.0)  # fmt: skip
    results = {}
    for vid, (word, levels) in (measured or {}).items():
        exp = store.new_experiment(workstream=ws, todo=f"{ws}.{vid}", variant=vid, kind="ab", status="done",
                                   verdict=word, reason=f"{word}: (stats reason)", rounds=16, gpu_s=gpu_s,
                                   version=version)  # fmt: skip
        store.add_verdicts(exp, [level_row(by_label[lab], *row) for lab, row in levels.items()])
        results[vid] = {"verdict": word, "reason": "(stats reason)", "exp_id": exp,
                        "levels": {by_label[lab]: row[0] for lab, row in levels.items()}}  # fmt: skip
        planner.finish(store, ws, vid, "completed", f"{word}: (stats reason)")
    for vid, (word, reason) in (failed or {}).items():
        exp = store.new_experiment(workstream=ws, todo=f"{ws}.{vid}", variant=vid, kind="ab", status="rejected",
                                   verdict=word, reason=reason, version=version)  # fmt: skip
        results[vid] = {"verdict": word, "reason": reason, "levels": {}, "exp_id": exp}
        planner.finish(store, ws, vid, "completed", f"{word}: {reason}")
    for vid, reason in (cancelled or {}).items():
        if reason.startswith("rejected by a person"):
            store.new_experiment(workstream=ws, todo=f"{ws}.{vid}", variant=vid, kind="ab", status="cancelled",
                                 reason=reason, version=version)  # fmt: skip
        planner.finish(store, ws, vid, "cancelled", reason)
    cfg_dir = tmp_path / "configs"
    cfg_dir.mkdir(exist_ok=True)
    cfg_path = cfg_dir / f"{plan.adapter.name}.json"
    if live is None:
        live_cfg = {"kernel": plan.adapter.name, **{k: v for k, v in plan.baseline.items() if k != "kernel"}}
        cfg_path.write_text(json.dumps(live_cfg, indent=2) + "\n")
    else:
        cfg_path.write_text(live)
    from kinv.agent.tools.files import configs

    store.update_workstream(ws, baseline_hash=configs.sha(cfg_path))
    levels = plan.levels()
    ctx = SimpleNamespace(store=store, plan=plan, plan_path=str(path), plan_hash=plan_hash, version=version,
                          backend=backend or FakeReplay(), adapter=plan.adapter, config_path=cfg_path,
                          levels=lambda: levels)  # fmt: skip
    state = {"results": results, "cancelled": list(cancelled or {})}
    return store, plan, state, ctx


def outcome(text: str) -> str:
    """The close-out's Outcome section."""
    return text.split("## Outcome", 1)[1].split("\n## ", 1)[0]
