"""Plausibility of a timed level: no kernel outruns its roofline.

Bytes moved and FLOPs come from the adapter (``KernelAdapter.bytes_moved`` and ``flops``, what one call must at
least move and compute).  A level where either arm's median time implies more than ``COPY_MARGIN`` times the
device's measured copy bandwidth, or more than its matrix peak, is flagged: the timer missed work (a side stream,
a patched timer), the kernel skipped work the check did not see, or its inputs came from L2.  So is a level whose
timed working set fits in L2 (the rotation that keeps device-memory reads honest did not happen).  A flagged level
is never decided: the variant's verdict is void, and the close-out says which levels and why.
"""

from __future__ import annotations

COPY_MARGIN = 1.10  # a kernel streams at most as fast as a device-to-device copy (within the copy's own noise)


def flags(adapter, levels, rows: list[dict], copy_gbps: float | None, matrix_tflops: float | None,
          timed: dict | None = None) -> dict[str, str]:  # fmt: skip
    """``{level key: why}`` for every implausible level of ``rows`` (verdict rows: ``level``, ``base_us``,
    ``variant_us``); ``timed`` is ``{level: {working_set, l2_bytes}}`` from the arms' set-ups where known."""
    by = {lv.key: lv for lv in levels}
    out: dict[str, str] = {}
    for row in rows:
        lv = by.get(row["level"])
        if lv is None:
            continue
        why = []
        for arm, us in (("baseline", row.get("base_us")), ("variant", row.get("variant_us"))):
            if not us or us <= 0:
                continue
            gbps = adapter.bytes_moved(lv) / (us * 1e-6) / 1e9
            tflops = adapter.flops(lv) / (us * 1e-6) / 1e12
            if copy_gbps and gbps > COPY_MARGIN * copy_gbps:
                why.append(f"the {arm} moves {gbps:,.0f} GB/s in {us:.2f} µs, above the copy bandwidth "
                           f"({copy_gbps:,.0f} GB/s)")  # fmt: skip
            if matrix_tflops and tflops > matrix_tflops:
                why.append(f"the {arm} computes {tflops:,.0f} TFLOP/s, above the matrix peak ({matrix_tflops:,.0f})")
        t = (timed or {}).get(lv.key) or {}
        if t.get("working_set") and t.get("l2_bytes") and t["working_set"] <= t["l2_bytes"]:
            why.append(f"its timed working set ({t['working_set'] / 2**20:.1f} MiB) fits in L2 "
                       f"({t['l2_bytes'] / 2**20:.0f} MiB), so its reads need not reach device memory")  # fmt: skip
        if why:
            out[lv.key] = "; ".join(why)
    return out


def void_reason(flagged: dict[str, str], label: dict[str, str] | None = None) -> str:
    """The void verdict's reason: each flagged level and why."""
    parts = [f"{(label or {}).get(k, k)}: {why}" for k, why in flagged.items()]
    return "implausible timing, faster than the roofline allows, so no level is decided (" + "; ".join(parts) + ")"


__all__ = ["COPY_MARGIN", "flags", "void_reason"]
