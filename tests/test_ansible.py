"""ansible/: ansible-lint at the production profile and the playbook's syntax, as the issue asks."""

from __future__ import annotations

import os
import stat
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
    for role in ("cocaq_node", "cocaq_server", "cocaq_login"):
        defaults = yaml.safe_load((ANSIBLE / "roles" / role / "defaults" / "main.yml").read_text()) or {}
        missing = sorted(set(defaults) - documented)
        assert not missing, f"{role}: defaults not in inventory/example/group_vars: {missing}"


def test_files_both_roles_carry_are_the_same() -> None:
    # each role stands alone (it can be copied into a site's roles/ by itself), so a few files are in several
    for rel, roles in (
        ("templates/sysvinit.j2", ("cocaq_node", "cocaq_server")),
        ("tasks/pip_spec.yml", ("cocaq_node", "cocaq_server", "cocaq_login")),
    ):
        first, *others = (ANSIBLE / "roles" / r / rel for r in roles)
        for other in others:
            assert first.read_bytes() == other.read_bytes(), f"roles/*/{rel} differ between {roles}"


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


def test_the_collectors_metrics_token_and_tls_reach_the_node_and_prometheus(tmp_path: Path) -> None:
    """Issue 33: with cocaq_collector_metrics_token the node role writes the token root's and 0600 and
    names it in [collector] metrics_token_file (with the TLS files), which the collector's own checks
    accept; the server role writes Prometheus' copy (root:prometheus 0640) and gives the cocaq-nodes job
    `authorization: {type: Bearer, credentials_file}`, `scheme: https` and `tls_config.ca_file`, which
    promtool accepts. Without a token neither is written (the default stays off)."""
    import yaml

    from cocaq.collector import metrics_auth
    from cocaq.config_load import load_config
    from tests.promkit import Prometheus
    from tests.test_collector_metrics_auth import _self_signed

    if os.geteuid() != 0:
        pytest.skip("needs root: the roles write root-owned files")
    cert, key = _self_signed(tmp_path / "tls")
    inv = tmp_path / "hosts.yml"
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inv.write_text(yaml.safe_dump({"all": {"children": {
        "head": {"hosts": {"head1": local}},
        "compute": {"hosts": {"gpu001": local}},
    }}}))  # fmt: skip

    def play(node_vars: dict[str, object], server_vars: dict[str, object]) -> None:
        etc = tmp_path / "etc"
        p = tmp_path / "play.yml"
        p.write_text(yaml.safe_dump([
            {"hosts": "compute", "gather_facts": False,
             "vars": {"cocaq_config_path": str(etc / "cocaq.toml"), "cocaq_spool_dir": str(tmp_path / "spool"),
                      "cocaq_log_dir": str(tmp_path / "log"), "cocaq_logrotate_conf": "",
                      "cocaq_service_manager": "none", "cocaq_database_url": "sqlite:///nonexistent",
                      "cocaq_collector_metrics_listen": "127.0.0.1:9830", **node_vars},
             "tasks": [{"name": "Node", "ansible.builtin.include_role": {"name": "cocaq_node", "tasks_from": "config"}}]},
            {"hosts": "head", "gather_facts": False,
             "vars": {"cocaq_prometheus_scrape_config_dir": str(tmp_path / "prometheus"),
                      "cocaq_prometheus_group": "root", **server_vars},
             "tasks": [{"name": "Prometheus", "ansible.builtin.include_role": {"name": "cocaq_server", "tasks_from": "prometheus"}}]},
        ]))  # fmt: skip
        r = subprocess.run(
            [str(BIN / "ansible-playbook"), "-i", str(inv), str(p)],
            cwd=ANSIBLE, env=ansible_env(), capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
        assert "n0de-T0ken" not in r.stdout + r.stderr  # no_log

    play({}, {})  # no token: none written, nothing asked of Prometheus
    cfg = load_config(tmp_path / "etc" / "cocaq.toml", {})
    assert cfg.collector.metrics_token_file is None and cfg.collector.metrics_tls_cert_file is None
    assert not (tmp_path / "etc" / "collector-metrics-token").exists()
    nodes_job = yaml.safe_load((tmp_path / "prometheus" / "cocaq-scrape.yml").read_text())["scrape_configs"][
        0
    ]
    assert "authorization" not in nodes_job and nodes_job.get("scheme", "http") == "http"

    play(
        {"cocaq_collector_metrics_token": "n0de-T0ken", "cocaq_collector_metrics_tls_cert_file": str(cert),
         "cocaq_collector_metrics_tls_key_file": str(key)},
        {"cocaq_prometheus_node_metrics_token": "n0de-T0ken", "cocaq_prometheus_node_scheme": "https",
         "cocaq_prometheus_node_ca_file": str(cert)},
    )  # fmt: skip
    cfg = load_config(tmp_path / "etc" / "cocaq.toml", {})
    token = tmp_path / "etc" / "collector-metrics-token"
    assert cfg.collector.metrics_token_file == str(token)
    st = token.stat()
    assert (st.st_uid, oct(st.st_mode & 0o777)) == (0, "0o600")
    cc = cfg.collector
    auth = metrics_auth.load(cc.metrics_token_file, cc.metrics_tls_cert_file, cc.metrics_tls_key_file)
    assert auth.token == b"n0de-T0ken" and auth.tls is not None  # the collector's own checks pass
    prom_token = tmp_path / "prometheus" / "cocaq-nodes-token"
    assert prom_token.read_text() == "n0de-T0ken\n" and oct(prom_token.stat().st_mode & 0o777) == "0o640"
    jobs = yaml.safe_load((tmp_path / "prometheus" / "cocaq-scrape.yml").read_text())["scrape_configs"]
    nodes_job = jobs[0]
    assert nodes_job["job_name"] == "cocaq-nodes" and nodes_job["scheme"] == "https"
    assert nodes_job["authorization"] == {"type": "Bearer", "credentials_file": str(prom_token)}
    assert nodes_job["tls_config"] == {"ca_file": str(cert)}
    with Prometheus(tmp_path / "run", jobs):  # (promtool checks the config first)
        pass


def test_the_login_role_installs_the_open_ondemand_app(tmp_path: Path) -> None:
    """cocaq_login's ood.yml, run for real on this machine against a virtualenv whose cocaq is this
    checkout: the installed package's ood/ folder lands in OnDemand's system apps, root's and read-only
    to users, its bin/python set to the virtualenv and config (one line each, as the admin guide sets
    them); a second run changes nothing; another virtualenv rewrites the wrapper alone and restarts the
    app (Passenger's tmp/restart.txt); without OnDemand's apps folder the role stops and says why."""
    import yaml

    from tests.test_ood_app import set_wrapper

    if os.geteuid() != 0:
        pytest.skip("needs root: the role writes root-owned files")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    (site,) = venv.glob("lib/python3*/site-packages")
    (site / "cocaq-checkout.pth").write_text(f"{ROOT}\n")  # `import cocaq` is this checkout's
    apps = tmp_path / "www" / "ood" / "apps" / "sys"
    app = apps / "footprint"
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"children": {"login": {"hosts": {"ood1": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}}}))  # fmt: skip
    config = "/etc/cocaq-ood-test/cocaq.toml"

    def run(**extra: object) -> subprocess.CompletedProcess[str]:
        play = tmp_path / "play.yml"
        play.write_text(yaml.safe_dump([{
            "hosts": "login", "gather_facts": False,
            "vars": {"cocaq_venv": str(venv), "cocaq_config_path": config, "cocaq_ood_app": True,
                     "cocaq_ood_apps_dir": str(apps), "cocaq_ood_app_name": "footprint", **extra},
            "tasks": [{"name": "OOD", "ansible.builtin.include_role": {"name": "cocaq_login", "tasks_from": "ood"}}],
        }]))  # fmt: skip
        return subprocess.run(
            [str(BIN / "ansible-playbook"), "-i", str(inv), str(play)],
            cwd=ANSIBLE, env=ansible_env(), capture_output=True, text=True, timeout=300,
        )  # fmt: skip

    r = run()
    assert r.returncode != 0 and f"{apps} is not a directory: install Open OnDemand" in r.stdout, r.stdout[
        -3000:
    ]
    assert not app.exists()

    apps.mkdir(parents=True)
    r = run()
    assert r.returncode == 0 and "changed=0" not in r.stdout, r.stdout[-4000:]
    shipped = {p.relative_to(ROOT / "ood").as_posix() for p in (ROOT / "ood").rglob("*") if p.is_file()}
    assert {p.relative_to(app).as_posix() for p in app.rglob("*") if p.is_file()} == shipped | {
        "tmp/restart.txt"
    }
    for rel in shipped - {"bin/python"}:
        assert (app / rel).read_bytes() == (ROOT / "ood" / rel).read_bytes(), rel
    wrapper = (ROOT / "ood" / "bin" / "python").read_text()
    assert (app / "bin" / "python").read_text() == set_wrapper(wrapper, venv, Path(config))
    for path in [app, *app.rglob("*")]:
        st = path.stat()
        want = 0o755 if path.is_dir() or path.name == "python" else 0o644
        assert (st.st_uid, st.st_gid, oct(stat.S_IMODE(st.st_mode))) == (0, 0, oct(want)), path

    r = run()
    assert r.returncode == 0 and "changed=0" in r.stdout, r.stdout[-4000:]

    before = (app / "tmp" / "restart.txt").stat().st_mtime_ns
    time.sleep(0.05)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.symlink_to(venv)
    r = run(cocaq_venv=str(elsewhere))
    assert r.returncode == 0 and "changed=2" in r.stdout, r.stdout[-4000:]  # the wrapper, and the restart
    assert f"VENV={elsewhere}\n" in (app / "bin" / "python").read_text()
    assert (app / "tmp" / "restart.txt").stat().st_mtime_ns > before
