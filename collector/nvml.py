"""NVML access for the hooks and the collector: loading, device identities, readings, Slurm GPU mapping.

Why a layer: the prolog/epilog run as root inside slurmd's time budget and must never fail a job, so every
NVML problem becomes data (``GpuReading.gone`` / ``.error``, an error string from ``resolve``) instead of
an exception, and only ``Nvml.open`` raises (``NvmlUnavailable``, one line, for the hook's error list).
The library (real ``pynvml`` or ``cocaq.collector.fakenvml``) is imported only by ``Nvml.open``.

Slurm names a job's GPUs by index = the device *minor number* (``/dev/nvidiaN``), not NVML's enumeration
index (PCI bus order); UUIDs are matched by UUID.  See docs/node-side.md, "GPU identity".

``GpuEnergyTracker`` turns readings into per-device energy since it started: the NVML energy counter
when the GPU has one (exact), else the trapezoid integral of power, never negative or absurd across a
counter reset (driver reload), a gap or a lost GPU.  Its state is JSON-able so the collector can keep it
across restarts.  Stdlib only.
"""

from __future__ import annotations

import math
import time

from cocaq.units import MILLIJOULES_PER_J, MILLIWATTS_PER_W

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~2 ms of a prolog's budget
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "MAX_PLAUSIBLE_POWER_W",
    "GpuEnergyTracker",
    "GpuId",
    "GpuReading",
    "Nvml",
    "NvmlUnavailable",
]

# Upper bound for any one GPU's power when the power limit is unknown (the largest boards draw ~1.2 kW).
MAX_PLAUSIBLE_POWER_W = 1500.0

# NVML return codes (identical in nvidia-ml-py and the fake); names for error strings.
_NOT_SUPPORTED = 3
_NOT_FOUND = 6
_GPU_IS_LOST = 15
_CODE_NAMES = {
    1: "NVML_ERROR_UNINITIALIZED",
    2: "NVML_ERROR_INVALID_ARGUMENT",
    3: "NVML_ERROR_NOT_SUPPORTED",
    4: "NVML_ERROR_NO_PERMISSION",
    6: "NVML_ERROR_NOT_FOUND",
    9: "NVML_ERROR_DRIVER_NOT_LOADED",
    10: "NVML_ERROR_TIMEOUT",
    12: "NVML_ERROR_LIBRARY_NOT_FOUND",
    13: "NVML_ERROR_FUNCTION_NOT_FOUND",
    15: "NVML_ERROR_GPU_IS_LOST",
    16: "NVML_ERROR_RESET_REQUIRED",
    17: "NVML_ERROR_OPERATING_SYSTEM",
    18: "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
    999: "NVML_ERROR_UNKNOWN",
}
_MAX_TEXT = 256  # bound on strings taken from the library (names, UUIDs, messages)
_MAX_RANGE = 1024  # bound on "a-b" ranges in a GPU list
_NO_GPU_WORDS = {"nodevfiles", "none", "void", "-1"}  # "no GPU" in CUDA_VISIBLE_DEVICES (Slurm, users)


def import_pynvml() -> Any:
    """`import pynvml`, minus the ~15 ms of `ctypes.util` it imports for a name it never calls on Linux.

    nvidia-ml-py does `from ctypes.util import find_library` at import time but loads
    libnvidia-ml.so.1 by name on Linux; in a prolog with a 50 ms budget that import is a third of it.
    A stand-in whose find_library loads the real module on first call is in place only during the import.
    """
    import sys

    if "pynvml" in sys.modules or not sys.platform.startswith("linux") or "ctypes.util" in sys.modules:
        import pynvml

        return pynvml
    import types

    stub = types.ModuleType("ctypes.util")

    def find_library(name: str) -> str | None:
        import importlib

        return importlib.import_module("ctypes.util").find_library(name)

    stub.find_library = find_library  # type: ignore[attr-defined]
    sys.modules["ctypes.util"] = stub
    try:
        import pynvml
    finally:
        if sys.modules.get("ctypes.util") is stub:
            del sys.modules["ctypes.util"]
    return pynvml


class NvmlUnavailable(Exception):
    """NVML cannot be used on this node (no library, no driver, init failed); ``str()`` is one line."""


def _one_line(text: object) -> str:
    s = " ".join(str(text).split())
    return s[:_MAX_TEXT]


def _text(v: object) -> str:
    """A library string (older pynvml returns bytes), bounded and without control characters."""
    s = v.decode("utf-8", "replace") if isinstance(v, bytes | bytearray) else str(v)
    return "".join(c if c.isprintable() else "?" for c in s[:_MAX_TEXT]).strip()


class GpuId:
    """A GPU's identity: ``index`` is NVML's (PCI order, may change across a driver reload); ``minor`` is
    what Slurm's indices mean; ``uuid`` is what stays the same.

    (Plain slotted classes rather than dataclasses: importing `dataclasses` costs a prolog ~12 ms.)
    """

    __slots__ = ("index", "minor", "name", "pci_bus_id", "uuid")

    def __init__(self, index: int, minor: int | None, uuid: str, pci_bus_id: str, name: str) -> None:
        self.index = index
        self.minor = minor
        self.uuid = uuid
        self.pci_bus_id = pci_bus_id
        self.name = name

    def _key(self) -> tuple[Any, ...]:
        return (self.index, self.minor, self.uuid, self.pci_bus_id, self.name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GpuId) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"GpuId({self.index}, minor={self.minor}, uuid={self.uuid!r}, pci={self.pci_bus_id!r})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "minor": self.minor,
            "uuid": self.uuid,
            "pci_bus_id": self.pci_bus_id,
            "name": self.name,
        }


class GpuReading:
    """One reading of one GPU; a value NVML could not give is None and says why in ``error``."""

    __slots__ = (
        "energy_mj",
        "error",
        "gone",
        "mem_total_mb",
        "mem_used_mb",
        "power_w",
        "ts",
        "util_pct",
        "uuid",
    )

    def __init__(
        self,
        uuid: str,
        ts: float,
        energy_mj: int | None,
        power_w: float | None,
        util_pct: float | None,
        mem_used_mb: float | None,
        mem_total_mb: float | None,
        gone: bool = False,
        error: str | None = None,
    ) -> None:
        self.uuid = uuid
        self.ts = ts
        self.energy_mj = energy_mj
        self.power_w = power_w
        self.util_pct = util_pct
        self.mem_used_mb = mem_used_mb
        self.mem_total_mb = mem_total_mb
        self.gone = gone
        self.error = error

    def __repr__(self) -> str:
        return f"GpuReading({self.to_dict()!r})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "uuid": self.uuid,
            "ts": self.ts,
            "energy_mj": self.energy_mj,
            "power_w": self.power_w,
            "util_pct": self.util_pct,
            "mem_used_mb": self.mem_used_mb,
            "mem_total_mb": self.mem_total_mb,
            "gone": self.gone,
            "error": self.error,
        }


class Nvml:
    """An initialised NVML library (real or fake).  Use ``Nvml.open``; close it (or ``with``) when done."""

    def __init__(self, lib: Any, spec: str) -> None:
        self._lib = lib
        self.spec = spec
        self._error_cls: type[BaseException] = getattr(lib, "NVMLError", Exception)
        self._devices: list[GpuId] | None = None
        self._handles: dict[str, Any] = {}
        self._closed = False
        self.errors: list[str] = []  # problems met while enumerating devices

    @classmethod
    def open(cls, spec: str = "pynvml") -> Nvml:
        """Load and initialise NVML.

        ``spec``: "pynvml" (nvidia-ml-py, the real driver) or "fake:<N-or-TOML-path>" (fakenvml).
        Raises NvmlUnavailable (one line) when the library or driver is missing or init fails, and
        ValueError for a malformed spec (a configuration error, not a node condition).
        """
        spec = spec.strip()
        if spec == "pynvml":
            try:
                lib: Any = import_pynvml()
            except ImportError as exc:
                raise NvmlUnavailable(f"nvml: pynvml not installed: {_one_line(exc)}") from None
        elif spec.startswith("fake:"):
            from . import fakenvml

            fakenvml.configure(spec[len("fake:") :])  # ValueError for a bad spec
            lib = fakenvml
        else:
            raise ValueError(f"nvml: unknown NVML spec {spec!r} (want 'pynvml' or 'fake:<N or path>')")
        error_cls: type[BaseException] = getattr(lib, "NVMLError", Exception)
        try:
            lib.nvmlInit()
        except error_cls as exc:
            raise NvmlUnavailable(f"nvml: {_one_line(exc)}") from None
        except OSError as exc:  # a broken libnvidia-ml.so
            raise NvmlUnavailable(f"nvml: cannot load the NVML library: {_one_line(exc)}") from None
        return cls(lib, spec)

    def __enter__(self) -> Nvml:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Shut NVML down once (nvmlInit/nvmlShutdown are reference counted)."""
        if self._closed:
            return
        self._closed = True
        self._handles.clear()
        try:
            self._lib.nvmlShutdown()
        except self._error_cls as exc:  # shutting down must not fail a hook; note it for the log
            self.errors.append(f"nvml: nvmlShutdown: {_one_line(exc)}")

    def driver_version(self) -> str | None:
        try:
            return _text(self._lib.nvmlSystemGetDriverVersion())
        except self._error_cls:
            return None

    def _err(self, exc: BaseException, what: str, uuid: str) -> str:
        value = getattr(exc, "value", None)
        name = _CODE_NAMES.get(value, f"NVML error {value}") if isinstance(value, int) else "NVML error"
        return f"nvml: {name} ({_one_line(exc)}) in {what} for {uuid}"

    def devices(self) -> list[GpuId]:
        """All GPUs NVML enumerates, in its order (cached).  A device that fails is left out and noted in
        ``errors`` (a GPU lost before the job starts cannot be identified)."""
        if self._devices is not None:
            return list(self._devices)
        lib = self._lib
        found: list[GpuId] = []
        try:
            count = int(lib.nvmlDeviceGetCount())
        except self._error_cls as exc:
            self.errors.append(self._err(exc, "nvmlDeviceGetCount", "all GPUs"))
            count = 0
        for i in range(count):
            try:
                h = lib.nvmlDeviceGetHandleByIndex(i)
                uuid = _text(lib.nvmlDeviceGetUUID(h))
                name = _text(lib.nvmlDeviceGetName(h))
                bus = _text(lib.nvmlDeviceGetPciInfo(h).busId)
            except self._error_cls as exc:
                self.errors.append(self._err(exc, "device enumeration", f"NVML index {i}"))
                continue
            minor: int | None
            try:
                minor = int(lib.nvmlDeviceGetMinorNumber(h))
            except self._error_cls as exc:  # not supported on some platforms: only UUIDs can match it
                self.errors.append(self._err(exc, "nvmlDeviceGetMinorNumber", uuid))
                minor = None
            found.append(GpuId(index=i, minor=minor, uuid=uuid, pci_bus_id=bus, name=name))
            self._handles[uuid] = h
        self._devices = found
        return list(found)

    def find(self, uuid: str) -> GpuId | None:
        """The enumerated device with this UUID (case-insensitive), or None."""
        want = uuid.strip().lower()
        for g in self.devices():
            if g.uuid.lower() == want:
                return g
        return None

    def _handle(self, uuid: str) -> Any:
        h = self._handles.get(uuid)
        if h is None:  # by UUID, never by index: the index may have moved since the prolog
            h = self._lib.nvmlDeviceGetHandleByUUID(uuid)
            self._handles[uuid] = h
        return h

    def power_limit_w(self, gpu: GpuId | str) -> float | None:
        """The enforced power limit in W (bounds plausible energy), or None."""
        uuid = gpu if isinstance(gpu, str) else gpu.uuid
        try:
            mw = float(self._lib.nvmlDeviceGetEnforcedPowerLimit(self._handle(uuid)))
        except self._error_cls:
            return None
        return mw / MILLIWATTS_PER_W if math.isfinite(mw) and mw > 0 else None

    def pids(self, gpu: GpuId | str) -> list[int] | None:
        """PIDs of compute processes on the GPU ([] when none), or None when NVML cannot say."""
        uuid = gpu if isinstance(gpu, str) else gpu.uuid
        try:
            procs = self._lib.nvmlDeviceGetComputeRunningProcesses(self._handle(uuid))
        except self._error_cls:
            return None
        return [int(p.pid) for p in procs]

    def read(self, gpu: GpuId | str, energy_only: bool = False) -> GpuReading:
        """Read one GPU; never raises for a lost or unsupported device.

        ``energy_only`` (the hooks' fast path) reads the energy counter and power, not utilisation or
        memory: power at the job's edges closes the collector's integral of power for a GPU without a
        counter (or whose counter reset mid-job).  A lost GPU (GPU_IS_LOST, or its UUID no
        longer found) gives ``gone=True``; other failures leave the value None and explain in ``error``.
        """
        uuid = gpu if isinstance(gpu, str) else gpu.uuid
        r = GpuReading(uuid, time.time(), None, None, None, None, None)
        errors: list[str] = []
        lib = self._lib

        def fail(exc: BaseException, what: str) -> bool:
            """Record the failure; True when the device is gone (stop reading it)."""
            errors.append(self._err(exc, what, uuid))
            if getattr(exc, "value", None) in (_GPU_IS_LOST, _NOT_FOUND):
                r.gone = True
                self._handles.pop(uuid, None)
            return r.gone

        try:
            h = self._handle(uuid)
        except self._error_cls as exc:
            fail(exc, "nvmlDeviceGetHandleByUUID")
            r.error = "; ".join(errors)
            return r
        try:
            r.energy_mj = int(lib.nvmlDeviceGetTotalEnergyConsumption(h))
        except self._error_cls as exc:
            if fail(exc, "nvmlDeviceGetTotalEnergyConsumption"):
                r.error = "; ".join(errors)
                return r
        try:
            r.power_w = float(lib.nvmlDeviceGetPowerUsage(h)) / MILLIWATTS_PER_W
        except self._error_cls as exc:
            fail(exc, "nvmlDeviceGetPowerUsage")
        if not energy_only and not r.gone:
            try:
                r.util_pct = float(lib.nvmlDeviceGetUtilizationRates(h).gpu)
            except self._error_cls as exc:
                fail(exc, "nvmlDeviceGetUtilizationRates")
        if not energy_only and not r.gone:
            try:
                mem = lib.nvmlDeviceGetMemoryInfo(h)
                r.mem_used_mb = float(mem.used) / 1048576.0
                r.mem_total_mb = float(mem.total) / 1048576.0
            except self._error_cls as exc:
                fail(exc, "nvmlDeviceGetMemoryInfo")
        if errors:
            r.error = "; ".join(errors)
        return r

    def resolve(self, slurm_gpus: str | None, cuda_visible: str | None) -> tuple[list[GpuId], list[str]]:
        """Map Slurm's GPU list to devices: ``(gpus, errors)``; unmatched entries are skipped with an error.

        ``slurm_gpus`` ($SLURM_JOB_GPUS) wins; ``cuda_visible`` ($CUDA_VISIBLE_DEVICES) is used only when
        the first is absent (None or blank).  Integers and ranges ("0-2") are device minor numbers (never
        list positions); "GPU-..." entries match by UUID (a unique prefix is accepted, as CUDA does);
        "MIG-..." entries map to their parent GPU when NVML can tell.
        """
        raw = slurm_gpus if slurm_gpus is not None and slurm_gpus.strip() else cuda_visible
        if raw is None:
            return [], []
        raw = raw[:4096]
        devices = self.devices()
        by_minor = {g.minor: g for g in devices if g.minor is not None}
        out: list[GpuId] = []
        errors: list[str] = []

        def add(g: GpuId) -> None:
            if g not in out:
                out.append(g)

        for entry in (e.strip() for e in raw.split(",")):
            if not entry or entry.lower() in _NO_GPU_WORDS:
                continue
            shown = _one_line(entry)[:64]
            low = entry.lower()
            if low.startswith("gpu-"):
                hits = [g for g in devices if g.uuid.lower() == low] or [
                    g for g in devices if g.uuid.lower().startswith(low)
                ]
                if len(hits) == 1:
                    add(hits[0])
                else:
                    why = "no such GPU" if not hits else "ambiguous UUID prefix"
                    errors.append(f"gpu {shown!r}: {why} on this node")
            elif low.startswith("mig-"):
                parent, err = self._mig_parent(entry, devices)
                if parent is not None:
                    add(parent)
                else:
                    errors.append(f"gpu {shown!r}: {err}")
            else:
                minors = _parse_indices(entry)
                if minors is None:
                    errors.append(f"gpu {shown!r}: not a GPU index, range, UUID or MIG id")
                    continue
                for m in minors:
                    g = by_minor.get(m)
                    if g is None:
                        errors.append(f"gpu index {m}: no device with minor number {m} on this node")
                    else:
                        add(g)
        return out, errors

    def _mig_parent(self, entry: str, devices: list[GpuId]) -> tuple[GpuId | None, str]:
        """The physical GPU behind a MIG id: "MIG-GPU-<uuid>/<gi>/<ci>" (CUDA 11.0-11.x) names it; a
        "MIG-<uuid>" asks NVML (handle by UUID -> parent handle)."""
        body = entry[4:]
        if body.lower().startswith("gpu-"):
            parent_uuid = body.split("/", 1)[0].lower()
            for g in devices:
                if g.uuid.lower() == parent_uuid:
                    return g, ""
            return None, "parent GPU of this MIG device is not on this node"
        lib = self._lib
        get_parent = getattr(lib, "nvmlDeviceGetDeviceHandleFromMigDeviceHandle", None)
        if get_parent is None:
            return None, "cannot determine the parent GPU of this MIG device"
        try:
            parent = get_parent(lib.nvmlDeviceGetHandleByUUID(entry))
            parent_uuid = _text(lib.nvmlDeviceGetUUID(parent)).lower()
        except self._error_cls as exc:
            return None, f"cannot determine the parent GPU of this MIG device ({_one_line(exc)})"
        for g in devices:
            if g.uuid.lower() == parent_uuid:
                return g, ""
        return None, "parent GPU of this MIG device is not on this node"


def _parse_indices(entry: str) -> list[int] | None:
    """ "3" -> [3]; "0-2" -> [0, 1, 2]; anything else -> None."""
    a, sep, b = entry.partition("-")
    try:
        lo = int(a.strip(), 10)
        hi = int(b.strip(), 10) if sep else lo
    except ValueError:
        return None
    if lo < 0 or hi < lo or hi - lo >= _MAX_RANGE:
        return None
    return list(range(lo, hi + 1))


# ---------------------------------------------------------------------------------------------------------
# Energy accounting.

SOURCE_COUNTER = "nvml"
SOURCE_POWER = "nvml-power-integral"


class _Dev:
    """Tracker state of one GPU.  Counter energy is kept in integer mJ so the counter path stays exact."""

    __slots__ = (
        "anomalies",
        "counter_mj",
        "gone",
        "gone_ts",
        "last_mj",
        "last_power",
        "last_ts",
        "limit_w",
        "power_j",
        "t0",
        "t1",
        "used_power",
    )

    def __init__(self) -> None:
        self.counter_mj = 0  # energy from counter deltas, mJ
        self.power_j = 0.0  # energy from power integration, J
        self.last_ts: float | None = None
        self.last_mj: int | None = None
        self.last_power: float | None = None
        self.limit_w: float | None = None
        self.t0: float | None = None
        self.t1: float | None = None
        self.gone = False
        self.gone_ts: float | None = None
        self.used_power = False  # some interval was integrated for lack of a counter
        self.anomalies = 0

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}


def _num_or_none(v: object, what: str) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ValueError(f"GpuEnergyTracker state: {what} must be a finite number or null")
    return float(v)


class GpuEnergyTracker:
    """Cumulative energy per GPU (J) since the tracker first saw it, fed with consecutive readings.

    Per interval between two readings: the counter delta when both have a counter (exact, source
    "nvml"); otherwise the trapezoid of the two powers (source "nvml-power-integral"; one power only: a
    rectangle).  A counter that goes backwards (driver reload / reset) or jumps beyond what the board
    could draw is not trusted: that interval is integrated from power instead, and counted in
    ``anomalies``.  Every interval is capped at ``max_power_w`` (2x the power limit when known, else
    1500 W) times its length, so a glitch can never produce negative or absurd energy.  An interval longer
    than ``max_gap_s`` without a counter is still integrated (best estimate) but counted as an anomaly.
    A gone reading stops accumulation; the interval up to it and any time while gone are not counted.
    Methods are all "measured" (the integral is a measurement at a coarser grain, labelled by source).
    """

    STATE_VERSION = 1

    def __init__(self, max_power_w: float = MAX_PLAUSIBLE_POWER_W, max_gap_s: float = 300.0) -> None:
        self.max_power_w = max_power_w
        self.max_gap_s = max_gap_s
        self.anomalies = 0
        self._devs: dict[str, _Dev] = {}

    def set_power_limit(self, uuid: str, watts: float | None) -> None:
        """The GPU's power limit: intervals are capped at 2x it (instead of ``max_power_w``)."""
        d = self._devs.setdefault(uuid, _Dev())
        d.limit_w = watts if watts is not None and math.isfinite(watts) and watts > 0 else None

    def _cap_w(self, d: _Dev) -> float:
        return min(2.0 * d.limit_w, self.max_power_w) if d.limit_w else self.max_power_w

    def _anomaly(self, d: _Dev) -> None:
        d.anomalies += 1
        self.anomalies += 1

    def update(self, r: GpuReading) -> float:
        """Account one reading; returns the energy (J) added for the interval it closes."""
        d = self._devs.setdefault(r.uuid, _Dev())
        if r.gone:
            if not d.gone:
                d.gone, d.gone_ts = True, r.ts
            d.last_ts = d.last_mj = d.last_power = None  # no baseline: the time while gone is not counted
            return 0.0
        if not math.isfinite(r.ts):
            self._anomaly(d)
            return 0.0
        power = r.power_w if r.power_w is not None and math.isfinite(r.power_w) and r.power_w >= 0 else None
        if d.last_ts is None:  # first reading (or first after the GPU came back): baseline only
            d.last_ts, d.last_mj, d.last_power = r.ts, r.energy_mj, power
            d.t0 = r.ts if d.t0 is None else d.t0
            d.t1 = r.ts
            return 0.0
        dt = r.ts - d.last_ts
        if dt <= 0:
            if dt < 0:  # clock stepped back or readings out of order: keep the later baseline
                self._anomaly(d)
            return 0.0
        cap_j = self._cap_w(d) * dt
        added = 0.0
        integrate = True
        if r.energy_mj is not None and d.last_mj is not None:
            delta = r.energy_mj - d.last_mj
            if 0 <= delta <= cap_j * MILLIJOULES_PER_J:
                d.counter_mj += delta
                added = delta / MILLIJOULES_PER_J
                integrate = False
            else:  # reset (negative) or an impossible jump: the counter cannot be trusted here
                self._anomaly(d)
        if integrate:
            if r.energy_mj is None or d.last_mj is None:
                d.used_power = True
                if dt > self.max_gap_s:
                    self._anomaly(d)
            p0, p1 = d.last_power, power
            if p0 is not None and p1 is not None:
                added = (p0 + p1) * 0.5 * dt
            elif p0 is not None or p1 is not None:
                added = (p0 if p0 is not None else p1 or 0.0) * dt
            else:
                self._anomaly(d)  # neither counter nor power: this interval is unknown
                added = 0.0
            added = min(max(added, 0.0), cap_j)
            d.power_j += added
        d.last_ts, d.last_mj, d.last_power = r.ts, r.energy_mj, power
        d.t1 = r.ts
        return added

    def uuids(self) -> list[str]:
        return list(self._devs)

    def energy_j(self, uuid: str) -> float:
        d = self._devs.get(uuid)
        return 0.0 if d is None else d.counter_mj / MILLIJOULES_PER_J + d.power_j

    def source(self, uuid: str) -> str | None:
        """ "nvml" when every interval came from the counter, "nvml-power-integral" when some were
        integrated for lack of one; None for an unknown device."""
        d = self._devs.get(uuid)
        if d is None:
            return None
        return SOURCE_POWER if d.used_power else SOURCE_COUNTER

    def gone(self, uuid: str) -> bool:
        d = self._devs.get(uuid)
        return d is not None and d.gone

    def span(self, uuid: str) -> tuple[float, float] | None:
        """(first, last) reading time accounted for this device."""
        d = self._devs.get(uuid)
        if d is None or d.t0 is None or d.t1 is None:
            return None
        return d.t0, d.t1

    def summary(self) -> list[dict[str, Any]]:
        """One record per device in the spool's "energy" shape (plus gone/anomalies)."""
        out = []
        for uuid, d in self._devs.items():
            out.append(
                {
                    "component": "gpu",
                    "device": uuid,
                    "source": self.source(uuid),
                    "method": "measured",
                    "energy_j": self.energy_j(uuid),
                    "t0": d.t0,
                    "t1": d.t1,
                    "gone": d.gone,
                    "anomalies": d.anomalies,
                }
            )
        return out

    def to_state(self) -> dict[str, Any]:
        """JSON-able state (ints stay ints, so the counter path stays exact after a restart)."""
        return {
            "v": self.STATE_VERSION,
            "max_power_w": self.max_power_w,
            "max_gap_s": self.max_gap_s,
            "anomalies": self.anomalies,
            "devices": {uuid: d.to_dict() for uuid, d in self._devs.items()},
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> GpuEnergyTracker:
        """Rebuild from ``to_state()``; ValueError (naming the field) for anything malformed."""
        if not isinstance(state, dict) or state.get("v") != cls.STATE_VERSION:
            raise ValueError(f"GpuEnergyTracker state: want a dict with v={cls.STATE_VERSION}")
        max_power = _num_or_none(state.get("max_power_w"), "max_power_w") or MAX_PLAUSIBLE_POWER_W
        max_gap = _num_or_none(state.get("max_gap_s"), "max_gap_s") or 300.0
        t = cls(max_power_w=max_power, max_gap_s=max_gap)
        anomalies = state.get("anomalies", 0)
        devices = state.get("devices")
        if not isinstance(anomalies, int) or isinstance(anomalies, bool) or not isinstance(devices, dict):
            raise ValueError("GpuEnergyTracker state: anomalies must be an int and devices a dict")
        t.anomalies = anomalies
        for uuid, raw in devices.items():
            if not isinstance(uuid, str) or not isinstance(raw, dict):
                raise ValueError("GpuEnergyTracker state: devices must map UUID strings to dicts")
            d = _Dev()
            for key in ("counter_mj", "anomalies"):
                v = raw.get(key, 0)
                if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                    raise ValueError(f"GpuEnergyTracker state: {uuid}.{key} must be a non-negative int")
                setattr(d, key, v)
            last_mj = raw.get("last_mj")
            if last_mj is not None and (not isinstance(last_mj, int) or isinstance(last_mj, bool)):
                raise ValueError(f"GpuEnergyTracker state: {uuid}.last_mj must be an int or null")
            d.last_mj = last_mj
            d.power_j = _num_or_none(raw.get("power_j", 0.0), f"{uuid}.power_j") or 0.0
            if d.power_j < 0:
                raise ValueError(f"GpuEnergyTracker state: {uuid}.power_j is negative")
            d.last_ts = _num_or_none(raw.get("last_ts"), f"{uuid}.last_ts")
            d.last_power = _num_or_none(raw.get("last_power"), f"{uuid}.last_power")
            d.limit_w = _num_or_none(raw.get("limit_w"), f"{uuid}.limit_w")
            d.t0 = _num_or_none(raw.get("t0"), f"{uuid}.t0")
            d.t1 = _num_or_none(raw.get("t1"), f"{uuid}.t1")
            d.gone_ts = _num_or_none(raw.get("gone_ts"), f"{uuid}.gone_ts")
            d.gone = bool(raw.get("gone", False))
            d.used_power = bool(raw.get("used_power", False))
            t._devs[uuid] = d
        return t
