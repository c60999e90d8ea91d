"""The read API fuzzed against its own OpenAPI document (schemathesis): no request gets a 500.

Every generated request carries a real MUNGE credential for exactly that request (made by root, an
admin here, so the queries behind every endpoint run), and the same operations are fuzzed without one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

from cocaq.accounting.importer import import_records
from cocaq.api import munge
from cocaq.api.client import payload_for
from cocaq.config_load import load_config
from cocaq.db.engine import make_engine
from tests.conftest import new_database
from tests.test_api import _job, need_munge_and_users, server_config

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def app(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    need_munge_and_users()
    tmp = tmp_path_factory.mktemp("fuzz")
    url = new_database("postgresql", tmp, request)
    cfg_path = tmp / "c.toml"
    cfg_path.write_text(server_config(url))
    from cocaq.db import migrate

    engine = make_engine(url)
    migrate.upgrade(engine)
    cfg = load_config(cfg_path, {})
    import_records(
        engine, [_job(1, "alice", "lab_vision", "a", 5), _job(3, "bob", "lab_nlp", "b", 10)], cfg, source="t"
    )
    engine.dispose()
    from cocaq.api.server import create_app

    yield create_app(cfg)


def _schema(app: Any) -> Any:
    return schemathesis.openapi.from_asgi("/openapi.json", app)


def _fuzz(app: Any, authenticated: bool, n: int) -> int:
    """Run every operation `n` times with generated inputs; returns how many requests were made."""
    schema = _schema(app)
    made = 0
    for result in schema.get_all_operations():
        op = result.ok()

        strategy = op.as_strategy()

        @settings(max_examples=n, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(strategy)
        def run(case: Any) -> None:
            nonlocal made
            headers = {}
            if authenticated:
                cred = munge.encode(payload_for(case.method, case.formatted_path))
                headers["Authorization"] = f"MUNGE {cred}"
            response = case.call(headers=headers)
            made += 1
            assert response.status_code < 500, (case.method, case.formatted_path, case.query, response.text)
            case.validate_response(response, checks=[not_a_server_error])

        run()
    return made


@pytest.mark.parametrize("authenticated", [True, False])
def test_no_request_the_schema_allows_gets_a_server_error(
    app: Any, authenticated: bool, tmp_path: Path
) -> None:
    made = _fuzz(app, authenticated, n=100)
    assert made >= 100 * 5, made
