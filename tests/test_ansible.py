"""ansible/: ansible-lint at the production profile and the playbook's syntax, as the issue asks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

ANSIBLE = ROOT / "ansible"
BIN = Path(sys.executable).parent


def ansible_env() -> dict[str, str]:
    """This venv's ansible, the repo's ansible.cfg, none of the caller's ANSIBLE_/COCAQ_/PIP_ settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "COCAQ_", "PIP_"))}
    env["PATH"] = f"{BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    env["ANSIBLE_CONFIG"] = str(ANSIBLE / "ansible.cfg")
    env["ANSIBLE_LOCAL_TEMP"] = env["ANSIBLE_REMOTE_TEMP"] = "/tmp/cocaq-ansible-tmp"
    env["ANSIBLE_NOCOLOR"] = "1"
    return env


def test_ansible_lint_production_profile_is_clean() -> None:
    r = subprocess.run(
        [str(BIN / "ansible-lint"), "--offline", "--profile", "production", "--nocolor"],
        cwd=ANSIBLE, env=ansible_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert "Passed" in r.stdout + r.stderr and "production" in r.stdout + r.stderr


def test_the_playbook_passes_syntax_check() -> None:
    r = subprocess.run(
        [str(BIN / "ansible-playbook"), "--syntax-check", "-i", "inventory/example/hosts.yml", "site.yml"],
        cwd=ANSIBLE, env=ansible_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_role_variable_is_documented_in_the_example_inventory() -> None:
    import yaml

    documented: set[str] = set()
    for f in (ANSIBLE / "inventory" / "example" / "group_vars").glob("*.yml"):
        documented |= set(yaml.safe_load(f.read_text()) or {})
    for role in ("cocaq_node", "cocaq_server"):
        defaults = yaml.safe_load((ANSIBLE / "roles" / role / "defaults" / "main.yml").read_text()) or {}
        missing = sorted(set(defaults) - documented)
        assert not missing, f"{role}: defaults not in inventory/example/group_vars: {missing}"


def test_files_both_roles_carry_are_the_same() -> None:
    # each role stands alone (it can be copied into a site's roles/ by itself), so a few files are in both
    for rel in ("templates/sysvinit.j2", "tasks/pip_spec.yml"):
        node, server = (ANSIBLE / "roles" / r / rel for r in ("cocaq_node", "cocaq_server"))
        assert node.read_bytes() == server.read_bytes(), f"roles/*/{rel} differ between the two roles"
