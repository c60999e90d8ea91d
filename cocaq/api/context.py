"""What one app of the read API serves from: its configuration, its database connections and how it
decodes MUNGE credentials. create_app makes one and puts it on `app.state`; the routes get it as a
dependency (cocaq.api.deps.Context), so that two apps (tests make many) share nothing."""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cocaq.api.pool import Pool
from cocaq.config import Config

Decode = Callable[[str], tuple[int, bytes]]  # a MUNGE credential -> (uid, payload)


@dataclass
class ApiContext:
    cfg: Config
    decode: Decode
    metrics_token: bytes | None  # what GET /metrics requires ([api] metrics_token_file), read at start
    pool: Pool = field(init=False)
    _engine: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.pool = Pool(self.cfg.database_url)

    def engine(self) -> Any:
        """The SQLAlchemy engine, made on first use: most routes read through the pool."""
        if self._engine is None:
            from cocaq.db.engine import make_engine

            self._engine = make_engine(self.cfg.database_url)
        return self._engine

    def close(self) -> None:
        self.pool.close()
        if self._engine is not None:
            self._engine.dispose()
