"""`cocaq collector`: sample every interval, spool, and ship the spool to the database.

Sampling never waits for the database: a cycle's samples, per-job energy and the sources' counters go
into `collector.db` in one transaction, and shipping is a separate step that may fail (database down)
without losing anything. After kill -9 the next start restores the counters from the same file and
carries on; a cycle half-written is not written at all.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import sys
import time
from typing import Any

from cocaq.collector import sources as sources_mod
from cocaq.collector.localdb import CollectorDB
from cocaq.collector.records import EnergyRow, stamp
from cocaq.collector.ship import ShipError, Target, connect, ship_once
from cocaq.collector.spool import running_jobs
from cocaq.config import Config

log = logging.getLogger("cocaq.collector")

# Sources in their own module (heavier imports): imported only when enabled, and they register themselves.
# They import `sources`, so `sources` cannot import them: the daemon does, before it builds the sources.
SOURCE_MODULES = {"jobmeta": "cocaq.collector.ml_meta_source"}


def node_name() -> str:
    return os.uname().nodename.split(".")[0]


# What Slurm may call a node (slurm.conf NodeName): the characters the hooks accept in SLURMD_NODENAME.
_SLURM_NODE = re.compile(r"[A-Za-z0-9._@+-]{1,128}")


def slurm_node_name(states: dict[str, dict[str, Any]]) -> str | None:
    """The node's name in Slurm (SLURMD_NODENAME), as the prologs of its running jobs recorded it."""
    for st in states.values():
        job = st.get("job")
        name = job.get("node") if isinstance(job, dict) else None
        if isinstance(name, str) and _SLURM_NODE.fullmatch(name):
            return name
    return None


def _running(
    spool_dir: str, now: float, states: dict[str, dict[str, Any]] | None = None
) -> dict[str, sources_mod.RunningJob]:
    """The running jobs from the prologs' states (`states`, when the caller has read them already)."""
    jobs = {}
    for jid, st in (running_jobs(spool_dir) if states is None else states).items():
        gpus, start_mj, start_power = [], {}, {}
        for g in st.get("gpus") or []:
            if isinstance(g, dict) and isinstance(g.get("uuid"), str):
                gpus.append(g["uuid"])
                if isinstance(g.get("energy_mj"), int):
                    start_mj[g["uuid"]] = g["energy_mj"]
                p, ts = g.get("power_w"), g.get("ts")
                if sources_mod.finite_number(p) and sources_mod.finite_number(ts) and p >= 0:
                    start_power[g["uuid"]] = (float(ts), float(p))
        start = st.get("ts")
        uid = st.get("job", {}).get("uid") if isinstance(st.get("job"), dict) else None
        jobs[jid] = sources_mod.RunningJob(
            jid,
            float(start) if isinstance(start, int | float) else now,
            gpus,
            start_mj,
            start_power,
            uid=uid if isinstance(uid, int) else None,
        )
    return jobs


class Collector:
    """One node's collector. With `[collector] metrics_listen` set (and `serve_metrics`), it also serves
    its last cycle to Prometheus (cocaq.collector.metrics); a failure to listen is logged, never fatal,
    but a token or TLS file that does not pass its checks stops the start (ConfigError)."""

    def __init__(self, cfg: Config, out: Any = None, *, serve_metrics: bool = True) -> None:
        auth = None
        if cfg.collector.metrics_listen:
            # its token and TLS files first, also with --once (which serves nothing): one that does not
            # pass is a ConfigError, and the collector does not start, rather than serve without them
            from cocaq.collector import metrics_auth

            cc = cfg.collector
            auth = metrics_auth.load(cc.metrics_token_file, cc.metrics_tls_cert_file, cc.metrics_tls_key_file)
        self.cfg = cfg
        self.out = out or sys.stderr
        self.node = node_name()
        self.db = CollectorDB(cfg.spool_dir, cfg.collector.spool_max_mb)
        if self.db.recovered_from:
            log.error(
                "spool: collector.db was unreadable; moved aside to %s, started a new one",
                self.db.recovered_from,
            )
        self.status: dict[str, str | None] = {}
        for name in cfg.collector.sources:
            if name not in sources_mod.REGISTRY and name in SOURCE_MODULES:
                import importlib

                importlib.import_module(SOURCE_MODULES[name])  # registers itself
        self.sources = sources_mod.build(cfg.collector, self._on_off)
        saved = self.db.get_state("sources") or {}
        for s in self.sources:
            try:
                s.restore(saved.get(s.name) or {})
            except (ValueError, TypeError, KeyError) as exc:
                log.warning("%s: saved state unusable, starting afresh: %s", s.name, exc)
        self.last_ts: float | None = self.db.get_state("last_ts")
        saved_node = self.db.get_state("node")
        if isinstance(saved_node, str) and _SLURM_NODE.fullmatch(saved_node):
            self.node = saved_node  # (Slurm's name for it, learnt from an earlier job's prolog)
        self.target: Target | None = None
        self.errors = 0
        self.cycles = 0
        self.hook_failures: dict[str, int] = {}
        self.last_ship_ts: float | None = None
        self.last_jobs: set[str] = set()  # the last cycle's running jobs (whose end the metrics keep)
        self.stop = False
        self.metrics: Any = None  # cocaq.collector.metrics.Exporter, when the endpoint is on
        if auth is not None and serve_metrics:
            self._start_metrics(cfg.collector.metrics_listen, auth)

    def _start_metrics(self, listen: str, auth: Any) -> None:
        """Serve the metrics endpoint; if it cannot listen, say why once and go on collecting."""
        from cocaq.config import parse_listen

        try:
            host, port = parse_listen(listen)
            from cocaq.collector.metrics import Exporter

            exporter = Exporter(self.cfg.cluster.name, self.node, self.cfg.collector.annotate_dir)
            exporter.serve(host, port, auth)
        except (OSError, ValueError, ImportError) as exc:
            log.error("metrics: not serving on %s: %s; collecting without them", listen, exc)
            return
        self.metrics = exporter
        how = ("https" if auth.tls else "http") + (", bearer token required" if auth.token else ", no token")
        log.info("metrics: serving on %s (%s)", listen, how)

    def _on_off(self, name: str, why: str | None) -> None:
        self.status[name] = why
        if why:
            log.warning("source %s is off: %s", name, why)
        else:
            log.info("source %s is on", name)

    def sample(self) -> sources_mod.Cycle:
        now = time.time()
        dt = now - self.last_ts if self.last_ts and 0 < now - self.last_ts < 3600 else None
        states = running_jobs(self.cfg.spool_dir)
        self._adopt_slurm_name(states)
        cycle = sources_mod.Cycle(ts=now, dt=dt, jobs=_running(self.cfg.spool_dir, now, states))
        for s in self.sources:
            try:
                s.collect(cycle)
            except Exception as exc:  # one source failing must not stop the others
                self.errors += 1
                log.error("source %s failed this cycle: %s: %s", s.name, type(exc).__name__, exc)
        self._hook_failures(cycle)
        # with metrics on, also the epilog records of the jobs that left since the last cycle: their final
        # counters stay on the endpoint a while (cocaq.collector.metrics.ENDED_KEEP_S)
        left = self.last_jobs - set(cycle.jobs) if self.metrics is not None else set()
        records = self._end_records(left)
        cycle.energy.extend(self._end_jobs(records))
        state = {"sources": {s.name: s.state() for s in self.sources}, "last_ts": now, "node": self.node}
        self.db.record_cycle(cycle.samples, cycle.energy, state)
        self._spool_events(cycle)
        self.db.finish_jobs(set(cycle.jobs))
        self.last_ts = now
        self.cycles += 1
        if self.metrics is not None:
            ended = []
            for rec in records:
                if rec.get("job_id") in left and rec.get("event") == "end":
                    for e in rec.get("energy") or []:
                        with contextlib.suppress(KeyError, TypeError, ValueError):
                            ended.append(EnergyRow.from_entry(rec["job_id"], e))
            self._update_metrics(cycle, states, ended)
        self.last_jobs = set(cycle.jobs)
        return cycle

    def _adopt_slurm_name(self, states: dict[str, dict[str, Any]]) -> None:
        """Take Slurm's name for the node where it is not the host's short name (NodeName vs NodeHostname):
        the hooks store what they measure under Slurm's name, the one sacct's NodeList uses, so with two
        names one node's GPUs and CPUs would be stored, and counted, twice."""
        name = slurm_node_name(states)
        if name is not None and name != self.node:
            log.warning(
                "node: Slurm calls this node %r (SLURMD_NODENAME), not %r: the collector's records use "
                "Slurm's name from now on",
                name,
                self.node,
            )
            self.node = name

    def _update_metrics(
        self, cycle: sources_mod.Cycle, states: dict[str, dict[str, Any]], ended: list[EnergyRow]
    ) -> None:
        """Swap in this cycle's metrics snapshot: the cycle's values and the collector's health."""
        from cocaq.collector.metrics import Health
        from cocaq.collector.spool import count_events

        try:
            # Samples leave collector.db only from the front (shipped, or the oldest dropped at the cap)
            # and go in with AUTOINCREMENT ids, so max - min + 1 is their count, read from the index.
            lo, hi = self.db.conn.execute("SELECT min(id), max(id) FROM samples").fetchone()
            energy = self.db.conn.execute(
                "SELECT count(*) FROM energy WHERE shipped_t1 IS NULL OR shipped_t1 < t1"
            ).fetchone()[0]
            health = Health(
                cycles=self.cycles,
                source_errors=self.errors,
                sources=tuple((n, why is None) for n, why in self.status.items()),
                backlog=(
                    ("events", count_events(self.cfg.spool_dir)),
                    ("samples", hi - lo + 1 if hi is not None else 0),
                    ("energy", int(energy)),
                ),
                last_ship_ts=self.last_ship_ts,
                last_sample_ts=cycle.ts,
                hook_failures=tuple(sorted(self.hook_failures.items())),
                running_jobs=len(cycle.jobs),
            )
            self.metrics.update(cycle, states, health, ended)
        except Exception as exc:  # the metrics must never stop the collection
            log.error("metrics: this cycle's not updated: %s: %s", type(exc).__name__, exc)

    def _end_records(self, also: set[str] | None = None) -> list[dict[str, Any]]:
        """The epilog records in the spool of the jobs a source waits on (to close an integral), and of
        the jobs in `also`."""
        from cocaq.collector import spool

        waiting = set().union(*(s.waiting_jobs() for s in self.sources)) if self.sources else set()
        waiting |= also or set()
        if not waiting:
            return []
        directory = os.path.join(self.cfg.spool_dir, spool.EVENTS)
        try:
            names = os.listdir(directory)
        except OSError:
            return []
        out = []
        for name in names:
            parts = name.split("-")  # {ts_ns}-{job_id}-end.json
            if len(parts) != 3 or parts[2] != "end.json" or parts[1] not in waiting:
                continue
            try:
                rec = json.loads(spool.read_bounded(os.path.join(directory, name)))
            except (OSError, ValueError) as exc:
                log.warning("spool: %s unreadable (%s); the ship will say more", name, exc)
                continue
            if isinstance(rec, dict):
                out.append(rec)
        return out

    def _end_jobs(self, records: list[dict[str, Any]]) -> list[EnergyRow]:
        """Final energy rows from the sources for the epilog records among `records`."""
        rows: list[EnergyRow] = []
        for rec in records:
            if rec.get("event") != "end":
                continue
            for s in self.sources:
                try:
                    rows.extend(s.end_job(rec))
                except Exception as exc:  # one source failing must not stop the others
                    self.errors += 1
                    log.error(
                        "source %s could not close job %s: %s: %s",
                        s.name,
                        rec.get("job_id"),
                        type(exc).__name__,
                        exc,
                    )
        return rows

    def _end_jobs_before_shipping(self, records: list[dict[str, Any]]) -> None:
        """Close what the epilog records about to ship end, so their final rows go in the same ship."""
        rows = self._end_jobs(records)
        if rows:
            self.db.record_cycle([], rows, {"sources": {s.name: s.state() for s in self.sources}})

    def _spool_events(self, cycle: sources_mod.Cycle) -> None:
        """The sources' records (`meta`) go to the spool beside the hooks', and ship the same way."""
        from cocaq.collector import spool

        for ev in cycle.events:
            stamp(ev, self.cfg.cluster.name, self.node, ev["job_id"])
            try:
                spool.write_event(self.cfg.spool_dir, ev)
            except (OSError, spool.SpoolError) as exc:
                log.error("spool: a %s record of job %s not written: %s", ev["event"], ev["job_id"], exc)

    def _hook_failures(self, cycle: sources_mod.Cycle) -> None:
        """The hooks count what they could not even log to the spool; report it as node samples."""
        import marshal

        from cocaq.collector.spool import read_bounded

        try:
            counts = marshal.loads(
                read_bounded(os.path.join(self.cfg.spool_dir, "hook-failures.marshal"), 65536)
            )
        except (OSError, EOFError, ValueError, TypeError):
            return
        if not isinstance(counts, dict):
            return
        for kind, n in counts.items():
            if isinstance(n, int):
                cycle.sample("hooks", "node", f"failures_{str(kind)[:20]}", n)
                if n > self.hook_failures.get(str(kind), 0):
                    log.warning("hooks: %d failure(s) of kind %s so far (see the hook log)", n, kind)
                self.hook_failures[str(kind)] = n

    def ship(self) -> Any:
        if self.target is None:
            try:
                self.target = connect(self.cfg.database_url)
            except ShipError as exc:
                log.warning("%s; the spool keeps everything", exc)
                return None
        res = ship_once(
            self.target,
            self.cfg.spool_dir,
            self.db,
            self.cfg.cluster.name,
            self.node,
            batch_size=self.cfg.collector.ship_batch,
            before_events=self._end_jobs_before_shipping,
        )
        for name, why in res.quarantined:
            log.error("spool: %s moved aside: %s", name, why)
        if not res.error:
            self.last_ship_ts = time.time()
        if res.error:
            log.warning("%s; the spool keeps the rest", res.error)
            self.target.close()
            self.target = None
        return res

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
        for s in self.sources:
            with contextlib.suppress(Exception):
                s.close()
        if self.target is not None:
            self.target.close()
        self.db.close()


def run_collector(
    cfg: Config, *, once: bool = False, interval_s: float | None = None, ship: bool = True
) -> None:
    c = Collector(cfg, serve_metrics=not once)
    interval = interval_s or cfg.collector.interval_s
    try:
        if once:
            cycle = c.sample()
            on = [n for n, why in c.status.items() if why is None]
            off = {n: why for n, why in c.status.items() if why}
            print(f"node {c.node}: sources on: {', '.join(on) or 'none'}", file=sys.stderr)
            for n, why in off.items():
                print(f"  off: {n}: {why}", file=sys.stderr)
            print(
                f"sampled {len(cycle.samples)} values for {len(cycle.jobs)} running jobs",
                file=sys.stderr,
            )
            if ship:
                res = c.ship()
                print(res.summary() if res else "not shipped: database unreachable", file=sys.stderr)
            return

        def _term(signum: int, frame: Any) -> None:
            c.stop = True

        signal.signal(signal.SIGTERM, _term)
        signal.signal(signal.SIGINT, _term)
        next_tick = time.monotonic()
        next_ship = next_tick
        while not c.stop:
            c.sample()
            now = time.monotonic()
            if ship and now >= next_ship:
                c.ship()
                next_ship = now + cfg.collector.ship_interval_s
            next_tick += interval
            if next_tick < time.monotonic():  # fell behind (suspended, slow disk): skip, don't burst
                next_tick = time.monotonic() + interval
            while not c.stop and time.monotonic() < next_tick:
                time.sleep(min(0.5, max(next_tick - time.monotonic(), 0.0)))
    finally:
        c.close()
