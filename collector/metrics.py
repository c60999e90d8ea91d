"""`[collector] metrics_listen`: the collector's Prometheus/OpenMetrics endpoint (prometheus_client).

Imported only when the endpoint is on, so the hooks and a collector without it never load
prometheus_client. After each cycle the daemon's main loop hands the cycle to `Exporter.update`, which
builds an immutable `Snapshot` (the per-job GPU, host-energy and core values of that cycle, with their
labels, and the collector's health) and swaps it in with one reference assignment. A scrape, in the HTTP
server's thread, reads only that reference: no NVML call, no spool or database access, no lock. Label
sets are made afresh from each cycle's running jobs, so a finished job's series are gone one cycle after
it leaves the spool. Metric and label names: the contract in docs/node-side.md.
"""

from __future__ import annotations

import contextlib
import logging
import math
import socket
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer, make_wsgi_app
from prometheus_client.registry import Collector as PromCollector
from prometheus_client.registry import CollectorRegistry

from cocaq.collector import annotation_files
from cocaq.collector.metrics_auth import Auth
from cocaq.collector.records import GPU_SOURCE_RANK, EnergyRow
from cocaq.collector.sources import Cycle
from cocaq.ml.meta import parse_comment

log = logging.getLogger("cocaq.collector")

JOB_LABELS = ("cluster", "node", "job_id", "user", "account", "partition", "model")
GPU_LABELS = (*JOB_LABELS, "gpu", "uuid")
HOST_LABELS = (*JOB_LABELS, "component")
NODE_LABELS = ("cluster", "node")
MAX_LABEL = 256  # what a label value may hold (the spool's strings are bounded already; this bounds ours)
# A job that has ended keeps its energy counters this long, at their final values (the epilog's counter
# reading, the integral closed at the epilog), so that a scrape every minute or two sees what the job used
# to its end; its gauges (power, utilisation, memory, cores) go at once, and then the counters go too.
ENDED_KEEP_S = 120.0

Key = tuple[str, str]  # ("gpu", uuid) or ("host", component)


def label(v: Any) -> str:
    """A label value: text, bounded, valid UTF-8 (a lone surrogate would fail the scrape's encoding)."""
    if v is None:
        return ""
    s = v if isinstance(v, str) else str(v)
    s = s[:MAX_LABEL]
    return s.encode("utf-8", "replace").decode("utf-8") if not s.isascii() else s


def _finite(v: Any) -> bool:
    try:
        return math.isfinite(v)
    except TypeError:
        return False


@dataclass(frozen=True)
class Health:
    """The collector's own state at the end of a cycle (what the daemon knows; read nowhere else)."""

    cycles: int = 0
    source_errors: int = 0
    sources: tuple[tuple[str, bool], ...] = ()  # (name, on)
    backlog: tuple[tuple[str, int], ...] = ()  # (events | samples | energy, records waiting)
    last_ship_ts: float | None = None
    last_sample_ts: float | None = None
    hook_failures: tuple[tuple[str, int], ...] = ()
    running_jobs: int = 0


@dataclass(frozen=True)
class Snapshot:
    """One cycle's values with their label values, ready to expose; never changed once made."""

    node_labels: tuple[str, str]
    gpu_power: tuple[tuple[tuple[str, ...], float], ...] = ()
    gpu_energy: tuple[tuple[tuple[str, ...], float], ...] = ()
    gpu_util: tuple[tuple[tuple[str, ...], float], ...] = ()
    gpu_mem: tuple[tuple[tuple[str, ...], float], ...] = ()
    host_energy: tuple[tuple[tuple[str, ...], float], ...] = ()
    cores: tuple[tuple[tuple[str, ...], float], ...] = ()
    health: Health = field(default_factory=Health)


def _family(cls: Any, name: str, doc: str, labels: tuple[str, ...], rows: Any) -> Metric:
    fam = cls(name, doc, labels=labels)
    for values, v in rows:
        fam.add_metric(values, v)
    return fam


class SnapshotCollector(PromCollector):
    """prometheus_client's custom collector over the last snapshot (one reference, swapped whole)."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        s = self.snapshot  # read once: a swap during this scrape does not mix two cycles
        G, C = GaugeMetricFamily, CounterMetricFamily
        yield _family(
            G,
            "cocaq_job_gpu_power_watts",
            "Last sampled power of the job's GPU (W).",
            GPU_LABELS,
            s.gpu_power,
        )
        yield _family(
            C,
            "cocaq_job_gpu_energy_joules",
            "The job's GPU energy since its start on this node (J), as shipped to node_energy.",
            GPU_LABELS,
            s.gpu_energy,
        )
        yield _family(
            G, "cocaq_job_gpu_utilization_ratio", "GPU utilisation, 0 to 1.", GPU_LABELS, s.gpu_util
        )
        yield _family(
            G, "cocaq_job_gpu_memory_used_bytes", "GPU memory in use (bytes).", GPU_LABELS, s.gpu_mem
        )
        yield _family(
            C,
            "cocaq_job_host_energy_joules",
            "The job's RAPL share since its start on this node (J), by component (cpu, dram).",
            HOST_LABELS,
            s.host_energy,
        )
        yield _family(
            G, "cocaq_job_cpu_cores", "Cores busy: cgroup CPU time over the interval.", JOB_LABELS, s.cores
        )
        h, nl = s.health, s.node_labels
        yield _family(G, "cocaq_collector_up", "1 while the collector runs.", NODE_LABELS, [(nl, 1.0)])
        yield _family(C, "cocaq_collector_cycles", "Sampling cycles done.", NODE_LABELS, [(nl, h.cycles)])
        yield _family(
            C,
            "cocaq_collector_source_errors",
            "Source failures (a cycle or a job's closing).",
            NODE_LABELS,
            [(nl, h.source_errors)],
        )
        yield _family(
            G,
            "cocaq_collector_source_up",
            "1 if the source is on, 0 if off (the log says why).",
            (*NODE_LABELS, "source"),
            [((*nl, name), 1.0 if on else 0.0) for name, on in h.sources],
        )
        yield _family(
            G,
            "cocaq_collector_spool_backlog_records",
            "Records in the spool waiting for the database, by kind.",
            (*NODE_LABELS, "kind"),
            [((*nl, kind), n) for kind, n in h.backlog],
        )
        yield _family(
            G,
            "cocaq_collector_last_ship_timestamp_seconds",
            "When the spool was last shipped without error (unix time).",
            NODE_LABELS,
            [(nl, h.last_ship_ts)] if h.last_ship_ts is not None else [],
        )
        yield _family(
            G,
            "cocaq_collector_last_sample_timestamp_seconds",
            "When the last cycle sampled (unix time).",
            NODE_LABELS,
            [(nl, h.last_sample_ts)] if h.last_sample_ts is not None else [],
        )
        yield _family(
            C,
            "cocaq_collector_hook_failures",
            "Prolog/Epilog failures the hooks could not even log to the spool, by kind.",
            (*NODE_LABELS, "kind"),
            [((*nl, kind), n) for kind, n in h.hook_failures],
        )
        yield _family(
            G,
            "cocaq_collector_running_jobs",
            "Jobs running on this node.",
            NODE_LABELS,
            [(nl, h.running_jobs)],
        )


class _QuietHandler(WSGIRequestHandler):
    timeout = 30  # a connection that sends nothing (or stalls its TLS handshake) frees its thread

    def log_message(self, format: str, *args: Any) -> None:
        """No line per scrape in the collector's log."""


class Exporter:
    """What the daemon holds when the endpoint is on: the registry, the server, the per-job model cache."""

    def __init__(self, cluster: str, node: str, annotate_dir: str) -> None:
        self.node_labels = (label(cluster), label(node))
        self.annotate_dir = annotate_dir
        self.collector = SnapshotCollector(Snapshot(self.node_labels))
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self.models: dict[tuple[str, float], str] = {}  # (job, start) -> model declared
        # the energy counters of the last cycle's running jobs, and of jobs ended less than
        # ENDED_KEEP_S ago (with when they go): job -> {key: (labels, t1, joules)}
        self.running: dict[str, dict[Key, tuple[tuple[str, ...], float, float]]] = {}
        self.ended: dict[
            str, tuple[float, dict[Key, tuple[tuple[str, ...], float, float]], dict[Key, int]]
        ] = {}
        self.sources: dict[tuple[str, Key], str] = {}  # (job, key) -> source of the running value
        self.server: Any = None
        self.thread: threading.Thread | None = None

    def serve(self, host: str, port: int, auth: Auth | None = None) -> None:
        """Listen on (host, port) in a daemon thread; raises OSError when it cannot.

        prometheus_client's start_http_server, except that the server's thread sleeps until a
        connection comes (its select wakes every 0.5 s otherwise: 0.02% of a core, as much as the
        scrapes); `close` wakes it with a connection of its own. `auth`: the bearer token every request
        must carry and the TLS context (cocaq.collector.metrics_auth). The TLS handshake is done in the
        request's thread (not at accept, where a client that stalls it would stop the server)."""
        auth = auth or Auth()
        family, _, _, _, sockaddr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]

        class Server(ThreadingWSGIServer):
            address_family = family

            def handle_error(self, request: Any, client_address: Any) -> None:
                """A client that hangs up, speaks HTTP to TLS or fails the handshake: no traceback."""
                log.debug("metrics: a request from %s failed", client_address[0] if client_address else "?")

        self.server = make_server(
            str(sockaddr[0]),
            port,
            auth.guard(make_wsgi_app(self.registry)),
            Server,
            handler_class=_QuietHandler,
        )
        if auth.tls is not None:
            self.server.socket = auth.tls.wrap_socket(
                self.server.socket, server_side=True, do_handshake_on_connect=False
            )
        self.thread = threading.Thread(
            target=self.server.serve_forever,
            kwargs={"poll_interval": None},
            name="cocaq-metrics",
            daemon=True,
        )
        self.thread.start()

    def close(self) -> None:
        """Stop serving: ask the loop to stop, and connect until it has seen the request (it sleeps
        in select until a connection comes), then close the socket."""
        srv, self.server = self.server, None
        if srv is None:
            return
        stopper = threading.Thread(target=srv.shutdown, daemon=True)
        stopper.start()
        host, port = srv.server_address[:2]
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
        for _ in range(50):
            with contextlib.suppress(OSError):
                socket.create_connection((host, port), timeout=0.5).close()
            stopper.join(0.1)
            if not stopper.is_alive():
                break
        srv.server_close()

    def _model(self, jid: str, start: float, st: Mapping[str, Any], uid: int | None) -> str:
        """The model the job declared, once per job: its annotation file, else its comment's `model=`."""
        key = (jid, start)
        got = self.models.get(key)
        if got is None:
            job = st.get("job")
            try:
                values, _mtime, _problems = annotation_files.read(self.annotate_dir, jid, uid)
                got = label((values or {}).get("model") or "")
            except Exception:  # the file is the user's: anything may be there, or nothing
                got = ""
            if not got:
                comment = job.get("comment") if isinstance(job, dict) else None
                got = label(parse_comment(comment if isinstance(comment, str) else None).get("model") or "")
            self.models[key] = got
        return got

    def _note_models(self, cycle: Cycle) -> None:
        """Take the models jobmeta read from annotation files this cycle; forget those of jobs gone."""
        for ev in cycle.events:  # what jobmeta read from a job's annotation file since the last cycle
            model = (ev.get("meta") or {}).get("api", {}).get("model") if isinstance(ev, dict) else None
            rj = cycle.jobs.get(str(ev.get("job_id")))
            if isinstance(model, str) and model and rj is not None:
                self.models[(rj.job_id, rj.start)] = label(model)
        live = {(j, rj.start) for j, rj in cycle.jobs.items()}
        for k in [k for k in self.models if k not in live]:
            del self.models[k]

    def update(
        self,
        cycle: Cycle,
        states: Mapping[str, Mapping[str, Any]],
        health: Health,
        ended_rows: Iterable[EnergyRow] = (),
    ) -> None:
        """Build this cycle's snapshot and swap it in (the daemon's thread; scrapes read the reference).

        `ended_rows`: the final energy rows of jobs that left the node since the last cycle, from their
        epilog records (the counter's reading at the end)."""
        self._note_models(cycle)
        nl = self.node_labels
        jl: dict[str, tuple[str, ...]] = {}
        gpu_index: dict[tuple[str, str], str] = {}
        for jid, rj in cycle.jobs.items():
            st = states.get(jid) or {}
            job: Mapping[str, Any] = st["job"] if isinstance(st.get("job"), dict) else {}
            jl[jid] = (
                *nl,
                label(jid),
                label(job.get("user")),
                label(job.get("account")),
                label(job.get("partition")),
                self._model(jid, rj.start, st, rj.uid),
            )
            for g in st.get("gpus") or []:
                if isinstance(g, dict) and isinstance(g.get("uuid"), str):
                    idx = g.get("slurm_index")
                    gpu_index[(jid, g["uuid"])] = "" if idx is None or isinstance(idx, bool) else label(idx)

        def gl(jid: str, uuid: str) -> tuple[str, ...]:
            return (*jl[jid], gpu_index.get((jid, uuid), ""), label(uuid))

        power, util, mem, cores = [], [], [], []
        for _ts, source, device, metric, owner, value in cycle.samples:
            if owner is None or owner not in jl or not _finite(value):
                continue
            if source == "nvml":
                if metric == "power_w":
                    power.append((gl(owner, device), value))
                elif metric == "util_pct":
                    util.append((gl(owner, device), value / 100.0))
                elif metric == "mem_used_mb":
                    mem.append((gl(owner, device), value * 1048576.0))
            elif source == "cgroup" and metric == "cpu_cores":
                cores.append((jl[owner], value))

        # the rows this cycle records for each job (the same ones collector.db ships); where a job has two
        # for one key (an epilog's closing row beside a running one), the later one, as the database keeps
        gpu_e: dict[tuple[str, str], tuple[float, float]] = {}
        host_e: dict[tuple[str, str], tuple[float, float]] = {}
        sources: dict[tuple[str, Key], str] = {}
        for r in cycle.energy:
            if r.job_id not in jl or not _finite(r.energy_j) or r.energy_j < 0:
                continue
            store, dev = (gpu_e, r.device) if r.component == "gpu" else (host_e, r.component)
            if r.component not in ("gpu", "cpu", "dram"):
                continue
            old = store.get((r.job_id, dev))
            if old is None or r.t1 >= old[0]:
                store[(r.job_id, dev)] = (r.t1, r.energy_j)
                sources[(r.job_id, ("gpu", dev) if r.component == "gpu" else ("host", dev))] = r.source
        self.sources = sources
        running: dict[str, dict[Key, tuple[tuple[str, ...], float, float]]] = {}
        for (j, u), (t1, e) in gpu_e.items():
            running.setdefault(j, {})[("gpu", u)] = (gl(j, u), t1, e)
        for (j, comp), (t1, e) in host_e.items():
            running.setdefault(j, {})[("host", comp)] = ((*jl[j], comp), t1, e)
        self._keep_ended(cycle, jl, running, ended_rows)
        kept = [(k, v) for _, vals, _ in self.ended.values() for k, v in vals.items()]
        self.collector.snapshot = Snapshot(
            nl,
            gpu_power=tuple(power),
            gpu_energy=tuple((gl(j, u), e) for (j, u), (_t, e) in gpu_e.items())
            + tuple((lab, e) for (kind, _), (lab, _t, e) in kept if kind == "gpu"),
            gpu_util=tuple(util),
            gpu_mem=tuple(mem),
            host_energy=tuple(((*jl[j], c), e) for (j, c), (_t, e) in host_e.items())
            + tuple((lab, e) for (kind, _), (lab, _t, e) in kept if kind == "host"),
            cores=tuple(cores),
            health=health,
        )

    def _keep_ended(
        self,
        cycle: Cycle,
        jl: Mapping[str, tuple[str, ...]],
        running: dict[str, dict[Key, tuple[tuple[str, ...], float, float]]],
        ended_rows: Iterable[EnergyRow],
    ) -> None:
        """Move the jobs that left since the last cycle to `ended`, bring their counters to their final
        values (this cycle's closing rows, the epilog's rows), and forget those ended ENDED_KEEP_S ago."""
        for jid, vals in self.running.items():
            if jid not in jl:
                ranks = {k: GPU_SOURCE_RANK.get(self.sources.get((jid, k), ""), 9) for k in vals}
                self.ended[jid] = (cycle.ts + ENDED_KEEP_S, dict(vals), ranks)
        for jid in [j for j in self.ended if j in jl]:  # the id runs again (requeued): one series each
            del self.ended[jid]
        for r in [*cycle.energy, *ended_rows]:
            got = self.ended.get(r.job_id)
            if got is None or not _finite(r.energy_j) or r.energy_j < 0:
                continue
            key: Key = ("gpu", r.device) if r.component == "gpu" else ("host", r.component)
            if r.component not in ("gpu", "cpu", "dram"):
                continue
            old = got[1].get(key)
            if old is None:  # (a GPU never seen running has no labels to use)
                continue
            # the job's final energy: the better source (the accounting's rank), else the later row
            rank = GPU_SOURCE_RANK.get(r.source, 9) if key[0] == "gpu" else 0
            if (rank, -r.t1) <= (got[2].get(key, 9), -old[1]):
                got[1][key] = (old[0], r.t1, r.energy_j)
                got[2][key] = rank
        for jid in [j for j, (until, _, _) in self.ended.items() if until < cycle.ts]:
            del self.ended[jid]
        self.running = running
