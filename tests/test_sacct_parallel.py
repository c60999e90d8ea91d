"""The forked parser (used for dump files) gives exactly what the in-process parser gives."""

from __future__ import annotations

from datetime import UTC
from pathlib import Path

import pytest

from cocaq.slurm.parallel import iter_parsable_forked
from cocaq.slurm.plausible import Tally, checked
from cocaq.slurm.sacct import ParseStats, SacctFormatError, iter_parsable

DATA = Path(__file__).parent / "data" / "sacct"


@pytest.mark.parametrize(
    "name", ["messy_parsable.txt", "slurm2205_parsable2.txt", "slurm2205_midway_parsable2.txt"]
)
def test_same_records_and_counts(name: str) -> None:
    """The child parses and applies the plausibility rules: the same as both in-process, tallies too."""
    s1, s2 = ParseStats(), ParseStats()
    t1 = Tally()
    with open(DATA / name, "rb") as fh:
        serial = list(checked(iter_parsable(fh, tz=UTC, stats=s1, default_cluster="c"), t1))
    with open(DATA / name, "rb") as fh:
        out = iter_parsable_forked(fh, tz=UTC, stats=s2, default_cluster="c")
        forked = list(out)
    assert forked == serial and len(serial) >= 9
    assert (out.tally.skipped, out.tally.clamped, out.tally.examples) == (t1.skipped, t1.clamped, t1.examples)
    assert (s2.lines, s2.jobs, s2.steps, s2.skipped, s2.examples, s2.replaced_bytes_lines) == (
        s1.lines,
        s1.jobs,
        s1.steps,
        s1.skipped,
        s1.examples,
        s1.replaced_bytes_lines,
    )


def test_many_batches(tmp_path: Path) -> None:
    lines = (DATA / "slurm2205_parsable2.txt").read_text().splitlines()
    header, body = lines[0], [line for line in lines[1:] if line.split("|")[0] == "3"]
    big = tmp_path / "big.txt"
    # 12,000 copies of job 3 under new ids: more than two of the child's batches
    big.write_text(
        "\n".join([header] + [b.replace("3|3|", f"{i}|{i}|", 1) for i in range(100, 12100) for b in body[:1]])
        + "\n"
    )
    st = ParseStats()
    with open(big, "rb") as fh:
        ids = [r.job_id for r in iter_parsable_forked(fh, tz=UTC, stats=st)]
    assert ids == [str(i) for i in range(100, 12100)] and st.jobs == 12000


def test_format_errors_surface(tmp_path: Path) -> None:
    f = tmp_path / "noheader.txt"
    f.write_text("1|alice|COMPLETED\n")
    with open(f, "rb") as fh, pytest.raises(SacctFormatError, match="not a sacct header"):
        list(iter_parsable_forked(fh, tz=UTC, stats=ParseStats()))
