"""Did a variant move what its hypothesis is about?  Its premise, level by level, from the compiled kernel and the
profile.

A variant's ``targets`` names a quantity kinv can measure (:data:`BUILTIN`, or one its kernel's adapter declares
in ``KernelAdapter.premises``): warps per SM and achieved occupancy for ``occupancy``, stages in flight for
``pipelining``, the tile and MMA shape for ``tile_shape``, CTAs (with waves and splits) for ``parallelism``, DRAM
bytes per item for ``bytes_moved``.  :func:`check` reads it for the baseline and the variant at each level and
says, per level, one of :class:`~kinv.agent.words.PremiseOutcome`: moved in the predicted direction (*tested*),
moved the other way, not moved (then the variant's verdict there says nothing about the hypothesis), or *not
measured* (no compiled or profiled figures: the command backend, the interpreter).  Where a profile reads the
quantity at a level (achieved occupancy), the profile decides there: it saw what ran.

Pure: figures in, :class:`PremiseCheck` out; :mod:`kinv.agent.workstream.collect` gathers the figures once.
"""

from __future__ import annotations

from dataclasses import dataclass

from kinv.agent.words import PremiseOutcome, Target
from kinv.kernels.adapter import Premise

#: targets that name no quantity kinv measures: their variants' verdicts are taken as they stand
NO_PREMISE = (Target.ROOFLINE_GAP, Target.ELSEWHERE)


def _compiled(f: dict) -> dict | None:
    c = f.get("compiled")
    return c if isinstance(c, dict) and c else None


def _warps(f: dict):
    c = _compiled(f)
    if c is None or c.get("warps_per_sm") is None:
        return None
    ctas = c.get("ctas_per_sm")
    w = (f.get("params") or {}).get("num_warps") or (c["warps_per_sm"] // ctas if ctas else "?")
    return c["warps_per_sm"], f"{ctas} CTAs × {w} warps"


def _achieved(f: dict):
    p = f.get("profile")
    if not p or p.get("achieved_occupancy_pct") is None:
        return None
    return p["achieved_occupancy_pct"], ""


def _stages(f: dict):
    n = (f.get("params") or {}).get("num_stages")
    return None if _compiled(f) is None or n is None else (n, "")


def _tile(f: dict):
    why, params = f.get("why") or {}, f.get("params") or {}
    if _compiled(f) is None:
        return None
    tile = why.get("tile") or "/".join(f"{k}{v}" for k, v in params.items() if k.startswith("BLOCK_"))
    if not tile:
        return None
    return (f"{tile}, MMA {why['mma_tile']}" if why.get("mma_tile") else tile), ""


def _ctas(f: dict):
    c, why = _compiled(f), f.get("why") or {}
    if c is None or why.get("ctas") is None:
        return None
    parts = [f"{why['num_splits']} splits" if why.get("num_splits") is not None else "",
             f"{c['waves']} waves" if c.get("waves") is not None else ""]  # fmt: skip
    return why["ctas"], ", ".join(x for x in parts if x)


def _bytes(f: dict):
    p, items = f.get("profile"), f.get("items")
    if not p or p.get("dram_bytes") is None or not items:
        return None
    return round(p["dram_bytes"] / items), ""


#: kinv's own premises: the compiled reading first, then the profiled one (which decides where it reads)
BUILTIN: dict[str, tuple[Premise, ...]] = {
    Target.OCCUPANCY: (Premise("warps per SM", "up", _warps),
                       Premise("achieved occupancy", "up", _achieved, tolerance=2.0)),
    Target.PIPELINING: (Premise("stages in flight", "up", _stages),),
    Target.TILE_SHAPE: (Premise("tile shape", "changed", _tile),),
    Target.PARALLELISM: (Premise("CTAs", "up", _ctas),),
    Target.BYTES_MOVED: (Premise("DRAM bytes per item", "down", _bytes, tolerance=0.02),),
}  # fmt: skip
#: how a person would test each premise when no variant did (the planner's proposal)
PROPOSALS: dict[str, str] = {
    Target.OCCUPANCY: "raise warps per SM one of two ways: more CTAs per SM (fewer registers per thread through a "
                      "register cap such as maxnreg, or a smaller tile), or more warps per CTA with a cap that keeps "
                      "the CTAs per SM (e.g. num_warps 8 with maxnreg 64); check the compiled table shows the rise "
                      "before timing",
    Target.PIPELINING: "raise num_stages where shared memory leaves room, and check the compiled kernel keeps its CTAs",
    Target.TILE_SHAPE: "change the tile (BLOCK sizes) so the compiled MMA shape changes",
    Target.PARALLELISM: "change the split rule or the tile so the grid's CTAs (and waves) change",
    Target.BYTES_MOVED: "cut the bytes each item reads (a narrower KV, fused reads), and profile the DRAM bytes",
}  # fmt: skip


def premises_of(target: str | None, adapter=None) -> tuple[Premise, ...]:
    """The readings of ``target``: kinv's, or the adapter's own; none for a target with no premise."""
    if target is None or target in NO_PREMISE:
        return ()
    if target in BUILTIN:
        return BUILTIN[target]
    own = (getattr(adapter, "premises", None) or {}).get(target)
    return (own,) if own is not None else ()


def words(target: str) -> str:
    """A target in a person's words: ``tile_shape`` -> "tile shape"."""
    return str(target).replace("_", " ")


@dataclass(frozen=True)
class Reading:
    """One quantity at one level: baseline -> variant, with what it is made of."""

    quantity: str
    label: str
    base: object
    variant: object
    base_detail: str = ""
    variant_detail: str = ""
    unit: str = ""
    profiled: bool = False

    def text(self) -> str:
        def show(x):
            if isinstance(x, float):
                x = f"{x:.3g}" if abs(x) < 100 else f"{x:,.0f}"
            elif isinstance(x, int):
                x = f"{x:,}"
            return f"{x}{self.unit}"

        detail = ""
        if self.base_detail or self.variant_detail:
            detail = (f" ({self.base_detail})" if self.base_detail == self.variant_detail
                      else f" ({self.base_detail} → {self.variant_detail})")  # fmt: skip
        return f"{show(self.base)} → {show(self.variant)}{detail}"


def _moved(p: Premise, b, v) -> str:
    """``same``, ``up``, ``down`` or ``changed`` (a shape)."""
    if isinstance(b, (int, float)) and isinstance(v, (int, float)) and not isinstance(b, bool):
        tol = p.tolerance * abs(b) if p.quantity.startswith("DRAM bytes") else p.tolerance
        return "same" if abs(v - b) <= tol else "up" if v > b else "down"
    return "same" if b == v else "changed"


def _outcome(p: Premise, how: str) -> PremiseOutcome:
    if how == "same":
        return PremiseOutcome.NOT_MOVED
    if p.direction == "changed" or how == p.direction or how == "changed":
        return PremiseOutcome.TESTED
    return PremiseOutcome.OPPOSITE


@dataclass(frozen=True)
class PremiseCheck:
    """A decided variant's premise: per level, whether it moved, and the figures that say so."""

    variant: str
    target: str
    quantity: str
    outcomes: tuple[tuple[str, str], ...]  # (level label, PremiseOutcome), every level of the plan
    readings: tuple[Reading, ...] = ()

    def at(self, label: str) -> str:
        return dict(self.outcomes).get(label, PremiseOutcome.NOT_MEASURED)

    @property
    def outcome(self) -> str:
        """The variant's outcome where every measured level agrees; ``partly`` where they do not."""
        known = {o for _, o in self.outcomes if o != PremiseOutcome.NOT_MEASURED}
        if not known:
            return PremiseOutcome.NOT_MEASURED
        return known.pop() if len(known) == 1 else "partly"

    @property
    def tested(self) -> bool:
        """Moved as predicted at one level or more."""
        return any(o == PremiseOutcome.TESTED for _, o in self.outcomes)

    @property
    def speaks(self) -> bool:
        """Whether the variant's verdict speaks to its premise somewhere: it moved it as predicted at a level, or a
        level's figures are missing (then the verdict is taken as it stands, and said so)."""
        return any(o in (PremiseOutcome.TESTED, PremiseOutcome.NOT_MEASURED) for _, o in self.outcomes)

    def line(self) -> str:
        """``Premise (occupancy): warps per SM 16 → 16 at b32 (4 CTAs × 4 warps → 2 CTAs × 8 warps); ...; did not
        move: V1's verdict says nothing about occupancy.``"""
        about = words(self.target)
        head = f"Premise ({about}, {self.quantity})"
        if not self.readings:
            return (f"{head}: not measured (no compiled or profiled figures of {self.variant} and the baseline); "
                    f"its verdict is taken as it stands.")  # fmt: skip
        groups: dict[tuple[str, str], list[str]] = {}
        for r in self.readings:
            groups.setdefault((r.quantity + (" (profiled)" if r.profiled else ""), r.text()), []).append(r.label)
        parts = [f"{q} {t} at {', '.join(labels)}" for (q, t), labels in groups.items()]
        by: dict[str, list[str]] = {}
        for label, o in self.outcomes:
            by.setdefault(o, []).append(label)
        o = self.outcome
        if o == PremiseOutcome.TESTED:
            end = f"moved as predicted: {self.variant} tested its premise"
        elif o == PremiseOutcome.NOT_MOVED:
            end = f"did not move: {self.variant}'s verdict says nothing about {about}"
        elif o == PremiseOutcome.OPPOSITE:
            end = f"moved the other way: {self.variant}'s verdict says nothing for or against the hypothesis"
        else:
            said = "; ".join(f"{'moved as predicted' if k == PremiseOutcome.TESTED else k} at {', '.join(v)}"
                             for k, v in by.items() if k != PremiseOutcome.NOT_MEASURED)  # fmt: skip
            end = f"{said}: only where it moved as predicted does {self.variant}'s verdict speak to {about}"
        gap = by.get(PremiseOutcome.NOT_MEASURED)
        if gap and o != PremiseOutcome.NOT_MEASURED:
            end += f" (not measured at {', '.join(gap)})"
        return f"{head}: {'; '.join(parts)}; {end}."


def check(variant: str, target: str | None, levels: list[tuple[str, dict, dict]], adapter=None,
          unit_of_items: str = "item") -> PremiseCheck | None:  # fmt: skip
    """The premise of ``variant`` (its ``target``) over ``levels``: ``(label, baseline figures, variant figures)``,
    each figures dict as :class:`kinv.kernels.adapter.Premise` reads it.  None for a target with no premise."""
    readers = premises_of(target, adapter)
    if not readers:
        return None
    outcomes, readings = [], []
    for label, base, var in levels:
        decided = PremiseOutcome.NOT_MEASURED
        for i, p in enumerate(readers):
            rb, rv = p.read(base or {}), p.read(var or {})
            if rb is None or rv is None:
                continue
            quantity = p.quantity.replace("per item", f"per {unit_of_items}")
            unit = "%" if "occupancy" in quantity else ""
            readings.append(Reading(quantity, label, rb[0], rv[0], rb[1], rv[1], unit, profiled=i > 0))
            decided = _outcome(p, _moved(p, rb[0], rv[0]))  # a later (profiled) reading decides where it reads
        outcomes.append((label, decided))
    quantity = " and ".join(dict.fromkeys(p.quantity.replace("per item", f"per {unit_of_items}") for p in readers))
    return PremiseCheck(variant, str(target), quantity, tuple(outcomes), tuple(readings))


__all__ = ["BUILTIN", "NO_PREMISE", "PROPOSALS", "PremiseCheck", "Reading", "check", "premises_of", "words"]
