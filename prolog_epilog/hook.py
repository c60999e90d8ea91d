"""`cocaq-hook`: Slurm's Prolog/Epilog (and PrologSlurmctld/EpilogSlurmctld) for cocaq.

Runs as root on every job start and end, so it must be fast, never wait for the database, and never
exit non-zero (a failing epilog drains the node). It snapshots the energy counters of the job's GPUs
(and RAPL), writes one record to the local spool, and logs one line. Every failure is logged, counted
and carried in the record's `errors`; the exit status is always 0.

Usage: cocaq-hook [--config FILE] [prolog|epilog|prologslurmctld|epilogslurmctld]
(without a kind, SLURM_SCRIPT_CONTEXT decides).
"""

from __future__ import annotations

import _signal
import os
import sys
import time

from cocaq.units import MILLIJOULES_PER_J, MS_PER_S

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cocaq.collector.records import EnergyRow

DEFAULT_TIMEOUT_S = 10.0
MAX_RAPL_ZONES = 64
EDGES_MAX_S = 60.0  # a GPU without an energy counter: the prolog/epilog readings alone, up to this long


class _Timeout(Exception):
    pass


def _on_alarm(signum: int, frame: Any) -> None:
    raise _Timeout()


def _log(path: str, line: str) -> None:
    """Append one line to the hook log; fall back to syslog when the log cannot be written."""
    data = (time.strftime("%Y-%m-%dT%H:%M:%S%z") + " " + line.replace("\n", " ") + "\n").encode(
        "utf-8", "replace"
    )
    try:
        d = os.path.dirname(path)
        if d and not os.path.isdir(d):
            os.makedirs(d, mode=0o755, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    except OSError:
        try:
            import syslog

            syslog.openlog("cocaq-hook", 0, syslog.LOG_DAEMON)
            syslog.syslog(syslog.LOG_WARNING, line[:2000])
        except Exception:  # nowhere left to report to
            pass


def _count_failure(spool_dir: str, what: str) -> None:
    """Bump a per-kind failure counter that the collector reports; best effort (the disk may be full)."""
    import marshal

    try:
        from cocaq.collector.spool import ensure_dir, read_bounded, write_atomic

        # The failure may be this spool (a symlink, not ours): ensure_dir refuses to write through it.
        ensure_dir(spool_dir, 0o755)
        path = os.path.join(spool_dir, "hook-failures.marshal")
        try:
            counts = marshal.loads(read_bounded(path, 65536))
            if not isinstance(counts, dict):
                counts = {}
        except (OSError, EOFError, ValueError, TypeError):
            counts = {}
        counts[what] = int(counts.get(what, 0)) + 1
        write_atomic(spool_dir, "hook-failures.marshal", marshal.dumps(counts))
    except Exception:
        pass


def _parse_args(argv: list[str]) -> tuple[str | None, str | None]:
    config = kind = None
    it = iter(argv)
    for a in it:
        if a == "--config":
            config = next(it, None)
        elif a.startswith("--config="):
            config = a.split("=", 1)[1]
        elif not a.startswith("-") and kind is None:
            kind = a
        else:
            raise ValueError(f"unexpected argument {a!r}")
    return config, kind


def _gpu_snapshot(
    spec: str, job: Any, saved: list[dict[str, Any]] | None, errors: list[str]
) -> list[dict[str, Any]]:
    """Read the energy counters of the job's GPUs: by Slurm's list at start, by the saved UUIDs at end."""
    gpus_var = job.get("gpus")
    if saved is None and not gpus_var and not job.get("cuda_visible_devices"):
        return []
    if saved is not None and not saved:
        return []
    from cocaq.collector.nvml import Nvml, NvmlUnavailable

    try:
        nvml = Nvml.open(spec)
    except NvmlUnavailable as exc:
        errors.append(str(exc))
        return []
    try:
        out = []
        if saved is None:
            devices, problems = nvml.resolve(gpus_var, job.get("cuda_visible_devices"))
            errors.extend(problems)
            pairs = [(d, {"slurm_index": None}) for d in devices]
        else:
            pairs = []
            for g in saved:
                d = nvml.find(str(g.get("uuid")))
                if d is None:
                    errors.append(f"nvml: GPU {g.get('uuid')} (minor {g.get('minor')}) is gone")
                    continue
                pairs.append((d, {"slurm_index": g.get("slurm_index")}))
        for dev, extra in pairs:
            r = nvml.read(dev, energy_only=True)
            if r.error:
                errors.append(f"nvml: {dev.uuid}: {r.error}")
            out.append(
                {
                    "slurm_index": extra["slurm_index"] if extra["slurm_index"] is not None else dev.minor,
                    "uuid": dev.uuid,
                    "pci_bus_id": dev.pci_bus_id,
                    "minor": dev.minor,
                    "index": dev.index,
                    "name": dev.name,
                    "energy_mj": r.energy_mj,
                    "power_w": r.power_w,
                    "gone": r.gone,
                    "ts": r.ts,
                }
            )
        return out
    finally:
        try:
            nvml.close()
        except Exception:
            pass


def _read_small(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        return os.read(fd, 64)
    finally:
        os.close(fd)


def _rapl_snapshot(sysfs_root: str, errors: list[str]) -> dict[str, int]:
    """Raw RAPL counters (µJ) by powercap zone; interpreting them (wraps, psys) is the collector's job."""
    base = os.path.join(sysfs_root, "class", "powercap")
    out: dict[str, int] = {}
    try:
        zones = sorted(os.listdir(base))[:MAX_RAPL_ZONES]
    except OSError:
        return out  # no RAPL on this node: normal, the collector reports it
    for z in zones:
        if not z.startswith("intel-rapl:"):
            continue
        try:
            out[z] = int(_read_small(os.path.join(base, z, "energy_uj")))
        except (OSError, ValueError) as exc:
            errors.append(f"rapl: {z}: {exc}")
    return out


def _gpu_energy(
    job_id: str, start: dict[str, Any], end: list[dict[str, Any]], errors: list[str]
) -> list[dict[str, Any]]:
    """Exact per-GPU energy from the counters at start and end; nothing where that is not possible."""
    from cocaq.collector.records import EnergyRow

    t0 = float(start["ts"])
    before = {g["uuid"]: g for g in start.get("gpus", []) if isinstance(g, dict) and "uuid" in g}
    out = []
    for g in end:
        b = before.get(g["uuid"])
        if b is None:
            continue
        e0, e1 = b.get("energy_mj"), g.get("energy_mj")
        if e0 is None or e1 is None:
            # No counter (or lost): the collector integrates the sampled power, from the prolog's
            # reading to this one. A job too short to be sure of a sample gets the trapezoid of the
            # two readings too, which is used only where the collector has nothing for this GPU.
            edges = _edges_energy(job_id, t0, b, g)
            if edges is not None:
                out.append(edges.entry())
            continue
        if e1 < e0:
            errors.append(f"nvml: {g['uuid']}: energy counter went back ({e0} -> {e1} mJ): driver reset?")
            continue
        dt = max(float(g["ts"]) - float(b.get("ts", t0)), 1e-3)
        joules = (e1 - e0) / MILLIJOULES_PER_J
        if joules / dt > 3000.0:
            errors.append(f"nvml: {g['uuid']}: implausible {joules / dt:.0f} W average; energy dropped")
            continue
        row = EnergyRow(
            job_id,
            t0,
            "gpu",
            g["uuid"],
            "nvml",
            "measured",
            joules,
            float(b.get("ts", t0)),
            float(g["ts"]),
            True,
        )
        out.append(row.entry())
    return out


def _num(v: object) -> float | None:
    """A finite number from a record, else None (a record is JSON: anything may be there)."""
    if isinstance(v, int | float) and not isinstance(v, bool) and v - v == 0:
        return float(v)
    return None


def _edges_energy(job_id: str, job_start: float, b: dict[str, Any], g: dict[str, Any]) -> EnergyRow | None:
    """The trapezoid between the prolog's and the epilog's power readings of one GPU, for a job of at
    most EDGES_MAX_S (longer, two readings say little of what happened in between)."""
    p0, p1, t0, t1 = _num(b.get("power_w")), _num(g.get("power_w")), _num(b.get("ts")), _num(g.get("ts"))
    if p0 is None or p1 is None or t0 is None or t1 is None:
        return None
    if not 0.0 < t1 - t0 <= EDGES_MAX_S or not 0.0 <= p0 <= 3000.0 or not 0.0 <= p1 <= 3000.0:
        return None
    from cocaq.collector.records import EnergyRow

    energy_j = (p0 + p1) * 0.5 * (t1 - t0)
    return EnergyRow(
        job_id, job_start, "gpu", g["uuid"], "nvml-power-edges", "measured", energy_j, t0, t1, True
    )


def _prepare_annotations(cfg: dict[str, Any], job: Any, errors: list[str]) -> None:
    """The job's empty, user-owned file for `cocaq.annotate`/`cocaq tag` (a failure is a warning)."""
    uid, gid = job.get("uid"), job.get("gid")
    if uid is None or gid is None:
        errors.append("annotations: no SLURM_JOB_UID/GID: no annotation file for this job")
        return
    try:
        from cocaq.collector.annotation_files import prepare

        prepare(cfg["annotate_dir"], job.job_id, uid, gid)
    except (OSError, ValueError) as exc:
        errors.append(f"annotations: {exc}")


def _read_annotations(cfg: dict[str, Any], job: Any, errors: list[str]) -> dict[str, Any] | None:
    """A `meta` spool record of what the job declared from inside (None when nothing); the file goes."""
    directory = cfg["annotate_dir"]  # hookconfig always gives it (the default when unset)
    path = os.path.join(directory, f"{job.job_id}.json")
    try:  # most jobs declare nothing: their file is as the prolog left it, and costs no imports
        st = os.lstat(path)
        if st.st_size == 0 and (st.st_mode & 0o170000) == 0o100000:
            os.unlink(path)
            return None
    except FileNotFoundError:
        return None
    except OSError:
        pass  # annotation_files.read says why
    from cocaq.collector import annotation_files

    try:
        values, mtime, problems = annotation_files.read(directory, job.job_id, job.get("uid"))
        errors.extend(problems)
    finally:
        try:
            annotation_files.remove(directory, job.job_id)
        except (OSError, ValueError) as exc:
            errors.append(f"annotations: {exc}")
    if not values:
        return None
    from cocaq.collector.records import meta_event

    return meta_event({"api": values, "api_ts": mtime}, time.time_ns())


def main(argv: list[str] | None = None) -> int:
    t_start = time.monotonic()
    args = sys.argv[1:] if argv is None else argv
    log_path = "/var/log/cocaq/hook.log"
    spool_dir = os.environ.get("COCAQ_SPOOL_DIR", "/var/spool/cocaq")
    job_id = "?"
    kind = "?"
    errors: list[str] = []
    old = _signal.signal(_signal.SIGALRM, _on_alarm)
    _signal.setitimer(_signal.ITIMER_REAL, DEFAULT_TIMEOUT_S)
    try:
        from cocaq.collector import records, spool
        from cocaq.prolog_epilog.hookconfig import load
        from cocaq.prolog_epilog.slurmenv import read_env

        config_path, kind_arg = _parse_args(args)
        kind = kind_arg or os.environ.get("SLURM_SCRIPT_CONTEXT", "?")[:32]
        cfg, problems = load(config_path)
        errors.extend(problems)
        log_path = cfg["hook_log"]
        spool_dir = cfg["spool_dir"]
        job = read_env(kind_arg)
        job_id, kind = job.job_id, job.kind
        errors.extend(job.problems)
        node = job.get("node") or os.uname().nodename.split(".")[0]
        cluster = cfg["cluster"]
        if cluster == "cluster" and job.get("cluster"):
            cluster = job.get("cluster")
        event = records.hook_event_kind(kind)
        record = records.hook_event(event, cluster, node, job_id, time.time_ns(), job.fields)
        src = cfg["sources"]
        if kind == "prolog":
            gpus = _gpu_snapshot(cfg["nvml"], job, None, errors) if "nvml" in src else []
            record["gpus"] = gpus
            if "rapl" in src:
                record["rapl_uj"] = _rapl_snapshot(cfg["sysfs_root"], errors)
            state = {
                "job_id": job_id,
                "ts": record["ts"],
                "uid": record["uid"],
                "gpus": gpus,
                "job": job.fields,
            }
            spool.write_job_state(spool_dir, job_id, state)
            _prepare_annotations(cfg, job, errors)
        elif kind == "epilog":
            try:
                start = spool.read_job_state(spool_dir, job_id)
            except (OSError, spool.SpoolError) as exc:
                errors.append(f"prolog state unreadable: {exc}")
                start = None
            if start is None:
                errors.append("no prolog record for this job on this node: no exact GPU energy")
            saved = start.get("gpus", []) if start else None
            gpus = _gpu_snapshot(cfg["nvml"], job, saved, errors) if "nvml" in src else []
            record["gpus"] = gpus
            if "rapl" in src:
                record["rapl_uj"] = _rapl_snapshot(cfg["sysfs_root"], errors)
            if start is not None:
                record["job_start"] = float(start["ts"])
                record["energy"] = _gpu_energy(job_id, start, gpus, errors)
        record["errors"] = errors[:50]
        record["hook"] = {
            "kind": kind,
            "version": records.VERSION,
            "ms": round((time.monotonic() - t_start) * MS_PER_S, 2),
        }
        # The energy record first: nothing optional (what the user declared from inside the job) may
        # keep it from the spool.
        spool.write_event(spool_dir, record)
        if kind == "epilog":
            try:
                meta = _read_annotations(cfg, job, errors)
                if meta is not None:
                    spool.write_event(spool_dir, records.stamp(meta, cluster, node, job_id))
            except Exception as exc:  # a user's file: its failure is logged, no more
                errors.append(f"annotations: {type(exc).__name__}: {str(exc)[:200]}")
            spool.remove_job_state(spool_dir, job_id)
        _signal.setitimer(_signal.ITIMER_REAL, 0)
        ms = (time.monotonic() - t_start) * MS_PER_S
        line = f"{kind} job={job_id} ok {ms:.1f}ms gpus={len(record.get('gpus', []))}"
        if errors:
            line += f" warnings={len(errors)}: " + "; ".join(errors)[:1500]
        _log(log_path, line)
    except _Timeout:
        _log(log_path, f"{kind} job={job_id} FAILED: timed out after {DEFAULT_TIMEOUT_S:.0f}s")
        _count_failure(spool_dir, "timeout")
    except BaseException as exc:  # a hook must never fail the job or drain the node
        _signal.setitimer(_signal.ITIMER_REAL, 0)
        what = f"{type(exc).__name__}: {exc}"
        ms = (time.monotonic() - t_start) * MS_PER_S
        _log(log_path, f"{kind} job={job_id} FAILED after {ms:.1f}ms: {what}"[:2000])
        _count_failure(spool_dir, type(exc).__name__)
    finally:
        _signal.setitimer(_signal.ITIMER_REAL, 0)
        _signal.signal(_signal.SIGALRM, old)
    return 0


def console() -> None:
    """The `cocaq-hook` console script: always exits 0."""
    main()
    sys.stdout.flush()
    os._exit(0)
