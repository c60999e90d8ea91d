"""ansible/: ansible-lint at the production profile and the playbook's syntax, as the issue asks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

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


def test_the_server_role_writes_prometheus_targets_and_the_grafana_dashboard(tmp_path: Path) -> None:
    """cocaq_server's prometheus.yml and grafana.yml tasks, run for real on this machine: the file_sd
    targets list every compute node at its metrics port with cluster and node labels, and a real
    Prometheus loads them through the scrape jobs the role wrote; the dashboard and its provider are in
    place; a second run changes nothing."""
    import json

    import yaml

    from tests.promkit import Prometheus

    if os.geteuid() != 0:
        pytest.skip("needs root: the role writes root-owned files")
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"children": {
        "head": {"hosts": {"head1": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}},
        "compute": {"hosts": {
            "gpu001.example.org": {"cocaq_collector_metrics_listen": ":9831"},
            "gpu002.example.org": {"ansible_host": "fd00::2"},
            "gpu003.example.org": {"ansible_host": "10.0.0.3", "cocaq_cluster_name": "other"},
        }},
    }}}))  # fmt: skip
    prom, dash, prov = tmp_path / "prometheus", tmp_path / "dashboards", tmp_path / "provisioning"
    play = tmp_path / "play.yml"
    play.write_text(yaml.safe_dump([{
        "hosts": "head", "gather_facts": False,
        "vars": {
            "cocaq_cluster_name": "main", "cocaq_api_metrics": True, "cocaq_api_metrics_token": "t0ken",
            "cocaq_prometheus_scrape_config_dir": str(prom), "cocaq_prometheus_group": "root",
            "cocaq_grafana_dashboards_dir": str(dash), "cocaq_grafana_provisioning_dir": str(prov),
        },
        "tasks": [
            {"name": "Prometheus", "ansible.builtin.include_role": {"name": "cocaq_server", "tasks_from": "prometheus"}},
            {"name": "Grafana", "ansible.builtin.include_role": {"name": "cocaq_server", "tasks_from": "grafana"}},
        ],
    }]))  # fmt: skip

    def run() -> str:
        r = subprocess.run(
            [str(BIN / "ansible-playbook"), "-i", str(inv), str(play)],
            cwd=ANSIBLE, env=ansible_env(), capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
        return r.stdout

    assert "changed=0" not in run()
    assert "changed=0" in run(), "a second run changes nothing"
    targets = json.loads((prom / "cocaq-nodes.json").read_text())
    assert targets == [
        {"targets": ["gpu001.example.org:9831"], "labels": {"cluster": "main", "node": "gpu001"}},
        {"targets": ["[fd00::2]:9830"], "labels": {"cluster": "main", "node": "gpu002"}},
        {"targets": ["10.0.0.3:9830"], "labels": {"cluster": "other", "node": "gpu003"}},
    ]
    token = prom / "cocaq-api-token"
    assert token.read_text() == "t0ken\n" and oct(token.stat().st_mode & 0o777) == "0o640"
    jobs = yaml.safe_load((prom / "cocaq-scrape.yml").read_text())["scrape_configs"]
    assert [j["job_name"] for j in jobs] == ["cocaq-nodes", "cocaq-api"]
    assert jobs[1]["authorization"] == {"type": "Bearer", "credentials_file": str(token)}
    with Prometheus(tmp_path / "run", jobs) as p:  # (it checks the config with promtool first)
        deadline = time.monotonic() + 30
        while len(active := p.api("targets")["activeTargets"]) < 4 and time.monotonic() < deadline:
            time.sleep(0.5)  # service discovery reads the file after start-up
        seen = {
            t["labels"]["instance"]: (t["labels"]["job"], t["labels"].get("cluster"), t["labels"].get("node"))
            for t in active
        }
    assert seen == {
        "gpu001.example.org:9831": ("cocaq-nodes", "main", "gpu001"),
        "[fd00::2]:9830": ("cocaq-nodes", "main", "gpu002"),
        "10.0.0.3:9830": ("cocaq-nodes", "other", "gpu003"),
        "head1:8470": ("cocaq-api", None, None),
    }
    shipped = ANSIBLE / "roles/cocaq_server/files/grafana/cocaq.json"
    assert (dash / "cocaq.json").read_bytes() == shipped.read_bytes()
    provider = yaml.safe_load((prov / "cocaq.yaml").read_text())
    assert provider["providers"][0]["options"]["path"] == str(dash)
