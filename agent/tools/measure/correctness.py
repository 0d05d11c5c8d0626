"""The correctness gate's result, recorded: stored on the experiment, and an incorrect variant rejected there and then.

The gate itself runs where the backend runs it (``Backend.check``: in a benchmark worker or a check's own process,
agent/tools/worker/gate.py) and is judged by the judge (agent/tools/worker/judge.py); this is the driver's half."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kinv.agent.store.db import Store


def record(store: Store, ws_id: str | None, experiment: int, result: dict) -> None:
    """Store the result on the experiment; an incorrect variant is rejected there and then."""
    store.update_experiment(experiment, correctness=result)
    if result["ok"]:
        n = len(result["levels"])
        ran = sum(1 for e in result["levels"] if not e.get("same_as"))
        runs = f"; {ran} distinct stand-in launch(es)" if ran != n else ""
        store.event(ws_id, "correctness.ok", f"correct at {n} level(s) ({result['device']}, {result['dtype']}{runs})",
                    {"experiment": experiment})  # fmt: skip
        return
    reason = f"incorrect: {result['reason']}"
    store.update_experiment(experiment, status="rejected", verdict="reject", reason=reason)
    store.event(ws_id, "correctness.failed", reason, {"experiment": experiment})
