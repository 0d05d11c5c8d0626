"""The state store: ``<state>/kinv.db``.  The only package that speaks SQL.

sqlite-utils over SQLite in WAL mode with foreign keys on.  The schema only
changes through the numbered migrations (:mod:`.schema`), applied on every open.
Reads use the standard library's sqlite3 directly; sqlite-utils (and what it
imports) is loaded on the first write, so read commands stay fast.

The package: :mod:`.state` (the state dir, its live-patch records and locks), :mod:`.schema` (the migrations),
:mod:`.db` (the :class:`~.db.Store`), :mod:`.screened` and :mod:`.regressions` (its row types).  Import
each name from the module that defines it; this package re-exports nothing.
"""

