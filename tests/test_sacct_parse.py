"""The sacct parser on messy real-world output: every line imports, folds into its job, or is skipped and counted."""

from __future__ import annotations

import io
import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from cocaq.slurm import sacct
from cocaq.slurm.record import JobRecord
from cocaq.slurm.sacct import (
    SACCT_FIELDS,
    ParseStats,
    SacctFormatError,
    gpus_from_tres,
    iter_json,
    iter_parsable,
    parse_mem_mb,
    parse_tres,
    sniff_format,
)
from cocaq.timeparse import parse_slurm_duration

DATA = Path(__file__).parent / "data" / "sacct"
PARIS = ZoneInfo("Europe/Paris")
T0 = datetime(2026, 7, 1, 10, 0, tzinfo=UTC)  # time.start of most jobs in the messy_*.json files
COLS = SACCT_FIELDS.split(",")
# A finished one-hour job; rows override what they test.
BASE = {
    "JobID": "7",
    "JobIDRaw": "7",
    "JobName": "train",
    "User": "alice",
    "UID": "1001",
    "Account": "lab",
    "Partition": "gpu",
    "QOS": "normal",
    "NodeList": "gpu01",
    "NNodes": "1",
    "AllocCPUS": "4",
    "AllocTRES": "billing=4,cpu=4,gres/gpu=1,mem=16G,node=1",
    "ReqTRES": "billing=4,cpu=4,gres/gpu=1,mem=16G,node=1",
    "ReqMem": "16G",
    "Submit": "2026-07-01T09:00:00",
    "Start": "2026-07-01T10:00:00",
    "End": "2026-07-01T11:00:00",
    "Elapsed": "01:00:00",
    "ElapsedRaw": "3600",
    "State": "COMPLETED",
    "ExitCode": "0:0",
    "TotalCPU": "02:00:00",
    "Comment": "",
    "ConsumedEnergyRaw": "900000",
    "Cluster": "midway",
    "Timelimit": "02:00:00",
}


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def row(cols: list[str] = COLS, delim: str = "|", **values: str) -> str:
    vals = {**BASE, **values}
    return delim.join(vals.get(c, "") for c in cols)


def dump(*rows: str, cols: list[str] | None = COLS, delim: str = "|", eol: str = "\n") -> bytes:
    lines = ([delim.join(cols)] if cols else []) + list(rows)
    return "".join(x + eol for x in lines).encode()


def parse(data: bytes, **kw: object) -> tuple[dict[str, JobRecord], ParseStats]:
    st = ParseStats()
    kw.setdefault("tz", UTC)
    recs = list(iter_parsable(io.BytesIO(data), stats=st, **kw))  # type: ignore[arg-type]
    by_id = {r.job_id: r for r in recs}
    assert len(by_id) == len(recs), "a job came out twice"
    assert_accounted(st)
    return by_id, st


def parse_json(data: bytes | str, **kw: object) -> tuple[dict[str, JobRecord], ParseStats]:
    st = ParseStats()
    recs = list(iter_json(data, stats=st, **kw))  # type: ignore[arg-type]
    by_id = {r.job_id: r for r in recs}
    assert len(by_id) == len(recs)
    return by_id, st


def assert_accounted(st: ParseStats) -> None:
    """Every data line became a job, a step, or a counted skip (an orphan step counts as both)."""
    orphans = st.skipped["step without its job line"]
    assert st.lines == st.jobs + st.steps + sum(st.skipped.values()) - orphans


def bad_values(st: ParseStats) -> int:
    return sum(n for reason, n in st.skipped.items() if reason.startswith("bad value ("))


# --- the messy parsable dump (tests/data/sacct/messy_parsable.txt, --parsable with trailing '|') --------


@pytest.fixture(scope="module")
def messy_bytes() -> bytes:
    return (DATA / "messy_parsable.txt").read_bytes()


@pytest.fixture(scope="module")
def messy(messy_bytes: bytes) -> tuple[dict[str, JobRecord], ParseStats]:
    return parse(messy_bytes)


def test_messy_dump_every_line_imported_or_counted(messy: tuple[dict[str, JobRecord], ParseStats]) -> None:
    jobs, st = messy
    assert list(jobs) == ["2001", "2002_4", "2003+0", "2003+1", "2005", "2006", "2008", "2009", "2013"]
    assert (st.lines, st.jobs, st.steps) == (21, 9, 7)
    assert st.skipped == {
        "pending (not started yet)": 2,  # 2002_[5-9%2] and 2007
        "wrong number of fields (30, expected 28; delimiter inside a value?)": 1,  # 2010, 'a|b' as name
        "bad value (invalid literal for int() with base 10: …)": 1,  # 2011, NNodes 'two'
        "never started (ended before it ran)": 1,  # 2012
        "step without its job line": 1,  # 1999.batch
    }
    assert st.examples["pending (not started yet)"] == "line 9"
    assert st.examples["step without its job line"] == "line 23"
    assert st.replaced_bytes_lines == 1


def test_messy_steps_fold_into_their_job(messy: tuple[dict[str, JobRecord], ParseStats]) -> None:
    jobs, _ = messy
    # no TotalCPU / energy on the job line: steps' CPU is summed, their energy is the max (not 125000, the sum)
    assert jobs["2001"].total_cpu_s == pytest.approx(3600 + 0.5 + 2 * 86400)
    assert jobs["2001"].consumed_energy_j == 120000.0
    # the job's own values win over its steps'
    assert jobs["2002_4"].total_cpu_s == 600.0
    assert jobs["2002_4"].consumed_energy_j == 36000.0
    # a zero TotalCPU is filled from the steps; no energy anywhere stays None
    assert jobs["2003+0"].total_cpu_s == 240.0
    assert jobs["2003+0"].consumed_energy_j is None
    assert jobs["2003+1"].total_cpu_s is None
    assert jobs["2008"].total_cpu_s == 0.0


def test_messy_array_and_het_ids(messy: tuple[dict[str, JobRecord], ParseStats]) -> None:
    jobs, _ = messy
    a = jobs["2002_4"]
    assert (a.array_job_id, a.array_task_id, a.job_id_raw, a.het_job_id) == (2002, 4, 2010, None)
    h0, h1 = jobs["2003+0"], jobs["2003+1"]
    assert (h0.het_job_id, h0.het_job_offset, h0.job_id_raw, h0.array_job_id) == (2003, 0, 2003, None)
    assert (h1.het_job_id, h1.het_job_offset, h1.job_id_raw) == (2003, 1, 2004)
    assert not any(k.startswith("2002_[") for k in jobs)


def test_messy_states(messy: tuple[dict[str, JobRecord], ParseStats]) -> None:
    jobs, _ = messy
    assert (jobs["2003+0"].state, jobs["2003+0"].state_detail) == ("CANCELLED", "CANCELLED by 12345")
    assert (jobs["2003+0"].exit_code, jobs["2003+0"].exit_signal) == (0, 15)
    assert (jobs["2005"].state, jobs["2005"].state_detail) == ("NODE_FAIL", None)
    assert (jobs["2006"].state, jobs["2006"].exit_signal) == ("OUT_OF_MEMORY", 125)
    assert (jobs["2013"].state, jobs["2013"].exit_signal) == ("TIMEOUT", 1)
    assert (jobs["2002_4"].state, jobs["2002_4"].exit_code) == ("FAILED", 1)
    running = jobs["2008"]
    assert (running.state, running.is_open, running.end_time) == ("RUNNING", True, None)
    assert running.start_time == utc(2026, 3, 1, 9, 30)
    assert running.elapsed_s == 10800.0
    assert not any(r.is_open for k, r in jobs.items() if k != "2008")


def test_messy_memory_and_gpus(messy: tuple[dict[str, JobRecord], ParseStats]) -> None:
    jobs, _ = messy
    assert jobs["2001"].req_mem_mb == 199 * 1024  # ReqMem 199G
    assert jobs["2002_4"].req_mem_mb == 2 * 4 * 1024  # 4Gn on 2 nodes
    assert jobs["2005"].req_mem_mb == 4 * 4 * 1024  # 4Gc on 4 CPUs
    assert jobs["2006"].req_mem_mb == 32000  # 32000M
    assert jobs["2003+0"].req_mem_mb == 16000  # mem= in AllocTRES wins over ReqMem 4000M
    assert jobs["2013"].req_mem_mb is None
    assert (jobs["2001"].alloc_gpus, jobs["2001"].gpu_type) == (8, None)
    assert (jobs["2002_4"].alloc_gpus, jobs["2002_4"].gpu_type) == (4, "a100")  # typed only
    assert (jobs["2003+1"].alloc_gpus, jobs["2003+1"].gpu_type) == (4, "a100")  # gres/gpu=4 wins over :a100=2
    assert (jobs["2005"].alloc_gpus, jobs["2005"].gpu_type) == (0, None)
    assert (jobs["2001"].n_nodes, jobs["2001"].alloc_cpus, jobs["2001"].node_list) == (2, 64, "gpu[01-02]")


def test_messy_times_and_limits(messy: tuple[dict[str, JobRecord], ParseStats]) -> None:
    jobs, _ = messy
    j = jobs["2001"]
    assert j.elapsed_s == 86400 + 4 * 3600 + 33 * 60 + 44  # ElapsedRaw empty, Elapsed 1-04:33:44
    assert (j.submit_time, j.start_time, j.end_time) == (
        utc(2026, 3, 1, 8),
        utc(2026, 3, 1, 9),
        utc(2026, 3, 2, 13, 33, 44),
    )
    assert j.time_limit_s == 2 * 86400
    assert jobs["2006"].time_limit_s == 30 * 60  # bare minutes
    assert jobs["2003+0"].time_limit_s is None  # UNLIMITED
    assert jobs["2003+1"].time_limit_s is None  # Partition_Limit
    assert jobs["2013"].submit_time == jobs["2013"].start_time == utc(2026, 3, 1, 15)  # Submit Unknown


def test_messy_text_fields(messy: tuple[dict[str, JobRecord], ParseStats]) -> None:
    jobs, _ = messy
    assert jobs["2009"].name == "r\ufffdsum\ufffd"  # latin-1 bytes, line still imported
    assert jobs["2009"].comment == "caf\ufffd \ufffd"
    assert jobs["2013"].user_name == "uid:1099"  # empty User, UID kept
    assert jobs["2013"].uid == 1099
    j = jobs["2001"]
    assert (j.user_name, j.uid, j.account, j.partition, j.qos, j.cluster) == (
        "alice",
        1001,
        "lab_vision",
        "gpu",
        "normal",
        "midway",
    )
    assert (j.name, j.comment) == ("train", "exp=resnet50")


def test_messy_crlf_gives_the_same_jobs(
    messy_bytes: bytes, messy: tuple[dict[str, JobRecord], ParseStats]
) -> None:
    jobs, st = parse(messy_bytes.replace(b"\n", b"\r\n"))
    assert jobs == messy[0]
    assert (st.skipped, st.replaced_bytes_lines) == (messy[1].skipped, 1)


def test_messy_headerless_archive_with_fields(
    messy_bytes: bytes, messy: tuple[dict[str, JobRecord], ParseStats]
) -> None:
    header, _, body = messy_bytes.partition(b"\n")
    fields = header.decode().rstrip("|").split("|")
    assert "Reservation" in fields and "WorkDir" in fields  # columns the parser does not know
    jobs, st = parse(body, fields=fields)
    assert jobs == messy[0]
    assert st.skipped == messy[1].skipped


def test_messy_cluster_time_zone(messy_bytes: bytes) -> None:
    jobs, _ = parse(messy_bytes, tz=PARIS)
    assert jobs["2001"].start_time == utc(2026, 3, 1, 8)  # 09:00 CET
    assert jobs["2001"].end_time == utc(2026, 3, 2, 12, 33, 44)


# --- small, targeted dumps --------------------------------------------------------------------------------


def test_summer_time_in_the_cluster_zone() -> None:
    jobs, _ = parse(dump(row(Start="2026-07-01T12:00:00", End="2026-07-01T13:00:00")), tz=PARIS)
    start = jobs["7"].start_time
    assert start is not None
    assert start == utc(2026, 7, 1, 10)
    assert start.astimezone(UTC).hour == 10
    assert jobs["7"].submit_time == utc(2026, 7, 1, 7)


def test_minimal_header() -> None:
    cols = ["JobID", "User", "State", "Submit", "Start", "End"]
    data = dump(
        row(cols, JobID="1"),
        row(cols, JobID="2", State="RUNNING", End="Unknown"),
        row(cols, JobID="3", State="PENDING", Start="Unknown", End="Unknown"),
        cols=cols,
    )
    jobs, st = parse(data)
    assert list(jobs) == ["1", "2"]
    j = jobs["1"]
    assert (j.elapsed_s, j.n_nodes, j.alloc_cpus, j.alloc_gpus, j.req_mem_mb) == (3600.0, 0, 0, 0, None)
    assert (j.account, j.node_list, j.total_cpu_s, j.consumed_energy_j, j.cluster) == (None,) * 5
    assert jobs["2"].is_open and jobs["2"].end_time is None
    assert st.skipped == {"pending (not started yet)": 1}


def test_default_cluster_when_the_column_is_missing() -> None:
    cols = ["JobID", "User", "State", "Submit", "Start", "End"]
    jobs, _ = parse(dump(row(cols), cols=cols), default_cluster="fallback")
    assert jobs["7"].cluster == "fallback"
    jobs, _ = parse(dump(row()), default_cluster="fallback")
    assert jobs["7"].cluster == "midway"


@pytest.mark.parametrize("delim", [";", "\t", "^|^"])
def test_other_delimiters_with_tres(delim: str) -> None:
    data = dump(row(delim=delim), row(delim=delim, JobID="7.batch", JobIDRaw="7.batch"), delim=delim)
    jobs, st = parse(data, delimiter=delim)
    j = jobs["7"]
    assert (j.alloc_gpus, j.req_mem_mb, j.elapsed_s, j.total_cpu_s) == (1, 16384.0, 3600.0, 7200.0)
    assert (st.jobs, st.steps, dict(st.skipped)) == (1, 1, {})


def test_comma_delimiter() -> None:
    cols = ["JobID", "User", "State", "Submit", "Start", "End", "Elapsed", "NodeList"]
    jobs, st = parse(dump(row(cols, ","), cols=cols, delim=","), delimiter=",")
    assert jobs["7"].elapsed_s == 3600.0
    # with TRES columns a comma delimiter is ambiguous: counted, not guessed
    jobs, st = parse(dump(row(delim=","), delim=","), delimiter=",")
    assert jobs == {}
    n = len(COLS)
    assert st.skipped == {f"wrong number of fields ({n + 8}, expected {n}; delimiter inside a value?)": 1}


def test_parsable2_without_header_needs_fields() -> None:
    body = dump(row(delim=";"), cols=None, delim=";")
    jobs, _ = parse(body, delimiter=";", fields=COLS)
    assert jobs["7"].start_time == utc(2026, 7, 1, 10)
    with pytest.raises(SacctFormatError, match="not a sacct header"):
        parse(body, delimiter=";")


def test_header_that_disagrees_with_fields() -> None:
    with pytest.raises(SacctFormatError, match="differs from --fields"):
        parse(dump(row()), fields=[c for c in COLS if c != "Comment"])


def test_fields_must_name_the_job_id() -> None:
    cols = ["User", "State", "Start", "End"]
    with pytest.raises(SacctFormatError, match="JobID"):
        parse(dump(row(cols), cols=None), fields=cols)


def test_header_with_a_byte_order_mark() -> None:
    jobs, _ = parse(b"\xef\xbb\xbf" + dump(row()))
    assert list(jobs) == ["7"]


def test_blank_and_whitespace_lines_are_ignored() -> None:
    data = b"\n\r\n" + dump(row()) + b"   \n\n" + dump(row(JobID="8", JobIDRaw="8"), cols=None) + b"\n"
    jobs, st = parse(data)
    assert list(jobs) == ["7", "8"]
    assert st.lines == 2


def test_parsable_and_parsable2_lines() -> None:
    # --parsable ends every line with the delimiter, --parsable2 does not; an empty last column is fine in both
    p1 = "|".join(COLS) + "|\n" + row(Timelimit="") + "|\n"
    p2 = "|".join(COLS) + "\n" + row(Timelimit="") + "\n"
    for data in (p1, p2):
        jobs, st = parse(data.encode())
        assert jobs["7"].time_limit_s is None
        assert dict(st.skipped) == {}


def test_parsable2_delimiter_in_a_value_with_an_empty_last_column() -> None:
    # one '|' too many and an empty last column: not a --parsable trailing delimiter when the header has none
    jobs, st = parse(dump(row(JobName="a|b", Timelimit="", NTasks="")))
    assert jobs == {}
    n = len(COLS)
    assert st.skipped == {f"wrong number of fields ({n + 1}, expected {n}; delimiter inside a value?)": 1}


def test_unknown_extra_columns() -> None:
    cols = ["Reservation", *COLS[:5], "MaxVMSize", *COLS[5:], "WorkDir"]
    jobs, st = parse(dump(row(cols, Reservation="maint", MaxVMSize="12G", WorkDir="/x/y"), cols=cols))
    j = jobs["7"]
    assert (j.user_name, j.alloc_gpus, j.elapsed_s) == ("alice", 1, 3600.0)
    assert dict(st.skipped) == {}


def test_empty_and_zero_energy_is_none() -> None:
    jobs, _ = parse(
        dump(
            row(JobID="1", ConsumedEnergyRaw=""),
            row(JobID="2", ConsumedEnergyRaw="0"),
            row(JobID="3", ConsumedEnergyRaw="123456"),
        )
    )
    assert [jobs[k].consumed_energy_j for k in "123"] == [None, None, 123456.0]


def test_unset_energy_sentinel_is_not_joules() -> None:
    no_val64 = "18446744073709551614"
    data = dump(
        row(JobID="1", ConsumedEnergyRaw=no_val64),
        row(JobID="2", ConsumedEnergyRaw=""),
        row(JobID="2.batch", ConsumedEnergyRaw=no_val64),
        row(JobID="2.0", ConsumedEnergyRaw="5000"),
    )
    jobs, _ = parse(data)
    assert jobs["1"].consumed_energy_j is None
    assert jobs["2"].consumed_energy_j == 5000.0


def test_steps_energy_is_the_max_and_cpu_the_sum() -> None:
    data = dump(
        row(TotalCPU="", ConsumedEnergyRaw=""),
        row(JobID="7.extern", TotalCPU="00:00:01", ConsumedEnergyRaw="300000"),
        row(JobID="7.batch", TotalCPU="00:10:00", ConsumedEnergyRaw="290000"),
        row(JobID="7.0", TotalCPU="1-00:00:00", ConsumedEnergyRaw="250000"),
    )
    jobs, st = parse(data)
    assert jobs["7"].total_cpu_s == 1 + 600 + 86400
    assert jobs["7"].consumed_energy_j == 300000.0
    assert (st.jobs, st.steps) == (1, 3)


def test_steps_of_array_tasks_and_het_components() -> None:
    data = dump(
        row(JobID="5_3", JobIDRaw="9", TotalCPU="00:00:00"),
        row(JobID="5_3.batch", JobIDRaw="9.batch", TotalCPU="00:01:00"),
        row(JobID="6+1", JobIDRaw="11", TotalCPU=""),
        row(JobID="6+1.0", JobIDRaw="11.0", TotalCPU="00:02:00"),
    )
    jobs, st = parse(data)
    assert (jobs["5_3"].total_cpu_s, jobs["6+1"].total_cpu_s) == (60.0, 120.0)
    assert (st.steps, dict(st.skipped)) == (2, {})


def test_step_far_from_its_job(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sacct, "_FOLD_WINDOW", 2)
    rows = [row(JobID=str(i), TotalCPU="") for i in range(1, 5)]
    jobs, st = parse(dump(*rows, row(JobID="1.batch", TotalCPU="00:05:00")))
    assert list(jobs) == ["1", "2", "3", "4"]  # input order
    assert jobs["1"].total_cpu_s is None
    assert st.skipped == {"step without its job line": 1}


def test_duplicate_job_line_keeps_the_later_one() -> None:
    data = dump(row(State="NODE_FAIL", End="2026-07-01T10:30:00"), row(Start="2026-07-01T10:40:00"))
    jobs, st = parse(data)
    assert (jobs["7"].state, jobs["7"].start_time) == ("COMPLETED", utc(2026, 7, 1, 10, 40))
    assert st.skipped == {"duplicate job line (later one kept)": 1}
    assert st.jobs == 1


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"State": "PENDING", "Start": "Unknown", "End": "Unknown", "NodeList": "None assigned"}, "pending"),
        (
            {"JobID": "123_[5-9]", "State": "PENDING", "Start": "Unknown", "NodeList": "None assigned"},
            "pending",
        ),
        ({"State": "CANCELLED by 1001", "Start": "None", "NodeList": "None assigned"}, "never started"),
        ({"State": "RUNNING", "Start": "Unknown"}, "no start time"),
        (
            {
                "State": "CANCELLED",
                "End": "2026-07-01T10:00:00",
                "Elapsed": "00:00:00",
                "ElapsedRaw": "0",
                "NodeList": "None assigned",
            },
            "never started (no node assigned)",
        ),
        ({"State": "WEIRD_STATE"}, "unknown state 'WEIRD_STATE'"),
        ({"State": ""}, "no state"),
        ({"User": "", "UID": ""}, "no user"),
        ({"JobID": "abc", "JobIDRaw": ""}, "bad job id"),
        ({"JobID": "", "JobIDRaw": ""}, "bad job id"),
    ],
)
def test_not_imported_lines_have_a_reason(overrides: dict[str, str], reason: str) -> None:
    jobs, st = parse(dump(row(JobID="1"), row(**overrides), row(JobID="3")))
    assert list(jobs) == ["1", "3"]
    assert len(st.skipped) == 1
    assert next(iter(st.skipped)).startswith(reason)
    assert sum(st.skipped.values()) == 1


@pytest.mark.parametrize(
    "overrides",
    [
        {"NNodes": "two"},
        {"AllocCPUS": "4.5"},
        {"UID": "u1001"},
        {"ElapsedRaw": "12x"},
        {"ElapsedRaw": "", "Elapsed": "nan"},
        {"ElapsedRaw": "", "Elapsed": "1:2:3:4"},
        {"TotalCPU": "1e3"},
        {"TotalCPU": "inf"},
        {"Start": "2026-13-01T10:00:00"},
        {"End": "yesterday"},
        {"ExitCode": "x:0"},
        {"AllocTRES": "cpu=4,node=1", "ReqTRES": "", "ReqMem": "16Q"},
        {"AllocTRES": "cpu=4,gres/gpu=two,node=1"},
        {"NNodes": "", "AllocTRES": "cpu=4,node=inf"},
        {"ConsumedEnergyRaw": "12kJ"},
        {"Timelimit": "soon"},
    ],
)
def test_a_bad_number_skips_only_its_line(overrides: dict[str, str]) -> None:
    jobs, st = parse(dump(row(JobID="1"), row(**overrides), row(JobID="3")))
    assert list(jobs) == ["1", "3"]
    assert bad_values(st) == 1
    assert sum(st.skipped.values()) == 1


def test_a_repeated_bad_value_skips_every_line_that_has_it() -> None:
    """The parser caches what it parsed from repeated texts (TRES, Timelimit, TotalCPU), never a failure."""
    bad = {"AllocTRES": "cpu=4,gres/gpu=two,node=1", "Timelimit": "soon", "TotalCPU": "nan"}
    for field_name, value in bad.items():
        rows = [row(JobID=str(i), **{field_name: value}) for i in range(1, 4)]
        jobs, st = parse(dump(row(JobID="9"), *rows, row(JobID="10")))
        assert list(jobs) == ["9", "10"], field_name
        assert bad_values(st) == 3, field_name


def test_more_distinct_allocations_than_the_cache_holds() -> None:
    """Past the cache's bound it starts again: every job still gets its own resources and limits."""
    n = sacct._CACHE_MAX + 500
    rows = [
        row(
            JobID=str(i),
            NNodes="",
            AllocCPUS="",
            AllocTRES=f"cpu={i % 97 + 1},mem={i}M,node={i % 5 + 1},gres/gpu:a100={i % 3}",
            Timelimit=f"{i}",
            TotalCPU=f"00:{i % 60:02d}:{i % 59:02d}",
        )
        for i in range(1, n + 1)
    ]
    jobs, _ = parse(dump(*rows))
    assert len(jobs) == n
    for i in (1, 2, sacct._CACHE_MAX, sacct._CACHE_MAX + 1, n):
        rec = jobs[str(i)]
        assert (rec.alloc_cpus, rec.n_nodes, rec.req_mem_mb) == (i % 97 + 1, i % 5 + 1, float(i))
        assert rec.alloc_gpus == i % 3 and rec.time_limit_s == i * 60.0
        assert rec.total_cpu_s == parse_slurm_duration(f"00:{i % 60:02d}:{i % 59:02d}")
    assert len(sacct._ALLOCATIONS) <= sacct._CACHE_MAX and len(sacct._TIMELIMITS) <= sacct._CACHE_MAX


def test_a_bad_step_value_skips_only_the_step() -> None:
    data = dump(row(TotalCPU=""), row(JobID="7.batch", TotalCPU="nan"), row(JobID="7.0", TotalCPU="00:00:30"))
    jobs, st = parse(data)
    assert jobs["7"].total_cpu_s == 30.0
    assert bad_values(st) == 1


def test_non_utf8_bytes() -> None:
    line = row(JobName="JOBNAME", Comment="COMMENT").encode()
    line = line.replace(b"JOBNAME", b"\xc3\x28x").replace(b"COMMENT", b"na\xefve \x80\xff")
    jobs, st = parse(dump() + line + b"\n" + dump(row(JobID="8", Comment="ok \u00e9"), cols=None))
    assert jobs["7"].name == "\ufffd(x"
    assert jobs["7"].comment == "na\ufffdve \ufffd\ufffd"
    assert jobs["8"].comment == "ok \u00e9"
    assert st.replaced_bytes_lines == 1


# --- field parsers ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "nodes", "cpus", "mb"),
    [
        ("199G", 1, 1, 199 * 1024),
        ("32000M", 1, 1, 32000),
        ("32000", 1, 1, 32000),
        ("4Gn", 3, 1, 3 * 4096),
        ("4Gc", 2, 8, 8 * 4096),
        ("4000Mc", 1, 0, 4000),
        ("512K", 1, 1, 0.5),
        ("1.5T", 1, 1, 1.5 * 1024 * 1024),
        ("2g", 1, 1, 2048),
    ],
)
def test_parse_mem_mb(text: str, nodes: int, cpus: int, mb: float) -> None:
    assert parse_mem_mb(text, nodes, cpus) == pytest.approx(mb)


def test_parse_mem_mb_unknowns_and_garbage() -> None:
    assert [parse_mem_mb(t) for t in ("", "0", "Unknown", "  ")] == [None] * 4
    for bad in ("4X", "G4", "-1G", "4 G"):
        with pytest.raises(ValueError):
            parse_mem_mb(bad)


def test_parse_tres() -> None:
    assert parse_tres("billing=4,cpu=4,mem=16G,node=1,gres/gpu:a100=2") == {
        "billing": "4",
        "cpu": "4",
        "mem": "16G",
        "node": "1",
        "gres/gpu:a100": "2",
    }
    assert parse_tres("") == {}
    assert parse_tres(",,=3,junk, cpu = 2 ") == {"cpu": "2"}


@pytest.mark.parametrize(
    ("tres", "expected"),
    [
        ("cpu=4", (0, None)),
        ("gres/gpu=4", (4, None)),
        ("gres/gpu:a100=4", (4, "a100")),
        ("gres/gpu:a100=2,gres/gpu=4", (4, "a100")),  # the untyped count wins
        ("gres/gpu=4,gres/gpu:a100=2", (4, "a100")),
        ("gres/gpu:a100=2,gres/gpu:v100=1", (3, "a100,v100")),
        ("gres/gpumem=40G,gres/gpuutil=100", (0, None)),
    ],
)
def test_gpus_from_tres(tres: str, expected: tuple[int, str | None]) -> None:
    assert gpus_from_tres(parse_tres(tres)) == expected


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1-04:33:44", 102824), ("00:00.500", 0.5), ("2-00:00:00", 172800), ("59:59", 3599), ("1-00", 86400)],
)
def test_slurm_durations(text: str, seconds: float) -> None:
    assert parse_slurm_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text", ["nan", "inf", "1e3", "00:-5", "1_0:00", "+5:00", "1-", "1-nan:00:00", "1:2:3:4"]
)
def test_slurm_duration_garbage(text: str) -> None:
    with pytest.raises(ValueError):
        parse_slurm_duration(text)


def test_sniff_format() -> None:
    assert sniff_format(b'  \n{"meta": {}') == "json"
    assert sniff_format(b"[]") == "json"
    assert sniff_format(b"JobID|User|") == "parsable"
    assert sniff_format(b"") == "parsable"


# --- JSON ---------------------------------------------------------------------------------------------------


def test_json_v0038_slurm_22_05() -> None:
    jobs, st = parse_json((DATA / "messy_v0038.json").read_bytes())
    assert list(jobs) == ["3001", "3002_4", "3003+0", "3003+1", "3005", "3006", "3009", "3014"]
    assert (st.lines, st.jobs, st.steps) == (15, 8, 7)
    assert st.skipped == {
        "pending (not started yet)": 2,  # the 3002_[5-9] array record and 3007
        "never started (ended before it ran)": 1,  # 3008
        "bad job entry": 1,  # a string in the jobs list
        "bad value (… object has no attribute …)": 1,  # 3011, a step that is not an object
        "bad value (could not convert string to float: …)": 1,  # 3012, elapsed 'abc'
        "no user": 1,  # 3013
    }
    j = jobs["3001"]
    assert (j.state, j.user_name, j.account, j.partition, j.qos, j.cluster) == (
        "COMPLETED",
        "alice",
        "lab_vision",
        "gpu",
        "normal",
        "midway",
    )
    assert (j.n_nodes, j.alloc_cpus, j.alloc_gpus, j.gpu_type, j.req_mem_mb) == (2, 64, 8, None, 409600.0)
    assert (j.submit_time, j.start_time, j.end_time) == (
        T0 - timedelta(minutes=10),
        T0,
        T0 + timedelta(hours=1),
    )
    assert (j.elapsed_s, j.time_limit_s, j.is_open) == (3600.0, 7200.0, False)
    assert (j.exit_code, j.exit_signal, j.name, j.comment, j.node_list) == (
        0,
        0,  # unset in the JSON: with the code known, as the text output's "0:0"
        "train",
        "exp=1",
        "gpu[01-02]",
    )
    assert j.total_cpu_s == 100.5  # the job's own total, not the steps' 90.5
    assert j.consumed_energy_j == 90000.0  # max over steps; the extern step's NO_VAL64 is not joules
    a = jobs["3002_4"]
    assert (a.array_job_id, a.array_task_id, a.job_id_raw, a.state, a.exit_code) == (
        3002,
        4,
        3010,
        "FAILED",
        1,
    )
    assert (a.alloc_gpus, a.gpu_type) == (4, "a100")
    assert a.total_cpu_s == 42.25  # zero on the job: the steps' sum
    assert (jobs["3003+0"].het_job_id, jobs["3003+0"].het_job_offset, jobs["3003+0"].job_id_raw) == (
        3003,
        0,
        3003,
    )
    assert (jobs["3003+1"].het_job_id, jobs["3003+1"].het_job_offset, jobs["3003+1"].job_id_raw) == (
        3003,
        1,
        3004,
    )
    assert (jobs["3005"].state, jobs["3005"].exit_code, jobs["3005"].exit_signal) == ("CANCELLED", 0, 9)
    r = jobs["3006"]
    assert (r.state, r.is_open, r.end_time, r.elapsed_s) == ("RUNNING", True, None, 500.0)
    assert (jobs["3009"].state, jobs["3009"].alloc_gpus, jobs["3009"].gpu_type) == ("NODE_FAIL", 2, "h100")
    assert jobs["3014"].consumed_energy_j is None  # a null TRES count
    assert jobs["3014"].total_cpu_s == 1.0


def test_json_v0040_numbers_as_objects() -> None:
    jobs, st = parse_json((DATA / "messy_v0040.json").read_text(encoding="utf-8"))
    assert list(jobs) == ["4001", "4002_7", "4003", "4004", "4007", "4008+1"]
    assert (st.lines, st.jobs, st.steps) == (8, 6, 3)
    assert st.skipped == {"pending (not started yet)": 2}
    j = jobs["4001"]
    assert (j.state, j.account, j.comment, j.time_limit_s, j.exit_code, j.exit_signal) == (
        "COMPLETED",
        "lab_nlp",
        None,
        3600.0,
        0,
        0,  # the code known, the signal unset: 0, as the text output's "0:0"
    )
    assert (j.total_cpu_s, j.consumed_energy_j) == (30.0, 7000.0)
    assert (j.alloc_cpus, j.alloc_gpus, j.req_mem_mb, j.start_time) == (16, 1, 65536.0, T0)
    a = jobs["4002_7"]
    assert (a.array_job_id, a.array_task_id, a.job_id_raw) == (4002, 7, 4010)
    c = jobs["4003"]
    assert (c.state, c.exit_signal, c.time_limit_s, c.elapsed_s) == ("CANCELLED", 15, None, 30.0)
    r = jobs["4004"]
    assert (r.state, r.is_open, r.end_time) == ("RUNNING", True, None)
    t = jobs["4007"]
    assert (t.state, t.exit_code, t.alloc_gpus, t.gpu_type, t.req_mem_mb) == ("TIMEOUT", 2, 2, "h100", None)
    h = jobs["4008+1"]
    assert (h.het_job_id, h.het_job_offset, h.job_id_raw) == (4008, 1, 4009)


def test_json_inputs_bytes_str_and_file() -> None:
    raw = (DATA / "messy_v0040.json").read_bytes()
    a, _ = parse_json(raw)
    b, _ = parse_json(raw.decode())
    st = ParseStats()
    c = {r.job_id: r for r in iter_json(io.BytesIO(raw), stats=st)}
    assert a == b == c
    assert len(a) == 6


def test_json_non_utf8_bytes() -> None:
    doc = {"jobs": [_json_job(9, name="NAME")]}
    raw = json.dumps(doc).encode().replace(b"NAME", b"caf\xe9")
    jobs, st = parse_json(raw)
    assert jobs["9"].name == "caf\ufffd"
    assert st.replaced_bytes_lines == 1


def test_json_duplicate_job_keeps_the_later_one() -> None:
    doc = {"jobs": [_json_job(9, state="NODE_FAIL"), _json_job(9, state="COMPLETED")]}
    jobs, st = parse_json(json.dumps(doc))
    assert jobs["9"].state == "COMPLETED"
    assert st.skipped == {"duplicate job line (later one kept)": 1}
    assert st.jobs == 1


def test_json_default_cluster() -> None:
    job = _json_job(9)
    del job["cluster"]
    jobs, _ = parse_json(json.dumps({"jobs": [job]}), default_cluster="fallback")
    assert jobs["9"].cluster == "fallback"


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"JobID|User|State\n1|a|COMPLETED\n", "not valid sacct JSON"),
        (b'{"jobs": [', "not valid sacct JSON"),
        (b"", "not valid sacct JSON"),
        (b'{"meta": {}, "errors": []}', "no top-level 'jobs' list"),
        (b'{"jobs": {"1": {}}}', "no top-level 'jobs' list"),
        (b"[]", "no top-level 'jobs' list"),
    ],
)
def test_json_that_is_not_sacct_json(raw: bytes, match: str) -> None:
    with pytest.raises(SacctFormatError, match=match):
        parse_json(raw)


def test_json_empty_jobs() -> None:
    jobs, st = parse_json(b'{"jobs": []}')
    assert (jobs, st.lines, st.jobs) == ({}, 0, 0)


def _json_job(job_id: int, state: str = "COMPLETED", name: str = "x") -> dict[str, object]:
    start = int(T0.timestamp())
    return {
        "job_id": job_id,
        "name": name,
        "user": "alice",
        "cluster": "midway",
        "nodes": "gpu01",
        "state": {"current": state, "reason": "None"},
        "time": {"elapsed": 60, "start": start, "end": start + 60, "submission": start - 5},
        "tres": {"allocated": [{"type": "cpu", "name": None, "id": 1, "count": 2}]},
    }


# --- garbage between valid lines ---------------------------------------------------------------------------

_JUNK = [*"0123456789|||||:::--__..[]++ ,;=/aAzZ%\t\r\x00", "\u00e9", "\ufffd", "PENDING", "RUNNING"]


def _valid_jobs(rng: random.Random, n: int) -> list[list[str]]:
    """n valid jobs, each a list of lines (the job, then its steps); ids 1..n."""
    jobs = []
    for i in range(1, n + 1):
        start = datetime(2026, 5, 1) + timedelta(minutes=rng.randrange(100_000))
        secs = rng.randrange(1, 300_000)
        end = start + timedelta(seconds=secs)
        gpus = rng.choice([0, 1, 4, 8])
        state = rng.choice(["COMPLETED", "FAILED", "TIMEOUT", "CANCELLED by 42", "OUT_OF_MEMORY", "RUNNING"])
        jid = rng.choice([str(i), f"{i}_{rng.randrange(50)}", f"{i}+{rng.randrange(3)}"])
        own = rng.random() < 0.5  # own TotalCPU and energy, or only from the steps
        values = {
            "JobID": jid,
            "JobIDRaw": str(i),
            "NodeList": f"gpu{i:02d}",
            "AllocTRES": f"cpu=8,mem={rng.randrange(1, 500)}G,gres/gpu={gpus},node=1",
            "Start": start.isoformat(),
            "End": "Unknown" if state == "RUNNING" else end.isoformat(),
            "ElapsedRaw": str(secs),
            "State": state,
            "TotalCPU": "01:00:00" if own else "",
            "ConsumedEnergyRaw": str(rng.randrange(1, 10**7)) if own else "",
        }
        lines = [row(delim="|", **values)]
        for s in rng.sample(["batch", "extern", "0", "1"], rng.randrange(3)):
            cpu = f"{rng.randrange(10):02d}:{rng.randrange(60):02d}:{rng.randrange(60):02d}"
            energy = str(rng.randrange(1, 10**6))
            rss = f"{int(energy) % 50_000}K"  # from the draws above: the seeds' streams stay as they were
            lines.append(
                row(
                    **{**values, "JobID": f"{jid}.{s}", "TotalCPU": cpu, "ConsumedEnergyRaw": energy},
                    MaxRSS=rss,
                    NTasks=str(len(s)),
                )
            )
        jobs.append(lines)
    return jobs


def _garbage(rng: random.Random, valid: list[list[str]]) -> str:
    kind = rng.randrange(7)
    if kind == 0:  # random characters, delimiters among them
        return "".join(rng.choice(_JUNK) for _ in range(rng.randrange(120)))
    if kind == 1:  # the header again (two dumps concatenated)
        return "|".join(COLS)
    if kind == 2:  # only delimiters, the right number of them or not
        return "|" * rng.choice([len(COLS) - 1, len(COLS), len(COLS) + 3, rng.randrange(60)])
    # a copy of a valid line under another job id, damaged
    src = rng.choice(rng.choice(valid))
    head, sep, rest = src.partition("|")
    fake = str(100_000 + rng.randrange(1000)) + head.lstrip("0123456789") + sep + rest
    if kind == 3:  # cut short
        return fake[: rng.randrange(len(fake))]
    if kind == 4:  # one field (not the job id) replaced by junk
        parts = fake.split("|")
        parts[rng.randrange(1, len(parts))] = "".join(
            rng.choice(_JUNK[:-4]) for _ in range(rng.randrange(1, 12))
        )
        return "|".join(parts)
    if kind == 5:  # a stray delimiter
        k = rng.randrange(len(fake))
        return fake[:k] + "|" + fake[k:]
    return " " * rng.randrange(4)  # blank


@pytest.mark.parametrize("seed", range(60))
def test_garbage_lines_never_raise_and_never_lose_valid_jobs(seed: int) -> None:
    rng = random.Random(seed)
    valid = _valid_jobs(rng, rng.randrange(1, 12))
    clean, _ = parse(dump(*(line for job in valid for line in job)))
    assert len(clean) == len(valid)
    noisy_lines: list[str] = []
    for job in valid:
        for line in job:  # garbage may also land between a job and its steps
            noisy_lines.extend(_garbage(rng, valid) for _ in range(rng.randrange(4)))
            noisy_lines.append(line)
    noisy_lines.extend(_garbage(rng, valid) for _ in range(rng.randrange(4)))
    data = dump(*noisy_lines)
    if rng.random() < 0.3:
        data = data.replace(b"\n", b"\r\n")
    jobs, st = parse(data)  # parse() also checks every line is accounted for
    for job_id, rec in clean.items():
        assert jobs[job_id] == rec
    assert st.jobs >= len(clean)


def test_finished_job_with_lost_end_gets_start_plus_elapsed() -> None:
    jobs, _ = parse(dump(row(End="Unknown", ElapsedRaw="5400")))
    assert jobs["7"].end_time == utc(2026, 7, 1, 11, 30) and not jobs["7"].is_open


# --- memory: MaxRSS of the steps ---------------------------------------------------------------------------

MIB = 1024 * 1024


def test_max_rss_is_the_largest_step_with_its_tasks_per_node() -> None:
    data = dump(
        row(MaxRSS="", NTasks=""),  # the job line: sacct leaves both empty
        row(JobID="7.extern", MaxRSS="1000K", NTasks="1", NNodes="2"),
        row(JobID="7.batch", MaxRSS="2.50G", NTasks="1", NNodes="1"),
        row(JobID="7.0", MaxRSS="3G", NTasks="8", NNodes="2"),
        row(JobID="7.1", MaxRSS="600M", NTasks="64", NNodes="2"),
    )
    jobs, st = parse(data)
    j = jobs["7"]
    assert (j.max_rss_mb, j.rss_tasks_per_node) == (3072.0, 4)  # 3 GB per task, 8 tasks on 2 nodes
    assert j.consumed_energy_j == 900000.0 and j.total_cpu_s == 7200.0  # the job's own, as before
    assert (st.steps, dict(st.skipped)) == (4, {})


@pytest.mark.parametrize(
    ("text", "mb"),
    [
        ("1234K", 1234 / 1024),
        ("2.50M", 2.5),
        ("16G", 16384.0),
        ("1.2T", 1.2 * 1024**2),
        ("16g", 16384.0),
        (" 512K ", 0.5),
        ("1048576", 1.0),  # a bare number (--noconvert) is bytes
        ("0", None),  # nothing gathered
        ("0K", None),
        ("", None),
    ],
)
def test_max_rss_units(text: str, mb: float | None) -> None:
    jobs, _ = parse(dump(row(), row(JobID="7.batch", MaxRSS=text, NTasks="1")))
    assert jobs["7"].max_rss_mb == (pytest.approx(mb) if mb is not None else None)
    assert jobs["7"].rss_tasks_per_node == (1 if mb is not None else None)


@pytest.mark.parametrize(
    "bad", ["abcK", "-5M", "1e30K", "nan", "nanK", "infG", "K", "12Q", "1.5.2M", "18446744073709551614K"]
)
def test_a_bad_max_rss_never_costs_the_job(bad: str) -> None:
    data = dump(
        row(JobID="1", MaxRSS=bad),  # on a job line
        row(JobID="2"),
        row(JobID="2.batch", MaxRSS=bad, NTasks="1"),
        row(JobID="2.0", MaxRSS="1G", NTasks="2", TotalCPU="00:00:30"),
        row(JobID="3", TotalCPU=""),
        row(JobID="3.batch", MaxRSS=bad, NTasks=bad, NNodes=bad, TotalCPU="00:01:00"),
    )
    jobs, st = parse(data)
    assert list(jobs) == ["1", "2", "3"]
    assert (jobs["1"].max_rss_mb, jobs["1"].rss_tasks_per_node) == (None, None)
    assert (jobs["2"].max_rss_mb, jobs["2"].rss_tasks_per_node) == (1024.0, 2)
    assert (jobs["3"].max_rss_mb, jobs["3"].total_cpu_s) == (None, 60.0)  # the step's other values count
    assert (st.steps, dict(st.skipped)) == (3, {})


@pytest.mark.parametrize("bad", ["x", "-3", "1e3", "2.5", "9" * 30, "²"])
def test_a_bad_task_count_means_one_task_per_node(bad: str) -> None:
    data = dump(row(), row(JobID="7.0", MaxRSS="2G", NTasks=bad, NNodes="2"))
    jobs, st = parse(data)
    assert (jobs["7"].max_rss_mb, jobs["7"].rss_tasks_per_node) == (2048.0, 1)
    assert dict(st.skipped) == {}


@pytest.mark.parametrize(
    ("ntasks", "nnodes", "per_node"),
    [("8", "2", 4), ("9", "2", 5), ("1", "4", 1), ("3", "1", 3), ("", "2", 1), ("4", "", 4), ("4", "0", 4)],
)
def test_tasks_per_node_round_up(ntasks: str, nnodes: str, per_node: int) -> None:
    jobs, _ = parse(dump(row(), row(JobID="7.0", MaxRSS="100M", NTasks=ntasks, NNodes=nnodes)))
    assert jobs["7"].rss_tasks_per_node == per_node


def test_max_rss_on_the_job_line() -> None:
    data = dump(
        row(JobID="1", MaxRSS="4G"),  # no steps (sacct -X, or an old Slurm)
        row(JobID="2", MaxRSS="4G"),
        row(JobID="2.0", MaxRSS="5G", NTasks="2", NNodes="1"),
        row(JobID="3", MaxRSS="4G", NTasks="4", NNodes="2"),
        row(JobID="3.batch", MaxRSS="1G", NTasks="1"),
    )
    jobs, _ = parse(data)
    assert (jobs["1"].max_rss_mb, jobs["1"].rss_tasks_per_node) == (4096.0, 1)
    assert (jobs["2"].max_rss_mb, jobs["2"].rss_tasks_per_node) == (5120.0, 2)
    assert (jobs["3"].max_rss_mb, jobs["3"].rss_tasks_per_node) == (4096.0, 2)


def test_max_rss_of_array_tasks_and_a_repeated_job_line() -> None:
    data = dump(
        row(JobID="5_3", JobIDRaw="9"),
        row(JobID="5_3.batch", JobIDRaw="9.batch", MaxRSS="700M", NTasks="1"),
        row(JobID="6"),
        row(JobID="6.batch", MaxRSS="300M", NTasks="1"),
        row(JobID="6", State="COMPLETED"),  # the same job again (requeued): its steps still count
    )
    jobs, _ = parse(data)
    assert (jobs["5_3"].max_rss_mb, jobs["6"].max_rss_mb) == (700.0, 300.0)


def test_max_rss_without_the_columns() -> None:
    cols = [c for c in COLS if c not in ("MaxRSS", "NTasks")]
    jobs, st = parse(dump(row(cols), row(cols, JobID="7.batch"), cols=cols))
    assert (jobs["7"].max_rss_mb, jobs["7"].rss_tasks_per_node) == (None, None)
    assert dict(st.skipped) == {}


def _json_step(tres: object = None, tasks: object = None, nodes: object = None, name: str = "batch") -> dict:
    step: dict[str, object] = {"step": {"name": name}, "time": {"total": {"seconds": 1, "microseconds": 0}}}
    for key, value in (("tres", tres), ("tasks", tasks), ("nodes", nodes)):
        if value is not None:
            step[key] = value
    return step


def _rss_tres(count: object, name: object = "") -> dict[str, object]:
    """A step's tres as data_parser writes it: `requested.max` holds the per-task maxima, mem in bytes."""
    return {
        "requested": {
            "max": [
                {"type": "cpu", "name": name, "id": 1, "count": 0, "task": 0, "node": "n1"},
                {"type": "mem", "name": name, "id": 2, "count": count, "task": 0, "node": "n1"},
                {"type": "vmem", "name": name, "id": 7, "count": 10 * 1024**3, "task": 0, "node": "n1"},
            ],
            "min": [],
            "average": [],
            "total": [],
        },
        "consumed": {"max": [], "min": [], "average": [], "total": []},
    }


def test_json_max_rss_is_the_largest_step() -> None:
    job = _json_job(9)
    job["steps"] = [
        _json_step(_rss_tres(1000 * 1024), {"count": 1}, {"count": 2, "list": ["n1", "n2"]}, "extern"),
        _json_step(_rss_tres(300 * MIB, None), {"count": 1}, {"count": 1}),  # 22.05: name null
        _json_step(
            _rss_tres({"set": True, "infinite": False, "number": 3 * 1024 * MIB}), {"count": 8}, {"count": 2}
        ),
        _json_step(_rss_tres(2 * 1024 * MIB), {"count": 64}, {"count": 2}),
    ]
    jobs, st = parse_json(json.dumps({"jobs": [job]}))
    assert (jobs["9"].max_rss_mb, jobs["9"].rss_tasks_per_node) == (3072.0, 4)
    assert (st.steps, dict(st.skipped)) == (4, {})


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        (_json_step(), (None, None)),  # no tres at all (the messy captures' steps have only `consumed`)
        (_json_step({"consumed": {"max": []}}), (None, None)),
        (_json_step({"requested": {"max": []}}), (None, None)),
        (_json_step({"requested": {"max": {"mem": 5}}}), (None, None)),  # not a list
        (_json_step({"requested": "max"}), (None, None)),
        (_json_step({"requested": {"max": None}}), (None, None)),
        (_json_step({"requested": {"max": ["mem", None, 3]}}), (None, None)),
        (_json_step(_rss_tres(0)), (None, None)),  # nothing gathered
        (_json_step(_rss_tres(None)), (None, None)),
        (_json_step(_rss_tres("abc")), (None, None)),
        (_json_step(_rss_tres(-5)), (None, None)),
        (_json_step(_rss_tres(2**64 - 2)), (None, None)),  # NO_VAL64
        (_json_step(_rss_tres(10**400)), (None, None)),
        (_json_step(_rss_tres({"set": False, "number": 0})), (None, None)),
        (_json_step(_rss_tres(512 * MIB)), (512.0, 1)),  # tasks and nodes missing
        (_json_step(_rss_tres("1048576")), (1.0, 1)),
        (_json_step(_rss_tres(MIB), tasks={"count": "x"}, nodes={"count": 2}), (1.0, 1)),
        (_json_step(_rss_tres(MIB), tasks=[4], nodes=None), (1.0, 1)),
        (_json_step(_rss_tres(MIB), tasks={"count": 4}, nodes={"count": "two"}), (1.0, 4)),
        (_json_step(_rss_tres(MIB), tasks={"count": 4}, nodes={"list": ["a", "b"]}), (1.0, 2)),
        (_json_step(_rss_tres(MIB), {"count": {"set": True, "number": 6}}, {"count": 4}), (1.0, 2)),
        (_json_step(_rss_tres(MIB), tasks={"count": 1e300}, nodes={"count": 1}), (1.0, 1)),
    ],
)
def test_json_step_shapes_never_cost_the_job(step: dict, expected: tuple[float | None, int | None]) -> None:
    job = _json_job(9)
    job["steps"] = [step]
    jobs, st = parse_json(json.dumps({"jobs": [job]}))
    assert (jobs["9"].max_rss_mb, jobs["9"].rss_tasks_per_node) == expected
    assert dict(st.skipped) == {}


def test_json_max_rss_of_the_real_capture() -> None:
    jobs, _ = parse_json((DATA / "slurm2205_sacct.json").read_bytes())
    # job 15: `srun sleep 2` with -n 2 on one node; job 1: its batch step (sleep)
    assert (jobs["15"].max_rss_mb, jobs["15"].rss_tasks_per_node) == (1466368 / MIB, 2)
    assert (jobs["1"].max_rss_mb, jobs["1"].rss_tasks_per_node) == (3330048 / MIB, 1)
    assert jobs["3"].max_rss_mb is None  # nothing gathered for its steps
