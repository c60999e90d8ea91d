"""The advice rules' one interface and their registry, as the collector's energy sources have theirs
(cocaq.collector.sources): one small class per rule, registered by its name.

A rule says when it fires and what it says over a window of a user's jobs (`over_window`, the monthly
e-mail's, `cocaq user`'s and the read API's suggestions, cocaq.footprint.advice) and on one job (`on_job`,
the notes of `cocaq job` and the job e-mail, cocaq.footprint.job_advice), or on only one of the two; how
it sizes its saving (`saves`: whether it may claim one at all); and what it rests on (`source`: Slurm's
or a vendor's documentation, a study). Each rule is its own module of this package, named after it
(`out-of-memory` in out_of_memory.py); cocaq.footprint.rules.catalog imports them all and lists them in
`order`. Both surfaces iterate that list, so that a rule is defined once, and once named.
"""

from __future__ import annotations

from abc import ABC
from collections.abc import Mapping, Sequence
from typing import ClassVar, TypeVar

from cocaq.footprint.jobfacts import JobFacts
from cocaq.footprint.rules.base import Advice, Context


class Rule(ABC):
    """One piece of advice: when it fires, what it says, how it sizes its saving, what it rests on."""

    name: ClassVar[str]  # its suggestions' and notes' id, as every surface and the study record it
    order: ClassVar[int]  # where it runs among the others (no two the same)
    source: ClassVar[str]  # the documentation or study its words and numbers rest on
    # its suggestion over a window may claim an energy saving: `advise` (the floor of a share of the user's
    # energy) can show it, so it runs there; one that never claims one runs only where every rule does
    saves: ClassVar[bool] = True
    repeated: ClassVar[bool] = False  # jobs ending this bad way again and again count whatever their energy
    # over a window it reads every GPU job (cocaq.footprint.advice_jobs hands it the narrow ones too)
    every_gpu_job: ClassVar[bool] = False
    after: ClassVar[tuple[str, ...]] = ()  # on one job: it says nothing where one of these rules spoke

    def over_window(self, jobs: Sequence[JobFacts], ctx: Context) -> Advice | None:
        """The suggestion over a window of a user's jobs; None: nothing to say."""
        return None

    def on_job(self, j: JobFacts, ctx: Context, runs: Sequence[JobFacts]) -> Advice | None:
        """The note on one job, whole (`share` 1); `runs`: the user's runs that ended in `ctx`'s window."""
        return None

    @property
    def speaks_over_window(self) -> bool:
        return type(self).over_window is not Rule.over_window

    @property
    def speaks_on_job(self) -> bool:
        return type(self).on_job is not Rule.on_job

    def job_note(
        self,
        j: JobFacts,
        title: str,
        body: str,
        change: tuple[str, ...] = (),
        kwh: float | None = None,
        upper: bool = False,
        basis: str = "none claimed",
    ) -> Advice:
        """A note about job `j` alone: its saving (`kwh` of it, None: none claimed) at its own CO2 per kWh."""
        saved = None if kwh is None else kwh * j.kg_per_kwh
        return Advice(self.name, title, body, change, (), (j.job_id,), kwh, saved, upper, basis, "this job")


REGISTRY: dict[str, Rule] = {}

R = TypeVar("R", bound=Rule)


def register(cls: type[R], registry: dict[str, Rule] = REGISTRY) -> type[R]:
    """Register a rule under its name (a class decorator). Refused: a name or an order another rule has
    (a second definition of a rule would otherwise replace the first, or run beside it, unseen)."""
    if cls.name in registry:
        raise ValueError(
            f"advice rule {cls.name!r} is registered twice: {cls.__module__} and "
            f"{type(registry[cls.name]).__module__}"
        )
    clash = [r.name for r in registry.values() if r.order == cls.order]
    if clash:
        raise ValueError(f"advice rule {cls.name!r} has the order of {clash[0]!r} ({cls.order})")
    registry[cls.name] = cls()
    return cls


def in_order(registry: Mapping[str, Rule]) -> tuple[Rule, ...]:
    """The rules by `order`; refused where a rule's `after` names a rule that does not run before it."""
    rules = tuple(sorted(registry.values(), key=lambda r: r.order))
    seen: set[str] = set()
    for r in rules:
        missing = [a for a in r.after if a not in seen]
        if missing:
            raise ValueError(
                f"advice rule {r.name!r} runs after {missing[0]!r}, which runs later or not at all"
            )
        seen.add(r.name)
    return rules
