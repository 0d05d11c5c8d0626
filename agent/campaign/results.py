"""What a campaign's steps produce, as typed models read from kinv.db: a confirmation workstream's result (its A/B
experiments and verdicts), never a workstream's message text.  A screened candidate is
agent.store.screened.Screened, one row of the screened table."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel

STUDY_DB = "optuna.db"
FINAL = "final"
BEATEN = ("void", "incorrect", "infeasible", "failed")  # A/B verdicts that say nothing about a level's change


CampaignEnd = Literal["done", "paused", "interrupted", "failed", "refused"]
"""How a campaign's pass ends: done; paused for a person's approval; interrupted by a signal (resumable); a
workstream or the adoption failed (a failed step) or refused its input (bad input).  The command line maps
each to its exit code."""


@dataclass(frozen=True)
class CampaignOutcome:
    """A campaign's pass: how it ended, the one line it ends with, and its summary (``kinv campaign --json``)."""

    end: CampaignEnd
    message: str
    summary: dict = field(default_factory=dict)


class LevelResult(BaseModel):
    """A level's measured time under the config a step chose there, and (when a variant won it) the change."""

    us: float
    by: str
    effect: float | None = None
    ci: list[float] | None = None
    conf: float | None = None
    verdict: str | None = None


class WorkstreamResult(BaseModel):
    """What a closed confirmation workstream decided: each variant's verdict, and at each level the winner the
    campaign adopts there (the final A/B: every level's change against the start)."""

    ws: str
    verdicts: dict[str, str]
    levels: dict[str, LevelResult]
    winners: dict[str, str]  # level -> the variant that improved most there (search steps only)

    def levels_json(self) -> dict:
        return {k: v.model_dump(exclude_none=True) for k, v in self.levels.items()}


def _change(v: dict) -> dict:
    return {"effect": math.expm1(v["effect"]), "ci": [math.expm1(v["ci_low"]), math.expm1(v["ci_high"])],
            "conf": v["conf"]}  # fmt: skip


def read_workstream(store, ws: str, final: bool) -> WorkstreamResult:
    """The result of workstream ``ws`` from its A/B experiments and per-level verdicts in kinv.db."""
    best: dict[str, float] = {}
    winners: dict[str, str] = {}
    levels: dict[str, LevelResult] = {}
    verdicts: dict[str, str] = {}
    for e in store.experiments(ws):
        if e["kind"] != "ab" or e["status"] != "done":
            continue
        verdicts[e["variant"]] = e["verdict"]
        if e["verdict"] in BEATEN:
            continue
        for v in store.verdicts(e["id"]):
            lv = v["level"]
            if final:  # the final config against the start: every level's change
                levels[lv] = LevelResult(us=v["variant_us"], by=e["variant"], verdict=v["verdict"], **_change(v))
                continue
            levels.setdefault(lv, LevelResult(us=v["base_us"], by="incumbent"))
            if v["verdict"] == "improved" and v["effect"] > best.get(lv, 0.0):
                best[lv] = v["effect"]
                winners[lv] = e["variant"]
                levels[lv] = LevelResult(us=v["variant_us"], by=e["variant"], **_change(v))
    return WorkstreamResult(ws=ws, verdicts=verdicts, levels=levels, winners=winners)


def best_accepted(store, ws: str) -> str | None:
    """The accepted variant of ``ws`` with the largest mean effect over its levels (per_level: false), if any."""
    best, best_eff = None, 0.0
    for e in store.experiments(ws):
        if e["kind"] == "ab" and e["verdict"] == "accept":
            vs = store.verdicts(e["id"])
            eff = sum(v["effect"] for v in vs) / max(1, len(vs))
            if eff > best_eff:
                best, best_eff = e["variant"], eff
    return best
