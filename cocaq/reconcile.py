"""Reconciling with Slurm: final states and missed jobs from sacct, then the nodes' measurements joined.

Run by hand (`cocaq reconcile`) and every few minutes by the scheduler. Idempotent: the import skips
records whose facts did not change, and linking only touches what is not linked yet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Engine

from cocaq.config import Config


@dataclass
class ReconcileSummary:
    sacct_kind: str | None = None  # json / parsable, None when sacct was not asked
    inserted: int = 0
    updated: int = 0
    unchanged: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    events_linked: int = 0
    events_unmatched: int = 0
    jobs_measured: int = 0
    models: int = 0

    def lines(self) -> list[str]:
        out = []
        if self.sacct_kind is not None:
            out.append(
                f"sacct ({self.sacct_kind}): {self.inserted:,} new jobs, {self.updated:,} updated,"
                f" {self.unchanged:,} unchanged"
                + (f", skipped {sum(self.skipped.values()):,}" if self.skipped else "")
            )
        out.append(
            f"linked {self.events_linked:,} node records; {self.events_unmatched:,} not matched to a job yet;"
            f" {self.jobs_measured:,} jobs with measured energy; {self.models:,} jobs' model metadata written"
        )
        return out


def reconcile(
    engine: Engine,
    cfg: Config,
    since: datetime,
    until: datetime,
    *,
    sacct: str | None = None,
    use_sacct: bool = True,
) -> ReconcileSummary:
    from cocaq import measured

    res = ReconcileSummary()
    if use_sacct:
        from cocaq.importer import import_records
        from cocaq.slurm import sacct as sacct_mod
        from cocaq.slurm.run import run_sacct

        kind, data, delimiter = run_sacct(since, until, all_users=True, sacct=sacct)
        stats = sacct_mod.ParseStats()
        records: Any
        if kind == "json":
            records = sacct_mod.iter_json(data, default_cluster=cfg.cluster.name, stats=stats)
        else:
            records = sacct_mod.iter_parsable(
                data.splitlines(keepends=True),
                tz=cfg.tz(),
                delimiter=delimiter,
                default_cluster=cfg.cluster.name,
                stats=stats,
            )
        s = import_records(engine, records, cfg, source=f"sacct-{kind}")
        res.sacct_kind = kind
        res.inserted, res.updated, res.unchanged = s.inserted, s.updated, s.unchanged
        res.skipped = dict(stats.skipped)
    link = measured.refresh(engine, cfg, since=since - measured.MARGIN)
    res.events_linked, res.events_unmatched, res.jobs_measured = (
        link.events_linked,
        link.events_unmatched,
        link.jobs_measured,
    )
    res.models = link.models
    return res
