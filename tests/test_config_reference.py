"""docs/configuration.md is what `python -m cocaq.config_reference` writes from the config model now,
and what it says matches what the loader accepts (keys, sections, environment variables)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from cocaq import config as C
from cocaq import config_load as L
from cocaq.config_reference import REGENERATE, render
from cocaq.errors import ConfigError

DOC = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


def test_the_reference_is_current() -> None:
    assert DOC.read_text(encoding="utf-8") == render(), (
        f"docs/configuration.md is out of date with cocaq/config.py: run `{REGENERATE}` and commit it"
    )


def test_every_setting_has_a_description() -> None:
    factories = [f.default_factory for f in dataclasses.fields(C.Config)]
    for cls in [c for c in factories if isinstance(c, type) and dataclasses.is_dataclass(c)]:
        assert cls.__doc__, cls
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            assert f.metadata.get("doc"), f"{cls.__name__}.{f.name}: no 'doc' in its field metadata"


def _documented() -> dict[str, list[str]]:
    """Section heading -> the keys its table lists."""
    out: dict[str, list[str]] = {}
    section = ""
    for line in render().splitlines():
        if line.startswith("## "):
            m = re.fullmatch(r"## \[(.+)\]", line)
            section = m.group(1) if m else line[3:]
            out.setdefault(section, [])
        elif line.startswith("| `") and section:
            out[section].append(line.split("`")[1])
    return out


def _known(tmp_path: Path, toml: str) -> list[str]:
    p = tmp_path / "c.toml"
    p.write_text(toml)
    with pytest.raises(ConfigError) as exc:
        L.load_config(p, environ={})
    m = re.search(r"unknown key \(known: ([^)]*)\)", str(exc.value))
    assert m, str(exc.value)
    return sorted(m.group(1).split(", "))


def test_the_documented_keys_are_the_ones_the_loader_accepts(tmp_path: Path) -> None:
    doc = _documented()
    top = set(doc["Top-level keys"]) | {s.split(".")[0] for s in doc if s[0].islower()}
    assert _known(tmp_path, "zzz = 1\n") == sorted(top)
    for section in ("cluster", "collector", "carbon", "embodied", "aggregate", "mail", "reports", "api"):
        assert _known(tmp_path, f"[{section}]\nzzz = 1\n") == sorted(doc[section]), section
    for section in ("advice", "alerts", "slurm", "estimate", "defaults"):
        assert _known(tmp_path, f"[{section}]\nzzz = 1\n") == sorted(doc[section]), section
    assert _known(tmp_path, "[partitions.gpu]\nzzz = 1\n") == sorted(doc["defaults"])
    assert doc["node_groups.NAME"] == ["nodes"]
    assert _known(tmp_path, "[node_groups.g]\nnodes = ['a']\nzzz = 1\n") == sorted(doc["defaults"])


def test_the_documented_environment_variables_work(tmp_path: Path) -> None:
    values = {
        "database_url": "sqlite:///x.sqlite",
        "spool_dir": "/tmp/spool-x",
        "cluster.name": "hal-x",
        "api.url": "https://head.example.org:8470",
        "mail.smtp_host": "mx.example.org",
        "mail.smtp_port": "2525",
    }
    assert set(L.ENV_SHORTHANDS.values()) == set(values)
    for var, key in L.ENV_SHORTHANDS.items():
        cfg = L.load_config(None, environ={var: values[key]})
        obj: object = cfg
        for part in key.split("."):
            obj = getattr(obj, part)
        assert str(obj) == values[key], var
    for section in L.ENV_SECTIONS:
        with pytest.raises(ConfigError, match=rf"config: {section}\.zzz: unknown key"):
            L.load_config(None, environ={f"COCAQ_{section.upper()}__ZZZ": "1"})
    with pytest.raises(ConfigError, match="unknown section 'partitions'"):
        L.load_config(None, environ={"COCAQ_PARTITIONS__GPU": "1"})
    with pytest.raises(ConfigError, match="unknown setting"):
        L.load_config(None, environ={"COCAQ_NO_SUCH_THING": "1"})
    for var in L._NON_SETTING_ENV:
        if var != "COCAQ_CONFIG":
            L.load_config(None, environ={var: "x"})  # not a setting: ignored
