"""`cocaq db`: the database's migrations (the work is in cocaq.db.migrate)."""

from __future__ import annotations

import click

from cocaq.cli.app import Ctx


@click.group()
def db() -> None:
    """The database: migrations."""


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True)
@click.pass_obj
def db_upgrade(obj: Ctx, revision: str) -> None:
    """Create or migrate the configured database."""
    from cocaq.db import migrate
    from cocaq.db.engine import mask_url

    engine = obj.engine(migrated=False)
    before = migrate.current_revision(engine)
    migrate.upgrade(engine, revision)
    after = migrate.current_revision(engine)
    click.echo(f"{mask_url(obj.cfg.database_url)}: schema {before or 'empty'} -> {after}", err=True)


@db.command("current")
@click.pass_obj
def db_current(obj: Ctx) -> None:
    """Print the schema revision of the configured database."""
    from cocaq.db import migrate

    click.echo(migrate.current_revision(obj.engine(migrated=False)) or "empty")


@db.command("retention")
@click.option(
    "--dry-run", is_flag=True, help="List what would go (and the partitions to make); change nothing."
)
@click.pass_obj
def db_retention(obj: Ctx, dry_run: bool) -> None:
    """Drop raw samples older than [retention] samples_days that the aggregator has summarised.

    On PostgreSQL whole monthly partitions go (and the coming months' are made); on SQLite the old rows
    are deleted in batches. The per-job and per-hour summaries stay. The scheduler runs it daily.
    """
    from cocaq.accounting.retention import run_retention
    from cocaq.db.status import size_text

    res = run_retention(obj.engine(), obj.cfg, dry_run=dry_run)
    verb = "would drop" if dry_run else "dropped"
    for m in res.months:
        rows = "rows unknown" if m.rows is None else f"~{m.rows:,} rows"
        if m.action == "keep":
            click.echo(f"kept {m.name} ({m.month}): {m.reason}")
        else:
            took = "" if dry_run else f" in {m.seconds:.2f} s"
            click.echo(f"{verb} {m.name} ({m.month}): {rows}, {size_text(m.bytes)}{took}")
    if res.dialect != "postgresql" and res.cutoff is not None:
        when = f" before {res.deleted_before:%Y-%m-%d %H:%M} UTC" if res.deleted_before else ""
        click.echo(f"{'would delete' if dry_run else 'deleted'} {res.deleted:,} samples{when}")
        if res.kept:
            click.echo(f"kept older samples: {res.kept}")
    for name in res.created:
        click.echo(f"{'would make' if dry_run else 'made'} partition {name}")
    if res.shipments:
        click.echo(f"{'would delete' if dry_run else 'deleted'} {res.shipments:,} node_shipments rows")
    click.echo(res.line(), err=True)


@db.command("status")
@click.option(
    "-o", "--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True
)
@click.pass_obj
def db_status(obj: Ctx, fmt: str) -> None:
    """Rows and size on disk per table, samples per month, and the retention setting."""
    from cocaq.cli import db_status_view

    db_status_view.show(obj, fmt)
