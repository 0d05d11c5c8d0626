"""Workstream ids and timestamps, shared by the plan models, the store and the read path (standard library only)."""

from __future__ import annotations

import time


def norm_ws(ws_id: str) -> str:
    """'3a' and '#3a' are the same workstream: stored as '#3a'."""
    ws_id = ws_id.strip()
    return ws_id if ws_id.startswith("#") else f"#{ws_id}"


def stamp(ts: float | None) -> str:
    """kinv's one timestamp format, everywhere a time is shown: UTC, ``2026-11-29 23:36:44Z``."""
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(ts)) if ts else ""
