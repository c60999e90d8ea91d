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
