"""Which tests may run at once under pytest-xdist (scripts/test.sh, COCAQ_TEST_WORKERS).

Each real Slurm cluster (tests/slurm/cluster.sh: Debian's 22.05 and the 25.11 built from source) is
machine-wide: its slurm.conf, daemons, ports and accounting. Its tests form one group that one worker
runs in order; every other module is a unit of its own and the units are shared out as workers free up.
A module stays on one worker so that its module-scoped fixtures (a month of data per database kind) are
built once.

The groups come from the test ids: pytest-xdist 3.8's `xdist_group` mark does nothing under pytest 9
(it renames `item._nodeid`, which pytest 9's `nodeid` no longer reads), so a scheduler of our own groups
the ids it is given.
"""

from __future__ import annotations

from typing import Any

import pytest

# group -> (whole modules, test_slurm_jobs.py's parameter for that version)
CLUSTERS: dict[str, tuple[tuple[str, ...], str]] = {
    # test_ansible_converge.py deploys onto this machine and rewrites 22.05's slurm.conf with its hooks
    "slurm-22.05": (("tests/test_live_slurm.py", "tests/test_ansible_converge.py"), "[22.05"),
    "slurm-25.11": (("tests/test_slurm_backends.py",), "[25.11"),
}
# 22.05's group first (it is the longest and its cluster is up already); 25.11's last, as in a serial
# run, because its tests wait for the background build of Slurm 25.11 and pyslurm (tests/conftest.py)
FIRST, LAST = "slurm-22.05", "slurm-25.11"


def group_of(nodeid: str) -> str:
    """The unit a test is scheduled in: its cluster's group, else its module."""
    module = nodeid.split("::", 1)[0]
    for group, (modules, param) in CLUSTERS.items():
        if module in modules or (module == "tests/test_slurm_jobs.py" and param in nodeid):
            return group
    return module


def _rank(unit: str, size: int) -> tuple[int, int]:
    return (0 if unit == FIRST else 2 if unit == LAST else 1, -size)


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's scope scheduler with `group_of` as the scope, the clusters' groups first and last and the
    other units largest first (xdist's own order)."""
    from xdist.scheduler import LoadScopeScheduling

    class ClusterGroups(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            if not getattr(self, "_ranked", False):
                units = sorted(self.workqueue.items(), key=lambda kv: _rank(kv[0], len(kv[1])))
                self.workqueue.clear()
                self.workqueue.update(units)
                self._ranked = True
            super()._assign_work_unit(node)

    return ClusterGroups(config, log)


class Plugin:
    """Registered by tests/conftest.py where pytest-xdist is installed (its hook exists only then)."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        if config.getvalue("dist") in ("no", "each"):
            return None
        return make_scheduler(config, log)
