"""`cocaq`: the command line.  A thin layer over the library; errors are one line, never a traceback."""

from __future__ import annotations

import errno
import logging
import os
import sys
from typing import Any, ClassVar

import click

from cocaq.config import Config
from cocaq.config_load import load_config
from cocaq.errors import CocaqError, DatabaseError, UsageError

log = logging.getLogger("cocaq")


class Ctx:
    def __init__(self, config_path: str | None, verbose: int) -> None:
        self.config_path = config_path
        self.verbose = verbose
        self._cfg: Config | None = None

    @property
    def cfg(self) -> Config:
        if self._cfg is None:
            self._cfg = load_config(self.config_path)
        return self._cfg

    def engine(self, *, migrated: bool = True) -> Any:
        from cocaq.db.engine import make_engine, require_schema

        engine = make_engine(self.cfg.database_url)
        if migrated:
            require_schema(engine)
        return engine


def _console(stderr: bool = False) -> Any:
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    # Piped output keeps whole columns rather than rich's 80-column default, unless COLUMNS says otherwise
    # (tables then drop their least important columns: cocaq.cli.terminal.fit_table).
    width = None if stream.isatty() or os.environ.get("COLUMNS", "").strip().isdigit() else 160
    return Console(stderr=stderr, highlight=False, soft_wrap=stderr, width=width)


def _window(since: str, until: str | None) -> Any:
    from cocaq.footprint.lookup import parse_window

    w = parse_window(since, until)
    if w.until <= w.since:
        raise UsageError(f"empty window: --until ({w.until:%Y-%m-%d %H:%M}) is not after --since")
    return w


FORMAT = click.Choice(["table", "json", "csv"])
since_opt = click.option(
    "-S",
    "--since",
    "--starttime",
    "since",
    default="30d",
    show_default=True,
    help="Window start: a duration back from now (30d, 12h, 2w) or a date (2026-11-01, 20261101).",
)
until_opt = click.option(
    "-E",
    "--until",
    "--endtime",
    "until",
    default=None,
    help="Window end (default: now); same forms as --since.",
)
cluster_opt = click.option(
    "-M", "--cluster", default=None, help="Only this cluster (default: all in the database)."
)


class LazyGroup(click.Group):
    """Commands that live in their own modules are imported when named (or listed by --help): `cocaq
    user` on a login node does not pay for importing the report, mail, carbon and scheduler commands."""

    # name -> ("module:attribute", then modules that add subcommands to it)
    lazy: ClassVar[dict[str, tuple[str, ...]]] = {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy and cmd_name not in self.commands:
            import importlib

            module, attribute = self.lazy[cmd_name][0].split(":")
            command = getattr(importlib.import_module(module), attribute)
            for extra in self.lazy[cmd_name][1:]:
                importlib.import_module(extra)
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Config file (default: $COCAQ_CONFIG, then /etc/cocaq/cocaq.toml).",
)
@click.option("-v", "--verbose", count=True, help="More logging (-vv for debug).")
@click.version_option(package_name="cocaq")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None, verbose: int) -> None:
    """Energy and CO2 of Slurm jobs, per job, user and lab."""
    level = logging.WARNING - 10 * verbose
    logging.basicConfig(level=max(level, logging.DEBUG), format="cocaq: %(levelname)s: %(message)s")
    ctx.obj = Ctx(config_path, verbose)


# --- every command lives in its own module, imported when named (LazyGroup) ------------------------------
LazyGroup.lazy.update(
    {
        "user": ("cocaq.cli.footprint:user",),
        "lab": ("cocaq.cli.footprint:lab",),
        "job": ("cocaq.cli.footprint:job",),
        "watch": ("cocaq.cli.watch:watch",),
        "tag": ("cocaq.cli.tag:tag",),
        "import": ("cocaq.cli.accounting:import_",),
        "recompute": ("cocaq.cli.accounting:recompute",),
        "aggregate": ("cocaq.cli.accounting:aggregate",),
        "reconcile": ("cocaq.cli.accounting:reconcile",),
        "db": ("cocaq.cli.db:db",),
        "hook": ("cocaq.cli.node:hook",),
        "collector": ("cocaq.cli.node:collector",),
        "demo": ("cocaq.cli.demo:demo",),
        "calibrate": ("cocaq.cli.calibrate:calibrate",),
        "carbon": ("cocaq.cli.carbon:carbon",),
        "mail": ("cocaq.cli.mail:mail",),
        "models": ("cocaq.cli.models:models",),
        "report": ("cocaq.cli.report:report", "cocaq.cli.report_send"),  # the latter adds `report send`
        "scheduler": ("cocaq.cli.scheduler:scheduler",),
        "serve": ("cocaq.cli.serve:serve",),
        "web": ("cocaq.cli.web:web",),
        # the latter two add `study report` and `study plan`
        "study": ("cocaq.cli.study:study", "cocaq.cli.study_report", "cocaq.cli.study_plan"),
        "export": ("cocaq.cli.export:export",),
    }
)


_WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="cocaq", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("cocaq: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except CocaqError as exc:
        click.echo(f"cocaq: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("cocaq: interrupted", err=True)
        sys.exit(130)
    except BrokenPipeError:
        os._exit(0)
    except OSError as exc:
        # A full disk under `> file` as click.echo writes (commands that write CSV or JSON say which
        # output: cocaq.outfile.stdout); only the errors a write alone gives, so no read error hides here.
        if exc.filename is not None or exc.errno not in _WRITE_ERRNOS:
            raise
        click.echo(f"cocaq: error: cannot write the output: {exc.strerror or exc}", err=True)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)  # (so that the interpreter's last flush of stdout does not fail again)
        sys.exit(1)
    except Exception as exc:  # last resort: the database going away mid-command, say
        from sqlalchemy.exc import OperationalError

        if isinstance(exc, OperationalError):
            click.echo(f"cocaq: error: {DatabaseError(str(exc.orig).splitlines()[0])}", err=True)
            sys.exit(3)
        raise
