"""Driver for check_equivalence.py: run import_records from whichever cocaq package is first on sys.path.

    python _equiv_driver.py DB_URL BATCH_SIZE NODE_GROUPS(0|1) DUMP [DUMP ...]

Migrates the database, imports the dumps one after the other, prints one JSON line: per dump the
summary (inserted, updated, unchanged, unknown partitions, unknown zones) or the exception raised.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import replace
from datetime import UTC
from pathlib import Path

from cocaq.accounting.importer import import_records
from cocaq.config import Hardware, NodeGroup
from cocaq.config_load import load_config
from cocaq.db import migrate
from cocaq.db.engine import make_engine
from cocaq.slurm.sacct import ParseStats, iter_parsable

CONFIG = Path(__file__).resolve().parent / "bench.toml"


def main() -> None:
    url, batch, groups, *dumps = sys.argv[1:]
    logging.basicConfig(level=logging.ERROR)
    cfg = load_config(CONFIG, environ={})
    if groups == "1":
        cfg = replace(
            cfg,
            node_groups=(
                NodeGroup("h100_low", ("h100-[001-012]",), Hardware(cpu_tdp_w_per_core=9.0, gpu_tdp_w=650.0)),
                NodeGroup("cpu_odd", ("cpu-1*",), Hardware(carbon_zone="XX-NOWHERE", pue=1.6)),
            ),
        )
    engine = make_engine(url)
    migrate.upgrade(engine)
    out = []
    for dump in dumps:
        with open(dump, "rb") as fh:
            try:
                s = import_records(
                    engine,
                    iter_parsable(fh, tz=UTC, stats=ParseStats()),
                    cfg,
                    source="sacct-parsable",
                    batch_size=int(batch),
                )
                out.append(
                    {
                        "inserted": s.inserted,
                        "updated": s.updated,
                        "unchanged": s.unchanged,
                        "unknown_partitions": dict(s.unknown_partitions),
                        "unknown_zones": sorted(s.unknown_zones),
                    }
                )
            except Exception as exc:  # compared as they are
                out.append({"error": f"{type(exc).__module__}.{type(exc).__name__}: {exc}".splitlines()[0]})
    engine.dispose()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
