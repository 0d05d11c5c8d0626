"""Read-side views of kinv's state: what ``kinv status``, ``todos``, ``experiments``, ``show``, ``pending``,
``history`` and ``backups`` print.

Every function takes a :class:`~agent.store.Store` and returns pydantic models, so the CLI stays thin: it
prints ``model.model_dump_json(indent=2)`` (or :func:`dump_json` for a list) under ``--json`` and renders the
same model with rich otherwise.  The models (:mod:`kinv.agent.report.view_models`) are the stable ``--json``
schema: they forbid unknown keys and every field says what it holds.

Reads of ``kinv.db`` go through the Store.  :func:`history` reads LangGraph's ``checkpoints.db`` directly,
read-only, with a small stdlib msgpack reader, because read commands must never import langgraph (nor torch
or triton).  Imports: standard library, pydantic, agent.store, agent.models.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from kinv.agent.errors import NotFound
from kinv.agent.ids import norm_ws, shown, stamp
from kinv.agent.report.view_models import (
    ApprovalView,
    BackupView,
    CampaignStep,
    CampaignView,
    CompareRow,
    EffectRow,
    ExperimentView,
    HistoryItem,
    Ledger,
    NoiseView,
    ReportView,
    SampleSummary,
    ShowView,
    StatusView,
    TodoView,
    VariantVerdict,
    VerdictView,
    WorkstreamView,
)
from kinv.agent.store.db import Store


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #
def _loads(text: Any) -> Any:
    """A JSON column: parsed, or the raw text when it is not JSON (never raises)."""
    if text is None or isinstance(text, dict | list):
        return text
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return {"unparsed": str(text)}


def _as_dict(text: Any) -> dict | None:
    v = _loads(text)
    if v is None:
        return None
    return v if isinstance(v, dict) else {"value": v}


def _pick(row: dict, model: type[BaseModel]) -> dict:
    return {k: row.get(k) for k in model.model_fields if k in row}


def _ranges(ids: Sequence[int]) -> str:
    """[1, 2, 3, 5, 8, 9] -> '1-3, 5, 8-9'."""
    out: list[str] = []
    ids = sorted(ids)
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ", ".join(out)


def dump_json(value: BaseModel | Iterable[BaseModel] | Any) -> str:
    """``--json`` output of a view or a list of views (or of plain JSON data, such as a todo export)."""
    if isinstance(value, BaseModel):
        return value.model_dump_json(indent=2)
    if isinstance(value, list | tuple):
        value = [v.model_dump(mode="json") if isinstance(v, BaseModel) else v for v in value]
    return json.dumps(value, indent=2)


# --------------------------------------------------------------------------- #
# id resolution
# --------------------------------------------------------------------------- #
def resolve_ws(store: Store, ws: str) -> str:
    """'3a' or '#3a' -> '#3a' if the store holds it; else NotFound naming the known ones."""
    ws_id = norm_ws(str(ws))
    if store.workstream(ws_id) is not None:
        return ws_id
    known = [w["id"] for w in store.workstreams()]
    if not known:
        raise NotFound(f"unknown workstream {shown(ws_id)}; no workstreams yet (start one with `kinv run plans/<ws>.yaml`)")
    raise NotFound(f"unknown workstream {shown(ws_id)}; known: {', '.join(known)}")


def resolve_experiment(store: Store, exp_id: int | str) -> dict:
    """The experiment row for an id such as 7 or '7'; else NotFound naming the ids that exist."""
    try:
        key = int(str(exp_id).strip().lstrip("#"))
    except ValueError:
        key = None
    row = store.experiment(key) if key is not None and 0 < key < 1 << 63 else None  # SQLite's integers
    if row is not None:
        return row
    ids = [e["id"] for e in store.experiments()]
    what = f"experiment {exp_id}" if key is not None else f"experiment id {shown(str(exp_id))} (give a number)"
    if not ids:
        raise NotFound(f"unknown {what}; no experiments yet")
    raise NotFound(f"unknown {what}; experiments: {_ranges(ids)}")


def resolve_approval(store: Store, approval_id: str) -> dict:
    """The approval row; else NotFound naming the pending ones (or all, if none is pending)."""
    row = store.approval(str(approval_id).strip())
    if row is not None:
        return row
    pending_ids = [a["id"] for a in store.approvals(status="pending")]
    if pending_ids:
        raise NotFound(f"unknown approval {shown(str(approval_id))}; pending: {', '.join(pending_ids)}")
    all_ids = [a["id"] for a in store.approvals()]
    if all_ids:
        raise NotFound(f"unknown approval {shown(str(approval_id))}; none is pending; known: {', '.join(all_ids)}")
    raise NotFound(f"unknown approval {shown(str(approval_id))}; there are no approvals")


# --------------------------------------------------------------------------- #
# row -> view
# --------------------------------------------------------------------------- #
def _todo_view(row: dict) -> TodoView:
    return TodoView(**{**_pick(row, TodoView), "content": row.get("content") or "",
                       "status": row.get("status") or "pending"})  # fmt: skip


def _approval_view(row: dict) -> ApprovalView:
    return ApprovalView(**{**_pick(row, ApprovalView), "status": row.get("status") or "pending",
                           "resources": _as_dict(row.get("resources")) or {}})  # fmt: skip


def _experiment_view(row: dict, samples: int) -> ExperimentView:
    return ExperimentView(**{**_pick(row, ExperimentView), "samples": samples})


def _latest_verdicts(exps: list[dict]) -> list[VariantVerdict]:
    latest: dict[str, dict] = {}
    for e in exps:  # ordered by id: later experiments win
        if e.get("verdict"):
            latest[e.get("variant") or e.get("kind") or f"experiment {e['id']}"] = e
    return [VariantVerdict(variant=k, verdict=e["verdict"], reason=e.get("reason"), experiment=e["id"])
            for k, e in latest.items()]  # fmt: skip


def approval(store: Store, approval_id: str) -> ApprovalView:
    """One approval, any status (`kinv approve` shows it before deciding)."""
    return _approval_view(resolve_approval(store, approval_id))


# --------------------------------------------------------------------------- #
# the read commands
# --------------------------------------------------------------------------- #
def workstream(store: Store, ws: str) -> WorkstreamView:
    """One workstream with its todos, pending approvals and latest verdicts (no samples are read)."""
    ws_id = resolve_ws(store, ws)
    return _workstream_view(store, store.workstream(ws_id))


def _workstream_view(store: Store, row: dict) -> WorkstreamView:
    ws_id = row["id"]
    pending = [_approval_view(a) for a in store.approvals(status="pending", ws_id=ws_id)]
    fields = _pick(row, WorkstreamView)
    alive = store.lock_holder(ws_id)
    live, way_back = [], None
    if alive is None:  # no run of it holds its lock: what it left on disk is the person's to restore
        exps = {e["id"]: e for e in store.experiments(ws_id)}
        live = [f"{Path(p['path']).name} holds {(exps.get(p['experiment']) or {}).get('variant') or 'a'} patch "
                f"(#{p['id']}, {p['state']})" for p in store.dangling_patches() if p["workstream"] == ws_id]  # fmt: skip
        if live:
            way_back = f"kinv resume {ws_id.lstrip('#')} (it reverts first) or kinv revert"
        if fields.get("status") == "running" and not pending:  # paused for a person is not killed
            fields["status"] = "not running: its process is gone (killed?)" + (
                f"; {live[0].split(' (#')[0]}'s patch is live on disk" if live else "")  # fmt: skip
    if pending and fields.get("status") in (None, "open", "running"):
        # the truth a person needs: nothing runs until someone decides
        fields["status"] = f"waiting for approval {pending[0].id}"
    return WorkstreamView(
        **fields,
        live_patches=live,
        way_back=way_back,
        todos=[_todo_view(t) for t in store.todos(ws_id)],
        pending_approvals=pending,
        latest_verdicts=_latest_verdicts(store.experiments(ws_id)),
    )


def status(store: Store) -> StatusView:
    """`kinv status`: every workstream, its todos, pending approvals and latest verdicts."""
    adhoc = [_experiment_view(e, store.sample_count(e["id"])) for e in store.experiments() if not e["workstream"]]
    return StatusView(state_dir=str(store.dir), workstreams=[_workstream_view(store, w) for w in store.workstreams()],
                      adhoc=adhoc, campaigns=campaigns(store))  # fmt: skip


def n_screened(step: dict) -> int:
    """How many candidates a step screened (a count; a state dir written before kept the list itself)."""
    v = step.get("screened")
    return v if isinstance(v, int) else len(v or [])


def campaigns(store: Store) -> list[CampaignView]:
    out = []
    for c in store.campaigns():
        from kinv.kernels.launch_config import describe  # only where a campaign has steps to describe

        steps = [CampaignStep(ws=s.get("ws"), item=s["item"], phase=s["phase"],
                              finalists=[describe(f) for f in s.get("finalists", [])],
                              screened=n_screened(s), pruned=s.get("pruned", 0),
                              verdicts=s.get("verdicts") or {}, note=s.get("note")) for s in c["steps"]]  # fmt: skip
        out.append(CampaignView(id=c["id"], status=c["status"], plan_path=c["plan_path"],
                                start_config=describe(c["start_config"]), incumbent=describe(c["incumbent"]),
                                stop_reason=c["stop_reason"] or None, steps=steps))  # fmt: skip
    return out


def todos(store: Store, ws: str) -> list[TodoView]:
    """`kinv todos WS`: the workstream's todo list in order."""
    return [_todo_view(t) for t in store.todos(resolve_ws(store, ws))]


def experiments(store: Store, ws: str | None = None) -> list[ExperimentView]:
    """`kinv experiments [WS]`: experiments with their sample counts (all workstreams when ws is None)."""
    rows = store.experiments(resolve_ws(store, ws) if ws is not None else None)
    return [_experiment_view(e, store.sample_count(e["id"])) for e in rows]


def pending(store: Store) -> list[ApprovalView]:
    """`kinv pending`: edits waiting for approval, oldest first."""
    return [_approval_view(a) for a in store.approvals(status="pending")]


def backups(store: Store) -> list[BackupView]:
    """`kinv backups`: every backup kinv made before touching a file."""
    return [BackupView(**_pick(b, BackupView)) for b in store.backups()]


def summarize_samples(samples: Iterable[dict]) -> list[SampleSummary]:
    """Samples grouped by (level, arm, place) in order of first appearance: n, median, min, max, cv.  Times from
    different GPUs are never pooled: a screening on Ray has an incumbent arm on each."""
    import statistics  # only `kinv show` summarizes samples: the read path of `kinv status` skips it

    groups: dict[tuple[str, str, str | None], list[float]] = {}
    for s in samples:
        if s.get("us") is not None:
            groups.setdefault((str(s.get("level")), str(s.get("arm")), s.get("place")), []).append(float(s["us"]))
    out = []
    for (level, arm, place), us in groups.items():
        mean = statistics.fmean(us)
        cv = statistics.pstdev(us) / mean if len(us) > 1 and mean > 0 else 0.0
        out.append(SampleSummary(level=level, arm=arm, n=len(us), median_us=statistics.median(us), min_us=min(us),
                                 max_us=max(us), cv=cv, place=place))  # fmt: skip
    return out


def show(store: Store, exp_id: int | str) -> ShowView:
    """`kinv show ID`: one experiment with its diff, checks, per-level/arm sample summary, effects and ledger."""
    row = resolve_experiment(store, exp_id)
    eid = row["id"]
    samples = store.samples(eid)
    env_checks = []
    for c in store.env_checks(exp_id=eid):
        c = dict(c)
        for k in ("expected", "seen", "mismatch"):
            if isinstance(c.get(k), str) and c[k][:1] in "{[":
                c[k] = _loads(c[k])
        if c.get("ok") is not None:
            c["ok"] = bool(c["ok"])
        env_checks.append(c)
    effects = [VerdictView(**{**_pick(v, VerdictView), "variant": row.get("variant")}) for v in store.verdicts(eid)]
    noise = [NoiseView(**{**_pick(n, NoiseView), "equivalent": None if n.get("equivalent") is None
                          else bool(n["equivalent"])}) for n in store.noise(exp_id=eid)]  # fmt: skip
    gpu_s = row.get("gpu_s")
    if gpu_s is None:
        from kinv.agent.tools.measure.protocol import gpu_seconds

        gpu_s = gpu_seconds(samples)
    rounds = row.get("rounds")
    if rounds is None:
        rounds = len({s.get("round") for s in samples if s.get("round") is not None})
    return ShowView(
        experiment=_experiment_view(row, len(samples)),
        diff=row.get("diff"),
        env_checks=env_checks,
        correctness=_as_dict(row.get("correctness")),
        resources=_as_dict(row.get("resources")),
        sample_summary=summarize_samples(samples),
        effects=effects,
        noise=noise,
        ledger=Ledger(gpu_s=gpu_s, rounds=rounds, wall_s=row.get("wall_s") or 0.0, samples=len(samples)),
        logs=run_logs(store, eid),
    )


def run_logs(store: Store, exp_id: int) -> dict | None:
    """Where the output of each run of experiment ``exp_id`` is kept (agent/tools/backends/command.py names them by
    experiment, arm, level, round and tag): ``{dir, pattern, files}``, or None when it has none."""
    d = store.dir / "commands"
    patterns = (f"e{exp_id}-*.log", f"server-e{exp_id}-*.log")
    files = sorted({f.name for p in patterns for f in d.glob(p)}) if d.is_dir() else []
    if not files:
        return None
    return {"dir": str(d), "pattern": " ".join(patterns), "files": len(files)}


def report(store: Store, ws: str, markdown: str) -> ReportView:
    wsv = workstream(store, ws)
    exps = [show(store, e.id) for e in experiments(store, ws)]
    return ReportView(workstream=wsv, experiments=exps, close_out=str(wsv.report_path or ""), markdown=markdown)



# --------------------------------------------------------------------------- #
# history: kinv.db's record of every graph node run
# --------------------------------------------------------------------------- #
def history(store: Store, ws: str) -> list[HistoryItem]:
    """`kinv history WS`: the graph nodes that ran for the workstream's current plan version, in order, with
    what each concluded; a node that paused (waiting for approval) or failed says so.  Every node writes its
    row as it finishes (agent.graph_support.recorded), so this never reads LangGraph's private tables."""
    ws_id = norm_ws(str(ws))
    row = store.workstream(ws_id)
    if row is None:
        resolve_ws(store, ws_id)  # raises NotFound naming the known workstreams
    version = int(row.get("version") or 1)
    return [HistoryItem(step=r["step"], node=r["node"], time=stamp(r["finished"]), decision=r["decision"],
                        outcome=r["outcome"], seconds=round((r["finished"] or 0) - (r["started"] or 0), 3))
            for r in store.node_runs(ws_id, version)]  # fmt: skip


# --------------------------------------------------------------------------- #
# export and compare (per-level effects of verdicts, as a person quotes them)
# --------------------------------------------------------------------------- #

def _effect_rows(store: Store, exp: dict) -> list[EffectRow]:

    def chg(x):
        return math.expm1(x) if x is not None and math.isfinite(x) else None

    return [EffectRow(workstream=exp.get("workstream"), experiment=exp["id"], variant=exp.get("variant"),
                      backend=exp.get("backend"), level=r["level"], rounds=r.get("n"), base_us=r.get("base_us"),
                      variant_us=r.get("variant_us"), change=chg(r.get("effect")), change_low=chg(r.get("ci_low")),
                      change_high=chg(r.get("ci_high")), conf=r.get("conf"), threshold=r.get("threshold"),
                      verdict=r.get("verdict")) for r in store.verdicts(exp["id"])]  # fmt: skip


def export(store: Store, ws: str) -> list[EffectRow]:
    """`kinv export WS`: every per-level effect of the workstream's A/B experiments."""
    ws_id = resolve_ws(store, ws)
    return [row for e in store.experiments(ws_id) if e["kind"] == "ab" for row in _effect_rows(store, e)]




def compare(store: Store, exp_a: int | str, exp_b: int | str) -> list[CompareRow]:
    """`kinv compare A B`: two experiments' per-level effects side by side (replay vs live, last week vs today)."""
    ea, eb = resolve_experiment(store, exp_a), resolve_experiment(store, exp_b)
    ra = {r.level: r for r in _effect_rows(store, ea)}
    rb = {r.level: r for r in _effect_rows(store, eb)}
    out = []
    for level in list(ra) + [lv for lv in rb if lv not in ra]:
        a, b = ra.get(level), rb.get(level)
        both = a is not None and b is not None and a.change is not None and b.change is not None
        overlap = (both and a.change_low is not None and b.change_low is not None
                   and a.change_low <= b.change_high and b.change_low <= a.change_high)  # fmt: skip
        out.append(CompareRow(level=level, a=a, b=b, difference=(b.change - a.change) if both else None,
                              overlap=bool(overlap) if both else None,
                              same_verdict=(a.verdict == b.verdict) if a and b else None))  # fmt: skip
    return out
