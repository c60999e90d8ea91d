"""The monthly reports' data layer (reports/data.py) on a hand-built month, on SQLite and PostgreSQL.

The month is March 2025 (February before it): five users in two labs on two clusters, jobs across both
month edges, a zero-length job, a running job, failed/cancelled/timed-out jobs, GPU samples (one job with
one busy and one idle GPU, idle notebooks, busy training), an intensity series for part of the month,
a monthly PUE, embodied CO2, model metadata. Expected figures are computed here from the `jobs` rows
(pro rata by hand), never from the rollups the code reads.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields, is_dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import Engine, insert, select, text

from cocaq.accounting.aggregate import run_aggregate
from cocaq.accounting.importer import import_records
from cocaq.config import Config
from cocaq.db.engine import make_engine
from cocaq.db.schema import CarbonIntensity, Cluster, ModelMetadata, Sample
from cocaq.errors import UsageError
from cocaq.footprint.by_model import model_stats
from cocaq.footprint.jobfacts import precision_of
from cocaq.reports import admin_report, data, job_report, lab_report, queries, user_report
from cocaq.slurm.record import JobRecord
from tests import builders
from tests.conftest import migrated_database

MONTH = datetime(2025, 3, 1, tzinfo=UTC)
NEXT = datetime(2025, 4, 1, tzinfo=UTC)
PREV = datetime(2025, 2, 1, tzinfo=UTC)
H = 3600.0


def config(tmp: Path, url: str, extra: str = "") -> Config:
    return builders.config(
        tmp, url, extra, cluster={"carbon_zone": "FR", "pue": 1.2, "pue_monthly": {"2025-02": 1.5}},
        embodied={"g_per_gpu_hour": 10}, collector={"interval_s": 60},
    )  # fmt: skip


def job(
    raw: int,
    start: datetime,
    hours: float,
    *,
    user: str,
    account: str,
    gpus: int = 1,
    limit_h: float | None = None,
    name: str | None = None,
    **kw: Any,
) -> JobRecord:
    """A job on n1: a CPU-partition one without GPUs, named job<raw> unless `name`; `limit_h`: its limit."""
    return builders.job(
        raw, start, hours, user=user, account=account, partition="gpu" if gpus else "cpu", gpus=gpus,
        time_limit_s=limit_h * H if limit_h else None, name=name or f"job{raw}", **kw,
    )  # fmt: skip


def gpu_samples(
    engine: Engine,
    raw: int,
    start: datetime,
    minutes: int,
    devices: dict[str, tuple[float, float]] | dict[str, list[tuple[float, float]]],
    *,
    cluster: str = "c",
    step_s: int = 60,
    node: str = "n1",
) -> None:
    """nvml samples every `step_s` for `minutes`: per device a constant (power W, util %) or a list."""
    with engine.begin() as c:
        cid = c.execute(select(Cluster.id).where(Cluster.name == cluster)).scalar_one()
        rows = []
        for dev, v in devices.items():
            for i in range(minutes * 60 // step_s):
                p, u = v[i] if isinstance(v, list) else v
                base = {"ts": start + timedelta(seconds=step_s * i), "cluster_id": cid, "node": node,
                        "source": "nvml", "device": dev, "job_id": str(raw)}  # fmt: skip
                rows.append({**base, "metric": "power_w", "value": p})
                rows.append({**base, "metric": "util_pct", "value": u})
        for i in range(0, len(rows), 5000):
            c.execute(insert(Sample), rows[i : i + 5000])


def series(engine: Engine, zone: str, start: datetime, days: int) -> None:
    """An hourly series whose value is 20 + the day of the month (constant within a day)."""
    rows = []
    for h in range(days * 24):
        t = start + timedelta(hours=h)
        rows.append({"zone": zone, "ts_start": t, "ts_end": t + timedelta(hours=1),
                     "g_per_kwh": 20.0 + t.day, "kind": "lifecycle", "source": "test series"})  # fmt: skip
    with engine.begin() as c:
        c.execute(insert(CarbonIntensity), rows)


def at(day: int, hour: float = 0.0, month: datetime = MONTH) -> datetime:
    return month.replace(day=day) + timedelta(hours=hour)


def build_month(engine: Engine, cfg: Config) -> None:
    feb = PREV
    jobs = [
        # alice, lab_a
        job(101, at(3, 10), 2, user="alice", account="lab_a", gpus=2, limit_h=24, name="two-gpus"),
        job(102, at(10, 8), 4, user="alice", account="lab_a", state="FAILED", limit_h=24, name="notebook"),
        job(103, at(28, 20, feb), 8, user="alice", account="lab_a", limit_h=24),  # 4 h in Feb, 4 h in March
        job(104, at(5, 10, feb), 5, user="alice", account="lab_a"),
        job(105, at(18, 10), 4, user="alice", account="lab_a", limit_h=24, name="train"),
        job(106, at(25, 10), 1, user="alice", account="lab_a", gpus=0, cpus=8, state="TIMEOUT", limit_h=1),
        job(901, at(12, 0), 1, user="alice", account="lab_a", cluster="d"),
        # bob, lab_a
        job(201, at(5), 6, user="bob", account="lab_a", gpus=0, cpus=16, state="TIMEOUT"),
        job(202, at(6, 12), 3, user="bob", account="lab_a", state="CANCELLED by 5"),
        job(203, at(12, 0, feb), 2, user="bob", account="lab_a"),
        # carol, lab_b: a day on 4 busy GPUs
        job(301, at(7), 24, user="carol", account="lab_b", gpus=4, cpus=32),
        # dave, lab_b: across the month's end; a job that never ran long enough to count time
        job(401, at(31, 22), 4, user="dave", account="lab_b"),
        job(402, at(2, 9), 0, user="dave", account="lab_b", state="FAILED"),
        # erin, lab_b: CPU, and a job still running at the month's end (1 h so far)
        job(501, at(15, 6), 2, user="erin", account="lab_b", gpus=0),
        job(502, at(31, 23), 1, user="erin", account="lab_b", gpus=0, running=True),
        # frank, on the other cluster only
        job(902, at(20, 0), 3, user="frank", account="lab_b", cluster="d"),
    ]
    import_records(engine, jobs, cfg, source="sacct-json")
    series(engine, "FR", MONTH, 20)  # March 1-20; the rest of March and February fall back
    gpu_samples(engine, 101, at(3, 10), 120, {"GPU-a": (300.0, 90.0), "GPU-b": (60.0, 0.0)})
    gpu_samples(engine, 102, at(10, 8), 240, {"GPU-a": (50.0, 0.0)})
    gpu_samples(engine, 105, at(18, 10), 240, {"GPU-a": (250.0, 80.0)})
    gpu_samples(engine, 202, at(6, 12), 180, {"GPU-a": (200.0, 40.0)})
    gpu_samples(engine, 301, at(7), 24 * 60, {f"GPU-{i}": (350.0, 95.0) for i in range(4)}, step_s=120)
    with engine.begin() as c:
        pks = dict(c.execute(text("SELECT job_id_raw, id FROM jobs")).all())
        # one merged row per job: alice's llama-7b in bf16 (job 101) and in fp32 (103, ending March 1, a row
        # of the first shape with the precision in `extra`); her bert-base (105) with no precision at all
        for row in [
            {"job_pk": pks[101], "model_name": "llama-7b", "framework": "pytorch", "precision": "bf16",
             "batch_size": 32, "epochs": 2.0, "sources": {"model": "api", "precision": "api"}},
            {"job_pk": pks[103], "model_name": "llama-7b", "framework": "pytorch", "epochs": 1.0,
             "batch_size": 32, "extra": {"dtype": "torch.float32"}, "sources": {"model": "comment"}},
            {"job_pk": pks[105], "model_name": "bert-base", "framework": "pytorch", "task": "train",
             "sources": {"model": "comment", "task": "detected"}},
        ]:  # fmt: skip
            c.execute(insert(ModelMetadata).values(**row))
    run_aggregate(engine, cfg)


@dataclass
class Setup:
    engine: Engine
    cfg: Config


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def month_db(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    """The month, built once per database kind for the module's read-only tests."""
    tmp = tmp_path_factory.mktemp(f"report-{request.param}")
    url = migrated_database(request.param, tmp, request)
    engine = make_engine(url)
    cfg = config(tmp, url)
    build_month(engine, cfg)
    yield Setup(engine, cfg)
    engine.dispose()


# --- the hand computation -----------------------------------------------------------------------------


@dataclass
class Row:
    pk: int
    raw: int
    cluster: str
    user: str
    account: str
    state: str
    t0: float
    el: float
    gpus: int
    cpus: int
    energy_j: float
    measured_j: float
    co2_g: float
    pue: float
    g: float
    util: float | None
    idle_s: float
    idle_j: float
    embodied_g: float


def job_rows(engine: Engine) -> list[Row]:
    with engine.connect() as c:
        rows = c.execute(
            text(
                "SELECT j.id, j.job_id_raw, cl.name, j.user_name, j.account, j.state, j.start_time, j.elapsed_s,"
                " j.alloc_gpus, j.alloc_cpus, j.energy_j, j.energy_measured_j, j.co2_g, j.pue,"
                " j.carbon_g_per_kwh, m.gpu_util_pct, m.idle_gpu_s, m.idle_gpu_energy_j, m.co2_embodied_g"
                " FROM jobs j JOIN clusters cl ON cl.id = j.cluster_id LEFT JOIN job_metrics m ON m.job_pk = j.id"
            )
        ).all()
    out = []
    for r in rows:
        start = r[6] if isinstance(r[6], datetime) else datetime.fromisoformat(r[6])
        start = start.replace(tzinfo=UTC) if start.tzinfo is None else start
        out.append(Row(r[0], r[1], r[2], r[3], r[4], r[5], start.timestamp(), r[7], r[8], r[9], r[10], r[11],
                       r[12], r[13], r[14], r[15], r[16] or 0.0, r[17] or 0.0, r[18] or 0.0))  # fmt: skip
    return out


def share(r: Row, lo: datetime, hi: datetime) -> tuple[float, float]:
    """(f, overlap s) of a job in [lo, hi): the share of its run inside, as the reports count it."""
    a, b = lo.timestamp(), hi.timestamp()
    ov = max(0.0, min(r.t0 + r.el, b) - max(r.t0, a))
    if r.el > 0:
        return ov / r.el, ov
    return (1.0 if a <= r.t0 < b else 0.0), 0.0


OUTCOMES = {  # how a job ended -> where its energy beyond idle GPUs counts (an oracle for cocaq.accounting.ledger)
    "FAILED": "failed", "NODE_FAIL": "failed", "BOOT_FAIL": "failed", "OUT_OF_MEMORY": "oom",
    "TIMEOUT": "timeout", "DEADLINE": "timeout", "CANCELLED": "cancelled",
}  # fmt: skip


def expect(rows: list[Row], lo: datetime = MONTH, hi: datetime = NEXT, **match: Any) -> dict[str, float]:
    """Sums over the matching jobs' shares in [lo, hi)."""
    parts = ("failed", "oom", "timeout", "cancelled")
    out = dict.fromkeys(
        ("jobs", "kwh", "co2_kg", "gpu_h", "cpu_h", "idle_h", "idle_kwh", "idle_co2_kg", "embodied_kg",
         *(f"{p}_kwh" for p in parts), *(f"{p}_co2_kg" for p in parts), *(f"jobs_{p}" for p in parts)), 0.0,
    )  # fmt: skip
    for r in rows:
        if any(getattr(r, k) not in (v if isinstance(v, (set, tuple)) else {v}) for k, v in match.items()):
            continue
        f, ov = share(r, lo, hi)
        if f <= 0:
            continue
        st = r.state.split()[0]
        kg_per_j = r.co2_g / 1000 / r.energy_j if r.energy_j > 0 else 0.0
        idle_j = min(r.idle_j, r.energy_j)  # the ledger's idle part: never more than the job's energy
        out["jobs"] += 1
        out["kwh"] += r.energy_j * f / 3.6e6
        out["co2_kg"] += r.co2_g * f / 1000
        out["gpu_h"] += r.gpus * ov / H
        out["cpu_h"] += r.cpus * ov / H
        out["idle_h"] += r.idle_s * f / H
        out["idle_kwh"] += idle_j * f / 3.6e6
        out["idle_co2_kg"] += idle_j * f * kg_per_j
        out["embodied_kg"] += r.embodied_g * f / 1000
        o = OUTCOMES.get(st)
        if o is not None:
            out[f"{o}_kwh"] += (r.energy_j - idle_j) * f / 3.6e6
            out[f"{o}_co2_kg"] += (r.energy_j - idle_j) * f * kg_per_j
            out[f"jobs_{o}"] += 1
    return out


def same(a: Any, b: Any) -> bool:
    """Equal, floats to 1e-9 (sums in another order differ in the last bits)."""
    if is_dataclass(a) and not isinstance(a, type):
        return type(a) is type(b) and all(same(getattr(a, f.name), getattr(b, f.name)) for f in fields(a))
    if isinstance(a, (list, tuple)):
        return (
            isinstance(b, type(a)) and len(a) == len(b) and all(same(x, z) for x, z in zip(a, b, strict=True))
        )
    if isinstance(a, float) and isinstance(b, float):
        return b == pytest.approx(a, rel=1e-9, abs=1e-9)
    return bool(a == b)


def approx(x: float) -> Any:
    return pytest.approx(x, rel=1e-9, abs=1e-9)


def check_totals(t: data.MonthTotals, e: dict[str, float]) -> None:
    assert t.jobs == e["jobs"]
    assert t.energy_kwh == approx(e["kwh"]) and t.co2_kg == approx(e["co2_kg"])
    assert t.gpu_hours == approx(e["gpu_h"]) and t.cpu_hours == approx(e["cpu_h"])
    assert t.idle_gpu_hours == approx(e["idle_h"]) and t.idle_gpu_kwh == approx(e["idle_kwh"])
    assert t.idle_co2_kg == approx(e["idle_co2_kg"])
    for p in ("failed", "oom", "timeout", "cancelled"):
        assert getattr(t, f"{p}_kwh") == approx(e[f"{p}_kwh"]), p
        assert getattr(t, f"{p}_co2_kg") == approx(e[f"{p}_co2_kg"]), p
        assert getattr(t, f"jobs_{p}") == e[f"jobs_{p}"], p
    assert t.co2_embodied_kg == approx(e["embodied_kg"])
    assert t.gpu_kwh + t.cpu_kwh + t.dram_kwh + t.other_kwh == approx(t.energy_kwh)
    assert t.measured_kwh + t.estimated_kwh == approx(t.energy_kwh)
    # the ledger's parts are disjoint: they never add up to more than the energy
    assert t.wasted_kwh <= t.energy_kwh * (1 + 1e-9) and t.wasted_co2_kg <= t.co2_kg * (1 + 1e-9) + 1e-12


# --- 1. user monthly ----------------------------------------------------------------------------------


def test_user_totals_are_the_sums_of_their_jobs_in_the_month(month_db: Setup) -> None:
    rows = job_rows(month_db.engine)
    with month_db.engine.connect() as conn:
        everyone = user_report.users_month(conn, month_db.cfg, MONTH)
        alice = user_report.user_month(conn, month_db.cfg, "alice", date(2025, 3, 17))  # any day of the month
        alice_c = user_report.user_month(conn, month_db.cfg, "alice", MONTH, cluster="c")
    assert sorted(everyone) == ["alice", "bob", "carol", "dave", "erin", "frank"]
    for u, um in everyone.items():
        check_totals(um.totals, expect(rows, user=u))
    check_totals(alice.totals, expect(rows, user="alice"))
    check_totals(alice_c.totals, expect(rows, user="alice", cluster="c"))
    assert same(alice, everyone["alice"])  # one user alone or all at once: the same report
    # by hand: 2 GPUs x 2 h + 4 h + 4 h of the 8 h job across Feb/Mar + 4 h + 1 h on cluster d
    assert alice.totals.gpu_hours == approx(17.0) and alice_c.totals.gpu_hours == approx(16.0)
    assert alice.totals.jobs == 6 and alice_c.totals.jobs == 5
    assert (alice.totals.jobs_failed, alice.totals.jobs_timeout) == (1, 1)
    assert alice.clusters == ("c", "d") and alice.accounts == ("lab_a",)
    # dave: 2 of the job's 4 h are March's; the zero-length FAILED job counts as a job, with no energy
    dave = everyone["dave"].totals
    assert dave.gpu_hours == approx(2.0) and dave.jobs == 2 and dave.jobs_failed == 1
    # erin's running job counts its hour so far
    assert everyone["erin"].totals.cpu_hours == approx(4 * 2 + 4 * 1)
    eq = alice.equivalents
    assert eq.car_km == approx(alice.totals.co2_kg / (0.400 / 1.609344))
    assert eq.smartphone_charges == approx(alice.totals.co2_kg / 8.22e-3)
    # nobody: an empty report, not an error
    with month_db.engine.connect() as conn:
        nobody = user_report.user_month(conn, month_db.cfg, "nobody", MONTH)
    assert nobody.totals.energy_kwh == 0 and nobody.totals.jobs == 0 and nobody.peers.energy_rank is None
    assert len(nobody.daily) == 31


def test_user_models_precision_and_the_comparison(month_db: Setup) -> None:
    rows = {r.raw: r for r in job_rows(month_db.engine)}
    with month_db.engine.connect() as conn:
        everyone = user_report.users_month(conn, month_db.cfg, MONTH)
    alice = everyone["alice"]
    # by model: the runs that ended in March, whole, as `cocaq models` counts them (job 103 ended on
    # March 1: all of it, although half of it ran in February)
    models = {m.model_name: m for m in alice.models}
    assert set(models) == {"llama-7b", "bert-base"}
    assert everyone["bob"].models == () and everyone["carol"].models == ()
    assert models["llama-7b"].energy_kwh == approx((rows[101].energy_j + rows[103].energy_j) / 3.6e6)
    assert models["bert-base"].jobs == 1 and models["bert-base"].gpu_hours == approx(4.0)
    with month_db.engine.connect() as conn:
        cli = model_stats(conn, MONTH, NEXT, user="alice")
    assert {g.key: g.energy_kwh for g in cli.by_model} == approx({k: m.energy_kwh for k, m in models.items()})
    # precision: the column (101), the first shape's `extra` (103), nothing recorded (105)
    prec = {int(g.job_id): (g.precision, g.precision_label) for g in alice.jobs if g.gpus}
    assert prec[101] == ("reduced", "bf16") and prec[103] == ("full", "float32") and prec[105] == (None, None)
    # the comparison: whole runs that ended in March (103 ended on March 1), kWh per epoch
    (c,) = alice.model_comparisons
    assert (c.user, c.model) == ("alice", "llama-7b")
    bf16, fp32 = c.groups
    assert (bf16.precision, bf16.batch_size, fp32.precision) == ("bf16", 32, "fp32")
    assert c.unit == "epoch"
    assert bf16.kwh_per_unit == approx(rows[101].energy_j / 2 / 3.6e6)
    assert fp32.kwh_per_unit == approx(rows[103].energy_j / 1 / 3.6e6)
    assert fp32.ratio_to_best == approx(fp32.kwh_per_unit / bf16.kwh_per_unit) and fp32.ratio_to_best > 1
    assert all(everyone[u].model_comparisons == () for u in everyone if u != "alice")


def test_trend_against_the_previous_month(month_db: Setup) -> None:
    rows = job_rows(month_db.engine)
    with month_db.engine.connect() as conn:
        alice = user_report.user_month(conn, month_db.cfg, "alice", MONTH)
        carol = user_report.user_month(conn, month_db.cfg, "carol", MONTH)
    cur, old = expect(rows, user="alice"), expect(rows, PREV, MONTH, user="alice")
    tr = alice.trend
    assert tr.previous_month.start == PREV and tr.previous_month.label == "2025-02"
    # per day of data: the data starts on 5 February (job 104), so February has 24 days of it, March 31
    assert (tr.days, tr.previous_days, tr.comparable) == (31, 24, True)
    assert "24 days of February" in tr.note
    assert old["gpu_h"] == approx(4.0 + 5.0)  # the 4 Feb hours of job 103, and job 104
    assert tr.gpu_hours.previous == approx(9.0 / 24) and tr.gpu_hours.current == approx(17.0 / 31)
    assert tr.gpu_hours.pct == approx((17.0 / 31 / (9.0 / 24) - 1) * 100)
    assert tr.energy_kwh.current == approx(cur["kwh"] / 31) and tr.energy_kwh.previous == approx(
        old["kwh"] / 24
    )
    assert tr.energy_kwh.pct == approx((cur["kwh"] / 31 / (old["kwh"] / 24) - 1) * 100)
    assert tr.co2_kg.delta == approx(cur["co2_kg"] / 31 - old["co2_kg"] / 24)
    assert tr.gpu_util_pct.previous is None and tr.gpu_util_pct.delta is None  # no samples in February
    # carol ran nothing in February: a change from zero has no percentage
    assert carol.trend.energy_kwh.previous == 0 and carol.trend.energy_kwh.pct is None
    assert carol.trend.energy_kwh.delta == approx(carol.totals.energy_kwh / 31)
    # February against January, which has no data: no comparison, and it says why
    with month_db.engine.connect() as conn:
        feb = user_report.user_month(conn, month_db.cfg, "alice", PREV)
    assert not feb.trend.comparable and feb.trend.energy_kwh.pct is None
    assert feb.trend.note == "No comparison with January: there is no data for it."
    # too few days of data in the month before (5 of 14 needed): no comparison either
    short = queries.month_trend(
        data.Month.of(MONTH).previous(), {}, {}, data.DataDays(None, None, 31, 31),
        data.DataDays(at(24, 0, PREV).date(), MONTH.date(), 5, 28), 14,
    )  # fmt: skip
    assert not short.comparable and "only 5 of its days (24 Feb-28 Feb)" in short.note


def test_peer_percentiles_on_the_same_clusters(month_db: Setup) -> None:
    rows = job_rows(month_db.engine)
    with month_db.engine.connect() as conn:
        months = user_report.users_month(conn, month_db.cfg, MONTH)
        only_c = user_report.users_month(conn, month_db.cfg, MONTH, cluster="c")

    def pct(mine: float, others: list[float]) -> float:
        return 100 * (sum(v < mine for v in others) + 0.5 * sum(v == mine for v in others)) / len(others)

    # bob ran on c only: his peers are the users of c (frank is not one), compared on c
    on_c = {u: expect(rows, user=u, cluster="c")["kwh"] for u in ("alice", "bob", "carol", "dave", "erin")}
    bob = months["bob"].peers
    assert bob.clusters == ("c",) and bob.users == 5
    others = [v for u, v in on_c.items() if u != "bob"]
    assert bob.energy_percentile == approx(pct(on_c["bob"], others))
    assert bob.energy_rank == 1 + sum(v > on_c["bob"] for v in others)
    # alice ran on c and d: everyone is her peer, on both clusters
    both = {u: expect(rows, user=u)["kwh"] for u in months}
    a = months["alice"].peers
    assert a.clusters == ("c", "d") and a.users == 6
    assert a.energy_percentile == approx(pct(both["alice"], [v for u, v in both.items() if u != "alice"]))
    # carol used the most energy: top rank, 100th percentile
    assert months["carol"].peers.energy_rank == 1 and months["carol"].peers.energy_percentile == 100.0
    # utilisation: among the users whose GPU utilisation is known (alice, bob, carol)
    utils = {u: m.totals.gpu_util_pct for u, m in only_c.items() if m.totals.gpu_util_pct is not None}
    assert sorted(utils) == ["alice", "bob", "carol"]
    cp = only_c["carol"].peers
    assert cp.gpu_users == 3 and cp.gpu_util_rank == 1 and cp.gpu_util_percentile == 100.0
    bp = only_c["bob"].peers
    assert bp.gpu_util_percentile == approx(pct(utils["bob"], [utils["alice"], utils["carol"]]))
    assert only_c["erin"].peers.gpu_util_rank is None and only_c["erin"].peers.gpu_util_percentile is None
    assert "frank" not in only_c


def test_idle_gpus_and_failed_jobs_in_kwh_and_co2(month_db: Setup) -> None:
    rows = job_rows(month_db.engine)
    by_raw = {r.raw: r for r in rows}
    with month_db.engine.connect() as conn:
        alice = user_report.user_month(conn, month_db.cfg, "alice", MONTH)
    t = alice.totals
    # job 101: GPU-b at 60 W, util 0, for 2 h; job 102: 50 W, util 0, for 4 h (the 5% threshold)
    assert t.idle_gpu_hours == approx(2.0 + 4.0)
    assert t.idle_gpu_kwh == approx((60 * 2 + 50 * 4) / 1000)
    co2 = sum(e * by_raw[raw].pue * by_raw[raw].g for raw, e in ((101, 0.12), (102, 0.2))) / 1000
    assert t.idle_co2_kg == approx(co2)
    # the ledger's parts, disjoint: the FAILED job's energy beyond its idle GPUs (all of them idle, 0.2 kWh)
    # is "failed"; the TIMEOUT job (no GPU) is "timed out", not "failed"; each with its own CO2
    e102, e106 = by_raw[102].energy_j / 3.6e6, by_raw[106].energy_j / 3.6e6
    assert t.failed_kwh == approx(e102 - 0.2) and t.timeout_kwh == approx(e106)
    assert t.failed_co2_kg == approx(by_raw[102].co2_g / 1000 * (e102 - 0.2) / e102)
    assert t.timeout_co2_kg == approx(by_raw[106].co2_g / 1000)
    # what did no work is certain; the time-out's part is possibly lost, apart (issue 32)
    assert t.wasted_kwh == approx(t.idle_gpu_kwh + e102 - 0.2) and t.wasted_kwh < t.energy_kwh
    # the jobs that held GPUs nearly idle: 102 (all of it) then 101 (one GPU of two)
    idle = alice.idle_jobs
    assert [j.job_id for j in idle] == ["102", "101"]
    assert idle[0].idle_share == approx(1.0) and idle[0].idle_kwh == approx(0.2) and idle[0].gpu_util_pct == 0
    assert idle[1].idle_share == approx(0.5) and idle[1].gpus == 2 and idle[1].idle_gpu_hours == approx(2.0)
    assert idle[1].gpu_util_pct == approx(90 * 300 / 360)  # energy-weighted over both GPUs
    assert idle[0].name == "notebook" and idle[0].start == at(10, 8)


def test_top_jobs_basis_and_daily_series(month_db: Setup) -> None:
    rows = job_rows(month_db.engine)
    with month_db.engine.connect() as conn:
        alice = user_report.user_month(
            conn, month_db.cfg, "alice", MONTH, options=data.ReportOptions(top_jobs=3)
        )
    mine = [r for r in rows if r.user == "alice" and share(r, MONTH, NEXT)[0] > 0]
    ranked = sorted(mine, key=lambda r: (-r.energy_j * share(r, MONTH, NEXT)[0], r.pk))[:3]
    assert [j.pk for j in alice.top_jobs] == [r.pk for r in ranked]
    for j, r in zip(alice.top_jobs, ranked, strict=True):  # whole jobs, as `cocaq job` shows them
        f, _ov = share(r, MONTH, NEXT)
        assert j.energy_kwh == approx(r.energy_j / 3.6e6) and j.share_in_month == approx(f)
        assert j.gpu_hours == approx(r.gpus * r.el / H) and j.co2_kg == approx(r.co2_g / 1000)
    half = next(j for j in alice.jobs if j.job_id == "103")
    assert half.share == approx(0.5)
    # basis: estimated only; the series for March 1-20, fallbacks for the rest; PUE 1.2 and February's 1.5
    b = alice.basis
    assert b.measured_share == 0.0
    assert sum(c.energy_share for c in b.carbon) == approx(1.0)
    assert sum(c.energy_kwh for c in b.carbon) == approx(alice.totals.energy_kwh)
    assert sum(c.co2_kg for c in b.carbon) == approx(alice.totals.co2_kg)
    assert any("test series" in (c.source or "") and c.flag is None for c in b.carbon)
    assert any(c.flag for c in b.carbon)  # job 106 (March 25) fell back
    assert {c.zone for c in b.carbon} == {"FR"}
    assert (b.pue_min, b.pue_max) == (1.2, 1.5) and b.idle_threshold_pct == 5.0
    assert b.complete and b.rollups_through is not None
    # daily: every day of March, adding up to the month
    assert [d.day for d in alice.daily] == [date(2025, 3, i) for i in range(1, 32)]
    assert sum(d.energy_kwh for d in alice.daily) == approx(alice.totals.energy_kwh)
    assert sum(d.gpu_hours for d in alice.daily) == approx(alice.totals.gpu_hours)
    day3 = alice.daily[2]
    assert day3.gpu_util_pct == approx(90 * 300 / 360) and alice.daily[3].gpu_util_pct is None
    assert alice.daily[0].gpu_hours == approx(4.0)  # job 103's March hours


def test_time_limits_of_completed_jobs(month_db: Setup) -> None:
    with month_db.engine.connect() as conn:
        alice = user_report.user_month(conn, month_db.cfg, "alice", MONTH)
    tl = alice.time_limits
    # ended in March with a limit: 101 (2 h), 102 FAILED, 103 (8 h, ended March 1), 105 (4 h), 106 TIMEOUT
    assert (tl.finished, tl.completed, tl.timeouts) == (5, 3, 1)
    assert tl.median_use == approx(4 / 24) and tl.median_limit_h == approx(24.0)
    assert tl.median_elapsed_h == approx(4.0) and tl.max_elapsed_h == approx(8.0)
    assert tl.requested_h == approx(72.0) and tl.used_h == approx(14.0)
    assert tl.examples == ("101", "105", "103")


# --- 2. lab monthly ------------------------------------------------------------------------------------


def test_lab_month(month_db: Setup) -> None:
    rows = job_rows(month_db.engine)
    with month_db.engine.connect() as conn:
        lab = lab_report.lab_month(conn, month_db.cfg, "lab_a", MONTH)
        lab_b = lab_report.lab_month(conn, month_db.cfg, "lab_b", MONTH, cluster="c")
        alice = user_report.user_month(conn, month_db.cfg, "alice", MONTH)
    check_totals(lab.totals, expect(rows, account="lab_a"))
    check_totals(lab_b.totals, expect(rows, account="lab_b", cluster="c"))
    old = expect(rows, PREV, MONTH, account="lab_a")  # per day of data: 24 of February's (from the 5th)
    assert lab.trend.energy_kwh.previous == approx(old["kwh"] / 24)
    assert lab.trend.gpu_hours.previous == approx((9 + 2) / 24)
    assert [u.user for u in lab.users] == sorted(
        ("alice", "bob"), key=lambda u: -expect(rows, user=u, account="lab_a")["kwh"]
    )
    for u in lab.users:
        e = expect(rows, user=u.user, account="lab_a")
        assert (u.jobs, u.energy_kwh, u.gpu_hours) == (e["jobs"], approx(e["kwh"]), approx(e["gpu_h"]))
        assert (u.idle_kwh, u.failed_kwh) == (approx(e["idle_kwh"]), approx(e["failed_kwh"]))
        assert u.waste is not None and u.waste.timeout_kwh == approx(e["timeout_kwh"])
        assert u.waste.wasted_kwh <= u.energy_kwh
    assert next(u for u in lab.users if u.user == "alice").gpu_util_pct == approx(alice.totals.gpu_util_pct)
    # idle waste: only alice's GPUs idled
    assert [w.key for w in lab.idle_by_user] == ["alice"]
    w = lab.idle_by_user[0]
    assert w.idle_gpu_hours == approx(6.0) and w.idle_share == approx(6.0 / 17.0)
    assert w.idle_co2_kg == approx(alice.totals.idle_co2_kg)
    # models: jobs 101 and 103 (ended on March 1) are llama, 105 is bert: runs that ended in March, whole
    by_raw = {r.raw: r for r in rows}
    e101, e103, e105 = (by_raw[k].energy_j / 3.6e6 for k in (101, 103, 105))
    models = {(m.model_name, m.framework): m for m in lab.models}
    llama, bert = models[("llama-7b", "pytorch")], models[("bert-base", "pytorch")]
    assert llama.energy_kwh == approx(e101 + e103) and llama.gpu_hours == approx(2 * 2 + 8)
    assert (llama.jobs, llama.users, bert.jobs) == (2, 1, 1)
    assert bert.energy_kwh == approx(e105) and bert.gpu_hours == approx(4.0)
    assert bert.co2_kg == approx(by_raw[105].co2_g / 1000) and llama.co2_kg == approx(
        (by_raw[101].co2_g + by_raw[103].co2_g) / 1000
    )
    assert [m.model_name for m in lab.models] == sorted(
        ("llama-7b", "bert-base"), key=lambda n: -models[(n, "pytorch")].energy_kwh
    )
    assert lab_b.models == ()  # no metadata: an empty list, not a guess
    # weeks: ISO weeks 9 (March 1-2) to 14 (March 31), adding up to the month
    assert [(w.iso_week, w.days) for w in lab.weekly] == [(9, 2), (10, 7), (11, 7), (12, 7), (13, 7), (14, 1)]
    assert lab.weekly[0].first == date(2025, 3, 1) and lab.weekly[-1].last == date(2025, 3, 31)
    assert sum(w.energy_kwh for w in lab.weekly) == approx(lab.totals.energy_kwh)
    assert sum(w.co2_kg for w in lab.weekly) == approx(lab.totals.co2_kg)


# --- 3. admin monthly ------------------------------------------------------------------------------------


def test_admin_month_tables_add_up(month_db: Setup) -> None:
    rows = job_rows(month_db.engine)
    with month_db.engine.connect() as conn:
        adm = admin_report.admin_month(conn, month_db.cfg, MONTH)
        adm_d = admin_report.admin_month(conn, month_db.cfg, MONTH, cluster="d")
    check_totals(adm.totals, expect(rows))
    check_totals(adm_d.totals, expect(rows, cluster="d"))
    assert adm.trend.energy_kwh.previous == approx(expect(rows, PREV, MONTH)["kwh"] / 24)
    for table in (adm.by_lab, adm.by_partition):
        assert sum(g.energy_kwh for g in table) == approx(adm.totals.energy_kwh)
        assert sum(g.co2_kg for g in table) == approx(adm.totals.co2_kg)
        assert sum(g.jobs for g in table) == adm.totals.jobs
    labs = {g.key: g for g in adm.by_lab}
    assert labs["lab_a"].energy_kwh == approx(expect(rows, account="lab_a")["kwh"])
    assert labs["lab_b"].jobs == expect(rows, account="lab_b")["jobs"]
    assert sum(g.energy_share or 0 for g in adm.by_lab) == approx(1.0)
    parts = {g.key: g for g in adm.by_partition}
    assert set(parts) == {"gpu", "cpu"} and parts["cpu"].gpu_hours == 0
    assert sum(w.energy_kwh for w in adm.by_week) == approx(adm.totals.energy_kwh)
    # top users: most energy first; carol's 96 GPU-hours lead
    assert adm.top_users[0].key == "carol" and adm.top_users[0].gpu_hours == approx(96.0)
    assert [g.key for g in adm.top_users] == sorted((g.key for g in adm.top_users),
                                                    key=lambda u: -expect(rows, user=u)["kwh"])  # fmt: skip
    # coverage: nothing measured here
    assert {c.partition for c in adm.coverage} == {"gpu", "cpu"}
    assert all(c.measured_share == 0 for c in adm.coverage)
    assert sum(c.estimated_kwh for c in adm.coverage) == approx(adm.totals.energy_kwh)
    # models: only lab_a's jobs have metadata, so the site's table is the lab's; none on cluster d
    with month_db.engine.connect() as conn:
        lab = lab_report.lab_month(conn, month_db.cfg, "lab_a", MONTH)
    assert same(adm.models, lab.models) and [m.model_name for m in adm.models] == ["llama-7b", "bert-base"]
    assert adm_d.models == ()


def test_admin_utilisation_histogram_idle_and_failures(month_db: Setup) -> None:
    rows = job_rows(month_db.engine)
    with month_db.engine.connect() as conn:
        adm = admin_report.admin_month(conn, month_db.cfg, MONTH)
    h = adm.util_histogram
    got = {b.lo: (b.jobs, round(b.gpu_hours, 6)) for b in h.bins if b.jobs}
    # by hand: 102 at 0% (4 GPU-h), 202 at 40% (3), 101 at 75% (4), 105 at 80% (4), 301 at 95% (96)
    assert got == {0.0: (1, 4.0), 40.0: (1, 3.0), 70.0: (1, 4.0), 80.0: (1, 4.0), 90.0: (1, 96.0)}
    assert len(h.bins) == 10 and h.bins[-1].hi == 100.0
    # GPU jobs without samples: 103 (4 h in March), 401 (2 h), 901 (1 h), 902 (3 h), 402 (no time)
    assert h.unsampled_jobs == 5 and h.unsampled_gpu_hours == approx(4 + 2 + 1 + 3)
    assert [w.key for w in adm.idle_by_user] == ["alice"] and [w.key for w in adm.idle_by_lab] == ["lab_a"]
    assert adm.idle_by_lab[0].idle_share == approx(6.0 / expect(rows, account="lab_a")["gpu_h"])
    waste = {w.key: w for w in adm.waste_by_lab}
    a = expect(rows, account="lab_a")
    w = waste["lab_a"]
    assert (w.idle_kwh, w.failed_kwh, w.timeout_kwh) == (approx(a["idle_kwh"]), approx(a["failed_kwh"]),
                                                         approx(a["timeout_kwh"]))  # fmt: skip
    assert (w.jobs_failed, w.jobs_timeout) == (1, 2)  # 102 FAILED; 106 and 201 TIMEOUT, apart
    assert w.wasted_kwh <= w.energy_kwh == approx(a["kwh"])
    assert "lab_b" not in waste  # its only bad job (FAILED) ran for no time: nothing wasted
    states = {s.state: s for s in adm.energy_by_state}
    assert set(states) == {"COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "RUNNING"}
    assert states["TIMEOUT"].outcome == "timeout" and states["CANCELLED"].outcome == "cancelled"
    assert states["FAILED"].outcome == "failed" and states["COMPLETED"].outcome is None
    assert states["CANCELLED"].energy_kwh == approx(expect(rows, state="CANCELLED by 5")["kwh"])
    assert sum(s.energy_kwh for s in adm.energy_by_state) == approx(adm.totals.energy_kwh)
    assert sum(s.jobs for s in adm.energy_by_state) == adm.totals.jobs


def test_admin_intensity_used_per_zone_and_day(month_db: Setup) -> None:
    rows = job_rows(month_db.engine)
    with month_db.engine.connect() as conn:
        adm = admin_report.admin_month(conn, month_db.cfg, MONTH)
    (fr,) = adm.intensity
    assert fr.zone == "FR"
    used = [(r, *share(r, MONTH, NEXT)) for r in rows if r.energy_j > 0 and share(r, MONTH, NEXT)[0] > 0]
    e = sum(r.energy_j * f for r, f, _ in used)
    assert fr.energy_kwh == approx(e / 3.6e6)
    assert fr.g_per_kwh == approx(sum(r.energy_j * f * r.g for r, f, _ in used) / e)
    # per day, the jobs' intensity weighted by their energy in the day
    per_day: dict[date, list[float]] = {}
    for r, _f, _ov in used:
        for d in range(31):
            lo = MONTH + timedelta(days=d)
            f, _ = share(r, lo, lo + timedelta(days=1))
            if f > 0 and r.el > 0:
                acc = per_day.setdefault(lo.date(), [0.0, 0.0])
                acc[0] += r.energy_j * f * r.g
                acc[1] += r.energy_j * f
    assert [d.day for d in fr.daily] == sorted(per_day)
    for d in fr.daily:
        assert d.g_per_kwh == approx(per_day[d.day][0] / per_day[d.day][1])
    assert fr.daily_mean_g_per_kwh == approx(sum(a / b for a, b in per_day.values()) / len(per_day))
    # job 101 ran on March 3, all in the series' hours: 20 + 3 g/kWh
    assert next(d for d in fr.daily if d.day == date(2025, 3, 3)).g_per_kwh == approx(23.0)
    assert any("test series" in s for s in fr.sources) and len(fr.sources) >= 2


def test_before_and_after_the_first_report(month_db: Setup) -> None:
    first = {
        "alice": at(15, 12),  # before: March 8-14 (job 102, idle); after: March 16-22 (job 105, busy)
        "bob": at(8, 6),  # GPU work before (job 202), none after: excluded
        "carol": at(28),  # the 7 days after end in April: not over by the month's end
        "zed": at(14),  # no jobs at all
    }
    with month_db.engine.connect() as conn:
        adm = admin_report.admin_month(conn, month_db.cfg, MONTH, first_report=first, window_days=7)
        wide = admin_report.before_after(conn, first, data.Month.of(MONTH), window_days=14)
        too_wide = admin_report.before_after(conn, first, data.Month.of(MONTH), window_days=20)
    ba = adm.before_after
    assert ba is not None and ba.window_days == 7
    assert [u.user for u in ba.users] == ["alice"]
    assert ba.excluded == ("bob", "zed") and ba.pending == ("carol",)
    a = ba.users[0]
    assert (a.before.start, a.before.end) == (at(8), at(15))
    assert (a.after.start, a.after.end) == (at(16), at(23))
    # before: job 102 (4 GPU-hours, all idle) and job 901 (1 GPU-hour on cluster d, no samples: not idle)
    assert a.before.gpu_hours == approx(5.0) and a.before.idle_gpu_hours == approx(4.0)
    assert a.before.idle_share == approx(0.8)
    assert a.after.gpu_hours == approx(4.0) and a.after.idle_share == approx(0.0)
    assert a.idle_share_change == approx(-0.8)
    assert a.before.gpu_util_pct == approx(0.0) and a.after.gpu_util_pct == approx(80.0)
    assert a.gpu_util_change == approx(80.0)
    assert ba.idle_share_before == approx(0.8) and ba.idle_share_after == approx(0.0)
    assert ba.gpu_util_change == approx(80.0) and ba.gpu_hours_before == approx(5.0)
    assert "not a controlled effect" in (data.BeforeAfter.__doc__ or "")
    # 14 days: alice's before-window is March 1-14: 103's 4 March hours, 101 (2 GPUs, one idle), 102, 901
    assert [u.user for u in wide.users] == ["alice"] and wide.excluded == ("bob", "zed")
    w = wide.users[0]
    assert w.before.gpu_hours == approx(4 + 4 + 4 + 1) and w.before.idle_gpu_hours == approx(6.0)
    assert wide.idle_share_before == approx(6.0 / 13.0)
    # utilisation is weighted by the GPU energy the jobs' samples saw: 101 at 75 % over 360 W x 2 h,
    # 102 at 0 % over 50 W x 4 h
    assert w.before.gpu_util_pct == approx((75.0 * 360 * 2 + 0.0 * 50 * 4) / (360 * 2 + 50 * 4))
    # 20 days after March 14 or later end in April: those windows are not over
    assert too_wide.users == () and too_wide.pending == ("alice", "carol", "zed")


# --- 4. one job -----------------------------------------------------------------------------------------


def test_job_footprint(month_db: Setup) -> None:
    rows = {r.raw: r for r in job_rows(month_db.engine)}
    with month_db.engine.connect() as conn:
        j = job_report.job_footprint(conn, month_db.cfg, rows[101].pk)
        running = job_report.job_footprint(conn, month_db.cfg, rows[502].pk)
        with pytest.raises(UsageError):
            job_report.job_footprint(conn, month_db.cfg, 10**9)
    r = rows[101]
    assert j.job_id == "101" and j.cluster == "c" and j.gpus == 2 and j.name == "two-gpus"
    assert j.energy_kwh == approx(r.energy_j / 3.6e6)
    assert sum(j.by_component.values()) == approx(j.energy_kwh)
    assert j.by_method == {"estimated": approx(j.energy_kwh)} and j.measured_kwh == 0
    assert j.by_component["gpu"] == approx(2 * 2 * 0.4)  # 2 GPUs x 2 h x 400 W TDP x 1.0
    assert {p.source for p in j.parts} == {"tdp-estimate"}
    assert j.co2_kg == approx(j.energy_kwh * j.pue * (j.carbon_g_per_kwh or 0) / 1000)
    assert j.carbon_zone == "FR" and "test series" in (j.carbon_source or "")
    assert j.carbon_g_per_kwh == approx(23.0) and j.carbon_flag is None  # March 3: 20 + 3 all day
    assert j.co2_embodied_kg == approx(2 * 2 * 10 / 1000)  # apart: not in co2_kg
    assert j.gpu_util_pct == approx(75.0) and j.idle_gpu_hours == approx(2.0) and j.idle_kwh == approx(0.12)
    assert j.sampled_gpu_hours == approx(4.0)
    assert j.idle_co2_kg == approx(0.12 * j.pue * 23.0 / 1000)
    assert j.cpu_usage == approx(0.5) and j.time_limit_h == 24.0
    assert j.final and j.final_reasons == () and j.metrics_current
    assert j.models == ("llama-7b",)
    # still running: the energy will change
    assert not running.final and running.is_open and "RUNNING" in running.final_reasons[0]
    assert running.end is None and running.elapsed_h == approx(1.0)


def test_month_helper() -> None:
    m = data.Month.of(datetime(2024, 12, 31, 23, 59, tzinfo=UTC))
    assert (m.start, m.end) == (datetime(2024, 12, 1, tzinfo=UTC), datetime(2025, 1, 1, tzinfo=UTC))
    assert m.label == "2024-12" and m.previous().label == "2024-11"
    assert len(data.Month.of(date(2024, 2, 3)).days()) == 29
    # a time with an offset is read in UTC: 00:30 on April 1 in Paris is still March in UTC
    assert data.Month.of(datetime(2025, 4, 1, 0, 30, tzinfo=ZoneInfo("Europe/Paris"))).label == "2025-03"
    # the precision column, then (rows of the first shape) the keys of `extra`
    assert precision_of("bf16") == ("reduced", "bf16") and precision_of("fp8") == ("reduced", "fp8")
    assert precision_of("tf32") == ("full", "tf32")
    assert precision_of("fp32", {"amp": True})[0] == "full"  # the column wins
    assert precision_of("nf4") == ("reduced", "nf4") and precision_of("bf16-mixed")[0] == "reduced"
    assert precision_of("q5_k") == (None, "q5_k")  # said, but neither: unknown
    assert precision_of(None, {"precision": "bf16"}) == ("reduced", "bf16")
    assert precision_of("", {"dtype": "torch.float32"}) == ("full", "float32")
    assert precision_of(None, {"amp": True}) == ("reduced", "amp=true")
    assert precision_of(None, {"task": "train"}) == (None, None)
    assert precision_of(None) == (None, None)
