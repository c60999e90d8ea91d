#!/usr/bin/env python3
"""The node side on a real GPU, end to end: prolog, collector, a two-power job, epilog, ship, aggregate.

    bash bench/real_gpu_check.sh            # one NVIDIA GPU, no Slurm, no network; about 2-3 minutes
    bash bench/real_gpu_check.sh --fake     # the same pipeline on cocaq's fake NVML, no torch (30 s)

In a temporary directory, with a synthetic Slurm environment (what slurmd gives a Prolog/Epilog): a
cocaq.toml (SQLite database, spool, `sources = ["nvml"]`, interval 1 s), the shims `cocaq hook shims`
writes for slurm.conf, `cocaq db upgrade`, then

  1. `cocaq collector` running for the whole job, sampling the GPU through pynvml;
  2. `nvidia-smi --query-gpu=timestamp,power.draw[,power.draw.instant] -lms 250` beside it (real mode);
  3. the prolog, as slurmd runs it (`/bin/sh cocaq-prolog`, no PATH), timed from spawn to exit;
  4. the job (bench/_gpu_workload.py): bf16 matmuls flat out, then duty-cycled (or under `-pl`);
  5. the epilog, timed; then --hook-pairs more prolog/epilog pairs on a spool of their own, for latency;
  6. the collector stopped, `cocaq collector --once` to ship the rest, a sacct record of the job
     (`cocaq import sacct --file`), `cocaq reconcile --no-sacct`, `cocaq aggregate`, `cocaq job ID`.

It prints, per phase and for the whole job, the GPU's energy three ways: NVML's energy counter (what the
hooks store), the collector's power samples integrated, and nvidia-smi's; their differences; the hooks'
latency; and `cocaq job`. How to read it: docs/benchmarks/real-gpu-check.md. Exit 2 with one line when
there is no GPU, no pynvml, no torch, or cocaq's commands cannot run here.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import json
import math
import os
import pty
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cocaq.collector.nvml import GpuId, Nvml, NvmlUnavailable  # noqa: E402 - after the checkout's path

WHEELS = ROOT / ".wheels"  # cocaq's own dependencies as wheels, for a machine without them (see the docs)
DEPS = ROOT / ".gpucheck-deps"  # ... unpacked here, on the path of cocaq's commands only
# What the commands this check runs import beyond the standard library (PYTHONPROFILEIMPORTTIME, 2026-12-04;
# codecarbon for its data files only): bench/real_gpu_check-requirements.txt pins them.
CLI_MODULES = ("click", "rich", "sqlalchemy", "alembic", "mako", "codecarbon")
JOB_ID = "90001"
NODE = os.uname().nodename.split(".")[0]  # the collector names its node so: the hooks must too
PHASES = ("setup", "high", "low", "tail")
# A reading that is the average of the last second (Ampere but GA100, and later) describes the power half
# a second before it was read: the integral with every reading moved back by this shows what that costs.
LAG_S = 0.5


def fail(msg: str) -> NoReturn:
    print(f"real_gpu_check: {msg}", file=sys.stderr)
    sys.exit(2)


# --- numbers -------------------------------------------------------------------------------------------


def integrate(ts: Sequence[float], ws: Sequence[float], a: float, b: float) -> float:
    """Energy (J) over [a, b] of the power (W) that the samples describe, read as linear between them
    (the collector's trapezoids) and flat before the first and after the last."""
    if not ts or b <= a:
        return 0.0

    def at(t: float) -> float:
        if t <= ts[0]:
            return ws[0]
        if t >= ts[-1]:
            return ws[-1]
        hi = bisect.bisect_right(ts, t)
        lo = hi - 1
        f = (t - ts[lo]) / (ts[hi] - ts[lo]) if ts[hi] > ts[lo] else 0.0
        return ws[lo] + f * (ws[hi] - ws[lo])

    knots = [a, *(t for t in ts if a < t < b), b]
    pw = [at(t) for t in knots]
    return sum((pw[i] + pw[i + 1]) * 0.5 * (knots[i + 1] - knots[i]) for i in range(len(knots) - 1))


def pct(x: float | None, ref: float | None) -> str:
    if x is None or not ref:
        return "n/a"
    return f"{(x - ref) / ref * 100:+.2f}%"


def pctl(xs: Sequence[float], q: float) -> float:
    """Nearest-rank percentile."""
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))]


# --- nvidia-smi ----------------------------------------------------------------------------------------

SMI_FIELDS = ("power.draw", "power.draw.instant")


def parse_smi(
    lines: Sequence[tuple[float, str]], fields: Sequence[str]
) -> dict[str, tuple[list[float], list[float]]]:
    """nvidia-smi's `--format=csv,noheader,nounits` lines (its local-time timestamp, then `fields`), each
    with the time it arrived, as {field: (times, watts)}: the time is nvidia-smi's own where it parses,
    else the arrival's; values that are not numbers ("[N/A]") and lines of another shape are skipped."""
    out: dict[str, tuple[list[float], list[float]]] = {f: ([], []) for f in fields}
    for arrived, line in lines:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 1 + len(fields):
            continue
        try:
            ts = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        except ValueError:
            ts = arrived
        for f, v in zip(fields, parts[1:], strict=True):
            try:
                w = float(v)
            except ValueError:
                continue
            if math.isfinite(w):
                out[f][0].append(ts)
                out[f][1].append(w)
    return out


class SmiLog:
    """nvidia-smi sampling the GPU in the background. On a pseudo-terminal, so that it writes every line
    as it reads it (into a pipe it would buffer kilobytes, and lose them when stopped)."""

    def __init__(self, uuid: str, period_ms: int) -> None:
        self.fields = [f for f in SMI_FIELDS if _smi_has(uuid, f)]
        self.lines: list[tuple[float, str]] = []
        master, slave = pty.openpty()
        self.proc = subprocess.Popen(
            [
                "nvidia-smi",
                "-i",
                uuid,
                f"--query-gpu=timestamp,{','.join(self.fields)}",
                "--format=csv,noheader,nounits",
                "-lms",
                str(period_ms),
            ],
            stdin=subprocess.DEVNULL,
            stdout=slave,
            stderr=subprocess.DEVNULL,
        )
        os.close(slave)
        self._fd = master
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self._fd, 4096)
            except OSError:  # EIO: the other end closed
                break
            if not chunk:
                break
            buf += chunk
            *done, buf = buf.split(b"\n")
            now = time.time()
            self.lines.extend((now, x.decode("ascii", "replace").strip()) for x in done)

    def stop(self) -> dict[str, tuple[list[float], list[float]]]:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(5)
        os.close(self._fd)
        return parse_smi(self.lines, self.fields)


def _smi_has(uuid: str, query: str) -> bool:
    """Whether this nvidia-smi knows the field and gives a number for it (power.draw.instant is newer)."""
    p = subprocess.run(
        ["nvidia-smi", "-i", uuid, f"--query-gpu={query}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    try:
        return p.returncode == 0 and math.isfinite(float(p.stdout.strip()))
    except ValueError:
        return False


def smi_power_limit(uuid: str) -> float | None:
    p = subprocess.run(
        ["nvidia-smi", "-i", uuid, "--query-gpu=power.limit", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    try:
        return float(p.stdout.strip()) if p.returncode == 0 else None
    except ValueError:
        return None


# --- processes -----------------------------------------------------------------------------------------


def unpack_wheels(wheels: Path, into: Path) -> None:
    """Unpack every wheel in `wheels` into `into`: what pip's install does, for importing, without pip,
    an index or the network. Done again only when the wheelhouse changed."""
    names = sorted(p.name for p in wheels.glob("*.whl"))
    stamp = into / ".wheels.json"
    if stamp.exists() and json.loads(stamp.read_text()) == names:
        return
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    for name in names:
        with zipfile.ZipFile(wheels / name) as z:
            z.extractall(into)
    stamp.write_text(json.dumps(names))


def missing_modules(env: dict[str, str]) -> list[str]:
    code = (
        "import importlib.util, sys; "
        f"print(' '.join(m for m in {CLI_MODULES!r} if importlib.util.find_spec(m) is None))"
    )
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return p.stdout.split()


def cli_env() -> dict[str, str]:
    """The environment of cocaq's commands: the checkout first, the unpacked wheelhouse when this
    Python lacks cocaq's dependencies (only for these processes: the job and the hooks never see it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COCAQ_") and k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(ROOT)
    missing = missing_modules(env)
    if missing and any(WHEELS.glob("*.whl")):
        unpack_wheels(WHEELS, DEPS)
        env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{DEPS}"
        missing = missing_modules(env)
    if missing:
        fail(
            f"{sys.executable} lacks {', '.join(missing)} for cocaq's commands and {WHEELS} has no wheels"
            " for them: make the wheelhouse (docs/benchmarks/real-gpu-check.md) or use a Python that has them"
        )
    return env


@dataclass
class Run:
    env: dict[str, str]
    config: Path
    log: list[str] = field(default_factory=list)

    def cocaq(self, *args: str) -> str:
        """One `cocaq` command, as an admin would type it; its stdout (stderr kept for the log)."""
        argv = [sys.executable, "-m", "cocaq", "--config", str(self.config), *args]
        p = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=120)
        self.log.append(f"$ cocaq {' '.join(args)}\n{p.stderr.strip()}")
        if p.returncode != 0:
            fail(f"`cocaq {' '.join(args)}` exited {p.returncode}: {p.stderr.strip()[-800:]}")
        return p.stdout


def hook_env(kind: str, job_id: str, gpu: str, node: Path) -> dict[str, str]:
    """What slurmd gives a Prolog/Epilog (no PATH), and the hooks' settings cache in `node` (not root's
    /run/cocaq: the check leaves nothing behind)."""
    return {
        "SLURM_SCRIPT_CONTEXT": f"{kind}_slurmd",
        "SLURM_JOB_ID": job_id,
        "SLURM_JOB_USER": _user(),
        "SLURM_JOB_UID": str(os.getuid()),
        "SLURM_JOB_GID": str(os.getgid()),
        "SLURM_JOB_ACCOUNT": "gpucheck",
        "SLURM_JOB_PARTITION": "gpu",
        "SLURM_JOB_GPUS": gpu,
        "CUDA_VISIBLE_DEVICES": gpu,
        "SLURMD_NODENAME": NODE,
        "SLURM_CLUSTER_NAME": "gpucheck",
        "COCAQ_TEST_HOOK_CACHE_DIR": str(node / "hookcache"),
    }


def _user() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return "root"


def run_hook(shim: Path, env: dict[str, str]) -> float:
    """The shim from spawn to exit, as slurmd waits for it: wall ms."""
    t0 = time.perf_counter_ns()
    pid = os.posix_spawn("/bin/sh", ["/bin/sh", str(shim)], env)
    _, status, _ = os.wait4(pid, 0)
    ms = (time.perf_counter_ns() - t0) / 1e6
    if os.waitstatus_to_exitcode(status) != 0:
        fail(f"{shim.name} exited {status}")
    return ms


def warm_hook_settings(config: Path, cache: Path) -> None:
    """Fill the hooks' settings cache as the first hook after a config change does, so that the timed
    hooks cost what they cost on every later job."""
    from cocaq.prolog_epilog.shims import import_paths

    code = (
        f"import sys; sys.path[:0] = {import_paths()!r}; "
        f"from cocaq.prolog_epilog.hookconfig import load; load({str(config)!r})"
    )
    subprocess.run(
        [sys.executable, "-I", "-S", "-c", code], env={"COCAQ_TEST_HOOK_CACHE_DIR": str(cache)}, check=True
    )


def write_config(d: Path, node: Path, nvml: str, interval_s: float, tdp_w: float) -> Path:
    """A node's cocaq.toml in `node` (its spool and hook log there), the database d/cocaq.sqlite."""
    node.mkdir(parents=True, exist_ok=True)
    cfg = node / "cocaq.toml"
    cfg.write_text(
        f'database_url = "sqlite:///{d / "cocaq.sqlite"}"\n'
        f'spool_dir = "{node / "spool"}"\n'
        '[cluster]\nname = "gpucheck"\ntimezone = "UTC"\n'
        f"[partitions.gpu]\ngpu_tdp_w = {tdp_w:.0f}\n"
        "[collector]\n"
        f"interval_s = {interval_s}\n"
        "ship_interval_s = 5\n"
        'sources = ["nvml"]\n'
        f'nvml = "{nvml}"\n'
        f'hook_log = "{node / "hook.log"}"\n'
        f'annotate_dir = "{node / "annotations"}"\n'
    )
    return cfg


# The fake GPU: idle, then the two levels from `epoch` on (the workload's high phase starts there), then
# idle again; NVML's power reading the 1 s average, as Ampere (but GA100) and later give it.
FAKE_SPEC = """\
epoch = {epoch}
[[gpu]]
uuid = "GPU-fa4e0000-0000-4000-8000-00000000c0c0"
minor = 0
name = "NVIDIA H200 (fake)"
trace = "{trace}"
power_limit_w = 700.0
power_average_s = 1.0
energy_offset_mj = 123456789
"""


def fake_trace(path: Path, high_s: float, low_s: float) -> None:
    """A CSV trace (t_s, W): 70 W idle, ~600 W for high_s, ~250 W for low_s, 70 W for an hour; 1 s
    knots with a fixed ripple so the samples have something to miss."""
    rows = [(0.0, 70.0)]
    t = 0.0
    for level, secs in ((600.0, high_s), (250.0, low_s)):
        n = max(1, round(secs))
        for i in range(n):
            rows.append((t + 0.5, level + (25.0 if i % 3 == 0 else -12.0)))
            t += secs / n
        rows.append((t, level))
    rows += [(t + 0.5, 70.0), (t + 3600.0, 70.0)]
    path.write_text("t_s,power_w\n" + "".join(f"{a:.3f},{w:.1f}\n" for a, w in rows))


# --- the run -------------------------------------------------------------------------------------------


@dataclass
class Result:
    gpu: dict[str, Any]
    hooks_ms: dict[str, Any]
    phases: list[dict[str, Any]]
    stored: dict[str, Any]
    smi_fields: list[str]
    job_output: str
    notes: list[str] = field(default_factory=list)
    wall_s: float = 0.0


def sqlite_ts(v: str) -> float:
    """SQLAlchemy's SQLite DATETIME text (UTC) as Unix seconds."""
    return datetime.fromisoformat(v).replace(tzinfo=UTC).timestamp()


def open_gpu(a: argparse.Namespace, d: Path) -> tuple[str, GpuId, dict[str, Any], list[str]]:
    """(NVML spec, the GPU, what to print about it, notes); one line and exit 2 when there is none."""
    notes: list[str] = []
    spec = "pynvml"
    if a.fake:
        fake_trace(d / "trace.csv", a.high_s, a.low_s)
        (d / "fake-gpu.toml").write_text(FAKE_SPEC.format(epoch=time.time() + 3600, trace=d / "trace.csv"))
        spec = f"fake:{d / 'fake-gpu.toml'}"
    try:
        nvml = Nvml.open(spec)
    except NvmlUnavailable as exc:
        fail(f"no GPU here: {exc}")
    with nvml:
        devices = nvml.devices()
        if not devices:
            fail(f"no GPU here: NVML lists none ({'; '.join(nvml.errors) or 'no error'})")
        dev = next((g for g in devices if g.minor == a.gpu), None)
        if dev is None:
            fail(f"no GPU with minor number {a.gpu} (NVML lists {[g.minor for g in devices]})")
        if nvml.read(dev).energy_mj is None:
            notes.append("this GPU has no energy counter: the hooks store the power integral instead")
        gpu = {
            "name": dev.name,
            "uuid": dev.uuid,
            "minor": dev.minor,
            "driver": nvml.driver_version(),
            "power_limit_w": nvml.power_limit_w(dev),
            "nvml": spec if a.fake else _pynvml_version(),
        }
    if not a.fake:
        import importlib.util

        if importlib.util.find_spec("torch") is None:
            fail(f"no torch in {sys.executable} (PYTHON=... names another interpreter)")
    return spec, dev, gpu, notes


def workload_argv(a: argparse.Namespace, spec: str, uuid: str, out: Path, epoch: float) -> list[str]:
    argv = [sys.executable, str(ROOT / "bench" / "_gpu_workload.py"), "--uuid", uuid, "--nvml", spec]
    argv += ["--out", str(out), "--high-s", str(a.high_s), "--low-s", str(a.low_s), "--duty", str(a.duty)]
    if a.fake:
        argv += ["--fake", "--start-at", str(epoch)]
    if a.power_limit:
        argv += ["--power-limit", str(a.power_limit)]
    return argv


def run_job(
    a: argparse.Namespace, d: Path, run: Run, spec: str, dev: GpuId, notes: list[str]
) -> tuple[dict[str, Any], dict[str, tuple[list[float], list[float]]]]:
    """The collector and nvidia-smi around the job's prolog, workload and epilog, then the latency pairs;
    (hook wall times, nvidia-smi's series). The workload writes d/phases.json."""
    minor = str(dev.minor)
    smi = None
    if a.fake:
        notes.append("--fake: no nvidia-smi reading (fake NVML, no GPU)")
    elif shutil.which("nvidia-smi") is None:
        notes.append("nvidia-smi not found: no third reading")
    else:
        smi = SmiLog(dev.uuid, a.smi_ms)
    orig_limit = smi_power_limit(dev.uuid) if a.power_limit else None
    settle_s = max(2.0, 1.5 * a.interval)  # the collector's first cycle, before the job starts
    epoch = time.time() + settle_s + 1.0  # --fake: the trace's (and the job's) high phase from here
    if a.fake:  # (every process reads the spec afresh: the hooks and the collector start after this)
        (d / "fake-gpu.toml").write_text(FAKE_SPEC.format(epoch=epoch, trace=d / "trace.csv"))
    col_log = open(d / "collector.log", "w")  # noqa: SIM115 - closed below
    collector = subprocess.Popen(
        [sys.executable, "-m", "cocaq", "--config", str(run.config), "collector"],
        env=run.env,
        stdout=col_log,
        stderr=subprocess.STDOUT,
    )
    hooks: dict[str, Any] = {}
    try:
        time.sleep(settle_s)
        if collector.poll() is not None:
            fail(f"the collector exited {collector.returncode}: {(d / 'collector.log').read_text()[-800:]}")
        hooks["prolog"] = run_hook(d / "shims" / "cocaq-prolog", hook_env("prolog", JOB_ID, minor, d))
        job_env = {k: v for k, v in os.environ.items() if not k.startswith("COCAQ_")}
        job_env.update(CUDA_VISIBLE_DEVICES=dev.uuid, PYTHONPATH=str(ROOT))
        p = subprocess.run(
            workload_argv(a, spec, dev.uuid, d / "phases.json", epoch),
            env=job_env,
            capture_output=True,
            text=True,
            timeout=a.high_s + a.low_s + 180,
        )
        if p.returncode != 0:
            fail(f"the job failed ({p.returncode}): {(p.stderr or p.stdout).strip()[-800:]}")
        hooks["epilog"] = run_hook(d / "shims" / "cocaq-epilog", hook_env("epilog", JOB_ID, minor, d))
        hooks["pairs"] = {"prolog": [], "epilog": []}
        lat = d / "latency"
        for i in range(a.hook_pairs):
            for kind in ("prolog", "epilog"):
                e = hook_env(kind, str(int(JOB_ID) + 1 + i), minor, lat)
                hooks["pairs"][kind].append(run_hook(lat / "shims" / f"cocaq-{kind}", e))
        time.sleep(2.5 * a.interval)  # a cycle after the epilog: the collector sees the job gone
    finally:
        collector.send_signal(signal.SIGTERM)
        try:
            collector.wait(30)
        except subprocess.TimeoutExpired:
            collector.kill()
            collector.wait()
        col_log.close()
        smi_series = smi.stop() if smi is not None else {}
        if orig_limit is not None:
            limit = ["nvidia-smi", "-i", dev.uuid, "-pl", f"{orig_limit:.0f}"]
            subprocess.run(limit, capture_output=True, timeout=30)
    return hooks, smi_series


def sacct_record(t_start: float, t_end: float) -> str:
    """The job as `sacct --parsable2` gives it to `cocaq reconcile` on the head node (times in UTC, the
    cluster's time zone in the config)."""
    start = datetime.fromtimestamp(math.floor(t_start), UTC).strftime("%Y-%m-%dT%H:%M:%S")
    end = datetime.fromtimestamp(math.ceil(t_end), UTC).strftime("%Y-%m-%dT%H:%M:%S")
    elapsed = math.ceil(t_end) - math.floor(t_start)
    return (
        "JobID|JobIDRaw|JobName|User|UID|Account|Partition|QOS|NodeList|NNodes|AllocCPUS|AllocTRES|ReqMem"
        "|Submit|Start|End|ElapsedRaw|State|ExitCode|TotalCPU|Comment|ConsumedEnergyRaw\n"
        f"{JOB_ID}|{JOB_ID}|gpucheck|{_user()}|{os.getuid()}|gpucheck|gpu|normal|{NODE}|1|4"
        f"|cpu=4,gres/gpu=1,mem=0,node=1|0|{start}|{start}|{end}|{elapsed}|COMPLETED|0:0|||\n"
    )


def phase_figures(
    bounds: list[tuple[float, int | None]],
    power: tuple[list[float], list[float]],
    smi: dict[str, tuple[list[float], list[float]]],
) -> list[dict[str, Any]]:
    """Per phase and in all, the counter's energy and the integrals', between the (time, counter mJ)
    `bounds`: the prolog's reading, the job's own at its phases' edges, the epilog's."""
    cts, cws = power
    spans = [*zip(PHASES, bounds, bounds[1:], strict=False), ("total", bounds[0], bounds[-1])]
    rows = []
    for name, (ta, ea), (tb, eb) in spans:
        row: dict[str, Any] = {"phase": name, "seconds": tb - ta}
        row["counter_j"] = (eb - ea) / 1000.0 if ea is not None and eb is not None else None
        row["integral_j"] = integrate(cts, cws, ta, tb)
        row["integral_lag_j"] = integrate([t - LAG_S for t in cts], cws, ta, tb)
        for f, (sts, sws) in smi.items():
            row[f"smi_{f}_j"] = integrate(sts, sws, ta, tb) if sts else None
        rows.append(row)
    return rows


def check(a: argparse.Namespace) -> Result:
    t_begin = time.monotonic()
    if a.fake and a.power_limit:
        fail("--power-limit needs a real GPU")
    env = cli_env()
    with tempfile.TemporaryDirectory(prefix="cocaq-gpucheck-") as tmp:
        d = Path(a.keep) if a.keep else Path(tmp)
        d.mkdir(parents=True, exist_ok=True)
        spec, dev, gpu, notes = open_gpu(a, d)
        tdp_w = gpu["power_limit_w"] or 700.0
        run = Run(env, write_config(d, d, spec, a.interval, tdp_w))
        lat_cfg = write_config(d, d / "latency", spec, a.interval, tdp_w)
        for cfg, where in ((run.config, d), (lat_cfg, d / "latency")):
            run.cocaq("hook", "shims", "--dir", str(where / "shims"), "--hook-config", str(cfg))
            warm_hook_settings(cfg, where / "hookcache")
        run.cocaq("db", "upgrade")

        hooks, smi = run_job(a, d, run, spec, dev, notes)
        run.cocaq("collector", "--once")  # ships what the daemon had not yet
        job = json.loads((d / "phases.json").read_text())

        con = sqlite3.connect(d / "cocaq.sqlite")
        q = "SELECT event, payload FROM node_events WHERE job_id = ? AND event IN ('start', 'end')"
        events = {ev: json.loads(payload) for ev, payload in con.execute(q, (JOB_ID,))}
        if set(events) != {"start", "end"}:
            fail(f"the database has {sorted(events)} records of job {JOB_ID}, not its start and end")
        g0, g1 = events["start"]["gpus"][0], events["end"]["gpus"][0]
        hooks["in_hook"] = {"prolog": events["start"]["hook"]["ms"], "epilog": events["end"]["hook"]["ms"]}
        notes += [f"hook: {e}" for e in events["start"].get("errors", []) + events["end"].get("errors", [])]
        t_start, t_end = float(g0["ts"]), float(g1["ts"])
        q = "SELECT ts, value FROM samples WHERE source = 'nvml' AND metric = 'power_w' AND device = ?"
        inside = [
            (t, v)
            for t, v in ((sqlite_ts(s), v) for s, v in con.execute(q, (dev.uuid,)))
            if t_start < t < t_end
        ]
        inside.sort()
        con.close()
        # The collector's integral: the prolog's reading, its samples, the epilog's (NvmlSource's
        # nvml-power-integral, what it ships for a GPU without an energy counter).
        power = (
            [t_start, *(t for t, _ in inside), t_end],
            [float(g0["power_w"]), *(w for _, w in inside), float(g1["power_w"])],
        )

        (d / "sacct.txt").write_text(sacct_record(t_start, t_end))
        run.cocaq("import", "sacct", "--file", str(d / "sacct.txt"))
        run.cocaq("reconcile", "--no-sacct")
        run.cocaq("aggregate")
        job_out = run.cocaq("job", JOB_ID)

        con = sqlite3.connect(d / "cocaq.sqlite")
        q = "SELECT source, energy_j FROM node_energy WHERE job_id = ? AND component = 'gpu'"
        node_energy = con.execute(q, (JOB_ID,)).fetchall()
        q = (
            "SELECT je.source, je.method, je.energy_j FROM job_energy je JOIN jobs j ON j.id = je.job_pk"
            " WHERE j.job_id_raw = ? AND je.component = 'gpu'"
        )
        job_energy = con.execute(q, (int(JOB_ID),)).fetchall()
        con.close()

        edges = {e["at"]: e for e in job["edges"]}
        bounds = [
            (t_start, g0.get("energy_mj")),
            *((float(edges[k]["ts"]), edges[k]["energy_mj"]) for k in ("high", "low", "end")),
            (t_end, g1.get("energy_mj")),
        ]
        stored = {
            "node_energy": [{"source": s, "energy_j": e} for s, e in node_energy],
            "job_energy": [{"source": s, "method": m, "energy_j": e} for s, m, e in job_energy],
            "collector_samples_in_job": len(inside),
            "workload": job["info"],
        }
        if a.keep:
            (d / "commands.log").write_text("\n".join(run.log) + "\n")
        return Result(
            gpu,
            hooks,
            phase_figures(bounds, power, smi),
            stored,
            list(smi),
            job_out,
            notes,
            time.monotonic() - t_begin,
        )


def _pynvml_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"nvidia-ml-py {version('nvidia-ml-py')}"
    except PackageNotFoundError:
        return "pynvml (version unknown)"


def _commit() -> str:
    """The checkout's commit, for the figures' row in BENCHMARKS.md ("unknown" in a copy without .git)."""
    try:
        p = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        )
    except OSError:
        return "unknown"
    return p.stdout.strip() if p.returncode == 0 else "unknown"


def show(r: Result, a: argparse.Namespace) -> None:
    g = r.gpu
    print(f"run: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, commit {_commit()}, {sys.executable}")
    print(
        f"gpu: {g['name']} {g['uuid']} minor {g['minor']}, driver {g['driver']}, power limit"
        f" {g['power_limit_w']} W, {g['nvml']}; collector interval {a.interval:g} s"
    )
    h = r.hooks_ms
    print(
        f"hooks: prolog {h['prolog']:.1f} ms, epilog {h['epilog']:.1f} ms (wall, /bin/sh shim as slurmd runs"
        f" it); in the hook {h['in_hook']['prolog']:.1f} / {h['in_hook']['epilog']:.1f} ms"
    )
    for kind in ("prolog", "epilog"):
        xs = h["pairs"][kind]
        if xs:
            print(
                f"hooks: {kind} x{len(xs)}: median {statistics.median(xs):.1f} ms, p90 {pctl(xs, 90):.1f},"
                f" max {max(xs):.1f}"
            )
    cols = ["integral", f"integral@-{LAG_S:g}s"] + [f"smi:{f}" for f in r.smi_fields]
    head = f"{'phase':8s} {'s':>7s} {'counter J':>11s} {'mean W':>7s}"
    for c in cols:
        head += f" {c + ' J':>18s} {'vs counter':>10s}"
    print(head)
    for p in r.phases:
        c = p["counter_j"]
        line = f"{p['phase']:8s} {p['seconds']:7.2f} {c if c is not None else float('nan'):11.1f}"
        line += f" {(c or 0.0) / p['seconds'] if p['seconds'] > 0 else 0.0:7.1f}"
        for key in ["integral_j", "integral_lag_j"] + [f"smi_{f}_j" for f in r.smi_fields]:
            v = p.get(key)
            line += f" {v if v is not None else float('nan'):18.1f} {pct(v, c):>10s}"
        print(line)
    s = r.stored
    ne = ", ".join(f"{x['source']} {x['energy_j']:.1f} J" for x in s["node_energy"]) or "none"
    je = ", ".join(f"{x['method']} {x['source']} {x['energy_j']:.1f} J" for x in s["job_energy"]) or "none"
    print(f"stored: node_energy {ne}; job_energy {je}; {s['collector_samples_in_job']} collector samples")
    info = s["workload"]
    if info.get("torch"):
        print(
            f"job: {info['device']}, torch {info['torch']}: high {info.get('high_tflops')} TFLOPS,"
            f" low {info.get('low_tflops')} TFLOPS"
            + (f", power limit {info['power_limit']}" if "power_limit" in info else "")
        )
    for n in r.notes:
        print(f"note: {n}")
    print(f"--- cocaq job {JOB_ID}")
    print(r.job_output.rstrip())
    print(f"--- done in {r.wall_s:.1f} s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fake", action="store_true", help="cocaq's fake NVML, no torch, no nvidia-smi")
    p.add_argument("--gpu", type=int, default=0, help="the GPU's minor number (Slurm's index), default 0")
    p.add_argument("--high-s", type=float, default=40.0, help="seconds of the flat-out phase")
    p.add_argument("--low-s", type=float, default=40.0, help="seconds of the duty-cycled phase")
    p.add_argument("--duty", type=float, default=0.3, help="low phase: busy share of every 100 ms")
    p.add_argument("--power-limit", type=float, default=None, help="low phase under nvidia-smi -pl W (root)")
    p.add_argument("--interval", type=float, default=1.0, help="collector interval, s (default 1)")
    p.add_argument("--smi-ms", type=int, default=250, help="nvidia-smi's sampling period, ms")
    p.add_argument("--hook-pairs", type=int, default=20, help="more prolog/epilog pairs timed")
    p.add_argument("--keep", default=None, help="work in this directory and keep it (logs, database)")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    a = p.parse_args(argv)
    r = check(a)
    show(r, a)
    if a.json:
        a.json.write_text(json.dumps(dataclasses.asdict(r), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
