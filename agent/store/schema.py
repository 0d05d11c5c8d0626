"""kinv.db's schema: the numbered migrations, applied in order on every open (:meth:`Store.migrate`), each once.
A migration never changes: a new column or table is a new one at the end."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import sqlite_utils

MIGRATIONS: list[tuple[str, Callable[[sqlite_utils.Database], None]]] = []


def migration(fn):
    MIGRATIONS.append((fn.__name__, fn))
    return fn


@migration
def m001_initial(db: sqlite_utils.Database) -> None:
    db["workstreams"].create(
        {"id": str, "parent": str, "parent_title": str, "title": str, "hypothesis": str, "kernel": str,
         "plan_path": str, "plan_hash": str, "plan_json": str, "status": str, "backend": str, "approval": str,
         "baseline_hash": str, "recommendation": str, "report_path": str, "created": float, "updated": float,
         "closed": float},
        pk="id",
    )  # fmt: skip
    db["todos"].create(
        {"id": str, "workstream": str, "parent": str, "content": str, "active_form": str, "status": str,
         "reason": str, "priority": str, "position": int, "created": float, "updated": float},
        pk="id", foreign_keys=[("workstream", "workstreams", "id")],
    )  # fmt: skip
    db["devices"].create({"id": str, "gpu": str, "fingerprint": str, "first_seen": float}, pk="id")
    db["experiments"].create(
        {"id": int, "workstream": str, "todo": str, "variant": str, "kind": str, "backend": str,
         "config_hash": str, "base_config_hash": str, "config_json": str, "status": str, "verdict": str,
         "reason": str, "rounds": int, "gpu_s": float, "wall_s": float, "resources": str, "correctness": str,
         "diff": str, "void_reason": str, "device": str, "started": float, "finished": float},
        pk="id", foreign_keys=[("workstream", "workstreams", "id"), ("device", "devices", "id")],
    )  # fmt: skip
    db["samples"].create(
        {"id": int, "experiment": int, "round": int, "arm": str, "level": str, "config_hash": str, "us": float,
         "replays": int, "gpu_s": float, "harness_hash": str, "reference_hash": str, "env": str, "backend": str,
         "device": str, "t": float},
        pk="id", foreign_keys=[("experiment", "experiments", "id")],
    )  # fmt: skip
    db["samples"].create_index(["experiment", "level"])
    db["verdicts"].create(
        {"id": int, "experiment": int, "level": str, "n": int, "base_us": float, "variant_us": float,
         "effect": float, "ci_low": float, "ci_high": float, "ratio": float, "threshold": float, "verdict": str,
         "t": float},
        pk="id", foreign_keys=[("experiment", "experiments", "id")],
    )  # fmt: skip
    db["noise"].create(
        {"id": int, "experiment": int, "workstream": str, "level": str, "band": float, "cv": float,
         "n_pairs": int, "equivalent": int, "effect": float, "ci_low": float, "ci_high": float, "t": float},
        pk="id", foreign_keys=[("experiment", "experiments", "id")],
    )  # fmt: skip
    db["measurements"].create(
        {"id": int, "experiment": int, "level": str, "config": str, "us": float, "gbps": float,
         "frac_copy": float, "tokens_per_s": float, "copy_gbps": float, "n": int, "t": float},  # m008 renames it
        pk="id", foreign_keys=[("experiment", "experiments", "id")],
    )  # fmt: skip
    db["backups"].create(
        {"id": int, "path": str, "backup_path": str, "sha": str, "workstream": str, "t": float}, pk="id"
    )
    db["patches"].create(
        {"id": int, "workstream": str, "experiment": int, "path": str, "kind": str, "state": str,
         "sha_before": str, "sha_after": str, "diff": str, "backup": int, "created": float, "updated": float},
        pk="id", foreign_keys=[("backup", "backups", "id")],
    )  # fmt: skip
    db["env_checks"].create(
        {"id": int, "workstream": str, "experiment": int, "source": str, "expected": str, "seen": str, "ok": int,
         "mismatch": str, "t": float},
        pk="id",
    )  # fmt: skip
    db["approvals"].create(
        {"id": str, "workstream": str, "todo": str, "variant": str, "kind": str, "diff": str, "resources": str,
         "hypothesis": str, "status": str, "reason": str, "created": float, "decided": float},
        pk="id",
    )  # fmt: skip
    db["events"].create(
        {"id": int, "workstream": str, "t": float, "kind": str, "message": str, "data": str}, pk="id"
    )
    db["events"].create_index(["workstream", "t"])
    db["locks"].create({"workstream": str, "pid": int, "host": str, "t": float}, pk="workstream")


@migration
def m002_variance_components(db: sqlite_utils.Database) -> None:
    """The A/A's variance components and warnings; every interval's real confidence."""
    for col, typ in (("round_sd", float), ("offset_sd", float), ("n_arms", int), ("outliers", int),
                     ("max_gap", float), ("threshold", float), ("broken", int), ("warning", str)):  # fmt: skip
        db["noise"].add_column(col, typ)
    db["noise"].add_column("offset_p", float)
    db["verdicts"].add_column("conf", float)
    db["verdicts"].add_column("offset_sd", float)


@migration
def m003_pinned_approvals(db: sqlite_utils.Database) -> None:
    """An approval pins the plan's hash and the exact edit; it shows the variant's title and rationale."""
    for col in ("plan_hash", "patch_sha", "title", "rationale"):
        db["approvals"].add_column(col, str)


@migration
def m004_plan_versions(db: sqlite_utils.Database) -> None:
    """A changed plan under the same workstream id is a new version; history keeps every version."""
    db["workstreams"].add_column("version", int)
    db["experiments"].add_column("version", int)
    db["plan_versions"].create(
        {"id": int, "workstream": str, "version": int, "plan_path": str, "plan_hash": str, "plan_json": str,
         "status": str, "report_path": str, "recommendation": str, "todos_json": str, "closed": float,
         "archived": float},
        pk="id",
    )  # fmt: skip


@migration
def m005_node_runs(db: sqlite_utils.Database) -> None:
    """Every graph node run is recorded in kinv.db (``kinv history`` reads it, not LangGraph's tables)."""
    db["node_runs"].create(
        {"id": int, "workstream": str, "version": int, "node": str, "step": int, "started": float, "finished": float,
         "decision": str, "outcome": str, "pid": int},
        pk="id",
    )  # fmt: skip
    db["node_runs"].create_index(["workstream", "version"])


@migration
def m006_campaigns(db: sqlite_utils.Database) -> None:
    """A campaign chains workstreams; its row holds the incumbent and the steps taken."""
    db["campaigns"].create(
        {"id": str, "plan_path": str, "plan_hash": str, "kernel": str, "status": str, "backend": str,
         "approval": str, "start_config": str, "incumbent": str, "steps": str, "stop_reason": str,
         "summary": str, "created": float, "updated": float},
        pk="id",
    )  # fmt: skip
    db["workstreams"].add_column("campaign", str)


@migration
def m007_sample_place(db: sqlite_utils.Database) -> None:
    """Which GPU of the node or cluster timed a sample (a Ray actor's place); empty in one process."""
    db["samples"].add_column("place", str)


@migration
def m008_throughput_unit(db: sqlite_utils.Database) -> None:
    """measurements.tokens_per_s held each kernel's own throughput (TFLOP/s for the MoE expert GEMM): the column
    is now ``throughput``, with its unit beside it (the adapter's throughput_unit).  Rows written before get the
    unit their kernel's adapter declares, or none when that kernel cannot be loaded here."""
    db.execute("alter table measurements rename column tokens_per_s to throughput")
    db.execute("alter table measurements add column throughput_unit text")
    kernel_of = ("select e.id, case when json_valid(e.config_json) then json_extract(e.config_json, '$.kernel') end, "
                 "w.kernel from experiments e left join workstreams w on e.workstream = w.id "
                 "where e.id in (select distinct experiment from measurements)")  # fmt: skip
    for exp, kernel, ws_kernel in db.execute(kernel_of).fetchall():
        unit = _throughput_unit(kernel or ws_kernel)
        if unit:
            db.execute("update measurements set throughput_unit = ? where experiment = ?", [unit, exp])


@migration
def m009_screened(db: sqlite_utils.Database) -> None:
    """A campaign's screened candidates, one row per config of a screening experiment: its change at every level
    against the incumbent (and its interval), or why it was pruned or failed (the Optuna study is only the
    sampler's memory)."""
    db["screened"].create(
        {"experiment": int, "config_hash": str, "trial": int, "asked": int, "status": str, "config": str,
         "config_json": str, "gains": str, "gain_ci": str, "measured_on": str, "reason": str, "t": float},
        pk=("experiment", "config_hash"),
    )  # fmt: skip


@migration
def m010_profiles(db: sqlite_utils.Database) -> None:
    """The profile step's evidence: one row per profiled (experiment, arm, level) with the parsed figures, where
    they came from (ncu live, or a recording) and the seconds it took."""
    db["profiles"].create(
        {"id": int, "workstream": str, "experiment": int, "arm": str, "config_hash": str, "level": str,
         "figures": str, "source": str, "seconds": float, "t": float},
        pk="id",
    )  # fmt: skip


@migration
def m011_sample_yardstick(db: sqlite_utils.Database) -> None:
    """The yardstick each timed sample also took (GB/s of a fixed device copy, timed with the sample's own
    events): a sample whose yardstick beats the card's copy bandwidth was timed by a timer not to be believed."""
    db["samples"].add_column("yard_gbps", float)


@migration
def m012_regressions(db: sqlite_utils.Database) -> None:
    """``kinv regress``: one row per comparison of two revisions (which, where, on what machine, how it ended) and
    one row per kernel and level it judged (the verdict, the change and its interval, the margin, the A/A band)."""
    db["regressions"].create(
        {"id": int, "repo": str, "base": str, "base_sha": str, "base_date": str, "head": str, "head_sha": str,
         "head_date": str, "head_dirty": int, "backend": str, "device": str, "machine": str, "outcome": str,
         "exit_code": int, "gpu_s": float, "wall_s": float, "closeout": str, "started": float, "finished": float},
        pk="id", foreign_keys=[("device", "devices", "id")],
    )  # fmt: skip
    db["regress_levels"].create(
        {"id": int, "regression": int, "kernel": str, "level": str, "label": str, "verdict": str,
         "kernel_verdict": str, "effect": float, "ci_low": float, "ci_high": float, "conf": float,
         "threshold": float, "band": float, "base_us": float, "head_us": float, "rounds": int, "experiment": int,
         "reason": str, "t": float},
        pk="id", foreign_keys=[("regression", "regressions", "id")],
    )  # fmt: skip
    db["regress_levels"].create_index(["kernel", "regression"])


@migration
def m013_sample_refresh(db: sqlite_utils.Database) -> None:
    """What a sample's fresh inputs cost (the fills' own time, taken out of ``us``) and any other GPU work seen
    beside it (NVML): a level whose samples saw some is voided."""
    db["samples"].add_column("refresh_us", float)
    db["samples"].add_column("foreign", str)


def _throughput_unit(kernel: str | None) -> str | None:
    if not kernel:
        return None
    try:
        from kinv.kernels.adapter import get_adapter

        return get_adapter(kernel).throughput_unit
    except Exception:  # noqa: BLE001 - a kernel no longer installed: its rows keep no unit rather than a guess
        return None
