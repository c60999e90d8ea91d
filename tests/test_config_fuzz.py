"""Config files of any shape: a clear one-line ConfigError or a Config, never another exception.

A type the parser did not expect (`[node_groups.x] nodes = 5`) once raised TypeError, and the hooks,
which fall back to their defaults only on ConfigError, then failed on every job.
"""

from __future__ import annotations

import os
from dataclasses import fields
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cocaq import config as C
from cocaq import config_load as L
from cocaq.errors import ConfigError

SECTIONS: dict[str, Any] = {
    "cluster": C.Cluster, "estimate": C.Estimate, "collector": C.Collector, "carbon": C.Carbon,
    "embodied": C.Embodied, "aggregate": C.Aggregate, "mail": C.Mail, "reports": C.Reports,
    "api": C.Api, "advice": C.Advice, "alerts": C.Alerts, "defaults": C.Hardware,
}  # fmt: skip
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.sampled_from([10**400, -1, 0, 1, 2**31, 2**63]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["\ud800", "\x00", "", "UTC", "Europe/Paris", "nvml", "postgresql://x", "1d"]),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)


@st.composite
def configs(draw: st.DrawFn) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for name in draw(st.lists(st.sampled_from(sorted(SECTIONS)), max_size=4, unique=True)):
        keys = [f.name for f in fields(SECTIONS[name])]
        sec = draw(st.dictionaries(st.sampled_from(keys), VALUES, max_size=4))
        data[name] = sec if draw(st.integers(0, 9)) else draw(VALUES)  # sometimes not a table at all
    for name in ("partitions", "node_groups"):
        if draw(st.booleans()):
            keys = [f.name for f in fields(C.Hardware)] + ["nodes"]
            data[name] = draw(
                st.one_of(
                    VALUES,
                    st.dictionaries(
                        st.text(min_size=1, max_size=6),
                        st.dictionaries(st.sampled_from(keys), VALUES, max_size=3),
                    ),
                )
            )
    for key in ("database_url", "spool_dir"):
        if draw(st.booleans()):
            data[key] = draw(VALUES)
    return data


@settings(
    max_examples=int(os.environ.get("COCAQ_FUZZ_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(configs())
def test_any_config_is_a_config_error_or_a_config(data: dict[str, Any]) -> None:
    try:
        L._from_dict(data, "fuzz")
    except ConfigError as exc:
        assert "\n" not in str(exc).strip(), "one line"


def test_found_examples() -> None:
    """Regression cases the fuzzing found, kept."""
    for data in (
        {"node_groups": {"x": {"nodes": 5}}},
        {"node_groups": {"x": 5}},
        {"partitions": {"gpu": {"gpu_tdp_w": 10**400}}},
        {"partitions": {"gpu": {"gpu_tdp_w": float("inf")}}, "embodied": {"g_per_gpu_hour": 10**400}},
        {"node_groups": {"a\nb": {"nodes": []}}},
        {"node_groups": {"x": {"cpu_model": None}}},
    ):
        try:
            L._from_dict(data, "fuzz")
        except ConfigError as exc:
            assert str(exc).isprintable(), "one line, control characters escaped"


def test_the_hooks_fall_back_to_their_defaults_on_any_config_failure(tmp_path: Any, monkeypatch: Any) -> None:
    """A hook must write its record whatever the config says: it falls back to the defaults on a bad
    config (once a TypeError from `nodes = 5` escaped, and every hook run on the node failed)."""
    from cocaq.prolog_epilog import hookconfig

    bad = tmp_path / "c.toml"
    bad.write_text("[node_groups.x]\nnodes = 5\n")
    got, problems = hookconfig._compute(str(bad), {})
    assert got["cluster"] == C.Cluster().name and "node_groups.x.nodes" in problems[0]

    def broken(*a: Any, **k: Any) -> Any:
        raise TypeError("a bug in the parser")

    monkeypatch.setattr(L, "load_config", broken)
    got, problems = hookconfig._compute(str(bad), {})
    assert got["spool_dir"] == C.Config(database_url="sqlite://").spool_dir
    assert problems == ["config unusable (TypeError), hook uses defaults: a bug in the parser"]
