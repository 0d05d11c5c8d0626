"""Adopt a measured winner: the accepted config (or the level-conditional overrides a mixed verdict
proposes, or an accepted source patch) written to the live kernel file as a journaled, reviewed change.

``kinv adopt WS VARIANT`` shows the diff and the commit message first; ``--yes`` writes it.  The write goes
through the patch journal (backup, intent, atomic write) under the same locks as a run, and the journal row
is then marked ``adopted``: a final state, so no later start "recovers" it back to the old baseline.

A write is measured against what it replaces.  When the variant's A/B ran against a baseline other than the
live file (a plan with ``baseline_on_disk: false``, or a live file that moved on since), kinv first runs a
confirming A/B of the variant against the live file, at the plan's levels and under its statistics (the
graph's sequential A/B with every rule, :func:`kinv.agent.tools.measure.sequential.run`), on the backend in use.  The variant is then
written as per-level overrides only where it improved on the live file; everywhere else the live file's
choices stay, and nothing the variant did not measure (other tunables, the live file's overrides, its
description) is dropped.  The commit message cites that comparison.  On the cuda backend the adopted
config's samples from that comparison are saved as a replay recording (:func:`record_replay`), so that the
replay backend serves the new shipped config.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from kinv.agent.errors import AdoptError, NoGain
from kinv.agent.store.db import Store
from kinv.kernels.errors import BadInput


@dataclass
class Adoption:
    ws: str
    variant: str
    kind: str  # "config", "overrides" or "source"
    path: Path
    new_config: dict | None
    source_diff: str | None
    diff: str
    message: str
    experiment: int | None = None  # the A/B the write rests on: the confirming one when there is one
    live_sha: str | None = None  # the live file's bytes the comparison and the diff were made against
    confirm: dict | None = None  # the confirming A/B against the live file: experiment, backend, levels
    arms: dict = field(default_factory=dict)  # level key -> the arm ("A" live, "B" variant) the write runs there


def _ab_experiment(store: Store, ws: str, vid: str) -> dict | None:
    return next((e for e in reversed(store.experiments(ws)) if e["variant"] == vid and e["kind"] == "ab"), None)


def _live(path: Path, kernel: str) -> tuple[dict, dict, str]:
    """The live file as written (its keys in the file's order), validated, and its sha."""
    from kinv.agent.tools.files import configs
    from kinv.kernels.launch_config import load_config

    cfg = load_config(path, kernel)
    raw = json.loads(path.read_text())
    return raw, cfg, configs.sha(path)


def _bare(cfg: dict) -> dict:
    return {k: v for k, v in cfg.items() if k != "description"}


def _onto(spec, raw: dict, cfg: dict) -> dict:
    """``cfg`` written over the live file ``raw``: the live keys keep their order and values unless ``cfg``
    sets them otherwise; a tunable ``cfg`` leaves at its default and the live file leaves out stays out."""
    out = dict(raw)
    defaults = spec.defaults()
    for k in spec.names:
        if k in cfg and (k in out or cfg[k] != defaults.get(k)):
            out[k] = cfg[k]
    if cfg.get("overrides"):
        out["overrides"] = cfg["overrides"]
    else:
        out.pop("overrides", None)
    return out


def where_it_won(adapter, raw: dict, live: dict, cand: dict, levels: list, won: list[str]) -> dict | None:
    """The live file ``raw`` with an override per level in ``won`` that runs the candidate there, put before
    the live file's own overrides (the first match wins); every other key of the live file is kept.  None when
    the candidate runs what the live file runs at every level it won."""
    from kinv.kernels.launch_config import effective

    spec = adapter.spec
    dims, choices = list(spec.override_dims), list(spec.override_choices)
    if not (dims or choices):
        return None
    top = {**spec.defaults(), **{k: live[k] for k in spec.names if k in live}}
    new = []
    for lv in levels:
        if lv.key not in won:
            continue
        want, have = effective(adapter, cand, lv), effective(adapter, live, lv)
        if all(want[k] == have[k] for k in spec.names):
            continue
        changed = {k: want[k] for k in spec.names if want[k] != top[k]} or {spec.names[0]: want[spec.names[0]]}
        where = {f"{d}_{m}": lv.dims[d] for d in dims if d in lv.dims for m in ("min", "max")}
        where.update({d: lv.dims[d] for d in choices if d in lv.dims})
        new.append({**where, **changed})
    if not new:
        return None
    out = dict(raw)
    out["overrides"] = new + list(raw.get("overrides", []))
    return out


def prepare(store: Store, ws: str, vid: str, backend: str | None = None, progress=None) -> Adoption:
    """What adopting ``vid`` of ``ws`` would write, and the commit message.  Writes no kernel file; when the
    variant was measured against another baseline than the live file, it runs (or re-reads) the confirming
    A/B against the live file on ``backend``."""
    from kinv.agent.errors import PlanError
    from kinv.agent.plan_file import load_plan
    from kinv.agent.tools.files import configs
    from kinv.kernels.launch_config import config_hash, describe

    row = store.workstream(ws)
    if row["status"] != "closed":
        raise BadInput(f"{ws} is {row['status']}: adopt a variant once its workstream has closed out")
    exp = _ab_experiment(store, ws, vid)
    if exp is None:
        ids = sorted({e["variant"] for e in store.experiments(ws) if e["kind"] == "ab"})
        raise BadInput(f"{ws} has no measured variant {vid!r}; measured: {', '.join(ids) or 'none'}")
    if exp["verdict"] not in ("accept", "mixed"):
        raise BadInput(f"{ws} {vid} was not a win ({exp['verdict']}: {exp['reason']}); only an accepted variant, or a "
                       "mixed one's level-conditional config, can be adopted")  # fmt: skip
    try:
        plan, plan_hash = load_plan(row["plan_path"])
    except PlanError as exc:
        raise AdoptError(f"the plan of {ws} cannot be read again: {exc}") from None
    if plan_hash != row["plan_hash"]:
        raise AdoptError(f"{row['plan_path']} changed since {ws} ran (hash {plan_hash[:12]}, ran with "
                         f"{row['plan_hash'][:12]}): adopt from the plan that was measured")  # fmt: skip
    adapter = plan.adapter
    variant = plan.variant(vid)
    path = adapter.config_path()
    raw, live, live_sha = _live(path, adapter.name)
    cand = plan.variant_config(variant)
    base_hash = exp["base_config_hash"] or config_hash({**plan.baseline, "kernel": adapter.name})
    against_live = base_hash == config_hash(_bare(live))
    if not variant.source_patch and config_hash(cand) == config_hash(_bare(live)):  # a source patch changes the code
        raise NoGain(f"{path} already runs {ws} {vid}'s config ({describe(live)}): nothing to adopt")
    note = (f"; the close-out says why: {Path(row['report_path'] or '').name}" if row["report_path"] else "")
    stamp = f"Adopted from {ws} {vid} ({variant.title}) by kinv adopt{note}."
    levels = plan.levels()
    label = {lv.key: lv.label for lv in levels}
    if variant.source_patch:
        if not against_live:
            raise AdoptError(f"{ws} {vid} carries a source patch measured with the config {_base_label(store, exp)}, "
                             f"but {path.name} is {describe(live)}: a source change is adopted only when it was "
                             "measured against the live file (run the plan with baseline_on_disk: true)")  # fmt: skip
        if exp["verdict"] == "mixed":
            raise BadInput(f"{ws} {vid} is mixed and carries a source patch: a source change applies at every level, "
                           "so it cannot be adopted only where it won; split the patch or tune the levels it lost")
        from kinv.agent.workstream.context import source_patch_of

        target, src_diff = source_patch_of(adapter, variant)
        verdicts = store.verdicts(exp["id"])
        lines = _header(adapter.name, ws, vid, variant.title, f"source patch {variant.source_patch}", live, exp)
        lines += _level_lines(verdicts, label) + _footer(row)
        return Adoption(ws, vid, "source", target, None, src_diff, src_diff, "\n".join(lines) + "\n",
                        experiment=exp["id"], live_sha=live_sha)  # fmt: skip
    confirm = None
    if against_live:
        verdicts = store.verdicts(exp["id"])
        used = exp
    else:
        used = confirm_against_live(store, ws, plan, vid, cand, live, backend, progress)
        verdicts = store.verdicts(used["id"])
        confirm = {"experiment": used["id"], "backend": used["backend"], "rounds": used["rounds"],
                   "levels": {v["level"]: v["verdict"] for v in verdicts}, "evidence": exp["id"]}  # fmt: skip
    won = [v["level"] for v in verdicts if v["verdict"] == "improved"]
    if against_live and exp["verdict"] == "accept":
        new_raw, kind = _onto(adapter.spec, raw, cand), "config"
        arms = {lv.key: "B" for lv in levels}
    else:
        new_raw = where_it_won(adapter, raw, live, cand, levels, won)
        kind = "overrides"
        arms = {lv.key: ("B" if lv.key in won else "A") for lv in levels}
        if new_raw is None:
            from kinv.agent import fmt

            said = ", ".join(f"{label.get(v['level'], v['level'])} {fmt.change(v['effect'])} {v['verdict']}"
                             for v in verdicts)  # fmt: skip
            what = "the live file" if against_live else f"the live file {describe(live)} (confirming A/B, experiment {used['id']})"
            raise NoGain(f"{ws} {vid} improves on {what} at no level ({said}); nothing to adopt: "
                             f"{path.name} stays as it is")  # fmt: skip
    old_desc = raw.get("description")
    new_raw["description"] = (f"{old_desc} Then: {stamp[0].lower()}{stamp[1:]}" if old_desc and not against_live
                              else stamp)  # fmt: skip
    if "description" not in raw:  # a file without one keeps its layout: the stamp goes after the kernel name
        new_raw = {k: new_raw[k] for k in (["kernel", "description"] if "kernel" in new_raw else ["description"])} | new_raw
    new_cfg = new_raw
    diff = configs.edit_diff(path, new_cfg, adapter.name)  # exactly what patch_config writes over the live bytes
    lines = _header(adapter.name, ws, vid, variant.title, describe(new_cfg), live, used)
    if confirm:
        lines += [f"The plan's A/B (experiment {exp['id']}) measured {vid} against {_base_label(store, exp)}, not "
                  f"against {path.name}; its effects are not claimed here.  Confirming A/B of {vid} "
                  f"({describe(cand)}) against the live file {describe(live)}, at the plan's levels and under its "
                  "statistics: throughput change vs the live file:", ""]  # fmt: skip
    lines += _level_lines(verdicts, label, won if kind == "overrides" else None)
    if kind == "overrides":
        lines += ["", f"Written: {vid} as per-level overrides only where it improved on the live file "
                  f"({', '.join(label.get(k, k) for k in won)}); the live file's choices stay everywhere else, "
                  "and none of its keys is dropped."]  # fmt: skip
    lines += _footer(row)
    return Adoption(ws, vid, kind, path, new_cfg, None, diff, "\n".join(lines) + "\n", experiment=used["id"],
                    live_sha=live_sha, confirm=confirm, arms=arms)  # fmt: skip


def _base_label(store: Store, exp: dict) -> str:
    from kinv.kernels.launch_config import describe

    for e in store.experiments(exp["workstream"]):
        if e["kind"] == "baseline" and _config_of(e["config_json"]):
            return describe(_config_of(e["config_json"]))
    return f"the baseline {exp['base_config_hash']}"


def _config_of(text: str | None) -> dict | None:
    """An experiment's stored config (JSON, or the Python repr older rows hold)."""
    import ast

    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return None
        return value if isinstance(value, dict) else None


def _header(kernel, ws, vid, title, what, live, exp) -> list[str]:
    from kinv.kernels.launch_config import describe

    return [f"{kernel}: adopt {ws} {vid} ({title})", "",
            f"{what}, replacing {describe(live)}. Measured by kinv ({exp['backend']} backend, experiment "
            f"{exp['id']}, {exp['rounds']} paired rounds): {exp['verdict']}.", ""]  # fmt: skip


def _level_lines(verdicts: list[dict], label: dict, won: list[str] | None = None) -> list[str]:
    from kinv.agent import fmt
    from kinv.agent.tools.measure.stats import level_names

    _, short = level_names(v["level"] for v in verdicts)
    out = []
    for v in verdicts:
        tail = "" if won is None else ("  -> written" if v["level"] in won else "  -> the live file's choice stays")
        out.append(f"  {short[v['level']]:>8s}  {fmt.change(v['effect'])} {fmt.change_interval(v['ci_low'], v['ci_high'])} "
                   f"({v['conf']:.3%} CI)  {v['verdict']}{tail}")  # fmt: skip
    return out


def _footer(row: dict) -> list[str]:
    return ["", f"Close-out: {row['report_path']}", f"Plan: {row['plan_path']} (sha {row['plan_hash'][:12]})"]


def confirm_against_live(store: Store, ws: str, plan, vid: str, cand: dict, live: dict, backend: str | None,
                         progress=None) -> dict:  # fmt: skip
    """The confirming A/B of ``cand`` against the live file's config ``live``: the plan's levels, thresholds,
    sequential plan and the workstream's A/A offsets, the sequential A/B with every rule (:func:`sequential.run`).  A finished one of this
    very pair on this backend is re-read, never measured twice; an unfinished one resumes from its rounds.
    Without a recording of the pair on replay (or on any backend failure) it refuses, and nothing is kept."""
    from kinv.agent.errors import BackendError
    from kinv.agent.tools.measure import protocol
    from kinv.agent.tools.runners import bench
    from kinv.kernels.launch_config import config_hash, describe

    if backend is None:
        raise BadInput(f"{ws} {vid} was measured against another baseline than the live file; a confirming A/B "
                       "needs a backend (--backend)")  # fmt: skip
    from kinv.agent.tools import backends

    if backend not in backends.BACKENDS:
        raise BadInput(f"--backend {backend!r} is not valid; use {', '.join(backends.BACKENDS)}")
    try:
        be = bench.get_backend(backend)
    except BackendError as exc:  # no GPU for --backend cuda, no recordings for replay: nothing is measured
        refused = BadInput if isinstance(exc, BadInput) else AdoptError  # no GPU, no recording: the --backend asked for
        raise refused(f"the confirming A/B of {ws} {vid} against the live file cannot run: "
                         f"{str(exc).splitlines()[0]}") from None  # fmt: skip
    base, var = _bare(live), _bare(cand)
    todo = f"{ws}.{vid}.confirm"
    for e in reversed(store.experiments(ws)):
        if (e["kind"], e["todo"], e["backend"], e["config_hash"], e["base_config_hash"]) == (
                "confirm", todo, be.name, config_hash(var), config_hash(base)):  # fmt: skip
            if e["status"] == "done":
                return e
    running = store.running_experiment(ws, todo, "confirm")
    if running and (running["backend"], running["config_hash"], running["base_config_hash"]) == (
            be.name, config_hash(var), config_hash(base)):  # fmt: skip
        exp_id, fresh = running["id"], False
    else:
        exp_id, fresh = store.new_experiment(workstream=ws, todo=todo, variant=vid, kind="confirm", backend=be.name,
                                             config_hash=config_hash(var), base_config_hash=config_hash(base),
                                             config_json=json.dumps(var)), True  # fmt: skip
    levels = plan.levels()
    thresholds = {lv.key: plan.stats.threshold_at(lv.label) for lv in levels}
    noise = [n for n in store.noise(ws) if n.get("offset_sd") is not None]
    offsets = {n["level"]: n["offset_sd"] for n in noise if n["level"] in thresholds}
    if progress:
        progress(f"confirming A/B of {vid} ({describe(var)}) against the live file {describe(base)} "
                 f"({be.loud})")  # fmt: skip
    from kinv.agent.tools.measure import sequential
    from kinv.kernels.devices import get_device

    try:
        out = sequential.run(store, exp_id, be, plan.kernel, base, var, env=dict(plan.environment), levels=levels,
                             thresholds=thresholds, seq=protocol.sequential_plan(plan.stats), offset_sd=offsets,
                             n_variants=len(plan.variants), names=("live", vid), ws=ws,
                             matrix_fallback=get_device(plan.device).matrix_tflops)  # fmt: skip
    except BackendError as exc:
        out = sequential.Outcome("failed", str(exc), kind="failed")
    if out.kind in ("not measured", "failed") and not out.void:
        if fresh:
            store.discard_experiment(exp_id)
        what = "no recording of that pair" if out.kind == "not measured" else "it failed"
        hint = "; measure it on a GPU: --backend cuda" if be.name == "replay" else ""
        raise AdoptError(f"{ws} {vid} was measured against {_base_label(store, _ab_experiment(store, ws, vid))}, not the "
                         f"live file {describe(base)}, and the confirming A/B of the two cannot run on {be.name} "
                         f"({what}: {out.reason.splitlines()[0]}){hint}; nothing written") from None  # fmt: skip
    if out.kind is not None or out.void:  # incorrect, crashed, tampered or void: nothing is written on its strength
        raise AdoptError(f"the confirming A/B of {ws} {vid} against the live file {describe(base)} decided nothing: "
                         f"{out.verdict}: {out.reason.splitlines()[0]}; nothing written (experiment {exp_id})")  # fmt: skip
    gpu = out.gpu_s
    store.event(ws, "adopt.confirmed", f"{vid} against the live file {describe(base)}: {out.verdict} after "
                f"{out.rounds} rounds ({gpu:.2f} GPU s, experiment {exp_id})", {"experiment": exp_id})  # fmt: skip
    return store.experiment(exp_id)


def apply(store: Store, a: Adoption) -> dict:
    """Write the adoption through the journal (the caller holds the run locks) and mark it final.  On the cuda
    backend the adopted config's samples are saved as a replay recording too."""
    from kinv.agent.tools.files import configs, record
    from kinv.kernels.launch_config import describe, load_config

    if a.live_sha and a.kind != "source" and configs.sha(a.path) != a.live_sha:
        raise AdoptError(f"{a.path} changed since the adoption was measured against it (sha {configs.sha(a.path)}, "
                         f"measured against {a.live_sha}): run kinv adopt again")  # fmt: skip
    exp_id = a.experiment or _ab_experiment(store, a.ws, a.variant)["id"]
    if a.kind == "source":
        row = configs.patch_source(store, a.path, a.source_diff, a.ws, exp_id)
    else:
        row = configs.patch_config(store, a.path, a.new_config, a.ws, exp_id)
    store.journal_set(row["id"], "adopted")
    record.keep_record(a.path)  # an adoption's bytes are the file of record the way back restores
    msg = store.dir / "adoptions" / f"{a.ws.lstrip('#')}-{a.variant}.txt"
    msg.parent.mkdir(parents=True, exist_ok=True)
    msg.write_text(a.message)
    recording = None
    if a.kind != "source" and (store.experiment(exp_id) or {}).get("backend") == "cuda":
        recording = str(record_replay(store, exp_id, a.arms, load_config(a.path)))
    what = (f"confirmed against the file it replaced in experiment {a.confirm['experiment']}" if a.confirm else
            f"measured against the file it replaced in experiment {exp_id}")  # fmt: skip
    store.event(a.ws, "adopted", f"adopted {a.ws} {a.variant} into {a.path.name} (patch #{row['id']}, {what})",
                {"patch": row["id"], "path": str(a.path), "message": str(msg), "experiment": exp_id,
                 "variant": a.variant, "confirmed": bool(a.confirm), "recording": recording,
                 "config": describe(a.new_config) if a.new_config else None})  # fmt: skip
    return {"patch": row["id"], "path": str(a.path), "message_file": str(msg), "kind": a.kind,
            "sha_after": configs.sha(a.path), "diff": a.diff, "message": a.message, "experiment": exp_id,
            "confirm": a.confirm, "recording": recording}  # fmt: skip


def recordings_dir() -> Path:
    from kinv.agent.tools.backends.base import RECORDINGS

    return Path(os.environ.get("KINV_RECORDINGS") or RECORDINGS)


def record_replay(store: Store, exp_id: int, arms: dict[str, str], config: dict, directory: Path | None = None) -> Path:
    """Save an A/B's samples of ``config`` as a replay recording (the format of benchmarks/record.py, read by
    agent/tools/runners/bench.py's Recording): at each level the rounds of the arm (``arms[level]``: "A" the baseline,
    "B" the variant) that runs what ``config`` runs there, as the variant worker of a pair of its own, so the
    replay backend serves ``config`` to ``kinv bench`` and to any lone arm.  Returns the file written."""
    import gzip
    import time

    from kinv.agent.tools.worker.hashes import kernel_hash
    from kinv.kernels.launch_config import config_hash, describe

    exp = store.experiment(exp_id)
    samples = store.samples(exp_id)
    if not samples:
        raise AdoptError(f"experiment {exp_id} has no samples to record")
    kernel = (_config_of(exp["config_json"]) or config).get("kernel")
    body = _bare(config)
    chash = config_hash(body)
    fingerprint = store.device_fingerprint(samples[0].get("device"))
    from kinv.kernels.adapter import get_adapter

    adapter = get_adapter(kernel)
    keep = [s for s in samples if arms.get(s["level"]) == s["arm"]]
    env = json.loads(keep[0]["env"] or "{}") if keep else {}
    levels = []
    for lv_key in dict.fromkeys(s["level"] for s in keep):
        levels.append(lv_key)
    header = {"type": "header", "version": 2, "kernel": adapter.name, "fingerprint": fingerprint,
              "harness_hash": keep[0]["harness_hash"], "reference_hash": keep[0]["reference_hash"],
              "kernel_hash": kernel_hash(kernel), "env": env.get("seen", {}),
              "rounds": max(s["round"] for s in keep) + 1, "aa_rounds": 0, "aa_arms": 0, "level_keys": levels,
              "protocol": f"kinv adopt: the {exp['backend']} A/B of experiment {exp_id}, at each level the arm that "
                          "runs what the adopted config runs there (ABBA, one baseline worker)",
              "configs": {describe(body): body}, "created": time.time(), "source": {"experiment": exp_id,
              "workstream": exp["workstream"], "variant": exp["variant"]}}  # fmt: skip
    lines = [header]
    for s in keep:
        e = json.loads(s["env"] or "{}")
        lines.append({"type": "sample", "kind": "ab", "pair": chash, "role": "variant", "arm": s["arm"],
                      "round": s["round"], "config_hash": chash, "level": s["level"], "us": s["us"],
                      "replays": s["replays"], "gpu_s": s["gpu_s"], "t": s["t"], "env": e.get("seen", {}),
                      "derived_env": e.get("derived", {})})  # fmt: skip
    gpu = re.sub(r"[^a-z0-9]+", "-", str(fingerprint.get("gpu") or "gpu").lower().removeprefix("nvidia ")).strip("-")
    out = Path(directory or recordings_dir()) / (gpu or "gpu") / f"{adapter.name}-adopted-{chash}.jsonl.gz"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with gzip.open(tmp, "wt") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
    os.replace(tmp, out)
    return out


def as_json(a: Adoption) -> str:
    return json.dumps({"workstream": a.ws, "variant": a.variant, "kind": a.kind, "path": str(a.path),
                       "diff": a.diff, "message": a.message, "confirm": a.confirm, "written": False}, indent=2)  # fmt: skip
