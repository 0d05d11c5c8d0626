"""The state store: ``<state>/kinv.db``.  The only package that speaks SQL.

sqlite-utils over SQLite in WAL mode with foreign keys on.  The schema only
changes through the numbered migrations (:mod:`.schema`), applied on every open.
Reads use the standard library's sqlite3 directly; sqlite-utils (and what it
imports) is loaded on the first write, so read commands stay fast.

The package: :mod:`.state` (the state dir, its live-patch records and locks), :mod:`.schema` (the migrations),
:mod:`.db` (the :class:`Store`).
"""

from kinv.agent.store.db import Store
from kinv.agent.store.schema import MIGRATIONS, migration
from kinv.agent.store.state import (
    CHECKPOINTS_NAME,
    DB_NAME,
    LIVE_DIR,
    checkpoint_threads,
    earlier_runs,
    live_markers,
    live_patch_line,
    lock_held,
    lock_path,
    now,
    state_dir,
)

__all__ = [
    "CHECKPOINTS_NAME",
    "DB_NAME",
    "LIVE_DIR",
    "MIGRATIONS",
    "Store",
    "checkpoint_threads",
    "earlier_runs",
    "live_markers",
    "live_patch_line",
    "lock_held",
    "lock_path",
    "migration",
    "now",
    "state_dir",
]
