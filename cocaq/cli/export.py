"""`cocaq export TABLE`: a table over a window as CSV or parquet, for other tools (cocaq.frames' rows).

pandas (and pyarrow, for parquet) is the optional extra `cocaq[analysis]`, imported only when the
command runs: `cocaq --help` lists this command without loading it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from cocaq.cli.app import Ctx, cluster_opt, since_opt, until_opt
from cocaq.errors import UsageError

if TYPE_CHECKING:
    import pandas as pd

FORMATS = ("csv", "parquet")


@click.command()
@click.argument("table")
@since_opt
@until_opt
@click.option("-u", "--user", default=None, help="Only this user's rows.")
@click.option("-A", "--account", default=None, help="Only this lab's (Slurm account's) rows.")
@cluster_opt
@click.option(
    "--format", "fmt", type=click.Choice(FORMATS), default=None,
    help="csv (default; parquet when -o ends in .parquet) or parquet (needs -o).",
)  # fmt: skip
@click.option("-o", "--output", type=click.Path(allow_dash=True), default=None,
              help="Write this file, whole or not at all (default or -: CSV to stdout).")  # fmt: skip
@click.pass_obj
def export(
    obj: Ctx,
    table: str,
    since: str,
    until: str | None,
    user: str | None,
    account: str | None,
    cluster: str | None,
    fmt: str | None,
    output: str | None,
) -> None:
    """A table over a window (jobs, job_energy, rollups, models, sent, study_arms) as CSV or parquet.

    jobs and job_energy hold each job's `share` of the window: energy_kwh x share adds up to `cocaq
    user`'s energy. Reads the read API where [api] url is set (its access rules), else the database.
    In CSV, text that a spreadsheet would run as a formula (=, +, -, @) starts with a '."""
    from cocaq.footprint.export_rows import check_table

    check_table(table)
    if output == "-":
        output = None
    if output is not None and output.lower() in (*FORMATS, "json", "table"):
        raise UsageError(f"-o names the output file; the format is --format {'|'.join(FORMATS)} "
                         f"(write -o ./{output} for a file named {output})")  # fmt: skip
    if fmt is None:
        fmt = "parquet" if output is not None and output.lower().endswith(".parquet") else "csv"
    if fmt == "parquet":
        if output is None:
            raise UsageError("parquet is binary: name the file with -o FILE.parquet")
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise UsageError("parquet needs pyarrow: pip install 'cocaq[analysis]'") from None
    from cocaq import frames, outfile

    df = frames.frame(table, since, until, user=user, account=account, cluster=cluster, cfg=obj.cfg)
    if fmt == "parquet":
        assert output is not None
        outfile.write_atomic(output, lambda path: _parquet(df, path))
        return
    text = csv_safe(df, table).to_csv(index=False, date_format="%Y-%m-%dT%H:%M:%S.%f%z")
    if output is None:
        outfile.stdout(text)
    else:
        outfile.write_text(output, text)


def _parquet(df: pd.DataFrame, path: str) -> None:
    """Through a Python file, so that a write error is the OSError it is (not Arrow's wording of it)."""
    with open(path, "wb") as f:
        df.to_parquet(f, index=False)


def csv_safe(df: pd.DataFrame, table: str) -> pd.DataFrame:
    """The frame with its text columns as every CSV writes them (cocaq.textsafe.csv_text: no formula a
    spreadsheet would run, controls as ?); number and time columns as they are."""
    from cocaq.footprint.export_rows import COLUMNS
    from cocaq.textsafe import csv_text

    out = df.copy()
    for name, kind in COLUMNS[table].items():
        if kind == "str":
            out[name] = out[name].map(csv_text, na_action="ignore")
    return out
