"""docs/architecture.md names every module of the package, and every path it names exists.

The page is where a newcomer looks a module up, so a module it does not name is one nobody finds, and a
path it names that is gone (a rename, a split) sends them nowhere. Modules are those tests/test_layers.py
walks (cocaq/ with the root folders it links to), each named by its path in the repository: a root
folder's module as `collector/daemon.py`, a package by its folder (`cocaq/db/`), the migrations'
revisions by theirs (`migrations/versions/`). A path is a code span whose first part is an entry of the
repository's root; a bare `name.py` is not a path and is flagged too, so that every module the page
names can be found by searching for its path.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from tests.test_layers import ROOT, _modules

DOC = ROOT / "docs" / "architecture.md"
LINKED = ("collector", "prolog_epilog", "reports", "migrations", "ood")  # root folders cocaq/ links to


def doc_path(path: Path) -> str:
    """A module's file as the page names it (`cocaq/db/engine.py`, `reports/batch.py`, `cocaq/db/`)."""
    rel = path.relative_to(ROOT / "cocaq")
    parts = list(rel.parts) if rel.parts[0] in LINKED else ["cocaq", *rel.parts]
    if parts[-1] == "__init__.py":
        return "/".join(parts[:-1]) + "/"
    return "/".join(parts)


def package_paths() -> list[str]:
    """Every module of the package, and the migrations' revisions as one folder."""
    out = sorted(doc_path(p) for p in _modules().values())
    if any((ROOT / "migrations" / "versions").glob("*.py")):
        out.append("migrations/versions/")
    return out


def spans(text: str) -> set[str]:
    """The page's inline code spans."""
    return set(re.findall(r"`([^`\n]+)`", text))


def unnamed(text: str, modules: Iterable[str]) -> list[str]:
    """The modules the page does not name."""
    named = spans(text)
    return [m for m in modules if m not in named]


def dead_paths(text: str, root: Path) -> list[str]:
    """The paths the page names that do not exist, its bare `name.py` spans, and its relative links that
    lead nowhere."""
    tops = {p.name for p in root.iterdir()}
    bad = []
    for s in sorted(spans(text)):
        if " " in s or not re.fullmatch(r"[\w./-]+", s):
            continue  # a command, an option, a sentence
        if "/" not in s:
            if s.endswith(".py"):
                bad.append(f"`{s}` (not a path: name the module by its path)")
            continue
        if s.split("/")[0] in tops and not (root / s).exists():
            bad.append(f"`{s}`")
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" not in target and not (DOC.parent / target).exists():
            bad.append(f"link {target}")
    return bad


def test_the_architecture_names_every_module() -> None:
    missing = unnamed(DOC.read_text(), package_paths())
    assert missing == [], "docs/architecture.md does not name:\n" + "\n".join(missing)


def test_every_path_the_architecture_names_exists() -> None:
    bad = dead_paths(DOC.read_text(), ROOT)
    assert bad == [], "docs/architecture.md names what is not there:\n" + "\n".join(bad)


def test_the_checks_find_a_planted_module_and_a_planted_path() -> None:
    """The checks themselves: the walk finds modules of cocaq/ and of the linked folders, a module the page
    lacks is named, and so are a path that is gone, a bare file name and a dead link."""
    modules = package_paths()
    assert len(modules) > 100 and {"cocaq/", "cocaq/db/", "reports/batch.py", "migrations/versions/"} <= set(
        modules
    )
    text = DOC.read_text()
    assert unnamed(text, [*modules, "cocaq/footprint/planted.py"]) == ["cocaq/footprint/planted.py"]
    gone = text + "\n`cocaq/footprint/gone.py`, `gone.py`, [a page](gone.md), `spool_dir/events/`\n"
    assert dead_paths(gone, ROOT) == [
        "`cocaq/footprint/gone.py`",
        "`gone.py` (not a path: name the module by its path)",
        "link gone.md",
    ]
