"""The investigation graph's wiring: a node that routes itself never also has a static out-edge.

LangGraph follows both a node's ``Command(goto=...)`` and its static edges; ``apply -> gate`` as a static
edge once made a failed source patch run the gate anyway, and every later ``kinv resume`` failed there.
"""

from __future__ import annotations

import inspect
from pathlib import Path

from kinv.agent.plan_file import load_plan
from kinv.agent.store.db import Store
from kinv.agent.workstream.context import Context
from kinv.agent.workstream.graph import build_graph, make_nodes

ROOT = Path(__file__).resolve().parents[3]


def _graph(tmp_path):
    plan, plan_hash = load_plan(ROOT / "plans" / "6a-fault-drill.yaml")
    ctx = Context(store=Store(tmp_path / "state"), plan=plan, plan_path="plans/6a-fault-drill.yaml",
                  plan_hash=plan_hash, backend_name="replay", approval="auto")  # fmt: skip
    return ctx, build_graph(ctx, None)


def test_no_node_that_returns_a_command_has_a_static_out_edge(tmp_path):
    ctx, graph = _graph(tmp_path)
    routing = {name for name, fn in make_nodes(ctx).items()
               if str(inspect.signature(fn).return_annotation).startswith("Command")}  # fmt: skip
    assert {"pick", "design", "approval", "apply", "gate"} <= routing
    static = {(a, b) for a, b in graph.builder.edges}
    offenders = sorted((a, b) for a, b in static if a in routing)
    assert not offenders, f"nodes that route themselves also have static edges: {offenders}"


def test_every_node_is_reachable_and_closeout_ends_the_graph(tmp_path):
    _, graph = _graph(tmp_path)
    drawn = graph.get_graph()
    names = set(drawn.nodes)
    assert {"setup", "baseline", "noise", "pick", "design", "approval", "apply", "gate", "measure", "revert",
            "decide", "declined", "closeout"} <= names  # fmt: skip
    assert any(e.source == "closeout" and e.target == "__end__" for e in drawn.edges)


def test_a_long_step_is_announced_and_beats_until_it_ends(tmp_path):
    """A correctness check can take minutes in the interpreter: it is announced when it starts, and a line comes
    every few seconds while it runs, and none after it ended."""
    import time

    ctx, _ = _graph(tmp_path)
    said: list[tuple[str, str]] = []
    ctx.progress = lambda kind, **info: said.append((kind, info.get("message", "")))
    with ctx.heartbeat("V1: correctness check at 5 levels (cpu)", every=0.05):
        time.sleep(0.3)
    n = len(said)
    time.sleep(0.2)
    assert said[0] == ("step", "V1: correctness check at 5 levels (cpu) ...")
    beats = [m for k, m in said if k == "heartbeat"]
    assert len(beats) >= 3 and all("still running" in m for m in beats)
    assert len(said) == n  # the beat stops with the step


def test_the_recorded_nodes_keep_their_routing_annotations(tmp_path):
    """Every node runs through the history recorder; LangGraph still sees each routing node's destinations."""
    _, graph = _graph(tmp_path)
    drawn = graph.get_graph()
    edges = {(e.source, e.target) for e in drawn.edges}
    assert ("gate", "measure") in edges and ("gate", "revert") in edges and ("pick", "closeout") in edges


def test_a_node_is_a_plain_function_of_state_and_runtime(tmp_path):
    """Nodes are module-level functions that get the run's Context from LangGraph's runtime (context_schema):
    one can be called alone, here `pick` choosing the first variant and then closing out on a spent budget."""
    from langgraph.runtime import Runtime

    from kinv.agent.workstream import graph, planner

    ctx, _ = _graph(tmp_path)
    ctx.store.upsert_workstream({"id": ctx.plan.ws, "title": ctx.plan.workstream.title, "kernel": ctx.plan.kernel,
                                 "status": "running", "version": 1})  # fmt: skip
    planner.init_todos(ctx.store, ctx.plan)
    out = graph.pick({"results": {}, "cancelled": [], "gpu_s": 0.0}, Runtime(context=ctx))
    assert out.goto == "design" and out.update["current"] == "F1"
    spent = graph.pick({"results": {}, "cancelled": [], "gpu_s": 1e9}, Runtime(context=ctx))
    assert spent.goto == "closeout" and spent.update["budget_exhausted"]
    assert "GPU budget spent" in spent.update["decision"]
