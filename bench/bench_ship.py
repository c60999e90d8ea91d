#!/usr/bin/env python3
"""Benchmark: shipping the collector's spool into PostgreSQL, against raw binary COPY of the same rows.

    .venv/bin/python bench/bench_ship.py              # ~3 minutes on 2 cores
    .venv/bin/python bench/bench_ship.py --profile    # also cProfile of one shipment (200,000 rows)

1. A collector.db spool is filled through the collector's own API (`CollectorDB.record_cycle`, 60
   cycles per call) with --rows (1,000,000) samples as a node with 8 GPUs and 16 jobs writes them every
   10 s: per cycle 8 GPUs x (power_w, util_pct, mem_used_mb, energy_j) with the owning job, RAPL power
   of 2 packages + 2 DRAM domains and the node's unattributed energy, cgroup cpu_cores and mem_mb of 16
   jobs = 69 rows, plus the running per-job energy rows (upserted). 14,493 cycles = 40 hours, inside the
   current month, so every row lands in a monthly partition `cocaq db upgrade` made (not samples_default).
2. Two scratch databases migrated alike with `cocaq db upgrade`: the same `samples` table, partitions
   and indexes (pk_samples on 6 columns, ix_samples_job_ts).
3. --repeat (3) times, the order of the two alternating, each into emptied tables (TRUNCATE samples,
   node_shipments, node_energy) after a CHECKPOINT:
   * ours: a copy of the filled spool; `collector.ship.connect(url)` + `ship_once(...)` with the
     configured batch size (collector.ship_batch, 5000), exactly what `cocaq collector` runs: read a
     batch from SQLite, record it in node_shipments, binary COPY with write_row, commit, delete it from
     the spool;
   * raw COPY, the best Python can do: the same rows pre-encoded (before the clock starts) as one
     PostgreSQL binary COPY stream, written in 1 MiB blocks with `cursor.copy(...).write()` in one
     transaction; the server's work is the same (same rows, table, partitions and indexes);
   * and, for the split, psycopg `write_row` of the same rows already in memory as Python tuples
     (datetime already made), one COPY, one transaction, set_types as ours does.
   The loaded tables are compared (count, sum of values, min and max ts).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import struct
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c

CLUSTER = "bench"
NODE = "gpu-n001"
COLS = "ts, cluster_id, node, source, device, metric, job_id, value"
TYPES = ["timestamptz", "int4", "text", "text", "text", "text", "text", "float8"]
GPUS = [f"GPU-{random.Random(i).getrandbits(128):032x}" for i in range(8)]
GPUS = [f"{g[:12]}-{g[12:16]}-{g[16:20]}-{g[20:24]}-{g[24:36]}" for g in GPUS]
JOBS = [str(4000 + i) for i in range(16)]
RAPL = ["package-0", "package-1", "package-0/dram", "package-1/dram"]
PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


def fill_spool(spool: Path, rows: int, start: float, interval: float = 10.0) -> tuple[int, float]:
    from cocaq.collector.localdb import CollectorDB

    rng = random.Random(20261121)
    db = CollectorDB(str(spool), max_mb=8192)
    per_cycle = len(GPUS) * 4 + len(RAPL) + 1 + len(JOBS) * 2
    cycles = -(-rows // per_cycle)
    t0 = time.perf_counter()
    n = 0
    gpu_mj = [rng.randrange(10**12) for _ in GPUS]
    unattributed = 0.0
    samples: list[tuple[float, str, str, str, str | None, float]] = []
    energy: list[tuple[str, float, str, str, str, str, float, float, float, bool]] = []
    for k in range(cycles):
        ts = start + k * interval
        for g, uuid in enumerate(GPUS):
            job = JOBS[g]
            p = rng.uniform(60, 390)
            gpu_mj[g] += int(p * interval * 1000)
            samples += [
                (ts, "nvml", uuid, "power_w", job, p),
                (ts, "nvml", uuid, "util_pct", job, float(rng.randrange(101))),
                (ts, "nvml", uuid, "mem_used_mb", job, float(rng.randrange(81920))),
                (ts, "nvml", uuid, "energy_j", job, gpu_mj[g] / 1000),
            ]
        for dom in RAPL:
            samples.append((ts, "rapl", dom, "power_w", None, rng.uniform(20, 200)))
        unattributed += rng.uniform(0, 100)
        samples.append((ts, "rapl", "node", "unattributed_j", None, unattributed))
        for j in JOBS:
            samples.append((ts, "cgroup", f"job_{j}", "cpu_cores", j, rng.uniform(0, 4)))
            samples.append((ts, "cgroup", f"job_{j}", "mem_mb", j, float(rng.randrange(65536))))
        for g, j in enumerate(JOBS):
            if g < len(GPUS):
                energy.append((j, start, "gpu", GPUS[g], "nvml", "measured", k * 2000.0, start, ts, False))
            energy.append((j, start, "cpu", "", "rapl", "measured", k * 400.0, start, ts, False))
            energy.append((j, start, "dram", "", "rapl", "measured", k * 40.0, start, ts, False))
        if (k + 1) % 60 == 0 or k == cycles - 1:
            take = samples[: rows - n]
            db.record_cycle(take, energy, {"sources": {}, "last_ts": ts})
            n += len(take)
            samples, energy = [], []
    db.close()
    return n, time.perf_counter() - t0


def spool_rows(spool: Path) -> list[tuple[float, str, str, str, str | None, float]]:
    import sqlite3

    conn = sqlite3.connect(spool / "collector.db")
    try:
        return conn.execute(
            "SELECT ts, source, device, metric, job_id, value FROM samples ORDER BY id"
        ).fetchall()
    finally:
        conn.close()


def encode_binary(rows: list[tuple[float, str, str, str, str | None, float]], cluster_id: int) -> bytes:
    """The PostgreSQL binary COPY stream of the rows, as ship.py's rows would be sent."""
    out = [b"PGCOPY\n\xff\r\n\x00", struct.pack("!ii", 0, 0)]
    node = NODE.encode()
    head_cid_node = struct.pack("!ii", 4, cluster_id) + struct.pack("!i", len(node)) + node
    one_us = timedelta(microseconds=1)
    enc: dict[str | None, bytes] = {None: b"\xff\xff\xff\xff"}

    def text(s: str | None) -> bytes:
        b = enc.get(s)
        if b is None:
            raw = s.encode()  # type: ignore[union-attr]
            b = enc[s] = struct.pack("!i", len(raw)) + raw
        return b

    for ts, src, dev, metric, job, value in rows:
        us = (datetime.fromtimestamp(ts, UTC) - PG_EPOCH) // one_us  # what psycopg sends for _dt(ts)
        out.append(
            b"".join(
                (
                    b"\x00\x08",
                    struct.pack("!iq", 8, us),
                    head_cid_node,
                    text(src),
                    text(dev),
                    text(metric),
                    text(job),
                    struct.pack("!id", 8, value),
                )
            )
        )
    out.append(b"\xff\xff")
    return b"".join(out)


def connect(dbname: str):  # type: ignore[no-untyped-def]
    import psycopg

    return psycopg.connect(c.pg_url(dbname, sqlalchemy=False))


def prepare(dbname: str) -> int:
    """Empty the tables ours writes; CHECKPOINT; the cluster id."""
    with connect(dbname) as conn:
        conn.execute("TRUNCATE samples, node_shipments, node_energy")
        conn.execute("INSERT INTO clusters (name) VALUES (%s) ON CONFLICT (name) DO NOTHING", (CLUSTER,))
        row = conn.execute("SELECT id FROM clusters WHERE name = %s", (CLUSTER,)).fetchone()
        conn.commit()
        conn.autocommit = True
        conn.execute("CHECKPOINT")
    assert row is not None
    return int(row[0])


def fingerprint(dbname: str) -> tuple[int, str, str, str, int]:
    with connect(dbname) as conn:
        r = conn.execute(
            "SELECT count(*), sum(value::numeric)::text, min(ts)::text, max(ts)::text FROM samples"
        ).fetchone()
        d = conn.execute("SELECT count(*) FROM samples_default").fetchone()
    assert r is not None and d is not None
    return int(r[0]), r[1], r[2], r[3], int(d[0])


def run_ours(master: Path, work: Path, dbname: str, batch: int) -> tuple[float, int, int]:
    from cocaq.collector.localdb import CollectorDB
    from cocaq.collector.ship import connect as ship_connect
    from cocaq.collector.ship import ship_once

    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(mode=0o755)
    shutil.copyfile(master / "collector.db", work / "collector.db")
    db = CollectorDB(str(work), max_mb=8192)
    try:
        t0 = time.perf_counter()
        target = ship_connect(c.pg_url(dbname, sqlalchemy=False))
        res = ship_once(target, str(work), db, CLUSTER, NODE, batch_size=batch)
        target.close()
        dt = time.perf_counter() - t0
        if res.error:
            raise SystemExit(f"ship failed: {res.error}")
        left = db.counts()["samples"]
    finally:
        db.close()
    return dt, res.samples, left


def run_raw(dbname: str, stream: bytes) -> float:
    t0 = time.perf_counter()
    with connect(dbname) as conn, conn.cursor() as cur:
        with cur.copy(f"COPY samples ({COLS}) FROM STDIN (FORMAT BINARY)") as cp:
            view = memoryview(stream)
            for i in range(0, len(view), 1 << 20):
                cp.write(view[i : i + (1 << 20)])
        conn.commit()
    return time.perf_counter() - t0


def run_write_row(dbname: str, tuples: list[tuple[object, ...]]) -> float:
    t0 = time.perf_counter()
    with connect(dbname) as conn, conn.cursor() as cur:
        with cur.copy(f"COPY samples ({COLS}) FROM STDIN (FORMAT BINARY)") as cp:
            cp.set_types(TYPES)
            for t in tuples:
                cp.write_row(t)
        conn.commit()
    return time.perf_counter() - t0


def profile_ship(master: Path, work: Path, dbname: str, batch: int, rows: int) -> str:
    """cProfile of ship_once over the first `rows` rows of the spool."""
    import cProfile
    import io
    import pstats
    import sqlite3

    from cocaq.collector.localdb import CollectorDB
    from cocaq.collector.ship import connect as ship_connect
    from cocaq.collector.ship import ship_once

    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(mode=0o755)
    shutil.copyfile(master / "collector.db", work / "collector.db")
    conn = sqlite3.connect(work / "collector.db")
    conn.execute("DELETE FROM samples WHERE id > (SELECT min(id) FROM samples) + ?", (rows - 1,))
    conn.commit()
    conn.close()
    prepare(dbname)
    db = CollectorDB(str(work), max_mb=8192)
    prof = cProfile.Profile()
    try:
        target = ship_connect(c.pg_url(dbname, sqlalchemy=False))
        prof.enable()
        res = ship_once(target, str(work), db, CLUSTER, NODE, batch_size=batch)
        prof.disable()
        target.close()
    finally:
        db.close()
    buf = io.StringIO()
    buf.write(f"shipped {res.samples} samples\n")
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(15)
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(20)
    return buf.getvalue()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--db", default="cocaq_bench_ship")
    p.add_argument("--batch", type=int, default=None, help="ship batch size (default: collector.ship_batch)")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--keep", action="store_true", help="keep the scratch databases")
    a = p.parse_args(argv)

    m = c.machine()
    c.print_machine(m)
    ours_db, raw_db = a.db, a.db + "_raw"
    from cocaq.config import Collector

    batch = a.batch or Collector().ship_batch
    tmp = tempfile.TemporaryDirectory(prefix="cocaq-bench-ship-")
    res: dict[str, object] = {"machine": m, "rows": a.rows, "ship_batch": batch}
    try:
        d = Path(tmp.name)
        for name in (ours_db, raw_db):
            c.recreate_database(name)
            env = {k: v for k, v in os.environ.items() if not k.startswith("COCAQ_")}
            env["COCAQ_DATABASE_URL"] = c.pg_url(name)
            c.run_process([c.COCAQ, "db", "upgrade"], env)

        now = datetime.now(UTC)
        month = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        span = timedelta(seconds=10 * (a.rows // 69 + 1))
        start = max(now - span, month + timedelta(hours=1)).timestamp()
        master = d / "master"
        n, fill_s = fill_spool(master, a.rows, start)
        size = (master / "collector.db").stat().st_size
        print(
            f"\nspool filled through CollectorDB.record_cycle: {n:,} samples in {fill_s:.1f} s,"
            f" collector.db {size / 2**20:.0f} MiB; ts {datetime.fromtimestamp(start, UTC):%Y-%m-%d %H:%M}"
            f" + {span.total_seconds() / 3600:.0f} h"
        )
        rows = spool_rows(master)
        assert len(rows) == n
        cid = prepare(raw_db)
        t0 = time.perf_counter()
        stream = encode_binary(rows, cid)
        print(
            f"pre-encoded the binary COPY stream: {len(stream) / 2**20:.0f} MiB"
            f" in {time.perf_counter() - t0:.1f} s"
        )
        tuples = [
            (datetime.fromtimestamp(ts, UTC), cid, NODE, s, dv, mt, j, v) for ts, s, dv, mt, j, v in rows
        ]
        del rows

        ours_t, raw_t, wr_t, ratios = [], [], [], []
        fp_ours = fp_raw = None
        for r in range(a.repeat):
            order = ("ours", "raw") if r % 2 == 0 else ("raw", "ours")
            got: dict[str, float] = {}
            for what in order:
                if what == "ours":
                    cid_ours = prepare(ours_db)
                    assert cid_ours == cid, (cid_ours, cid)
                    dt, shipped, left = run_ours(master, d / "work", ours_db, batch)
                    assert shipped == n and left == 0, (shipped, left)
                    fp_ours = fingerprint(ours_db)
                else:
                    prepare(raw_db)
                    dt = run_raw(raw_db, stream)
                    fp_raw = fingerprint(raw_db)
                got[what] = dt
            prepare(raw_db)
            wr = run_write_row(raw_db, tuples)
            fp_wr = fingerprint(raw_db)
            assert fp_ours == fp_raw == fp_wr, (fp_ours, fp_raw, fp_wr)
            ours_t.append(got["ours"])
            raw_t.append(got["raw"])
            wr_t.append(wr)
            ratios.append(got["raw"] / got["ours"])
            print(
                f"run {r + 1} ({' then '.join(order)}): ours {got['ours']:.2f} s"
                f" ({n / got['ours']:,.0f} rows/s), raw COPY {got['raw']:.2f} s"
                f" ({n / got['raw']:,.0f} rows/s), ratio {got['raw'] / got['ours']:.2f};"
                f" write_row from memory {wr:.2f} s ({n / wr:,.0f} rows/s)"
            )
        assert fp_ours is not None
        print(
            f"loaded tables identical: {fp_ours[0]:,} rows, sum(value) {fp_ours[1]}, ts {fp_ours[2]} .."
            f" {fp_ours[3]}, {fp_ours[4]} rows in samples_default"
        )
        med = {k: statistics.median(v) for k, v in (("ours", ours_t), ("raw", raw_t), ("write_row", wr_t))}
        ratio = statistics.median(ratios)
        print(f"\n{'what (median of ' + str(a.repeat) + ')':58s} {'s':>7s} {'rows/s':>11s}")
        for label, key in (
            (f"ours: connect + ship_once, batch {batch}", "ours"),
            ("raw binary COPY, pre-encoded, one transaction", "raw"),
            ("psycopg write_row from memory, one transaction", "write_row"),
        ):
            print(f"{label:58s} {med[key]:7.2f} {n / med[key]:11,.0f}")
        verdict = "met" if ratio >= 0.5 else "MISSED"
        print(
            f"ours / raw COPY throughput: {ratio:.2f} (median of the per-run ratios);"
            f" target >= 0.5 -> {verdict}"
        )
        print(f"write_row from memory / raw COPY throughput: {med['raw'] / med['write_row']:.2f}")
        res.update(
            fill_s=fill_s,
            spool_mb=size / 2**20,
            stream_mb=len(stream) / 2**20,
            ours_s=ours_t,
            raw_s=raw_t,
            write_row_s=wr_t,
            ratios=ratios,
            median=med,
            ratio=ratio,
            fingerprint=fp_ours,
        )
        if a.profile:
            prof_rows = min(200_000, n)
            text = profile_ship(master, d / "work", ours_db, batch, prof_rows)
            print(f"\ncProfile of ship_once, {prof_rows:,} rows:\n" + text)
        if a.json:
            a.json.write_text(json.dumps(res, indent=2))
    finally:
        tmp.cleanup()
        if not a.keep:
            c.drop_database(ours_db)
            c.drop_database(raw_db)
    return 0


if __name__ == "__main__":
    sys.exit(main())
