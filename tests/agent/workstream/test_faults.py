"""Integrity: a changed harness or reference voids a verdict.

The fault drill itself (plans/6a-fault-drill.yaml: each planted fault stopped at its gate, recorded with its
reason, the kernel files byte for byte as before) runs once, as the README's session runs it on a fresh clone,
and is checked there: tests/test_readme.py.
"""

from __future__ import annotations

from kinv.agent.workstream.context import _integrity


def _rows(harness, reference):
    return [{"harness_hash": harness, "reference_hash": reference}]


class _Store:
    def __init__(self, rows):
        self.rows = rows

    def samples(self, exp):
        return self.rows


def test_integrity_voids_a_changed_harness_or_reference_and_passes_an_unchanged_run():
    base = {"harness": "h0", "reference": "r0"}
    assert _integrity(_Store(_rows("h0", "r0")), 1, base) is None
    assert "benchmark harness changed" in _integrity(_Store(_rows("h1", "r0")), 1, base)
    assert "reference changed" in _integrity(_Store(_rows("h0", "r9")), 1, base)
