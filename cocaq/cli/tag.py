"""`cocaq tag`: a job records its model metadata from the shell (the library side is cocaq.ml.annotation)."""

from __future__ import annotations

import sys

import click


@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("pairs", nargs=-1, required=True)
@click.option("--strict", is_flag=True, help="Exit 1 when nothing was recorded (default: warn, exit 0).")
def tag(pairs: tuple[str, ...], strict: bool) -> None:
    """Record model metadata from inside a Slurm job: `cocaq tag model=llama-3-8b precision=bf16 epochs=2`.

    Run it any time, as often as you like (later values win; `key=` removes a key). Known keys: model,
    task, framework, framework_version, params, precision, batch_size, dataset, epochs, tokens; others are
    kept as extra. A problem is a warning and exit status 0, so a job script with `set -e` goes on.
    """
    from cocaq.ml.annotation import parse_pairs, update

    values, bad = parse_pairs(list(pairs))
    for word in bad:
        click.echo(f"cocaq: warning: {word!r} is not key=value; ignored", err=True)
    ok = bool(values) and update(values)
    if strict and not ok:
        sys.exit(1)
