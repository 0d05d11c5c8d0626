"""kinv.db's regressions tables: every ``kinv regress`` comparison of two revisions, and its verdict at each kernel
and level (the history ``kinv regress --history KERNEL`` reads)."""

from __future__ import annotations

from kinv.agent.store.state import now


class RegressRows:
    """The regressions tables' reads and writes (a part of Store: it uses the Store's connection)."""

    def new_regression(self, **row) -> int:
        """A comparison begins: its revisions, backend and repository; returns its id."""
        row.setdefault("started", now())
        row.setdefault("outcome", "running")
        return self._insert("regressions", row)

    def finish_regression(self, reg_id: int, **values) -> None:
        """How a comparison ended (outcome, exit code, machine, GPU and wall seconds, close-out path)."""
        self._update("regressions", reg_id, {"finished": now(), **values})

    def add_regress_levels(self, reg_id: int, rows: list[dict]) -> None:
        """One comparison's verdicts for one kernel, every level at once."""
        t = now()
        with self.db.conn:
            self.db["regress_levels"].insert_all([{**r, "regression": reg_id, "t": t} for r in rows])

    def regression(self, reg_id: int) -> dict | None:
        return self._one("regressions", reg_id)

    def regress_levels(self, reg_id: int) -> list[dict]:
        return self._rows("regress_levels", "regression = ?", [reg_id], order_by="id")

    def regress_history(self, kernel: str) -> list[dict]:
        """Every stored verdict of ``kernel``, oldest comparison first, each with its comparison's revisions, date
        and machine."""
        return self._query(
            "select l.*, r.base, r.base_sha, r.base_date, r.head, r.head_sha, r.head_date, r.head_dirty, r.backend, "
            "r.machine, r.device, r.started from regress_levels l join regressions r on r.id = l.regression "
            "where l.kernel = ? order by r.started, l.id", [kernel])  # fmt: skip

    def regressed_kernels(self) -> list[str]:
        """The kernels with a stored verdict (for a history asked of another)."""
        return [r["kernel"] for r in self._query("select distinct kernel from regress_levels order by kernel")]
