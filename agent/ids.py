"""Workstream ids, shared by the plan models and the read path (standard library only)."""

from __future__ import annotations


def norm_ws(ws_id: str) -> str:
    """'3a' and '#3a' are the same workstream: stored as '#3a'."""
    ws_id = ws_id.strip()
    return ws_id if ws_id.startswith("#") else f"#{ws_id}"
