"""The deterministic planner: the todo list and the engineer's rules.

No network, no model: the same plan and the same measurements give the same
todos, the same moot decisions and the same recommendation.

Rules
-----
* Todo ids: ``#3a.baseline``, ``#3a.noise``, ``#3a.V1`` ..., ``#3a.closeout``;
  statuses pending / in_progress / completed / cancelled (with a reason);
  exactly one item in_progress at a time.
* Moot: a variant whose ``requires`` premise was refuted is cancelled with the
  reason ("moot: V1 regressed at every level").
* Escalation: a quick look that leaves a level undecided escalates to the full
  suite (more rounds), up to the plan's cap (agent.stats.run_sequential).
* Mixed: improved at some levels and regressed at others proposes a
  level-conditional config (the variant where it helped, the baseline elsewhere).
* Recommendation: the backlog ranked on evidence: the roofline headroom the
  benchmark measured and the verdicts just reached.
"""

from __future__ import annotations

from kinv.agent.errors import StateDamaged
from kinv.agent.plan import Plan
from kinv.agent.plan_sections import Variant
from kinv.agent.store.db import Store
from kinv.agent.words import LevelVerdict, Verdict

STATUSES = ("pending", "in_progress", "completed", "cancelled")


def todo_id(ws: str, item: str) -> str:
    return f"{ws}.{item}"


def init_todos(store: Store, plan: Plan) -> None:
    """Create the workstream's todo list once (existing items keep their status)."""
    ws = plan.ws
    items = [("baseline", "Verify the baseline: env, correctness, resources", "Verifying the baseline", "high"),
             ("noise", "Characterize benchmark noise (A/A of the baseline)", "Characterizing benchmark noise", "high")]
    for v in plan.variants:
        items.append((v.id, f"{v.id}: {v.title}", f"Testing {v.id}: {v.title}", "medium"))
    items.append(("closeout", "Close out: summary, state restored, next step", "Writing the close-out", "medium"))
    for pos, (item, content, active, prio) in enumerate(items):
        tid = todo_id(ws, item)
        if store.todo(tid) is None:
            store.upsert_todo({"id": tid, "workstream": ws, "parent": ws, "content": content, "active_form": active,
                               "status": "pending", "reason": "", "priority": prio, "position": pos})  # fmt: skip


def start(store: Store, ws: str, item: str) -> None:
    """Mark one item in_progress; any other in_progress item of the workstream goes back to pending."""
    tid = todo_id(ws, item)
    for t in store.todos(ws):
        if t["status"] == "in_progress" and t["id"] != tid:
            store.upsert_todo({"id": t["id"], "status": "pending"})
    store.upsert_todo({"id": tid, "status": "in_progress"})


def finish(store: Store, ws: str, item: str, status: str = "completed", reason: str = "") -> None:
    if status not in STATUSES:
        raise ValueError(f"unknown todo status {status!r}; valid: {', '.join(STATUSES)}")
    store.upsert_todo({"id": todo_id(ws, item), "status": status, "reason": reason})


def add_follow_up(store: Store, ws: str, item: str, content: str, reason: str) -> None:
    tid = todo_id(ws, item)
    if store.todo(tid) is None:
        pos = len(store.todos(ws))
        store.upsert_todo({"id": tid, "workstream": ws, "parent": ws, "content": content,
                           "active_form": f"Proposing {content}", "status": "pending", "reason": reason,
                           "priority": "low", "position": pos})  # fmt: skip


# --------------------------------------------------------------------------- #
# the decided variants: their verdicts live in the store; the run's state holds their experiments' ids
# --------------------------------------------------------------------------- #
def result(exp: dict, verdict_rows: list[dict]) -> dict:
    """A decided variant's result as the rules below read it, from its experiment's rows in the store: the verdict
    and its reason, and each level's verdict where the A/B reached one (none for a variant it never timed to a
    result: infeasible, failed, incorrect, tampered)."""
    out = {"verdict": exp.get("verdict"), "reason": exp.get("reason"), "exp_id": exp["id"],
           "levels": {r["level"]: r["verdict"] for r in verdict_rows}}  # fmt: skip
    if exp.get("void_reason"):
        out["void_reason"] = exp["void_reason"]
    return out


def results(store: Store, decided: dict[str, int]) -> dict[str, dict]:
    """Every decided variant's result (variant id -> :func:`result`), read from the store by experiment id."""
    out = {}
    for vid, exp_id in decided.items():
        exp = store.experiment(exp_id)
        if exp is None:
            raise StateDamaged(f"the run's checkpoint names experiment {exp_id} for {vid} but kinv.db holds no such "
                               f"experiment: kinv doctor names the way back")  # fmt: skip
        out[vid] = result(exp, store.verdicts(exp_id))
    return out


def decided(state: dict) -> dict[str, int]:
    """The run's decided variants (variant id -> experiment id).  A checkpoint written by an earlier kinv holds
    each result itself (``results``, each with its ``exp_id``): its ids are read from those, the verdicts from the
    store as for any other run."""
    old = state.get("results") or {}
    missing = sorted(vid for vid, r in old.items() if not isinstance(r, dict) or r.get("exp_id") is None)
    if missing:
        raise StateDamaged(f"the run's checkpoint was written by an earlier kinv and holds results without their "
                           f"experiment ids ({', '.join(missing)}); it cannot be resumed: start over with kinv run "
                           f"PLAN --new-version")  # fmt: skip
    return {**{vid: int(r["exp_id"]) for vid, r in old.items()}, **(state.get("decided") or {})}


# --------------------------------------------------------------------------- #
# rules
# --------------------------------------------------------------------------- #
def moot_reason(variant: Variant, results: dict) -> str | None:
    """Why a variant is moot given earlier verdicts, or None if its premise holds (or it has none)."""
    req = variant.requires
    if req is None:
        return None
    prior = results.get(req.variant)
    if prior is None:
        return f"moot: {req.variant} was not measured"
    levels = prior.get("levels", {})
    improved = [lv for lv, v in levels.items() if v == LevelVerdict.IMPROVED]
    if req.improves_somewhere and not improved:
        if levels and all(v == LevelVerdict.REGRESSED for v in levels.values()):
            return f"moot: {req.variant} regressed at every level"
        if prior.get("verdict") == Verdict.INCORRECT:
            return f"moot: {req.variant} was incorrect"
        if prior.get("verdict") == Verdict.INFEASIBLE:
            return f"moot: {req.variant} was infeasible"
        return f"moot: {req.variant} improved at no level ({prior.get('verdict')})"
    return None


def next_variant(plan: Plan, results: dict, cancelled: set[str]) -> tuple[str | None, dict[str, str]]:
    """The next variant to test, and the variants found moot on the way (id -> reason)."""
    moot = {}
    for v in plan.variants:
        if v.id in results or v.id in cancelled:
            continue
        reason = moot_reason(v, results)
        if reason:
            moot[v.id] = reason
            continue
        return v.id, moot
    return None, moot


def level_conditional(plan: Plan, variant: Variant, levels: dict[str, str]) -> dict | None:
    """For a mixed verdict: the baseline plus overrides that run the variant only at the levels where it improved,
    conditioned on the level dimensions the kernel's overrides accept (its adapter's ``override_dims``, and
    ``override_choices`` by value); None when the kernel takes no overrides or the variant changes nothing there.

    Each new override says every tunable the variant runs with at its level that differs from the baseline's
    own values, and goes before the baseline's overrides (the first match wins), so a variant whose change is
    itself an override (``{shape: v3, batch_min: 96, ...}``) is adopted where it won as well as one that
    changes the base tunables."""
    spec = plan.adapter.spec
    dims, choices = list(spec.override_dims), list(spec.override_choices)
    by_key = {lv.key: lv for lv in plan.levels()}
    improved = [by_key[k] for k, v in levels.items() if v == LevelVerdict.IMPROVED and k in by_key]
    if not improved or not (dims or choices):
        return None
    cfg, base = plan.variant_config(variant), plan.baseline
    levels_all = plan.levels()
    # a dimension that tells every level apart orders them: a run of neighbouring improved levels with one change
    # becomes one override over a range that covers the values between levels too (b9-64 for b32 and b64 after b8;
    # open-ended past the last level), as a person would write it
    span = next((d for d in dims if len({lv.dims.get(d) for lv in levels_all}) == len(levels_all)), None)
    order = sorted(levels_all, key=lambda lv: lv.dims[span]) if span else list(levels_all)
    overrides, run = [], None  # run: [first index, last index, changed, choice values] of the override being built
    for i, lv in enumerate(order):
        want, have = spec.resolve(cfg, lv.dims), spec.resolve(base, lv.dims)
        changed = {k: want[k] for k in spec.names if want[k] != base[k] or want[k] != have[k]}
        chosen = {d: lv.dims[d] for d in choices if d in lv.dims}
        if lv not in improved or dict(want) == dict(have):
            run = None
            continue
        if span and run is not None and run[1] == i - 1 and run[2] == changed and run[3] == chosen:
            run[1] = i
            if i < len(order) - 1:
                overrides[-1][f"{span}_max"] = lv.dims[span]
            else:
                overrides[-1].pop(f"{span}_max", None)
            continue
        if span:
            where = {f"{span}_min": order[i - 1].dims[span] + 1} if i > 0 else {}
            if i < len(order) - 1:
                where[f"{span}_max"] = lv.dims[span]
        else:
            where = {f"{d}_{m}": lv.dims[d] for d in dims for m in ("min", "max")}
        run = [i, i, changed, chosen]
        overrides.append({**where, **chosen, **changed})
    if not overrides:
        return None
    try:
        return plan.adapter.validate_config({**base, "overrides": overrides + list(base.get("overrides", []))})
    except ValueError:
        return None


def _beat(result: dict) -> bool:
    """Improved at some level and regressed at none (the close-out's "beat the baseline"); a result that carries
    no levels (a campaign's summary) beat it when it was accepted."""
    got = set((result.get("levels") or {}).values())
    if not got:
        return result.get("verdict") == Verdict.ACCEPT
    return LevelVerdict.IMPROVED in got and LevelVerdict.REGRESSED not in got


def recommend(plan: Plan, results: dict, headroom: float | None, bound: str = "copy bandwidth",
              measured_by: str = "", unmeasured=(), implausible=(), premises: dict | None = None) -> list[dict]:
    """Rank the backlog: prior plausibility times what this investigation's evidence says.

    * occupancy items: refuted (x0.1) when every occupancy variant that moved its premise (warps per SM,
      achieved occupancy) regressed or showed no gain; boosted (x1.5) when one was accepted;
    * an item whose premise the plan's variants aimed at but none moved keeps its score: its evidence says so and
      the ranking carries a proposal of the variants that would test it;
    * roofline-gap items: scaled by the measured headroom (1 - the best fraction of the roofline bound that
      applies at each level: copy bandwidth or the matrix peak);
    * tile-shape items: boosted (x1.3) when occupancy was refuted (the remaining kernel lever), and (x1.5)
      when a tile-shape variant won here (the lever works: its neighbours are next);
    * work elsewhere: boosted (x1.5) when no kernel variant here beat the baseline (improved at some level,
      regressed at none).

    ``premises`` maps a timed variant to its premise (:class:`kinv.agent.tools.runners.premise.PremiseCheck`); a variant
    absent from it was never timed and tested nothing.  None where the caller has none (a campaign's summary):
    then every decided variant counts as having tested its premise.
    ``unmeasured`` names variants never measured (a person rejected them, they never ran): occupancy is not
    refuted while one of its variants is among them.  ``implausible`` names levels whose roofline fraction is not
    to be believed (above the roofline, or inside L2): they are left out of ``headroom`` by the caller and said.
    """
    from kinv.agent.tools.runners.premise import NO_PREMISE, PROPOSALS, words

    def tested(vid: str) -> bool:
        return premises is None or (vid in premises and premises[vid].speaks)

    def aimed(target: str) -> list[str]:
        return [v.id for v in plan.variants if v.targets == target]

    occupancy_ids = aimed("occupancy")
    occ = [results[i] for i in occupancy_ids if i in results and tested(i)]
    occ_refuted = (bool(occ) and all(r.get("verdict") in (Verdict.REJECT, Verdict.INCORRECT, Verdict.INFEASIBLE) for r in occ)
                   and not set(occupancy_ids) & set(unmeasured))  # fmt: skip
    occ_won = any(r.get("verdict") == Verdict.ACCEPT for r in occ)
    all_rejected = bool(results) and not any(_beat(r) for r in results.values())
    tile_won = [v.id for v in plan.variants if v.targets == "tile_shape" and v.id in results
                and results[v.id].get("verdict") in (Verdict.ACCEPT, Verdict.MIXED)]  # fmt: skip
    incumbent = measured_by or "the baseline"
    ranked = []
    for item in plan.backlog:
        score, why = item.prior, [f"prior {item.prior:.2f}"]
        decided = [i for i in aimed(item.targets) if i in results]
        untested = (premises is not None and item.targets not in NO_PREMISE and bool(decided)
                    and not any(tested(i) for i in decided))  # fmt: skip
        proposal = ""
        if untested:
            said = "; ".join(f"{i}: {premises[i].quantity} {premises[i].outcome}" if i in premises
                             else f"{i} never timed ({results[i].get('verdict')})" for i in decided)  # fmt: skip
            why.append(f"{words(item.targets)} untested here ({said}): no variant moved its premise, so the score "
                       "stays at its prior")  # fmt: skip
            proposal = PROPOSALS.get(item.targets, f"a variant that moves {words(item.targets)}")
        elif item.targets == "occupancy":
            if occ_refuted:
                score *= 0.1
                why.append("occupancy refuted here: " + ", ".join(f"{i} {results[i]['verdict']}" for i in occupancy_ids
                                                                   if i in results and tested(i)))  # fmt: skip
            elif occ_won:
                score *= 1.5
                why.append("an occupancy variant was accepted")
        elif item.targets == "roofline_gap" and headroom is not None:
            score *= 0.5 + headroom
            verb, its = ("leave", "their") if "," in incumbent else ("leaves", "its")
            why.append(f"{incumbent} {verb} {headroom:.0%} of {its} roofline ({bound}) unused"
                       + (f" at the plausible levels (not {', '.join(implausible)})" if implausible else ""))
        elif item.targets == "roofline_gap" and implausible:
            why.append(f"roofline headroom unknown: implausible fractions at {', '.join(implausible)}")
        elif item.targets == "tile_shape" and tile_won:
            score *= 1.5
            why.append(f"a tile-shape variant won here ({', '.join(tile_won)}): its neighbours are next")
        elif item.targets == "tile_shape" and occ_refuted:
            score *= 1.3
            why.append("the kernel lever left after occupancy was refuted")
        elif item.targets == "elsewhere" and all_rejected:
            score *= 1.5
            why.append("no kernel variant here beat the baseline")
        ranked.append({"id": item.id, "title": item.title, "score": round(score, 3), "rationale": item.rationale,
                       "evidence": "; ".join(why), "proposal": proposal})  # fmt: skip
    ranked.sort(key=lambda r: -r["score"])
    return ranked
