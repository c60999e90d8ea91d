"""The wheel holds one top-level package, `cocaq`, with everything a `pip install .` needs."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from sqlalchemy import create_engine

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (whl,) = out.glob("cocaq-*.whl")
    return whl


def test_wheel_has_a_single_top_level_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/", 1)[0] for n in names}
    assert top == {"cocaq", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}
    for path in (
        "cocaq/__init__.py",
        "cocaq/cli/app.py",
        "cocaq/collector/__init__.py",
        "cocaq/prolog_epilog/__init__.py",
        "cocaq/reports/__init__.py",
        "cocaq/migrations/env.py",
        "cocaq/migrations/script.py.mako",
        "cocaq/migrations/versions/0001_initial_schema.py",
    ):
        assert path in names, path
    assert not [n for n in names if n.startswith(("tests/", "collector/", "migrations/"))]
    # the report templates ship with the code that renders them (reports/render.py reads them from there)
    templates = sorted(p.name for p in (ROOT / "reports" / "templates").iterdir() if p.is_file())
    assert "user_month.html" in templates and "_theme.html" in templates
    for name in templates:
        assert f"cocaq/reports/templates/{name}" in names, name


def test_the_open_ondemand_app_ships_in_the_wheel(wheel: Path) -> None:
    """ood/ (issue 38) is in the wheel as cocaq/ood/, byte for byte, its bin/python executable: the
    Ansible role and the admin guide copy the app from the installed package."""
    z = zipfile.ZipFile(wheel)
    files = sorted(p for p in (ROOT / "ood").rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    rels = {p.relative_to(ROOT / "ood").as_posix() for p in files}
    assert {"manifest.yml", "passenger_wsgi.py", "bin/python"} <= rels
    for p in files:
        name = "cocaq/ood/" + p.relative_to(ROOT / "ood").as_posix()
        assert z.read(name) == p.read_bytes(), name
    mode = z.getinfo("cocaq/ood/bin/python").external_attr >> 16
    assert mode & 0o111 == 0o111, oct(mode)


def test_installed_wheel_works_without_the_checkout(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("COCAQ_")}
    env.update(PYTHONPATH=str(target), XDG_DATA_HOME=str(tmp_path / "data"), HOME=str(tmp_path))
    code = (
        "import cocaq, cocaq.collector, cocaq.prolog_epilog, cocaq.reports, cocaq.migrations;"
        "print(cocaq.__file__); print(cocaq.migrations.__file__)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert all(line.startswith(str(target)) for line in r.stdout.split())
    # the Open OnDemand app's folder, found from the installed package as the admin guide finds it
    code = "import cocaq, pathlib; print(pathlib.Path(cocaq.__file__).parent / 'ood')"
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, check=True
    )
    ood = Path(r.stdout.strip())
    assert ood.is_relative_to(target) and (ood / "manifest.yml").is_file(), ood
    assert (ood / "passenger_wsgi.py").is_file() and os.access(ood / "bin" / "python", os.X_OK)
    url = f"sqlite:///{tmp_path / 'w.sqlite'}"
    r = subprocess.run(
        [sys.executable, "-m", "cocaq", "db", "upgrade"],
        env=dict(env, COCAQ_DATABASE_URL=url),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    from alembic.script import ScriptDirectory

    from cocaq.db.migrate import alembic_config

    head = ScriptDirectory.from_config(alembic_config(create_engine("sqlite://"))).get_current_head()
    assert r.returncode == 0 and f"-> {head}" in r.stderr, r.stderr  # the newest migration, from the wheel


def test_node_side_packages_import_light() -> None:
    """Hooks and collector run as root on every node: no pandas (nor pyarrow, cocaq.frames), ORM or
    codecarbon at import time, in the hook's and the collector's own modules too."""
    code = (
        "import sys, cocaq.prolog_epilog, cocaq.collector, cocaq.prolog_epilog.hook, cocaq.collector.daemon,"
        " cocaq.collector.ship, cocaq.collector.spool;"
        "heavy = [m for m in ('pandas', 'pyarrow', 'cocaq.frames', 'sqlalchemy', 'codecarbon', 'rich', 'click')"
        " if m in sys.modules];"
        "print(','.join(heavy))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert r.stdout.strip() == ""
