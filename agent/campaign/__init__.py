"""Autonomous campaigns: kinv writes and runs the next workstreams itself (``kinv campaign PLAN``).

A campaign plan is a workstream plan with a ``campaign:`` section (plans/7-decode-ceiling.yaml).  From the
plan's baseline, the campaign repeats, within its budget and under the approval policy:

1. **Pick** the top backlog item it can express as a search: an item with ``tunables`` inside the campaign's
   space (the plan's tunables).  The planner ranks the backlog on the evidence so far
   (agent.planner.recommend); items it cannot express (OEA, a kernel rewrite) stay recommendations.
2. **Screen** candidates proposed by Optuna's ask/tell (agent/campaign/search.py: a grid when the item's space
   fits the trial budget, TPE otherwise; the studies in ``<state>/optuna.db`` are the sampler's memory, and
   every candidate's outcome is a row of kinv.db's screened table).  A candidate varies the item's tunables
   and keeps the incumbent's other values at every level.  The resource model prunes infeasible ones
   before any GPU time; the rest get a few paired rounds against the incumbent at every level.
3. **Confirm** the finalists (the best screened candidate at each level) in a workstream of their own
   (#7a, #7b, ...): a plan file a person could have written, run through the same graph as ``kinv run``
   (noise, approvals, correctness, sequential A/B with agent/tools/measure/stats.py, close-out).  Its baseline is the
   incumbent, measured from the plan (``baseline_on_disk: false``): nothing is written to the live file.
4. **Adopt in the campaign** only what was confirmed: at each level, the finalist with the largest
   confirmed improvement there becomes the incumbent (a level-conditional config when levels differ).

It stops when the goal is met (a fraction of copy bandwidth, or of the bound the kernel's adapter names:
:meth:`KernelAdapter.roofline`), the budget is spent, the workstream cap is reached, or no expressible item
is left.  Then a last workstream measures the final config against the starting baseline (on disk, or from the plan with ``baseline_on_disk: false``; the
evidence for the change), and the campaign proposes it through the approval gate: with ``--approval
auto`` it is written as a journaled patch with a commit message citing every close-out; otherwise an
approval waits in ``kinv pending`` and the next ``kinv campaign PLAN`` writes it once approved.

A campaign resumes where it stopped: its row in kinv.db holds the incumbent and the steps, each
workstream resumes from its own checkpoints, and a screening from its screened rows.
"""

