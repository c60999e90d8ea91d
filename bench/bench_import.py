#!/usr/bin/env python3
"""Benchmark: `cocaq import sacct` of 1,000,000 sacct lines into PostgreSQL, against raw COPY.

    .venv/bin/python bench/bench_import.py            # ~5 minutes on 2 cores

The target (issue 34): the import at most 5x a plain COPY of the same file's lines into a one-column
table (reference D, same run), with a peak RSS of at most 300 MiB.

What it does, all in one run so the machine's noise hits every number alike:

1. bench/gen_sacct.py writes 1,000,000 `--parsable2` lines (plus header) to a temporary file, which is
   read once so every later reader finds it in the page cache;
2. --repeat times (3): a fresh database (`cocaq_bench_import`), `cocaq db upgrade`, CHECKPOINT,
   `cocaq import sacct --file F` as a whole process (wall clock around the subprocess; peak RSS, user
   and system CPU from GNU time -v); CHECKPOINT; then reference D, the issue's: a plain COPY of the
   same file's lines (header skipped), each line one value, into a one-column text table; then
   reference A, the physical limit for the input: psycopg `COPY raw_lines FROM STDIN (FORMAT text,
   DELIMITER '|')` of the same bytes into a plain logged table of 26 text columns, no indexes (both the
   import's neighbours in time, so their ratios are taken under the same conditions);
3. reference B, the limit for the output: the final rows, `COPY (SELECT * FROM jobs) TO STDOUT` into a
   buffer, then `COPY` of that buffer into an empty `LIKE jobs INCLUDING ALL` (same indexes); the
   same for job_energy;
4. the same import again into the loaded database (every job unchanged: the idempotent path);
5. reference C: the parser alone (iter_parsable over the file in this process, records dropped);
6. the peer: the same import into a fresh database by cocaq as it was at --baseline-rev (its whole
   `cocaq` package and root folders, from git), with reference D right after it.

Prints the machine, a results table and the ratios; --json writes them too.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c
import gen_sacct


def raw_copy(dbname: str, path: Path) -> tuple[float, int]:
    """COPY the file's data lines into a fresh table of text columns; (seconds, rows)."""
    cols = ", ".join(f'"{f.lower()}" text' for f in gen_sacct.FIELDS)
    return _copy_lines(dbname, path, "raw_lines", cols, "DELIMITER '|'")


def one_column_copy(dbname: str, path: Path) -> tuple[float, int]:
    """The issue's reference: COPY the file's data lines into a one-column text table; (seconds, rows).

    Text format with a delimiter no line holds (\\x01), so each line is one value."""
    return _copy_lines(dbname, path, "one_column", "line text", "DELIMITER E'\\x01'")


def _copy_lines(dbname: str, path: Path, table: str, cols: str, delimiter: str) -> tuple[float, int]:
    """The file's data lines (header skipped) COPYed as text into a fresh `table`, timed, then dropped."""
    import psycopg

    with psycopg.connect(c.pg_url(dbname, sqlalchemy=False)) as conn, conn.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {table}")
        cur.execute(f"CREATE TABLE {table} ({cols})")
        conn.commit()
        t0 = time.perf_counter()
        with open(path, "rb") as fh:
            fh.readline()  # the header
            with cur.copy(f"COPY {table} FROM STDIN (FORMAT text, {delimiter})") as cp:
                while block := fh.read(1 << 20):
                    cp.write(block)
        conn.commit()
        secs = time.perf_counter() - t0
        n = cur.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # type: ignore[index]
        cur.execute(f"DROP TABLE {table}")
        conn.commit()
    return secs, n


def final_rows_copy(dbname: str, table: str) -> tuple[float, float, int, int]:
    """(export s, load s, rows, bytes): the table's rows out to a buffer and into an empty copy of it."""
    import psycopg

    with psycopg.connect(c.pg_url(dbname, sqlalchemy=False)) as conn, conn.cursor() as cur:
        buf = io.BytesIO()
        t0 = time.perf_counter()
        with cur.copy(f"COPY (SELECT * FROM {table}) TO STDOUT") as cp:
            for data in cp:
                buf.write(data)
        export = time.perf_counter() - t0
        copy_table = f"{table}_copy"
        cur.execute(f"DROP TABLE IF EXISTS {copy_table}")
        cur.execute(f"CREATE TABLE {copy_table} (LIKE {table} INCLUDING ALL)")
        conn.commit()
        data = buf.getvalue()
        t0 = time.perf_counter()
        with cur.copy(f"COPY {copy_table} FROM STDIN") as cp:
            for i in range(0, len(data), 1 << 20):
                cp.write(data[i : i + (1 << 20)])
        conn.commit()
        load = time.perf_counter() - t0
        n = cur.execute(f"SELECT count(*) FROM {copy_table}").fetchone()[0]  # type: ignore[index]
        cur.execute(f"DROP TABLE {copy_table}")
        conn.commit()
    return export, load, n, len(data)


def make_baseline(root: Path, rev: str) -> str:
    """cocaq as of `rev` under `root`: its package and the root folders it links to (git archive)."""
    import subprocess

    names = ["cocaq", "collector", "prolog_epilog", "reports", "migrations", "pyproject.toml"]
    archive = subprocess.run(
        ["git", "archive", rev, "--", *names], cwd=c.ROOT, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    return subprocess.run(
        ["git", "log", "-1", "--format=%h %s", rev], cwd=c.ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()


def parse_only(path: Path) -> tuple[float, int]:
    """cocaq.slurm.sacct.iter_parsable over the file, records dropped: the parser's own time."""
    from datetime import UTC

    from cocaq.slurm.sacct import ParseStats, iter_parsable

    t0 = time.perf_counter()
    with open(path, "rb") as fh:
        n = sum(1 for _ in iter_parsable(fh, tz=UTC, stats=ParseStats()))
    return time.perf_counter() - t0, n


def checkpoint() -> None:
    """Flush the previous step's dirty pages now, so its checkpoint does not land in the next timing."""
    import psycopg

    with psycopg.connect(c.ADMIN_URL, autocommit=True) as conn:
        conn.execute("CHECKPOINT")


def counts(dbname: str) -> tuple[int, int]:
    import psycopg

    with psycopg.connect(c.pg_url(dbname, sqlalchemy=False)) as conn:
        jobs = conn.execute("SELECT count(*) FROM jobs").fetchone()[0]  # type: ignore[index]
        energy = conn.execute("SELECT count(*) FROM job_energy").fetchone()[0]  # type: ignore[index]
    return jobs, energy


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lines", type=int, default=1_000_000)
    p.add_argument("--db", default="cocaq_bench_import")
    p.add_argument("--seed", type=int, default=20261121)
    p.add_argument("--file", type=Path, default=None, help="reuse this dump instead of generating one")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.add_argument("--repeat", type=int, default=3, help="fresh-database imports to time (median reported)")
    p.add_argument(
        "--baseline-rev",
        default="440f21e",
        help="also time cocaq as of this git revision (the peer: before issue 34's work); '' to skip",
    )
    p.add_argument("--keep", action="store_true", help="keep the database and the dump")
    a = p.parse_args(argv)

    m = c.machine()
    c.print_machine(m)
    env = c.cocaq_env(a.db)
    cfg = ["--config", str(c.CONFIG)]
    tmpdir = tempfile.TemporaryDirectory(prefix="cocaq-bench-")
    path = a.file or Path(tmpdir.name) / f"sacct-{a.lines}.txt"
    if a.file is None:
        t0 = time.perf_counter()
        end = float(int(time.time()) // 3600 * 3600)
        with open(path, "w", encoding="utf-8", newline="\n") as fh:
            n_lines, n_jobs = gen_sacct.generate(fh, jobs=None, lines=a.lines, seed=a.seed, end=end)
        print(
            f"generated {n_lines:,} lines ({n_jobs:,} job lines) in {time.perf_counter() - t0:.1f} s: {path}"
        )
    size = path.stat().st_size
    with open(path, "rb") as fh:  # also pulls the file into the page cache
        data_lines = sum(1 for _ in fh) - 1

    res: dict[str, object] = {"machine": m, "lines": data_lines, "bytes": size}
    imports, raws, ratios, ones, one_ratios = [], [], [], [], []
    imp = None
    for r in range(a.repeat):
        c.recreate_database(a.db)
        c.run_process([c.COCAQ, *cfg, "db", "upgrade"], env)
        checkpoint()
        imp = c.run_process([c.COCAQ, *cfg, "import", "sacct", "--file", str(path)], env, rss=True)
        checkpoint()
        ref_d, n_one = one_column_copy(a.db, path)
        assert n_one == data_lines, (n_one, data_lines)
        checkpoint()
        ref_a, n_raw = raw_copy(a.db, path)
        assert n_raw == data_lines, (n_raw, data_lines)
        imports.append(imp)
        raws.append(ref_a)
        ratios.append(imp.wall_s / ref_a)
        ones.append(ref_d)
        one_ratios.append(imp.wall_s / ref_d)
        print(
            f"run {r + 1}: one-column COPY {ref_d:.2f} s, raw COPY {ref_a:.2f} s, import {imp.wall_s:.2f} s "
            f"({imp.wall_s / ref_d:.1f}x the one-column COPY, {imp.wall_s / ref_a:.1f}x the raw COPY), "
            f"user {imp.user_s:.1f} s sys {imp.sys_s:.1f} s, peak RSS {imp.max_rss_mb:.0f} MiB"
        )
    assert imp is not None
    summary = next((ln for ln in imp.stderr.splitlines() if "records read" in ln), "")
    jobs, energy = counts(a.db)

    checkpoint()
    exp_j, load_j, n_j, bytes_j = final_rows_copy(a.db, "jobs")
    checkpoint()
    exp_e, load_e, n_e, bytes_e = final_rows_copy(a.db, "job_energy")
    assert n_j == jobs and n_e == energy

    checkpoint()
    again = c.run_process([c.COCAQ, *cfg, "import", "sacct", "--file", str(path)], env, rss=True)
    summary2 = next((ln for ln in again.stderr.splitlines() if "records read" in ln), "")
    m2 = re.search(r"imported ([\d,]+), updated ([\d,]+), unchanged ([\d,]+)", summary2)
    assert m2 and m2.group(1) == "0" and m2.group(2) == "0", summary2

    parse_s, parsed = parse_only(path)
    assert parsed == jobs, (parsed, jobs)
    print(f"the parser alone (iter_parsable over the file in this process, no database): {parse_s:.2f} s")

    base = None
    if a.baseline_rev:
        with tempfile.TemporaryDirectory(prefix="cocaq-baseline-") as bdir:
            label = make_baseline(Path(bdir), a.baseline_rev)
            c.recreate_database(a.db)
            c.run_process([c.COCAQ, *cfg, "db", "upgrade"], env)
            checkpoint()
            base = c.run_process(
                [sys.executable, "-m", "cocaq", *cfg, "import", "sacct", "--file", str(path)],
                env,
                rss=True,
                cwd=Path(bdir),
            )
            b_summary = next((ln for ln in base.stderr.splitlines() if "records read" in ln), "")
            assert b_summary.split(": ", 1)[1] == summary.split(": ", 1)[1], (b_summary, summary)
            checkpoint()
            base_ref_d, _ = one_column_copy(a.db, path)
            print(
                f"baseline ({label}): import {base.wall_s:.2f} s ({base.wall_s / base_ref_d:.1f}x its "
                f"one-column COPY, {base_ref_d:.2f} s), user {base.user_s:.1f} s, "
                f"peak RSS {base.max_rss_mb:.0f} MiB; same summary line"
            )

    walls = [i.wall_s for i in imports]
    imp_med = statistics.median(walls)
    raw_med = statistics.median(raws)
    ratio_med = statistics.median(ratios)
    one_med = statistics.median(ones)
    one_ratio_med = statistics.median(one_ratios)
    ref_b = load_j + load_e
    rss = max(i.max_rss_mb or 0.0 for i in imports)
    spread = f" (runs: {', '.join(f'{w:.1f}' for w in walls)})" if len(walls) > 1 else ""
    rows = [
        (
            f"cocaq import sacct, fresh database, median of {len(walls)}{spread}",
            imp_med,
            data_lines / imp_med,
        ),
        ("cocaq import sacct again, all unchanged", again.wall_s, data_lines / again.wall_s),
        *(
            [
                (
                    f"peer: the importer before this work ({a.baseline_rev}), fresh database",
                    base.wall_s,
                    data_lines / base.wall_s,
                )
            ]
            if base
            else []
        ),
        (
            f"ref D (the issue's): plain COPY of the same lines into one text column, median of {len(ones)}",
            one_med,
            data_lines / one_med,
        ),
        (f"ref A: raw COPY of the same input lines, median of {len(raws)}", raw_med, data_lines / raw_med),
        (f"ref B: COPY of the final {jobs:,} jobs rows into LIKE jobs INCLUDING ALL", load_j, None),
        (
            f"ref B: COPY of the final {energy:,} job_energy rows into LIKE job_energy INCLUDING ALL",
            load_e,
            None,
        ),
        ("ref B: both (what the output costs PostgreSQL to take in)", ref_b, None),
        ("ref C: the sacct parser alone, no database (cocaq/slurm/sacct.py)", parse_s, data_lines / parse_s),
    ]
    print()
    print(
        f"input: {data_lines:,} sacct --parsable2 lines ({size / 2**20:.0f} MiB) -> {jobs:,} jobs, "
        f"{energy:,} job_energy rows"
    )
    print(f"import: {summary.strip()}")
    print(f"again:  {summary2.strip()}")
    print()
    print("| what | seconds | lines/s |")
    print("|---|---:|---:|")
    for name, secs, rate in rows:
        print(f"| {name} | {secs:.2f} | {f'{rate:,.0f}' if rate else ''} |")
    print()
    print(
        f"import CPU (cocaq process, median run): user {statistics.median(i.user_s for i in imports):.1f} s, "
        f"sys {statistics.median(i.sys_s for i in imports):.1f} s; peak RSS {rss:.0f} MiB "
        f"(re-import {again.max_rss_mb:.0f} MiB)"
    )
    print(
        f"ref B export (COPY TO a buffer, not counted): jobs {exp_j:.2f} s ({bytes_j / 2**20:.0f} MiB), "
        f"job_energy {exp_e:.2f} s ({bytes_e / 2**20:.0f} MiB)"
    )
    print()
    print(f"ratio import / one-column COPY of the input (median of per-run ratios): {one_ratio_med:.1f}x")
    print(f"ratio import / raw COPY of the input (median of per-run ratios): {ratio_med:.1f}x")
    print(f"ratio import / COPY of the final rows (jobs + job_energy): {imp_med / ref_b:.1f}x")
    print(f"ratio re-import / raw COPY of the input: {again.wall_s / raw_med:.1f}x")
    print(
        f"ratio import / the parser alone: {imp_med / parse_s:.1f}x (the parser is {parse_s / imp_med:.0%} "
        "of the import's wall time)"
    )
    if base:
        print(
            f"ratio importer before this work / now: {base.wall_s / imp_med:.2f}x (one-column COPY ratios: "
            f"{base.wall_s / base_ref_d:.1f}x then, {one_ratio_med:.1f}x now)"
        )
    speed = "MET" if one_ratio_med <= 5 else "MISSED"
    memory = "MET" if rss <= 300 else "MISSED"
    print(
        f"target: import of {data_lines:,} lines at most 5x the one-column COPY: {speed} "
        f"({one_ratio_med:.1f}x; import median {imp_med:.1f} s, best {min(walls):.1f} s, "
        f"worst {max(walls):.1f} s; "
        f"one-column COPY median {one_med:.2f} s); peak RSS at most 300 MiB: {memory} ({rss:.0f} MiB)"
    )
    res.update(
        import_s=walls,
        import_user_s=[i.user_s for i in imports],
        import_sys_s=[i.sys_s for i in imports],
        import_rss_mb=rss,
        reimport_s=again.wall_s,
        reimport_rss_mb=again.max_rss_mb,
        raw_copy_s=raws,
        one_column_copy_s=ones,
        ratio_one_column=one_ratio_med,
        final_jobs_copy_s=load_j,
        final_energy_copy_s=load_e,
        jobs=jobs,
        job_energy=energy,
        summary=summary.strip(),
        summary_again=summary2.strip(),
        baseline_s=base.wall_s if base else None,
        parse_only_s=parse_s,
        baseline_rev=a.baseline_rev,
    )
    if a.json:
        a.json.write_text(json.dumps(res, indent=2))
    if a.keep:
        print(f"kept database {a.db} and {path}")
        if a.file is None:
            keep_path = Path(tempfile.gettempdir()) / path.name
            path.replace(keep_path)
            print(f"dump moved to {keep_path}")
    else:
        c.drop_database(a.db)
    tmpdir.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
