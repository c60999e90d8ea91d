"""The configuration reference (docs/configuration.md), written from the config model itself.

Every setting of cocaq.toml is a field of a frozen dataclass in cocaq.config, and carries its one-line
description in the field's metadata (`doc`); the sections' descriptions are the dataclasses' docstrings,
and the environment variables come from the loader, cocaq.config_load (`ENV_SECTIONS`, `ENV_SHORTHANDS`
and `_NON_SETTING_ENV`, what `_apply_env` accepts). This module only renders them, so the reference
cannot drift from the code: tests/test_config_reference.py fails when docs/configuration.md is not what
`render()` makes now.
Regenerate with `python -m cocaq.config_reference --output docs/configuration.md`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Iterator
from typing import Any

from cocaq import config as C
from cocaq import config_load as L

REGENERATE = "python -m cocaq.config_reference --output docs/configuration.md"

# TOML's words for the model's annotations (a new annotation fails loudly, so the reference stays true).
_TYPES = {
    "str": "string",
    "float": "number",
    "int": "integer",
    "bool": "boolean",
    "tuple[str, ...]": "list of strings",
    "tuple[float, ...]": "list of numbers",
    "dict[str, float]": "table of numbers",
    "dict[str, str]": "table of strings",
    "dict[str, tuple[str, ...]]": "table of lists of strings",
}

_INTRO = """\
# Configuration reference

<!-- Generated from cocaq/config.py by cocaq/config_reference.py; do not edit by hand.
     tests/test_config_reference.py fails when this file is out of date. -->

cocaq reads one TOML file: `--config FILE`, else `$COCAQ_CONFIG`, else `/etc/cocaq/cocaq.toml` if it
exists, else built-in defaults. Environment variables override single keys: `COCAQ_SECTION__KEY` for any
key of the sections that allow it (`COCAQ_CLUSTER__PUE=1.3`; lists as comma-separated values, booleans as
1/0, true/false, yes/no or on/off), plus the short forms listed at the end. A bad key or value is one line
naming it, with a non-zero exit code; the node hooks instead fall back to the built-in defaults and say so
in their log.

This page is written from the config model (`cocaq/config.py`: one dataclass per section, each key's
description in its field's metadata). To change it, change the model and run:

    {regen}

The guides show the settings in context: [admin guide](admin-guide.md), [user guide](user-guide.md).
"""


def _type(f: dataclasses.Field[Any]) -> str:
    t = str(f.type)
    optional = t.endswith(" | None")
    base = t.removesuffix(" | None")
    if base not in _TYPES:
        raise TypeError(f"config_reference: no TOML name for {f.name}'s type {t!r}")
    return _TYPES[base] + (", optional" if optional else "")


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() else repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, tuple | list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"config_reference: cannot write {v!r} as TOML")


def _default(f: dataclasses.Field[Any]) -> str:
    if "default_doc" in f.metadata:
        return str(f.metadata["default_doc"])
    if f.default is None:
        return "unset"
    if f.default is not dataclasses.MISSING:
        return f"`{_toml(f.default)}`"
    if f.default_factory is not dataclasses.MISSING:
        return f"`{_toml(f.default_factory())}`"
    return "required"


def _doc(f: dataclasses.Field[Any]) -> str:
    doc = f.metadata.get("doc")
    if not doc:
        raise ValueError(f"config_reference: {f.name} has no description (field metadata 'doc')")
    return str(doc)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _shorthand(key: str) -> str | None:
    for var, target in L.ENV_SHORTHANDS.items():
        if target == key:
            return var
    return None


def _env(section: str | None, f: dataclasses.Field[Any]) -> str:
    if _type(f).startswith("table"):
        return "file only"
    names = []
    if section is not None:
        if section not in L.ENV_SECTIONS:
            return "file only"
        names.append(f"COCAQ_{section.upper()}__{f.name.upper()}")
    short = _shorthand(f"{section}.{f.name}" if section else f.name)
    if short:
        names.append(short)
    return ", ".join(f"`{n}`" for n in names) if names else "file only"


def _doc_of(cls: type) -> str:
    return " ".join((cls.__doc__ or "").split("\n\n")[0].split())


def _table(section: str | None, rows: list[tuple[str, dataclasses.Field[Any]]]) -> Iterator[str]:
    yield "| key | type | default | environment | description |"
    yield "| --- | --- | --- | --- | --- |"
    for key, f in rows:
        cells = (f"`{key}`", _type(f), _default(f), _env(section, f), _doc(f))
        yield "| " + " | ".join(_cell(c) for c in cells) + " |"


def _sections() -> Iterator[str]:
    cfg_fields = dataclasses.fields(C.Config)
    top = [(f.name, f) for f in cfg_fields if f.metadata.get("doc") and "toml" not in f.metadata]
    yield "## Top-level keys"
    yield ""
    yield from _table(None, top)
    for f in cfg_fields:
        where = f.metadata.get("toml", f.name)
        if where is None or (f.name, f) in top or where == "cluster.pue_monthly":
            continue
        if where == "partitions.NAME":
            yield ""
            yield "## [partitions.NAME]"
            yield ""
            yield (
                "The hardware of partition NAME (a partition missing here uses `[defaults]`, and the "
                "reports say so): the same keys as `[defaults]`, each defaulting to its value there. "
                "A job submitted to several partitions counts in the first that sacct reports. File only."
            )
            continue
        if where == "node_groups.NAME":
            yield ""
            yield "## [node_groups.NAME]"
            yield ""
            yield (
                _doc_of(C.NodeGroup) + " The group's keys default to `[defaults]`; a job takes the first "
                "group that holds all its nodes, else its partition, else `[defaults]`. File only."
            )
            yield ""
            nodes = next(g for g in dataclasses.fields(C.NodeGroup) if g.name == "nodes")
            yield from _table(where, [("nodes", nodes)])
            continue
        cls = f.default_factory
        assert isinstance(cls, type) and dataclasses.is_dataclass(cls), f.name
        yield ""
        yield f"## [{where}]"
        yield ""
        doc = _doc_of(cls)
        if where == "defaults":
            doc += " Also the base of every `[partitions.NAME]` and `[node_groups.NAME]`."
        yield doc
        yield ""
        rows = [(g.name, g) for g in dataclasses.fields(cls)]
        if where == "cluster":
            pm = next(g for g in cfg_fields if g.metadata.get("toml") == "cluster.pue_monthly")
            rows.append(("pue_monthly", pm))
        yield from _table(where, rows)


def _environment() -> Iterator[str]:
    yield "## Environment variables"
    yield ""
    yield (
        "Besides `COCAQ_SECTION__KEY` for the sections "
        + ", ".join(f"`[{s}]`" for s in L.ENV_SECTIONS)
        + " (not `[partitions.*]`, `[node_groups.*]` or tables such as `lab_heads`), these short forms "
        "set one key each. Variables are applied in name order, so `COCAQ_SMTP_HOST` and "
        "`COCAQ_SMTP_PORT` win over `COCAQ_MAIL__SMTP_HOST`/`_PORT`, while `COCAQ_CLUSTER__NAME` and "
        "`COCAQ_API__URL` win over `COCAQ_CLUSTER` and `COCAQ_API_URL`. Any other `COCAQ_*` variable "
        "is an error naming it."
    )
    yield ""
    yield "| variable | sets |"
    yield "| --- | --- |"
    for var, key in L.ENV_SHORTHANDS.items():
        yield f"| `{var}` | `{key}` |"
    yield ""
    yield (
        "These are read elsewhere and are not settings (nor are `COCAQ_TEST_*` and `COCAQ_BENCH_*`, "
        "used by the tests and benchmarks, or the variable named by `mail.smtp_password_env`, which "
        "holds a password):"
    )
    yield ""
    yield "| variable | what it does |"
    yield "| --- | --- |"
    for var, what in L._NON_SETTING_ENV.items():
        yield f"| `{var}` | {_cell(what)} |"
    yield ""
    yield (
        "Nor are the variables of the repository's own scripts and tests, so that a shell which built "
        "Slurm and pyslurm with `tests/slurm/` can run cocaq. They are ignored by exact name: "
        "`COCAQ_SLURM_BACKEND`, say, is still an error (did you mean `COCAQ_SLURM__BACKEND`?)."
    )
    yield ""
    yield "| variable | used by |"
    yield "| --- | --- |"
    for var, what in L.TOOL_ENV.items():
        yield f"| `{var}` | {_cell(what)} |"


def render() -> str:
    """The reference as Markdown, from the model as it is now."""
    parts = [_INTRO.format(regen=REGENERATE), *_sections(), "", *_environment()]
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m cocaq.config_reference", description="Write the configuration reference (Markdown)."
    )
    p.add_argument("--output", "-o", help="write it to this file (default: standard output)")
    args = p.parse_args(argv)
    text = render()
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
