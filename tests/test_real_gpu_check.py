"""bench/real_gpu_check.sh, the real-GPU check, in its --fake mode: the same pipeline (prolog, collector,
job, epilog, ship, sacct import, reconcile, aggregate, `cocaq job`) on the fake NVML, so that the script
that runs once on a GPU machine is known to work before one is lent. And its nvidia-smi reader, on a
stand-in nvidia-smi."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "real_gpu_check.sh"


def _driver() -> ModuleType:
    spec = importlib.util.spec_from_file_location("real_gpu_check", ROOT / "bench" / "real_gpu_check.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # (its dataclasses look their module up)
    spec.loader.exec_module(mod)
    return mod


rgc = _driver()


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COCAQ_")}
    env["PYTHON"] = sys.executable
    return env


def test_fake_mode_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    p = subprocess.run(
        [
            "bash",
            str(SCRIPT),
            "--fake",
            "--high-s",
            "4",
            "--low-s",
            "4",
            "--hook-pairs",
            "2",
            "--json",
            str(out),
        ],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr + p.stdout
    # the printed table parses: phase, seconds, counter J, mean W, then (J, signed %) per reading
    rows = {}
    for line in p.stdout.splitlines():
        m = re.match(
            r"(setup|high|low|tail|total)\s+([-0-9.]+)\s+([-0-9.]+)\s+([-0-9.]+)((?:\s+[-0-9.]+\s+[-+0-9.]+%)+)$",
            line,
        )
        if m:
            pairs = re.findall(r"([-0-9.]+)\s+([-+0-9.]+)%", m.group(5))
            rows[m.group(1)] = [float(x) for x in m.group(2, 3, 4)] + [
                float(v) for pair in pairs for v in pair
            ]
    assert set(rows) == {"setup", "high", "low", "tail", "total"}, p.stdout
    seconds, counter, mean_w, integral, d_integral, lagged, d_lagged = rows["total"]
    assert 8.0 < seconds < 30.0 and counter > 0 and mean_w == pytest.approx(counter / seconds, rel=2e-3)
    # The fake GPU reads power as the 1 s average (as Ampere and later do): the integral of the readings
    # taken at their read times misses half a second of the job's last power against its first (~2% here,
    # 250 W against 70 W over 9 s); moved back by half a second it agrees to sampling noise.
    assert abs(d_integral) < 5.0
    assert abs(d_lagged) < 1.0
    for energy, diff in ((integral, d_integral), (lagged, d_lagged)):
        assert (energy - counter) / counter * 100 == pytest.approx(diff, abs=0.02)
    assert rows["high"][2] > 2 * rows["low"][2] > 2 * rows["setup"][2]  # the two power levels, and idle

    fig = json.loads(out.read_text())
    total = fig["phases"][-1]
    assert total["phase"] == "total"
    assert sum(r["counter_j"] for r in fig["phases"][:-1]) == pytest.approx(total["counter_j"], rel=1e-9)
    # what the epilog computed is what the database holds for the job, as shipped and as linked
    assert fig["stored"]["node_energy"] == [{"source": "nvml", "energy_j": pytest.approx(total["counter_j"])}]
    assert fig["stored"]["job_energy"] == [
        {"source": "nvml", "method": "measured", "energy_j": pytest.approx(total["counter_j"])}
    ]
    assert fig["stored"]["collector_samples_in_job"] >= 8
    hooks = fig["hooks_ms"]
    assert hooks["prolog"] > 0 and hooks["epilog"] > 0 and len(hooks["pairs"]["prolog"]) == 2
    assert "Job 90001 on cluster gpucheck" in p.stdout
    assert "GPU energy counter" in p.stdout  # `cocaq job`: the measured source


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU machine: the real check would run")
def test_without_a_gpu_it_says_why_in_one_line() -> None:
    p = subprocess.run(["bash", str(SCRIPT)], env=_env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("real_gpu_check: no GPU here: nvml: "), p.stderr


def test_integrate_is_the_trapezoid_with_flat_ends() -> None:
    ts, ws = [1.0, 2.0, 4.0], [100.0, 200.0, 200.0]
    assert rgc.integrate(ts, ws, 1.0, 4.0) == pytest.approx(150.0 + 400.0)
    assert rgc.integrate(ts, ws, 0.0, 1.5) == pytest.approx(100.0 + 62.5)  # flat before the first
    assert rgc.integrate(ts, ws, 3.0, 6.0) == pytest.approx(600.0)  # and after the last
    assert rgc.integrate([], [], 0.0, 1.0) == 0.0


FAKE_SMI = """#!{python}
# nvidia-smi as bench/real_gpu_check.py calls it: one probe per field, or a loop every -lms ms until SIGINT
import signal, sys, time
from datetime import datetime
args = sys.argv[1:]
query = next(a.split("=", 1)[1] for a in args if a.startswith("--query-gpu="))
if "-lms" not in args:
    print("[N/A]" if query == "power.draw.instant" else "123.45")
    sys.exit(0)
signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
period = int(args[args.index("-lms") + 1]) / 1000
print("garbage line")
while True:
    now = datetime.now().strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
    print(f"{{now}}, 300.00")  # no flush: a pipe would hold these lines; a terminal gets each at once
    time.sleep(period)
"""


def test_smi_log_reads_nvidia_smi_as_it_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_SMI.format(python=sys.executable))
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    log = rgc.SmiLog("GPU-x", 100)
    assert log.fields == ["power.draw"]  # the instant field answers [N/A] here: left out
    t0 = time.time()
    time.sleep(1.5)
    series = log.stop()
    ts, ws = series["power.draw"]
    assert len(ts) >= 8 and set(ws) == {300.0}
    assert t0 - 1 < ts[0] < ts[-1] < time.time()
    assert rgc.integrate(ts, ws, ts[0], ts[-1]) == pytest.approx(300.0 * (ts[-1] - ts[0]))


def test_wheelhouse_unpacks_once(tmp_path: Path) -> None:
    wheels, into = tmp_path / "wheels", tmp_path / "deps"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "demo_pkg-1.0-py3-none-any.whl", "w") as z:
        z.writestr("demo_pkg/__init__.py", "VALUE = 1\n")
        z.writestr("demo_pkg-1.0.dist-info/METADATA", "Name: demo-pkg\nVersion: 1.0\n")
    rgc.unpack_wheels(wheels, into)
    assert (into / "demo_pkg" / "__init__.py").read_text() == "VALUE = 1\n"
    (into / "demo_pkg" / "marker").write_text("")
    rgc.unpack_wheels(wheels, into)  # the same wheelhouse: left as it is
    assert (into / "demo_pkg" / "marker").exists()
