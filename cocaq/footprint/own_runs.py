"""The precision evidence from a user's own runs: per model, precision and batch size, the energy per unit
of work (per 1M tokens, or per epoch) of the runs that count it, and the best reduced-precision group set
against the full-precision one of the same batch size (a larger batch alone can cut the energy per unit:
a comparison that changes both says nothing of precision).

The `precision` rule (cocaq.footprint.rules.precision), over a window and on one job, sizes a saving
on this measured difference before it falls back on the literature's figure; it lives apart from the
rule as the evidence it reads; the model statistics
(cocaq.footprint.by_model) group runs with the same energy-weighted formula. Standard library only.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cocaq.footprint.advice_words import energy, shorten
from cocaq.footprint.jobfacts import JobFacts, precision_of


@dataclass(frozen=True)
class UnitCost:
    """A user's runs of one model in one precision and batch size: energy per unit of work (BASIS of
    cocaq.footprint.by_model: the energy-weighted mean of the runs' kWh per unit)."""

    precision: str  # as recorded: bf16, fp32
    unit: str  # "1M tokens" or "epoch"
    kwh_per_unit: float
    runs: tuple[str, ...]
    energy_kwh: float
    batch_size: int | None = None  # as recorded; None: not recorded


def unit_costs(runs: Iterable[JobFacts], unit: str) -> dict[tuple[str, str, int | None], UnitCost]:
    """Per (model, precision label, batch size): kWh per unit ("1M tokens" or "epoch") of runs with that
    counter."""
    acc: dict[tuple[str, str, int | None], list[tuple[float, float, str]]] = defaultdict(list)
    for j in runs:
        count = (j.tokens / 1e6 if j.tokens else 0.0) if unit == "1M tokens" else (j.epochs or 0.0)
        if not j.model or not j.precision_label or count <= 0 or j.energy_kwh <= 0:
            continue
        acc[(j.model, j.precision_label, j.batch_size)].append((j.energy_kwh, j.energy_kwh / count, j.job_id))
    out = {}
    for key, rs in acc.items():
        e = sum(r[0] for r in rs)
        out[key] = UnitCost(
            key[1], unit, sum(r[0] * r[1] for r in rs) / e, tuple(r[2] for r in rs), e, key[2]
        )
    return out


@dataclass(frozen=True)
class OwnComparison:
    model: str
    reduced: UnitCost
    full: UnitCost

    @property
    def saving(self) -> float:
        f = self.full.kwh_per_unit
        return (f - self.reduced.kwh_per_unit) / f if f > 0 else 0.0

    @property
    def percent(self) -> int:
        """The saving as the one whole percentage every surface says (body, evidence, `cocaq models`)."""
        return round(self.saving * 100)

    def at_batch(self) -> str:
        b = self.full.batch_size
        return f" at batch size {b}" if b is not None else ""

    def sentence(self) -> str:
        r, f = self.reduced, self.full
        per = "per 1M tokens" if r.unit == "1M tokens" else "per epoch"
        return (
            f"your {shorten(self.model, 40)} runs in {r.precision}{self.at_batch()} used "
            f"{energy(r.kwh_per_unit)} {per}, {self.percent}% less than in {f.precision} "
            f"({energy(f.kwh_per_unit)}; runs {', '.join(r.runs[:3])} against {', '.join(f.runs[:3])})"
        )


def own_comparisons(runs: Sequence[JobFacts], min_saving: float = 0.0) -> dict[str, OwnComparison]:
    """Per model: the user's own best reduced-precision group against their full-precision one at the
    same batch size (a comparison that also changes the batch size says nothing of precision), per 1M
    tokens where both count tokens, else per epoch. Of the batch sizes with both, the one with the most
    full-precision energy."""
    out: dict[str, OwnComparison] = {}
    for unit in ("1M tokens", "epoch"):
        costs = unit_costs(runs, unit)
        for model in sorted({m for m, _, _ in costs}):  # (a set's order would follow the hash seed)
            if model in out:
                continue
            groups = [c for (m, _, _), c in costs.items() if m == model]
            pairs = []
            for full in (c for c in groups if precision_of(c.precision)[0] == "full"):
                reduced = [
                    c
                    for c in groups
                    if precision_of(c.precision)[0] == "reduced" and c.batch_size == full.batch_size
                ]
                if reduced:
                    best = min(reduced, key=lambda c: (c.kwh_per_unit, c.precision))
                    pairs.append(OwnComparison(model, best, full))
            if not pairs:
                continue
            cmp = max(pairs, key=lambda p: (p.full.energy_kwh, p.full.precision, str(p.full.batch_size)))
            if cmp.saving >= min_saving:
                out[model] = cmp
    return out
