"""`cocaq hook shims` and `cocaq collector`: the node side's commands (the work is in prolog_epilog/ and
collector/)."""

from __future__ import annotations

import logging

import click

from cocaq.cli.app import Ctx

log = logging.getLogger("cocaq")


@click.group()
def hook() -> None:
    """Slurm Prolog/Epilog hooks."""


@hook.command("shims")
@click.option(
    "--dir", "directory", required=True, type=click.Path(file_okay=False), help="Where to write them."
)
@click.option(
    "--hook-config",
    default="/etc/cocaq/cocaq.toml",
    show_default=True,
    help="Config file the hooks read (absolute; Slurm passes no environment).",
)
@click.option("--timeout", "timeout_s", default=20, show_default=True, type=click.IntRange(1, 300))
def hook_shims(directory: str, hook_config: str, timeout_s: int) -> None:
    """Write cocaq-prolog, cocaq-epilog (and the slurmctld ones) for slurm.conf's Prolog=/Epilog=."""
    from cocaq.prolog_epilog.shims import write_shims

    for path in write_shims(directory, hook_config, timeout_s=timeout_s):
        click.echo(path)


@click.command()
@click.option("--once", is_flag=True, help="One cycle: sample every source, ship everything spooled, exit.")
@click.option(
    "--interval", "interval_s", type=click.FloatRange(1, 3600), default=None, help="Seconds (config)."
)
@click.option("--no-ship", is_flag=True, help="Sample and spool only; leave shipping to a later run.")
@click.option(
    "--metrics-listen",
    "metrics_listen",
    default=None,
    metavar="ADDR",
    help='Serve Prometheus metrics at ADDR (":9830", "127.0.0.1:9830", "[::1]:9830"; "" = off); config:'
    " [collector] metrics_listen.",
)
@click.pass_obj
def collector(
    obj: Ctx, once: bool, interval_s: float | None, no_ship: bool, metrics_listen: str | None
) -> None:
    """The node collector daemon: sample GPUs, RAPL and cgroups per job, ship the spool to the database."""
    from dataclasses import replace

    from cocaq.collector.daemon import run_collector
    from cocaq.config import parse_listen

    cfg = obj.cfg
    if metrics_listen is not None:
        if metrics_listen.strip():
            try:
                parse_listen(metrics_listen.strip())
            except ValueError as exc:
                raise click.BadParameter(str(exc), param_hint="--metrics-listen") from None
        cfg = replace(cfg, collector=replace(cfg.collector, metrics_listen=metrics_listen.strip()))
    run_collector(cfg, once=once, interval_s=interval_s, ship=not no_ship)
