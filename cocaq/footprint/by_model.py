"""Energy and CO2 per ML model, framework and training run: `jobs` joined to `model_metadata`.

What counts, and why:

* A job is a run. A run counts, whole, in the window it *ended* in: [since, until) on `jobs.end_time`,
  the same half-open windows as `cocaq.footprint.totals`, so consecutive windows still add up (every finished
  job lands in exactly one). Unlike the footprint, a run is not pro-rated across the window's edges:
  its epochs and tokens belong to the whole run, so kWh per epoch is only meaningful for the whole
  run's energy. Running jobs (no end time yet) are left out until they end.
* Energy is IT energy before PUE (`jobs.energy_j`, as the footprint's `energy_kwh`); CO2 is operational
  (with PUE, `jobs.co2_g`); embodied CO2 (`job_metrics.co2_embodied_g`, once the aggregator has run) is
  kept apart and never added in. GPU-hours are allocated GPUs x elapsed time.
* By model: `model_name`, or "(unnamed)" for jobs whose metadata names no model (only a framework, say).
  By framework: `framework`, or "(unknown)".
* Precision is the `precision` column; rows written before it existed keep it in `extra` (`precision`
  or `dtype`), read as a fallback, lower-cased and without a `torch.` prefix. Dtype spellings are
  shown by their short names (float32 as fp32, bfloat16 as bf16), so that they group together.
* Per run, kWh (and kg CO2) per epoch and Wh (and g CO2) per million tokens are given where the
  metadata has a positive count, None otherwise (never a division by zero).
* The comparison users act on: for one user and one named model, the runs grouped by (precision, batch
  size), each group's energy per unit of work (per 1M tokens where the runs count tokens, per epoch
  where they count epochs: both, where both) the **energy-weighted mean** of its runs' energy per unit
  (sum(e_i * e_i/u_i) / sum(e_i): the runs that used the most energy weigh most,
  cocaq.footprint.own_runs.UnitCost),
  side by side with the ratio to the best (lowest) group. Only where at least two groups have one, and
  only groups with a known precision or batch size.

Totals are summed in SQL (SQLAlchemy Core, PostgreSQL and SQLite); the comparisons are grouped in Python
over the runs, with the formula the advice uses (cocaq.footprint.own_runs), so the two never disagree.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Connection, Float, Select, Table, case, func, literal, select

from cocaq.db.coltypes import as_utc
from cocaq.db.schema import Cluster, Job, JobMetrics, ModelMetadata
from cocaq.footprint.words import UNNAMED  # "(unnamed)": what it is, in words there
from cocaq.units import G_PER_KG, J_PER_KWH, S_PER_HOUR, WH_PER_KWH

J = cast(Table, Job.__table__).c
M = cast(Table, JobMetrics.__table__).c
MM = cast(Table, ModelMetadata.__table__).c
CL = cast(Table, Cluster.__table__).c
JOBS = cast(Table, Job.__table__)
METRICS = cast(Table, JobMetrics.__table__)
MODELS = cast(Table, ModelMetadata.__table__)
CLUSTERS = cast(Table, Cluster.__table__)

UNKNOWN = "(unknown)"
BASIS = "energy-weighted mean of the runs' energy per unit of work"
UNITS = ("1M tokens", "epoch")
WINDOW = "jobs that ended in [since, until); each run whole, not pro-rated"


# --- results ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupTotal:
    """A model's or a framework's runs in the window."""

    key: str  # the model name ("(unnamed)"), or the framework ("(unknown)")
    jobs: int
    users: int
    gpu_hours: float
    energy_kwh: float
    co2_kg: float  # operational (with PUE)
    co2_embodied_kg: float  # apart, never in co2_kg; 0 until the aggregator has run

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Run:
    """One job and what its metadata says; per-epoch and per-token figures None where unknown."""

    job_pk: int
    job_id: str
    cluster: str
    user: str
    account: str | None
    state: str
    end: datetime | None
    model: str  # model_name, or "(unnamed)"
    framework: str | None
    task: str | None
    precision: str | None
    batch_size: int | None
    epochs: float | None
    tokens: int | None
    gpus: int
    gpu_hours: float
    energy_kwh: float
    co2_kg: float
    co2_embodied_kg: float | None  # None until the aggregator has derived the job's metrics
    kwh_per_epoch: float | None
    wh_per_1m_tokens: float | None
    co2_kg_per_epoch: float | None
    co2_g_per_1m_tokens: float | None

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["end"] = self.end.isoformat() if self.end else None
        return d


@dataclass(frozen=True)
class SettingGroup:
    """One (precision, batch size) of a user's runs of one model."""

    precision: str | None
    batch_size: int | None
    runs: int
    units: float  # epochs, or millions of tokens (the comparison's `unit`)
    energy_kwh: float
    co2_kg: float
    kwh_per_unit: float  # energy-weighted mean of the runs' kWh per unit (BASIS)
    ratio_to_best: float | None  # kwh_per_unit / the best group's; None when the best used nothing

    def label(self, dims: Sequence[str] = ("precision", "batch_size")) -> str:
        """`in bf16 with batch size 64`, naming only `dims` (what differs between the groups compared)."""
        parts = []
        if "precision" in dims:
            parts.append(f"in {self.precision}" if self.precision else "in unrecorded precision")
        if "batch_size" in dims:
            parts.append(
                f"with batch size {self.batch_size}"
                if self.batch_size is not None
                else "with unrecorded batch size"
            )
        return " ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Comparison:
    """A user's runs of one model side by side by (precision, batch size): best (lowest kWh/epoch) first."""

    user: str
    model: str
    groups: tuple[SettingGroup, ...]
    basis: str = BASIS
    unit: str = "epoch"  # or "1M tokens"

    @property
    def best(self) -> SettingGroup:
        return self.groups[0]

    @property
    def worst(self) -> SettingGroup:
        return self.groups[-1]

    @property
    def against(self) -> SettingGroup | None:
        """The group the best is compared with: one that differs from it in one setting only, precision
        first (the same batch size: the comparison cocaq.footprint.own_runs makes, so that the same runs
        give the same percentage in the advice, the e-mail and `cocaq models`), else batch size (the
        same precision). None where every other group differs in both: such a comparison says nothing of
        either (a larger batch alone can cut the energy per unit)."""
        b = self.best
        prec = [g for g in self.groups[1:] if g.batch_size == b.batch_size and g.precision != b.precision]
        if prec:
            return max(prec, key=lambda g: (g.energy_kwh, str(g.precision)))
        batch = [g for g in self.groups[1:] if g.precision == b.precision and g.batch_size != b.batch_size]
        return batch[-1] if batch else None

    @property
    def saving(self) -> float | None:
        """How much less energy per unit the best group used than the one it is compared with."""
        a = self.against
        if a is None:
            return None
        w = a.kwh_per_unit
        return (w - self.best.kwh_per_unit) / w if w > 0 else None

    @property
    def saving_kwh(self) -> float:
        """What the other groups' work would have saved at the best group's rate (to rank comparisons)."""
        return sum(g.units * (g.kwh_per_unit - self.best.kwh_per_unit) for g in self.groups[1:])

    def differs(self) -> tuple[str, ...]:
        """Which of precision and batch size differ between the best and the group it is compared with."""
        b, w = self.best, self.against or self.worst
        pairs = (("precision", b.precision, w.precision), ("batch_size", b.batch_size, w.batch_size))
        dims = tuple(d for d, x, y in pairs if x != y)
        return dims or ("precision", "batch_size")

    def sentence(
        self,
        whose: str = "Your",
        kwh: Callable[[float], str] | None = None,
        name: Callable[[str], str] = str,
    ) -> str | None:
        """One line a user can act on: `Your llama-3-8b runs in bf16 used 42 Wh per 1M tokens, 38% less
        than in fp32.` None when the best group saved nothing worth saying (under 1%)."""
        s = self.saving
        if s is None or s < 0.01:
            return None
        fmt = kwh or _kwh_text
        dims = self.differs()
        a = self.against
        assert a is not None  # (a saving has one)
        # the setting held equal is said too: it is what makes the comparison one of the other
        if dims == ("precision",):
            best = self.best.label(dims) + (
                f" at batch size {self.best.batch_size}" if self.best.batch_size is not None else ""
            )
        else:
            best = self.best.label(("precision", "batch_size"))
        return (
            f"{whose} {name(self.model)} runs {best} used "
            f"{fmt(self.best.kwh_per_unit)} per {self.unit}, {round(s * 100)}% less than {a.label(dims)}."
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "user": self.user,
            "model": self.model,
            "unit": self.unit,
            "basis": self.basis,
            "saving": self.saving,
            "sentence": self.sentence(f"{self.user}'s"),
            "groups": [g.as_dict() for g in self.groups],
        }


@dataclass(frozen=True)
class ModelStats:
    """Everything `cocaq models` shows for a window and scope."""

    since: datetime
    until: datetime
    user: str | None
    account: str | None
    cluster: str | None
    by_model: tuple[GroupTotal, ...]
    by_framework: tuple[GroupTotal, ...]
    runs: tuple[Run, ...]
    comparisons: tuple[Comparison, ...] = field(default=())

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelStats:
        """What as_dict() wrote (the read API's answer), for the table and CSV output."""

        def group(x: Mapping[str, Any]) -> GroupTotal:
            return GroupTotal(**x)

        def run(x: Mapping[str, Any]) -> Run:
            return Run(**{**x, "end": datetime.fromisoformat(x["end"]) if x.get("end") else None})

        def comparison(x: Mapping[str, Any]) -> Comparison:
            groups = tuple(SettingGroup(**g) for g in x["groups"])
            return Comparison(
                user=x["user"],
                model=x["model"],
                groups=groups,
                basis=x.get("basis", BASIS),
                unit=x.get("unit", "epoch"),
            )

        return cls(
            since=datetime.fromisoformat(d["since"]),
            until=datetime.fromisoformat(d["until"]),
            user=d.get("user"),
            account=d.get("account"),
            cluster=d.get("cluster"),
            by_model=tuple(group(x) for x in d["by_model"]),
            by_framework=tuple(group(x) for x in d["by_framework"]),
            runs=tuple(run(x) for x in d["runs"]),
            comparisons=tuple(comparison(x) for x in d["comparisons"]),
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "since": self.since.isoformat(),
            "until": self.until.isoformat(),
            "window": WINDOW,
            "user": self.user,
            "account": self.account,
            "cluster": self.cluster,
            "by_model": [g.as_dict() for g in self.by_model],
            "by_framework": [g.as_dict() for g in self.by_framework],
            "runs": [r.as_dict() for r in self.runs],
            "comparisons": [c.as_dict() for c in self.comparisons],
        }


def _kwh_text(x: float) -> str:
    """A few significant digits, never scientific: 12.3 kWh, 1.5 kWh, 420 Wh, 0.42 Wh."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g} kWh"
    if abs(x) < 1:
        x *= WH_PER_KWH
        digits = max(0, 2 - math.floor(math.log10(abs(x))))
        return f"{x:,.{digits}f} Wh"
    digits = max(0, 2 - math.floor(math.log10(abs(x))))
    return f"{x:,.{digits}f} kWh"


# --- the queries -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scope:
    """Which jobs: users (None: all), a lab (Slurm account), a cluster by name or id."""

    users: tuple[str, ...] | None = None
    account: str | None = None
    cluster: str | None = None
    cluster_id: int | None = None

    def where(self) -> list[Any]:
        out: list[Any] = []
        if self.users is not None:
            one = len(self.users) == 1  # (none: an empty IN, false)
            out.append(J.user_name == self.users[0] if one else J.user_name.in_(self.users))
        if self.account is not None:
            out.append(J.account == self.account)
        if self.cluster_id is not None:
            out.append(J.cluster_id == self.cluster_id)
        if self.cluster is not None:
            out.append(J.cluster_id.in_(select(CL.id).where(CL.name == self.cluster)))
        return out


def _f(x: float) -> Any:
    return literal(x, Float)


# Spellings of one precision, so that `float32` (a dtype) and `fp32` runs compare as one group: the short
# names cocaq.ml.meta gives new rows, for rows of the first shape that kept a dtype in `extra`.
ALIASES = {
    "bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "single": "fp32",
    "float64": "fp64", "double": "fp64", "float8": "fp8",
}  # fmt: skip


def precision_expr() -> Any:
    """The run's precision: the column, else what a row of the first shape kept in `extra` (lower-cased,
    without `torch.`); common dtype spellings as their short names (ALIASES)."""
    legacy = func.coalesce(MM.extra["precision"].as_string(), MM.extra["dtype"].as_string())
    p = func.coalesce(MM.precision, func.replace(func.lower(legacy), "torch.", ""))
    return case(*((p == k, literal(v)) for k, v in ALIASES.items()), else_=p)


def _base(since: datetime, until: datetime, scope: Scope) -> Any:
    """One row per run in the window: the job's totals and its merged metadata (a subquery, so that the
    groupings below refer to plain columns: PostgreSQL cannot match an expression with bound parameters
    in SELECT to the same one in GROUP BY)."""
    gpu_h = func.coalesce(J.alloc_gpus, 0) * func.coalesce(J.elapsed_s, 0.0) / float(S_PER_HOUR)
    return (
        select(
            J.id.label("pk"),
            J.job_id,
            CL.name.label("cluster"),
            J.user_name,
            J.account,
            J.state,
            J.end_time,
            func.coalesce(J.alloc_gpus, 0).label("gpus"),
            gpu_h.label("gh"),
            func.coalesce(J.energy_j, 0.0).label("e"),
            func.coalesce(J.co2_g, 0.0).label("c"),
            M.co2_embodied_g.label("emb"),
            MM.model_name,
            MM.framework,
            MM.task,
            precision_expr().label("precision"),
            MM.batch_size,
            MM.epochs,
            MM.tokens,
        )
        .select_from(
            JOBS.join(MODELS, MM.job_pk == J.id)
            .join(CLUSTERS, CL.id == J.cluster_id)
            .outerjoin(METRICS, M.job_pk == J.id)
        )
        .where(J.end_time >= since, J.end_time < until, *scope.where())
        .subquery("r")
    )


def _totals(conn: Connection, r: Any, key: Any, fallback: str) -> tuple[GroupTotal, ...]:
    q: Select[Any] = select(
        key,
        func.count(),
        func.count(r.c.user_name.distinct()),
        func.sum(r.c.gh),
        func.sum(r.c.e),
        func.sum(r.c.c),
        func.sum(func.coalesce(r.c.emb, 0.0)),
    ).group_by(key)
    out = [
        GroupTotal(
            key=k if k is not None else fallback,
            jobs=int(n),
            users=int(u),
            gpu_hours=float(gh or 0.0),
            energy_kwh=float(e or 0.0) / J_PER_KWH,
            co2_kg=float(c or 0.0) / G_PER_KG,
            co2_embodied_kg=float(emb or 0.0) / G_PER_KG,
        )
        for k, n, u, gh, e, c, emb in conn.execute(q)
    ]
    out.sort(key=lambda g: (-g.energy_kwh, g.key))
    return tuple(out)


def by_model(
    conn: Connection, since: datetime, until: datetime, scope: Scope | None = None
) -> tuple[GroupTotal, ...]:
    """Jobs, users, GPU-hours, energy and CO2 per model name, most energy first."""
    r = _base(since, until, scope or Scope())
    return _totals(conn, r, r.c.model_name, UNNAMED)


def by_framework(
    conn: Connection, since: datetime, until: datetime, scope: Scope | None = None
) -> tuple[GroupTotal, ...]:
    """The same per framework."""
    r = _base(since, until, scope or Scope())
    return _totals(conn, r, r.c.framework, UNKNOWN)


def _per(num: Any, den: Any, scale: float) -> Any:
    """num / den / scale where den > 0, else NULL."""
    return case((den > 0, num / (den * _f(scale))), else_=None)


def runs(conn: Connection, since: datetime, until: datetime, scope: Scope | None = None) -> tuple[Run, ...]:
    """Every run in the window, most energy first, with kWh and CO2 per epoch and per 1,000 tokens."""
    r = _base(since, until, scope or Scope())
    c = r.c
    tokens_m = c.tokens / 1e6
    q = select(
        c.pk, c.job_id, c.cluster, c.user_name, c.account, c.state, c.end_time, c.model_name, c.framework,
        c.task, c.precision, c.batch_size, c.epochs, c.tokens, c.gpus, c.gh, c.e, c.c, c.emb,
        _per(c.e, c.epochs, J_PER_KWH), _per(c.e, tokens_m, J_PER_KWH / WH_PER_KWH),
        _per(c.c, c.epochs, float(G_PER_KG)), _per(c.c, tokens_m, 1.0),
    ).order_by(c.e.desc(), c.pk)  # fmt: skip
    out = []
    for row in conn.execute(q):
        (pk, job_id, cluster, user, account, state, end, model, fw, task, prec, bs, epochs, tokens, gpus, gh,
         e, co2, emb, kpe, kpt, cpe, cpt) = row  # fmt: skip
        out.append(
            Run(
                job_pk=int(pk),
                job_id=job_id,
                cluster=cluster,
                user=user,
                account=account,
                state=state,
                end=as_utc(end),
                model=model if model is not None else UNNAMED,
                framework=fw,
                task=task,
                precision=prec,
                batch_size=None if bs is None else int(bs),
                epochs=None if epochs is None else float(epochs),
                tokens=None if tokens is None else int(tokens),
                gpus=int(gpus or 0),
                gpu_hours=float(gh or 0.0),
                energy_kwh=float(e) / J_PER_KWH,
                co2_kg=float(co2) / G_PER_KG,
                co2_embodied_kg=None if emb is None else float(emb) / G_PER_KG,
                kwh_per_epoch=_opt(kpe),
                wh_per_1m_tokens=_opt(kpt),
                co2_kg_per_epoch=_opt(cpe),
                co2_g_per_1m_tokens=_opt(cpt),
            )
        )
    return tuple(out)


def _opt(x: Any) -> float | None:
    return None if x is None else float(x)


def comparisons(
    conn: Connection, since: datetime, until: datetime, scope: Scope | None = None
) -> tuple[Comparison, ...]:
    """Per user, named model and unit of work (1M tokens, epoch), the (precision, batch size) groups side by
    side (BASIS), where at least two groups have one; the largest possible saving first."""
    return compare(runs(conn, since, until, scope))


def compare(all_runs: Sequence[Run]) -> tuple[Comparison, ...]:
    """The comparisons of these runs (see `comparisons`), with cocaq.footprint.own_runs' per-unit formula."""
    out = []
    for unit in UNITS:
        acc: dict[tuple[str, str, str | None, int | None], list[tuple[float, float, float]]] = defaultdict(
            list
        )
        for r in all_runs:
            n = (r.tokens or 0) / 1e6 if unit == "1M tokens" else (r.epochs or 0.0)
            if (
                r.model == UNNAMED
                or n <= 0
                or r.energy_kwh <= 0
                or (r.precision is None and r.batch_size is None)
            ):
                continue
            acc[(r.user, r.model, r.precision, r.batch_size)].append((r.energy_kwh, n, r.co2_kg))
        per: dict[tuple[str, str], list[tuple[str | None, int | None, list[tuple[float, float, float]]]]] = (
            defaultdict(list)
        )
        for (user, model, prec, bs), rs in acc.items():
            per[(user, model)].append((prec, bs, rs))
        for (user, model), groups_in in per.items():
            if len(groups_in) < 2:
                continue
            rows = []
            for prec, bs, rs in groups_in:
                e = sum(x[0] for x in rs)
                w = sum(x[0] * x[0] / x[1] for x in rs) / e  # energy-weighted mean of kWh per unit
                rows.append((w, prec, bs, len(rs), sum(x[1] for x in rs), e, sum(x[2] for x in rs)))
            rows.sort(key=lambda x: (x[0], str(x[1]), x[2] if x[2] is not None else -1))
            best = rows[0][0]
            groups = tuple(
                SettingGroup(
                    precision=prec,
                    batch_size=bs,
                    runs=n,
                    units=units,
                    energy_kwh=e,
                    co2_kg=co2,
                    kwh_per_unit=w,
                    ratio_to_best=w / best if best > 0 else (1.0 if i == 0 else None),
                )
                for i, (w, prec, bs, n, units, e, co2) in enumerate(rows)
            )
            out.append(Comparison(user, model, groups, unit=unit))
    out.sort(key=lambda x: (-x.saving_kwh, x.user, x.model, x.unit))
    return tuple(out)


def model_stats(
    conn: Connection,
    since: datetime,
    until: datetime,
    *,
    user: str | None = None,
    account: str | None = None,
    cluster: str | None = None,
) -> ModelStats:
    """By model, by framework, every run and the comparisons, for `cocaq models`."""
    scope = Scope(users=(user,) if user is not None else None, account=account, cluster=cluster)
    all_runs = runs(conn, since, until, scope)
    return ModelStats(
        since=since,
        until=until,
        user=user,
        account=account,
        cluster=cluster,
        by_model=by_model(conn, since, until, scope),
        by_framework=by_framework(conn, since, until, scope),
        runs=all_runs,
        comparisons=compare(all_runs),
    )
