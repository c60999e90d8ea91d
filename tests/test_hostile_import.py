"""A mixed sacct dump of good jobs and hostile or broken lines: every good job kept, nothing absurd stored.

The hostile lines are the audit's (issue 16): numbers no column holds, negative counts, energies and run
times no node could reach, ends before starts, years 0001, 2 MB names, lone surrogates and NULs. Each is
skipped or corrected by cocaq.slurm.plausible with a reason the import summary shows, on both databases
and both of sacct's formats, and through the real CLI.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import Engine, text

from cocaq.accounting.importer import import_records
from cocaq.config import Config
from cocaq.slurm.plausible import MAX_COMMENT, MAX_NAME, check
from cocaq.slurm.record import JobRecord
from cocaq.slurm.sacct import SACCT_FIELDS, ParseStats, iter_json, iter_parsable
from tests.builders import default_config

COLS = SACCT_FIELDS.split(",")
BASE = {
    "JobID": "{id}", "JobIDRaw": "{id}", "JobName": "train", "User": "alice", "UID": "1001",
    "Account": "lab_nlp", "Partition": "gpu", "QOS": "normal", "NodeList": "gpu01", "NNodes": "1",
    "AllocCPUS": "16", "AllocTRES": "cpu=16,gres/gpu=2,mem=64G,node=1", "ReqTRES": "cpu=16,mem=64G,node=1",
    "ReqMem": "64G", "Submit": "2026-11-10T09:00:00", "Start": "2026-11-10T10:00:00",
    "End": "2026-11-10T16:00:00", "Elapsed": "06:00:00", "ElapsedRaw": "21600", "State": "COMPLETED",
    "ExitCode": "0:0", "TotalCPU": "40:00:00", "Comment": "", "ConsumedEnergyRaw": "", "Cluster": "c1",
    "Timelimit": "1-00:00:00", "MaxRSS": "", "NTasks": "", "TRESUsageInAve": "", "TRESUsageInMax": "",
    "TRESUsageInMin": "", "TRESUsageInMinNode": "", "TRESUsageInMinTask": "",
}  # fmt: skip
BIG = "99999999999999999999"
# (overrides, what happens: "skip: <reason start>" or "keep")
HOSTILE: list[tuple[dict[str, str], str]] = [
    ({"ExitCode": f"{BIG}:0"}, "keep"),
    ({"UID": BIG}, "keep"),
    ({"AllocCPUS": "", "AllocTRES": "cpu=1e20,node=1"}, "skip: alloc_cpus"),
    ({"NNodes": BIG}, "skip: n_nodes"),
    ({"ConsumedEnergyRaw": "9.2e18", "End": "2026-11-10T11:00:00", "ElapsedRaw": "3600"}, "keep"),
    ({"AllocCPUS": "-64"}, "skip: alloc_cpus"),
    ({"AllocTRES": "cpu=16,gres/gpu=-4,node=1"}, "skip: alloc_gpus"),
    ({"End": "2026-11-10T09:30:00", "ElapsedRaw": "", "Elapsed": "00:00:00"}, "skip: ends before"),
    ({"ElapsedRaw": "", "Elapsed": "99999999-00:00:00"}, "keep"),
    ({"Start": "0001-01-01T00:00:00", "Submit": "0001-01-01T00:00:00"}, "skip: submit time"),
    ({"Start": "2999-01-01T00:00:00", "End": "2999-01-01T06:00:00"}, "skip: start or end"),
    ({"JobName": "n" * (2 << 20), "Comment": "c" * (2 << 20)}, "keep"),
    ({"JobName": "evil\x00name\x1b[31m", "Comment": "line 1\nline 2\x00"}, "keep"),
    ({"User": "u" * 100}, "skip: user_name"),
    ({"TotalCPU": "9999-00:00:00"}, "keep"),
    ({"JobIDRaw": BIG + "0"}, "skip: job_id_raw"),
    ({"TRESUsageInAve": f"gres/gpuutil={BIG},mem=1G", "TRESUsageInMax": "gres/gpumem=1e400"}, "keep"),
    ({"TRESUsageInAve": "gres/gpuutil=-5,gres/gpumem=x", "TRESUsageInMax": "gres/gpumem=-1G"}, "keep"),
    ({"TRESUsageInAve": "gres/gpuutil=nan", "TRESUsageInMax": "gres/gpumem=inf"}, "keep"),
]
GOOD = 20
DAY = datetime(2026, 11, 10, tzinfo=UTC)


def cfg() -> Config:
    return default_config(name="c1", carbon_zone="FRA")


def line(job_id: int, **over: str) -> str:
    d = {k: v.replace("{id}", str(job_id)) for k, v in BASE.items()}
    d.update(over)
    return "|".join(d[c] for c in COLS)


def dump() -> list[str]:
    lines = ["|".join(COLS)]
    lines += [line(1000 + i) for i in range(GOOD)]
    lines += [line(2000 + i, **over) for i, (over, _) in enumerate(HOSTILE)]
    return lines


def json_dump() -> str:
    start = int(datetime(2026, 11, 10, 10, tzinfo=UTC).timestamp())

    def job(i: int, **over: object) -> dict[str, object]:
        j: dict[str, object] = {
            "job_id": i, "name": "train", "user": "bob", "account": "lab_cv", "partition": "gpu",
            "nodes": "gpu02", "cluster": "c1", "state": {"current": ["COMPLETED"]},
            "time": {"elapsed": 3600, "start": start, "end": start + 3600, "submission": start - 60},
            "tres": {"allocated": [{"type": "cpu", "name": "", "id": 1, "count": 8},
                                   {"type": "node", "name": "", "id": 4, "count": 1}]},
            "exit_code": {"return_code": 0}, "steps": [],
        }  # fmt: skip
        j.update(over)
        return j

    jobs = [job(3000 + i) for i in range(5)]
    jobs += [
        job(3100, name="gpt-\ud800"),  # a lone surrogate: once an UnicodeEncodeError for the whole import
        job(3101, user="\ud800bob"),
        job(3102, time={"elapsed": 3600, "start": start, "end": start - 10, "submission": start}),
        job(3103, exit_code={"return_code": 10**30}),
    ]
    return json.dumps({"jobs": jobs})  # json.dumps writes the surrogates as \\ud800 escapes


def stored(engine: Engine) -> dict[str, dict[str, object]]:
    with engine.connect() as c:
        rows = c.execute(
            text(
                "SELECT job_id, user_name, uid, exit_code, n_nodes, alloc_cpus, alloc_gpus, start_time, "
                "end_time, elapsed_s, consumed_energy_j, energy_j, total_cpu_s, name, comment FROM jobs"
            )
        ).mappings()
        out = {r["job_id"]: dict(r) for r in rows}
    for r in out.values():  # SQLite gives the stored text
        for k in ("start_time", "end_time"):
            if isinstance(r[k], str):
                r[k] = datetime.fromisoformat(r[k])  # type: ignore[arg-type]
    return out


def _sane(rows: dict[str, dict[str, object]]) -> None:
    for jid, r in rows.items():
        assert 0 <= int(r["n_nodes"]) <= 10**7 and 0 <= int(r["alloc_cpus"]) <= 10**7, jid  # type: ignore[call-overload]
        assert 0 <= int(r["alloc_gpus"]) <= 10**7, jid  # type: ignore[call-overload]
        el = float(r["elapsed_s"])  # type: ignore[arg-type]
        start, end = r["start_time"], r["end_time"]
        assert isinstance(start, datetime) and isinstance(end, datetime)
        start, end = (t if t.tzinfo else t.replace(tzinfo=UTC) for t in (start, end))
        assert datetime(2000, 1, 1, tzinfo=UTC) <= start <= end, jid
        assert 0 <= el <= (end - start).total_seconds() + 1, jid
        nodes = max(int(r["n_nodes"]), 1)  # type: ignore[call-overload]
        assert float(r["energy_j"]) <= nodes * max(el, 1.0) * 20_000, jid  # type: ignore[arg-type]
        for col, limit in (("name", MAX_NAME), ("comment", MAX_COMMENT)):
            v = r[col]
            if v is not None:
                assert isinstance(v, str) and len(v) <= limit and "\x00" not in v, (jid, col)
                v.encode("utf-8")  # no lone surrogates
        for col in ("uid", "exit_code"):
            assert r[col] is None or 0 <= int(r[col]) < 2**31, (jid, col)  # type: ignore[call-overload]


def test_a_mixed_parsable_dump_keeps_every_good_job_and_stores_nothing_absurd(engine: Engine) -> None:
    st = ParseStats()
    recs = iter_parsable((x.encode("utf-8", "surrogatepass") + b"\n" for x in dump()), tz=UTC, stats=st)
    s = import_records(engine, recs, cfg(), source="sacct-parsable", batch_size=7)
    rows = stored(engine)
    assert all(str(1000 + i) in rows for i in range(GOOD)), "every good job kept"
    for i, (_over, want) in enumerate(HOSTILE):
        jid = str(2000 + i)
        if want == "keep":
            assert jid in rows, (jid, dict(s.skipped), dict(st.skipped))
        else:
            assert jid not in rows, jid
            reason = want.removeprefix("skip: ")
            assert any(k.startswith(reason) for k in s.skipped) or any(reason in k for k in st.skipped), (
                reason,
                dict(s.skipped),
                dict(st.skipped),
            )
    _sane(rows)
    # the corrections, each kept job with what was wrong made safe
    assert rows["2000"]["exit_code"] is None and rows["2001"]["uid"] is None
    assert rows["2004"]["consumed_energy_j"] is None, "9.2e18 J in an hour: dropped, estimated instead"
    assert float(rows["2008"]["elapsed_s"]) == 6 * 3600.0  # type: ignore[arg-type]
    assert len(str(rows["2011"]["name"])) == MAX_NAME and len(str(rows["2011"]["comment"])) == MAX_COMMENT
    assert rows["2012"]["name"] == "evilname[31m" and rows["2012"]["comment"] == "line 1\nline 2"
    assert rows["2014"]["total_cpu_s"] is None
    assert s.clamped and all(n > 0 for n in s.clamped.values())
    # the same dump again: the corrections were made before hashing, so nothing changes
    st2 = ParseStats()
    recs2 = iter_parsable((x.encode("utf-8", "surrogatepass") + b"\n" for x in dump()), tz=UTC, stats=st2)
    again = import_records(engine, recs2, cfg(), source="sacct-parsable", batch_size=7)
    assert (again.inserted, again.updated) == (0, 0)


def test_a_mixed_json_dump(engine: Engine) -> None:
    st = ParseStats()
    s = import_records(engine, iter_json(json_dump().encode(), stats=st), cfg(), source="sacct-json")
    rows = stored(engine)
    assert all(str(3000 + i) in rows for i in range(5))
    assert rows["3100"]["name"] == "gpt-\ufffd" and rows["3101"]["user_name"] == "\ufffdbob"
    assert "3102" not in rows and "ends before it started" in s.skipped
    assert rows["3103"]["exit_code"] is None
    _sane(rows)


def test_every_rule_is_a_skip_or_a_correction_never_an_exception() -> None:
    """Records as no parser makes them (pyslurm, a future format): wrong types, NaN, huge ints."""
    now = datetime.now(UTC)
    base = JobRecord(
        job_id="1", user_name="a", submit_time=DAY, state="COMPLETED", start_time=DAY, end_time=DAY, n_nodes=1
    )
    odd: list[object] = [None, -1, 10**400, float("nan"), float("inf"), -0.0, "x", "\ud800", b"x", [1]]
    for name in JobRecord.__slots__:
        for v in odd:
            rec = replace(base)
            try:
                setattr(rec, name, v)
            except TypeError:
                continue
            p = check(rec, now)
            if p.skip is None:  # then what is stored is storable
                for f in ("name", "comment", "user_name", "job_id", "account", "node_list"):
                    x = getattr(rec, f)
                    assert x is None or (isinstance(x, str) and "\x00" not in x), (name, v, f)
                    if isinstance(x, str):
                        x.encode("utf-8")


def test_the_cli_says_what_it_skipped_and_corrected(tmp_path: Path) -> None:
    f = tmp_path / "dump.txt"
    lines = [x.replace("line 1\nline 2", "line 1 line 2") for x in dump()]  # one job a line
    f.write_bytes("\n".join(lines).encode("utf-8", "surrogatepass") + b"\n")
    db = tmp_path / "c.db"
    env = {"COCAQ_DATABASE_URL": f"sqlite:///{db}", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    r = subprocess.run(
        [sys.executable, "-m", "cocaq", "db", "upgrade"], env=env, capture_output=True, text=True, check=False
    )
    assert r.returncode == 0, r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "cocaq", "import", "sacct", "--file", str(f)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    err = r.stderr
    assert f"imported {GOOD + sum(w == 'keep' for _, w in HOSTILE)}" in err, err
    assert "skipped 1: ends before it started (first: job 2007)" in err, err
    assert "kept, corrected 1: ConsumedEnergy over nodes x elapsed x 20000 W" in err, err
    assert "Traceback" not in err
