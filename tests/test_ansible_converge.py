"""ansible/site.yml converged on this machine, as the issue asks: the three roles against localhost
(connection local) onto the test Slurm cluster and PostgreSQL, with the services run by init scripts
(`cocaq_service_manager: sysvinit`, there is no systemd here). Then a second run and a --check --diff run
report no change, a changed collector setting restarts the collector and nothing else, and a real Slurm
job goes through the deployed hooks: its spool records reach PostgreSQL through the deployed collector
(the writer role), the deployed scheduler imports it from sacct (the owner role), and alice reads it
through the deployed API (the reader role) with the deployed CLI. The login role's Open OnDemand app
(issue 38) is off in those runs and nothing lands in the (stand-in) OnDemand apps folder; turned on, it
installs the app there, root's and read-only, a run after that changes nothing, and the deployed app
answers alice, as alice, through the deployed API.

Everything it deploys is under names of its own (/opt/cocaq-ansible-test, /etc/cocaq-ansible-test,
/var/lib/cocaq-ansible-test-ood for OnDemand's /var/www/ood, database cocaq_ansible_test, roles cocaqat_*, user cocaqat, services cocaq-at-*), removed before and
after; slurm.conf is put back by tests/slurm/cluster.sh. Needs root. About 3 to 4 minutes, most of it
pip building the virtualenv and Ansible's own start-up per task.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import URL, Engine, create_engine, text
from sqlalchemy.exc import ProgrammingError

from tests.conftest import PG_ADMIN_URL, ROOT
from tests.slurmkit import (
    CLUSTER,
    STATE_DIR,
    cluster_lock,
    cluster_sh,
    hook_env,
    sacct_states,
    sbatch,
    sh,
    slurm_config,
    slurm_installed,
    wait_node_idle,
    wait_until,
)
from tests.sysfs_tree import make_cgroup_v2, make_rapl
from tests.test_ansible import ANSIBLE, BIN, ansible_env
from tests.test_ood_app import REQUEST, set_wrapper

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

PLAYBOOK = [str(BIN / "ansible-playbook"), "-i"]

WORK = STATE_DIR / "ansible"  # the wheel, pip constraints, fake GPUs and sysfs, the shims: root's, fixed
VENV = Path("/opt/cocaq-ansible-test")
ETC = Path("/etc/cocaq-ansible-test")
SPOOL = Path("/var/spool/cocaq-ansible-test")
LOGS = Path("/var/log/cocaq-ansible-test")
HOME = Path("/var/lib/cocaq-ansible-test")
SHIMS = WORK / "shims"
VAULT_PASS = WORK / "vault-password"
ANNOTATE = "/run/cocaq-ansible-test-jobs"
OOD = Path("/var/lib/cocaq-ansible-test-ood")  # stands for /var/www/ood, which the ondemand package makes
OOD_APPS = OOD / "apps" / "sys"
OOD_APP = OOD_APPS / "cocaq"
OOD_ON = ("-e", '{"cocaq_ood_app": true}')
HOSTS = {"cocaq-head", "cocaq-node", "cocaq-login"}
SERVICES = {"collector": "cocaq-at-collector", "scheduler": "cocaq-at-scheduler", "api": "cocaq-at-api"}
DB, USER = "cocaq_ansible_test", "cocaqat"
ROLES = {"owner": "cocaqat_owner", "writer": "cocaqat_writer", "reader": "cocaqat_reader"}
PYTHON = (
    "/usr/bin/python3.11"  # the system's: the services' users and postgres can run it (pyenv's is root's)
)
RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


@dataclass
class Run:
    rc: int
    out: str
    seconds: float

    def recap(self) -> dict[str, dict[str, int]]:
        return {
            m.group(1): {"ok": int(m.group(2)), "changed": int(m.group(3)), "unreachable": int(m.group(4)),
                         "failed": int(m.group(5))}
            for m in RECAP.finditer(self.out)
        }  # fmt: skip

    def assert_ok(self, *, changed: bool) -> None:
        """Exit 0, a recap line for every host, nothing failed, and changes on each (or none on any)."""
        assert self.rc == 0, self.out[-8000:]
        recap = self.recap()
        assert set(recap) == HOSTS, self.out[-3000:]
        for host, r in recap.items():
            assert r["failed"] == r["unreachable"] == 0, (host, r)
            assert (r["changed"] > 0) == changed, (host, r, self.changed_tasks())

    def changed_tasks(self) -> list[str]:
        """`changed: [host]` lines with the task they belong to."""
        task, out = "", []
        for line in self.out.splitlines():
            if line.startswith(("TASK [", "RUNNING HANDLER [")):
                task = line.split("[", 1)[1].rsplit("]", 1)[0]
            elif line.startswith("changed: ["):
                out.append(f"{task}: {line}")
        return out


@dataclass
class Deployment:
    inventory: Path
    passwords: dict[str, str]
    api_port: int
    runs: dict[str, Run] = field(default_factory=dict)
    pids: dict[str, dict[str, int]] = field(default_factory=dict)  # before/after the collector change
    left_by_check: list[str] = field(default_factory=list)  # what --check on a new host left behind
    ood_while_off: list[str] = field(default_factory=list)  # the apps folder after the runs with the app off


def _head() -> str:
    """The newest migration: what a converged database must be at."""
    from alembic.script import ScriptDirectory

    from cocaq.db.migrate import alembic_config

    return str(ScriptDirectory.from_config(alembic_config(create_engine("sqlite://"))).get_current_head())


def playbook(d: Deployment, *args: str) -> Run:
    t0 = time.monotonic()
    r = subprocess.run(
        [*PLAYBOOK, str(d.inventory), "--vault-password-file", str(VAULT_PASS), "site.yml", *args],
        cwd=ANSIBLE, env=ansible_env(), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    return Run(r.returncode, r.stdout + r.stderr, time.monotonic() - t0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pid_of(service: str) -> int:
    try:
        return int(Path(f"/run/{service}.pid").read_text().strip())
    except (OSError, ValueError):
        return 0


def alive(pid: int) -> bool:
    return pid > 0 and Path(f"/proc/{pid}").exists()


def user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def admin() -> Engine:
    return create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")


def db_engine(user: str = "postgres", password: str | None = None) -> Engine:
    url = URL.create("postgresql+psycopg", user, password, "127.0.0.1", 5432, DB)
    return create_engine(url)


def remove_everything() -> None:
    """What a run (or an interrupted one) deployed, gone: services, files, user, database and roles."""
    for svc in SERVICES.values():
        script = Path("/etc/init.d") / svc
        if script.exists():
            subprocess.run([str(script), "stop"], capture_output=True, timeout=120, check=False)
            subprocess.run(["update-rc.d", "-f", svc, "remove"], capture_output=True, timeout=60, check=False)
            script.unlink()
        Path(f"/run/{svc}.pid").unlink(missing_ok=True)
    for p in (VENV, ETC, SPOOL, LOGS, HOME, WORK, Path(ANNOTATE), OOD):
        shutil.rmtree(p, ignore_errors=True)
    if user_exists(USER):
        subprocess.run(["userdel", USER], capture_output=True, timeout=60, check=False)
    subprocess.run(["groupdel", USER], capture_output=True, timeout=60, check=False)
    eng = admin()
    with eng.connect() as c:
        c.execute(text(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)'))
        for role in ROLES.values():
            c.execute(text(f'DROP ROLE IF EXISTS "{role}"'))
    eng.dispose()


def build_inputs() -> tuple[Path, Path]:
    """The wheel pip installs, and constraints that hold its dependencies to requirements.lock."""
    wheels = WORK / "wheels"
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(ROOT)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    (wheel,) = wheels.glob("cocaq-*.whl")
    pins = []
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)(\[[^]]*\])?(==\S+)(\s*;[^\\]*)?", line)
        if m:  # constraints take no extras or hashes
            pins.append(f"{m.group(1)}{m.group(3)}{m.group(4) or ''}".strip())
    constraints = WORK / "constraints.txt"
    constraints.write_text("\n".join(pins) + "\n")
    # The node's sources: two fake A100s for NVML (the cluster's gres gpu:a100:2), a RAPL package and
    # a cgroup v2 tree, as tests/test_slurm_jobs.py has them.
    (WORK / "fake-gpus.toml").write_text(
        '[[gpu]]\nminor = 0\nuuid = "GPU-c0c0a000-0000-4000-8000-00000000a000"\n'
        'pci_bus_id = "00000000:87:00.0"\ntrace = "inference"\n\n'
        '[[gpu]]\nminor = 1\nuuid = "GPU-c0c0a001-0000-4000-8000-00000000a001"\n'
        'pci_bus_id = "00000000:07:00.0"\ntrace = "light"\n'
    )
    make_rapl(WORK / "sys", packages=1)
    make_cgroup_v2(WORK / "sys" / "fs" / "cgroup", node_cpus="0-1")
    return wheel, constraints


def write_inventory(wheel: Path, constraints: Path, passwords: dict[str, str], api_port: int) -> Path:
    """An inventory as the example lays it out: the hosts and their settings in hosts.yml, the passwords
    in an ansible-vault file of group_vars that the settings refer to (vault_cocaq_db_*_password)."""
    common = {
        "ansible_connection": "local",
        "ansible_python_interpreter": "/usr/bin/python3",
        "ansible_become_method": "su",  # root already; su to postgres for the database tasks (no sudo here)
        "cocaq_python": PYTHON,
        "cocaq_venv": str(VENV),
        "cocaq_pip_spec": str(wheel),
        "cocaq_pip_environment": {"PIP_CONSTRAINT": str(constraints), "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
        "cocaq_cli_symlink": "",
        "cocaq_cluster_name": CLUSTER,
        "cocaq_service_manager": "sysvinit",
        "cocaq_systemd_unit_dir": str(ETC / "systemd"),
    }
    head = {
        **common,
        "cocaq_config_path": str(ETC / "server.toml"),
        "cocaq_spool_dir": str(SPOOL / "server"),
        "cocaq_user": USER,
        "cocaq_group": USER,
        "cocaq_home": str(HOME),
        "cocaq_db_host": "127.0.0.1",
        "cocaq_db_name": DB,
        **{f"cocaq_db_{k}_user": v for k, v in ROLES.items()},
        **{f"cocaq_db_{k}_password": f"{{{{ vault_cocaq_db_{k}_password }}}}" for k in ROLES},
        "cocaq_scheduler_service": SERVICES["scheduler"],
        "cocaq_scheduler_reconcile_every": "3s",
        "cocaq_api_service": SERVICES["api"],
        "cocaq_api_port": api_port,
        "cocaq_server_log_dir": str(LOGS / "server"),
        "cocaq_mail_transport": "outbox",
        "cocaq_prometheus_scrape_config_dir": str(WORK / "prometheus"),
    }
    node = {
        **common,
        "cocaq_config_path": str(ETC / "node.toml"),
        # as inventory/example/group_vars/compute.yml shows it: built from the writer's vaulted password
        "cocaq_database_url": (
            f"postgresql+psycopg://{ROLES['writer']}:{{{{ vault_cocaq_db_writer_password | urlencode }}}}"
            f"@127.0.0.1:5432/{DB}"
        ),
        "cocaq_spool_dir": str(SPOOL / "node"),
        "cocaq_log_dir": str(LOGS / "node"),
        "cocaq_annotate_dir": ANNOTATE,
        "cocaq_collector_nvml": f"fake:{WORK / 'fake-gpus.toml'}",
        "cocaq_collector_sysfs_root": str(WORK / "sys"),
        "cocaq_collector_interval_s": 1,
        "cocaq_collector_ship_interval_s": 2,
        "cocaq_shim_dir": str(SHIMS),
        "cocaq_slurm_hooks": "slurm_conf",
        "cocaq_slurm_conf": "/etc/slurm/slurm.conf",
        "cocaq_collector_service": SERVICES["collector"],
        "cocaq_logrotate_conf": "",
    }
    login = {  # a login node that is the Open OnDemand host too; the app is off until a run turns it on
        **common,
        "cocaq_config_path": str(ETC / "login.toml"),
        "cocaq_api_url": f"http://127.0.0.1:{api_port}",
        "cocaq_ood_apps_dir": str(OOD_APPS),
    }
    inv = WORK / "inventory"
    (inv / "group_vars" / "all").mkdir(parents=True)
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {
        "head": {"hosts": {"cocaq-head": head}},
        "compute": {"hosts": {"cocaq-node": node}},
        "login": {"hosts": {"cocaq-login": login}},
    }}}, sort_keys=False))  # fmt: skip
    vault = inv / "group_vars" / "all" / "vault.yml"
    vault.write_text(yaml.safe_dump({f"vault_cocaq_db_{k}_password": v for k, v in passwords.items()}))
    VAULT_PASS.write_text(secrets.token_hex(16) + "\n")
    VAULT_PASS.chmod(0o600)
    r = subprocess.run(
        [str(BIN / "ansible-vault"), "encrypt", "--vault-password-file", str(VAULT_PASS), str(vault)],
        env=ansible_env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert r.returncode == 0 and vault.read_text().startswith("$ANSIBLE_VAULT;"), r.stdout + r.stderr
    return inv


@pytest.fixture(scope="module")
def deployed() -> Iterator[Deployment]:
    if os.geteuid() != 0:
        pytest.skip("needs root: deploys onto this machine (services, users, slurm.conf, PostgreSQL roles)")
    with cluster_lock():
        remove_everything()
        up = cluster_sh("up", hook_env())  # slurm.conf as cluster.sh writes it: no Prolog= or Epilog=
        if up.returncode != 0:
            if not slurm_installed():
                pytest.skip(f"Slurm packages could not be installed: {(up.stdout + up.stderr)[-800:]}")
            pytest.fail(f"tests/slurm/cluster.sh up failed:\n{up.stdout}{up.stderr}")
        assert slurm_config("Prolog") == "(null)"
        restore: subprocess.CompletedProcess[str] | None = None
        try:
            WORK.mkdir(parents=True, mode=0o700)
            wheel, constraints = build_inputs()
            # with what URLs, TOML and .pgpass must escape: the roles must carry them through intact
            passwords = {k: secrets.token_urlsafe(12) + ' :@/%"\\' for k in ROLES}
            port = free_port()
            d = Deployment(write_inventory(wheel, constraints, passwords, port), passwords, port)
            OOD_APPS.mkdir(parents=True)  # as Open OnDemand's package leaves it: empty
            conf_before = Path("/etc/slurm/slurm.conf").read_text()
            d.runs["check_new"] = playbook(d, "--check", "--diff")  # on a host with nothing deployed yet
            d.left_by_check = [str(p) for p in (VENV, ETC, SPOOL, LOGS, HOME, SHIMS, OOD_APP) if p.exists()]
            d.left_by_check += (
                ["slurm.conf"] if Path("/etc/slurm/slurm.conf").read_text() != conf_before else []
            )
            d.left_by_check += [f"user {USER}"] if user_exists(USER) else []
            d.runs["first"] = playbook(d)
            assert d.runs["first"].rc == 0, d.runs["first"].out[-8000:]
            d.runs["second"] = playbook(d)
            d.runs["check"] = playbook(d, "--check", "--diff")
            d.ood_while_off = sorted(p.name for p in OOD_APPS.iterdir())
            d.runs["ood_on"] = playbook(d, *OOD_ON)
            d.runs["ood_again"] = playbook(d, *OOD_ON)
            d.pids["before"] = {k: pid_of(s) for k, s in SERVICES.items()}
            d.runs["collector_change"] = playbook(d, "-e", "cocaq_collector_interval_s=2")
            d.pids["after"] = {k: pid_of(s) for k, s in SERVICES.items()}
            yield d
        finally:
            remove_everything()
            restore = cluster_sh("up", hook_env())
        assert restore.returncode == 0, f"restoring the cluster failed:\n{restore.stdout}{restore.stderr}"


def test_check_diff_on_a_new_host_reports_and_changes_nothing(deployed: Deployment) -> None:
    run = deployed.runs["check_new"]
    run.assert_ok(changed=True)
    assert "+Prolog=" in run.out  # --diff shows the slurm.conf lines it would add
    assert deployed.left_by_check == []


def test_no_password_in_any_output(deployed: Deployment) -> None:
    """The passwords come from the vault; no run prints one, not even --diff of the configs."""
    from urllib.parse import quote

    for name, run in deployed.runs.items():
        for pw in deployed.passwords.values():
            for form in (pw, quote(pw), quote(pw, safe=""), pw.replace("\\", "\\\\").replace(":", "\\:")):
                assert form not in run.out, f"the {name} run printed a password"


def test_first_run_deploys_the_roles(deployed: Deployment) -> None:
    deployed.runs["first"].assert_ok(changed=True)
    cocaq = VENV / "bin" / "cocaq"
    r = subprocess.run([str(cocaq), "--version"], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0 and "cocaq" in r.stdout.lower(), r.stdout + r.stderr
    # the virtualenv is the system Python's, which the services' users can run
    assert (VENV / "pyvenv.cfg").read_text().count("/usr/bin") >= 1
    # configs: the node's holds the writer's password (root only), the server's is the cocaq group's
    node_cfg, server_cfg = os.stat(ETC / "node.toml"), os.stat(ETC / "server.toml")
    assert stat.S_IMODE(node_cfg.st_mode) == 0o640 and node_cfg.st_uid == node_cfg.st_gid == 0
    assert stat.S_IMODE(server_cfg.st_mode) == 0o640 and server_cfg.st_gid == pwd.getpwnam(USER).pw_gid
    assert stat.S_IMODE(os.stat(HOME / ".pgpass").st_mode) == 0o600
    # the login node's names the API and nothing secret: every user reads it
    login_cfg = os.stat(ETC / "login.toml")
    assert stat.S_IMODE(login_cfg.st_mode) == 0o644 and login_cfg.st_uid == login_cfg.st_gid == 0
    assert "database_url" not in (ETC / "login.toml").read_text()
    assert f'url = "http://127.0.0.1:{deployed.api_port}"' in (ETC / "login.toml").read_text()
    # the shims are byte for byte what the venv's `python -m cocaq hook shims` writes for this config
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run(
            [str(VENV / "bin" / "python"), "-m", "cocaq", "hook", "shims", "--dir", tmp, "--hook-config",
             str(ETC / "node.toml")],
            capture_output=True, text=True, timeout=60, check=False, cwd="/",  # not this checkout's cocaq,
            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},  # nor the one PYTHONPATH names
        )  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr
        for kind in ("prolog", "epilog"):
            ours = (SHIMS / f"cocaq-{kind}").read_bytes()
            assert ours == (Path(tmp) / f"cocaq-{kind}").read_bytes(), ours.decode()
            assert f"--config {ETC / 'node.toml'} {kind}".encode() in ours
    # wired into slurm.conf, before the node lines, and slurmctld re-read it (the reconfigure handler)
    conf = Path("/etc/slurm/slurm.conf").read_text()
    assert conf.index(f"Prolog={SHIMS}/cocaq-prolog") < conf.index("NodeName=")
    assert slurm_config("Prolog") == f"{SHIMS}/cocaq-prolog"
    assert slurm_config("Epilog") == f"{SHIMS}/cocaq-epilog"
    # the database: migrated, owned by the owner role
    with db_engine().connect() as c:
        assert c.execute(text("SELECT version_num FROM alembic_version")).scalar() == _head()
        owner = c.execute(
            text("SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = :d"), {"d": DB}
        )
        assert owner.scalar() == ROLES["owner"]
    # the three services run under their init scripts, the server's as the cocaq user
    for key, svc in SERVICES.items():
        r = subprocess.run([f"/etc/init.d/{svc}", "status"], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, f"{svc}: {r.stdout}{r.stderr}"
        uid = os.stat(f"/proc/{pid_of(svc)}").st_uid
        assert uid == (0 if key == "collector" else pwd.getpwnam(USER).pw_uid), (svc, uid)


def test_the_systemd_units_pass_systemd_analyze_verify(deployed: Deployment) -> None:
    """systemd does not run here, but it loads the units the roles wrote as it would on a real host: an
    unknown key, a bad value or a missing executable is reported."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    units = sorted((ETC / "systemd").glob("*.service"))
    assert [u.name for u in units] == sorted(f"{s}.service" for s in SERVICES.values())
    r = subprocess.run(
        ["systemd-analyze", "verify", *map(str, units)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), r.stdout + r.stderr


def test_second_run_changes_nothing(deployed: Deployment) -> None:
    deployed.runs["second"].assert_ok(changed=False)


def test_check_diff_on_a_converged_host_changes_nothing(deployed: Deployment) -> None:
    deployed.runs["check"].assert_ok(changed=False)


def test_a_changed_collector_setting_restarts_the_collector_only(deployed: Deployment) -> None:
    run = deployed.runs["collector_change"]
    assert run.rc == 0, run.out[-6000:]
    changed = run.changed_tasks()
    assert any("Write cocaq.toml" in t for t in changed), changed
    assert any("Restart the cocaq collector (sysvinit)" in t for t in changed), changed
    assert not any("scheduler" in t or "api" in t.lower() for t in changed), changed
    before, after = deployed.pids["before"], deployed.pids["after"]
    assert before["collector"] != after["collector"] and alive(after["collector"]), (before, after)
    assert before["scheduler"] == after["scheduler"] and alive(after["scheduler"]), (before, after)
    assert before["api"] == after["api"] and alive(after["api"]), (before, after)
    assert "interval_s = 2" in (ETC / "node.toml").read_text()


def test_the_open_ondemand_app_is_left_alone_while_off(deployed: Deployment) -> None:
    """cocaq_ood_app is false by default: the runs before it was turned on wrote nothing under the
    apps folder."""
    assert deployed.ood_while_off == []
    assert not any("Open OnDemand" in t for t in deployed.runs["first"].changed_tasks())


def test_turned_on_the_app_is_installed_root_owned_and_a_second_run_changes_nothing(
    deployed: Deployment,
) -> None:
    run = deployed.runs["ood_on"]
    assert run.rc == 0, run.out[-8000:]
    recap = run.recap()
    assert set(recap) == HOSTS and recap["cocaq-login"]["changed"] > 0, (recap, run.out[-3000:])
    assert recap["cocaq-head"]["changed"] == recap["cocaq-node"]["changed"] == 0, run.changed_tasks()
    deployed.runs["ood_again"].assert_ok(changed=False)
    # the installed package's folder (which also holds pip's byte code) less the byte code
    files = {p.relative_to(OOD_APP).as_posix() for p in OOD_APP.rglob("*") if p.is_file()}
    assert files == {"manifest.yml", "passenger_wsgi.py", "bin/python", "tmp/restart.txt"}, files
    for path in [OOD_APP, *OOD_APP.rglob("*")]:
        st = path.stat()
        want = 0o755 if path.is_dir() or path.name == "python" else 0o644
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, want), path
    for rel in ("manifest.yml", "passenger_wsgi.py"):
        assert (OOD_APP / rel).read_bytes() == (ROOT / "ood" / rel).read_bytes(), rel
    wrapper = (ROOT / "ood" / "bin" / "python").read_text()
    assert (OOD_APP / "bin" / "python").read_text() == set_wrapper(wrapper, VENV, ETC / "login.toml")


def test_the_deployed_app_answers_each_user_as_themselves_through_the_api(deployed: Deployment) -> None:
    """As Passenger runs it in each user's own nginx: the app folder's bin/python, its startup file, as
    the user; their footprint page comes from the deployed API, asked with their own MUNGE credential."""
    for user in ("alice", "bob"):
        r = subprocess.run(
            ["runuser", "-u", user, "--", "env", "-i", "PATH=/usr/bin:/bin", "HOME=/tmp",
             str(OOD_APP / "bin" / "python"), "-c", REQUEST, "/"],
            capture_output=True, text=True, timeout=120, check=False, cwd=OOD_APP,
        )  # fmt: skip
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        status, _, page = r.stdout.partition("\n")
        assert status == "200 OK", r.stdout[:3000]
        assert f"Signed in as <strong>{user}</strong>" in page and 'href="/pun/sys/cocaq/jobs"' in page


def test_prometheus_lists_the_compute_nodes(deployed: Deployment) -> None:
    """The server role's file_sd names every host of the compute group, at the default metrics port."""
    targets = json.loads((WORK / "prometheus" / "cocaq-nodes.json").read_text())
    assert targets == [{"targets": ["cocaq-node:9830"], "labels": {"cluster": CLUSTER, "node": "cocaq-node"}}]
    jobs = yaml.safe_load((WORK / "prometheus" / "cocaq-scrape.yml").read_text())["scrape_configs"]
    assert [j["job_name"] for j in jobs] == ["cocaq-nodes"]  # the API's /metrics is off by default


def test_least_privilege_roles(deployed: Deployment) -> None:
    pw = deployed.passwords
    writer, reader = db_engine(ROLES["writer"], pw["writer"]), db_engine(ROLES["reader"], pw["reader"])
    try:
        with reader.connect() as c:
            assert c.execute(text("SELECT count(*) FROM jobs")).scalar() is not None
            with pytest.raises(ProgrammingError, match="permission denied"):
                c.execute(text("DELETE FROM node_events"))
        with writer.connect() as c, pytest.raises(ProgrammingError, match="permission denied"):
            c.execute(text("SELECT count(*) FROM jobs"))
    finally:
        writer.dispose()
        reader.dispose()


def test_a_slurm_job_through_the_deployed_hooks_reaches_postgresql(deployed: Deployment) -> None:
    outdir = Path(tempfile.mkdtemp(prefix="cocaq-ansible-job-", dir="/tmp"))
    os.chmod(outdir, 0o1777)
    try:
        t0 = time.time() - 1
        job = sbatch("alice", outdir, "--gres=gpu:1", "--account=lab_vision", "-J", "cocaq-ansible",
                     "--comment", "cocaq: model=resnet50", "--wrap", "echo GPUS=$SLURM_JOB_GPUS; sleep 4")  # fmt: skip
        wait_until(
            f"job {job} COMPLETED in sacct", 120, lambda: sacct_states(t0, [job]).get(job) == "COMPLETED"
        )
        hook_log = LOGS / "node" / "hook.log"
        log = wait_until("the epilog's line", 30, lambda: hook_log.exists() and f"epilog job={job} " in
                         hook_log.read_text() and hook_log.read_text())  # fmt: skip
        assert f"prolog job={job} ok" in log and f"epilog job={job} ok" in log, log

        eng = db_engine()
        try:

            def shipped() -> list[Any]:
                with eng.connect() as c:
                    rows = c.execute(
                        text("SELECT event, payload FROM node_events WHERE job_id = :j"), {"j": job}
                    )
                    return [dict(r._mapping) for r in rows]

            events = wait_until("the collector to ship the job's records", 60,
                                lambda: {"start", "end"} <= {e["event"] for e in shipped()} and shipped())  # fmt: skip
            assert {e["event"] for e in events} >= {"start", "end"}, events

            def energy() -> list[Any]:
                with eng.connect() as c:
                    rows = c.execute(text("SELECT * FROM node_energy WHERE job_id = :j"), {"j": job})
                    return [dict(r._mapping) for r in rows]

            rows = wait_until(
                "the job's GPU energy", 60, lambda: [r for r in energy() if r["component"] == "gpu"]
            )
            assert sum(r["energy_j"] for r in rows) > 0, rows

            def imported() -> (
                Any
            ):  # the scheduler reconciles with sacct every 3 s (it may first see it RUNNING)
                with eng.connect() as c:
                    row = c.execute(
                        text("SELECT j.user_name, j.account, j.state FROM jobs j JOIN clusters c ON c.id = j.cluster_id"
                             " WHERE c.name = :c AND j.job_id = :j"), {"c": CLUSTER, "j": job}).first()  # fmt: skip
                return row if row is not None and row.state == "COMPLETED" else None

            row = wait_until("the scheduler to import the job's final state from sacct", 90, imported)
            assert tuple(row) == ("alice", "lab_vision", "COMPLETED"), row
        finally:
            eng.dispose()

        # alice, through the deployed API and CLI (MUNGE), sees her job with the energy the hooks measured
        def as_user(user: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                ["runuser", "-u", user, "--", "env", "-i", "PATH=/usr/bin:/bin", "HOME=/tmp",
                 f"COCAQ_API_URL=http://127.0.0.1:{deployed.api_port}", str(VENV / "bin" / "cocaq"),
                 "job", job, "-o", "json"],
                capture_output=True, text=True, timeout=60, check=False, cwd="/tmp",
            )  # fmt: skip

        def measured_via_api() -> Any:
            r = as_user("alice")
            assert r.returncode == 0, r.stdout + r.stderr
            doc = json.loads(r.stdout)
            # The test cluster hands out a job id again after a restart (slurmctld resumes from its last
            # saved state), and the deployed scheduler imports two days of sacct: `cocaq job 8` then
            # answers every job 8 it knows, as a list. This run's is the one submitted since t0.
            if isinstance(doc, list):
                mine = [d for d in doc if datetime.fromisoformat(d["submit_time"]).timestamp() >= t0 - 1]
                assert len(mine) == 1, f"cocaq job {job}: {len(doc)} jobs: {r.stdout[:3000]}"
                doc = mine[0]
            gpu = [e for e in doc["energies"] if e["component"] == "gpu" and e["method"] == "measured"]
            return (doc, gpu) if gpu and doc["state"] == "COMPLETED" else None

        doc, gpu = wait_until(
            "alice to see her job's measured GPU energy through the API", 60, measured_via_api, 2
        )
        assert (doc["user_name"], doc["account"], doc["state"]) == ("alice", "lab_vision", "COMPLETED"), doc
        assert sum(e["energy_j"] for e in gpu) > 0 and doc["model"]["model"] == "resnet50", doc
        refused = as_user("bob")  # not bob's job, nor his lab's: the API refuses him
        assert refused.returncode == 5 and not refused.stdout, refused.stdout + refused.stderr
        wait_node_idle(60)
    finally:
        shutil.rmtree(outdir, ignore_errors=True)
    assert sh("scontrol", "show", "config")  # the cluster still answers
