"""`cocaq db upgrade`: Alembic driven from code, so the installed wheel needs no alembic.ini."""

from __future__ import annotations

import os
from datetime import UTC, datetime

from alembic import command
from alembic.config import Config as AlembicConfig
from sqlalchemy import Engine, text

import cocaq.migrations


def alembic_config(engine: Engine) -> AlembicConfig:
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", os.path.dirname(os.path.abspath(cocaq.migrations.__file__)))
    cfg.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False).replace("%", "%%"))
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    with engine.begin() as conn:
        cfg = alembic_config(engine)
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
    if engine.dialect.name == "postgresql":
        ensure_sample_partitions(engine, datetime.now(UTC), months_ahead=2)


def downgrade(engine: Engine, revision: str = "base") -> None:
    with engine.begin() as conn:
        cfg = alembic_config(engine)
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def _month_add(d: datetime, n: int) -> datetime:
    y, m = divmod(d.month - 1 + n, 12)
    return d.replace(year=d.year + y, month=m + 1, day=1, hour=0, minute=0, second=0, microsecond=0)


def ensure_sample_partitions(engine: Engine, around: datetime, months_ahead: int = 2) -> list[str]:
    """Monthly partitions of `samples` from `around`'s month to `months_ahead` later (PostgreSQL only)."""
    made = []
    with engine.begin() as conn:
        for i in range(months_ahead + 1):
            lo, hi = _month_add(around, i), _month_add(around, i + 1)
            name = f"samples_p{lo:%Y%m}"
            exists = conn.execute(text("SELECT to_regclass(:n)"), {"n": name}).scalar()
            if exists is None:
                conn.execute(
                    text(
                        f"CREATE TABLE {name} PARTITION OF samples "
                        f"FOR VALUES FROM ('{lo:%Y-%m-%d} 00:00:00+00') TO ('{hi:%Y-%m-%d} 00:00:00+00')"
                    )
                )
                made.append(name)
    return made
