"""Loading the configuration: the TOML file and the COCAQ_* environment variables, validated into a Config.

Lookup order for the file: `--config`, then `$COCAQ_CONFIG`, then `/etc/cocaq/cocaq.toml` (if present).
Environment variables override single keys: `COCAQ_DATABASE_URL`, `COCAQ_CLUSTER__PUE`,
`COCAQ_ESTIMATE__GPU_UTILISATION` (`__` separates a section from its key); `COCAQ_SMTP_HOST` and
`COCAQ_SMTP_PORT` are short for `COCAQ_MAIL__SMTP_HOST` and `COCAQ_MAIL__SMTP_PORT` (and win over them).
`_apply_env` folds the variables into the file's raw table so that one validator (`_from_dict`, a function
per section) checks both, and a bad key or value is one ConfigError line naming it. Which variables are
settings (ENV_SECTIONS, ENV_SHORTHANDS) and which are not is written here, where the loader uses it, and
cocaq.config_reference documents it from here; the sections, keys and defaults are the model, cocaq.config.
"""

from __future__ import annotations

import itertools
import math
import os
import tomllib
from dataclasses import fields, replace
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cocaq.config import (
    COLLECTOR_SOURCES,
    CONSUMED_ENERGY,
    IDLE_POLICIES,
    IN_DOUBT,
    MAIL_TRANSPORTS,
    SLURM_BACKENDS,
    SMTP_SECURITY,
    STUDY_OUTCOMES,
    Advice,
    Aggregate,
    Alerts,
    Api,
    Carbon,
    Cluster,
    Collector,
    Config,
    Embodied,
    Estimate,
    Hardware,
    Mail,
    NodeGroup,
    Reports,
    Retention,
    Shifting,
    Slurm,
    Study,
    parse_listen,
)
from cocaq.errors import CocaqError, ConfigError
from cocaq.units import S_PER_HOUR

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
    "COCAQ_FAKE_NVML": "the fake NVML's GPUs where nothing configured it (collector/fakenvml.py, for tests)",
}
_NON_SETTING_PREFIXES = ("COCAQ_TEST_", "COCAQ_BENCH_")
# The variables of the repository's own scripts and tests, by exact name: an admin who builds Slurm and
# pyslurm with tests/slurm/ exports them in the shell cocaq then runs in. Exact names, not a prefix, so
# that `COCAQ_SLURM_BACKEND` (for COCAQ_SLURM__BACKEND) is still a typo; tests/test_env_namespace.py
# checks that every COCAQ_* name in the repository is a setting, listed here, or COCAQ_TEST_*/BENCH_*.
TOOL_ENV = {
    "COCAQ_SLURM_SOURCE": "tests/slurm/build.sh: Slurm 25.11's source tarball",
    "COCAQ_SLURM_VERSION": "tests/slurm/cluster.sh, capture_sacct.sh: the test cluster's Slurm",
    "COCAQ_SLURM25_PREFIX": "tests/slurm/build.sh: where Slurm 25.11 is installed",
    "COCAQ_SLURM25_SYSCONF": "tests/slurm/build.sh: its configuration folder",
    "COCAQ_SLURM_PROLOG": "tests/slurm/cluster.sh: the test cluster's Prolog",
    "COCAQ_SLURM_EPILOG": "tests/slurm/cluster.sh: its Epilog",
    "COCAQ_SLURM_TASK_PROLOG": "tests/slurm/cluster.sh: its TaskProlog",
    "COCAQ_SLURM_TASK_EPILOG": "tests/slurm/cluster.sh: its TaskEpilog",
    "COCAQ_SLURM_EXTRA_CONF": "tests/slurm/cluster.sh: lines added to its slurm.conf",
    "COCAQ_SLURM_USERS": "tests/slurm/cluster.sh: its users",
    "COCAQ_DB_PASS": "tests/slurm/cluster.sh: its slurmdbd's MariaDB password",
    "COCAQ_STOP_MARIADB": "tests/slurm/cluster.sh: `down` stops MariaDB too",
    "COCAQ_SKIP_PROMETHEUS": "tests: skip the tests that need Prometheus",
    "COCAQ_SKIP_SCREENSHOTS": "tests: skip the report screenshots (no Chromium)",
    "COCAQ_CHROMIUM": "tests: the Chromium for the screenshots",
    "COCAQ_SCREENSHOT_DIR": "tests: where the screenshots are copied",
    "COCAQ_UPDATE_GOLDEN": "tests: rewrite the golden e-mails",
    "COCAQ_FUZZ_EXAMPLES": "tests: Hypothesis examples per fuzz test",
}


def is_not_a_setting(name: str) -> bool:
    """True for a COCAQ_* variable that cocaq reads elsewhere or leaves to the repository's tools."""
    return name in _NON_SETTING_ENV or name in TOOL_ENV or name.startswith(_NON_SETTING_PREFIXES)


def _did_you_mean(name: str) -> str:
    """': did you mean X?' for the variable `name` was most likely meant as, or ''; on the error path only."""
    from dataclasses import MISSING
    from difflib import get_close_matches

    known = [*ENV_SHORTHANDS, *_NON_SETTING_ENV, *TOOL_ENV]
    for f in fields(Config):
        section = f.metadata.get("toml", f.name)
        if section in ENV_SECTIONS and f.default_factory is not MISSING:
            known += [f"COCAQ_{section.upper()}__{g.name.upper()}" for g in fields(f.default_factory)]  # type: ignore[arg-type]
    close = get_close_matches(name, known, n=1, cutoff=0.8)
    return f": did you mean {close[0]}?" if close else ""


# The sections that `COCAQ_SECTION__KEY` may set (partitions and node groups only in the file).
ENV_SECTIONS = (
    "cluster", "estimate", "defaults", "collector", "carbon", "shifting", "embodied", "aggregate",
    "retention", "mail", "reports", "api", "advice", "alerts", "study", "slurm",
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
        elif k in ("cores_per_node", "gpus_per_node"):
            values[k] = _whole(key, v, 0, 100000)
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
        v["sources"] = _collector_sources(t["sources"])
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
    if "metrics_listen" in t:
        v["metrics_listen"] = _metrics_listen(t["metrics_listen"])
    for k in ("metrics_token_file", "metrics_tls_cert_file", "metrics_tls_key_file"):
        if k in t:
            v[k] = _str(f"collector.{k}", t[k])
    if ("metrics_tls_cert_file" in v) != ("metrics_tls_key_file" in v):
        raise ConfigError("config: collector: metrics_tls_cert_file and metrics_tls_key_file go together")
    return replace(c, **v)


def _collector_sources(src: Any) -> tuple[str, ...]:
    """collector.sources: known source names, each once, in the order given."""
    if isinstance(src, str):  # from the environment: "nvml,rapl"
        src = [s.strip() for s in src.split(",") if s.strip()]
    if not isinstance(src, list) or not all(isinstance(s, str) for s in src):
        raise ConfigError(f"config: collector.sources: expected a list of source names, got {src!r}")
    for s in src:
        if s not in COLLECTOR_SOURCES:
            raise ConfigError(
                f"config: collector.sources: unknown source {s!r} (known: {', '.join(COLLECTOR_SOURCES)})"
            )
    return tuple(dict.fromkeys(src))


def _metrics_listen(m: Any) -> str:
    """collector.metrics_listen: where the metrics endpoint listens ("" for not at all)."""
    if not isinstance(m, str):
        raise ConfigError(f'config: collector.metrics_listen: expected a string like ":9830", got {m!r}')
    if m.strip():
        try:
            parse_listen(m.strip())
        except ValueError as exc:
            raise ConfigError(f"config: collector.metrics_listen: {exc}") from None
    return m.strip()


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
        elif k in ("gap_tolerance_s", "slack_s") and isinstance(v, str) and not v.replace(".", "").isdigit():
            from cocaq.timeparse import parse_duration

            try:
                seconds = parse_duration(v).total_seconds()
            except (ValueError, CocaqError):
                raise ConfigError(
                    f"config: {section}.{k}: expected seconds or a duration like 2h, got {v!r}"
                ) from None
            values[k] = _num(f"{section}.{k}", seconds, *ranges[k])
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
    m = replace(Mail(), **_mail_values(t))
    _check_mail_login(m)
    _check_mail_texts(m)
    return m


def _mail_values(t: dict[str, Any]) -> dict[str, Any]:
    """Each key of the mail table checked on its own; what they say together is checked after."""
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
    return v


def _check_mail_login(m: Mail) -> None:
    """An SMTP login needs a user and one place for its password, and never crosses a network in clear."""
    import re

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


def _check_mail_texts(m: Mail) -> None:
    """The sender and reply-to addresses, the address template and List-Unsubscribe are well formed."""
    from cocaq.addresses import check_address_template, check_list_unsubscribe, looks_like_address

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
    if "keep_months" in t:
        n = _num("reports.keep_months", t["keep_months"], 0.0, 120.0)
        if n != int(n):
            raise ConfigError(f"config: reports.keep_months: expected whole months, got {t['keep_months']!r}")
        v["keep_months"] = int(n)
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
    for key in ("interactive_partitions", "interactive_qos"):
        if key in t:
            got = _names(f"advice.{key}", t[key])
            v[key] = tuple(dict.fromkeys(n.strip().lower() for n in got if n.strip()))
    if "mig_partitions" in t:
        v["mig_partitions"] = _mig_partitions("advice.mig_partitions", t["mig_partitions"])
    for key in ("partition_max_time", "qos_max_time"):
        if key in t:
            v[key] = _max_times(f"advice.{key}", t[key])
    return replace(Advice(), **v)


def _max_times(key: str, value: Any) -> dict[str, float]:
    """`{ debug = "01:00:00" }` (Slurm's [D-]HH:MM:SS, as slurm.conf and sacctmgr print it) -> hours."""
    if not isinstance(value, dict):
        raise ConfigError(f'config: {key}: expected a table like {{ debug = "01:00:00" }}, got {value!r}')
    from cocaq.timeparse import parse_slurm_duration

    out: dict[str, float] = {}
    for name, text in value.items():
        seconds = None
        if isinstance(text, str):
            try:
                seconds = parse_slurm_duration(text)
            except ValueError:
                seconds = None
        if seconds is None or seconds <= 0:
            raise ConfigError(
                f'config: {key}.{name}: expected a Slurm time limit like "1-12:00:00", got {text!r}'
            )
        out[str(name)] = seconds / S_PER_HOUR
    return out


def _mig_partitions(key: str, value: Any) -> dict[str, str]:
    """`{ "gpu-mig" = "1g.10gb" }`: a partition and the MIG profile (NVIDIA's `<g>g.<mem>gb`) it gives."""
    import re

    if not isinstance(value, dict):
        raise ConfigError(f'config: {key}: expected a table like {{ "gpu-mig" = "1g.10gb" }}, got {value!r}')
    out: dict[str, str] = {}
    for name, profile in value.items():
        if not isinstance(profile, str) or not re.fullmatch(r"[1-7]g\.\d+gb", profile.strip().lower()):
            raise ConfigError(f'config: {key}.{name}: expected a MIG profile like "1g.10gb", got {profile!r}')
        out[str(name)] = profile.strip().lower()
    return out


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


RETENTION_MAX_DAYS = 36500


def _retention(t: Any) -> Retention:
    """`[retention]`: samples_days a whole number of days, 0 meaning keep for ever."""
    if not isinstance(t, dict):
        raise ConfigError(f"config: retention: expected a table, got {t!r}")
    _check_keys("retention", t, {f.name for f in fields(Retention)})
    if "samples_days" not in t:
        return Retention()
    v = t["samples_days"]
    n = v if isinstance(v, int) and not isinstance(v, bool) else None
    if isinstance(v, str) and v.strip().isdigit():  # from the environment
        n = int(v.strip())
    if n is None or not 0 <= n <= RETENTION_MAX_DAYS:
        raise ConfigError(
            "config: retention.samples_days: expected a whole number of days from 1 to "
            f"{RETENTION_MAX_DAYS}, or 0 to keep samples for ever, got {v!r}"
        )
    return Retention(samples_days=n)


def _month(key: str, value: Any) -> str:
    text = _str(key, value).strip()
    import re

    m = re.fullmatch(r"(\d{4})-(\d{2})", text)
    if not m or not 1 <= int(m.group(2)) <= 12 or not 2000 <= int(m.group(1)) <= 2200:
        raise ConfigError(f'config: {key}: expected a month like "2026-09", got {value!r}')
    return text


def _study(t: Any) -> Study:
    if not isinstance(t, dict):
        raise ConfigError(f"config: study: expected a table, got {t!r}")
    _check_keys("study", t, {f.name for f in fields(Study)})
    v: dict[str, Any] = {}
    for k in ("start", "end"):
        if k in t and not (isinstance(t[k], str) and not t[k].strip()):  # "" (an empty variable): unset
            v[k] = _month(f"study.{k}", t[k])
    if "holdout_share" in t:
        v["holdout_share"] = _num("study.holdout_share", t["holdout_share"], 0.05, 0.5)
    for k, lo, hi in (("seed", 0, 2**31 - 1), ("baseline_months", 1, 24), ("bootstrap", 200, 100_000)):
        if k in t and not (k == "seed" and isinstance(t[k], str) and not t[k].strip()):  # "": random
            n = _num(f"study.{k}", t[k], lo, hi)
            if n != int(n):
                raise ConfigError(f"config: study.{k}: expected a whole number, got {t[k]!r}")
            v[k] = int(n)
    if "primary" in t:
        if t["primary"] not in STUDY_OUTCOMES:
            raise ConfigError(
                f"config: study.primary: expected one of {', '.join(STUDY_OUTCOMES)}, got {t['primary']!r}"
            )
        v["primary"] = t["primary"]
    out = replace(Study(), **v)
    if out.end is not None and (out.start is None or out.end < out.start):
        raise ConfigError(f"config: study.end ({out.end}) needs a study.start on or before it")
    return out


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
    if "consumed_energy" in t:
        ce = _str("slurm.consumed_energy", t["consumed_energy"]).lower()
        if ce not in CONSUMED_ENERGY:
            raise ConfigError(
                f"config: slurm.consumed_energy: expected one of {', '.join(CONSUMED_ENERGY)}, "
                f"got {t['consumed_energy']!r}"
            )
        v["consumed_energy"] = ce
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
    for k in ("url", "host", "tls_cert", "tls_key", "ca_file", "munge_socket", "metrics_token_file"):
        if k in t:
            v[k] = _str(f"api.{k}", t[k])
    if "metrics" in t:
        v["metrics"] = _bool("api.metrics", t["metrics"])
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


# The top-level keys of a configuration: its two settings and its sections.
_TOP_LEVEL = (
    "database_url",
    "spool_dir",
    "cluster",
    "estimate",
    "defaults",
    "partitions",
    "node_groups",
    "collector",
    "carbon",
    "shifting",
    "embodied",
    "aggregate",
    "retention",
    "mail",
    "reports",
    "api",
    "advice",
    "alerts",
    "study",
    "slurm",
)


def _from_dict(data: dict[str, Any], source: str) -> Config:
    # The sections are checked in this order: the first problem found is the one reported.
    _check_keys("", data, set(_TOP_LEVEL))
    if "database_url" in data:  # given: the default (platformdirs, a few ms on every command) is not needed
        cfg = Config(source=source, database_url=_str("database_url", data["database_url"]))
    else:
        cfg = Config(source=source)
    if "spool_dir" in data:
        cfg = replace(cfg, spool_dir=_str("spool_dir", data["spool_dir"]))
    cluster, pue_monthly = _cluster(data.get("cluster", {}))
    estimate = _estimate(data.get("estimate", {}))
    default_hw = _hardware("defaults", data.get("defaults", {}), Hardware())
    parts_raw = data.get("partitions", {})
    if not isinstance(parts_raw, dict):
        raise ConfigError(f"config: partitions: expected a table of partitions, got {parts_raw!r}")
    partitions = {name: _hardware(f"partitions.{name}", t, default_hw) for name, t in parts_raw.items()}
    groups = _node_groups(data.get("node_groups", {}), default_hw)
    return replace(
        cfg,
        carbon=_small_table(
            "carbon", data.get("carbon", {}), Carbon, {"gap_tolerance_s": (0.0, 366 * 86400.0)}
        ),
        shifting=_small_table(
            "shifting",
            data.get("shifting", {}),
            Shifting,
            {"slack_s": (0.0, 31 * 86400.0), "min_share": (0.0, 1.0), "min_kg": (0.0, 1e9)},
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
        retention=_retention(data.get("retention", {})),
        pue_monthly=pue_monthly,
        collector=_collector(data.get("collector", {})),
        mail=_mail(data.get("mail", {})),
        reports=_reports(data.get("reports", {})),
        api=_api(data.get("api", {})),
        advice=_advice(data.get("advice", {})),
        alerts=_alerts(data.get("alerts", {})),
        study=_study(data.get("study", {})),
        slurm=_slurm(data.get("slurm", {})),
        cluster=cluster,
        estimate=estimate,
        default_hardware=default_hw,
        partitions=partitions,
        node_groups=groups,
    )


def _cluster(c: Any) -> tuple[Cluster, dict[str, float]]:
    """The cluster section: the cluster, and its PUE by month (`pue_monthly`, kept beside it in Config)."""
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
    return cluster, pue_monthly


def _estimate(e: Any) -> Estimate:
    """The estimate section: what a job without a measurement is estimated from."""
    if not isinstance(e, dict):
        raise ConfigError(f"config: estimate: expected a table, got {e!r}")
    _check_keys("estimate", e, {f.name for f in fields(Estimate)})
    estimate = Estimate(
        gpu_utilisation=_num("estimate.gpu_utilisation", e.get("gpu_utilisation", 1.0), 0.0, 1.0),
        mem_w_per_gb=_num("estimate.mem_w_per_gb", e.get("mem_w_per_gb", 0.3725), 0.0, 100.0),
        cpu_usage=str(e.get("cpu_usage", "totalcpu")),
        max_node_power_w=_num("estimate.max_node_power_w", e.get("max_node_power_w", 20_000.0), 100.0, 1e6),
        gpu_idle_share=_num("estimate.gpu_idle_share", e.get("gpu_idle_share", 0.15), 0.0, 1.0),
        calibrate=_bool("estimate.calibrate", e.get("calibrate", True)),
        calibrate_min_jobs=_whole("estimate.calibrate_min_jobs", e.get("calibrate_min_jobs", 5), 1, 10**6),
        calibrate_buckets=_buckets(e.get("calibrate_buckets", [25, 50, 75])),
    )
    if estimate.cpu_usage not in ("totalcpu", "allocated"):
        raise ConfigError(
            f"config: estimate.cpu_usage: expected 'totalcpu' or 'allocated', got {estimate.cpu_usage!r}"
        )
    return estimate


def _node_groups(groups_raw: Any, default_hw: Hardware) -> tuple[NodeGroup, ...]:
    """The node_groups tables: each a hardware table over `defaults`, with the nodes it names."""
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
    return tuple(groups)


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
        if not name.startswith("COCAQ_") or name in secret_vars or is_not_a_setting(name):
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
                f"environment: {name}: unknown setting{_did_you_mean(name)} (use COCAQ_DATABASE_URL, "
                "COCAQ_SPOOL_DIR, COCAQ_CLUSTER, COCAQ_SMTP_HOST, COCAQ_SMTP_PORT or COCAQ_SECTION__KEY)"
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
