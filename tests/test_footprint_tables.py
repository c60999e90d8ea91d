"""The light Core tables the login-node queries use agree with the ORM models."""

from __future__ import annotations

import subprocess
import sys

from cocaq.footprint import CLUSTERS, JOBS
from cocaq.models import Cluster, Job


def test_light_tables_match_the_models() -> None:
    for light, model in ((JOBS, Job.__table__), (CLUSTERS, Cluster.__table__)):
        for col in light.c:
            assert col.name in model.c, f"{light.name}.{col.name} is not in the model"
            mine, theirs = type(col.type), type(model.c[col.name].type)
            assert (
                issubclass(theirs, mine)
                or issubclass(mine, theirs)
                or (
                    col.name == "id" and model.c[col.name].type._type_affinity is mine  # BigInteger variant
                )
            ), f"{light.name}.{col.name}: {mine.__name__} vs {theirs.__name__}"


def test_user_query_path_does_not_import_the_orm() -> None:
    code = "import sys, cocaq.cli, cocaq.footprint, cocaq.db, cocaq.render; print('sqlalchemy.orm' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "False"
