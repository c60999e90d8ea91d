"""Site-level figures for Prometheus: what `cocaq serve` answers at GET /metrics (docs/api.md).

Per cluster and lab (Slurm account): the jobs that ended in the last 24 h, the kWh and CO2 of the last
day, the jobs running now; the carbon intensity now per zone the cluster's config names, its PUE; and how
the scheduler's jobs ended (`scheduler_runs`). Labs only, never a user's name: Prometheus has no MUNGE,
so what it scrapes is what anyone holding the bearer token may see.

The numbers are the CLI's: the last day is `--since 1d` (cocaq.timeparse.parse_when), its kWh and CO2
per lab come from cocaq.footprint.totals.group_totals (the query behind `cocaq lab ACCOUNT --since 1d`,
rollups and the shared window share), and the intensity now is cocaq.carbon.intensity's choice for the
zone (the imported series, else its nearest value within the gap tolerance, else the zone's annual
figure). Each scrape reads the database afresh; a collector with no state, so a lab or zone that is gone
leaves no stale series.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from cocaq.footprint.totals import Window, group_totals
from cocaq.timeparse import parse_when

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric
    from sqlalchemy import Connection

    from cocaq.config import Config
    from cocaq.db.dbapi import Db

LAST_DAY = "1d"  # the window of the lab figures, in `cocaq lab --since` words

# name -> (type, help): every series GET /metrics exposes (tests/test_grafana_dashboard.py reads these)
METRICS: dict[str, tuple[str, str]] = {
    "cocaq_lab_jobs_last_day": ("gauge", "Jobs of the lab that ended in the last 24 h"),
    "cocaq_lab_energy_last_day_kwh": (
        "gauge",
        "Energy of the lab's jobs over the last 24 h, kWh (the share of each job's run inside the window, "
        "as `cocaq lab --since 1d`)",
    ),
    "cocaq_lab_co2_last_day_kg": ("gauge", "Operational CO2 of the lab's jobs over the last 24 h, kg"),
    "cocaq_running_jobs": ("gauge", "Jobs of the lab running now (as the last reconcile saw them)"),
    "cocaq_carbon_intensity_grams_per_kwh": (
        "gauge",
        "Carbon intensity now, g CO2/kWh: the imported series, else the zone's annual figure",
    ),
    "cocaq_pue": ("gauge", "Power usage effectiveness of the cluster now"),
    "cocaq_scheduler_runs_total": ("counter", "Runs of each scheduler task in scheduler_runs, by outcome"),
    "cocaq_scheduler_last_run_timestamp_seconds": (
        "gauge",
        "When the scheduler job last ended with this outcome (its start while running), unix seconds",
    ),
}


@dataclass(frozen=True)
class LabDay:
    """One lab on one cluster: the last day's figures and its running jobs."""

    cluster: str
    account: str
    jobs_ended: int = 0
    energy_kwh: float = 0.0
    co2_kg: float = 0.0
    running: int = 0


@dataclass(frozen=True)
class SchedulerOutcome:
    task: str  # the scheduler's job (its name in scheduler_runs): `task`, as Prometheus keeps `job`
    outcome: str
    runs: int
    last_s: float


@dataclass
class Site:
    """What one scrape reads."""

    labs: list[LabDay] = field(default_factory=list)
    intensity: list[tuple[str, str, float]] = field(default_factory=list)  # (cluster, zone, g/kWh)
    pue: list[tuple[str, float]] = field(default_factory=list)  # (cluster, PUE)
    scheduler: list[SchedulerOutcome] = field(default_factory=list)


def last_day(now: datetime) -> Window:
    """The window `cocaq lab --since 1d` reads at `now`."""
    return Window(parse_when(LAST_DAY, now, UTC), now)


def lab_days(db: Db, w: Window) -> list[LabDay]:
    """Per cluster and lab: jobs that ended in `w`, the window's kWh and CO2 (group_totals), jobs running."""
    labs: dict[tuple[str, str], dict[str, Any]] = {}
    clusters = [str(r[0]) for r in db.rows("SELECT name FROM clusters ORDER BY name")]
    for cluster in clusters:
        for row in group_totals(db, w, "account", cluster=cluster):
            d = labs.setdefault((cluster, str(row["account"])), {})
            d["energy_kwh"], d["co2_kg"] = float(row["energy_kwh"]), float(row["co2_kg"])
    counts = db.rows(
        """SELECT c.name, coalesce(j.account, ''),
       sum(CASE WHEN j.is_open THEN 1 ELSE 0 END),
       sum(CASE WHEN NOT j.is_open AND j.end_time >= %(since)s AND j.end_time < %(until)s THEN 1 ELSE 0 END)
FROM jobs j JOIN clusters c ON c.id = j.cluster_id
WHERE j.is_open OR (j.end_time >= %(since)s AND j.end_time < %(until)s)
GROUP BY c.name, coalesce(j.account, '')""",
        {"since": w.since, "until": w.until},
    )
    for cluster, account, running, ended in counts:
        d = labs.setdefault((str(cluster), str(account)), {})
        d["running"], d["jobs_ended"] = int(running or 0), int(ended or 0)
    return [LabDay(c, a, **d) for (c, a), d in sorted(labs.items())]


def zones(cfg: Config) -> list[str]:
    """The carbon zones the config gives this cluster's jobs: the cluster's and any profile's override."""
    hws = [cfg.default_hardware, *cfg.partitions.values(), *(g.hardware for g in cfg.node_groups)]
    return sorted({cfg.cluster.carbon_zone} | {hw.carbon_zone for hw in hws if hw.carbon_zone})


def intensity_now(conn: Connection, cfg: Config, now: datetime) -> list[tuple[str, str, float]]:
    """(cluster, zone, g/kWh) now: the value the aggregator's choice gives that instant
    (cocaq.carbon.intensity.IntensityIndex.point, with the configured basis and gap tolerance)."""
    from cocaq.carbon.intensity import IntensityIndex

    zs = zones(cfg)
    index = IntensityIndex.load(conn, zs, now, now, cfg.carbon.basis, cfg.carbon.gap_tolerance_s)
    return [(cfg.cluster.name, z, index.point(z, now).g_per_kwh) for z in zs]


def scheduler_outcomes(db: Db) -> list[SchedulerOutcome]:
    rows = db.rows(
        "SELECT job_id, status, count(*), max(coalesce(finished_at, started_at)) FROM scheduler_runs "
        "GROUP BY job_id, status ORDER BY job_id, status"
    )
    out = []
    for job, status, n, last in rows:
        when = db.timestamp(last)
        out.append(SchedulerOutcome(str(job), str(status), int(n), when.timestamp() if when else 0.0))
    return out


def read_site(db: Db, conn: Connection, cfg: Config, now: datetime) -> Site:
    """Everything one scrape shows, read at `now`."""
    return Site(
        labs=lab_days(db, last_day(now)),
        intensity=intensity_now(conn, cfg, now),
        pue=[(cfg.cluster.name, cfg.pue_at(cfg.default_hardware, now))],
        scheduler=scheduler_outcomes(db),
    )


class SiteCollector:
    """A prometheus_client collector that reads the site at each scrape (`read`)."""

    def __init__(self, read: Callable[[], Site]) -> None:
        self.read = read

    def describe(self) -> list[Metric]:
        return []  # (registering must not read the database)

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        site = self.read()

        def gauge(name: str, labels: list[str]) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, METRICS[name][1], labels=labels)

        jobs = gauge("cocaq_lab_jobs_last_day", ["cluster", "account"])
        kwh = gauge("cocaq_lab_energy_last_day_kwh", ["cluster", "account"])
        co2 = gauge("cocaq_lab_co2_last_day_kg", ["cluster", "account"])
        running = gauge("cocaq_running_jobs", ["cluster", "account"])
        for lab in site.labs:
            key = [lab.cluster, lab.account]
            jobs.add_metric(key, lab.jobs_ended)
            kwh.add_metric(key, lab.energy_kwh)
            co2.add_metric(key, lab.co2_kg)
            running.add_metric(key, lab.running)
        yield from (jobs, kwh, co2, running)
        ci = gauge("cocaq_carbon_intensity_grams_per_kwh", ["cluster", "zone"])
        for cluster, zone, g in site.intensity:
            ci.add_metric([cluster, zone], g)
        yield ci
        pue = gauge("cocaq_pue", ["cluster"])
        for cluster, v in site.pue:
            pue.add_metric([cluster], v)
        yield pue
        runs = CounterMetricFamily(
            "cocaq_scheduler_runs", METRICS["cocaq_scheduler_runs_total"][1], labels=["task", "outcome"]
        )
        last = gauge("cocaq_scheduler_last_run_timestamp_seconds", ["task", "outcome"])
        for s in site.scheduler:
            runs.add_metric([s.task, s.outcome], s.runs)
            last.add_metric([s.task, s.outcome], s.last_s)
        yield from (runs, last)


def exposition(read: Callable[[], Site], accept: str | None) -> tuple[bytes, str]:
    """(body, content type): OpenMetrics where the scraper's Accept asks for it, else the text format."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import choose_encoder

    registry = CollectorRegistry(auto_describe=False)
    registry.register(SiteCollector(read))
    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type
