"""Library side of the measuring commands: ``kinv bench``, ``noise``, ``kernels``, ``profile`` and ``revert --to-plan``.

Each raises a :class:`KinvError` for bad input and for a step that failed (the CLI maps it to its exit code and one
line, in ``kinv.agent.cli.app.main``) and returns the line it ends with (or nothing); ``kinv run`` is
agent/workstream/investigation.py.  The exit codes are the command line's: none is decided here.
"""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path

from rich.markup import escape

from kinv.agent.errors import (
    RevertError,
)
from kinv.agent.plan_file import load_plan
from kinv.agent.store.db import Store
from kinv.kernels.errors import BadInput

log = logging.getLogger(__name__)


def _plan_and_backend(plan_path, backend, as_json: bool = False):
    """The plan and the backend (its banner: :func:`_banner`, once the caller's inputs are valid)."""
    from kinv.agent.plan_file import load_plan
    from kinv.agent.tools import backends
    from kinv.agent.tools.runners import bench

    if backend not in backends.BACKENDS:  # bad input (exit 2); get_backend's BackendError would be a failed step
        raise BadInput(f"--backend {backend!r} is not valid; use {', '.join(backends.BACKENDS)}")
    said = ""
    if plan_path is None:  # no --plan: a registered kernel's example plan, and a phrase saying whose
        from kinv.kernels.adapter import default_plan

        plan_path, said = default_plan()
    plan, _ = load_plan(plan_path)
    be = bench.get_backend(backend, plan.kernel)
    return plan, be, said


def _banner(be, as_json: bool, said: str = "") -> None:
    """Say which backend measures (and which plan, when none was given); callers print it once their inputs are
    valid (under --json it goes to stderr, where bad input must leave exactly one line: the refusal)."""
    import sys

    out = sys.stderr if as_json else sys.stdout
    if said:
        print(said, flush=True, file=out)
    print(be.loud, flush=True, file=out)


def bench_command(plan_path, config_path, variant, backend, samples, rounds, state_dir, as_json, console):
    """``kinv bench``: time one config at the plan's levels, or A/B a variant against it (the sequential A/B with
    every rule that the graph runs, agent/tools/measure/sequential.py, without an A/A's offsets, which it says)."""

    from kinv.agent import fmt
    from kinv.agent.tools.measure import protocol, stats
    from kinv.agent.tools.runners import bench
    from kinv.kernels.errors import ConfigError
    from kinv.kernels.launch_config import describe, load_config
    from kinv.kernels.tunables import brief_repr

    plan, be, said = _plan_and_backend(plan_path, backend, as_json)
    adapter = plan.adapter
    cfg = load_config(config_path or adapter.ensure_config(), adapter.name)
    cfg = {k: v for k, v in cfg.items() if k != "description"}
    var_cfg = None
    if variant is not None:  # bad input is refused before the store is opened (it would create the state dir)
        patch = {}
        for item in variant.split(","):
            k, _, v = item.partition("=")
            k = k.strip()
            if k not in adapter.spec.names:
                raise BadInput(f"--variant item {brief_repr(item)}: {brief_repr(k)} is not a tunable of "
                               f"{adapter.name}; its tunables: {', '.join(adapter.spec.names)}")  # fmt: skip
            if re.fullmatch(r"[0-9]{1,9}", v.strip()):  # ASCII digits only: no "٨", "0_8" or "+8"
                patch[k] = int(v.strip())
            else:
                raise BadInput(f"--variant item {brief_repr(item)} must be KEY=INT, e.g. "
                               f"{adapter.spec.names[-1]}=2")  # fmt: skip
        try:
            var_cfg = adapter.validate_config({**cfg, **patch})
        except ConfigError as exc:
            raise BadInput(f"--variant {brief_repr(variant)}: {exc}") from None
    lvls = plan.levels()
    env = dict(plan.environment)
    if variant is None:
        be.preflight(plan.kernel, env, lvls, [(("config", plan.kernel, cfg, env), {})])
    else:  # the two arms as the sequential A/B opens them
        be.preflight(plan.kernel, env, lvls, [(("baseline", plan.kernel, cfg, env), {"partner": var_cfg, "role": "base"}),
                                              (("variant", plan.kernel, var_cfg, env), {"partner": cfg})])  # fmt: skip
    _banner(be, as_json, said)
    store = Store(state_dir)
    if variant is None:
        exp = store.new_experiment(kind="bench", variant="config", backend=be.name, config_json=json.dumps(cfg))
        common, short = stats.level_names(lv.key for lv in lvls)
        if not as_json:
            console.print(f"{describe(cfg)}{' at ' + common if common else ''}: median of {samples} samples per level",
                          markup=False)  # fmt: skip
        rows = bench.measure_config(store, exp, be, plan.kernel, cfg, env, lvls, samples,
                                    on_level=None if as_json else lambda m: console.print(_bench_line(m, short),
                                                                                         markup=False))  # fmt: skip
        store.update_experiment(exp, status="done", finished=time.time())
        if as_json:
            print(json.dumps(rows, indent=2))
        return "" if as_json else f"stored as experiment {exp} in {store.path}"
    exp = store.new_experiment(kind="ab", variant=describe(var_cfg), backend=be.name, config_json=json.dumps(var_cfg))
    thresholds = {lv.key: plan.stats.threshold_at(lv.label) for lv in lvls}
    # the sequential A/B with every rule, capped at --rounds; no A/A has measured this pair's offset (said as skipped)
    seq = protocol.sequential_plan(plan.stats, max_rounds=rounds)
    from kinv.agent.tools.measure import sequential
    from kinv.kernels.devices import get_device

    out = sequential.run(store, exp, be, plan.kernel, cfg, var_cfg, env=env, levels=lvls, thresholds=thresholds,
                         seq=seq, matrix_fallback=get_device(plan.device).matrix_tflops)  # fmt: skip
    res = out.result
    if as_json:
        print(json.dumps({"verdict": out.verdict, "reason": out.reason, "rounds": out.rounds, "gpu_s": out.gpu_s,
                          "void": out.void, "skipped": out.skipped, "ceilings": out.ceilings,
                          "effects": {k: e.__dict__ for k, e in res.effects.items()} if res else {}},
                         indent=2, default=str))  # fmt: skip
    else:
        if res is not None:
            common, short = stats.level_names(res.effects)
            if common:
                console.print(f"levels {common}: throughput change [{next(iter(res.effects.values())).conf:.3%} CI]",
                              markup=False)  # fmt: skip
            for k, e in res.effects.items():
                console.print(f"{short[k]:>8s} {fmt.change(e.effect):>7s} {fmt.change_interval(e.ci_low, e.ci_high)} "
                              f"{e.verdict}", markup=False)  # fmt: skip
        for rule in out.skipped:
            console.print(f"rule skipped: {rule}", markup=False)
        console.print(f"{describe(var_cfg)} vs {describe(cfg)}: {out.verdict} after {out.rounds} rounds "
                      f"({out.gpu_s:.2f} GPU s) — {out.reason}", markup=False)  # fmt: skip
    return "" if as_json else f"stored as experiment {exp} in {store.path}"


def _bench_line(m: dict, short: dict) -> str:
    frac = f"{m['frac_copy']:.0%}" if m.get("frac_copy") else "n/a"
    peer = f"  {m['peer']} {m['peer_us']:.1f} µs: {m['vs_peer']:.2f}x" if m.get("peer_us") else ""
    return (f"{short.get(m['level'], m['level']):>8s} {m['us']:9.1f} µs {m['gbps']:7.0f} GB/s {frac:>4s} of copy "
            f"{m['throughput']:13,.{0 if m['throughput'] >= 100 else 2}f} {m.get('throughput_unit', '')}{peer}")  # fmt: skip


def noise_command(plan_path, rounds, backend, state_dir, as_json, console, arms_n: int = 4):
    """``kinv noise``: the A/A the graph runs (protocol.run_aa + protocol.noise_bands), at the plan's levels and
    thresholds."""

    from kinv.agent import fmt
    from kinv.agent.tools.measure import noise, protocol, stats
    from kinv.kernels.launch_config import load_config

    plan, be, said = _plan_and_backend(plan_path, backend, as_json)
    adapter = plan.adapter
    cfg = {k: v for k, v in load_config(adapter.ensure_config(), adapter.name).items() if k != "description"}
    lvls = plan.levels()
    env = dict(plan.environment)
    be.preflight(plan.kernel, env, lvls, [(("A", plan.kernel, cfg, env), {"replica": j}) for j in range(arms_n)])
    _banner(be, as_json, said)
    store = Store(state_dir)
    exp = store.new_experiment(kind="noise", variant="A/A", backend=be.name)
    acc, gpu_s = protocol.run_aa(store, exp, be, plan.kernel, cfg, dict(plan.environment), lvls, rounds, arms_n)
    bands = protocol.noise_bands(plan, lvls, acc)
    store.add_noise(exp, None, [b.__dict__ for b in bands])
    store.update_experiment(exp, status="done", rounds=rounds, gpu_s=gpu_s)
    if as_json:
        print(json.dumps([b.__dict__ for b in bands], indent=2))
    else:

        common, short = stats.level_names(b.level for b in bands)
        from kinv.agent.report.render import table

        t = table("level", "round band", "offset SD", "widest pair [95% CI]", "out", "thr.", "ok",
                  title=f"A/A noise, {arms_n} workers x {rounds} rounds ({be.name})"
                  + (f"\nlevels {common}" if common else ""))  # fmt: skip
        for b in bands:
            t.add_row(short[b.level], f"±{b.band:.2%}", f"{b.offset_sd:.2%}",
                      f"{fmt.signed(b.effect)} {fmt.interval(b.ci_low, b.ci_high)}", str(b.outliers), f"{b.threshold:.1%}",
                      "yes" if b.equivalent else "NO")  # fmt: skip
        console.print(t)
    for w in noise.check_aa(bands):
        console.print(f"[yellow]warning[/yellow]: {escape(w)}")
    return "" if as_json else f"stored as experiment {exp} in {store.path}"


def kernels_rows() -> list[dict]:
    """Every registered kernel: its tunables, restrictions, level dimensions, unit and config (kinv kernels --json)."""
    from kinv.kernels.adapter import get_adapter, registered
    from kinv.kernels.errors import UnknownKernelError

    rows = []
    for name, ref in sorted(registered().items()):
        try:
            a = get_adapter(name)
        except UnknownKernelError as exc:
            rows.append({"name": name, "ref": ref, "error": str(exc)})
            continue
        rows.append({"name": a.name, "ref": ref, "tunables": {t.name: list(t.values) for t in a.spec.tunables},
                     "restrictions": [r.text for r in a.spec.restrictions], "level_dims": list(a.level_dims),
                     "override_dims": list(a.spec.override_dims),
                     "override_choices": {d: list(v) for d, v in a.spec.override_choices.items()},
                     "throughput_unit": a.throughput_unit, "config": str(a.config_path()),
                     "example_plan": str(a.root() / a.example_plan) if a.example_plan else None})  # fmt: skip
    return rows


def kernels_command(as_json: bool, console) -> str:
    """``kinv kernels``: every registered kernel, its tunables and level dimensions."""

    rows = kernels_rows()
    if as_json:
        print(json.dumps(rows, indent=2))
        return ""
    from rich.text import Text

    from kinv.agent.report.render import table

    if not console.is_terminal:  # piped: one block per kernel, no table padded to its widest cell
        for r in rows:
            say = [f"{r['name']} ({r['ref']})"]
            if "error" in r:
                say.append(f"  error: {r['error']}")
            else:
                tun = "; ".join(f"{k} " + "/".join(map(str, v)) for k, v in r["tunables"].items()) or "(none)"
                say += [f"  tunables: {tun}",
                        f"  level dimensions: {', '.join(r['level_dims'])}; throughput: {r['throughput_unit']}",
                        f"  example plan: {r['example_plan'] or '(none)'}"]  # fmt: skip
            console.print("\n".join(say), markup=False, highlight=False)
        rows = []
    t = table("kernel", "adapter", "tunables", "level dimensions", "throughput", "example plan",
              title="registered kernels (kinv.kernels entry points; a plan may also name package.module:Class)")
    for r in rows:
        if "error" in r:
            t.add_row(r["name"], r["ref"], Text(r["error"], "red"), "", "", "")
            continue
        tun = "; ".join(f"{k} {'/'.join(map(str, v))}" for k, v in r["tunables"].items())
        t.add_row(r["name"], r["ref"], tun, ", ".join(r["level_dims"]), r["throughput_unit"], r["example_plan"] or "")
    if t.rows:
        console.print(t)
    from kinv.kernels.adapter import default_plan

    try:
        path, _ = default_plan()
        console.print(f"kinv bench, noise and env without --plan use {path}", markup=False, highlight=False)
    except BadInput:
        console.print("no kernel names an example plan: kinv bench, noise and env need --plan", markup=False)
    return ""


def revert_to_plan(plan_path, state_dir: Path, baseline: bool = False) -> str:
    """``kinv revert --to-plan`` (``baseline`` False): the live config of the plan's kernel back to its file of
    record, the shipped bytes (git HEAD when the checkout tracks it, else the copy kinv kept before its first
    write); ``--to-plan-baseline`` (``baseline`` True): the plan's measurement baseline written into the live
    file, asked for by name.  Needs no state dir and creates none; the config lock records ``state_dir``."""
    from kinv.agent.tools.files import config_text, configs, record
    from kinv.kernels.launch_config import config_hash, describe, load_config

    plan, _ = load_plan(plan_path)  # PlanError -> exit 2 in main
    path = plan.adapter.ensure_config()
    with configs.ConfigFileLock(path, state_dir):  # refused while any run edits it
        if not baseline:
            try:
                action, rec = record.restore_file_of_record(path)
            except RevertError as exc:
                raise RevertError(f"{exc}. To write {plan.ws}'s measurement baseline "
                                          f"({describe(plan.baseline)}) instead: kinv revert --to-plan-baseline "
                                          f"{plan_path}") from None  # fmt: skip
            if action == "unchanged":
                return f"{path} already holds its file of record: {rec.source} (file sha {rec.sha})"
            return f"restored {path} to its file of record: {rec.source} (file sha {rec.sha})"
        base = {**plan.baseline, "kernel": plan.adapter.name}
        now = load_config(path, plan.adapter.name) if path.exists() else None
        if now is not None and config_hash(now) == config_hash(base):
            return f"{path} already holds the measurement baseline of {plan.ws} ({describe(base)})"
        before = path.read_bytes() if path.exists() else None
        if before is not None:
            new = config_text.edit_config_text(before.decode("utf-8", errors="replace"), base, plan.adapter.name).encode()
            record.note_kinv_write(path, before, new)  # the shipped bytes stay the file of record
        configs.write_config(path, base)
        got = load_config(path, plan.adapter.name)
        if config_hash(got) != config_hash(base):
            raise RevertError(f"{path} did not verify after the write")
    return (f"wrote the measurement baseline of {plan.ws} into {path} ({describe(base)}, config hash "
                     f"{config_hash(base)}, file sha {configs.sha(path)}); this is not the shipped file: kinv "
                     f"revert --to-plan {plan_path} restores that")  # fmt: skip


def profile_command(exp_id, backend, state_dir, as_json, console):
    """``kinv profile EXP``: the profile step, after the fact, for one decided A/B of a config variant: the baseline
    and the variant under Nsight Compute at the level of the largest effect, stored, and the sentence that explains
    the verdict."""

    from kinv.agent.report.resources import _profile_lines
    from kinv.agent.report.views import resolve_experiment
    from kinv.agent.tools.runners import profiling

    store = Store(state_dir)
    row = resolve_experiment(store, exp_id)
    if row["kind"] != "ab" or not row.get("verdict"):
        raise BadInput(f"experiment {row['id']} is a {row['kind']} experiment ({row.get('verdict') or row['status']}); "
                       "kinv profile takes a decided A/B of a variant (kinv experiments WS lists them)")  # fmt: skip
    wsrow = store.workstream(row["workstream"]) or {}
    plan, be, said = _plan_and_backend(wsrow.get("plan_path"), backend, as_json)
    v = next((x for x in plan.variants if x.id == row["variant"]), None)
    if v is None or v.source_patch:
        raise BadInput(f"experiment {row['id']} ({row['variant']}) is not a config variant of {wsrow.get('plan_path')}; "
                       "kinv profile takes config variants (a source patch is reverted once it is decided)")  # fmt: skip
    _banner(be, as_json, said)
    notes = profiling.step(store, plan.ws, be, plan.adapter, plan.environment, {**plan.baseline, "kernel": plan.adapter.name},
                         [(row["id"], v.id, plan.variant_config(v), plan.variant_env(v))], plan.levels())  # fmt: skip
    profs = store.profiles(exp_id=row["id"])
    if as_json:
        print(json.dumps({"experiment": row["id"], "profiles": profs, "skipped": notes}, indent=2, default=str))
    else:
        for line in notes:
            console.print(line, markup=False)
        for line in _profile_lines(profs, {lv.key: lv.label for lv in plan.levels()}):
            if line:
                console.print(line, markup=False)
    return "" if as_json else f"{len(profs)} profile(s) stored with experiment {row['id']} in {store.path}"
