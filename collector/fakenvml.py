"""A fake ``pynvml`` (nvidia-ml-py) that replays per-GPU power traces, for tests, the demo and benchmarks.

Why: the hooks and the collector must be exercised on machines without GPUs, and separate processes (a
Slurm prolog, the epilog, the collector) must agree on every reading.  So every value here is a pure
function of wall-clock time (``time.time()``) and the configuration: power(t) is read off a periodic,
piecewise-linear trace (per-device phase), and the energy counter is the exact integral of that power
from the configured ``epoch`` to t (cumulative sums over one period: whole periods + the partial one).

Same function names, arguments, return types, units and error behaviour as nvidia-ml-py for the subset
cocaq uses: power in mW (int), energy in mJ (int, monotonic), memory in bytes, ``NVMLError(value)`` with
the real numeric codes and messages (``str(NVMLError(NVML_ERROR_GPU_IS_LOST)) == "GPU is lost"``), and
per-code subclasses such as ``NVMLError_NotSupported``.  Calls before ``nvmlInit`` raise Uninitialized.

Configuration: ``configure(spec)``, or ``$COCAQ_FAKE_NVML`` read by ``nvmlInit`` when ``configure`` was
not called.  ``spec`` is either

* ``N`` (1..64): N "NVIDIA A100-SXM4-80GB" GPUs with a mix of the built-in traces, minor numbers 0..N-1.
  NVML enumerates by PCI bus id, and the bus ids are assigned so that for N >= 2 *no* NVML index equals
  its device's minor number (minors reversed, the middle one swapped for odd N): code that maps Slurm's
  GPU indices (minor numbers) by list position reads the wrong GPU.
* the path of a TOML file::

      epoch = 1700000000.0          # float, default 1_700_000_000: t=0 of every trace (the "driver load")
      [[gpu]]
      uuid = "GPU-..."              # default: derived from minor
      minor = 0                     # default: position in the file
      pci_bus_id = "00000000:07:00.0"   # default: derived from minor; enumeration is sorted by it
      name = "NVIDIA A100-SXM4-80GB"
      trace = "training"            # built-in name, or a CSV path (relative to the TOML file):
                                    #   t_s,power_w[,util_pct,mem_used_mb]  (header optional)
      energy_counter = true         # false: nvmlDeviceGetTotalEnergyConsumption -> NOT_SUPPORTED (pre-Volta)
      gone_flag = "/tmp/gpu0.gone"  # while this file exists every call on the device -> GPU_IS_LOST
      gone_after_s = 3600.0         # the device is lost from epoch + gone_after_s on
      power_scale = 1.0             # multiplies power (and so energy)
      power_average_s = 0.0         # nvmlDeviceGetPowerUsage: 0 = the instantaneous power (Volta, GA100);
                                    #   1.0 = the average of the last second, as Ampere (but GA100) and
                                    #   later report it: energy over [t - 1 s, t] / 1 s
      phase_s = 0.0                 # shifts the periodic part of the trace
      mem_total_mb = 81920
      power_limit_w = 400.0
      energy_offset_mj = 0          # counter value at epoch (real counters count since driver load)
      mig = ["MIG-..."]             # MIG device UUIDs that resolve to this GPU

  A CSV trace repeats with period = its last t_s (after shifting the first to 0); between samples
  power is linear, utilisation and memory hold the earlier sample's value.  Without util_pct the
  utilisation is derived from power; without mem_used_mb the memory in use is 0.

Before the epoch a device idles at its trace's first power value and the counter is clamped at 0.

The built-in traces (``training``, ``inference``, ``idle``, ``light``) and CSV traces are built in
`cocaq.collector.fake_traces`; this module is the pynvml surface over them.

Import is stdlib-only and cheap (``tomllib`` only for a TOML spec); each trace is built once per process
on first use (~1-3 ms), so this module can run inside a Slurm prolog.
"""

from __future__ import annotations

import math
import os
import random
import time

from cocaq.collector.fake_traces import (
    A100_TDP_W,
    BUILTIN_TRACES,
    GENERATORS,
    Trace,
    builtin_trace,
    csv_trace,
)

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~3 ms of a prolog's budget
if TYPE_CHECKING:
    from typing import Any


__all__ = [
    "NVML_ERROR_ALREADY_INITIALIZED",
    "NVML_ERROR_DRIVER_NOT_LOADED",
    "NVML_ERROR_FUNCTION_NOT_FOUND",
    "NVML_ERROR_GPU_IS_LOST",
    "NVML_ERROR_INSUFFICIENT_SIZE",
    "NVML_ERROR_INVALID_ARGUMENT",
    "NVML_ERROR_LIBRARY_NOT_FOUND",
    "NVML_ERROR_NOT_FOUND",
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_NO_PERMISSION",
    "NVML_ERROR_UNINITIALIZED",
    "NVML_ERROR_UNKNOWN",
    "NVML_SUCCESS",
    "NVMLError",
    "configure",
    "energy_mj_at",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetHandleByPciBusId",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetName",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceIsMigDeviceHandle",
    "nvmlInit",
    "nvmlShutdown",
    "nvmlSystemGetDriverVersion",
    "power_w_at",
    "reset",
]

# ---------------------------------------------------------------------------------------------------------
# Error codes and NVMLError, numerically and textually as in nvidia-ml-py.

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

_ERROR_STRINGS: dict[int, str] = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    """An NVML failure: ``.value`` is the NVML return code; ``NVMLError(v)`` builds the per-code subclass."""

    _valClassMapping: dict[int, type[NVMLError]] = {}  # noqa: RUF012 - the name pynvml uses
    value: int

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _ERROR_STRINGS.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NVMLError) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __reduce__(self) -> tuple[Any, ...]:
        return (NVMLError, (self.value,))


def _error_subclass(code: int, class_name: str) -> type[NVMLError]:
    def new(cls: type[NVMLError], *_args: object) -> NVMLError:
        obj = Exception.__new__(cls)
        obj.value = code
        return obj

    def init(self: NVMLError, *_args: object) -> None:
        Exception.__init__(self, code)
        self.value = code

    sub = type(class_name, (NVMLError,), {"__new__": new, "__init__": init})
    NVMLError._valClassMapping[code] = sub
    return sub


NVMLError_Uninitialized = _error_subclass(NVML_ERROR_UNINITIALIZED, "NVMLError_Uninitialized")
NVMLError_InvalidArgument = _error_subclass(NVML_ERROR_INVALID_ARGUMENT, "NVMLError_InvalidArgument")
NVMLError_NotSupported = _error_subclass(NVML_ERROR_NOT_SUPPORTED, "NVMLError_NotSupported")
NVMLError_NoPermission = _error_subclass(NVML_ERROR_NO_PERMISSION, "NVMLError_NoPermission")
NVMLError_AlreadyInitialized = _error_subclass(NVML_ERROR_ALREADY_INITIALIZED, "NVMLError_AlreadyInitialized")
NVMLError_NotFound = _error_subclass(NVML_ERROR_NOT_FOUND, "NVMLError_NotFound")
NVMLError_InsufficientSize = _error_subclass(NVML_ERROR_INSUFFICIENT_SIZE, "NVMLError_InsufficientSize")
NVMLError_DriverNotLoaded = _error_subclass(NVML_ERROR_DRIVER_NOT_LOADED, "NVMLError_DriverNotLoaded")
NVMLError_LibraryNotFound = _error_subclass(NVML_ERROR_LIBRARY_NOT_FOUND, "NVMLError_LibraryNotFound")
NVMLError_FunctionNotFound = _error_subclass(NVML_ERROR_FUNCTION_NOT_FOUND, "NVMLError_FunctionNotFound")
NVMLError_GpuIsLost = _error_subclass(NVML_ERROR_GPU_IS_LOST, "NVMLError_GpuIsLost")
NVMLError_Unknown = _error_subclass(NVML_ERROR_UNKNOWN, "NVMLError_Unknown")

# ---------------------------------------------------------------------------------------------------------
# Devices' constants.

A100_MEM_MB = 81920
A100_NAME = "NVIDIA A100-SXM4-80GB"
_A100_PCI_DEVICE_ID = 0x20B510DE  # device 0x20B5, vendor 0x10DE (NVIDIA)
_DRIVER_VERSION = "535.129.03"
DEFAULT_EPOCH = 1_700_000_000.0

_MIX = ("training", "inference", "idle", "light", "training", "training", "inference", "training")
_DGX_BUSES = (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD)  # DGX-A100-like bus numbers


# ---------------------------------------------------------------------------------------------------------
# Devices and configuration.


class _Device:
    """One fake GPU: identity, trace reference and failure switches.  The trace is built on first use.

    A plain slotted class, not a dataclass: importing dataclasses costs ~10 ms of a prolog's 50 ms.
    """

    __slots__ = (
        "_trace",
        "energy_counter",
        "energy_offset_mj",
        "epoch",
        "gone_after_s",
        "gone_flag",
        "mem_scale",
        "mem_total_mb",
        "mig",
        "minor",
        "name",
        "pci_bus_id",
        "phase_s",
        "power_average_s",
        "power_limit_w",
        "power_scale",
        "trace_ref",
        "uuid",
    )

    def __init__(
        self,
        *,
        uuid: str,
        minor: int,
        pci_bus_id: str,
        name: str,
        trace_ref: str,
        epoch: float = DEFAULT_EPOCH,
        energy_counter: bool = True,
        gone_flag: str | None = None,
        gone_after_s: float | None = None,
        power_scale: float = 1.0,
        power_average_s: float = 0.0,
        phase_s: float = 0.0,
        mem_total_mb: float = float(A100_MEM_MB),
        mem_scale: float = 1.0,
        power_limit_w: float = A100_TDP_W,
        energy_offset_mj: float = 0.0,
        mig: tuple[str, ...] = (),
    ) -> None:
        self.uuid = uuid
        self.minor = minor
        self.pci_bus_id = pci_bus_id
        self.name = name
        self.trace_ref = trace_ref
        self.epoch = epoch
        self.energy_counter = energy_counter
        self.gone_flag = gone_flag
        self.gone_after_s = gone_after_s
        self.power_scale = power_scale
        self.power_average_s = power_average_s
        self.phase_s = phase_s
        self.mem_total_mb = mem_total_mb
        self.mem_scale = mem_scale
        self.power_limit_w = power_limit_w
        self.energy_offset_mj = energy_offset_mj
        self.mig = mig
        self._trace: Trace | None = None

    @property
    def trace(self) -> Trace:
        if self._trace is None:
            ref = self.trace_ref
            self._trace = builtin_trace(ref) if ref in GENERATORS else csv_trace(ref)
        return self._trace

    def is_gone(self, now: float) -> bool:
        if self.gone_after_s is not None and now >= self.epoch + self.gone_after_s:
            return True
        return self.gone_flag is not None and os.path.exists(self.gone_flag)

    def energy_mj(self, t: float) -> float:
        x = t - self.epoch
        tr = self.trace
        if x < 0:  # idle at the first knot's power before the epoch
            return max(0.0, self.energy_offset_mj + x * tr.ps[0] * self.power_scale * 1000.0)
        return self.energy_offset_mj + tr.energy_j(x, self.phase_s) * self.power_scale * 1000.0

    def sample(self, t: float) -> tuple[float, int, float]:
        p, u, m = self.trace.sample(t - self.epoch, self.phase_s)
        return p * self.power_scale, u, min(m * self.mem_scale, self.mem_total_mb * 0.98)

    def power_reading_w(self, t: float) -> float:
        """What nvmlDeviceGetPowerUsage reports: instantaneous, or the average over `power_average_s`."""
        w = self.power_average_s
        if w <= 0:
            return self.sample(t)[0]
        return (self.energy_mj(t) - self.energy_mj(t - w)) / (1000.0 * w)


class _Handle:
    """What nvmlDeviceGetHandle* returns (pynvml returns an opaque ctypes pointer)."""

    __slots__ = ("dev", "mig_uuid")

    def __init__(self, dev: _Device, mig_uuid: str | None = None) -> None:
        self.dev = dev
        self.mig_uuid = mig_uuid

    def __repr__(self) -> str:
        return f"<fakenvml handle {self.mig_uuid or self.dev.uuid}>"


class _Obj:
    """A plain record like pynvml's structures (attribute access), printable for debugging."""

    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.__dict__})"

    def __getattr__(self, name: str) -> Any:  # for mypy: fields are dynamic, as in pynvml's ctypes structs
        raise AttributeError(name)


class _State:
    def __init__(self) -> None:
        self.spec: str | None = None
        self.devices: list[_Device] = []  # NVML enumeration order (sorted by PCI bus id)
        self.by_uuid: dict[str, _Handle] = {}
        self.by_pci: dict[str, _Handle] = {}
        self.handles: list[_Handle] = []
        self.refcount = 0


_state = _State()

_ALLOWED_KEYS = {
    "uuid",
    "minor",
    "pci_bus_id",
    "name",
    "trace",
    "energy_counter",
    "gone_flag",
    "gone_after_s",
    "power_scale",
    "power_average_s",
    "phase_s",
    "mem_total_mb",
    "power_limit_w",
    "energy_offset_mj",
    "mig",
}


def _uuid_for(seed: str) -> str:
    """A stable GPU UUID (same text in every process: Random(str) hashes with SHA-512, not hash())."""
    h = f"{random.Random(seed).getrandbits(128):032x}"
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _norm_pci(bus_id: str) -> str:
    """NVML's form "DDDDDDDD:BB:DD.F" (upper-case hex) from that or the legacy "DDDD:BB:DD.F"."""
    try:
        dom, bus, devfn = bus_id.strip().split(":")
        dev, fn = devfn.split(".")
        d, b, v, f = int(dom, 16), int(bus, 16), int(dev, 16), int(fn, 16)
    except ValueError:
        raise ValueError(f"fakenvml: bad pci_bus_id {bus_id!r} (want e.g. '00000000:07:00.0')") from None
    if not (0 <= d <= 0xFFFFFFFF and 0 <= b <= 0xFF and 0 <= v <= 0x1F and 0 <= f <= 7):
        raise ValueError(f"fakenvml: pci_bus_id {bus_id!r} out of range")
    return f"{d:08X}:{b:02X}:{v:02X}.{f:X}"


def _pci_key(bus_id: str) -> tuple[int, ...]:
    dom, bus, devfn = bus_id.split(":")
    dev, fn = devfn.split(".")
    return (int(dom, 16), int(bus, 16), int(dev, 16), int(fn, 16))


def _count_devices(n: int) -> list[_Device]:
    """N built-in A100s; NVML index i (bus order) gets a minor != i for N >= 2."""
    order = list(range(n))[::-1]
    if n % 2 == 1 and n >= 3:
        m = n // 2
        order[0], order[m] = order[m], order[0]
    devs = []
    for idx, minor in enumerate(order):
        bus = _DGX_BUSES[idx] if n <= len(_DGX_BUSES) else 0x10 + idx
        devs.append(
            _Device(
                uuid=_uuid_for(f"cocaq-fakenvml/a100/{minor}"),
                minor=minor,
                pci_bus_id=f"00000000:{bus:02X}:00.0",
                name=A100_NAME,
                trace_ref=_MIX[minor % len(_MIX)],
                energy_counter=True,
                gone_flag=None,
                gone_after_s=None,
                power_scale=1.0 + 0.02 * (((minor * 37) % 7) - 3) / 3.0,
                phase_s=float((minor * 211) % 1800),
                mem_total_mb=float(A100_MEM_MB),
                mem_scale=1.0,
                power_limit_w=A100_TDP_W,
                energy_offset_mj=0.0,
                mig=(),
                epoch=DEFAULT_EPOCH,
            )
        )
    return devs


def _want(table: dict[str, Any], key: str, types: tuple[type, ...], where: str) -> Any:
    v = table[key]
    if (isinstance(v, bool) and bool not in types) or not isinstance(v, types):
        want = " or ".join(t.__name__ for t in types)
        raise ValueError(f"fakenvml: {where}: {key} must be {want}, not {type(v).__name__}")
    return v


def _num(
    table: dict[str, Any], key: str, default: float | None, lo: float | None, where: str
) -> float | None:
    """A finite number >= lo from the table, or the default."""
    if key not in table:
        return default
    v = float(_want(table, key, (int, float), where))
    if not math.isfinite(v) or (lo is not None and v < lo):
        raise ValueError(f"fakenvml: {where}: {key} = {v} out of range")
    return v


def _toml_devices(path: str) -> list[_Device]:
    import tomllib

    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as exc:
        raise ValueError(f"fakenvml: cannot read {path!r}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"fakenvml: {path}: invalid TOML: {exc}") from None
    unknown = set(doc) - {"epoch", "gpu"}
    if unknown:
        raise ValueError(f"fakenvml: {path}: unknown top-level key(s) {sorted(unknown)} (want epoch, gpu)")
    epoch = doc.get("epoch", DEFAULT_EPOCH)
    if isinstance(epoch, bool) or not isinstance(epoch, int | float) or not math.isfinite(epoch):
        raise ValueError(f"fakenvml: {path}: epoch must be a number (Unix seconds)")
    gpus = doc.get("gpu")
    if not isinstance(gpus, list) or not gpus or not all(isinstance(g, dict) for g in gpus):
        raise ValueError(f"fakenvml: {path}: needs at least one [[gpu]] table")
    if len(gpus) > 64:
        raise ValueError(f"fakenvml: {path}: at most 64 GPUs")
    base = os.path.dirname(os.path.abspath(path))
    devs: list[_Device] = []
    for pos, g in enumerate(gpus):
        where = f"{path} gpu #{pos + 1}"
        bad = set(g) - _ALLOWED_KEYS
        if bad:
            raise ValueError(
                f"fakenvml: {where}: unknown key(s) {sorted(bad)}; allowed: {sorted(_ALLOWED_KEYS)}"
            )
        minor = _want(g, "minor", (int,), where) if "minor" in g else pos
        if not 0 <= minor < 4096:
            raise ValueError(f"fakenvml: {where}: minor {minor} out of range")
        uuid = _want(g, "uuid", (str,), where) if "uuid" in g else _uuid_for(f"cocaq-fakenvml/toml/{minor}")
        if not uuid.startswith("GPU-") or len(uuid) > 80:
            raise ValueError(f"fakenvml: {where}: uuid {uuid!r} must look like 'GPU-xxxxxxxx-...'")
        pci = (
            _norm_pci(_want(g, "pci_bus_id", (str,), where))
            if "pci_bus_id" in g
            else (f"00000000:{(0x07 + 8 * minor) % 256:02X}:00.0")
        )
        trace = _want(g, "trace", (str,), where) if "trace" in g else "training"
        if trace not in GENERATORS:
            trace = trace if os.path.isabs(trace) else os.path.join(base, trace)
            if not os.path.isfile(trace):
                raise ValueError(
                    f"fakenvml: {where}: trace {g['trace']!r} is neither a built-in "
                    f"({', '.join(BUILTIN_TRACES)}) nor an existing CSV file"
                )
            csv_trace(trace)  # validate now: a bad CSV is a configuration error, not a runtime one
        gone_flag = _want(g, "gone_flag", (str,), where) if "gone_flag" in g else None
        if gone_flag is not None and not os.path.isabs(gone_flag):
            gone_flag = os.path.join(base, gone_flag)
        gone_after = _num(g, "gone_after_s", None, 0.0, where)
        mem_total = _num(g, "mem_total_mb", float(A100_MEM_MB), 1.0, where) or float(A100_MEM_MB)
        mig = _want(g, "mig", (list,), where) if "mig" in g else []
        if not all(isinstance(m, str) and m.startswith("MIG-") for m in mig):
            raise ValueError(f"fakenvml: {where}: mig must be a list of 'MIG-...' UUIDs")
        devs.append(
            _Device(
                uuid=uuid,
                minor=minor,
                pci_bus_id=pci,
                name=_want(g, "name", (str,), where) if "name" in g else A100_NAME,
                trace_ref=trace,
                energy_counter=_want(g, "energy_counter", (bool,), where) if "energy_counter" in g else True,
                gone_flag=gone_flag,
                gone_after_s=gone_after,
                power_scale=_num(g, "power_scale", 1.0, 0.0, where) or 0.0,
                power_average_s=_num(g, "power_average_s", 0.0, 0.0, where) or 0.0,
                phase_s=_num(g, "phase_s", 0.0, None, where) or 0.0,
                mem_total_mb=mem_total,
                mem_scale=mem_total / A100_MEM_MB if trace in GENERATORS else 1.0,
                power_limit_w=_num(g, "power_limit_w", A100_TDP_W, 1.0, where) or A100_TDP_W,
                energy_offset_mj=_num(g, "energy_offset_mj", 0.0, 0.0, where) or 0.0,
                mig=tuple(mig),
                epoch=float(epoch),
            )
        )
    for attr in ("minor", "uuid", "pci_bus_id"):
        seen: set[object] = set()
        for d in devs:
            v = getattr(d, attr)
            key = v.lower() if isinstance(v, str) else v
            if key in seen:
                raise ValueError(f"fakenvml: {path}: duplicate {attr} {v!r}")
            seen.add(key)
    return devs


def configure(spec: str) -> None:
    """Select the fake GPUs: ``"N"`` built-in A100s or a TOML file path (see the module docstring).

    Raises ValueError naming the problem.  Re-configuring replaces the devices (old handles keep working
    on the devices they came from).
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError("fakenvml: empty spec: want a GPU count like '4' or the path of a TOML file")
    s = spec.strip()
    if s.isdigit():
        n = int(s)
        if not 1 <= n <= 64:
            raise ValueError(f"fakenvml: GPU count {n} out of range 1..64")
        devs = _count_devices(n)
    elif os.path.isfile(s):
        devs = _toml_devices(s)
    else:
        raise ValueError(f"fakenvml: spec {spec!r} is neither a GPU count (1..64) nor an existing TOML file")
    devs.sort(key=lambda d: _pci_key(d.pci_bus_id))
    new = _State()
    new.spec = s
    new.devices = devs
    new.handles = [_Handle(d) for d in devs]
    new.by_uuid = {d.uuid.lower(): h for d, h in zip(devs, new.handles, strict=True)}
    for d in devs:
        for m in d.mig:
            new.by_uuid[m.lower()] = _Handle(d, m)
    new.by_pci = {d.pci_bus_id: h for d, h in zip(devs, new.handles, strict=True)}
    new.refcount = _state.refcount
    _swap(new)


def _swap(new: _State) -> None:
    """Replace the whole state in one assignment (no lock: threading costs import time, and readers see
    either the old or the new devices, never a mix)."""
    global _state
    _state = new


def reset() -> None:
    """Forget the configuration and the init count (tests)."""
    _swap(_State())


# ---------------------------------------------------------------------------------------------------------
# The pynvml API.


def nvmlInit() -> None:
    """Initialise; configures from $COCAQ_FAKE_NVML unless configure() was called (ValueError if neither)."""
    if _state.spec is None:
        env = os.environ.get("COCAQ_FAKE_NVML")
        if not env:
            raise ValueError("fakenvml: not configured: call configure(spec) or set COCAQ_FAKE_NVML")
        configure(env)
    _state.refcount += 1


def nvmlInitWithFlags(flags: int) -> None:
    nvmlInit()


def nvmlShutdown() -> None:
    if _state.refcount <= 0:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    _state.refcount -= 1


def _check_init() -> None:
    if _state.refcount <= 0:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)


def _dev(handle: object, now: float | None = None, mig_ok: bool = False) -> _Device:
    """The device behind a handle, raising as NVML does for a bad handle or a lost GPU."""
    _check_init()
    if not isinstance(handle, _Handle):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    if handle.mig_uuid is not None and not mig_ok:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # per-MIG-instance power/energy are not exposed
    dev = handle.dev
    if dev.is_gone(time.time() if now is None else now):
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    return dev


def nvmlSystemGetDriverVersion() -> str:
    _check_init()
    return _DRIVER_VERSION


def nvmlDeviceGetCount() -> int:
    _check_init()
    return len(_state.devices)


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
    _check_init()
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(_state.handles):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    h = _state.handles[index]
    _dev(h)
    return h


def _text(v: str | bytes) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else v


def nvmlDeviceGetHandleByUUID(uuid: str | bytes) -> _Handle:
    _check_init()
    h = _state.by_uuid.get(_text(uuid).strip().lower())
    if h is None:
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    _dev(h, mig_ok=True)
    return h


def nvmlDeviceGetHandleByPciBusId(pciBusId: str | bytes) -> _Handle:
    _check_init()
    try:
        key = _norm_pci(_text(pciBusId))
    except ValueError:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT) from None
    h = _state.by_pci.get(key)
    if h is None:
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    _dev(h)
    return h


def nvmlDeviceGetUUID(handle: _Handle) -> str:
    dev = _dev(handle, mig_ok=True)
    return handle.mig_uuid or dev.uuid


def nvmlDeviceGetName(handle: _Handle) -> str:
    return _dev(handle).name


def nvmlDeviceGetMinorNumber(handle: _Handle) -> int:
    return _dev(handle).minor


def nvmlDeviceGetPciInfo(handle: _Handle) -> _Obj:
    dev = _dev(handle)
    dom, bus, devfn = dev.pci_bus_id.split(":")
    return _Obj(
        busIdLegacy=f"{dom[-4:]}:{bus}:{devfn}",
        domain=int(dom, 16),
        bus=int(bus, 16),
        device=int(devfn.split(".")[0], 16),
        pciDeviceId=_A100_PCI_DEVICE_ID,
        pciSubSystemId=0x145F10DE,
        busId=dev.pci_bus_id,
    )


nvmlDeviceGetPciInfo_v3 = nvmlDeviceGetPciInfo


def nvmlDeviceGetPowerUsage(handle: _Handle) -> int:
    now = time.time()
    return int(_dev(handle, now).power_reading_w(now) * 1000.0)


def nvmlDeviceGetTotalEnergyConsumption(handle: _Handle) -> int:
    now = time.time()
    dev = _dev(handle, now)
    if not dev.energy_counter:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return int(dev.energy_mj(now))


def nvmlDeviceGetEnforcedPowerLimit(handle: _Handle) -> int:
    return int(_dev(handle).power_limit_w * 1000.0)


def nvmlDeviceGetPowerManagementLimit(handle: _Handle) -> int:
    return nvmlDeviceGetEnforcedPowerLimit(handle)


def nvmlDeviceGetUtilizationRates(handle: _Handle) -> _Obj:
    now = time.time()
    _, u, _ = _dev(handle, now).sample(now)
    return _Obj(gpu=u, memory=int(u * 0.55 + 0.5))


def nvmlDeviceGetMemoryInfo(handle: _Handle, version: int | None = None) -> _Obj:
    now = time.time()
    dev = _dev(handle, now)
    used = int(dev.sample(now)[2] * 1024 * 1024)
    total = int(dev.mem_total_mb * 1024 * 1024)
    return _Obj(total=total, free=total - used, used=used)


def nvmlDeviceGetComputeRunningProcesses(handle: _Handle) -> list[_Obj]:
    """One process holding the memory while the trace has memory in use; [] otherwise (like an idle GPU)."""
    now = time.time()
    dev = _dev(handle, now)
    used = int(dev.sample(now)[2] * 1024 * 1024)
    if used < 64 * 1024 * 1024:
        return []
    pid = 4000 + 97 * dev.minor
    return [_Obj(pid=pid, usedGpuMemory=used, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)]


nvmlDeviceGetComputeRunningProcesses_v3 = nvmlDeviceGetComputeRunningProcesses


def nvmlDeviceIsMigDeviceHandle(handle: _Handle) -> int:
    _dev(handle, mig_ok=True)
    return 1 if handle.mig_uuid is not None else 0


def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle: _Handle) -> _Handle:
    dev = _dev(handle, mig_ok=True)
    if handle.mig_uuid is None:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return _state.by_uuid[dev.uuid.lower()]


# ---------------------------------------------------------------------------------------------------------
# Test helpers (not in pynvml): the model's values at an explicit time, by NVML index.


def _device_at(index: int) -> _Device:
    if _state.spec is None:
        raise ValueError("fakenvml: not configured")
    return _state.devices[index]


def energy_mj_at(index: int, t: float) -> float:
    """The energy counter (mJ, unrounded) of NVML device ``index`` at Unix time ``t``."""
    return _device_at(index).energy_mj(t)


def power_w_at(index: int, t: float) -> float:
    """The power (W) of NVML device ``index`` at Unix time ``t``."""
    return _device_at(index).sample(t)[0]
