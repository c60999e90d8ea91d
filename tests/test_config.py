from __future__ import annotations

from pathlib import Path

import pytest

from cocaq.config_load import load_config
from cocaq.errors import ConfigError
from tests.conftest import run_cocaq

GOOD = """
database_url = "sqlite:////tmp/x.sqlite"
[cluster]
name = "hal"
carbon_zone = "FRA"
pue = 1.3
timezone = "Europe/Paris"

[estimate]
gpu_utilisation = 0.6

[defaults]
gpu_tdp_w = 250

[partitions.gpu]
cpu_model = "EPYC 7763"
cpu_tdp_w_per_core = 4.4
gpu_model = "A100"
gpu_tdp_w = 400
mem_gb = 1024

[partitions.cpu]
cpu_tdp_w_per_core = 3.75
gpu_tdp_w = 0
pue = 1.1

[node_groups.h100]
nodes = ["h100-[01-04]", "h100-x*"]
gpu_model = "H100"
gpu_tdp_w = 700
carbon_zone = "SE3"
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "cocaq.toml"
    p.write_text(text)
    return p


def test_file_and_hardware_profiles(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, GOOD), environ={})
    assert cfg.cluster.name == "hal" and cfg.cluster.pue == 1.3 and cfg.estimate.gpu_utilisation == 0.6
    hw, name = cfg.hardware_for("gpu", ["gpu01"])
    assert (name, hw.gpu_tdp_w, hw.cpu_tdp_w_per_core) == ("partition:gpu", 400, 4.4)
    hw, name = cfg.hardware_for("gpu", ["h100-02", "h100-xyz"])  # every node in the group
    assert (name, hw.gpu_tdp_w) == ("node_group:h100", 700)
    assert cfg.zone_and_pue(hw) == ("SE3", 1.3)
    _, name = cfg.hardware_for("gpu", ["h100-02", "gpu01"])  # mixed nodes: the partition decides
    assert name == "partition:gpu"
    hw, name = cfg.hardware_for("cpu,gpu", [])
    assert name == "partition:cpu" and cfg.zone_and_pue(hw) == ("FRA", 1.1)
    hw, name = cfg.hardware_for("mystery", [])
    assert name == "default" and hw.gpu_tdp_w == 250  # [defaults] applies to unknown partitions
    # Partitions inherit [defaults] for keys they do not set.
    assert cfg.partitions["cpu"].cpu_model == "unknown CPU"


def test_environment_overrides(tmp_path: Path) -> None:
    env = {
        "COCAQ_DATABASE_URL": "postgresql+psycopg://u@h/db",
        "COCAQ_CLUSTER__PUE": "1.5",
        "COCAQ_ESTIMATE__GPU_UTILISATION": "0.9",
        "COCAQ_CLUSTER": "other",
    }
    cfg = load_config(write(tmp_path, GOOD), environ=env)
    assert cfg.database_url == "postgresql+psycopg://u@h/db"
    assert cfg.cluster.pue == 1.5 and cfg.cluster.name == "other" and cfg.estimate.gpu_utilisation == 0.9
    assert cfg.cluster.carbon_zone == "FRA"  # untouched keys stay


def test_config_env_var_picks_the_file(tmp_path: Path) -> None:
    p = write(tmp_path, GOOD)
    assert load_config(environ={"COCAQ_CONFIG": str(p)}).cluster.name == "hal"


def test_default_database_is_sqlite_in_user_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    cfg = load_config(None, environ={})
    assert cfg.database_url == f"sqlite:///{tmp_path / 'data' / 'cocaq' / 'cocaq.sqlite'}"


@pytest.mark.parametrize(
    ("text", "env", "message"),
    [
        ("[cluster]\npue = 0.5\n", {}, "cluster.pue: expected a number between 1.0 and 5.0, got 0.5"),
        ("[cluster]\npue = 'abc'\n", {}, "cluster.pue: expected a number, got 'abc'"),
        ("[partitions.gpu]\ngpu_tdp = 400\n", {}, "partitions.gpu.gpu_tdp: unknown key"),
        ("[estimate]\ngpu_utilisation = 1.5\n", {}, "estimate.gpu_utilisation: expected a number between"),
        ("[cluster]\ntimezone = 'Mars/Olympus'\n", {}, "cluster.timezone: unknown time zone"),
        ("[node_groups.x]\ngpu_tdp_w = 1\n", {}, "node_groups.x.nodes: expected a list"),
        ("colour = 'red'\n", {}, "colour: unknown key"),
        ("[carbon]\nbasis = 'marginal'\n", {}, "carbon.basis: expected 'lca' or 'direct'"),
        (
            "[carbon]\ngap_tolerance_s = 'soon'\n",
            {},
            "carbon.gap_tolerance_s: expected seconds or a duration",
        ),
        ("[embodied]\ng_per_gpu_hour = -1\n", {}, "embodied.g_per_gpu_hour: expected a number between"),
        ("[aggregate]\nidle_gpu_util_pct = 120\n", {}, "aggregate.idle_gpu_util_pct: expected a number"),
        ("[aggregate]\nworkers = 2.5\n", {}, "aggregate.workers: expected a whole number from 0 to 64"),
        ("", {"COCAQ_AGGREGATE__WORKERS": "many"}, "aggregate.workers: expected a whole number"),
        ("[cluster.pue_monthly]\n'2026-13' = 1.2\n", {}, "cluster.pue_monthly: '2026-13' is not a month"),
        ("[cluster.pue_monthly]\n'2026-01' = 0.9\n", {}, "cluster.pue_monthly.2026-01: expected a number"),
        ("", {"COCAQ_COLLECTOR__IDLE_POLICY": "fair"}, "collector.idle_policy: expected one of"),
        ("[collector]\nsources = ['nvml', 'ipmi2']\n", {}, "collector.sources: unknown source 'ipmi2'"),
        ("[cluster\n", {}, "not valid TOML"),
        ("", {"COCAQ_CLUSTER__PUE": "high"}, "cluster.pue: expected a number, got 'high'"),
        ("", {"COCAQ_FROB": "1"}, "COCAQ_FROB: unknown setting"),
        ("", {"COCAQ_NOPE__X": "1"}, "COCAQ_NOPE__X: unknown section"),
        (
            "",
            {"COCAQ_ESTIMATE__CPU_USAGE": "guess"},
            "estimate.cpu_usage: expected 'totalcpu' or 'allocated'",
        ),
        ('[shifting]\nslack_s = "40d"\n', {}, "shifting.slack_s: expected a number between 0.0 and"),
        ("", {"COCAQ_SHIFTING__SLACK_S": "soon"}, "shifting.slack_s: expected seconds or a duration like 2h"),
        ("[shifting]\nmin_share = 2\n", {}, "shifting.min_share: expected a number between 0.0 and 1.0"),
        ('[study]\nstart = "2026-9"\n', {}, 'study.start: expected a month like "2026-09"'),
        ('[study]\nstart = "2026-09"\nend = "2026-08"\n', {}, "study.end (2026-08) needs a study.start"),
        ("[study]\nholdout_share = 0.9\n", {}, "study.holdout_share: expected a number between 0.05 and 0.5"),
        ("", {"COCAQ_STUDY__SEED": "1.5"}, "study.seed: expected a whole number"),
    ],
)
def test_bad_config_names_key_and_problem(
    tmp_path: Path, text: str, env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), environ=env)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_explicit_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "nope.toml", environ={})


def test_cli_bad_config_is_one_line(tmp_path: Path, cli_env: dict[str, str]) -> None:
    p = write(tmp_path, "[partitions.gpu]\ngpu_tdp_w = -3\n")
    r = run_cocaq(["--config", str(p), "user", "alice"], cli_env)
    assert r.code == 2
    assert r.err.strip().count("\n") == 0, r.err
    assert "partitions.gpu.gpu_tdp_w" in r.err and "Traceback" not in r.err


def test_cli_unreachable_database_masks_password(cli_env: dict[str, str]) -> None:
    env = dict(cli_env, COCAQ_DATABASE_URL="postgresql+psycopg://cocaq:s3cret@127.0.0.1:1/cocaq")
    r = run_cocaq(["user", "alice"], env)
    assert r.code == 3
    assert r.err.startswith(
        "cocaq: error: cannot connect to database postgresql+psycopg://cocaq:***@127.0.0.1:1/cocaq"
    )
    assert "s3cret" not in r.err and "Traceback" not in r.err
    assert r.err.strip().count("\n") == 0, r.err


def test_cli_unmigrated_database(tmp_path: Path, cli_env: dict[str, str]) -> None:
    env = dict(cli_env, COCAQ_DATABASE_URL=f"sqlite:///{tmp_path / 'empty.sqlite'}")
    r = run_cocaq(["user", "alice"], env)
    assert r.code == 3 and "run `cocaq db upgrade`" in r.err and "Traceback" not in r.err
