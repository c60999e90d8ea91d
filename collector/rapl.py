"""RAPL energy counters from `{sysfs_root}/class/powercap`, and wrap/reset-safe deltas.

Runs as root on every compute node, so: stdlib only, every read bounded, no symlink followed inside a
zone, and a file that vanishes or holds garbage costs one domain one reading, never the collector.

Only the `/sys/class/powercap/<zone>` entries themselves are followed when they are symlinks: that is how
sysfs presents every class device (they point into `{sysfs_root}/devices/...`).  They are accepted only
when they resolve inside the sysfs root; nothing below a zone directory is ever followed.
"""

from __future__ import annotations

import errno
import math
import os
import re
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cocaq.collector import sysfs
from cocaq.collector.sysfs import MAX_READ
from cocaq.collector.sysfs import OPEN_DIR as _OPEN_DIR

_INT_MAX_LEN = 32  # a counter longer than this is garbage (u64 has 20 digits)
# `intel-rapl:N` / `intel-rapl:N:M` (also what the kernel shows on AMD Zen), and `amd-rapl:*` if a driver
# ever names its zones so.  `intel-rapl-mmio:*` repeats the package-0 counter through MMIO: never matched.
_ZONE = re.compile(r"(intel-rapl|amd-rapl):(\d{1,6})(?::(\d{1,6}))?")
_PACKAGE = re.compile(r"package-(\d{1,6})(?:-die-\d{1,6})?")
_SUBKINDS = ("dram", "core", "uncore")
KINDS = ("package", "dram", "core", "uncore", "psys")


class RaplUnavailable(Exception):
    """This node gives no usable RAPL counter (no domains, or none readable); the reason is one line."""


class RaplReadError(Exception):
    """One sysfs file could not be read this time; the message is the short reason."""


@dataclass(frozen=True, slots=True)
class RaplDomain:
    """One RAPL counter: `id` is stable across reboots ("package-0/dram"), unlike zone numbers."""

    id: str
    name: str
    kind: str
    path: str
    max_energy_uj: int  # 0: unknown (then a drop is always a reset, never a wrap)
    package: int | None


def read_bounded(name: str, dir_fd: int | None = None, limit: int = MAX_READ) -> bytes:
    """`sysfs.read_bounded`, its failures as RaplReadError (with why RAPL may be unreadable)."""
    try:
        return sysfs.read_bounded(name, dir_fd, limit)
    except sysfs.SysfsReadError as exc:
        if exc.permission:
            raise RaplReadError("permission denied (RAPL energy is root-only since CVE-2020-8694)") from None
        raise RaplReadError(str(exc)) from None


def parse_uint(data: bytes) -> int:
    """A sysfs counter: ASCII digits and an optional newline, nothing else."""
    text = data.strip()
    if not text or len(text) > _INT_MAX_LEN or not text.isdigit():
        raise RaplReadError(f"garbage: {data[:40]!r}")
    return int(text)


def _read_in_dir(path: str, names: Iterable[str]) -> dict[str, bytes | RaplReadError]:
    """Read several small files of one directory, opened once with O_NOFOLLOW (so it cannot be swapped)."""
    try:
        dfd = os.open(path, _OPEN_DIR)
    except FileNotFoundError:
        err = RaplReadError("vanished")
        return {n: err for n in names}
    except OSError as exc:
        err = RaplReadError("zone is a symlink: not followed" if exc.errno == errno.ELOOP else str(exc))
        return {n: err for n in names}
    out: dict[str, bytes | RaplReadError] = {}
    try:
        for n in names:
            try:
                out[n] = read_bounded(n, dir_fd=dfd)
            except RaplReadError as exc:
                out[n] = exc
    finally:
        os.close(dfd)
    return out


def _zone_key(name: str) -> tuple[int, int, int] | None:
    m = _ZONE.fullmatch(name)
    if not m:
        return None
    return (0 if m.group(1) == "intel-rapl" else 1, int(m.group(2)), int(m.group(3) or -1))


class Rapl:
    """The node's RAPL domains, found once at construction; `read()` gives energy_uj per domain id.

    Raises RaplUnavailable when there is no domain or none can be read (e.g. not root).
    """

    def __init__(self, sysfs_root: str = "/sys") -> None:
        self.sysfs_root = sysfs_root
        self.errors: dict[str, str] = {}  # domain id -> why the last read() skipped it
        self.skipped: dict[str, str] = {}  # zone entry -> why discovery ignored it
        self._domains = self._discover()
        if not self._domains:
            raise RaplUnavailable(f"rapl: {self._powercap} has no intel-rapl domains")
        self.read()  # raises RaplUnavailable when nothing is readable

    @property
    def _powercap(self) -> str:
        return os.path.join(self.sysfs_root, "class", "powercap")

    def _zone_dir(self, entry: os.DirEntry[str], real_root: str) -> str | None:
        """The zone's real directory: a plain dir, or a class symlink that stays inside the sysfs root."""
        if entry.is_dir(follow_symlinks=False):
            return entry.path
        if not entry.is_symlink():
            self.skipped[entry.name] = "not a directory"
            return None
        target = os.path.realpath(entry.path)
        if os.path.commonpath([target, real_root]) != real_root:
            self.skipped[entry.name] = "symlink leaves the sysfs root: not followed"
            return None
        return target

    def _discover(self) -> list[RaplDomain]:
        real_root = os.path.realpath(self.sysfs_root)
        zones: list[tuple[tuple[int, int, int], str, str]] = []
        try:
            with os.scandir(self._powercap) as it:
                for entry in it:
                    key = _zone_key(entry.name)
                    if key is None:
                        continue
                    path = self._zone_dir(entry, real_root)
                    if path is not None:
                        zones.append((key, entry.name, path))
        except OSError as exc:
            raise RaplUnavailable(f"rapl: cannot list {self._powercap}: {exc.strerror or exc}") from None
        zones.sort()
        parent_names: dict[tuple[int, int], str] = {}
        domains: dict[str, RaplDomain] = {}
        for (vendor, top, sub), zone, path in zones:  # parents sort before their subzones
            got = _read_in_dir(path, ("name", "max_energy_range_uj"))
            raw_name = got["name"]
            if isinstance(raw_name, RaplReadError):
                self.skipped[zone] = f"name: {raw_name}"
                continue
            name = raw_name.decode("ascii", "replace").strip()
            raw_max = got["max_energy_range_uj"]
            try:
                max_uj = parse_uint(raw_max) if isinstance(raw_max, bytes) else 0
            except RaplReadError:
                max_uj = 0
            if sub < 0:
                parent_names[(vendor, top)] = name
                dom = self._top_domain(name, path, max_uj)
            else:
                parent = parent_names.get((vendor, top))
                dom = self._sub_domain(parent, name, path, max_uj)
            if dom is None:
                self.skipped[zone] = f"unknown domain name {name[:40]!r}"
            elif dom.id in domains:
                # Counting a counter twice is worse than not counting it: keep the first.
                self.skipped[zone] = f"duplicate of {dom.id}"
            else:
                domains[dom.id] = dom
        return list(domains.values())

    @staticmethod
    def _top_domain(name: str, path: str, max_uj: int) -> RaplDomain | None:
        m = _PACKAGE.fullmatch(name)
        if m:
            return RaplDomain(name, name, "package", path, max_uj, int(m.group(1)))
        if name == "psys":
            return RaplDomain("psys", name, "psys", path, max_uj, None)
        return None

    @staticmethod
    def _sub_domain(parent: str | None, name: str, path: str, max_uj: int) -> RaplDomain | None:
        m = _PACKAGE.fullmatch(parent or "")
        if not m or name not in _SUBKINDS:
            return None
        return RaplDomain(f"{parent}/{name}", name, name, path, max_uj, int(m.group(1)))

    def domains(self) -> list[RaplDomain]:
        """All domains found, packages first, each followed by its subdomains."""
        return list(self._domains)

    def counted(self) -> list[RaplDomain]:
        """The domains whose sum is the node's CPU+DRAM energy: packages and dram.

        Never psys on top of packages (psys is the whole SoC/platform and already holds them), never
        core/uncore (they are parts of their package).  Only a node with no package domain at all
        counts psys, its one whole-CPU measure.
        """
        chosen = [d for d in self._domains if d.kind in ("package", "dram")]
        if not any(d.kind == "package" for d in chosen):
            chosen = [d for d in self._domains if d.kind == "psys"]
        return chosen

    def read(self) -> dict[str, int]:
        """energy_uj per domain id; a domain unreadable this time is left out, its reason in `.errors`."""
        values: dict[str, int] = {}
        self.errors = {}
        for dom in self._domains:
            raw = _read_in_dir(dom.path, ("energy_uj",))["energy_uj"]
            try:
                if isinstance(raw, RaplReadError):
                    raise raw
                values[dom.id] = parse_uint(raw)
            except RaplReadError as exc:
                self.errors[dom.id] = f"energy_uj: {exc}"
        if not values:
            first = next(iter(self.errors.values()), "no domain")
            raise RaplUnavailable(f"rapl: no readable energy_uj ({first})")
        return values


@dataclass(frozen=True, slots=True)
class RaplAnomaly:
    """An interval that gave no energy for one domain, and why (kept for logs and counters)."""

    ts: float
    domain: str
    reason: str


class RaplCounter:
    """Turns successive energy_uj readings into joules per interval, safe against wraps and resets.

    A counter below its previous value is a wrap (`cur + max - prev`) only when the implied power is
    plausible; otherwise it is a reset (reboot, driver reload) or a bogus reading.  An implausible
    interval yields no energy for that domain (left out of the result, not 0, so a made-up 0 W never
    reaches the idle baseline) and is recorded in `.anomalies`.

    A single wrap per interval is assumed, so sample more often than `max_energy_uj / power` (about
    15 minutes at 300 W for the usual 262 kJ range).  After a reboot the counters restart: a daemon
    that restores state across a reboot should call `forget()` (a drop is caught anyway unless a wrap
    would be plausible).
    """

    def __init__(
        self,
        max_energy_uj: Mapping[str, int] | None = None,
        max_plausible_w: float = 1000.0,
        keep_anomalies: int = 256,
    ) -> None:
        self.max_energy_uj: dict[str, int] = dict(max_energy_uj or {})
        self.max_plausible_w = max_plausible_w
        self._prev: dict[str, tuple[float, int]] = {}
        self.anomalies: deque[RaplAnomaly] = deque(maxlen=keep_anomalies)
        self.anomaly_count = 0

    @classmethod
    def for_domains(cls, domains: Iterable[RaplDomain], max_plausible_w: float = 1000.0) -> RaplCounter:
        """A counter knowing each domain's wrap range."""
        return cls({d.id: d.max_energy_uj for d in domains}, max_plausible_w)

    def _anomaly(self, ts: float, domain: str, reason: str) -> None:
        self.anomalies.append(RaplAnomaly(ts, domain, reason))
        self.anomaly_count += 1

    def update(self, ts: float, values: Mapping[str, int]) -> dict[str, float]:
        """Joules per domain since that domain's previous reading; {} on the first update."""
        out: dict[str, float] = {}
        for dom, cur in values.items():
            if not isinstance(cur, int) or cur < 0:
                self._anomaly(ts, dom, f"bad value {cur!r}")
                continue
            top = self.max_energy_uj.get(dom, 0)
            if top > 0 and cur > top:
                self._anomaly(ts, dom, f"value {cur} above max_energy_range_uj {top}")
                continue  # keep the last good reading
            prev = self._prev.get(dom)
            self._prev[dom] = (ts, cur)
            if prev is None:
                continue
            pts, puj = prev
            dt = ts - pts
            if not dt > 0:
                self._anomaly(ts, dom, f"time did not advance ({dt:+.3f} s)")
                continue
            if cur >= puj:
                delta, how = cur - puj, "jump"
            elif top > 0:
                delta, how = cur + top - puj, "drop (reset, or a wrap too fast to be real)"
            else:
                self._anomaly(ts, dom, "counter dropped and its wrap range is unknown: reset")
                continue
            watts = delta / 1e6 / dt
            if watts > self.max_plausible_w:
                self._anomaly(ts, dom, f"{how}: {watts:.0f} W over {dt:.1f} s > {self.max_plausible_w:g} W")
                continue
            out[dom] = delta / 1e6
        return out

    def forget(self, domain: str | None = None) -> None:
        """Drop the previous reading (of one domain, or all), e.g. after a reboot."""
        if domain is None:
            self._prev.clear()
        else:
            self._prev.pop(domain, None)

    def to_state(self) -> dict[str, Any]:
        """JSON-able state, so a restarted collector continues the series without a gap."""
        return {
            "v": 1,
            "max_energy_uj": dict(self.max_energy_uj),
            "max_plausible_w": self.max_plausible_w,
            "prev": {d: [ts, uj] for d, (ts, uj) in self._prev.items()},
        }

    @classmethod
    def from_state(
        cls, state: Mapping[str, Any], max_energy_uj: Mapping[str, int] | None = None
    ) -> RaplCounter:
        """Restore `to_state()`; malformed entries are dropped (a fresh start beats a crash).

        `max_energy_uj` (from the domains found now) overrides the stored ranges.
        """
        ranges: dict[str, int] = {}
        stored = state.get("max_energy_uj") if isinstance(state, Mapping) else None
        if isinstance(stored, Mapping):
            ranges = {str(k): v for k, v in stored.items() if isinstance(v, int) and v >= 0}
        ranges.update(max_energy_uj or {})
        w = state.get("max_plausible_w") if isinstance(state, Mapping) else None
        watts = 1000.0
        if isinstance(w, int | float) and not isinstance(w, bool) and math.isfinite(w) and w > 0:
            watts = float(w)
        counter = cls(ranges, watts)
        prev = state.get("prev") if isinstance(state, Mapping) else None
        if isinstance(prev, Mapping):
            for d, item in prev.items():
                if (
                    isinstance(item, list | tuple)
                    and len(item) == 2
                    and isinstance(item[0], int | float)
                    and math.isfinite(item[0])
                    and isinstance(item[1], int)
                    and not isinstance(item[1], bool)
                    and item[1] >= 0
                ):
                    counter._prev[str(d)] = (float(item[0]), item[1])
        return counter
