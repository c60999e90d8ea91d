"""RAPL discovery and reading on fake sysfs trees, and the wrap/reset-safe counter."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest
from sysfs_tree import DEFAULT_MAX_UJ, make_rapl

from cocaq.collector import rapl as rapl_mod
from cocaq.collector.rapl import Rapl, RaplCounter, RaplUnavailable


def test_discovery_ids_kinds_and_mmio_ignored(tmp_path: Path) -> None:
    make_rapl(tmp_path, packages=2, dram=True, psys=True, core=True, uncore=True, mmio=True)
    r = Rapl(str(tmp_path))
    got = {d.id: (d.kind, d.name, d.package) for d in r.domains()}
    assert got == {
        "package-0": ("package", "package-0", 0),
        "package-0/core": ("core", "core", 0),
        "package-0/uncore": ("uncore", "uncore", 0),
        "package-0/dram": ("dram", "dram", 0),
        "package-1": ("package", "package-1", 1),
        "package-1/core": ("core", "core", 1),
        "package-1/uncore": ("uncore", "uncore", 1),
        "package-1/dram": ("dram", "dram", 1),
        "psys": ("psys", "psys", None),
    }  # intel-rapl-mmio:0 (a second package-0) is not a domain at all
    assert all(d.max_energy_uj == DEFAULT_MAX_UJ for d in r.domains())
    assert [d.id for d in r.counted()] == ["package-0", "package-0/dram", "package-1", "package-1/dram"]


def test_packages_and_dram_summed_psys_and_core_not_added(tmp_path: Path) -> None:
    tree = make_rapl(tmp_path, packages=2, dram=True, psys=True, core=True, mmio=True)
    r = Rapl(str(tmp_path))
    counter = RaplCounter.for_domains(r.domains())
    counter.update(0.0, r.read())
    steps = {
        "package-0": 80.0,
        "package-0/dram": 10.0,
        "package-1": 60.0,
        "package-1/dram": 12.0,
        "package-0/core": 50.0,
        "package-1/core": 40.0,
        "psys": 200.0,
        "mmio/package-0": 80.0,
    }
    for dom, j in steps.items():
        tree.add_joules(dom, j)
    per_domain = counter.update(10.0, r.read())
    node = sum(per_domain[d.id] for d in r.counted())
    assert node == pytest.approx(162.0)  # adding psys (200) or cores (90) or mmio (80) would break this
    assert per_domain["psys"] == pytest.approx(200.0)  # read, just not counted


def test_psys_counted_only_without_packages(tmp_path: Path) -> None:
    make_rapl(tmp_path, packages=0, psys=True)
    assert [d.id for d in Rapl(str(tmp_path)).counted()] == ["psys"]


def test_amd_like_tree_and_multi_die_names(tmp_path: Path) -> None:
    tree = make_rapl(tmp_path, packages=1, dram=False, core=True, prefix="amd-rapl")
    tree.add_zone("amd-rapl:1", "package-0-die-1", "package-0-die-1", energy_uj=5)
    r = Rapl(str(tmp_path))
    assert [d.id for d in r.counted()] == ["package-0", "package-0-die-1"]
    assert {d.id: d.package for d in r.domains()}["package-0-die-1"] == 0


def test_no_powercap_or_no_domains_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(RaplUnavailable, match="rapl: cannot list"):
        Rapl(str(tmp_path))
    (tmp_path / "class/powercap").mkdir(parents=True)
    with pytest.raises(RaplUnavailable, match="no intel-rapl domains"):
        Rapl(str(tmp_path))


def test_wrap_around_gives_the_right_joules(tmp_path: Path) -> None:
    tree = make_rapl(tmp_path, packages=1, dram=False)
    tree.set("package-0", DEFAULT_MAX_UJ - 1_500_000)  # 1.5 J before the top
    r = Rapl(str(tmp_path))
    counter = RaplCounter.for_domains(r.domains())
    counter.update(0.0, r.read())
    assert tree.add_joules("package-0", 2500.0) == 2_498_500_000  # it wrapped: 2498.5 J past 0
    assert counter.update(10.0, r.read()) == {"package-0": pytest.approx(2500.0)}
    assert counter.anomaly_count == 0


def test_reset_gives_no_energy_and_an_anomaly() -> None:
    counter = RaplCounter({"package-0": DEFAULT_MAX_UJ})
    counter.update(0.0, {"package-0": 150_000_000_000})
    out = counter.update(10.0, {"package-0": 3_000_000})  # dropped mid-range: a reboot, not a wrap
    assert "package-0" not in out  # no energy: not negative, not ~112 kJ
    assert counter.anomaly_count == 1 and "drop" in counter.anomalies[0].reason
    assert counter.update(20.0, {"package-0": 4_000_000}) == {"package-0": pytest.approx(1.0)}


def test_implausible_jump_and_unknown_range_and_time_backwards() -> None:
    counter = RaplCounter({"a": DEFAULT_MAX_UJ, "b": 0}, max_plausible_w=1000.0)
    counter.update(0.0, {"a": 0, "b": 10_000_000})
    out = counter.update(10.0, {"a": 20_000_000_000, "b": 5})  # 2000 W; b drops with no known range
    assert out == {} and counter.anomaly_count == 2
    assert counter.update(20.0, {"a": 21_000_000_000}) == {"a": pytest.approx(1000.0)}  # new base, 100 W
    assert counter.update(15.0, {"a": 21_001_000_000}) == {}  # the clock went backwards
    assert counter.anomaly_count == 3
    assert counter.update(25.0, {"a": DEFAULT_MAX_UJ + 1}) == {}  # above the range: bogus, skipped
    assert counter.anomaly_count == 4
    assert counter.update(30.0, {"a": 21_002_000_000}) == {"a": pytest.approx(1.0)}
    assert all(v >= 0 for v in out.values())


def test_wrap_too_fast_to_be_real_is_a_reset() -> None:
    counter = RaplCounter({"p": 10_000_000_000})  # a small 10 kJ range
    counter.update(0.0, {"p": 4_000_000_000})
    assert counter.update(1.0, {"p": 3_000_000_000}) == {}  # "wrap" = 9 kJ in 1 s
    counter.update(2.0, {"p": 9_999_000_000})
    assert counter.update(3.0, {"p": 1_000_000}) == {"p": pytest.approx(2.0)}  # a real wrap: 2 J in 1 s


def test_counter_state_round_trip_json() -> None:
    counter = RaplCounter({"package-0": DEFAULT_MAX_UJ}, max_plausible_w=500.0)
    counter.update(0.0, {"package-0": 10_000_000})
    state = json.loads(json.dumps(counter.to_state()))
    again = RaplCounter.from_state(state)
    assert again.max_plausible_w == 500.0 and again.max_energy_uj == {"package-0": DEFAULT_MAX_UJ}
    assert again.update(10.0, {"package-0": 30_000_000}) == {"package-0": pytest.approx(20.0)}
    garbage = RaplCounter.from_state({"prev": {"x": ["a", -1], "y": 3}, "max_plausible_w": "big"})
    assert garbage.to_state()["prev"] == {} and garbage.max_plausible_w == 1000.0


def test_unreadable_energy_recorded_in_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = make_rapl(tmp_path, packages=2, dram=True)
    # Tests run as root, so chmod 000 stops nothing: make one a directory, deny the other at open().
    energy = tree.path("package-1/dram") / "energy_uj"
    energy.unlink()
    energy.mkdir()
    real_open = os.open

    def deny(path: str, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if (
            path == "energy_uj"
            and dir_fd is not None
            and os.readlink(f"/proc/self/fd/{dir_fd}").endswith("/intel-rapl:0")
        ):
            raise PermissionError(errno.EACCES, "Permission denied")
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(rapl_mod.os, "open", deny)
    r = Rapl(str(tmp_path))
    values = r.read()
    assert set(values) == {"package-0/dram", "package-1"}
    assert "permission denied" in r.errors["package-0"] and "CVE-2020-8694" in r.errors["package-0"]
    assert "not a regular file" in r.errors["package-1/dram"]


def test_nothing_readable_is_unavailable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_rapl(tmp_path, packages=1, dram=False)
    real_open = os.open

    def deny(path: str, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if path == "energy_uj":
            raise PermissionError(errno.EACCES, "Permission denied")
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(rapl_mod.os, "open", deny)
    with pytest.raises(RaplUnavailable, match="permission denied"):
        Rapl(str(tmp_path))


def test_symlinks_inside_the_tree_are_not_followed(tmp_path: Path) -> None:
    sysfs = tmp_path / "sys"
    tree = make_rapl(sysfs, packages=2, dram=True)
    outside = tmp_path / "user-owned"
    outside.mkdir()
    (outside / "energy").write_text("123456789\n")  # parseable, so following it would be visible
    energy = tree.path("package-1") / "energy_uj"
    energy.unlink()
    energy.symlink_to(outside / "energy")
    (tree.path("package-0/dram") / "energy_uj").unlink()
    (tree.path("package-0/dram") / "energy_uj").symlink_to("/etc/passwd")
    r = Rapl(str(sysfs))
    values = r.read()
    assert "package-1" not in values and "package-0/dram" not in values
    assert "symlink" in r.errors["package-1"] and "symlink" in r.errors["package-0/dram"]


def test_class_link_leaving_the_sysfs_root_is_ignored(tmp_path: Path) -> None:
    sysfs = tmp_path / "sys"
    make_rapl(sysfs, packages=1, dram=False)
    fake = tmp_path / "evil" / "intel-rapl:7"
    fake.mkdir(parents=True)
    for name, text in (("name", "package-7\n"), ("energy_uj", "5\n"), ("max_energy_range_uj", "100\n")):
        (fake / name).write_text(text)
    (sysfs / "class/powercap/intel-rapl:7").symlink_to(fake)
    r = Rapl(str(sysfs))
    assert [d.id for d in r.domains()] == ["package-0"]
    assert "leaves the sysfs root" in r.skipped["intel-rapl:7"]


@pytest.mark.parametrize("content", ["abc\n", "", "-5\n", "12 34\n", "9" * 40 + "\n", "1" * 5000, "\x00\xff"])
def test_garbage_energy_is_skipped(tmp_path: Path, content: str) -> None:
    tree = make_rapl(tmp_path, packages=2, dram=False)
    (tree.path("package-1") / "energy_uj").write_text(content)
    r = Rapl(str(tmp_path))
    assert r.read() == {"package-0": 1_000_000}
    assert r.errors["package-1"].startswith("energy_uj: ")


def test_fifo_does_not_block_and_is_refused(tmp_path: Path) -> None:
    tree = make_rapl(tmp_path, packages=2, dram=False)
    energy = tree.path("package-1") / "energy_uj"
    energy.unlink()
    os.mkfifo(energy)
    r = Rapl(str(tmp_path))
    assert "package-1" not in r.read() and "not a regular file" in r.errors["package-1"]


def test_zone_vanishing_after_discovery(tmp_path: Path) -> None:
    tree = make_rapl(tmp_path, packages=2, dram=True)
    r = Rapl(str(tmp_path))
    shutil.rmtree(tree.path("package-1"))
    values = r.read()
    assert set(values) == {"package-0", "package-0/dram"}
    assert "vanished" in r.errors["package-1"] and "vanished" in r.errors["package-1/dram"]


def test_garbage_name_or_range_at_discovery(tmp_path: Path) -> None:
    tree = make_rapl(tmp_path, packages=2, dram=False)
    (tree.path("package-1") / "name").write_text("rm -rf /\n")
    (tree.path("package-0") / "max_energy_range_uj").write_text("lots\n")
    r = Rapl(str(tmp_path))
    assert [(d.id, d.max_energy_uj) for d in r.domains()] == [("package-0", 0)]  # 0: wrap range unknown
    assert "unknown domain name" in r.skipped["intel-rapl:1"]
