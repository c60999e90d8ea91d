"""The head node's scheduler service behind `cocaq scheduler`: what runs when, one active scheduler, the loop.

- `jobs`: the job table (what each job does, its schedule) and the record of every run (`scheduler_runs`);
- `lock`: only one scheduler acts (a PostgreSQL advisory lock, or a lock file beside a SQLite database);
- `daemon`: APScheduler's loop over the job table, standby and takeover, and `--status`.

The command line (`cocaq/cli/scheduler.py`) only parses options and calls these; nothing else imports them
(tests/test_layers.py).

The oldest versions kept the job functions in a module of this very name, and APScheduler's job store
names each job's function by module and attribute (`cocaq.scheduler:job_reports_monthly`): such a job
must still load after an upgrade, or it is dropped with the run that fell due meanwhile. `__getattr__`
leads those names to the job table (the daemon's EARLIER_JOB_MODULES does the same for later homes).
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    """`cocaq.scheduler.job_*`, as the job store of the oldest versions names the job functions."""
    if name.startswith("job_"):
        from cocaq.scheduler import jobs

        if name in {f.__name__ for f in jobs.JOB_FUNCS.values()}:
            return getattr(jobs, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
