"""Configuration: a TOML file overridden by COCAQ_* environment variables.

Lookup order for the file: `--config`, then `$COCAQ_CONFIG`, then `/etc/cocaq/cocaq.toml` (if present).
Environment variables override single keys: `COCAQ_DATABASE_URL`, `COCAQ_CLUSTER__PUE`,
`COCAQ_ESTIMATE__GPU_UTILISATION` (`__` separates a section from its key); `COCAQ_SMTP_HOST` and
`COCAQ_SMTP_PORT` are short for `COCAQ_MAIL__SMTP_HOST` and `COCAQ_MAIL__SMTP_PORT` (and win over them).
"""

from __future__ import annotations

import fnmatch
import itertools
import logging
import math
import os
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cocaq.errors import CocaqError, ConfigError
from cocaq.ml.annotation import DEFAULT_DIR as ANNOTATE_DIR

log = logging.getLogger(__name__)

DEFAULT_CONFIG_PATH = Path("/etc/cocaq/cocaq.toml")
# COCAQ_* variables that are not settings of this file, each with what it does (for
# docs/configuration.md): the config file itself, the job side's annotation directory
# (cocaq.ml.annotation), the collector's /proc for tests, the MUNGE backend (cocaq.api.munge).
_NON_SETTING_ENV = {
    "COCAQ_CONFIG": "the config file to read (as `--config FILE`; default /etc/cocaq/cocaq.toml)",
    "COCAQ_ANNOTATE_DIR": "where `cocaq.annotate` and `cocaq tag` write a job's file (wins over "
    "`[collector] annotate_dir`)",
    "COCAQ_PROC_ROOT": "the collector's /proc (tests point it at a fixture tree)",
    "COCAQ_MUNGE_BACKEND": "`library` or `binary`: force how the API reads MUNGE credentials",
}
_NON_SETTING_PREFIXES = ("COCAQ_TEST_", "COCAQ_BENCH_")
# The sections that `COCAQ_SECTION__KEY` may set (partitions and node groups only in the file).
ENV_SECTIONS = (
    "cluster", "estimate", "defaults", "collector", "carbon", "embodied", "aggregate",
    "mail", "reports", "api", "advice", "alerts", "slurm",
)  # fmt: skip
# Short variables for the keys set most often, and the key each one sets (`_apply_env`); a short one
# wins over its `COCAQ_SECTION__KEY` form where both are set, except COCAQ_CLUSTER and COCAQ_API_URL.
ENV_SHORTHANDS = {
    "COCAQ_DATABASE_URL": "database_url",
    "COCAQ_SPOOL_DIR": "spool_dir",
    "COCAQ_CLUSTER": "cluster.name",
    "COCAQ_API_URL": "api.url",
    "COCAQ_SMTP_HOST": "mail.smtp_host",
    "COCAQ_SMTP_PORT": "mail.smtp_port",
}
# Every setting below carries a one-line description in its field's metadata ("doc"), from which
# `python -m cocaq.config_reference` writes docs/configuration.md; "default_doc" replaces a default that
# depends on the machine, "toml" names a setting whose place in the file differs from the model's.


def default_database_url() -> str:
    from platformdirs import user_data_dir

    return "sqlite:///" + str(Path(user_data_dir("cocaq")) / "cocaq.sqlite")


@dataclass(frozen=True)
class Hardware:
    """What a partition's or node group's nodes are made of; drives estimates when nothing is measured."""

    cpu_model: str = field(default="unknown CPU", metadata={"doc": "the CPU's name, as reported"})
    cpu_tdp_w_per_core: float = field(
        default=12.0,
        metadata={"doc": "rated power per core, W (Green Algorithms' figure for an unknown core)"},
    )
    gpu_model: str = field(
        default="unknown GPU", metadata={"doc": "the GPU's name; also a fallback for calibrated estimates"}
    )
    gpu_tdp_w: float = field(default=300.0, metadata={"doc": "rated power of one GPU, W"})
    mem_gb: float = field(
        default=0.0, metadata={"doc": "memory per node, GB, for the report only (estimates use the request)"}
    )
    gpu_mem_gb: float = field(
        default=0.0, metadata={"doc": "memory of one GPU, GB (0: unknown), to tell a job how much it used"}
    )
    carbon_zone: str | None = field(default=None, metadata={"doc": "overrides the cluster's carbon zone"})
    pue: float | None = field(default=None, metadata={"doc": "overrides the cluster's PUE (1 to 5)"})


@dataclass(frozen=True)
class NodeGroup:
    """Nodes that differ from their partition's hardware: `[node_groups.NAME]`, a Hardware plus `nodes`."""

    name: str
    nodes: tuple[str, ...] = field(
        metadata={"doc": "the group's nodes: glob patterns or Slurm host lists (`gpu[01-08]`)"}
    )
    hardware: Hardware

    def matches(self, node: str) -> bool:
        from cocaq.hostlist import expand_hostlist

        for pat in self.nodes:
            if "[" in pat:
                if node in expand_hostlist(pat):
                    return True
            elif fnmatch.fnmatchcase(node, pat):
                return True
        return False


@dataclass(frozen=True)
class Estimate:
    """How a job's energy is estimated where nothing measured it."""

    gpu_utilisation: float = field(
        default=1.0,
        metadata={"doc": "share of GPU TDP drawn when nothing was measured, 0 to 1 (Green Algorithms: 1)"},
    )
    mem_w_per_gb: float = field(
        default=0.3725, metadata={"doc": "W per GB of requested memory (Green Algorithms' figure)"}
    )
    cpu_usage: str = field(
        default="totalcpu",
        metadata={"doc": '"totalcpu": the CPU time used; "allocated": allocated cores x elapsed'},
    )
    max_node_power_w: float = field(
        default=20_000.0,
        metadata={
            "doc": "Slurm's ConsumedEnergy above nodes x elapsed x this is implausible: dropped at import, "
            "estimated instead"
        },
    )
    calibrate: bool = field(
        default=True,
        metadata={
            "doc": "GPUs that nothing measured: W per GPU from the site's measured jobs of the same model "
            "(cocaq calibrate); false: always TDP x gpu_utilisation"
        },
    )
    calibrate_min_jobs: int = field(
        default=5, metadata={"doc": "jobs a cell of the learnt table needs before an estimate uses it"}
    )
    calibrate_buckets: tuple[float, ...] = field(
        default=(25.0, 50.0, 75.0),
        metadata={"doc": "GPU utilisation bucket edges, %: increasing, between 0 and 100 (exclusive)"},
    )


@dataclass(frozen=True)
class Cluster:
    """The cluster as a whole: its name, clock, carbon zone and PUE."""

    name: str = field(default="cluster", metadata={"doc": "the cluster's name (sacct's cluster, reports)"})
    timezone: str | None = field(
        default=None,
        metadata={
            "doc": "time zone of the times in sacct's text output and of the schedule; unset: this machine's"
        },
    )
    carbon_zone: str = field(
        default="WORLD",
        metadata={
            "doc": "ISO3 country, USA-CA, CAN-QC, SE3, an Electricity Maps zone of imported series, or WORLD"
        },
    )
    pue: float = field(default=1.0, metadata={"doc": "power usage effectiveness, 1 to 5"})


COLLECTOR_SOURCES = ("nvml", "rapl", "cgroup", "pm_counters", "jobmeta")
IDLE_POLICIES = ("allocated", "cputime", "none")


@dataclass(frozen=True)
class Collector:
    """The node side: hooks and the collector daemon (see docs/node-side.md)."""

    interval_s: float = field(default=10.0, metadata={"doc": "seconds between samples, 1 to 3600"})
    ship_interval_s: float = field(
        default=60.0, metadata={"doc": "seconds between shipments of the spool to the database"}
    )
    sources: tuple[str, ...] = field(
        default=("nvml", "rapl", "cgroup", "jobmeta"),
        metadata={"doc": "what to sample: nvml, rapl, cgroup, pm_counters (HPE Cray), jobmeta"},
    )
    nvml: str = field(
        default="pynvml",
        metadata={"doc": '"pynvml", or "fake:N" / "fake:/path/spec.toml" (tests, demo, benchmarks)'},
    )
    sysfs_root: str = field(default="/sys", metadata={"doc": "where sysfs is (RAPL, cgroups)"})
    idle_policy: str = field(
        default="allocated",
        metadata={
            "doc": "who pays a node's idle RAPL energy: allocated, cputime or none (docs/node-side.md)"
        },
    )
    idle_baseline_w: float | None = field(
        default=None, metadata={"doc": "idle power per RAPL domain, W; unset: learnt (lowest power seen)"}
    )
    spool_max_mb: float = field(
        default=512.0, metadata={"doc": "the most the spool may hold while the database is away, MB"}
    )
    ship_batch: int = field(default=5000, metadata={"doc": "rows per shipment"})
    hook_log: str = field(default="/var/log/cocaq/hook.log", metadata={"doc": "the Prolog/Epilog hooks' log"})
    annotate_dir: str = field(
        default=ANNOTATE_DIR,
        metadata={"doc": "where jobs' `cocaq.annotate`/`cocaq tag` files live (root's 0711 directory)"},
    )
    detect_interval_s: float = field(
        default=300.0,
        metadata={"doc": "look at a running job's processes for its ML framework this often, s (0: never)"},
    )


@dataclass(frozen=True)
class Carbon:
    """How a job's carbon intensity is chosen from imported series (`cocaq carbon import`)."""

    basis: str = field(
        default="lca",
        metadata={"doc": '"lca" (life cycle, Electricity Maps\' default) or "direct" (combustion only)'},
    )
    gap_tolerance_s: float = field(
        default=7200.0,
        metadata={"doc": "a gap in the series is filled by the nearest value within this (seconds or 2h)"},
    )


@dataclass(frozen=True)
class Embodied:
    """Scope 3 (manufacturing) emissions, reported apart from operational CO2; 0 means not counted."""

    g_per_gpu_hour: float = field(default=0.0, metadata={"doc": "g CO2e per GPU-hour"})
    g_per_node_hour: float = field(default=0.0, metadata={"doc": "g CO2e per node-hour"})


@dataclass(frozen=True)
class Aggregate:
    """The aggregator (`cocaq aggregate`): per-job metrics and the daily rollups."""

    idle_gpu_util_pct: float = field(
        default=5.0, metadata={"doc": "an allocated GPU below this utilisation, %, counts as idle"}
    )
    workers: int = field(
        default=0,
        metadata={
            "doc": "processes for deriving many jobs (PostgreSQL): 0 = one per CPU, 1 = none; up to 64"
        },
    )


MAIL_TRANSPORTS = ("smtp", "outbox")
SMTP_SECURITY = ("starttls", "tls", "none")
SMTP_DEFAULT_PORTS = {"none": 25, "starttls": 587, "tls": 465}
IN_DOUBT = ("resend", "skip")


@dataclass(frozen=True)
class Mail:
    """How report e-mails leave (SMTP or an outbox of .eml files) and whom they reach (reports/).

    Holds no password: only where to read it (`smtp_password_env`, `smtp_password_file`), read when the
    SMTP connection is opened, so a printed or logged Config never shows one.
    """

    transport: str = field(default="smtp", metadata={"doc": '"smtp" or "outbox" (a directory of .eml files)'})
    smtp_host: str = field(default="localhost", metadata={"doc": "the SMTP server"})
    smtp_port: int | None = field(
        default=None, metadata={"doc": "the SMTP port; unset: 25, 587 or 465 by smtp_security"}
    )
    smtp_security: str = field(
        default="none",
        metadata={"doc": '"starttls", "tls" (implicit, SMTPS) or "none" (a local relay)'},
    )
    smtp_user: str | None = field(
        default=None, metadata={"doc": "log in as this user (needs a password and, off localhost, TLS)"}
    )
    smtp_password_env: str | None = field(
        default=None, metadata={"doc": "name of the environment variable holding the password"}
    )
    smtp_password_file: str | None = field(
        default=None, metadata={"doc": "file holding the password (chmod 600); not with smtp_password_env"}
    )
    smtp_ca_file: str | None = field(
        default=None, metadata={"doc": "CA bundle to trust for the server (default: the system's)"}
    )
    smtp_timeout_s: float = field(default=30.0, metadata={"doc": "seconds to wait for the server"})
    from_address: str | None = field(
        default=None,
        metadata={
            "doc": '"cocaq@example.org" or "HPC <hpc@example.org>", also the Message-ID domain; '
            "unset: cocaq@FQDN"
        },
    )
    outbox_dir: str | None = field(default=None, metadata={"doc": "the outbox; unset: <spool_dir>/outbox"})
    address_template: str | None = field(
        default=None, metadata={"doc": 'a user\'s address, "{user}@example.org" (only {user})'}
    )
    address_map: str | None = field(
        default=None, metadata={"doc": 'CSV (user,address) or TOML (user = "address"), one per line'}
    )
    opt_out_file: str | None = field(
        default=None, metadata={"doc": "user names or addresses that get nothing, one per line"}
    )
    max_per_user_per_day: int = field(
        default=10, metadata={"doc": "messages to one address in 24 h; 0: no limit"}
    )
    retry_attempts: int = field(
        default=4, metadata={"doc": "tries per message on transient errors (4xx, connection, timeout)"}
    )
    retry_base_delay_s: float = field(
        default=2.0, metadata={"doc": "first delay between tries, s; then 2x, 4x... (capped at 5 minutes)"}
    )
    in_doubt: str = field(
        default="resend",
        metadata={"doc": 'a message left "sending" by a crash: "resend" (same Message-ID) or "skip"'},
    )
    list_unsubscribe: str | None = field(
        default=None,
        metadata={
            "doc": 'the List-Unsubscribe target, "mailto:hpc@example.org?subject=unsubscribe%20{user}"; '
            "unset: a mailto: to reply_to (else the sender), so that every report carries one"
        },
    )
    reply_to: str | None = field(
        default=None, metadata={"doc": "where replies go (the support team, say); unset: no Reply-To header"}
    )

    @property
    def port(self) -> int:
        return self.smtp_port if self.smtp_port is not None else SMTP_DEFAULT_PORTS[self.smtp_security]


@dataclass(frozen=True)
class Reports:
    """What the rendered reports say about the site, where admins' templates are, and who gets the lab and
    admin reports (users' own addresses come from [mail])."""

    template_dir: str | None = field(
        default=None, metadata={"doc": "files here override reports/templates/ files of the same name"}
    )
    site_name: str | None = field(
        default=None, metadata={"doc": "in subjects and headers; unset: the cluster's name"}
    )
    contact: str | None = field(
        default=None, metadata={"doc": "who to ask (an address or a few words), in every report's footer"}
    )
    lab_heads: dict[str, tuple[str, ...]] = field(
        default_factory=dict,
        metadata={"doc": 'Slurm account -> addresses of its lab report, { lab_nlp = ["head@example.org"] }'},
    )
    admins: tuple[str, ...] = field(default=(), metadata={"doc": "addresses of the admin report"})
    before_after_days: int = field(
        default=30, metadata={"doc": "window on each side of a user's first report (admin report), days"}
    )
    archive_dir: str | None = field(
        default=None, metadata={"doc": "where the batch keeps the admins' interactive HTML, one file a month"}
    )
    job_digest_minutes: int = field(
        default=30, metadata={"doc": "job e-mails: a user's ended jobs wait this long to go as one digest"}
    )
    job_email_waste_kwh: float = field(
        default=5.0,
        metadata={
            "doc": "job e-mails also go, unasked, for a job whose energy that did no work (idle GPUs, "
            "failed, out of memory, timed out) reached this many kWh; 0: only to those who asked"
        },
    )


INTERACTIVE_NAMES = (
    "jupyter", "jupyterlab", "jupyter-notebook", "notebook", "interactive", "bash", "sh", "zsh",
    "vscode", "code-server", "rstudio", "sys/dashboard", "ondemand", "desktop", "spawner-jupyterhub",
)  # fmt: skip


@dataclass(frozen=True)
class Advice:
    """What the suggestions to users (cocaq.footprint.advice) may say, and when."""

    min_share: float = field(
        default=0.02, metadata={"doc": "a suggestion must save at least this share of the user's energy..."}
    )
    min_kwh: float = field(default=0.5, metadata={"doc": "...and at least this many kWh in the period"})
    interactive_names: tuple[str, ...] = field(
        default=INTERACTIVE_NAMES,
        metadata={
            "doc": "job names of interactive sessions (notebooks, shells, editors), besides partitions "
            'named "interactive": their idle GPUs are released, not checkpointed'
        },
    )


@dataclass(frozen=True)
class Alerts:
    """Alerts while a job runs: its GPUs allocated and unused (`cocaq scheduler`, reports.alerts)."""

    idle_gpu: bool = field(default=True, metadata={"doc": "false: no alerts"})
    idle_minutes: float = field(
        default=60.0,
        metadata={"doc": "all of a job's GPUs under the idle threshold this long, to the last sample"},
    )
    throttle_hours: float = field(
        default=24.0, metadata={"doc": "at most one alert per user in this many hours (0: no limit)"}
    )
    min_gpus: int = field(default=1, metadata={"doc": "jobs holding fewer GPUs are left alone"})


@dataclass(frozen=True)
class Api:
    """The read API (`cocaq serve`) and its clients (`cocaq user` on login nodes); see docs/api.md."""

    url: str | None = field(
        default=None, metadata={"doc": "clients: use the API there instead of the database"}
    )
    host: str = field(default="127.0.0.1", metadata={"doc": "the server listens on this address"})
    port: int = field(default=8470, metadata={"doc": "the server listens on this port"})
    tls_cert: str | None = field(
        default=None, metadata={"doc": "the server's certificate; it terminates TLS itself when both are set"}
    )
    tls_key: str | None = field(default=None, metadata={"doc": "the server's private key (with tls_cert)"})
    ca_file: str | None = field(
        default=None,
        metadata={"doc": "clients: the CA that signed the server's certificate (default: the system's)"},
    )
    munge_socket: str | None = field(default=None, metadata={"doc": "munged's socket; unset: its default"})
    admin_groups: tuple[str, ...] = field(
        default=(), metadata={"doc": "Unix groups whose members see everything"}
    )
    admin_users: tuple[str, ...] = field(default=(), metadata={"doc": "users who see everything"})
    lab_heads: dict[str, tuple[str, ...]] = field(
        default_factory=dict,
        metadata={"doc": 'Slurm account -> user names who see the lab, { lab_nlp = ["carol"] }'},
    )
    timeout_s: float = field(default=10.0, metadata={"doc": "clients: how long to wait for the API, s"})


SLURM_BACKENDS = ("auto", "cli", "pyslurm")


@dataclass(frozen=True)
class Slurm:
    """How cocaq reads Slurm's accounting (import, reconcile, the scheduler): cocaq.slurm.backend."""

    backend: str = field(
        default="auto",
        metadata={"doc": '"cli": sacct; "pyslurm": slurmdbd through pyslurm; "auto": pyslurm where it fits'},
    )
    sacct: str | None = field(
        default=None, metadata={"doc": "path of sacct (unset: PATH, then /usr/bin/sacct)"}
    )


@dataclass(frozen=True)
class Config:
    """The whole configuration: top-level keys and one section (a frozen dataclass) per TOML table."""

    database_url: str = field(
        default_factory=default_database_url,
        metadata={
            "doc": "SQLAlchemy URL of the database (postgresql+psycopg://... or sqlite:///...)",
            "default_doc": "SQLite in the user's data directory (~/.local/share/cocaq/cocaq.sqlite)",
        },
    )
    spool_dir: str = field(
        default="/var/spool/cocaq", metadata={"doc": "the node-side spool (hooks' records, collector state)"}
    )
    cluster: Cluster = field(default_factory=Cluster)
    collector: Collector = field(default_factory=Collector)
    carbon: Carbon = field(default_factory=Carbon)
    embodied: Embodied = field(default_factory=Embodied)
    aggregate: Aggregate = field(default_factory=Aggregate)
    mail: Mail = field(default_factory=Mail)
    reports: Reports = field(default_factory=Reports)
    api: Api = field(default_factory=Api)
    advice: Advice = field(default_factory=Advice)
    alerts: Alerts = field(default_factory=Alerts)
    slurm: Slurm = field(default_factory=Slurm)
    pue_monthly: dict[str, float] = field(
        default_factory=dict,
        metadata={
            "doc": 'PUE by month, overriding cluster.pue: { "2026-07" = 1.45 } (YYYY-MM, 1 to 5)',
            "toml": "cluster.pue_monthly",
        },
    )
    estimate: Estimate = field(default_factory=Estimate)
    default_hardware: Hardware = field(default_factory=Hardware, metadata={"toml": "defaults"})
    partitions: dict[str, Hardware] = field(default_factory=dict, metadata={"toml": "partitions.NAME"})
    node_groups: tuple[NodeGroup, ...] = field(default=(), metadata={"toml": "node_groups.NAME"})
    source: str = field(default="built-in defaults", metadata={"toml": None})

    def tz(self) -> Any:
        if self.cluster.timezone is None:
            from datetime import datetime

            return datetime.now().astimezone().tzinfo
        return ZoneInfo(self.cluster.timezone)

    def hardware_for(self, partition: str | None, nodes: list[str] | None = None) -> tuple[Hardware, str]:
        """The profile for a job: a node group matching all its nodes, else its partition, else default.

        Returns the profile and its name (`node_group:NAME`, `partition:NAME` or `default`).
        """
        if nodes:
            for group in self.node_groups:
                if all(group.matches(n) for n in nodes):
                    return group.hardware, f"node_group:{group.name}"
        if partition:
            # A job submitted to several partitions (`gpu,cpu`) ran in the first that sacct reports.
            part = partition.split(",")[0]
            if part in self.partitions:
                return self.partitions[part], f"partition:{part}"
        return self.default_hardware, "default"

    def zone_and_pue(self, hw: Hardware) -> tuple[str, float]:
        return hw.carbon_zone or self.cluster.carbon_zone, hw.pue if hw.pue is not None else self.cluster.pue

    def pue_at(self, hw: Hardware, when: Any) -> float:
        """The PUE for a job of this hardware at `when` (a datetime): the month's value if configured."""
        if hw.pue is None and self.pue_monthly and when is not None:
            v = self.pue_monthly.get(f"{when:%Y-%m}")
            if v is not None:
                return v
        return self.zone_and_pue(hw)[1]


# --- validation -------------------------------------------------------------------------------------


def _num(key: str, value: Any, lo: float | None = 0.0, hi: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise ConfigError(f"config: {key}: expected a number, got {value!r}") from None
        else:
            raise ConfigError(f"config: {key}: expected a number, got {value!r}")
    try:
        v = float(value)
    except OverflowError:  # an int of hundreds of digits
        raise ConfigError(
            f"config: {key}: expected a number, got one of {len(str(abs(value)))} digits"
        ) from None
    if not math.isfinite(v) or (lo is not None and v < lo) or (hi is not None and v > hi):
        rng = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
        raise ConfigError(f"config: {key}: expected a number {rng}, got {value!r}")
    return v


def _whole(key: str, value: Any, lo: int, hi: int) -> int:
    n = _num(key, value, lo, hi)
    if n != int(n):
        raise ConfigError(f"config: {key}: expected a whole number, got {value!r}")
    return int(n)


def _buckets(value: Any) -> tuple[float, ...]:
    """Utilisation bucket edges: increasing numbers strictly between 0 and 100 (an empty list: no buckets)."""
    key = "estimate.calibrate_buckets"
    if isinstance(value, str):  # from the environment: "25,50,75"
        value = [v for v in value.replace(" ", "").split(",") if v]
    if not isinstance(value, list | tuple) or len(value) > 20:
        raise ConfigError(f"config: {key}: expected a list of percentages like [25, 50, 75], got {value!r}")
    edges = tuple(_num(key, v, 0.0, 100.0) for v in value)
    if any(not 0.0 < v < 100.0 for v in edges) or any(b <= a for a, b in itertools.pairwise(edges)):
        raise ConfigError(
            f"config: {key}: expected increasing percentages between 0 and 100 (exclusive), got {value!r}"
        )
    return edges


def _str(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"config: {key}: expected a non-empty string, got {value!r}")
    return value.strip()


def _check_keys(section: str, table: dict[str, Any], allowed: set[str]) -> None:
    for k in table:
        if k not in allowed:
            where = f"{section}.{k}" if section else k
            raise ConfigError(f"config: {where}: unknown key (known: {', '.join(sorted(allowed))})")


def _hardware(section: str, table: Any, base: Hardware) -> Hardware:
    if not isinstance(table, dict):
        raise ConfigError(f"config: {section}: expected a table, got {table!r}")
    allowed = {f.name for f in fields(Hardware)}
    _check_keys(section, {k: v for k, v in table.items() if k != "nodes"}, allowed)
    values: dict[str, Any] = {}
    for k, v in table.items():
        key = f"{section}.{k}"
        if k in ("cpu_model", "gpu_model", "carbon_zone"):
            values[k] = _str(key, v)
        elif k == "pue":
            values[k] = _num(key, v, 1.0, 5.0)
        elif k in ("cpu_tdp_w_per_core", "gpu_tdp_w", "mem_gb", "gpu_mem_gb"):
            values[k] = _num(key, v, 0.0, 10000.0)
    return replace(base, **values)


def _collector(t: Any) -> Collector:
    if not isinstance(t, dict):
        raise ConfigError(f"config: collector: expected a table, got {t!r}")
    _check_keys("collector", t, {f.name for f in fields(Collector)})
    c = Collector()
    v: dict[str, Any] = {}
    if "interval_s" in t:
        v["interval_s"] = _num("collector.interval_s", t["interval_s"], 1.0, 3600.0)
    if "ship_interval_s" in t:
        v["ship_interval_s"] = _num("collector.ship_interval_s", t["ship_interval_s"], 1.0, 86400.0)
    if "sources" in t:
        src = t["sources"]
        if isinstance(src, str):  # from the environment: "nvml,rapl"
            src = [s.strip() for s in src.split(",") if s.strip()]
        if not isinstance(src, list) or not all(isinstance(s, str) for s in src):
            raise ConfigError(f"config: collector.sources: expected a list of source names, got {src!r}")
        for s in src:
            if s not in COLLECTOR_SOURCES:
                raise ConfigError(
                    f"config: collector.sources: unknown source {s!r} (known: {', '.join(COLLECTOR_SOURCES)})"
                )
        v["sources"] = tuple(dict.fromkeys(src))
    for k in ("nvml", "sysfs_root", "hook_log", "annotate_dir"):
        if k in t:
            v[k] = _str(f"collector.{k}", t[k])
    if "nvml" in v and not (v["nvml"] == "pynvml" or v["nvml"].startswith("fake:")):
        raise ConfigError(f"config: collector.nvml: expected 'pynvml' or 'fake:SPEC', got {v['nvml']!r}")
    if "idle_policy" in t:
        pol = t["idle_policy"]
        if pol not in IDLE_POLICIES:
            raise ConfigError(
                f"config: collector.idle_policy: expected one of {', '.join(IDLE_POLICIES)}, got {pol!r}"
            )
        v["idle_policy"] = pol
    if "idle_baseline_w" in t:
        v["idle_baseline_w"] = _num("collector.idle_baseline_w", t["idle_baseline_w"], 0.0, 5000.0)
    if "detect_interval_s" in t:
        v["detect_interval_s"] = _num("collector.detect_interval_s", t["detect_interval_s"], 0.0, 86400.0)
    if "spool_max_mb" in t:
        v["spool_max_mb"] = _num("collector.spool_max_mb", t["spool_max_mb"], 1.0, 1_000_000.0)
    if "ship_batch" in t:
        v["ship_batch"] = int(_num("collector.ship_batch", t["ship_batch"], 1.0, 1_000_000.0))
    return replace(c, **v)


def _small_table(section: str, t: Any, cls: Any, ranges: dict[str, tuple[float, float]]) -> Any:
    """A section of numbers (and `basis`): keys checked, values in range."""
    if not isinstance(t, dict):
        raise ConfigError(f"config: {section}: expected a table, got {t!r}")
    _check_keys(section, t, {f.name for f in fields(cls)})
    values: dict[str, Any] = {}
    for k, v in t.items():
        if k == "basis":
            if v not in ("lca", "direct"):
                raise ConfigError(f"config: {section}.basis: expected 'lca' or 'direct', got {v!r}")
            values[k] = v
        elif k == "gap_tolerance_s" and isinstance(v, str) and not v.replace(".", "").isdigit():
            from cocaq.timeparse import parse_duration

            try:
                values[k] = parse_duration(v).total_seconds()
            except (ValueError, CocaqError):
                raise ConfigError(
                    f"config: {section}.{k}: expected seconds or a duration like 2h, got {v!r}"
                ) from None
        elif k == "workers":
            n = v if isinstance(v, int) and not isinstance(v, bool) else None
            if isinstance(v, str) and v.strip().isdigit():
                n = int(v)
            if n is None or not 0 <= n <= 64:
                raise ConfigError(f"config: {section}.{k}: expected a whole number from 0 to 64, got {v!r}")
            values[k] = n
        else:
            lo, hi = ranges[k]
            values[k] = _num(f"{section}.{k}", v, lo, hi)
    return cls(**values)


def _opt_str(key: str, value: Any) -> str | None:
    """An optional string: "" (an environment variable set empty) means unset."""
    if isinstance(value, str) and not value.strip():
        return None
    return _str(key, value)


def _mail(t: Any) -> Mail:
    if not isinstance(t, dict):
        raise ConfigError(f"config: mail: expected a table, got {t!r}")
    _check_keys("mail", t, {f.name for f in fields(Mail)})
    if not t:
        return Mail()
    import re

    from cocaq.addresses import (
        check_address_template,
        check_list_unsubscribe,
        looks_like_address,
    )

    v: dict[str, Any] = {}
    for key, choices in (
        ("transport", MAIL_TRANSPORTS),
        ("smtp_security", SMTP_SECURITY),
        ("in_doubt", IN_DOUBT),
    ):
        if key in t:
            if t[key] not in choices:
                raise ConfigError(f"config: mail.{key}: expected one of {', '.join(choices)}, got {t[key]!r}")
            v[key] = t[key]
    for key in (
        "smtp_user",
        "smtp_password_env",
        "smtp_password_file",
        "smtp_ca_file",
        "from_address",
        "outbox_dir",
        "address_template",
        "address_map",
        "opt_out_file",
        "list_unsubscribe",
        "reply_to",
    ):
        if key in t:
            v[key] = _opt_str(f"mail.{key}", t[key])
    if "smtp_host" in t:
        v["smtp_host"] = _str("mail.smtp_host", t["smtp_host"])
        if any(c.isspace() or c in "/@" for c in v["smtp_host"]):
            raise ConfigError(
                f"config: mail.smtp_host: expected a host name or address, got {t['smtp_host']!r}"
            )
    if "smtp_port" in t:
        port = _num("mail.smtp_port", t["smtp_port"], 1.0, 65535.0)
        if port != int(port):
            raise ConfigError(f"config: mail.smtp_port: expected a whole number, got {t['smtp_port']!r}")
        v["smtp_port"] = int(port)
    if "smtp_timeout_s" in t:
        v["smtp_timeout_s"] = _num("mail.smtp_timeout_s", t["smtp_timeout_s"], 0.1, 600.0)
    if "max_per_user_per_day" in t:
        v["max_per_user_per_day"] = int(_num("mail.max_per_user_per_day", t["max_per_user_per_day"], 0, 1e6))
    if "retry_attempts" in t:
        v["retry_attempts"] = int(_num("mail.retry_attempts", t["retry_attempts"], 1.0, 100.0))
    if "retry_base_delay_s" in t:
        v["retry_base_delay_s"] = _num("mail.retry_base_delay_s", t["retry_base_delay_s"], 0.0, 3600.0)
    m = replace(Mail(), **v)
    if m.smtp_password_env and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", m.smtp_password_env):
        raise ConfigError(
            "config: mail.smtp_password_env: expected the name of an environment variable "
            f"(like SMTP_PASSWORD), got {m.smtp_password_env!r}"
        )
    if m.smtp_password_env and m.smtp_password_file:
        raise ConfigError("config: mail.smtp_password_env: give it or mail.smtp_password_file, not both")
    if (m.smtp_password_env or m.smtp_password_file) and not m.smtp_user:
        raise ConfigError("config: mail.smtp_user: needed with a password (smtp_password_env or _file)")
    if m.smtp_user and not (m.smtp_password_env or m.smtp_password_file):
        raise ConfigError(
            "config: mail.smtp_user: say where its password is (smtp_password_env or smtp_password_file)"
        )
    if m.smtp_user and m.smtp_security == "none" and m.smtp_host not in ("localhost", "127.0.0.1", "::1"):
        raise ConfigError(
            f"config: mail.smtp_user: logging in to {m.smtp_host} needs smtp_security 'starttls' or 'tls' "
            "(the password would cross the network in clear)"
        )
    for key in ("from_address", "reply_to"):
        value = getattr(m, key)
        if value is None:
            continue
        from email.utils import getaddresses

        parsed = getaddresses([value])
        if len(parsed) != 1 or not looks_like_address(parsed[0][1]) or not value.isprintable():
            raise ConfigError(
                f"config: mail.{key}: expected an address like cocaq@example.org or "
                f"'HPC <hpc@example.org>', got {value!r}"
            )
    if m.address_template is not None:
        problem = check_address_template(m.address_template)
        if problem:
            raise ConfigError(f"config: mail.address_template: {m.address_template!r} {problem}")
    if m.list_unsubscribe is not None:
        problem = check_list_unsubscribe(m.list_unsubscribe)
        if problem:
            raise ConfigError(f"config: mail.list_unsubscribe: {problem}")
    return m


def _addresses(key: str, value: Any) -> tuple[str, ...]:
    """A list of e-mail addresses (from the environment: comma-separated)."""
    from cocaq.addresses import looks_like_address, normalise_address

    if isinstance(value, str):
        value = [a.strip() for a in value.split(",") if a.strip()]
    if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
        raise ConfigError(
            f'config: {key}: expected a list of addresses like ["hpc@example.org"], got {value!r}'
        )
    for a in value:
        if not looks_like_address(a.strip()):
            raise ConfigError(f"config: {key}: {a!r} is not an e-mail address")
    return tuple(dict.fromkeys(normalise_address(a) for a in value))


def _reports(t: Any) -> Reports:
    if not isinstance(t, dict):
        raise ConfigError(f"config: reports: expected a table, got {t!r}")
    _check_keys("reports", t, {f.name for f in fields(Reports)})
    v: dict[str, Any] = {}
    for key in ("site_name", "contact"):
        if key in t:
            v[key] = _opt_str(f"reports.{key}", t[key])
    for key in ("template_dir", "archive_dir"):
        if key in t:
            d = _opt_str(f"reports.{key}", t[key])
            if d is not None:
                d = os.path.expanduser(d)
                if not os.path.isdir(d):
                    what = "not a directory" if os.path.exists(d) else "no such directory"
                    raise ConfigError(f"config: reports.{key}: {d}: {what}")
            v[key] = d
    if "admins" in t:
        v["admins"] = _addresses("reports.admins", t["admins"])
    if "lab_heads" in t:
        heads = t["lab_heads"]
        if not isinstance(heads, dict):
            raise ConfigError(
                'config: reports.lab_heads: expected a table like { lab_nlp = ["head@example.org"] } '
                f"(set it in the config file), got {heads!r}"
            )
        v["lab_heads"] = {
            str(acct): _addresses(f"reports.lab_heads.{acct}", [a] if isinstance(a, str) else a)
            for acct, a in heads.items()
        }
    if "before_after_days" in t:
        n = _num("reports.before_after_days", t["before_after_days"], 1.0, 366.0)
        if n != int(n):
            raise ConfigError(
                f"config: reports.before_after_days: expected whole days, got {t['before_after_days']!r}"
            )
        v["before_after_days"] = int(n)
    if "job_digest_minutes" in t:
        n = _num("reports.job_digest_minutes", t["job_digest_minutes"], 0.0, 1440.0)
        if n != int(n):
            raise ConfigError(
                f"config: reports.job_digest_minutes: expected whole minutes, got {t['job_digest_minutes']!r}"
            )
        v["job_digest_minutes"] = int(n)
    if "job_email_waste_kwh" in t:
        v["job_email_waste_kwh"] = _num("reports.job_email_waste_kwh", t["job_email_waste_kwh"], 0.0, 1e6)
    return replace(Reports(), **v)


def _bool(key: str, value: Any) -> bool:
    """true/false (from the environment: 1/0, true/false, yes/no, on/off)."""
    if isinstance(value, bool):
        return value
    word = value.strip().lower() if isinstance(value, str) else None
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"config: {key}: expected true or false, got {value!r}")


def _advice(t: Any) -> Advice:
    if not isinstance(t, dict):
        raise ConfigError(f"config: advice: expected a table, got {t!r}")
    _check_keys("advice", t, {f.name for f in fields(Advice)})
    v: dict[str, Any] = {}
    if "min_share" in t:
        v["min_share"] = _num("advice.min_share", t["min_share"], 0.0, 1.0)
    if "min_kwh" in t:
        v["min_kwh"] = _num("advice.min_kwh", t["min_kwh"], 0.0, 1e9)
    if "interactive_names" in t:
        names = _names("advice.interactive_names", t["interactive_names"])
        v["interactive_names"] = tuple(dict.fromkeys(n.strip().lower() for n in names))
    return replace(Advice(), **v)


def _alerts(t: Any) -> Alerts:
    if not isinstance(t, dict):
        raise ConfigError(f"config: alerts: expected a table, got {t!r}")
    _check_keys("alerts", t, {f.name for f in fields(Alerts)})
    v: dict[str, Any] = {}
    if "idle_gpu" in t:
        v["idle_gpu"] = _bool("alerts.idle_gpu", t["idle_gpu"])
    if "idle_minutes" in t:
        v["idle_minutes"] = _num("alerts.idle_minutes", t["idle_minutes"], 1.0, 10080.0)
    if "throttle_hours" in t:
        v["throttle_hours"] = _num("alerts.throttle_hours", t["throttle_hours"], 0.0, 8760.0)
    if "min_gpus" in t:
        n = _num("alerts.min_gpus", t["min_gpus"], 1.0, 100000.0)
        if n != int(n):
            raise ConfigError(f"config: alerts.min_gpus: expected a whole number, got {t['min_gpus']!r}")
        v["min_gpus"] = int(n)
    return replace(Alerts(), **v)


def _slurm(t: Any) -> Slurm:
    if not isinstance(t, dict):
        raise ConfigError(f"config: slurm: expected a table, got {t!r}")
    _check_keys("slurm", t, {f.name for f in fields(Slurm)})
    v: dict[str, Any] = {}
    if "backend" in t:
        b = _str("slurm.backend", t["backend"]).lower()
        if b not in SLURM_BACKENDS:
            raise ConfigError(
                f"config: slurm.backend: expected one of {', '.join(SLURM_BACKENDS)}, got {t['backend']!r}"
            )
        v["backend"] = b
    if "sacct" in t:
        v["sacct"] = _str("slurm.sacct", t["sacct"])
    return replace(Slurm(), **v)


def _names(key: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):  # from the environment: "a,b"
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"config: {key}: expected a list of names, got {value!r}")
    return tuple(value)


def _api(t: Any) -> Api:
    if not isinstance(t, dict):
        raise ConfigError(f"config: api: expected a table, got {t!r}")
    _check_keys("api", t, {f.name for f in fields(Api)})
    v: dict[str, Any] = {}
    for k in ("url", "host", "tls_cert", "tls_key", "ca_file", "munge_socket"):
        if k in t:
            v[k] = _str(f"api.{k}", t[k])
    if v.get("url") and not v["url"].startswith(("http://", "https://")):
        raise ConfigError(f"config: api.url: expected http://... or https://..., got {v['url']!r}")
    if "port" in t:
        v["port"] = int(_num("api.port", t["port"], 1, 65535))
    if "timeout_s" in t:
        v["timeout_s"] = _num("api.timeout_s", t["timeout_s"], 0.1, 600.0)
    if ("tls_cert" in v) != ("tls_key" in v):
        raise ConfigError("config: api: tls_cert and tls_key go together")
    for k in ("admin_groups", "admin_users"):
        if k in t:
            v[k] = _names(f"api.{k}", t[k])
    if "lab_heads" in t:
        heads = t["lab_heads"]
        if not isinstance(heads, dict):
            raise ConfigError('config: api.lab_heads: expected a table like { lab_nlp = ["carol"] }')
        v["lab_heads"] = {str(a): _names(f"api.lab_heads.{a}", u) for a, u in heads.items()}
    return replace(Api(), **v)


def _from_dict(data: dict[str, Any], source: str) -> Config:
    _check_keys(
        "",
        data,
        {
            "database_url",
            "spool_dir",
            "cluster",
            "estimate",
            "defaults",
            "partitions",
            "node_groups",
            "collector",
            "carbon",
            "embodied",
            "aggregate",
            "mail",
            "reports",
            "api",
            "advice",
            "alerts",
            "slurm",
        },
    )
    if "database_url" in data:  # given: the default (platformdirs, a few ms on every command) is not needed
        cfg = Config(source=source, database_url=_str("database_url", data["database_url"]))
    else:
        cfg = Config(source=source)
    if "spool_dir" in data:
        cfg = replace(cfg, spool_dir=_str("spool_dir", data["spool_dir"]))
    c = data.get("cluster", {})
    if not isinstance(c, dict):
        raise ConfigError(f"config: cluster: expected a table, got {c!r}")
    _check_keys("cluster", c, {f.name for f in fields(Cluster)} | {"pue_monthly"})
    pue_monthly: dict[str, float] = {}
    pm = c.get("pue_monthly", {})
    if not isinstance(pm, dict):
        raise ConfigError(
            f'config: cluster.pue_monthly: expected a table like {{"2026-01" = 1.35}}, got {pm!r}'
        )
    for month, v in pm.items():
        if (
            len(month) != 7
            or month[4] != "-"
            or not (month[:4] + month[5:]).isdigit()
            or not 1 <= int(month[5:]) <= 12
        ):
            raise ConfigError(f"config: cluster.pue_monthly: {month!r} is not a month (YYYY-MM)")
        pue_monthly[month] = _num(f"cluster.pue_monthly.{month}", v, 1.0, 5.0)
    cluster = Cluster(
        name=_str("cluster.name", c["name"]) if "name" in c else Cluster.name,
        timezone=_str("cluster.timezone", c["timezone"]) if "timezone" in c else None,
        carbon_zone=_str("cluster.carbon_zone", c["carbon_zone"]) if "carbon_zone" in c else "WORLD",
        pue=_num("cluster.pue", c["pue"], 1.0, 5.0) if "pue" in c else 1.0,
    )
    if cluster.timezone:
        try:
            ZoneInfo(cluster.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ConfigError(
                f"config: cluster.timezone: unknown time zone {cluster.timezone!r} (e.g. Europe/Paris)"
            ) from None
    e = data.get("estimate", {})
    if not isinstance(e, dict):
        raise ConfigError(f"config: estimate: expected a table, got {e!r}")
    _check_keys("estimate", e, {f.name for f in fields(Estimate)})
    estimate = Estimate(
        gpu_utilisation=_num("estimate.gpu_utilisation", e.get("gpu_utilisation", 1.0), 0.0, 1.0),
        mem_w_per_gb=_num("estimate.mem_w_per_gb", e.get("mem_w_per_gb", 0.3725), 0.0, 100.0),
        cpu_usage=str(e.get("cpu_usage", "totalcpu")),
        max_node_power_w=_num("estimate.max_node_power_w", e.get("max_node_power_w", 20_000.0), 100.0, 1e6),
        calibrate=_bool("estimate.calibrate", e.get("calibrate", True)),
        calibrate_min_jobs=_whole("estimate.calibrate_min_jobs", e.get("calibrate_min_jobs", 5), 1, 10**6),
        calibrate_buckets=_buckets(e.get("calibrate_buckets", [25, 50, 75])),
    )
    if estimate.cpu_usage not in ("totalcpu", "allocated"):
        raise ConfigError(
            f"config: estimate.cpu_usage: expected 'totalcpu' or 'allocated', got {estimate.cpu_usage!r}"
        )
    default_hw = _hardware("defaults", data.get("defaults", {}), Hardware())
    parts_raw = data.get("partitions", {})
    if not isinstance(parts_raw, dict):
        raise ConfigError(f"config: partitions: expected a table of partitions, got {parts_raw!r}")
    partitions = {name: _hardware(f"partitions.{name}", t, default_hw) for name, t in parts_raw.items()}
    groups_raw = data.get("node_groups", {})
    if not isinstance(groups_raw, dict):
        raise ConfigError(f"config: node_groups: expected a table of node groups, got {groups_raw!r}")
    groups = []
    for name, t in groups_raw.items():
        hw = _hardware(f"node_groups.{name}", t, default_hw)
        nodes = t.get("nodes")
        if isinstance(nodes, str):
            nodes = [nodes]
        if not isinstance(nodes, list) or not nodes or not all(isinstance(n, str) and n for n in nodes):
            raise ConfigError(f"config: node_groups.{name}.nodes: expected a list of node names or patterns")
        groups.append(NodeGroup(name, tuple(nodes), hw))
    return replace(
        cfg,
        carbon=_small_table(
            "carbon", data.get("carbon", {}), Carbon, {"gap_tolerance_s": (0.0, 366 * 86400.0)}
        ),
        embodied=_small_table(
            "embodied",
            data.get("embodied", {}),
            Embodied,
            {"g_per_gpu_hour": (0.0, 1e6), "g_per_node_hour": (0.0, 1e6)},
        ),
        aggregate=_small_table(
            "aggregate", data.get("aggregate", {}), Aggregate, {"idle_gpu_util_pct": (0.0, 100.0)}
        ),
        pue_monthly=pue_monthly,
        collector=_collector(data.get("collector", {})),
        mail=_mail(data.get("mail", {})),
        reports=_reports(data.get("reports", {})),
        api=_api(data.get("api", {})),
        advice=_advice(data.get("advice", {})),
        alerts=_alerts(data.get("alerts", {})),
        slurm=_slurm(data.get("slurm", {})),
        cluster=cluster,
        estimate=estimate,
        default_hardware=default_hw,
        partitions=partitions,
        node_groups=tuple(groups),
    )


def _apply_env(data: dict[str, Any], environ: dict[str, str]) -> dict[str, Any]:
    """Fold COCAQ_* variables into the raw TOML dict, so one validator checks both."""
    known_sections = set(ENV_SECTIONS)
    # The variable that holds the SMTP password is not a setting, whatever its name.
    mail = data.get("mail")
    secret_vars = {
        environ.get("COCAQ_MAIL__SMTP_PASSWORD_ENV"),
        mail.get("smtp_password_env") if isinstance(mail, dict) else None,
    }
    for name, value in sorted(environ.items()):
        if (
            not name.startswith("COCAQ_")
            or name in _NON_SETTING_ENV
            or name in secret_vars
            or name.startswith(_NON_SETTING_PREFIXES)
        ):
            continue
        key = name[len("COCAQ_") :].lower()
        if "__" in key:
            section, _, sub = key.partition("__")
            if section not in known_sections:
                raise ConfigError(f"environment: {name}: unknown section {section!r}")
            tbl = data.setdefault(section, {})
            if not isinstance(tbl, dict):
                raise ConfigError(f"environment: {name}: config section {section} is not a table")
            tbl[sub] = value
        elif key in ("database_url", "spool_dir"):
            data[key] = value
        elif key == "cluster":
            data.setdefault("cluster", {})["name"] = value
        elif key == "api_url":  # COCAQ_API_URL: login nodes' clients
            tbl = data.setdefault("api", {})
            if not isinstance(tbl, dict):
                raise ConfigError(f"environment: {name}: config section api is not a table")
            tbl["url"] = value
        elif key in ("smtp_host", "smtp_port"):  # COCAQ_SMTP_HOST, COCAQ_SMTP_PORT
            tbl = data.setdefault("mail", {})
            if not isinstance(tbl, dict):
                raise ConfigError(f"environment: {name}: config section mail is not a table")
            tbl[key] = value
        else:
            raise ConfigError(
                f"environment: {name}: unknown setting (use COCAQ_DATABASE_URL, COCAQ_SPOOL_DIR, "
                "COCAQ_CLUSTER, COCAQ_SMTP_HOST, COCAQ_SMTP_PORT or COCAQ_SECTION__KEY)"
            )
    return data


def load_config(path: str | os.PathLike[str] | None = None, environ: dict[str, str] | None = None) -> Config:
    """Read the config file (if any) and apply environment overrides; raise ConfigError on bad input."""
    env = dict(os.environ if environ is None else environ)
    explicit = path or env.get("COCAQ_CONFIG")
    file = Path(explicit) if explicit else DEFAULT_CONFIG_PATH
    data: dict[str, Any] = {}
    source = "built-in defaults"
    if explicit or file.exists():
        try:
            with open(file, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"config: {file}: no such file") from None
        except PermissionError:
            raise ConfigError(f"config: {file}: permission denied") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config: {file}: not valid TOML: {exc}") from None
        except IsADirectoryError:
            raise ConfigError(f"config: {file}: is a directory") from None
        source = str(file)
    data = _apply_env(data, env)
    try:
        return _from_dict(data, source)
    except ConfigError as exc:
        raise ConfigError(f"{exc} (from {source} and COCAQ_* variables)") from None
