"""The configuration model: every setting of cocaq.toml, with its type, default and description.

One frozen dataclass per section of the file (Cluster, Estimate, Hardware for `[defaults]`,
`[partitions.NAME]` and `[node_groups.NAME]`, Collector, Carbon, Embodied, Aggregate, Retention, Mail,
Reports, Api, Advice, Alerts, Slurm) and Config, which holds them with the top-level keys; beside them the
values some settings may take (COLLECTOR_SOURCES, SLURM_BACKENDS, ...) and the questions the rest of cocaq
asks of a Config (a job's hardware profile, its zone and PUE in a month, the cluster's time zone). Each
field carries its one-line description in its metadata, from which cocaq.config_reference writes
docs/configuration.md.
This module reads nothing: turning the file and the COCAQ_* variables into a Config, and refusing bad
input, is cocaq.config_load, so code that is handed a Config imports only the model.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from cocaq.ml.annotation import DEFAULT_DIR as ANNOTATE_DIR

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
    cores_per_node: int = field(
        default=0, metadata={"doc": "CPU cores per node (0: unknown), for the advice on cores per GPU, nodes"}
    )
    gpus_per_node: int = field(
        default=0, metadata={"doc": "GPUs per node (0: unknown), for the advice on a GPU's share of a node"}
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
    gpu_idle_share: float = field(
        default=0.15,
        metadata={
            "doc": "share of TDP an idle GPU draws, 0 to 1 (an A100-SXM4 idles near 55 W of 400 W): the "
            "floor of an estimate from Slurm's gres/gpuutil, TDP x (idle + (1 - idle) x utilisation)"
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


def parse_listen(value: str) -> tuple[str, int]:
    """(host, port) of a listen address: ":PORT" (all IPv4 interfaces), "HOST:PORT", "[IPV6]:PORT".

    Raises ValueError with the reason (the loader and the CLI make it one line naming the key)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f'expected ":PORT", "HOST:PORT" or "[IPV6]:PORT" with a port 1-65535, got {value!r}')
    if host.startswith("["):
        if (
            not host.endswith("]")
            or ":" not in host
            or not all(ch in "0123456789abcdefABCDEF:." for ch in host[1:-1])
        ):
            raise ValueError(f"expected an IPv6 address in brackets, got {host!r}")
        return host[1:-1], int(port)
    if host == "":
        return "0.0.0.0", int(port)
    if (
        ":" in host
        or len(host) > 253
        or not all(ch.isascii() and (ch.isalnum() or ch in ".-") for ch in host)
    ):
        raise ValueError(f"expected a host name or address before :{port}, got {host!r} (IPv6: [addr]:port)")
    return host, int(port)


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
    metrics_listen: str = field(
        default="",
        metadata={
            "doc": 'serve Prometheus/OpenMetrics metrics here: ":9830" (all IPv4 interfaces),'
            ' "127.0.0.1:9830", "[::1]:9830"; "" = off. It shows user names and job ids to whoever'
            " reaches it: bind it to the management network, set metrics_token_file (docs/node-side.md)"
        },
    )
    metrics_token_file: str | None = field(
        default=None,
        metadata={
            "doc": "file holding a bearer token the metrics endpoint then requires (root's or the"
            " collector's own, chmod 600; Prometheus' `authorization: {credentials_file: ...}`); unset:"
            " none, and whoever reaches the port reads every running job's user, account and job id"
        },
    )
    metrics_tls_cert_file: str | None = field(
        default=None,
        metadata={"doc": "serve the metrics endpoint over HTTPS with this certificate (PEM, with the chain)"},
    )
    metrics_tls_key_file: str | None = field(
        default=None,
        metadata={"doc": "the certificate's private key (PEM; root's or the collector's own, chmod 600)"},
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
            "doc": "processes for deriving many jobs, and connections for rebuilding many days (PostgreSQL):"
            " 0 = one per CPU, 1 = none; up to 64"
        },
    )


@dataclass(frozen=True)
class Retention:
    """How long raw GPU samples stay in the database (`cocaq db retention`, the scheduler's daily job).

    The per-job and per-hour summaries derived from them (job_metrics, job_gpu_hours, the rollups) are
    kept for ever; only the raw rows go, and only once the aggregator has summarised them.
    """

    samples_days: int = field(
        default=35,
        metadata={
            "doc": "days of raw samples to keep, 1 to 36500, or 0 = keep for ever; on PostgreSQL a month "
            "goes once all of it is this old. 35: the scheduler's calibrate window (the jobs whose "
            "estimates it redoes); calibration itself learns from job summaries, never raw samples"
        },
    )


@dataclass(frozen=True)
class Shifting:
    """When to run: what past jobs would have emitted at their best start (cocaq.accounting.shifting)."""

    slack_s: float = field(
        default=86400.0,
        metadata={
            "doc": "how long a job could have waited (seconds or a duration like 24h), never more than its"
            " time limit; 0 = no shifting figures"
        },
    )
    min_share: float = field(
        default=0.1,
        metadata={"doc": "the e-mails suggest when to run if it would save this share of the user's CO2..."},
    )
    min_kg: float = field(default=1.0, metadata={"doc": "...and at least this many kg in the period"})


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
        default=None,
        metadata={"doc": "where the batch keeps the admins' interactive HTML, one file a month (0640)"},
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
    keep_months: int = field(
        default=3,
        metadata={
            "doc": "the web app's month pages: `cocaq report keep` keeps this many settled months' answers "
            "per user (the latest ones); 0: none, every view computes its month"
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
    interactive_partitions: tuple[str, ...] = field(
        default=(),
        metadata={
            "doc": "partitions that hold interactive sessions, besides any whose name holds "
            '"interactive": a session that ends at its time limit ended normally (no energy lost)'
        },
    )
    interactive_qos: tuple[str, ...] = field(
        default=(),
        metadata={"doc": "QOS of interactive sessions (e.g. one a site gives srun --pty and salloc jobs)"},
    )
    mig_partitions: dict[str, str] = field(
        default_factory=dict,
        metadata={
            "doc": 'partitions of MIG slices and the profile each gives (its gres type), e.g. { "gpu-mig" = '
            '"1g.10gb" }: jobs that use a small part of a full GPU are pointed to them'
        },
    )
    partition_max_time: dict[str, float] = field(
        default_factory=dict,
        metadata={
            "doc": 'partitions\' MaxTime (slurm.conf), e.g. { debug = "01:00:00", gpu = "2-00:00:00" }: no '
            "--time the advice proposes is longer (hours once read)"
        },
    )
    qos_max_time: dict[str, float] = field(
        default_factory=dict,
        metadata={
            "doc": 'QOS MaxWall (sacctmgr show qos), e.g. { short = "04:00:00" }: no --time the advice '
            "proposes is longer (hours once read)"
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


STUDY_ARMS = ("emailed", "hold-out")
# The study's outcomes by name (cocaq.study.analysis.OUTCOMES defines them; a test keeps the two equal):
# `[study] primary` names one of them.
STUDY_OUTCOMES = (
    "idle_gpu_energy_share", "idle_gpu_hours_share", "failed_kwh_per_user", "gpu_util", "kwh_per_gpu_hour",
    "co2_per_user",
)  # fmt: skip
STUDY_PRIMARY = "idle_gpu_hours_share"


@dataclass(frozen=True)
class Study:
    """A controlled study of the e-mails (docs/study.md): a hold-out share of users gets none."""

    start: str | None = field(
        default=None, metadata={"doc": 'the first month of the study, "YYYY-MM"; unset: no study'}
    )
    end: str | None = field(
        default=None, metadata={"doc": 'its last month, "YYYY-MM" (inclusive); unset: until it is ended'}
    )
    holdout_share: float = field(
        default=0.2, metadata={"doc": "the share of users drawn into the hold-out arm, 0.05 to 0.5"}
    )
    seed: int | None = field(
        default=None,
        metadata={
            "doc": "the draw's seed, for a study anyone can redo (it names the study); unset: the first "
            "draw picks one at random and keeps it with the study, shown to admins only"
        },
    )
    baseline_months: int = field(
        default=3,
        metadata={"doc": "months before the start that stratify the draw and are each user's baseline"},
    )
    bootstrap: int = field(
        default=2000,
        metadata={"doc": "bootstrap resamples and re-randomisations for the intervals, 200 to 100000"},
    )
    primary: str = field(
        default=STUDY_PRIMARY,
        metadata={
            "doc": "the one outcome the study is judged by, declared before it starts (kept with the "
            "study at its first draw): " + ", ".join(STUDY_OUTCOMES)
        },
    )


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
    metrics: bool = field(
        default=False,
        metadata={"doc": "serve GET /metrics (Prometheus: the labs' last day, running jobs, intensity, PUE)"},
    )
    metrics_token_file: str | None = field(
        default=None,
        metadata={
            "doc": "file holding a bearer token that GET /metrics then requires (chmod 600); unset: none"
        },
    )


SLURM_BACKENDS = ("auto", "cli", "pyslurm")
# What Slurm's ConsumedEnergy holds, by the site's AcctGatherEnergyType (cocaq.accounting.estimate).
CONSUMED_ENERGY = ("node", "gpus")


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
    consumed_energy: str = field(
        default="node",
        metadata={
            "doc": 'what sacct\'s ConsumedEnergy measures: "node" (acct_gather_energy/ipmi, pm_counters, '
            'rapl: the nodes) or "gpus" (acct_gather_energy/gpu, Slurm 23.11+: the job\'s GPUs only, its '
            "CPUs and memory are then estimated)"
        },
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
    shifting: Shifting = field(default_factory=Shifting)
    aggregate: Aggregate = field(default_factory=Aggregate)
    retention: Retention = field(default_factory=Retention)
    mail: Mail = field(default_factory=Mail)
    reports: Reports = field(default_factory=Reports)
    api: Api = field(default_factory=Api)
    advice: Advice = field(default_factory=Advice)
    alerts: Alerts = field(default_factory=Alerts)
    study: Study = field(default_factory=Study)
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
