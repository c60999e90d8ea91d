"""``precision``: GPU jobs that train in full precision (fp32/tf32), told to use mixed precision.

Over a window: the jobs recorded as running in full precision, the busy ones (AMP does not help idling).
With the user's own runs of the same model in reduced precision (bf16, fp16) that ended in the window,
the saving is their own measured difference in energy per 1M tokens (or per epoch, where they count no
tokens; cocaq.footprint.own_runs) applied to the full-precision jobs' energy; otherwise the literature's
figure (the Baler study: 33% less with AMP) applied to those jobs' GPU energy, and said so. Jobs of
unknown precision get a conditional suggestion only when none of the user's jobs is known to use reduced
precision, and only for GPU-heavy users. On one job: the same comparison, on that job's energy.

What to turn on depends on what the GPU can compute (cocaq.footprint.gpu_caps): bf16 from compute
capability 8.0, float16 with a loss scaler on 7.x, nothing before 7.0 (no tensor cores).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from cocaq.footprint.advice_words import energy, job_list, n_jobs, num, pct, shorten
from cocaq.footprint.gpu_caps import capability
from cocaq.footprint.jobfacts import JobFacts
from cocaq.footprint.own_runs import OwnComparison, own_comparisons
from cocaq.footprint.rules.base import Advice, Context, Evidence, ended_in, saving
from cocaq.footprint.rules.registry import Rule, register

# The Baler energy study: the same training took 0.213 kWh without and 0.143 kWh with automatic mixed
# precision (AMP): 33% less.
BALER_FP32_KWH = 0.213
BALER_AMP_KWH = 0.143
BALER_SAVING = 1 - BALER_AMP_KWH / BALER_FP32_KWH

# How to turn mixed precision on, per the dtype the GPU can compute (cocaq.footprint.gpu_caps): bf16 needs
# compute capability 8.0 (A100, H100 and newer); on 7.x (V100, T4) it is float16, whose small range needs
# a loss scaler (torch.cuda.amp.GradScaler); "mixed": the GPU is not known, both are named.
AMP_HOWTO = {
    "bf16": (
        "In PyTorch: torch.autocast(device_type='cuda', dtype=torch.bfloat16) around the forward pass; in "
        "Lightning: Trainer(precision='bf16-mixed'); in Hugging Face: TrainingArguments(bf16=True)."
    ),
    "fp16": (
        "These GPUs have no bf16 (it needs compute capability 8.0): use float16 with a loss scaler. In "
        "PyTorch: torch.autocast(device_type='cuda', dtype=torch.float16) around the forward pass and a "
        "torch.cuda.amp.GradScaler (scaler.scale(loss).backward(); scaler.step(optimizer); "
        "scaler.update()); in Lightning: Trainer(precision='16-mixed'); in Hugging Face: "
        "TrainingArguments(fp16=True)."
    ),
    "mixed": (
        "On A100, H100 and newer GPUs (compute capability 8.0+) use bf16: torch.autocast(device_type='cuda', "
        "dtype=torch.bfloat16), Trainer(precision='bf16-mixed'), TrainingArguments(bf16=True); on V100 or "
        "T4 (7.x, no bf16) use float16 with a torch.cuda.amp.GradScaler (precision='16-mixed', fp16=True)."
    ),
}
AMP_CHANGE = {
    "bf16": "torch.autocast(device_type='cuda', dtype=torch.bfloat16)",
    "fp16": "torch.autocast(device_type='cuda', dtype=torch.float16) + torch.cuda.amp.GradScaler()",
    "mixed": "torch.autocast(device_type='cuda', dtype=torch.bfloat16)  (float16 + GradScaler before A100)",
}
AMP_RECORD = "Record it with `cocaq tag precision=bf16` (or fp16) so that the next report can compare."


def amp_dtype(j: JobFacts) -> str | None:
    """The mixed precision the job's GPUs can use: "bf16", "fp16", "mixed" (GPU not known), or None (no
    tensor cores: before compute capability 7.0 mixed precision gains little, so nothing is advised)."""
    return _dtype(j.gpu_type, j.gpu_model)


@lru_cache(maxsize=256)
def _dtype(gpu_type: str | None, gpu_model: str | None) -> str | None:
    """`amp_dtype` by the two names: asked twice of each of a heavy user's 10,000 GPU jobs, which name
    a few GPUs."""
    cap = capability(gpu_type, gpu_model)
    if cap is None:
        return "mixed"
    if cap.bf16:
        return "bf16"
    return "fp16" if cap.fp16_tensor_cores else None


def amp_words(dtypes: set[str]) -> str:
    """The precision a set of jobs is told to use, as a title says it (short: it is the e-mail's subject);
    the body says which GPUs take which (`amp_which`)."""
    if dtypes == {"bf16"}:
        return "bf16 mixed precision"
    if dtypes == {"fp16"}:
        return "fp16 mixed precision"
    return "mixed precision"


def amp_which(gpus: Mapping[str, set[str]]) -> str:
    """Where the jobs ran on GPUs of both kinds: which take bf16, which fp16. '' otherwise."""
    if not gpus.get("bf16") or not gpus.get("fp16"):
        return ""
    return (
        f"Use bf16 on {'/'.join(sorted(gpus['bf16']))}, and float16 with a GradScaler on "
        f"{'/'.join(sorted(gpus['fp16']))} (no bf16 before compute capability 8.0). "
    )


def _gpus_by_dtype(jobs: Iterable[JobFacts]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for j in jobs:
        cap = capability(j.gpu_type, j.gpu_model)
        d = amp_dtype(j)
        if cap is not None and d is not None:
            out[d].add(cap.model)
    return out


def amp_how(dtypes: set[str]) -> tuple[str, tuple[str, ...]]:
    """The how-to and the lines to change for the jobs' GPUs."""
    key = next(iter(dtypes)) if len(dtypes) == 1 else "mixed"
    tag = "cocaq tag precision=fp16" if key == "fp16" else "cocaq tag precision=bf16"
    record = AMP_RECORD if key == "mixed" else f"Record it with `{tag}` so that the next report can compare."
    return AMP_HOWTO[key] + " " + record, (AMP_CHANGE[key], tag)


def in_full_precision(j: JobFacts) -> bool:
    """A GPU job recorded in full precision, on GPUs with tensor cores (where mixed precision pays)."""
    return j.gpus > 0 and j.precision == "full" and amp_dtype(j) is not None


def by_own_runs(cmp: OwnComparison) -> Callable[[JobFacts], float]:
    """The saving on a job at the user's own measured rate: its energy in the window times that share."""
    return lambda j: j.energy_kwh * j.share * cmp.saving


def by_literature(j: JobFacts) -> float:
    """The saving on a job by the Baler study: its share of its GPU energy."""
    return j.gpu_kwh * j.share * BALER_SAVING


@dataclass
class _Sized:
    """The full-precision jobs' saving, per model (largest energy first), and what the body says of it."""

    kwh: float = 0.0
    kg: float = 0.0
    per_model: list[tuple[str, float]] = field(default_factory=list)
    own_lines: list[str] = field(default_factory=list)  # models sized by the user's own runs
    literature: list[str] = field(default_factory=list)  # models sized by the study


def _size(full: Sequence[JobFacts], own: Mapping[str, OwnComparison]) -> _Sized:
    by_model: dict[str, list[JobFacts]] = defaultdict(list)
    for j in full:
        by_model[j.model or ""].append(j)
    out = _Sized()
    for model, js in sorted(by_model.items(), key=lambda kv: -sum(j.energy_kwh * j.share for j in kv[1])):
        cmp = own.get(model) if model else None
        if cmp is not None:
            e, c = saving(js, by_own_runs(cmp))
            r, f = cmp.reduced, cmp.full
            out.own_lines.append(
                f"{cmp.percent}% less energy per {r.unit} in {r.precision} than in {f.precision}"
                f"{cmp.at_batch()} for {shorten(model, 40)} (runs {', '.join(r.runs[:2])} against "
                f"{', '.join(f.runs[:2])})"
            )
        else:
            e, c = saving(js, by_literature)
            out.literature.append(shorten(model, 40) or "jobs that name no model")
        out.per_model.append((model, e))
        out.kwh += e
        out.kg += c
    return out


def _said(own_lines: list[str], literature: list[str]) -> list[str]:
    """What the body says of where each model's figure comes from: their own runs, or the study."""
    said = []
    if own_lines:
        more = len(own_lines) - 3
        shown = own_lines[:3] + ([f"{more} more model{'s' if more > 1 else ''}"] if more > 0 else [])
        said.append("By your own runs: " + "; ".join(shown) + ".")
    if literature:
        names = (
            ", ".join(literature[:3]) + f" and {len(literature) - 3} more"
            if len(literature) > 3
            else " and ".join(literature)
            if len(literature) < 3
            else f"{literature[0]}, {literature[1]} and {literature[2]}"
        )
        said.append(
            f"For {names}, which you have not run in reduced precision, the Baler study's "
            f"{pct(BALER_SAVING)} less GPU energy is counted."
        )
    return said


def _basis(measured: bool, literature: bool) -> str:
    if measured and not literature:
        return "your own runs' difference in energy per unit of work, on these jobs' energy"
    if measured:
        return (
            "your own runs' difference where you have one, else the Baler study's "
            f"{pct(BALER_SAVING)} of the GPU energy"
        )
    return f"the Baler study's {pct(BALER_SAVING)} of these jobs' GPU energy"


@register
class Precision(Rule):
    name = "precision"
    order = 10
    source = (
        "the Baler energy study (0.213 kWh without, 0.143 kWh with automatic mixed precision); NVIDIA's CUDA "
        "compute capability table and the CUDA C++ Programming Guide (bf16 tensor cores from 8.0); "
        "PyTorch's torch.autocast and torch.cuda.amp.GradScaler"
    )
    every_gpu_job = True

    def over_window(self, jobs: Sequence[JobFacts], ctx: Context) -> Advice | None:
        t = ctx.thresholds
        gpu = [j for j in jobs if j.gpus > 0]
        busy = [j for j in gpu if j.idle_share is None or j.idle_share < t.amp_busy_idle_share]
        # jobs on GPUs without tensor cores (before compute capability 7.0) gain little: nothing is advised
        full = [j for j in busy if in_full_precision(j)]
        if full:
            own = own_comparisons([j for j in gpu if ended_in(j, ctx)], t.own_min_saving)
            return self._full(full, own, ctx)
        return self._unknown(gpu, busy, ctx)

    def _full(self, full: list[JobFacts], own: Mapping[str, OwnComparison], ctx: Context) -> Advice | None:
        """Jobs recorded in full precision: sized by the user's own runs of each model, else the study."""
        t = ctx.thresholds
        sized = _size(full, own)
        per_model, literature = sized.per_model, sized.literature
        gpu_energy = sum(j.gpu_kwh * j.share for j in full)
        if gpu_energy < t.amp_min_gpu_kwh:
            return None
        top = max(per_model, key=lambda m: m[1])[0]
        dtypes = {d for j in full if (d := amp_dtype(j)) is not None}
        others = sum(1 for m, _ in per_model if m != top)
        what = shorten(top, 40) if top else "your jobs that name no model"
        if others:
            what += f" and {others} more {'model' if others == 1 else 'models'}"
        how, change = amp_how(dtypes)
        largest = sorted(full, key=lambda j: -j.energy_kwh * j.share)
        return Advice(
            id=self.name,
            title=f"Train {what} in {amp_words(dtypes)}",
            body=(
                f"{n_jobs(len(full))} {ctx.period} ran in full precision (fp32), by their metadata: "
                f"{job_list(largest, 3)}. "
                + " ".join(_said(sized.own_lines, literature))
                + f" Together about {energy(sized.kwh)} less. "
                + amp_which(_gpus_by_dtype(full))
                + how
            ),
            change=change,
            evidence=(
                Evidence("jobs in full precision", len(full), "jobs"),
                Evidence("their GPU energy", gpu_energy, "kWh"),
                *(  # in the body's order: the models by the energy that ran in full precision
                    Evidence(
                        f"{m}: less energy per {o.reduced.unit} in {o.reduced.precision}{o.at_batch()}",
                        o.percent,
                        "%",
                    )
                    for m, o in ((m, own.get(m)) for m, _ in per_model if m)
                    if o is not None
                ),
            ),
            job_ids=tuple(j.job_id for j in largest),
            saving_kwh=sized.kwh,
            saving_kg=sized.kg,
            upper_bound=False,
            basis=_basis(bool(sized.own_lines), bool(literature)),
            test=(
                f"jobs recorded as fp32 with {energy(gpu_energy)} of GPU energy >= "
                f"{energy(t.amp_min_gpu_kwh)}"
            ),
        )

    def _unknown(self, gpu: list[JobFacts], busy: list[JobFacts], ctx: Context) -> Advice | None:
        """No job recorded in reduced precision, and a GPU-heavy user: a conditional suggestion, an upper
        bound by the study."""
        t = ctx.thresholds
        reduced_known = any(j.precision == "reduced" for j in gpu)
        unknown = [j for j in busy if j.precision is None and amp_dtype(j) is not None]
        gpu_hours = sum(j.gpu_hours * j.share for j in gpu)
        if reduced_known or not unknown or gpu_hours < t.amp_unknown_min_gpu_hours:
            return None
        gpu_energy = sum(j.gpu_kwh * j.share for j in unknown)
        if gpu_energy < t.amp_min_gpu_kwh:
            return None
        unknown.sort(key=lambda j: -j.gpu_kwh * j.share)
        kwh, kg = saving(unknown, by_literature)
        dtypes = {d for j in unknown if (d := amp_dtype(j)) is not None}
        how, change = amp_how(dtypes)
        return Advice(
            id=self.name,
            title="Mixed precision, if you do not use it yet",
            body=(
                f"You used {num(gpu_hours)} GPU-hours {ctx.period}; your GPU jobs ({job_list(unknown)}) drew "
                f"{energy(gpu_energy)} and none of them records its precision. If they train in full "
                f"precision, {amp_words(dtypes)} is the change most likely to pay: the Baler study measured "
                f"{pct(BALER_SAVING)} less energy for the same training. {how}"
            ),
            change=change,
            evidence=(
                Evidence("GPU-hours", gpu_hours, "h"),
                Evidence("GPU energy of jobs of unknown precision", gpu_energy, "kWh"),
            ),
            job_ids=tuple(j.job_id for j in unknown),
            saving_kwh=kwh,
            saving_kg=kg,
            upper_bound=True,
            basis=(
                f"upper bound: the Baler study's {pct(BALER_SAVING)} of the GPU energy, if none used it yet"
            ),
            test=(
                f"{num(gpu_hours)} GPU-hours >= {num(t.amp_unknown_min_gpu_hours)}, no job recorded in "
                "reduced "
                "precision"
            ),
        )

    def on_job(self, j: JobFacts, ctx: Context, runs: Sequence[JobFacts]) -> Advice | None:
        if not in_full_precision(j):
            return None
        mine = [r for r in runs if r.pk != j.pk]
        cmp = (
            own_comparisons([j, *mine], ctx.thresholds.own_min_saving).get(j.model or "") if j.model else None
        )
        if cmp is not None:
            kwh = by_own_runs(cmp)(j)
            body = (
                f"It ran in {j.precision_label}; {cmp.sentence()}. At that rate "
                f"{cmp.reduced.precision} would have saved about {energy(kwh)} here."
            )
            basis = "your own runs' difference in energy per unit of work"
        else:
            kwh = by_literature(j)
            body = (
                f"It ran in {j.precision_label}. The Baler study measured {pct(BALER_SAVING)} less energy "
                "with "
                f"mixed precision: about {energy(kwh)} of its GPU energy."
            )
            basis = f"the Baler study's {pct(BALER_SAVING)} of its GPU energy"
        dtype = amp_dtype(j)
        assert dtype is not None  # (in_full_precision)
        how, change = amp_how({dtype})
        return self.job_note(
            j, f"Train in {amp_words({dtype})}", body + " " + how, change[:1], kwh, False, basis
        )
