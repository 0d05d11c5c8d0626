"""The campaign as a LangGraph graph, beside the workstream graph it runs (agent/workstream/graph.py)::

    START -> plan_next -+-> screen ---> plan_next          (a backlog item's screening)
                        +-> confirm --> plan_next          (its finalists' workstream; a pause -> summarise)
                        +-> final_ab -> plan_next          (the campaign's config against the start)
                        +-> adopt ----> summarise -> END   (through the approval gate)

Nodes are thin: each runs one step of the Campaign (driver.py, screen.py, steps.py, finish.py), which reads and
writes kinv.db; the graph state holds the exit code and the last line only.  plan_next routes on what kinv.db says
was done (the campaign's row and its steps), so a node re-run after a kill finds its step's records: a screening
its screened rows, a workstream its own checkpoints.  The graph's checkpoints are the state dir's checkpoints.db,
thread ``<campaign>@campaign``: a killed campaign resumes at the node it was in; a paused or finished pass ends,
and the next ``kinv campaign`` starts a new pass at plan_next.

A confirmation workstream runs the workstream graph on its own thread, exactly as ``kinv run`` would (its
approvals, ``kinv resume`` and ``kinv history`` see one workstream): it is invoked from the node in a context
of its own, never as a namespace of the campaign's thread."""

from __future__ import annotations

import contextvars
from typing import Literal, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.types import Command

from kinv.agent.campaign.results import FINAL, CampaignEnd
from kinv.agent.errors import CampaignError

RECURSION_LIMIT = 500  # a pass takes about three supersteps per backlog item


class CampaignState(TypedDict, total=False):
    end: CampaignEnd  # how the pass ends (the command line maps it to an exit code)
    line: str
    decision: str


def _last(c) -> dict | None:
    steps = c.row["steps"]
    return steps[-1] if steps else None


def plan_next(state: CampaignState, runtime: Runtime) -> Command[Literal["plan_next", "screen", "confirm", "final_ab",
                                                                         "adopt"]]:  # fmt: skip
    c = runtime.context
    last = _last(c)
    if last and last["phase"] != "done":
        if last["phase"] == "screen":
            return Command(goto="screen", update={"decision": f"{last['ws']}: screen {last['item']}"})
        if last["phase"] == "confirm":
            node = "final_ab" if last.get("item") == FINAL else "confirm"
            return Command(goto=node, update={"decision": f"{last['ws']}: {node}"})
        raise CampaignError(f"step {last.get('ws')} is in an unknown phase {last['phase']!r}")
    if last and last.get("item") == FINAL:
        return Command(goto="adopt", update={"decision": "adopt"})
    why = c.stop_reason()
    if why:
        c.save(stop_reason=why)
        c.say(f"stops: {why}")
        c.begin_final()
        return Command(goto="plan_next", update={"decision": f"stops: {why}"[:300]})
    c.begin_step()
    return Command(goto="plan_next", update={"decision": f"next: {_last(c)['item']}"})


def screen(state: CampaignState, runtime: Runtime) -> dict:
    c = runtime.context
    last = _last(c)
    if last and last["phase"] == "screen":
        c.screen(last)
    return {"decision": f"{last['ws']}: screened" if last else "nothing to screen"}


def _confirm(c) -> Command:
    last = _last(c)
    if not last or last["phase"] != "confirm":
        return Command(goto="plan_next", update={"decision": "nothing to confirm"})
    # the workstream's graph runs on its own thread: a context of its own keeps LangGraph from nesting it
    end, line = contextvars.Context().run(c.confirm, last)
    if end != "done":
        return Command(goto="summarise", update={"end": end, "line": line, "decision": f"{last['ws']}: {end}"})
    return Command(goto="plan_next", update={"decision": f"{last['ws']} closed"})


def confirm(state: CampaignState, runtime: Runtime) -> Command[Literal["plan_next", "summarise"]]:
    return _confirm(runtime.context)


def final_ab(state: CampaignState, runtime: Runtime) -> Command[Literal["plan_next", "summarise"]]:
    return _confirm(runtime.context)


def adopt(state: CampaignState, runtime: Runtime) -> dict:
    c = runtime.context
    end, line = c.finish(_last(c))
    return {"end": end, "line": line, "decision": line[:300]}


def summarise(state: CampaignState, runtime: Runtime) -> dict:

    c = runtime.context
    c.save(summary=c.summary())
    end = state.get("end", "done")
    if end in ("paused", "interrupted"):
        c.save(status=end)
    return {"decision": "summarised"}


NODES = {"plan_next": plan_next, "screen": screen, "confirm": confirm, "final_ab": final_ab, "adopt": adopt,
         "summarise": summarise}  # fmt: skip


def build_campaign_graph(checkpointer):
    g = StateGraph(CampaignState)
    for name, fn in NODES.items():
        g.add_node(name, fn)
    g.add_edge(START, "plan_next")
    g.add_edge("screen", "plan_next")
    g.add_edge("adopt", "summarise")
    g.add_edge("summarise", END)
    return g.compile(checkpointer=checkpointer)


def thread(cid: str) -> str:
    return f"{cid}@campaign"


def drive(c) -> tuple[CampaignEnd, str]:
    """One pass of the campaign's graph: resumed at the node a kill left it in, else started at plan_next."""
    from kinv.agent.workstream.context import open_checkpointer

    saver = open_checkpointer(c.store, c.s.plan_path)
    try:
        graph = build_campaign_graph(saver)
        config = {"configurable": {"thread_id": thread(c.cid)}, "recursion_limit": RECURSION_LIMIT}
        pending = graph.get_state(config).next
        out = graph.invoke(None if pending else {"end": "done", "line": ""}, config, context=c)
    finally:
        saver.conn.close()
    return out.get("end", "done"), out.get("line", "")
