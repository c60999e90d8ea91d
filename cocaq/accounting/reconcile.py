"""Reconciling with Slurm: final states and missed jobs from sacct, then the nodes' measurements joined.

Run by hand (`cocaq reconcile`) and every few minutes by the scheduler. Idempotent: the import skips
records whose facts did not change, and linking only touches what is not linked yet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import Engine

from cocaq.config import Config


@dataclass
class ReconcileSummary:
    sacct_kind: str | None = None  # json / parsable / pyslurm, None when Slurm was not asked
    label: str = ""  # what read Slurm: "sacct json", "sacct parsable", "pyslurm slurmdbd"
    note: str = ""  # "auto"'s choice and why
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
                f"{self.label.replace(' ', ' (', 1)}): {self.inserted:,} new jobs, {self.updated:,} updated,"
                f" {self.unchanged:,} unchanged"
                + (f", skipped {sum(self.skipped.values()):,}" if self.skipped else "")
            )
        if self.note:
            out.append(self.note)
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
    backend: str | None = None,
) -> ReconcileSummary:
    """`backend`: "auto", "cli" or "pyslurm" (None: the config's [slurm] backend)."""
    from cocaq.accounting import measured

    res = ReconcileSummary()
    if use_sacct:
        from cocaq.accounting.importer import import_records
        from cocaq.slurm.backend import read_accounting

        acct = read_accounting(cfg, since, until, all_users=True, backend=backend, sacct=sacct)
        s = import_records(engine, acct.records, cfg, source=acct.source)
        res.sacct_kind, res.label, res.note = acct.kind, acct.label, acct.note
        res.inserted, res.updated, res.unchanged = s.inserted, s.updated, s.unchanged
        res.skipped = dict(acct.stats.skipped)
    link = measured.refresh(engine, cfg, since=since - measured.MARGIN)
    res.events_linked, res.events_unmatched, res.jobs_measured = (
        link.events_linked,
        link.events_unmatched,
        link.jobs_measured,
    )
    res.models = link.models
    return res
