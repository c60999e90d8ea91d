"""NVML layer and the fake NVML: cross-process agreement, identity mapping by minor number, lost and
unsupported devices, and energy accounting (counter, power integral, resets, persisted state)."""

from __future__ import annotations

import inspect
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cocaq.collector import fakenvml
from cocaq.collector.nvml import GpuEnergyTracker, GpuId, GpuReading, Nvml, NvmlUnavailable

ROOT = Path(__file__).resolve().parent.parent
T0 = 1_763_700_000.0  # a fixed instant well after the fake's default epoch


@pytest.fixture(autouse=True)
def _fresh_fake() -> Iterator[None]:
    fakenvml.reset()
    yield
    fakenvml.reset()


def run_python(code: str, **env: str) -> str:
    """Run code in a fresh interpreter (a separate process, as the prolog, epilog and collector are)."""
    full_env = {k: v for k, v in os.environ.items() if k != "COCAQ_FAKE_NVML"} | env
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full_env, cwd=ROOT, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def write_toml(tmp_path: Path, body: str, name: str = "gpus.toml") -> str:
    path = tmp_path / name
    path.write_text(body)
    return str(path)


def trapezoid_j(index: int, t1: float, t2: float, step: float) -> float:
    n = round((t2 - t1) / step)
    ps = [fakenvml.power_w_at(index, t1 + k * step) for k in range(n + 1)]
    return sum((ps[k] + ps[k + 1]) * 0.5 * step for k in range(n))


# ---------------------------------------------------------------------------------------------------------
# The fake itself


CROSS_PROCESS = """
import json, time
from cocaq.collector import fakenvml as f
f.nvmlInit()  # configured from $COCAQ_FAKE_NVML
T0 = 1_763_700_000.0
out = {"devices": [], "live": []}
for i in range(f.nvmlDeviceGetCount()):
    h = f.nvmlDeviceGetHandleByIndex(i)
    out["devices"].append({
        "uuid": f.nvmlDeviceGetUUID(h), "minor": f.nvmlDeviceGetMinorNumber(h),
        "bus": f.nvmlDeviceGetPciInfo(h).busId,
        "energy": [f.energy_mj_at(i, T0 + dt) for dt in (0.0, 0.4, 17.25, 1234.5, 2000.0, 86400.7)],
        "power": [f.power_w_at(i, T0 + 0.25 * k) for k in range(0, 8001)],
    })
    before = f.energy_mj_at(i, time.time())
    live = f.nvmlDeviceGetTotalEnergyConsumption(h)
    after = f.energy_mj_at(i, time.time())
    out["live"].append([before, live, after])
print(json.dumps(out))
"""


def test_fake_agrees_across_processes_and_energy_is_the_integral_of_power() -> None:
    a = json.loads(run_python(CROSS_PROCESS, COCAQ_FAKE_NVML="4"))
    b = json.loads(run_python(CROSS_PROCESS, COCAQ_FAKE_NVML="4"))
    assert a["devices"] == b["devices"]  # same identities and the same values at the same instants
    assert len(a["devices"]) == 4
    for before, live, after in a["live"] + b["live"]:  # the live counter is the model's value "now"
        assert int(before) <= live <= after
    for dev in a["devices"]:
        power = dev["power"]  # 0.25 s samples over [T0, T0 + 2000 s]: crosses a period wrap
        numeric_j = sum((power[k] + power[k + 1]) * 0.125 for k in range(len(power) - 1))
        exact_j = (dev["energy"][4] - dev["energy"][0]) / 1000.0
        assert numeric_j == pytest.approx(exact_j, rel=2e-3), dev["uuid"]
        assert all(e2 >= e1 for e1, e2 in itertools.pairwise(dev["energy"]))


def test_fake_energy_matches_power_integral_in_process() -> None:
    fakenvml.configure("8")
    fakenvml.nvmlInit()
    for i in range(8):
        for t1, t2 in ((T0 + 0.37, T0 + 600.37), (T0 + 1000.0, T0 + 4700.0)):
            exact = (fakenvml.energy_mj_at(i, t2) - fakenvml.energy_mj_at(i, t1)) / 1000.0
            assert trapezoid_j(i, t1, t2, 0.5) == pytest.approx(exact, rel=2e-3)


def test_fake_power_reading_is_instant_or_the_last_seconds_average(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nvmlDeviceGetPowerUsage as Ampere+ reports it: the energy of the last second over one second."""
    spec = write_toml(
        tmp_path,
        f'epoch = {T0}\n[[gpu]]\nminor = 0\ntrace = "inference"\n'
        '[[gpu]]\nminor = 1\ntrace = "inference"\npower_average_s = 1.0\n',
    )
    fakenvml.configure(spec)
    fakenvml.nvmlInit()
    instant, average = (fakenvml.nvmlDeviceGetHandleByIndex(i) for i in range(2))
    differ = 0
    for k in range(600):
        t = T0 + 0.7 * k + 0.05
        monkeypatch.setattr(time, "time", lambda t=t: t)
        assert fakenvml.nvmlDeviceGetPowerUsage(instant) == int(fakenvml.power_w_at(0, t) * 1000)
        want = fakenvml.energy_mj_at(1, t) - fakenvml.energy_mj_at(1, t - 1.0)  # mJ in 1 s = mW
        assert fakenvml.nvmlDeviceGetPowerUsage(average) == pytest.approx(want, abs=1.0)
        differ += abs(want - fakenvml.power_w_at(1, t) * 1000) > 5000
    assert differ > 30, "bursts: the average and the instant differ"
    with pytest.raises(ValueError, match="power_average_s"):
        fakenvml.configure(write_toml(tmp_path, "[[gpu]]\nminor = 0\npower_average_s = -1\n"))


def test_builtin_traces_look_like_an_a100() -> None:
    """Mean power over a day per trace kind, and never above the 400 W TDP or below ~50 W."""
    fakenvml.configure("4")
    fakenvml.nvmlInit()
    means = {}
    for i in range(4):
        h = fakenvml.nvmlDeviceGetHandleByIndex(i)
        kind = fakenvml._state.devices[i].trace_ref
        means[kind] = (fakenvml.energy_mj_at(i, T0 + 86400) - fakenvml.energy_mj_at(i, T0)) / 86400 / 1000
        samples = [fakenvml.power_w_at(i, T0 + k) for k in range(0, 3600, 3)]
        assert min(samples) >= 50 and max(samples) <= 400, kind
        assert fakenvml.nvmlDeviceGetEnforcedPowerLimit(h) == 400_000
    assert 270 <= means["training"] <= 360
    assert 80 <= means["inference"] <= 220
    assert 55 <= means["idle"] <= 70
    assert 65 <= means["light"] <= 130


def test_energy_counter_monotonic() -> None:
    fakenvml.configure("8")
    fakenvml.nvmlInit()
    for i in range(8):
        h = fakenvml.nvmlDeviceGetHandleByIndex(i)
        live = [fakenvml.nvmlDeviceGetTotalEnergyConsumption(h) for _ in range(200)]
        assert all(isinstance(v, int) for v in live)
        assert live == sorted(live)
        ts = [T0 + 0.173 * k for k in range(20000)]  # dense sweep across segment boundaries and a wrap
        es = [fakenvml.energy_mj_at(i, t) for t in ts]
        assert all(b >= a for a, b in itertools.pairwise(es))


def test_nvml_error_matches_real_pynvml() -> None:
    pynvml = pytest.importorskip("pynvml")  # in the locked deps: imports without a driver
    for name in (
        "NVML_SUCCESS",
        "NVML_ERROR_UNINITIALIZED",
        "NVML_ERROR_INVALID_ARGUMENT",
        "NVML_ERROR_NOT_SUPPORTED",
        "NVML_ERROR_NOT_FOUND",
        "NVML_ERROR_GPU_IS_LOST",
        "NVML_ERROR_LIBRARY_NOT_FOUND",
    ):
        value = getattr(fakenvml, name)
        assert value == getattr(pynvml, name), name
        if value:
            assert str(fakenvml.NVMLError(value)) == str(pynvml.NVMLError(value))
            assert fakenvml.NVMLError(value).value == value
    assert isinstance(fakenvml.NVMLError(15), fakenvml.NVMLError_GpuIsLost)
    for fn in (
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetHandleByUUID",
        "nvmlDeviceGetHandleByPciBusId",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlSystemGetDriverVersion",
    ):
        real = list(inspect.signature(getattr(pynvml, fn)).parameters)
        fake = list(inspect.signature(getattr(fakenvml, fn)).parameters)
        assert fake == real, fn


def test_calls_before_init_raise_uninitialized() -> None:
    fakenvml.configure("1")
    with pytest.raises(fakenvml.NVMLError) as err:
        fakenvml.nvmlDeviceGetCount()
    assert err.value.value == fakenvml.NVML_ERROR_UNINITIALIZED


def test_csv_trace(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text(
        "t_s,power_w,util_pct,mem_used_mb\n0,100,50,1000\n10,300,90,2000\n20,100,40,1000\n"
    )
    spec = write_toml(tmp_path, f'epoch = {T0}\n[[gpu]]\ntrace = "t.csv"\nminor = 0\n')
    fakenvml.configure(spec)
    assert fakenvml.power_w_at(0, T0 + 5) == pytest.approx(200.0)
    # one period (20 s) = 2 trapezoids of (100+300)/2*10 = 4000 J
    assert fakenvml.energy_mj_at(0, T0 + 20) == pytest.approx(4_000_000.0)
    assert fakenvml.energy_mj_at(0, T0 + 45) == pytest.approx(2 * 4_000_000.0 + (100 + 200) / 2 * 5 * 1000)


# ---------------------------------------------------------------------------------------------------------
# Unsupported and lost devices


def test_not_supported_energy_counter(tmp_path: Path) -> None:
    spec = write_toml(tmp_path, '[[gpu]]\nminor = 0\ntrace = "training"\nenergy_counter = false\n')
    with Nvml.open(f"fake:{spec}") as nvml:
        (gpu,) = nvml.devices()
        h = fakenvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(fakenvml.NVMLError) as err:
            fakenvml.nvmlDeviceGetTotalEnergyConsumption(h)
        assert err.value.value == fakenvml.NVML_ERROR_NOT_SUPPORTED
        assert str(err.value) == "Not Supported"
        r = nvml.read(gpu)
        assert r.energy_mj is None and not r.gone
        assert r.power_w is not None and r.power_w > 50
        assert r.error is not None and "NVML_ERROR_NOT_SUPPORTED" in r.error and gpu.uuid in r.error
        fast = nvml.read(gpu, energy_only=True)  # the hooks' fast path still gets power to integrate
        assert fast.energy_mj is None and fast.power_w is not None and fast.util_pct is None


def test_gone_flag_device(tmp_path: Path) -> None:
    flag = tmp_path / "gpu1.gone"
    spec = write_toml(
        tmp_path,
        f'[[gpu]]\nminor = 0\n[[gpu]]\nminor = 1\ngone_flag = "{flag}"\ntrace = "idle"\n',
    )
    with Nvml.open(f"fake:{spec}") as nvml:
        gpus, errors = nvml.resolve("0,1", None)
        assert errors == [] and [g.minor for g in gpus] == [0, 1]
        lost = gpus[1]
        assert nvml.read(lost).energy_mj is not None
        flag.touch()  # the GPU falls off the bus mid-job
        with pytest.raises(fakenvml.NVMLError) as err:
            fakenvml.nvmlDeviceGetHandleByUUID(lost.uuid)
        assert err.value.value == fakenvml.NVML_ERROR_GPU_IS_LOST and str(err.value) == "GPU is lost"
        r = nvml.read(lost)
        assert r.gone and r.energy_mj is None and r.power_w is None
        assert r.error is not None and "NVML_ERROR_GPU_IS_LOST" in r.error
        assert not nvml.read(gpus[0]).gone  # the other GPU is unaffected
        flag.unlink()
        assert not nvml.read(lost).gone


def test_gone_after_s_device_is_left_out_of_enumeration(tmp_path: Path) -> None:
    spec = write_toml(
        tmp_path,
        f"epoch = {time.time() - 100}\n[[gpu]]\nminor = 0\n[[gpu]]\nminor = 1\ngone_after_s = 50\n",
    )
    with Nvml.open(f"fake:{spec}") as nvml:
        assert [g.minor for g in nvml.devices()] == [0]
        assert any("NVML_ERROR_GPU_IS_LOST" in e for e in nvml.errors)
        gpus, errors = nvml.resolve("0,1", None)
        assert [g.minor for g in gpus] == [0] and len(errors) == 1 and "1" in errors[0]


# ---------------------------------------------------------------------------------------------------------
# Slurm GPU indices -> devices


def test_resolve_by_minor_not_by_position() -> None:
    with Nvml.open("fake:4") as nvml:
        devices = nvml.devices()
        assert [g.index for g in devices] == [0, 1, 2, 3]
        assert all(g.index != g.minor for g in devices)  # the fake's deliberate enumeration order
        gpus, errors = nvml.resolve("0,2", None)
        assert errors == []
        assert [g.minor for g in gpus] == [0, 2]
        # a position-based mapping would have picked devices[0] and devices[2]
        assert [g.uuid for g in gpus] != [devices[0].uuid, devices[2].uuid]
        for g in gpus:  # and NVML itself agrees on each chosen device's minor number
            assert fakenvml.nvmlDeviceGetMinorNumber(fakenvml.nvmlDeviceGetHandleByUUID(g.uuid)) == g.minor
        gpus, errors = nvml.resolve("1-3", None)
        assert [g.minor for g in gpus] == [1, 2, 3] and errors == []


def test_resolve_by_uuid_and_preference() -> None:
    with Nvml.open("fake:4") as nvml:
        minor3 = next(g for g in nvml.devices() if g.minor == 3)
        gpus, errors = nvml.resolve(None, f"{minor3.uuid}")
        assert gpus == [minor3] and errors == []
        gpus, errors = nvml.resolve(None, minor3.uuid.upper()[:12])  # CUDA accepts a unique prefix
        assert gpus == [minor3] and errors == []
        gpus, errors = nvml.resolve("1", minor3.uuid)  # SLURM_JOB_GPUS wins over CUDA_VISIBLE_DEVICES
        assert [g.minor for g in gpus] == [1] and errors == []
        gpus, errors = nvml.resolve(None, "2")  # CUDA_VISIBLE_DEVICES only when the first is absent
        assert [g.minor for g in gpus] == [2]
        assert nvml.resolve(None, None) == ([], [])
        assert nvml.resolve(None, "NoDevFiles") == ([], [])
        gpus, errors = nvml.resolve("0,0", None)
        assert [g.minor for g in gpus] == [0]


def test_resolve_unknown_entries() -> None:
    with Nvml.open("fake:2") as nvml:
        gpus, errors = nvml.resolve("1,7,gpu0,GPU-00000000-dead", None)
        assert [g.minor for g in gpus] == [1]
        assert len(errors) == 3
        assert "7" in errors[0] and "gpu0" in errors[1] and "GPU-00000000-dead" in errors[2]
        gpus, errors = nvml.resolve(None, "MIG-5b2c8a3e-0000-0000-0000-000000000000")
        assert gpus == [] and len(errors) == 1 and "MIG" in errors[0]


def test_resolve_mig(tmp_path: Path) -> None:
    spec = write_toml(
        tmp_path,
        '[[gpu]]\nminor = 0\nuuid = "GPU-aaaaaaaa-0000-0000-0000-000000000000"\n'
        '[[gpu]]\nminor = 1\nuuid = "GPU-bbbbbbbb-0000-0000-0000-000000000000"\n'
        'mig = ["MIG-11111111-0000-0000-0000-000000000000"]\n',
    )
    with Nvml.open(f"fake:{spec}") as nvml:
        gpus, errors = nvml.resolve(None, "MIG-11111111-0000-0000-0000-000000000000")
        assert [g.minor for g in gpus] == [1] and errors == []
        gpus, errors = nvml.resolve(None, "MIG-GPU-aaaaaaaa-0000-0000-0000-000000000000/1/0")  # CUDA 11 form
        assert [g.minor for g in gpus] == [0] and errors == []


def test_gpuid_to_dict() -> None:
    g = GpuId(index=1, minor=0, uuid="GPU-x", pci_bus_id="00000000:07:00.0", name="A100")
    assert g.to_dict() == {
        "index": 1,
        "minor": 0,
        "uuid": "GPU-x",
        "pci_bus_id": "00000000:07:00.0",
        "name": "A100",
    }
    assert json.loads(json.dumps(g.to_dict())) == g.to_dict()


# ---------------------------------------------------------------------------------------------------------
# Opening NVML


def test_open_real_pynvml_without_driver_raises_one_line() -> None:
    if os.path.exists("/dev/nvidiactl"):  # a GPU node: the real library must work
        with Nvml.open("pynvml") as nvml:
            assert nvml.devices()
        return
    with pytest.raises(NvmlUnavailable) as err:
        Nvml.open("pynvml")
    msg = str(err.value)
    assert msg.startswith("nvml: ") and "\n" not in msg and len(msg) < 200
    print(msg)


def test_bad_fake_specs(tmp_path: Path) -> None:
    cases = {
        "": "empty spec",
        "0": "out of range",
        "65": "out of range",
        "/no/such/file.toml": "neither a GPU count",
        write_toml(tmp_path, "[[gpu]]\ntracee = 'idle'\n", "typo.toml"): "tracee",
        write_toml(tmp_path, "[[gpu]]\ntrace = 'bogus'\n", "trace.toml"): "bogus",
        write_toml(tmp_path, "[[gpu]]\nminor = 0\n[[gpu]]\nminor = 0\n", "dup.toml"): "duplicate minor",
        write_toml(tmp_path, "[[gpu]]\nminor = 'zero'\n", "type.toml"): "minor must be int",
        write_toml(tmp_path, "[[gpu]]\npci_bus_id = 'xyz'\n", "pci.toml"): "pci_bus_id",
        write_toml(tmp_path, "epoch = 1\n", "nogpu.toml"): "[[gpu]]",
        write_toml(tmp_path, "[[gpu\n", "broken.toml"): "invalid TOML",
    }
    for spec, needle in cases.items():
        with pytest.raises(ValueError) as err:
            fakenvml.configure(spec)
        assert needle in str(err.value), (spec, str(err.value))
    with pytest.raises(ValueError, match="neither a GPU count"):
        Nvml.open("fake:nope")
    with pytest.raises(ValueError, match="unknown NVML spec"):
        Nvml.open("nvidia")
    with pytest.raises(ValueError, match="not configured"):
        fakenvml.nvmlInit()  # neither configure() nor $COCAQ_FAKE_NVML (the test env has none)


def test_import_configure_and_read_8_gpus_loads_the_stdlib_only() -> None:
    """Fast in a fresh process (a hook's budget) without a clock: it loads fakenvml, its traces and the
    standard library, nothing else (the time itself: bench/bench_collector.py, bench/bench_hooks.py)."""
    code = """
import sys
before = set(sys.modules)
from cocaq.collector import fakenvml as f
f.configure("8"); f.nvmlInit()
e = [f.nvmlDeviceGetTotalEnergyConsumption(f.nvmlDeviceGetHandleByIndex(i)) for i in range(f.nvmlDeviceGetCount())]
assert len(e) == 8 and all(v > 0 for v in e)
print(" ".join(sorted(set(sys.modules) - before)))
"""
    lazy = "import sys, cocaq.collector.nvml; print(sorted({'pynvml', 'cocaq.collector.fakenvml'} & set(sys.modules)))"
    assert run_python(lazy).strip() == "[]"  # the library is imported by Nvml.open only
    new = run_python(code).split()
    ours = {m for m in new if m.split(".")[0] == "cocaq"}
    # fakenvml and its traces only: no config, database or real NVML
    assert "cocaq.collector.fakenvml" in ours, ours
    assert all(m in ("cocaq", "cocaq.collector") or m.startswith("cocaq.collector.fake") for m in ours), ours
    others = {m.split(".")[0] for m in new} - {"cocaq"}
    assert others <= sys.stdlib_module_names, others - sys.stdlib_module_names


# ---------------------------------------------------------------------------------------------------------
# Energy tracking


def reading(uuid: str, ts: float, mj: int | None, w: float | None, gone: bool = False) -> GpuReading:
    return GpuReading(uuid, ts, mj, w, None, None, None, gone=gone)


def test_tracker_counter_path_is_exact() -> None:
    fakenvml.configure("2")
    fakenvml.nvmlInit()
    tr = GpuEnergyTracker()
    uuid = fakenvml.nvmlDeviceGetUUID(fakenvml.nvmlDeviceGetHandleByIndex(0))
    counters = [int(fakenvml.energy_mj_at(0, T0 + 10 * k)) for k in range(361)]
    for k, mj in enumerate(counters):
        tr.update(reading(uuid, T0 + 10 * k, mj, fakenvml.power_w_at(0, T0 + 10 * k)))
    assert tr.energy_j(uuid) == (counters[-1] - counters[0]) / 1000
    assert tr.source(uuid) == "nvml" and tr.anomalies == 0
    assert tr.span(uuid) == (T0, T0 + 3600)


@pytest.mark.parametrize("step", [1.0, 10.0])
def test_tracker_power_integral_close_to_truth(step: float) -> None:
    fakenvml.configure("1")  # one GPU: the training trace
    fakenvml.nvmlInit()
    assert fakenvml._state.devices[0].trace_ref == "training"
    tr = GpuEnergyTracker()
    t1, n = T0 + 0.3, int(3600 / step)
    for k in range(n + 1):
        t = t1 + k * step
        tr.update(reading("GPU-a", t, None, fakenvml.power_w_at(0, t)))
    truth = (fakenvml.energy_mj_at(0, t1 + n * step) - fakenvml.energy_mj_at(0, t1)) / 1000
    got = tr.energy_j("GPU-a")
    print(
        f"power integral at {step:g} s: {got / 3.6e6:.4f} kWh vs {truth / 3.6e6:.4f} kWh ({(got / truth - 1) * 100:+.2f} %)"
    )
    assert got == pytest.approx(truth, rel=0.03)
    assert tr.source("GPU-a") == "nvml-power-integral" and tr.anomalies == 0


def test_tracker_counter_reset_and_jumps_never_negative_or_huge() -> None:
    tr = GpuEnergyTracker()
    tr.set_power_limit("g", 400.0)
    tr.update(reading("g", 0.0, 5_000_000, 100.0))
    assert tr.update(reading("g", 10.0, 6_000_000, 100.0)) == 1000.0
    added = tr.update(reading("g", 20.0, 300, 100.0))  # driver reload: counter restarted near 0
    assert added == pytest.approx(1000.0)  # that interval integrated from power instead
    assert tr.anomalies == 1
    assert tr.update(reading("g", 30.0, 1_300, 100.0)) == 1.0  # and the counter is trusted again
    added = tr.update(reading("g", 40.0, 10**15, None))  # an impossible jump, no power to fall back on
    assert 0 <= added <= 800 * 10  # capped at 2x the 400 W limit
    assert tr.anomalies == 2
    added = tr.update(reading("g", 50.0, 10, 50_000.0))  # reset again, with an absurd power reading
    assert 0 <= added <= 800 * 10
    assert tr.update(reading("g", 45.0, 20, 100.0)) == 0.0  # time went backwards: ignored, counted
    assert tr.anomalies == 4
    assert tr.energy_j("g") >= 2001.0 and tr.energy_j("g") <= 2001.0 + 2 * 8000


def test_tracker_gone_device_stops_accumulating() -> None:
    tr = GpuEnergyTracker()
    tr.update(reading("g", 0.0, 0, 300.0))
    tr.update(reading("g", 10.0, 3_000_000, 300.0))
    assert tr.update(reading("g", 20.0, None, None, gone=True)) == 0.0
    assert tr.update(reading("g", 30.0, None, None, gone=True)) == 0.0
    assert tr.energy_j("g") == 3000.0 and tr.gone("g")
    assert [s["gone"] for s in tr.summary()] == [True]
    tr.update(reading("g", 40.0, 100, 60.0))  # back after a driver reload: a new baseline, no jump
    tr.update(reading("g", 50.0, 700_100, 60.0))
    assert tr.energy_j("g") == 3700.0


def test_tracker_state_round_trip() -> None:
    tr = GpuEnergyTracker()
    tr.set_power_limit("a", 400.0)
    for k in range(5):
        tr.update(reading("a", 100.0 + k, 1000 * k * k, 50.0 + k))
        tr.update(reading("b", 100.0 + k, None, 80.0))
    tr.update(reading("a", 106.0, 1, 60.0))  # a reset, so anomalies are non-zero
    state = json.loads(json.dumps(tr.to_state()))
    back = GpuEnergyTracker.from_state(state)
    assert back.to_state() == tr.to_state()
    for u in ("a", "b"):
        assert back.energy_j(u) == tr.energy_j(u) and back.source(u) == tr.source(u)
    assert back.anomalies == tr.anomalies == 1
    for t in (tr, back):  # both continue identically after a "restart"
        t.update(reading("a", 110.0, 40_001, 61.0))
        t.update(reading("b", 110.0, None, 90.0))
    assert back.to_state() == tr.to_state()
    with pytest.raises(ValueError):
        GpuEnergyTracker.from_state({"v": 99})
    with pytest.raises(ValueError, match="counter_mj"):
        GpuEnergyTracker.from_state({"v": 1, "anomalies": 0, "devices": {"a": {"counter_mj": -5}}})


def test_tracker_with_live_fake_readings(tmp_path: Path) -> None:
    """End to end on the fake: counter and no-counter GPUs through Nvml.read, over a few real seconds."""
    spec = write_toml(
        tmp_path,
        "[[gpu]]\nminor = 0\n[[gpu]]\nminor = 1\nenergy_counter = false\n",
    )
    with Nvml.open(f"fake:{spec}") as nvml:
        tr = GpuEnergyTracker()
        gpus = nvml.devices()
        for g in gpus:
            tr.set_power_limit(g.uuid, nvml.power_limit_w(g))
        for _ in range(4):
            for g in gpus:
                tr.update(nvml.read(g, energy_only=True))
            time.sleep(0.05)
        by_minor = {g.minor: g.uuid for g in gpus}
        assert tr.source(by_minor[0]) == "nvml" and tr.source(by_minor[1]) == "nvml-power-integral"
        for u in by_minor.values():
            assert 0 < tr.energy_j(u) < 400 * 1.0  # < 1 s at < 400 W
        assert tr.anomalies == 0


def test_pynvml_imported_without_ctypes_util_still_finds_libraries() -> None:
    """The prolog's shortcut must leave a working pynvml and a real ctypes.util behind it."""
    code = (
        "import sys, time; t = time.perf_counter()\n"
        "from cocaq.collector.nvml import import_pynvml\n"
        "m = import_pynvml()\n"
        "assert 'ctypes.util' not in sys.modules, 'the real ctypes.util was imported after all'\n"
        "assert hasattr(m, 'nvmlDeviceGetTotalEnergyConsumption')\n"
        "assert m.find_library('c'), 'find_library must still work (loads the real ctypes.util)'\n"
        "import ctypes.util\n"
        "assert ctypes.util.find_library.__module__ == 'ctypes.util'\n"
        "print('ok')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
