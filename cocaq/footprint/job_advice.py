"""The notes on one job, jobstats-style: what it used of what it asked for, what it lost, and the exact
line to change, each as an `Advice` about that job alone (its whole energy, not a window's share).

`cocaq job` and the job e-mail show these (through cocaq.footprint.one_job). They are the same rules as
the window's suggestions (cocaq.footprint.advice), one module each in cocaq.footprint.rules, each said of
a single job (`Rule.on_job`), with lower bars where a note costs the reader nothing. One note per kind of
GPU use: a rule whose `after` names a rule that spoke of the job says nothing (an idle notebook is told to
end, not to ask for fewer GPUs or more cores). Standard library only (login nodes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from cocaq.footprint.jobfacts import JobFacts
from cocaq.footprint.rules.base import Advice, Context
from cocaq.footprint.rules.catalog import ON_JOB


def job_notes(job: JobFacts, ctx: Context, runs: Sequence[JobFacts] = ()) -> list[Advice]:
    """jobstats-style notes on one job, whole: what it used of what it asked for, and the exact line to
    change, largest saving first. `runs`: the user's runs that ended in `ctx`'s window, for the precision
    comparison and the time limit."""
    j = job if job.share == 1.0 else replace(job, share=1.0)
    out: list[Advice] = []
    spoke: set[str] = set()
    for rule in ON_JOB:
        if spoke.intersection(rule.after):
            continue
        note = rule.on_job(j, ctx, runs)
        if note is not None:
            out.append(note)
            spoke.add(rule.name)
    out.sort(key=lambda a: (a.saving_kwh is None, -(a.saving_kwh or 0.0), a.id))
    return out
