"""What the rules of Princeton's jobstats notes share (what many sites' users know), on cocaq's data: a
finding on one job (`Hit`), found once per job (`JobstatsRule.find`), said over a window by naming every
job it fits and on one job by speaking of it alone.

The rules: ``cpus`` (CPU cores kept busy), ``cores-per-gpu`` and ``mem-per-gpu`` (against a fair share of
the node), ``fewer-nodes`` (jobs spread over more nodes than they need), ``unused-gpus`` (GPUs a job never
used), ``zero-cpu-nodes`` (nodes a job never used) and ``mig`` (MIG slices for jobs that use a small part
of a full GPU), each in its own module. None claims an energy saving: an idle core or a memory reservation
draws little that cocaq counts, and what idle GPUs drew is the ``fewer-gpus`` advice's; they free
resources for others and let the user's own jobs start sooner. Where they need the node (cores, GPUs and
memory per node), it is the hardware profile's (`cores_per_node`, `gpus_per_node`, `mem_gb` of
`[partitions.NAME]` or `[node_groups.NAME]`); without the profile's figures, no note.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from cocaq.footprint.advice_words import n_jobs
from cocaq.footprint.jobfacts import JobFacts
from cocaq.footprint.rules.base import Advice, Context, Evidence
from cocaq.footprint.rules.registry import Rule

MIN_RUN_H = 0.25  # a shorter run says little about what it needs (jobstats: 300 s)
JOBSTATS = "Princeton's jobstats (github.com/PrincetonUniversity/jobstats)"


@dataclass(frozen=True)
class Hit:
    """One job's finding: the sentence about it alone, the detail a window's list gives, the lines."""

    job: JobFacts
    body: str
    detail: str
    change: tuple[str, ...]
    evidence: tuple[tuple[str, float, str], ...]
    weight: float  # the largest first: what the note frees
    title: str | None = None  # on one job, where it differs from the rule's


def fair_share(j: JobFacts) -> tuple[float, float] | None:
    """A GPU's fair share of its node: (cores, GB of memory); None where the profile does not say."""
    if j.gpus <= 0 or j.node_gpus <= 0:
        return None
    return j.node_cores / j.node_gpus, j.node_mem_gb / j.node_gpus


class JobstatsRule(Rule):
    """A jobstats note: found on each job alone, with words fixed but for the finding's own."""

    saves = False
    title: ClassVar[str]  # over a window (plural)
    job_title: ClassVar[str]  # on one job
    why: ClassVar[str]  # the window's sentence after the list of jobs
    basis: ClassVar[str]
    test: ClassVar[str]

    @abstractmethod
    def find(self, j: JobFacts, ctx: Context) -> Hit | None:
        """What this rule finds on job `j`; None: nothing."""

    def over_window(self, jobs: Sequence[JobFacts], ctx: Context) -> Advice | None:
        hits = [h for j in jobs if (h := self.find(j, ctx)) is not None]
        if not hits:
            return None
        hits.sort(key=lambda h: (-h.weight, h.job.job_id))
        top = hits[0]
        more = f" and {len(hits) - 4} more" if len(hits) > 4 else ""
        return Advice(
            id=self.name,
            title=self.title,
            body=f"{n_jobs(len(hits))} {ctx.period}: "
            + "; ".join(h.detail for h in hits[:4])
            + more
            + f". {self.why} For a job like {top.job.job_id}: {top.body}",
            change=top.change,
            evidence=(Evidence("jobs", len(hits), "jobs"), *(Evidence(*e) for e in top.evidence)),
            job_ids=tuple(h.job.job_id for h in hits),
            saving_kwh=None,
            saving_kg=None,
            upper_bound=False,
            basis=self.basis,
            test=self.test,
        )

    def on_job(self, j: JobFacts, ctx: Context, runs: Sequence[JobFacts]) -> Advice | None:
        h = self.find(j, ctx)
        if h is None:
            return None
        return Advice(
            id=self.name, title=h.title or self.job_title, body=h.body, change=h.change,
            evidence=tuple(Evidence(*e) for e in h.evidence), job_ids=(j.job_id,), saving_kwh=None,
            saving_kg=None, upper_bound=False, basis=self.basis, test="this job",
        )  # fmt: skip
