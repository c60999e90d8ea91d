"""The hook's few settings, from cocaq.toml, at the cost of a stat() on most calls.

Parsing TOML and validating the full configuration costs more than a hook's whole budget on a slow
node, so the first call after the file (or a COCAQ_* variable) changes does it with cocaq.config_load and
caches the result with marshal in a root-only directory; later calls check the file's identity and
load the cache. A configuration that does not validate is reported and the defaults are used: a
hook must run anyway.
"""

from __future__ import annotations

import marshal
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

CACHE_DIR = "/run/cocaq"
CACHE_VERSION = 2
DEFAULT_PATH = "/etc/cocaq/cocaq.toml"


def _key(path: str, explicit: bool, environ: Mapping[str, str]) -> tuple[Any, ...]:
    try:
        st = os.stat(path)
        ident: tuple[Any, ...] = (st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev)
    except OSError as exc:
        ident = ("missing", exc.errno)
    env = tuple(sorted((k, v) for k, v in environ.items() if k.startswith("COCAQ_")))
    return (CACHE_VERSION, path, explicit, ident, env)


def _compute(path: str | None, environ: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    from cocaq.config import Config
    from cocaq.config_load import load_config
    from cocaq.errors import ConfigError

    problems: list[str] = []
    try:
        cfg = load_config(path, dict(environ))
    except ConfigError as exc:
        problems.append(f"config unusable, hook uses defaults: {exc}")
        cfg = Config(database_url="sqlite://", source="defaults")
    except Exception as exc:  # a parser bug must not fail every job on the node: the defaults still work
        problems.append(f"config unusable ({type(exc).__name__}), hook uses defaults: {str(exc)[:200]}")
        cfg = Config(database_url="sqlite://", source="defaults")
    c = cfg.collector
    return (
        {
            "spool_dir": cfg.spool_dir,
            "cluster": cfg.cluster.name,
            "sources": list(c.sources),
            "nvml": c.nvml,
            "sysfs_root": c.sysfs_root,
            "hook_log": c.hook_log,
            "annotate_dir": c.annotate_dir,
        },
        problems,
    )


def load(
    config_path: str | None, environ: Mapping[str, str] | None = None
) -> tuple[dict[str, Any], list[str]]:
    """(settings, problems) for the hook; never raises for a bad configuration."""
    env = os.environ if environ is None else environ
    explicit = config_path or env.get("COCAQ_CONFIG")
    path = explicit or DEFAULT_PATH
    key = _key(path, bool(explicit), env)
    cache_dir = env.get("COCAQ_TEST_HOOK_CACHE_DIR") or CACHE_DIR
    cache = os.path.join(cache_dir, "hook-settings.marshal")
    try:
        fd = os.open(cache, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if st.st_uid == os.geteuid() and st.st_size < 65536 and not st.st_mode & 0o022:
                cached = marshal.loads(os.read(fd, 65536))
                if isinstance(cached, tuple) and len(cached) == 3 and cached[0] == key:
                    return cached[1], list(cached[2])
        finally:
            os.close(fd)
    except (OSError, EOFError, ValueError, TypeError):
        pass
    settings, problems = _compute(explicit, env)
    try:
        from cocaq.collector.spool import ensure_dir, write_atomic

        ensure_dir(cache_dir, 0o700)
        write_atomic(cache_dir, "hook-settings.marshal", marshal.dumps((key, settings, problems)))
    except Exception:  # the cache is an optimisation only
        pass
    return settings, problems
