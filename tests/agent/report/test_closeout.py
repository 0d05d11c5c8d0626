"""The close-out's sentences follow from the verdicts its tables print (rendered from a store built directly)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kinv.agent.report import closeout as report
from kinv.agent.report import figure
from kinv.agent.workstream import collect as closeout
from tests.closeout_fixture import build, outcome

ALL = ("b1", "b8", "b32", "b64", "b96")


def _levels(verdict, change, lo, hi, labels=ALL):
    return {lab: (verdict, change, lo, hi) for lab in labels}


def _render(tmp_path, **kw):
    store, plan, state, ctx = build(tmp_path, **kw)
    return report.render(closeout.collect(store, plan, state, ctx))


# ---- behaviour that was right before the sentences were derived from the verdicts, pinned --------------------
def test_every_variant_measured_or_moot_and_none_improved_is_refuted(tmp_path):
    text = _render(tmp_path, measured={"V1": ("reject", _levels("regressed", -0.3, -0.32, -0.28)),
                                       "V2": ("reject", _levels("equivalent", 0.001, -0.002, 0.004))},
                   cancelled={"V3": "moot: V1 regressed at every level"})  # fmt: skip
    assert "The hypothesis is refuted for this kernel shape" in outcome(text)
    assert "not refuted" not in outcome(text) and "supported where" not in outcome(text)


def test_an_undecided_level_with_nothing_improved_is_neither_supported_nor_refuted(tmp_path):
    v2 = {**_levels("equivalent", 0.001, -0.002, 0.004, ALL[:3]), **_levels("undecided", 0.006, -0.02, 0.03, ALL[3:])}
    text = _render(tmp_path, measured={"V1": ("reject", _levels("regressed", -0.3, -0.32, -0.28)),
                                       "V2": ("inconclusive", v2)},
                   cancelled={"V3": "moot: V1 regressed at every level"})  # fmt: skip
    assert "not refuted either; undecided levels in V2" in outcome(text)
    assert "refuted for this kernel shape" not in outcome(text)


def test_a_null_drill_equivalent_where_predicted_says_the_null_holds(tmp_path):
    n1 = {**_levels("equivalent", 0.001, -0.003, 0.004, ("b1", "b8")),
          **_levels("improved", 0.05, 0.04, 0.06, ("b32", "b64", "b96"))}
    text = _render(tmp_path, plan_file="3c-null-batch-aware.yaml", measured={"N1": ("accept", n1)})
    assert "- The null holds: equivalent at b1, b8 for every measured variant." in outcome(text)
    assert "refuted" not in outcome(text)


# ---- sentences that contradicted their tables -------------------------------------------------------------
SHIPPED = ('{\n  "kernel": "mla_decode",\n  "description": "shipped",\n  "BLOCK_T": 64,\n  "BLOCK_H": 16,\n'
           '  "num_warps": 4,\n  "num_stages": 2\n}\n')


def test_an_undecided_level_whose_interval_clears_the_margin_rules_a_regression_out(tmp_path):
    """Live #3a: V2 improved at b64, undecided at b96 with [+0.06%, +1.09%]: a regression is ruled out there, V2
    beat the baseline where it improved, and the file on disk (the shipped BT64 config) is named as it is."""
    v2 = {**_levels("equivalent", 0.002, -0.003, 0.006, ALL[:3]), "b64": ("improved", 0.0112, 0.009, 0.013),
          "b96": ("undecided", 0.0056, 0.0006, 0.0109)}
    text = _render(tmp_path, measured={"V1": ("reject", _levels("regressed", -0.3, -0.32, -0.28)),
                                       "V2": ("inconclusive", v2)},
                   cancelled={"V3": "moot: V1 regressed at every level"}, live=SHIPPED)  # fmt: skip
    out = outcome(text)
    assert "not ruled out" not in out and "b96 (+0.56% [+0.06%, +1.09%]: a regression is ruled out)" in out, out
    assert "No variant beat the baseline" not in out and "V2 beat the baseline at b64" in out, out
    assert "BT16/BH16/w4/s2 stays" not in out and "mla_decode.json stays BT64/BH16/w4/s2" in out, out
    assert "refuted" not in out.replace("not refuted", "") and "supported where a variant improved: V2 at b64" in out
    assert "V2" in text.split("Proposed follow-ups:", 1)[1]


def test_an_undecided_level_whose_interval_reaches_below_the_margin_leaves_a_regression_open(tmp_path):
    v2 = {**_levels("equivalent", 0.002, -0.003, 0.006, ALL[:4]), "b96": ("undecided", 0.004, -0.02, 0.03)}
    out = outcome(_render(tmp_path, measured={"V1": ("reject", _levels("regressed", -0.3, -0.32, -0.28)),
                                              "V2": ("inconclusive", v2)},
                          cancelled={"V3": "moot: V1 regressed at every level"}))  # fmt: skip
    assert "b96 (+0.40% [-2.00%, +3.00%]: a regression is not ruled out)" in out, out


def test_a_variant_that_improved_and_regressed_nowhere_beat_the_baseline_and_is_a_follow_up(tmp_path):
    """#4a: V2 +12.96% / +3.08% / +3.11%, regressed nowhere, not accepted (levels left undecided)."""
    v2 = {"t1": ("improved", 0.1296, 0.11, 0.15), "t8": ("improved", 0.0308, 0.02, 0.04),
          "t32": ("improved", 0.0311, 0.02, 0.04), "t64": ("undecided", 0.01, -0.004, 0.02),
          "t96": ("equivalent", 0.0, -0.005, 0.005)}
    v1 = {lab: ("regressed", -0.1, -0.12, -0.08) for lab in ("t1", "t8", "t32", "t64", "t96")}
    text = _render(tmp_path, plan_file="4a-expert-gemm-tiles.yaml",
                   measured={"V1": ("reject", v1), "V2": ("inconclusive", v2)},
                   cancelled={"V3": "moot: V1 regressed at every level"})  # fmt: skip
    out = outcome(text)
    assert "No variant beat the baseline" not in out and "V2 beat the baseline at t1 (+12.96%" in out, out
    assert "V2" in text.split("Proposed follow-ups:", 1)[1].split("\n## ", 1)[0]


def test_an_improved_level_is_never_printed_beside_refuted(tmp_path):
    """#9c: V1 improved at b96 (+9.44%) and regressed at b64; nothing else measured."""
    lv = {"b64": ("regressed", -0.05, -0.06, -0.04), "b96": ("improved", 0.0944, 0.08, 0.11),
          "b128": ("equivalent", 0.0, -0.004, 0.004)}
    text = _render(tmp_path, plan_file="9c-decode-shape.yaml", measured={"V1": ("mixed", lv)})
    out = outcome(text)
    assert "refuted" not in out and "supported where a variant improved: V1 at b96" in out, out
    assert "No variant beat the baseline without regressing elsewhere: V1 improved at b96" in out, out


def test_a_variant_rejected_by_a_person_was_never_measured_so_nothing_is_refuted(tmp_path):
    def both_occupancy(src):  # V1 and V2 both aimed at occupancy, as the seed's plan once had it
        src["variants"][1]["targets"] = "occupancy"

    text = _render(tmp_path, measured={"V1": ("reject", _levels("regressed", -0.3, -0.32, -0.28))},
                   cancelled={"V2": "rejected by a person: not today", "V3": "moot: V1 regressed at every level"},
                   plan_edit=both_occupancy)  # fmt: skip
    out = outcome(text)
    assert "refuted for this kernel shape" not in out and "not supported but not refuted either" in out, out
    assert "V2 was rejected by a person and never measured" in out and "num_stages 3 untested" in out, out
    assert "occupancy refuted" not in text  # nor in the recommendation's evidence: half of it was never measured


def test_roofline_fractions_above_one_or_inside_l2_are_flagged_never_stated(tmp_path):
    """#4a at t1: 100 µs for a call that must move ~470 MB at 4.1 TB/s is above the roofline: implausible.  #3a at
    b1 moves 4.7 MB a call: timed over input sets that fill 3x the H200's 60 MB L2 its fraction is stated; timed
    over one set that fits in L2 it says nothing and is flagged."""
    eq = {lab: ("equivalent", 0.0, -0.004, 0.004) for lab in ("t1", "t8", "t32", "t64", "t96")}
    text = _render(tmp_path, plan_file="4a-expert-gemm-tiles.yaml", measured={"V1": ("reject", eq)})
    roof = text.split("## Roofline", 1)[1].split("\n## ", 1)[0]
    assert "t1 memory-bound at" not in roof and "implausible" in roof, roof
    assert "0% of its roofline" not in text and "0% of their roofline" not in text
    for name, per_set_sets in (("rotated", 3 * 60 * 2**20 + 2**20), ("one-set", 4 * 2**20)):
        (tmp_path / name).mkdir()
        store, plan, state, ctx = build(tmp_path / name, measured={"V1": ("reject", _levels("equivalent", 0.0, -0.004, 0.004))})
        exp = next(e["id"] for e in store.experiments(plan.ws) if e["kind"] == "ab")
        key = next(lv.key for lv in plan.levels() if lv.label == "b1")
        store.merge_resources(exp, timed={key: {"working_set": per_set_sets, "l2_bytes": 60 * 2**20}})
        roof = report.render(closeout.collect(store, plan, state, ctx)).split("## Roofline", 1)[1].split("\n## ", 1)[0]
        if name == "rotated":
            assert "b1 memory-bound at" in roof and "fits in L2" not in roof, roof
        else:
            assert "b1 memory-bound at" not in roof and "timed working set (4.0 MiB) fits in L2 (60 MiB)" in roof, roof


def test_a_standalone_plan_never_calls_its_baseline_a_campaigns_incumbent(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from kinv.agent.workstream import context as graph_support
    from kinv.agent.workstream import graph
    from tests.utils import write_seed_config

    cfg = tmp_path / "cfg"
    cfg.mkdir()
    write_seed_config(cfg)
    monkeypatch.setenv("KINV_CONFIG_DIR", str(cfg))
    store, plan, _state, _ctx = build(tmp_path)
    said = []
    ctx = graph_support.Context(store=store, plan=plan, plan_path=_ctx.plan_path, plan_hash=_ctx.plan_hash,
                        backend_name="replay", approval="auto", progress=lambda kind, **i: said.append(i["message"]),
                        _backend=_ctx.backend)  # fmt: skip
    graph.setup({"ws": plan.ws}, SimpleNamespace(context=ctx))
    line = next(m for m in said if "baseline" in m)
    assert "incumbent" not in line and "campaign" not in line and "never written" in line, line


# ---- defects ------------------------------------------------------------------------------------------------
def test_a_new_plan_versions_close_out_shows_only_its_own_experiments(tmp_path):
    store, plan, state, ctx = build(tmp_path, measured={"V1": ("reject", _levels("regressed", -0.3, -0.32, -0.28))},
                                    version=2, gpu_s=1.0)  # fmt: skip
    old = store.new_experiment(workstream=plan.ws, todo=f"{plan.ws}.V2", variant="V2", kind="ab", status="done",
                               verdict="accept", reason="old", rounds=8, gpu_s=50.0, version=1)  # fmt: skip
    from tests.closeout_fixture import level_row

    store.add_verdicts(old, [level_row(lv.key, "improved", 0.2, 0.1, 0.3) for lv in plan.levels()])
    text = report.render(closeout.collect(store, plan, state, ctx))
    assert "## V2" not in text and "+20.00%" not in text
    assert "GPU time in samples: 2.00 s" in text, text.split("## Ledger")[1]  # noise + V1 of version 2 only


def test_a_replay_close_out_names_where_its_recordings_come_from(tmp_path, monkeypatch):
    from tests.closeout_fixture import FakeReplay

    be = FakeReplay([{"synthetic": True, "fingerprint": {"gpu": "a synthetic test fixture (not a measurement)"}}])
    store, plan, state, ctx = build(tmp_path, measured={"V1": ("reject", _levels("regressed", -0.3, -0.32, -0.28))},
                                    backend=be)  # fmt: skip
    titles = []
    monkeypatch.setattr(figure, "plot", lambda data, path, adapter, levels, title="", **kw: titles.append(title))
    path = closeout.write_closeout(store, plan, state, ctx, out_dir=tmp_path / "reports")
    assert titles and "H200" not in titles[0] and "synthetic" in titles[0], titles
    assert "H200" not in path.read_text()


@pytest.mark.slow  # a run to V1's approval
def test_an_archived_plan_version_keeps_its_own_close_out_which_the_next_version_never_overwrites(tmp_path):
    """Version 1's close-out is renamed when version 2 starts: the history row must point at the renamed file, not
    at the path version 2's close-out then writes."""
    from kinv.agent.store.db import Store
    from tests.utils import kinv_in_process as run_kinv
    from tests.utils import replay_env

    env = replay_env(tmp_path, tmp_path / "state")
    store = Store(tmp_path / "state")
    reports = tmp_path / "state" / "reports"
    reports.mkdir(parents=True)
    (reports / "3a-closeout.md").write_text("version 1's close-out\n![throughput by level](3a-closeout.png)\n")
    (reports / "3a-closeout.png").write_bytes(b"png of version 1")
    store.upsert_workstream({"id": "#3a", "title": "old", "kernel": "mla_decode", "status": "closed", "version": 1,
                             "plan_hash": "0ld", "plan_path": "old.yaml", "report_path": str(reports / "3a-closeout.md")})
    # version 2 pauses (exit 3) at V1's edit, after version 1 was archived
    r = run_kinv(env, "run", "plans/3a-attention-occupancy.yaml", "--backend", "replay", "--new-version",
                 "--approval", "ask", timeout=300)
    assert "version 1 kept in history" in r.stdout, r.stdout + r.stderr
    old = Store(tmp_path / "state").plan_versions("#3a")[0]["report_path"]
    assert old and Path(old).read_text().startswith("version 1's close-out\n"), old
    link = Path(old).read_text().split("](", 1)[1].split(")", 1)[0]
    assert (Path(old).parent / link).read_bytes() == b"png of version 1", link  # its own plot, not version 2's
    assert Path(old) != reports / "3a-closeout.md"  # the path version 2's close-out writes


# ---- the renderer renders what it is handed -------------------------------------------------------------------
RENDERERS = ("agent/report/closeout.py", "agent/report/figure.py", "agent/report/resources.py", "agent/report/summary.py", "agent/report/render.py", "agent/fmt.py")
COLLECTORS = ("kinv.agent.store", "kinv.agent.tools", "kinv.agent.workstream.planner", "kinv.agent.workstream.collect", "kinv.agent.report.views",
              "kinv.agent.workstream.graph", "kinv.agent.workstream.investigation", "sqlite3", "subprocess", "torch")  # fmt: skip


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at its top or inside a function (``from kinv.agent.workstream import planner`` counts as
    ``kinv.agent.workstream.planner``)."""
    import ast

    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


@pytest.mark.parametrize("module", RENDERERS)
def test_the_close_out_renderer_reads_asks_and_measures_nothing(module):
    """What a close-out shows is collected once by the close-out node: the renderer imports no store, backend,
    planner, tool or collector, and opens no file to read."""
    path = Path(__file__).resolve().parents[3] / module
    pure = "kinv.agent.tools.measure.stats"  # level names and intervals: pure functions of what it is handed
    reached = sorted(n for n in _imports(path) for c in COLLECTORS
                     if (n == c or n.startswith(c + ".")) and not (n == pure or n.startswith(pure + ".")))
    assert not reached, f"{module} imports {reached}: hand the renderer the data instead"
    text = path.read_text()
    assert ".read_text(" not in text and ".read_bytes(" not in text and "open(" not in text, module


def test_a_close_out_rendered_twice_from_the_same_collected_data_is_the_same_text(tmp_path):
    """Rendering changes nothing it was handed and reads nothing else: the same data gives the same Markdown, and
    collecting does not record the recommendation (writing the close-out does)."""
    store, plan, state, ctx = build(tmp_path, measured={"V1": ("accept", _levels("improved", 0.05, 0.03, 0.07)),
                                                        "V2": ("reject", _levels("regressed", -0.3, -0.32, -0.28))})  # fmt: skip
    cd = closeout.collect(store, plan, state, ctx)
    before = dict(store.workstream(plan.ws))
    assert report.render(cd) == report.render(cd)
    assert dict(store.workstream(plan.ws)) == before
    assert "## Recommendation" in report.render(cd) and cd.ranked


GOLDEN = Path(__file__).resolve().parents[2] / "data" / "closeouts"
SCENARIOS = {
    "mixed": {"measured": {"V1": ("mixed", {**_levels("improved", 0.0405, 0.012, 0.034, ALL[:2]),
                                            **_levels("regressed", -0.02, -0.03, -0.011, ALL[2:])}),
                           "V2": ("inconclusive", {**_levels("equivalent", 0.001, -0.002, 0.004, ALL[:3]),
                                                   **_levels("undecided", 0.006, -0.02, 0.03, ALL[3:])})},
              "cancelled": {"V3": "moot: V1 regressed at every level"}},
    "failed": {"measured": {"V1": ("accept", _levels("improved", 0.12, 0.08, 0.16))},
               "failed": {"V2": ("incorrect", "max abs error 3.1 at b8 over atol 0.01")},
               "cancelled": {"V3": "rejected by a person: not worth the registers"}},
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_a_close_out_reads_word_for_word_as_pinned(name, tmp_path):
    """The whole Markdown of a close-out, every table, sentence and figure, as the close-out wrote it before it
    was split into collecting and rendering (tests/data/closeouts/; only the temporary path and the time vary).
    A deliberate change of wording rewrites the pinned file in the same commit."""
    import re

    store, plan, state, ctx = build(tmp_path, **SCENARIOS[name])
    text = report.render(closeout.collect(store, plan, state, ctx)).replace(str(tmp_path), "TMP")
    text = re.sub(r"written \d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ", "written TIME", text)
    assert text == (GOLDEN / f"{name}.md").read_text()
