"""The login-node queries' hand-written SQL reads columns the ORM models have, and imports no SQLAlchemy."""

from __future__ import annotations

import subprocess
import sys

from cocaq.db.schema import Base
from cocaq.footprint.totals import READS


def test_columns_the_footprint_sql_reads_are_in_the_models() -> None:
    tables = Base.metadata.tables
    for name, cols in READS.items():
        assert name in tables, f"table {name} is not in the models"
        for col in cols:
            assert col in tables[name].c, f"{name}.{col} is not in the model"


def test_user_query_path_does_not_import_sqlalchemy() -> None:
    code = (
        "import sys, cocaq.cli.app, cocaq.footprint.totals, cocaq.db.dbapi, cocaq.cli.terminal; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sqlalchemy', 'alembic', 'rich')"
        " or m in ('cocaq.db.schema', 'cocaq.db.engine')))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"
