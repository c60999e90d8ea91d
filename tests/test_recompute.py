"""`cocaq recompute` after new intensity data and a new configuration equals computing from scratch."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, select, text

from cocaq.db import migrate
from cocaq.db.schema import DailyRollup
from tests.conftest import migrated_database, new_database, run_cocaq

DAY0 = datetime(2026, 10, 5, tzinfo=UTC)
BEFORE = "[cluster]\nname = 'c'\ncarbon_zone = 'FR'\npue = 1.2\n[defaults]\ngpu_tdp_w = 300\n"
AFTER = (
    "[cluster]\nname = 'c'\ncarbon_zone = 'FR'\npue = 1.2\n[cluster.pue_monthly]\n'2026-10' = 1.4\n"
    "[defaults]\ngpu_tdp_w = 400\n[embodied]\ng_per_gpu_hour = 20\n"
)


def _dump(tmp: Path) -> Path:
    """A small sacct dump: GPU jobs over four days, one across midnight, one failed."""
    lines = [
        "JobID|JobIDRaw|User|Account|Partition|NodeList|AllocTRES|Submit|Start|End|Elapsed|State|TotalCPU|Cluster"
    ]
    for i in range(12):
        start = DAY0 + timedelta(hours=7 * i + 3)
        end = start + timedelta(hours=1 + i % 5)
        state = "FAILED" if i == 4 else "COMPLETED"
        fmt = "%Y-%m-%dT%H:%M:%S"
        el = end - start
        lines.append(
            f"{100 + i}|{100 + i}|u{i % 3}|lab{i % 2}|gpu|n1|cpu=4,gres/gpu={1 + i % 2},mem=8G,node=1|"
            f"{start:{fmt}}|{start:{fmt}}|{end:{fmt}}|{int(el.total_seconds() // 3600):02d}:00:00|{state}|"
            f"01:00:00|c"
        )
    p = tmp / "dump.txt"
    p.write_text("\n".join(lines) + "\n")
    return p


def _series(tmp: Path) -> Path:
    p = tmp / "fr.csv"
    rows = ["zone,datetime,gco2_per_kwh"]
    for h in range(24 * 6):
        rows.append(f"FR,{(DAY0 + timedelta(hours=h)).strftime('%Y-%m-%dT%H:%M:%SZ')},{20 + (h * 7) % 60}")
    p.write_text("\n".join(rows) + "\n")
    return p


def _state(engine: Engine) -> tuple[list[Any], list[Any]]:
    with engine.connect() as c:
        jobs = c.execute(
            text(
                "SELECT j.job_id, j.energy_j, j.co2_g, j.pue, j.carbon_g_per_kwh, j.carbon_source, j.carbon_flag,"
                " m.co2_embodied_g FROM jobs j JOIN job_metrics m ON m.job_pk = j.id ORDER BY j.job_id"
            )
        ).all()
        cols = [
            col
            for col in DailyRollup.__table__.columns
            if col.name not in ("id", "computed_at", "cluster_id")
        ]
        days = c.execute(select(*cols).order_by(*cols[:4])).all()
    rnd = lambda r: tuple(round(v, 6) if isinstance(v, float) else v for v in r)  # noqa: E731
    return [rnd(r) for r in jobs], [rnd(r) for r in days]


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_recompute_equals_computing_from_scratch(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, cli_env: dict[str, str]
) -> None:
    dump, series = _dump(tmp_path), _series(tmp_path)
    states = []
    for name, steps in (("later", "recompute"), ("scratch", "scratch")):
        d = tmp_path / name
        d.mkdir()
        url = migrated_database(kind, d, request)
        eng = create_engine(url)
        cfg = d / "c.toml"
        env = dict(cli_env, COCAQ_CONFIG=str(cfg), COCAQ_DATABASE_URL=url)

        def cocaq(*args: str, env: dict[str, str] = env) -> None:
            r = run_cocaq(list(args), env)
            assert r.code == 0, (args, r.err)

        if steps == "recompute":  # the history: imported and aggregated under the old setup...
            cfg.write_text(BEFORE)
            cocaq("import", "sacct", "--file", str(dump))
            cocaq("aggregate")
            before = _state(eng)
            cocaq("carbon", "import", str(series))  # ...then hourly data and a new configuration arrive
            cfg.write_text(AFTER)
            cocaq("recompute")
            assert _state(eng) != before
        else:  # everything known from the start
            cfg.write_text(AFTER)
            cocaq("carbon", "import", str(series))
            cocaq("import", "sacct", "--file", str(dump))
            cocaq("aggregate")
        states.append(_state(eng))
        eng.dispose()
    later, scratch = states
    assert len(later[0]) == 12 and len(later[1]) >= 8, later
    assert later[0] == scratch[0] and later[1] == scratch[1]
    assert all(r[6] is None for r in later[0]), "the series covers every job: no fallback flagged"


def test_cocaq_job_shows_how_its_carbon_and_gpu_use_were_derived(
    tmp_path: Path, request: pytest.FixtureRequest, cli_env: dict[str, str]
) -> None:
    url = new_database("sqlite", tmp_path, request)
    migrate.upgrade(create_engine(url))
    cfg = tmp_path / "c.toml"
    cfg.write_text(AFTER)
    env = dict(cli_env, COCAQ_CONFIG=str(cfg), COCAQ_DATABASE_URL=url)
    for args in (
        ["carbon", "import", str(_series(tmp_path))],
        ["import", "sacct", "--file", str(_dump(tmp_path))],
    ):
        assert run_cocaq(args, env).code == 0
    before = run_cocaq(["job", "101"], env)
    assert before.code == 0 and "Carbon intensity over the run" not in before.out
    assert run_cocaq(["aggregate"], env).code == 0
    r = run_cocaq(["job", "101"], env)
    assert r.code == 0, r.err
    assert "Carbon intensity over the run: hourly series for 100% of it (life-cycle emissions)" in r.out, (
        r.out
    )
    assert "Embodied CO2e (making the hardware; not in the CO2e above):" in r.out
    assert "PUE 1.40" in r.out
