"""Reports: the monthly, job and idle-alert e-mails and the admins' interactive page, sent over SMTP.

Each step lives in small modules, imported where used so that `import cocaq.reports` stays cheap:

- the figures: `data` (the dataclasses every report is made of), `queries` (what the report kinds
  share), one builder module per kind (`user_report`, `lab_report`, `admin_report`, `job_report`),
  `suggest` (a user's suggestions) and `idle_jobs` (running jobs whose GPUs idle);
- words and pictures: `wording` (numbers as sentences), `render` (Jinja2 templates), `charts` (PNG),
  `admin_html` (the interactive page's Plotly charts), `message` (the MIME message), `files` (a report
  written to files instead of sent);
- delivery: `transport` (SMTP and the outbox directory, and how each fails), `recipients` (a user's
  address, opt-outs, the per-address daily throttle; what an address is: `cocaq.addresses`), `sent_mail`
  (the exactly-once record of sent mail in `sent_reports`; not the energy ledger,
  `cocaq.accounting.ledger`), `deliver` (sending a batch, and its one-line summary);
- what is sent: `batch` (a month's user, lab and admin e-mails, `cocaq report send`), `jobmail` (job
  e-mails at job end, grouped into digests), `alerts` (idle-GPU alerts while a job runs).

`trigger` is what `cocaq scheduler` calls (cocaq/scheduler/jobs.py, the reports jobs).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from cocaq.config import Config

# On Mondays in the first two weeks of a month, the previous month's batch is run again (see `trigger`).
WEEKLY_RETRY_DAYS = 14


@dataclass(frozen=True)
class Nothing:
    """A run that had nothing to do, and says why (the scheduler records it as `skipped`)."""

    reason: str
    status: str = "skipped"

    def line(self) -> str:
        return self.reason


def trigger(kind: str, period_start: datetime, engine: Engine, cfg: Config) -> Any:
    """Run the scheduled reports of `kind`; returns a summary with `line()` and `status`.

    * "monthly" (the 1st; `period_start` is the previous month's first day, local time): that month's
      user, lab and admin e-mails, as `cocaq report send --month YYYY-MM` sends them.
    * "weekly" (Mondays; `period_start` is the previous week's Monday): there is no weekly report. What is
      useful weekly is the month's batch again, in the first two weeks of a month: it sends only what the
      monthly run could not (a server that was down on the 1st, throttled or refused messages, reports
      of users whose address was fixed since) and is a quick no-op when everything went. Later Mondays
      do nothing, and say so.
    * "jobs" (every 5 minutes; `period_start` is the time of the run): job e-mails (reports.jobmail).
    """
    if kind == "monthly":
        from cocaq.reports.batch import send_month

        return send_month(engine, cfg, date(period_start.year, period_start.month, 1))
    if kind == "weekly":
        this_monday = (period_start + timedelta(days=7)).date()
        last_month = (this_monday.replace(day=1) - timedelta(days=1)).replace(day=1)
        if this_monday.day > WEEKLY_RETRY_DAYS:
            return Nothing(
                "no weekly report (monthly reports go out on the 1st, job e-mails at job end); "
                f"{last_month:%Y-%m}'s batch is retried on Mondays up to the {WEEKLY_RETRY_DAYS}th only"
            )
        from cocaq.reports.batch import send_month

        return send_month(engine, cfg, last_month)
    if kind == "jobs":
        from cocaq.reports.jobmail import send_job_mail

        return send_job_mail(engine, cfg, now=period_start)
    raise ValueError(f"reports: unknown kind {kind!r} (monthly, weekly, jobs)")
