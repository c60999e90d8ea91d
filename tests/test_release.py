"""The version is written once (cocaq/__init__.py), CHANGELOG.md's newest section names it, and the
pre-commit hooks run what CI runs first (issue 37, point 6)."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import version
from pathlib import Path

import yaml

import cocaq

ROOT = Path(__file__).resolve().parent.parent


def test_the_version_is_written_in_one_place() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["hatch"]["version"]["path"] == "cocaq/__init__.py"
    assert re.fullmatch(r"\d+\.\d+\.\d+(?:[ab]\d+|rc\d+)?", cocaq.__version__)
    # (the installed metadata is made from it: scripts/setup-venv.sh installs the checkout)
    assert version("cocaq") == cocaq.__version__


def test_the_changelog_opens_with_this_version() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    sections = re.findall(r"^## (\S+)", text, flags=re.M)
    assert sections and sections[0] == cocaq.__version__, sections
    assert len(sections) == len(set(sections))  # one section per version


def test_pre_commit_runs_what_ci_runs_first() -> None:
    hooks = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())["repos"][0]["hooks"]
    ci = (ROOT / "scripts" / "test.sh").read_text()
    entries = [h["entry"] for h in hooks]
    assert entries == [".venv/bin/ruff check .", ".venv/bin/ruff format --check .", "scripts/typecheck.sh"]
    for entry in entries:
        assert entry in ci, entry  # the same command, so a commit that passes them passes CI's first steps
    assert all(h["language"] == "system" and h["pass_filenames"] is False for h in hooks)
