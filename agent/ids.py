"""Workstream ids, ids given on the command line, and timestamps, shared by the plan models, the store and
the read path (standard library only)."""

from __future__ import annotations

import time

from kinv.kernels.errors import BadInput

MAX_ID_CHARS = 64  # the longest id kinv makes is far shorter: '3a-V1-12', '7-adopt', '#12b.REGRW'


def norm_ws(ws_id: str) -> str:
    """'3a' and '#3a' are the same workstream: stored as '#3a'."""
    ws_id = ws_id.strip()
    return ws_id if ws_id.startswith("#") else f"#{ws_id}"


def shown(value: str, limit: int = 40) -> str:
    """A user's value as an error message quotes it: repr (control characters escaped), at most ``limit``
    characters of it, and how long it was when cut."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"


def check_id(value: str, what: str = "id") -> str:
    """An id typed on the command line (a workstream, an approval): refused (BadInput) when it holds
    whitespace or control characters, or is longer than any id kinv makes.  Returns it unchanged."""
    if not value:
        raise BadInput(f"{what} is empty; give one such as 3a (kinv status lists them)")
    if len(value) > MAX_ID_CHARS:
        raise BadInput(f"{what} {shown(value)} is not an id kinv made: ids are at most {MAX_ID_CHARS} characters "
                       "(kinv status lists them)")  # fmt: skip
    if any(c.isspace() or not c.isprintable() for c in value):
        raise BadInput(f"{what} {shown(value)} holds whitespace or a control character; ids are letters, digits, "
                       "'#', '.', '-' and '_' (kinv status lists them)")  # fmt: skip
    return value


def stamp(ts: float | None) -> str:
    """kinv's one timestamp format, everywhere a time is shown: UTC, ``2026-11-29 23:36:44Z``."""
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(ts)) if ts else ""


def state_flag(state_dir) -> str:
    """`` --state-dir DIR`` when the command was given one (else nothing), so that a hint it prints ("continue
    with: kinv resume 3a") runs as printed against the same state dir."""
    if not state_dir:
        return ""
    import shlex

    return f" --state-dir {shlex.quote(str(state_dir))}"


def continue_command(store, ws_id: str, state_dir) -> str:
    """The command that continues workstream ``ws_id``: ``kinv resume WS``, or ``kinv campaign PLAN`` for a workstream
    a campaign runs (the campaign, not the lone workstream, goes on; its adoption's approval is filed under its last
    workstream, which is already closed out)."""
    import os

    row = store.workstream(norm_ws(ws_id)) or {}
    cid = row.get("campaign") or (row.get("parent") if row.get("parent") and store.campaign(row["parent"]) else None)
    camp = store.campaign(cid) if cid else None
    if camp and camp.get("plan_path"):
        path = camp["plan_path"]
        rel = os.path.relpath(path)
        return f"kinv campaign {rel if not rel.startswith('..') else path}{state_flag(state_dir)}"
    return f"kinv resume {norm_ws(ws_id).lstrip('#')}{state_flag(state_dir)}"
