"""The advice's case book (issue 32): single jobs and small users written as sacct lines, each with the
advice that must and must not appear, read as an HPC expert would read it.

Every case is a user of its own on one cluster; the lines (parsable2 with a header, steps included, as
`sacct --parsable2` prints them) go through the real `cocaq import sacct --file` and `cocaq aggregate`
once per database (SQLite and PostgreSQL), then each case reads its suggestions the way every surface
does (cocaq.footprint.jobfacts + advice: what `cocaq user`, the e-mail and the API say) and its jobs'
notes (what `cocaq job` and the job e-mail say), and a few through the real CLI. Where a rule rests on
Slurm's documentation or the hardware, the case says which (docs/user-guide.md has the table).

Point by point of issue 32: 1 time-outs, 2 time limits per kind of job, 3 sessions and the possibly lost
energy, 4 early and late failures, 5 precision by the GPU, 6 frequency, 8 words (a count of one), 9 a
running job and unknown names, here; 7 (every jobstats note) on a site of its own, with node shapes, MIG
partitions and per-GPU samples, in tests/advice_casebook_jobstats.py, whose tests run as part of this
module. Point 10 (when to run) needs hourly series around clock changes: tests/test_cli_carbon.py and
tests/test_when_advice.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cocaq.config import Config
from cocaq.config_load import load_config
from cocaq.footprint import advice, jobfacts
from cocaq.footprint.advice import Advice
from cocaq.footprint.jobfacts import JobFacts
from tests.advice_casebook_jobstats import (  # noqa: F401  (point 7's cases, collected here)
    site,
    test_a_batch_script_without_srun_leaves_every_other_node_idle,
    test_cocaq_job_names_the_idle_node,
    test_cocaq_job_says_them,
    test_cores_per_gpu,
    test_cpu_between_half_and_80_asks_for_a_scaling_test,
    test_cpu_one_core_worth_is_a_serial_code,
    test_cpu_two_cores_and_gpu_jobs,
    test_cpu_under_half_is_sized_down,
    test_fewer_nodes,
    test_hostile_minimum_fields_cost_only_themselves,
    test_json_and_pyslurm_read_the_same,
    test_mem_per_gpu,
    test_mig_partitions_config_errors,
    test_mig_slice_for_a_small_part_of_a_gpu,
    test_no_zero_cpu_node_note_where_every_node_worked_one_node_or_many_tasks,
    test_unused_gpus_from_per_gpu_samples,
    test_zero_cpu_node_is_named_with_the_line_to_change,
)
from tests.conftest import new_database, run_cocaq

CONFIG = """
database_url = "{url}"
[cluster]
name = "hal"
carbon_zone = "FRA"
pue = 1.2
timezone = "UTC"
[defaults]
cpu_tdp_w_per_core = 10
gpu_tdp_w = 0
[partitions.gpu]
gpu_model = "A100-SXM4-80GB"
gpu_tdp_w = 400
gpu_mem_gb = 80
cpu_tdp_w_per_core = 10
[partitions.v100]
gpu_model = "Tesla V100-SXM2-32GB"
gpu_tdp_w = 300
gpu_mem_gb = 32
cpu_tdp_w_per_core = 10
[partitions.p100]
gpu_model = "Tesla P100-PCIE-16GB"
gpu_tdp_w = 250
gpu_mem_gb = 16
[advice]
min_share = 0.02
min_kwh = 0.5
partition_max_time = {{ gpu = "1-00:00:00", debug = "01:00:00" }}
qos_max_time = {{ short = "04:00:00" }}
"""

HEADER = (
    "JobID|JobIDRaw|JobName|User|UID|Account|Partition|QOS|NodeList|NNodes|AllocCPUS|AllocTRES|ReqTRES|"
    "ReqMem|Submit|Start|End|Elapsed|ElapsedRaw|State|ExitCode|TotalCPU|Comment|ConsumedEnergyRaw|Cluster|"
    "Timelimit|TRESUsageInAve|TRESUsageInMax|MaxRSS|NTasks"
)

NOW = datetime.now(UTC).replace(microsecond=0, second=0, minute=0)
T0 = NOW - timedelta(days=20)  # the cases' jobs start from here, each an hour after the last


def _t(d: datetime) -> str:
    return d.strftime("%Y-%m-%dT%H:%M:%S")


def _clock(h: float) -> str:
    s = round(h * 3600)
    d, r = divmod(s, 86400)
    return (f"{d}-" if d else "") + f"{r // 3600:02d}:{r % 3600 // 60:02d}:{r % 60:02d}"


_ids = iter(range(7000, 100000))
_starts: dict[str, datetime] = {}


@dataclass
class J:
    """One job as sacct shows it, with its steps: `steps` names them ("batch", "extern", "0",
    "interactive"); a batch job has "batch", `srun --pty` has "0" and no batch, salloc "interactive"."""

    user: str
    name: str = "train"
    partition: str = "gpu"
    qos: str = "normal"
    hours: float = 2.0
    limit: str = "1-00:00:00"
    state: str = "COMPLETED"
    exit: str = "0:0"
    cpus: int = 8
    gpus: int = 1
    nodes: int = 1
    mem: str = "64G"
    total_cpu_h: float | None = None  # None: half the cores busy
    gpu_util: float | None = None  # gres/gpuutil, % of one GPU summed over the job's GPUs
    comment: str = ""
    max_rss: str = ""
    steps: tuple[str, ...] = ("batch",)
    start: datetime | None = None  # None: an hour after the user's last job
    id: int = field(default_factory=lambda: next(_ids))

    def lines(self) -> list[str]:
        start = self.start or _starts.get(self.user, T0)
        _starts[self.user] = start + timedelta(hours=self.hours + 1)
        end = start + timedelta(hours=self.hours)
        running = self.state == "RUNNING"
        el = round(self.hours * 3600)
        cpu = self.total_cpu_h if self.total_cpu_h is not None else self.cpus * self.hours * 0.5
        kind = {"v100": "v100", "p100": "p100"}.get(self.partition, "a100")
        gres = f",gres/gpu:{kind}={self.gpus},gres/gpu={self.gpus}" if self.gpus else ""
        tres = f"billing={self.cpus},cpu={self.cpus}{gres},mem={self.mem},node={self.nodes}"
        nodes = "n01" if self.nodes == 1 else f"n[01-{self.nodes:02d}]"
        head = (
            f"{self.id}|{self.id}|{self.name}|{self.user}|2001|lab_{self.user}|{self.partition}|{self.qos}|"
            f"{nodes}|{self.nodes}|{self.cpus}|{tres}|{tres}|{self.mem}|{_t(start)}|{_t(start)}|"
            f"{'Unknown' if running else _t(end)}|"
            f"{_clock(self.hours)}|{el}|{self.state}|{self.exit}|{_clock(cpu)}|{self.comment}||hal|"
            f"{self.limit}||||"
        )
        out = [head]
        for s in self.steps:
            use = f"cpu={_clock(cpu)}" + (
                f",gres/gpumem=1G,gres/gpuutil={self.gpu_util:g}" if self.gpu_util is not None else ""
            )
            step_state = self.state.split(" ")[0] if s not in ("extern",) else "COMPLETED"
            out.append(
                f"{self.id}.{s}|{self.id}.{s}|{s}|||lab_{self.user}|||{nodes}|{self.nodes}|{self.cpus}|{tres}|||"
                f"{_t(start)}|{_t(start)}|{'Unknown' if running else _t(end)}|{_clock(self.hours)}|{el}|"
                f"{step_state}|{self.exit}|"
                f"{_clock(cpu if s != 'extern' else 0)}|||||{use if s != 'extern' else ''}|"
                f"{use if s != 'extern' else ''}|{self.max_rss if s != 'extern' else ''}|1"
            )
        return out


# --- the cases -------------------------------------------------------------------------------------------

# 1. A training run at 88% GPU use that hits its limit, the partition's MaxTime (1 day), and three runs of
# the same job that completed in 20-23 h: Slurm does not requeue it (sbatch(1) --requeue: node failure,
# preemption, scontrol requeue), so the advice is a warning signal and a checkpoint; no --time longer
# than the partition allows.
TINA = [
    J("tina", hours=24, state="TIMEOUT", exit="0:15", gpus=4, cpus=32, gpu_util=352),
    *(J("tina", hours=h, gpus=4, cpus=32, gpu_util=350) for h in (20, 22, 23)),
]
# 2. Time limits per kind of job: `train` on gpu asks 2 days and completes in 3-4 h (a --time from its
# own runs); `smoke` on debug runs 5-10 min of a 1 h limit (too short a limit to be worth a note); a
# jupyter session (interactive) never gets a --time; a `sweep` in QOS short (MaxWall 4 h) at 12% of a
# 4 h limit gets a limit from its runs, never above the QOS's.
DEBBY = [
    *(J("debby", hours=h, limit="2-00:00:00", gpu_util=90) for h in (3.0, 3.5, 4.0, 3.2)),
    *(J("debby", name="smoke", partition="debug", hours=h, limit="01:00:00", gpus=0) for h in (0.1, 0.15, 0.12)),
    *(J("debby", name="jupyter", hours=1.0, limit="08:00:00", gpu_util=60, steps=("interactive", "extern"))
      for _ in range(3)),
    *(J("debby", name="sweep", qos="short", hours=0.5, limit="04:00:00", gpus=0) for _ in range(3)),
]  # fmt: skip
# A job that hit the 1 h MaxTime of debug: no --time above it; an srun --pty session at its limit: no
# time-out advice at all (it ended normally).
DEBBY_TIMEOUTS = [
    J("debby", name="smoke2", partition="debug", hours=1.0, limit="01:00:00", state="TIMEOUT", gpus=1,
      gpu_util=80),
    J("debby", name="shell", hours=8.0, limit="08:00:00", state="TIMEOUT", gpu_util=40, steps=("0", "extern")),
]  # fmt: skip
# 4. Failures: three early (2, 4, 6 min), two late (6 h and 10 h): only the early ones count towards
# "test on a small input"; the late ones get their own advice.
FAY = [
    *(J("fay", hours=m / 60, state="FAILED", exit="1:0", gpus=4, cpus=32, gpu_util=300) for m in (2, 4, 6)),
    J("fay", hours=6, state="FAILED", exit="1:0", gpus=4, cpus=32, gpu_util=320),
    J("fay", hours=10, state="FAILED", exit="137:0", gpus=4, cpus=32, gpu_util=310),
]
# 5. Precision: V100s have no bf16 (compute capability 7.0): fp16 with a GradScaler; P100s (6.0, no tensor
# cores): nothing advised; on A100s, the user's own bf16 run against fp32 at the same batch size (16),
# never against the fp32 run at batch size 8; several models: the title names the largest "and N more".
VIC = [J("vic", partition="v100", hours=10, gpus=4, cpus=16, gpu_util=360,
         comment="cocaq: model=resnet50 framework=pytorch precision=fp32 batch_size=256 epochs=10")
       for _ in range(2)]  # fmt: skip
PAM = [J("pam", partition="p100", hours=10, gpus=4, cpus=16, gpu_util=360,
         comment="cocaq: model=resnet50 framework=pytorch precision=fp32 batch_size=256 epochs=10")
       for _ in range(2)]  # fmt: skip
ANA = [  # the bf16 run first: a job's note compares it with the runs that ended before it
    J("ana", hours=6, gpus=4, gpu_util=380, comment="cocaq: model=mistral-7b precision=bf16 batch_size=16 tokens=1e9"),
    J("ana", hours=10, gpus=4, gpu_util=380, comment="cocaq: model=mistral-7b precision=fp32 batch_size=16 tokens=1e9"),
    J("ana", hours=11, gpus=4, gpu_util=380, comment="cocaq: model=mistral-7b precision=fp32 batch_size=16 tokens=1e9"),
    J("ana", hours=20, gpus=4, gpu_util=380, comment="cocaq: model=mistral-7b precision=fp32 batch_size=8 tokens=1e9"),
    J("ana", hours=8, gpus=4, gpu_util=380, comment="cocaq: model=bert-base precision=fp32 epochs=3"),
    J("ana", hours=4, gpus=4, gpu_util=380, comment="cocaq: model=vit-l precision=fp32 epochs=3"),
]  # fmt: skip
# 6. Frequency: 27 out-of-memory kills of a minute each draw little energy, and still get a note, after
# the advice sized by energy (here: a long early... no, a big time-out).
OLGA = [
    J("olga", hours=20, state="TIMEOUT", limit="20:00:00", gpus=4, cpus=32, gpu_util=360),
    *(J("olga", name="prep", hours=1 / 60, state="OUT_OF_MEMORY", exit="0:125", gpus=0, cpus=2, mem="4G")
      for _ in range(27)),
]  # fmt: skip

# 3. Time-limit energy: a training run at its limit is "possibly lost", apart from what did no work; a
# notebook (salloc: an interactive step, no batch step) and an `srun --pty` shell that end at their limit
# ended normally: the notebook's idle GPUs did no work, nothing of either is possibly lost.
TESS = [
    J("tess", hours=12, limit="12:00:00", state="TIMEOUT", gpus=2, gpu_util=170),
    J("tess", name="jupyter", hours=8, limit="08:00:00", state="TIMEOUT", gpu_util=1,
      steps=("interactive", "extern")),
    J("tess", name="shell", hours=2, limit="02:00:00", state="TIMEOUT", gpus=0, cpus=4, steps=("0", "extern")),
]  # fmt: skip
# 8. A count of one: a 4-core job at 20% is told about 1 core, never "1 cores".
CARL = [J("carl", name="post", partition="cpu", hours=2, cpus=4, gpus=0, total_cpu_h=1.6)]
# 9. A job running for 54 minutes of a 12 h limit (its sacct elapsed is minutes old).
RITA = [J("rita", hours=0.8, limit="12:00:00", state="RUNNING", gpus=1, gpu_util=90,
          start=datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=54))]  # fmt: skip

CASES = [*TINA, *DEBBY, *DEBBY_TIMEOUTS, *FAY, *VIC, *PAM, *ANA, *OLGA, *TESS, *CARL, *RITA]


def dump() -> str:
    _starts.clear()
    return HEADER + "\n" + "\n".join(x for j in CASES for x in j.lines()) + "\n"


@dataclass
class Book:
    env: dict[str, str]
    cfg: Config
    url: str

    def jobs(self, user: str) -> list[JobFacts]:
        from cocaq.db.dbapi import connect

        db = connect(self.url)
        try:
            return jobfacts.load(db, self.cfg, NOW - timedelta(days=30), NOW + timedelta(days=1), user=user)
        finally:
            db.close()

    def ctx(self) -> advice.Context:
        return advice.site_context(self.cfg, NOW - timedelta(days=30), NOW + timedelta(days=1))

    def candidates(self, user: str) -> dict[str, Advice]:
        return {a.id: a for a in advice.candidates(self.jobs(user), self.ctx())}

    def advised(self, user: str) -> list[Advice]:
        jobs = self.jobs(user)
        return advice.advise_user(jobs, self.ctx(), sum(j.energy_kwh * j.share for j in jobs), self.cfg)

    def notes(self, job: J) -> dict[str, Advice]:
        from cocaq.db.dbapi import connect
        from cocaq.footprint import one_job

        j = next(x for x in self.jobs(job.user) if x.job_id == str(job.id))
        db = connect(self.url)
        try:
            return {a.id: a for a in one_job.job_notes(db, self.cfg, j)}
        finally:
            db.close()

    def cli(self, *args: str) -> Any:
        r = run_cocaq([*args, "-o", "json"], self.env)
        assert r.code == 0, r.err
        return json.loads(r.out)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def book(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Book]:
    tmp = tmp_path_factory.mktemp(f"cases-{request.param}")
    url = new_database(request.param, tmp, request)
    cfg_path = tmp / "cocaq.toml"
    cfg_path.write_text(CONFIG.format(url=url))
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("COCAQ_")}
    env.update(COCAQ_CONFIG=str(cfg_path), HOME=str(tmp), XDG_DATA_HOME=str(tmp / "xdg"), COLUMNS="200")
    f = tmp / "sacct.txt"
    f.write_text(dump())
    for args in (["db", "upgrade"], ["import", "sacct", "--file", str(f)], ["aggregate"]):
        r = run_cocaq(args, env)
        assert r.code == 0, (args, r.err)
    yield Book(env, load_config(cfg_path, environ={}), url)


def text_of(a: Advice) -> str:
    return " ".join([a.title, a.body, *a.change])


# --- 1. time-outs ----------------------------------------------------------------------------------------


def test_a_timeout_is_told_to_checkpoint_on_a_signal_not_to_requeue(book: Book) -> None:
    a = book.candidates("tina")["timeouts"]
    # the minimal working snippet: a warning signal to the batch shell, a trap that saves and requeues
    assert a.change[0] == "#SBATCH --signal=B:USR1@300"
    assert "trap on_warning USR1" in a.change and "  scontrol requeue $SLURM_JOB_ID" in a.change
    assert any(c.startswith("  kill -USR1 $pid; wait $pid") for c in a.change)
    assert any(c.startswith("python train.py --resume &") for c in a.change)  # in the background...
    assert a.change[-1] == "pid=$!; wait $pid"  # ...so that the shell's wait returns on the signal
    assert all(len(c) <= 56 for c in a.change)  # a line of code at 60 columns, unfolded
    # never "--requeue" as the way to resume a timed-out job (sbatch(1): node failure, preemption)
    assert "#SBATCH --requeue" not in a.change
    assert "resume from the last one (#SBATCH --requeue)" not in a.body
    assert "does not requeue a job that hits its time limit" in a.body
    # the partition's MaxTime is 1 day and the job asked for it: no longer --time
    assert not any(c.startswith("#SBATCH --time") for c in a.change)
    assert "already the longest its partition or QOS allows (24 h)" in a.body
    # and the same on the job's own note
    n = book.notes(TINA[0])["timeouts"]
    assert n.change[0] == "#SBATCH --signal=B:USR1@300" and "#SBATCH --requeue" not in n.change
    assert not any(c.startswith("#SBATCH --time") for c in n.change)


def test_a_timeout_below_maxtime_asks_for_what_its_own_runs_took(book: Book) -> None:
    # olga's 20 h limit on gpu (MaxTime 24 h), no completed run of it: at most the partition's 24 h
    a = book.candidates("olga")["timeouts"]
    assert "#SBATCH --time=1-00:00:00" in a.change
    assert "its partition or QOS allows up to 24 h" in a.body


# --- 2. one limit for everyone ----------------------------------------------------------------------------


def test_time_limits_are_sized_per_kind_of_job_on_its_own_runs(book: Book) -> None:
    a = book.candidates("debby")["time-limits"]
    # train on gpu: 95th percentile 4 h, x 1.25 = 5 h; not the 1.5 x 24 h of before, nor one line for all
    assert "#SBATCH --time=05:00:00  (train, gpu)" in a.change
    # sweep in QOS short: 30 min runs, 45 min; never above the QOS's 4 h
    assert "#SBATCH --time=00:45:00  (sweep, gpu)" in a.change
    assert not any("smoke" in c or "jupyter" in c for c in a.change)  # a 1 h limit; interactive
    assert not any(str(j.id) in a.job_ids for j in DEBBY if j.name in ("smoke", "jupyter"))
    assert "train on gpu (QOS normal): 4 completed runs, 95% within 4 h, asked for 48 h (median)" in a.body
    # the job note: the same figure from the same runs
    n = book.notes(DEBBY[3])["time-limits"]  # the 4th run: the 3 before it and itself
    assert n.change == ("#SBATCH --time=05:00:00",)
    # an interactive session: no limit note
    assert "time-limits" not in book.notes(DEBBY[7])


def test_no_time_limit_above_maxtime_and_none_for_sessions(book: Book) -> None:
    found = book.candidates("debby")
    t = found["timeouts"]
    # smoke2 hit debug's MaxTime (1 h); the srun --pty shell at its limit is not a time-out to checkpoint
    assert str(DEBBY_TIMEOUTS[0].id) in t.job_ids and str(DEBBY_TIMEOUTS[1].id) not in t.job_ids
    assert not any(c.startswith("#SBATCH --time") for c in t.change)
    assert "timeouts" not in book.notes(DEBBY_TIMEOUTS[1])
    for a in found.values():
        for line in a.change:
            m = re.match(r"#SBATCH --time=(?:(\d+)-)?(\d\d):(\d\d):(\d\d)", line)
            if m:
                h = int(m[1] or 0) * 24 + int(m[2]) + int(m[3]) / 60
                assert h <= 24, line


# --- 4. failed jobs -----------------------------------------------------------------------------------------


def test_only_early_failures_count_towards_a_short_test(book: Book) -> None:
    found = book.candidates("fay")
    early, late = found["failures"], found["failures-late"]
    assert set(early.job_ids) == {str(j.id) for j in FAY[:3]}
    assert set(late.job_ids) == {str(j.id) for j in FAY[3:]}
    jobs = {j.job_id: j for j in book.jobs("fay")}
    part = sum(max(jobs[i].energy_kwh - jobs[i].idle_kwh, 0) for i in early.job_ids)
    assert early.saving_kwh == pytest.approx(part)
    # the evidence in minutes, as people say it
    assert "after a median of 4 min" in early.body
    ev = {e.label: (e.value, e.unit) for e in early.evidence}
    assert ev["median run time before failing"] == (4.0, "min")
    assert not re.search(r"\b0\.\d+ h\b", early.body)
    # late failures: the job's log and checkpoints, no 15-minute test
    assert "slurm-" in late.body and "checkpoint" in late.body and "--time=00:" not in " ".join(late.change)
    assert "failures-late" in book.notes(FAY[4]) and "failures" not in book.notes(FAY[4])
    assert "failures" in book.notes(FAY[0])


# --- 5. precision -----------------------------------------------------------------------------------------


def test_v100s_get_fp16_with_a_grad_scaler_never_bf16(book: Book) -> None:
    a = book.candidates("vic")["precision"]
    assert "fp16" in a.title and "bf16" not in a.title
    assert "GradScaler" in a.body and "torch.float16" in a.change[0]
    assert a.change[1] == "cocaq tag precision=fp16"
    assert "torch.bfloat16" not in " ".join(a.change) and "bf16-mixed" not in a.body
    n = book.notes(VIC[0])["precision"]
    assert "bf16" not in n.title and "GradScaler" in n.body


def test_gpus_without_tensor_cores_get_no_precision_advice(book: Book) -> None:
    assert "precision" not in book.candidates("pam")
    assert "precision" not in book.notes(PAM[0])


def test_one_comparison_one_percentage_at_the_same_batch_size(book: Book) -> None:
    a = book.candidates("ana")["precision"]
    jobs = {j.job_id: j for j in book.jobs("ana")}
    fp32 = [jobs[str(j.id)] for j in ANA[1:3]]
    bf16 = jobs[str(ANA[0].id)]
    per = sum(j.energy_kwh * (j.energy_kwh / 1000) for j in fp32) / sum(j.energy_kwh for j in fp32)
    expect = round((per - bf16.energy_kwh / 1000) / per * 100)
    said = {int(x) for x in re.findall(r"(\d+)% less energy per 1M tokens", a.body)}
    assert said == {expect}
    assert str(ANA[3].id) not in a.body.split("By your own runs:")[1].split(".")[0]  # the batch-8 run
    ev = next(e for e in a.evidence if e.label.startswith("mistral-7b"))
    assert ev.value == expect and "at batch size 16" in ev.label
    n = book.notes(ANA[2])["precision"]
    assert f"{expect}% less than in fp32" in n.body
    # several models: the title names the largest and how many more
    assert a.title == "Train mistral-7b and 2 more models in bf16 mixed precision"
    # cocaq models says the same percentage for the same comparison
    models = book.cli("models", "-u", "ana", "--since", "30d")
    sentences = [c["sentence"] for c in models["comparisons"] if c["model"] == "mistral-7b"]
    assert sentences and all(f"{expect}% less" in s for s in sentences if s and "precision" not in s)


# --- 6. frequency --------------------------------------------------------------------------------------------


def test_repeated_failures_of_a_kind_get_a_note_whatever_their_energy(book: Book) -> None:
    found = book.advised("olga")
    ids = [a.id for a in found]
    assert ids[0] == "timeouts" and "out-of-memory" in ids
    oom = next(a for a in found if a.id == "out-of-memory")
    assert len(oom.job_ids) == 27
    floor = max(book.cfg.advice.min_share * sum(j.energy_kwh for j in book.jobs("olga")), 0.5)
    assert (oom.saving_kwh or 0) < floor  # below the energy floor: there by its count
    # through the real CLI: the same order
    d = book.cli("user", "olga", "--since", "30d")
    assert [a["id"] for a in d["advice"]][:2] == ["timeouts", "out-of-memory"]


# --- 3. time-limit energy, sessions -------------------------------------------------------------------------


def test_possibly_lost_is_apart_and_sessions_lose_nothing_at_their_limit(book: Book) -> None:
    jobs = {j.job_id: j for j in book.jobs("tess")}
    train, notebook, shell = (jobs[str(j.id)] for j in TESS)
    assert notebook.batch_step is False and shell.batch_step is False and train.batch_step is True
    t = book.cli("user", "tess", "--since", "30d")
    # only the batch job's energy beyond idle GPUs is possibly lost; what did no work is the notebook's idle
    assert t["timeout_energy_kwh"] == pytest.approx(train.energy_kwh - train.idle_kwh, rel=1e-3)
    assert t["wasted_energy_kwh"] == pytest.approx(notebook.idle_kwh + train.idle_kwh, rel=1e-3)
    assert notebook.idle_kwh > 0
    found = book.candidates("tess")
    assert found["timeouts"].job_ids == (str(TESS[0].id),)
    assert "notebooks" in found and "time-limits" not in found
    assert "timeouts" not in book.notes(TESS[1]) and "timeouts" not in book.notes(TESS[2])


# --- 8. words ----------------------------------------------------------------------------------------------


def test_a_count_of_one_is_singular(book: Book) -> None:
    n = book.notes(CARL[0])["cpus"]
    text = text_of(n)
    assert "About 1 core per node" in text and not re.search(r"\b1 cores\b", text)
    everything = " ".join(
        text_of(a) for user in ("tina", "debby", "fay", "vic", "ana", "olga", "tess", "carl")
        for a in book.candidates(user).values()
    )  # fmt: skip
    assert not re.search(r"\b1 (cores|jobs|GPUs|nodes|models)\b", everything)


# --- 9. surfaces -----------------------------------------------------------------------------------------------


def test_a_running_job_says_one_run_time_and_no_power_now(book: Book) -> None:
    r = run_cocaq(["job", str(RITA[0].id)], {**book.env, "COLUMNS": "60"})
    assert r.code == 0, r.err
    out = " ".join(r.out.split())
    assert re.search(r"0:5\d:\d\d so far of a 12:00:00 limit", out), out  # not sacct's 0.8 h
    assert "0.8 h" not in out and "Power now" not in out  # nothing measures it: rated power, said so
    notes = book.notes(RITA[0])
    assert not set(notes) & {"cpus", "memory", "time-limits", "gpu-memory"}  # its steps have not ended


def test_names_nowhere_in_the_database_exit_2(book: Book) -> None:
    for args in (["report", "user", "nosuch", "--out", "/tmp"], ["models", "-u", "nosuch"]):
        r = run_cocaq(args, book.env)
        assert r.code == 2 and "nosuch" in r.err, (args, r.code, r.err)
