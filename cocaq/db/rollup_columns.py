"""The columns of the daily_rollups table (cocaq.db.schema.DailyRollup) by name: the one list of them.

The aggregator writes a row's counts and sums (cocaq.accounting.rollups), `cocaq user/lab` reads them
(cocaq.footprint.totals, as SQL text: on a login node it must not import SQLAlchemy, so the model
cannot be the list) and so do the reports (reports.queries). The order here is the order they reach
SQL, CSV and JSON in, which is not the table's; tests/test_formulas.py holds the names to the model's
columns and fails on a new copy of the list. Stdlib-only.
"""

from __future__ import annotations

# One row per cluster, day, user, account and partition (the table's unique key).
ROLLUP_KEYS = ("cluster_id", "day", "user_name", "account", "partition")
# The jobs that ran in the day, and those of them by how they ended (cocaq.accounting.ledger.OUTCOMES).
ROLLUP_COUNTS = ("jobs", "jobs_failed", "jobs_oom", "jobs_timeout", "jobs_cancelled")
# What a row sums, in its units (hours, joules, grams).
ROLLUP_SUMS = (
    "cpu_hours", "gpu_hours", "energy_gpu_j", "energy_cpu_j", "energy_dram_j", "energy_other_j",
    "energy_measured_j", "energy_estimated_j", "energy_failed_j", "energy_oom_j", "energy_timeout_j",
    "energy_cancelled_j", "co2_g", "co2_embodied_g", "gpu_util_energy_j", "gpu_util_weighted",
    "idle_gpu_hours", "idle_gpu_energy_j", "energy_est_low_j", "energy_est_high_j", "shift_co2_g",
    "shift_saved_g", "shift_pause_saved_g",
)  # fmt: skip
# Everything the aggregator computes for a row: the counts, then the sums.
ROLLUP_FIELDS = (*ROLLUP_COUNTS, *ROLLUP_SUMS)
