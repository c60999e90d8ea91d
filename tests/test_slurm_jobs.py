"""Real Slurm jobs through cocaq's node side: Prolog/Epilog shims, collector, shipper, reconcile.

`tests/slurm/cluster.sh` runs a one-node Slurm 22.05 cluster (node `hostname -s`, two fake GPUs as
gres gpu:a100:2 whose Slurm indices are the device minor numbers 0 and 1). This module installs the
shims that `cocaq hook shims` writes as the cluster's Prolog= and Epilog=, with a config whose fake
NVML enumerates the two GPUs in the reverse of their minor order (so a GPU picked by NVML position
instead of minor number would carry the other one's UUID) and gives one of them no energy counter. It
submits real jobs as alice and bob (completed, failed, srun, cancelled, timed out, CPU-only) while
`cocaq collector` samples, ships with `cocaq collector --once`, imports sacct with `cocaq reconcile`,
and checks what landed in PostgreSQL. Needs root. About 90 s, most of it waiting for Slurm to time a
job out (a limit is at least one minute, and slurmctld checks limits every 30 s).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from cocaq.collector import fakenvml
from cocaq.db.engine import make_engine
from tests.conftest import ROOT, Result, new_database, run_cocaq
from tests.slurmkit import (
    ANNOTATE_DIR,
    CLUSTER,
    COUNTER,
    NO_COUNTER,
    NO_SOURCE,
    NODE,
    NVML_INDEX,
    PCI,
    STATE_DIR,
    UUID,
    VERSIONS,
    activate,
    cluster_lock,
    cluster_sh,
    hook_env,
    node_state,
    queue,
    sacct,
    sacct_states,
    sbatch,
    sh,
    slurm_config,
    slurm_installed,
    up_or_skip,
    wait_node_idle,
    wait_until,
    write_inputs,
)
from tests.userkit import user_python

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

SHIM_DIR = STATE_DIR / "shims"

IDLE_W, MAX_W = 50.0, 400.0  # an A100's idle floor and TDP: any measured average must lie between
COMMENT = "cocaq: model=resnet50 precision=bf16"


# alice's job declares more from inside, with both user-side interfaces, as a training script would.
PY_AS_USER = user_python()
TAGS = (
    f"COCAQ_ANNOTATE_DIR={ANNOTATE_DIR} {PY_AS_USER} -m cocaq tag epochs=2 tokens=5000 && "
    f"COCAQ_ANNOTATE_DIR={ANNOTATE_DIR} {PY_AS_USER} -c 'import cocaq; cocaq.annotate(batch_size=64)'"
)

GPUS_LINE = re.compile(r"^GPUS=(\S*)$", re.M)
HOOK_LINE = re.compile(r"^\S+ (prolog|epilog|\?) job=(\S+) (ok|FAILED)(.*)$")


def ts(d: datetime | float) -> float:
    if isinstance(d, datetime):
        return (d if d.tzinfo else d.replace(tzinfo=UTC)).timestamp()
    return float(d)


def cli_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COCAQ_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class SlurmRun:
    tmp: Path
    config: Path
    config_text: str
    spec: Path
    spool: Path
    hook_log: Path
    outdir: Path
    engine: Engine
    env: dict[str, str]
    version: str = "22.05"  # of the Slurm cluster the jobs ran on
    t_submit: float = 0.0  # just before the first job was submitted
    jobs: dict[str, str] = field(default_factory=dict)  # role -> Slurm job id
    gpus: dict[str, list[int]] = field(default_factory=dict)  # role -> GPU indices the job printed
    hook_log_text: str = ""
    daemon_rc: int | None = None
    daemon_err: str = ""
    once: Result | None = None
    reconcile: Result | None = None
    timings: dict[str, float] = field(default_factory=dict)


@pytest.fixture(scope="module", params=VERSIONS)
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmRun]:
    """Bring the cluster up with cocaq's hooks, run the jobs, ship and reconcile; restore at the end.
    Once per Slurm version (22.05 from Debian, 25.11 built from source): every test runs on both."""
    version: str = request.param
    if os.geteuid() != 0:
        pytest.skip("needs root: runs a real Slurm cluster (tests/slurm/cluster.sh) with cocaq's hooks")
    t_all = time.monotonic()
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    # one module at a time per machine: two runs would reconfigure the same slurm.conf under each other
    lock = ExitStack()  # held for the whole module
    lock.enter_context(cluster_lock())
    tmp = tmp_path_factory.mktemp("slurm")
    outdir = Path(tempfile.mkdtemp(prefix="cocaq-slurm-jobs-", dir="/tmp"))  # alice and bob write here
    os.chmod(outdir, 0o1777)
    daemon: subprocess.Popen[str] | None = None
    bob: subprocess.Popen[str] | None = None
    data: SlurmRun | None = None
    hooks_on = False
    try:
        db_url = new_database("postgresql", tmp, request)
        config, spec, config_text = write_inputs(tmp, db_url)
        env = cli_env()
        r = run_cocaq(["--config", str(config), "db", "upgrade"], env)
        assert r.code == 0, r.err
        data = SlurmRun(
            tmp=tmp, config=config, config_text=config_text, spec=spec, spool=tmp / "spool",
            hook_log=tmp / "log" / "hook.log", outdir=outdir, engine=make_engine(db_url), env=env,
            version=version,
        )  # fmt: skip

        r = run_cocaq(["hook", "shims", "--dir", str(SHIM_DIR), "--hook-config", str(config)], env)
        assert r.code == 0, r.err
        prolog, epilog = str(SHIM_DIR / "cocaq-prolog"), str(SHIM_DIR / "cocaq-epilog")
        assert r.out.split() == [prolog, epilog, str(SHIM_DIR / "cocaq-prologslurmctld"),
                                 str(SHIM_DIR / "cocaq-epilogslurmctld")]  # fmt: skip

        t0 = time.monotonic()
        hooks_on = True
        up = cluster_sh("up", hook_env(prolog, epilog), version)
        if up.returncode != 0:
            if up.returncode == NO_SOURCE or not slurm_installed(version):
                hooks_on = False  # nothing to restore: cluster.sh stopped before slurm.conf
            up_or_skip(up, version)
        lock.enter_context(activate(version))  # this version's sinfo, sbatch, sacct ... for the rest
        env = data.env = cli_env()
        data.timings["cluster_up_s"] = time.monotonic() - t0
        # slurmctld took the new Prolog=/Epilog= (cluster.sh reconfigures a running cluster)
        assert slurm_config("Prolog") == prolog and slurm_config("Epilog") == epilog
        assert node_state() == "idle", f"node {NODE} is {node_state()!r} before the jobs"

        daemon = subprocess.Popen(
            [sys.executable, "-m", "cocaq", "--config", str(config), "collector", "--interval", "1"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        )  # fmt: skip
        t0 = time.monotonic()
        data.t_submit = time.time() - 1
        # The node has 2 CPUs and 2 GPUs. The timeout job holds a CPU and GPU 0 for 60-90 s, so the
        # single-GPU jobs get GPU 1 (the one without an energy counter), one after the other; bob's srun
        # for both GPUs runs once the timeout job has ended. Slurm gives a job the lowest free index.
        jobs = data.jobs
        jobs["timeout"] = sbatch("bob", outdir, "--gres=gpu:1", "--account=lab_nlp", "--time=1", "-J", "cocaq-timeout",
                                 "--wrap", "echo GPUS=$SLURM_JOB_GPUS; sleep 300")  # fmt: skip
        jobs["alice"] = sbatch("alice", outdir, "--gres=gpu:1", "--account=lab_vision", "--comment", COMMENT,
                               "--wrap", f"echo GPUS=$SLURM_JOB_GPUS; {TAGS} && echo TAGGED; sleep 5")  # fmt: skip
        # fails at once: too short for the collector (1 s cycles) to be sure to see it
        jobs["failed"] = sbatch("alice", outdir, "--gres=gpu:1", "-J", "cocaq-fail",
                                "--wrap", "echo GPUS=$SLURM_JOB_GPUS; exit 3")  # fmt: skip
        jobs["cancelled"] = sbatch("alice", outdir, "--gres=gpu:1", "-J", "cocaq-cancel",
                                   "--wrap", "echo GPUS=$SLURM_JOB_GPUS; sleep 300")  # fmt: skip
        # srun without an allocation: the job's one step prints the GPUs (steps get no SLURM_JOB_GPUS)
        bob = subprocess.Popen(
            ["runuser", "-u", "bob", "--", "srun", "--gres=gpu:2", "--account=lab_nlp", "-J", "cocaq-srun",
             f"--chdir={outdir}", "sh", "-c", "echo JOB=$SLURM_JOB_ID; echo GPUS=$CUDA_VISIBLE_DEVICES; sleep 5"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        jobs["cpu"] = sbatch(
            "bob", outdir, "-p", "cpu", "-J", "cocaq-cpu", "--wrap", "echo GPUS=$SLURM_JOB_GPUS; sleep 1"
        )

        cancel_id, cancelled = jobs["cancelled"], False
        deadline = time.monotonic() + 200
        while True:
            q = queue()
            if not cancelled and q.get(cancel_id) == "RUNNING":
                log = data.hook_log.read_text() if data.hook_log.exists() else ""
                out = outdir / f"{cancel_id}.out"
                # cancel once its prolog has run and its script has started
                if f"prolog job={cancel_id} " in log and out.exists() and "GPUS=" in out.read_text():
                    time.sleep(2)
                    sh("runuser", "-u", "alice", "--", "scancel", cancel_id)
                    cancelled = True
            if not any(j in q for j in jobs.values()) and bob.poll() is not None:
                break
            assert time.monotonic() < deadline, f"jobs still queued after 200 s: {q}"
            time.sleep(0.5)
        bob_out, bob_err = bob.communicate(timeout=10)
        assert bob.returncode == 0, f"bob's srun failed: {bob_out}{bob_err}"
        m = re.search(r"^JOB=(\d+)$", bob_out, re.M)
        assert m, bob_out
        jobs["srun"] = m.group(1)
        for role, jid in jobs.items():
            printed = bob_out if role == "srun" else (outdir / f"{jid}.out").read_text()
            m = GPUS_LINE.search(printed)
            assert m, f"{role} job {jid} printed no GPUS= line: {printed!r}"
            data.gpus[role] = [int(g) for g in m.group(1).split(",") if g]
        ids = list(jobs.values())
        busy = {"RUNNING", "PENDING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED"}

        def sacct_final() -> bool:
            s = sacct_states(data.t_submit, ids)
            return len(s) == len(ids) and not busy & set(s.values())

        wait_until("sacct to show every job's final state", 30, sacct_final)
        data.timings["jobs_s"] = time.monotonic() - t0

        daemon.send_signal(signal.SIGTERM)
        _, data.daemon_err = daemon.communicate(timeout=30)
        data.daemon_rc = daemon.returncode
        data.hook_log_text = data.hook_log.read_text()

        t0 = time.monotonic()
        data.once = run_cocaq(["--config", str(config), "collector", "--once"], env)
        # sacct's CLI on both versions (the pyslurm backend: tests/test_slurm_backends.py)
        data.reconcile = run_cocaq(
            ["--config", str(config), "reconcile", "--since", "1h", "--backend", "cli"], env
        )
        data.timings["ship_reconcile_s"] = time.monotonic() - t0
        data.timings["fixture_s"] = time.monotonic() - t_all
        yield data
    finally:
        for p in (daemon, bob):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        restore = None
        if hooks_on:
            if data is not None:
                leftovers = [j for j in data.jobs.values() if j in queue()]
                if leftovers:
                    subprocess.run(["scancel", *leftovers], check=False)
            # the cluster as this session found it configured: without our hooks (unless it set some)
            restore = cluster_sh("up", hook_env(), version)
        if data is not None:
            data.engine.dispose()
        shutil.rmtree(outdir, ignore_errors=True)
        lock.close()
        if restore is not None:
            assert restore.returncode == 0, f"restoring the cluster failed:\n{restore.stdout}{restore.stderr}"
            assert slurm_config("Prolog") == (os.environ.get("COCAQ_SLURM_PROLOG") or "(null)")


# --- what landed in the database ------------------------------------------------------------------------


EXPECTED = {  # role -> (user, account, partition, final state in sacct)
    "timeout": ("bob", "lab_nlp", "gpu", "TIMEOUT"),
    "alice": ("alice", "lab_vision", "gpu", "COMPLETED"),
    "failed": ("alice", "lab_vision", "gpu", "FAILED"),
    "srun": ("bob", "lab_nlp", "gpu", "COMPLETED"),
    "cancelled": ("alice", "lab_vision", "gpu", "CANCELLED"),
    "cpu": ("bob", "lab_nlp", "cpu", "COMPLETED"),
}


def query(run: SlurmRun, sql: str, **params: Any) -> list[Any]:
    with run.engine.connect() as c:
        return list(c.execute(text(sql), params).mappings())


def jobs_by_role(run: SlurmRun) -> dict[str, Any]:
    rows = query(  # this run's jobs: an id may have been used before (see sacct())
        run,
        "SELECT j.* FROM jobs j JOIN clusters c ON c.id = j.cluster_id"
        " WHERE c.name = :cluster AND j.job_id_raw = ANY(:ids) AND j.submit_time >= :since",
        cluster=CLUSTER,
        ids=[int(j) for j in run.jobs.values()],
        since=datetime.fromtimestamp(run.t_submit, UTC),
    )
    by_id = {str(r["job_id_raw"]): r for r in rows}
    assert len(rows) == len(by_id) == len(run.jobs), (
        f"want one jobs row per job: {[r['job_id'] for r in rows]}"
    )
    return {role: by_id[jid] for role, jid in run.jobs.items()}


def events_by_role(run: SlurmRun) -> dict[str, dict[str, Any]]:
    rows = query(run, "SELECT * FROM node_events WHERE job_id = ANY(:ids)", ids=list(run.jobs.values()))
    out: dict[str, dict[str, Any]] = {}
    for role, jid in run.jobs.items():
        mine = [r for r in rows if r["job_id"] == jid and r["event"] != "meta"]  # meta: what jobs declared
        assert sorted(r["event"] for r in mine) == ["end", "start"], f"{role} job {jid}: {mine}"
        out[role] = {r["event"]: r for r in mine}
    return out


def energy_by_role(run: SlurmRun) -> dict[str, list[Any]]:
    rows = query(run, "SELECT * FROM node_energy WHERE job_id = ANY(:ids)", ids=list(run.jobs.values()))
    return {role: [r for r in rows if r["job_id"] == jid] for role, jid in run.jobs.items()}


def test_cluster_runs_the_shims_and_the_node_stays_up(run: SlurmRun) -> None:
    assert slurm_config("Prolog") == str(SHIM_DIR / "cocaq-prolog")
    assert slurm_config("Epilog") == str(SHIM_DIR / "cocaq-epilog")
    assert slurm_config("PrologFlags") == "Alloc"
    # no hook drained it (right after jobs end, backfill may show the node "planned" for a cycle)
    wait_node_idle(90)
    shim = (SHIM_DIR / "cocaq-epilog").read_text()  # Slurm passes no PATH and no config: all absolute
    assert f"--config {run.config} epilog" in shim and shim.rstrip().endswith("exit 0")
    # what each job was given, as it printed it (Slurm hands out the lowest free index)
    g = run.gpus
    assert g["timeout"] == [0] and g["alice"] == g["failed"] == g["cancelled"] == [1], g
    assert g["srun"] == [0, 1] and g["cpu"] == [], g


def test_jobs_from_sacct(run: SlurmRun) -> None:
    jobs = jobs_by_role(run)
    ev = events_by_role(run)
    for role, (user, account, partition, state) in EXPECTED.items():
        j = jobs[role]
        where = f"{role} job {run.jobs[role]}"
        assert (j["user_name"], j["account"], j["partition"], j["state"]) == (
            user,
            account,
            partition,
            state,
        ), where
        assert j["node_list"] == NODE and j["n_nodes"] == 1 and not j["is_open"], where
        assert j["alloc_gpus"] == len(run.gpus[role]), where
        start, end = ts(j["start_time"]), ts(j["end_time"])
        assert start <= end and abs((end - start) - j["elapsed_s"]) <= 1, where
        # the same run as the node saw it (the prolog runs at allocation, the epilog after the end):
        # seconds apart, not hours (a time zone mix-up would show here)
        assert abs(ts(ev[role]["start"]["ts"]) - start) <= 5, where
        assert abs(ts(ev[role]["end"]["ts"]) - end) <= 8, where
    assert jobs["alice"]["comment"] == COMMENT
    assert jobs["alice"]["exit_code"] == 0 and jobs["srun"]["exit_code"] == 0
    # Slurm 22.05's `sacct --json` reports exit code 0 for this job (see test_sacct_real.py), so on
    # 22.05 reconcile reads sacct's text output, which has the 3 (as has the epilog: 768 = 3 << 8).
    assert jobs["failed"]["exit_code"] == 3
    assert sacct(run.t_submit, [run.jobs["failed"]], "State,ExitCode") == [["FAILED", "3:0"]]
    assert (jobs["cancelled"]["state_detail"] or "").startswith("CANCELLED by")
    assert jobs["timeout"]["elapsed_s"] >= 60 and jobs["timeout"]["time_limit_s"] == 60
    assert jobs["alice"]["gpu_type"] == "a100"


def test_model_metadata_by_comment_and_by_tag_from_inside_the_job(run: SlurmRun) -> None:
    out = (run.outdir / f"{run.jobs['alice']}.out").read_text()
    assert "TAGGED" in out and "warning" not in out, out
    rows = query(
        run,
        "SELECT m.model_name, m.precision, m.epochs, m.tokens, m.batch_size, m.sources FROM model_metadata m"
        " JOIN jobs j ON j.id = m.job_pk WHERE j.job_id = :j",
        j=run.jobs["alice"],
    )
    assert len(rows) == 1, rows
    model, precision, epochs, tokens, batch_size, sources = rows[0].values()
    assert (model, precision, epochs, tokens, batch_size) == ("resnet50", "bf16", 2.0, 5000, 64)
    assert sources == {
        "model": "comment", "precision": "comment", "epochs": "api", "tokens": "api", "batch_size": "api",
    }  # fmt: skip
    # the epilog read the file and removed it; the other jobs declared nothing
    assert not (Path(ANNOTATE_DIR) / f"{run.jobs['alice']}.json").exists()
    others = [j for r, j in run.jobs.items() if r != "alice"]
    assert (
        query(
            run,
            "SELECT count(*) AS n FROM model_metadata m JOIN jobs j ON j.id = m.job_pk WHERE j.job_id = ANY(:ids)",
            ids=others,
        )[0]["n"]
        == 0
    )
    hook_lines = run.hook_log.read_text()
    assert f"epilog job={run.jobs['alice']} ok" in hook_lines


def test_node_events_carry_the_jobs_gpus_by_minor_number(run: SlurmRun) -> None:
    jobs = jobs_by_role(run)
    events = events_by_role(run)
    for role, evs in events.items():
        where = f"{role} job {run.jobs[role]}"
        want_gpus = run.gpus[role]
        for kind, e in evs.items():
            p = e["payload"]
            assert e["job_pk"] == jobs[role]["id"], f"{where}: {kind} event not linked to its job"
            assert e["node"] == p["node"] == NODE and p["cluster"] == CLUSTER, where
            user, account, partition, _ = EXPECTED[role]
            job = p["job"]
            assert (job["user"], job["account"], job["partition"]) == (user, account, partition), where
            assert job["node_list"] == NODE and job["uid"] == int(sh("id", "-u", user)), where
            # Slurm's own list, as the prolog/epilog got it: exactly the indices the job printed
            assert job.get("gpus", "") == ",".join(map(str, want_gpus)), where
            # ... mapped to devices by minor number, whatever NVML's enumeration order
            got = sorted(
                (g["slurm_index"], g["minor"], g["uuid"], g["pci_bus_id"], g["index"]) for g in p["gpus"]
            )
            assert got == [(i, i, UUID[i], PCI[i], NVML_INDEX[i]) for i in want_gpus], (
                f"{where} {kind}: {got}"
            )
            for g in p["gpus"]:
                if g["minor"] == COUNTER:
                    assert isinstance(g["energy_mj"], int) and g["energy_mj"] > 0, where
                else:  # no counter: the power reading is kept for an integral
                    assert g["energy_mj"] is None and 0 < g["power_w"] <= MAX_W, where
            # the only complaint is the missing counter, and only for a job holding that GPU
            for err in p["errors"]:
                assert "NVML_ERROR_NOT_SUPPORTED" in err and UUID[NO_COUNTER] in err, f"{where}: {err}"
            assert bool(p["errors"]) == (NO_COUNTER in want_gpus), f"{where}: {p['errors']}"
        end = evs["end"]["payload"]
        assert end["job_start"] == evs["start"]["payload"]["ts"], where
        # exact energy from the counters only, i.e. only for the GPU that has one; the other gets the
        # trapezoid of its two power readings (these jobs are shorter than EDGES_MAX_S)
        got = sorted((x["device"], x["source"]) for x in end["energy"])
        want = [(UUID[COUNTER], "nvml")] * (COUNTER in want_gpus)
        want += [(UUID[NO_COUNTER], "nvml-power-edges")] * (NO_COUNTER in want_gpus)
        assert got == sorted(want), f"{where}: {got}"
    assert events["alice"]["start"]["payload"]["job"]["comment"] == COMMENT
    # 22.05 gives the epilog the raw wait status: exit 3 -> 768
    assert events["failed"]["end"]["payload"]["job"]["exit_code"] == str(3 << 8)


def test_node_energy(run: SlurmRun) -> None:
    ev = events_by_role(run)
    sampled = {  # (job, GPU) pairs the collector saw while the job ran: samples it tagged with the job
        (r["job_id"], r["device"])
        for r in query(
            run,
            "SELECT DISTINCT job_id, device FROM samples WHERE source = 'nvml' AND job_id = ANY(:ids)",
            ids=list(run.jobs.values()),
        )
    }
    fakenvml.configure(str(run.spec))  # the fake is a pure function of time: recompute the counter
    try:
        for role, rows in energy_by_role(run).items():
            jid, where = run.jobs[role], f"{role} job {run.jobs[role]}"
            start_ts = ev[role]["start"]["payload"]["ts"]
            # the fake cgroup tree holds no job cgroups, so RAPL has nothing to split between jobs: GPUs only
            assert {r["component"] for r in rows} <= {"gpu"}, f"{where}: {rows}"
            held = {UUID[i] for i in run.gpus[role]}
            assert {r["device"] for r in rows} <= held, f"{where}: energy of a GPU it did not hold"
            for r in rows:
                assert r["node"] == NODE and r["method"] == "measured", where
                assert abs(ts(r["job_start"]) - start_ts) < 1e-3, where  # keyed by the prolog's time
            counter = [r for r in rows if r["device"] == UUID[COUNTER]]
            if UUID[COUNTER] in held:
                (r,) = counter
                assert r["source"] == "nvml", where
                (exact,) = [e for e in ev[role]["end"]["payload"]["energy"] if e["source"] == "nvml"]
                t0, t1 = exact["t0"], exact["t1"]
                i = NVML_INDEX[COUNTER]
                model = (fakenvml.energy_mj_at(i, t1) - fakenvml.energy_mj_at(i, t0)) / 1e3
                assert exact["energy_j"] == pytest.approx(model, abs=5.0), where
                assert IDLE_W * (t1 - t0) <= exact["energy_j"] <= MAX_W * (t1 - t0), where
                if abs(ts(r["t1"]) - t1) < 1e-3:  # the epilog's exact value, final
                    assert r["energy_j"] == pytest.approx(exact["energy_j"]) and r["final"], where
                else:  # the collector read the GPU after the epilog did but before the epilog removed
                    # the job's state: its later reading wins ("a newer t1 replaces"), a few ms more
                    dt = ts(r["t1"]) - t1
                    assert (
                        0 < dt < 2 and exact["energy_j"] <= r["energy_j"] <= exact["energy_j"] + MAX_W * dt
                    ), where
            # No counter: the epilog cannot measure it. The collector's integral of the GPU's power,
            # closed at the epilog's reading, where the collector saw the job running; the epilog's
            # trapezoid of its two readings in any case (used where there is no integral).
            if UUID[NO_COUNTER] in held:
                mine = [r for r in rows if r["device"] == UUID[NO_COUNTER]]
                integral = [r for r in mine if r["source"] == "nvml-power-integral"]
                assert len(integral) == ((jid, UUID[NO_COUNTER]) in sampled), f"{where}: {mine}"
                assert len([r for r in mine if r["source"] == "nvml-power-edges"]) == 1, f"{where}: {mine}"
                (g_end,) = [g for g in ev[role]["end"]["payload"]["gpus"] if g["uuid"] == UUID[NO_COUNTER]]
                for r in mine:
                    assert r["final"] and ts(r["t1"]) >= g_end["ts"] - 1e-3, f"{where}: not closed: {r}"
                    span = g_end["ts"] - ts(r["t0"])
                    assert IDLE_W * (span - 1) <= r["energy_j"] <= MAX_W * (span + 1), f"{where}: {r}"
        # 5 s at 1 s cycles: the collector cannot miss these
        for role in ("alice", "srun", "timeout"):
            assert {(run.jobs[role], UUID[i]) for i in run.gpus[role]} <= sampled, role
    finally:
        fakenvml.reset()


def test_job_energy_is_measured_where_measured_and_estimated_elsewhere(run: SlurmRun) -> None:
    jobs = jobs_by_role(run)
    node_energy = energy_by_role(run)
    for role, j in jobs.items():
        where = f"{role} job {run.jobs[role]}"
        rows = query(run, "SELECT * FROM job_energy WHERE job_pk = :pk", pk=j["id"])
        assert rows, where
        assert j["energy_j"] == pytest.approx(sum(r["energy_j"] for r in rows)), where
        measured = [r for r in rows if r["method"] == "measured"]
        assert j["energy_measured_j"] == pytest.approx(sum(r["energy_j"] for r in measured)), where
        # CPU and DRAM: nothing measured them (RAPL had no job cgroup to split by): estimated
        assert all(r["component"] == "gpu" for r in measured), f"{where}: {measured}"
        assert all(r["method"] == "estimated" for r in rows if r["component"] != "gpu"), where
        if not run.gpus[role]:
            assert not [r for r in rows if r["component"] == "gpu"] and not measured, where
            continue
        devices = {r["device"] for r in node_energy[role]}
        # the epilog's two-reading trapezoid counts only for a GPU that nothing else measured
        others = {r["device"] for r in node_energy[role] if r["source"] != "nvml-power-edges"}
        chosen = [
            r for r in node_energy[role] if r["source"] != "nvml-power-edges" or r["device"] not in others
        ]
        assert {r["source"] for r in measured} == {r["source"] for r in chosen}, where
        e = sum(r["energy_j"] for r in measured)
        assert e == pytest.approx(sum(r["energy_j"] for r in chosen)), where
        elapsed = j["elapsed_s"]
        n = len(devices)
        assert IDLE_W * n * max(elapsed - 2, 0) <= e <= MAX_W * n * (elapsed + 3), (
            f"{where}: {e} J in {elapsed} s"
        )
        if role in ("alice", "srun", "timeout"):
            assert e > 0 and n == len(run.gpus[role]), where
        # a GPU nothing measured keeps its share of the TDP estimate, labelled so (a job that ran
        # for 0 s, as sacct counts, has a 0 J estimate: no row)
        estimated = [r for r in rows if r["component"] == "gpu" and r["method"] == "estimated"]
        if n == len(run.gpus[role]):
            assert not estimated, where
        else:
            assert len(estimated) == (elapsed > 0) and all(
                r["source"] == "tdp-estimate" for r in estimated
            ), where


def test_hook_log_has_one_clean_line_per_hook(run: SlurmRun) -> None:
    lines = [HOOK_LINE.match(line) for line in run.hook_log_text.splitlines()]
    assert all(lines), run.hook_log_text
    parsed = [m.groups() for m in lines if m]
    assert not [p for p in parsed if p[2] == "FAILED"], run.hook_log_text
    for role, jid in run.jobs.items():
        mine = sorted(kind for kind, j, _, _ in parsed if j == jid)
        assert mine == ["epilog", "prolog"], f"{role} job {jid}: {mine}"
    for kind, jid, _, rest in parsed:
        took = re.match(r" ([\d.]+)ms", rest)
        assert took and float(took.group(1)) < 2000, f"{kind} job={jid}{rest}"
        if "warnings=" in rest:
            assert "NVML_ERROR_NOT_SUPPORTED" in rest and UUID[NO_COUNTER] in rest, rest


def test_collector_sampled_and_shipped_everything(run: SlurmRun) -> None:
    assert run.daemon_rc == 0, run.daemon_err
    assert "ERROR" not in run.daemon_err and "Traceback" not in run.daemon_err, run.daemon_err
    assert run.once is not None and run.once.code == 0, run.once
    assert "sources on: nvml, rapl, cgroup" in run.once.err, run.once.err
    assert "stopped" not in run.once.err, run.once.err
    # everything shipped; every epilog removed its job's prolog state
    assert not list((run.spool / "events").iterdir())
    assert not list((run.spool / "jobs").iterdir())
    # the daemon knew bob's job from its prolog state and tagged both GPUs' samples with it
    rows = query(
        run,
        "SELECT device, count(*) AS n FROM samples WHERE source = 'nvml' AND metric = 'power_w'"
        " AND job_id = :job GROUP BY device",
        job=run.jobs["srun"],
    )
    assert {r["device"] for r in rows} == {UUID[0], UUID[1]} and all(r["n"] >= 2 for r in rows), rows
    assert run.reconcile is not None and run.reconcile.code == 0, run.reconcile
    # 25.11's --json is trusted (a failed job's exit code is right there); 22.05's text output is read
    kind = "parsable" if run.version == "22.05" else "json"
    assert re.search(rf"^sacct \({kind}\): \d+ new jobs", run.reconcile.err, re.M), run.reconcile.err
    assert re.search(r"; 0 not matched to a job yet", run.reconcile.err), run.reconcile.err
    assert not query(run, "SELECT uid FROM node_events WHERE job_pk IS NULL")


# --- a failing hook -------------------------------------------------------------------------------------


def test_failing_hook_logs_why_and_keeps_the_node_up(run: SlurmRun) -> None:
    """The spool a real job's hooks are told to use is a symlink: they refuse it, say so, exit 0."""
    target = run.tmp / "elsewhere"
    target.mkdir(mode=0o700)
    link = run.tmp / "spool-link"
    link.symlink_to(target)
    broken_log = run.tmp / "log" / "hook-broken.log"
    broken = run.config_text.replace(f'spool_dir = "{run.spool}"', f'spool_dir = "{link}"')
    broken = broken.replace(f'hook_log = "{run.hook_log}"', f'hook_log = "{broken_log}"')
    assert broken.count(str(link)) == 1 and broken.count(str(broken_log)) == 1
    tmp = run.config.with_suffix(".tmp")
    since = time.time() - 1
    try:
        tmp.write_text(broken)
        os.replace(tmp, run.config)  # the path the shims name; the hooks notice the change by its stat
        jid = sbatch("alice", run.outdir, "-p", "cpu", "-J", "cocaq-broken-spool", "--wrap", "echo ran")
        wait_until(f"job {jid} to leave the queue", 60, lambda: jid not in queue())
        wait_until(
            f"job {jid} in sacct",
            30,
            lambda: sacct_states(since, [jid]).get(jid) not in (None, "RUNNING", "PENDING"),
        )
    finally:
        tmp.write_text(run.config_text)
        os.replace(tmp, run.config)
    # a failing Prolog would have requeued the job held and drained the node; an Epilog drained it
    assert sacct_states(since, [jid]) == {jid: "COMPLETED"}
    assert (run.outdir / f"{jid}.out").read_text() == "ran\n"
    wait_node_idle(90)
    lines = broken_log.read_text().splitlines()
    assert len(lines) == 2, lines
    for kind, line in zip(("prolog", "epilog"), lines, strict=True):
        assert f" {kind} job={jid} FAILED after " in line, line
        assert f"SpoolError: spool: {link} is a symlink; refusing to use it" in line, line
    assert list(target.iterdir()) == []  # nothing written through the symlink, not even a failure count
    assert not list((run.spool / "events").iterdir())  # nor into the real spool

    # By hand, as slurmd would run it but without a job: the shim still exits 0 and the log says why.
    r = subprocess.run(
        ["env", "-i", str(SHIM_DIR / "cocaq-prolog")], capture_output=True, text=True, timeout=60
    )
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    last = run.hook_log.read_text().splitlines()[-1]
    assert " job=? FAILED after " in last and "SLURM_JOB_ID is missing or not a number" in last, last
    # and one whose interpreter is gone (cocaq moved without regenerating the shims): still 0
    from cocaq.prolog_epilog.shims import write_shims

    (stale,) = [p for p in write_shims(str(run.tmp / "stale"), str(run.config), python="/nonexistent/python3")
                if p.endswith("/cocaq-epilog")]  # fmt: skip
    r = subprocess.run(["env", "-i", "SLURM_JOB_ID=1", stale], capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
