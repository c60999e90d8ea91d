"""What each energy source, component and carbon basis is called in words, the same on every surface.

The terminal (cocaq.cli.terminal), the e-mails and the admin page (reports/) name a job's `job_energy`
sources and components, and the basis of its CO2, with these words; one table, so a user reading both
never sees the same thing called two names."""

from __future__ import annotations

# Where a job's energy came from, in words (job_energy.source).
SOURCE_WORDS = {
    "nvml": "GPU energy counter",
    "nvml-power-integral": "GPU power samples",
    "nvml-power-edges": "GPU power at start and end",
    "nvml-samples": "GPU samples' share of node",
    "slurm-consumed-energy": "Slurm's node energy",
    "tdp-estimate": "estimate from rated power",
    "calibrated-estimate": "estimate from the site's measured jobs",
    "slurm-gpu-energy": "Slurm's GPU energy",
    "slurm-gpuutil-estimate": "estimate from Slurm gres/gpuutil",
}
COMPONENT_WORDS = {"gpu": "GPUs", "cpu": "CPUs", "dram": "memory", "node": "rest of node"}
# carbon_detail keys (cocaq.carbon.intensity) in words
INTENSITY_WORDS = {
    "series": "hourly series",
    "nearest": "nearest hour of the series",
    "annual": "the zone's yearly average",
    "world": "the world average",
}
BASIS_WORDS = {"lca": "life-cycle emissions", "direct": "direct emissions only"}


def source_words(src: str) -> str:
    """A job_energy source in words (nvml -> "GPU energy counter")."""
    if src in SOURCE_WORDS:
        return SOURCE_WORDS[src]
    if src.startswith("rapl"):
        return "RAPL energy counters"
    return src


def component_words(component: str) -> str:
    return COMPONENT_WORDS.get(component, component)


# The two energy figures, named the same on every surface (issue 31): the hardware's own draw (IT energy,
# `energy_kwh`), and that x PUE, the data centre's cooling and power losses included (`energy_kwh_with_pue`),
# which Green Algorithms and codecarbon report as the energy used. Neither is ever shown unlabelled.
DRAWN_WORDS = "drawn by the hardware"


def pue_words(lo: float | None, hi: float | None = None) -> str:
    """`PUE 1.35`; `PUE 1.20-1.35` where the jobs' PUE differ (clusters, hardware profiles or months with
    their own PUE); `PUE n/a` with no jobs. Two decimals, as each job's CO2 line gives its PUE."""
    if lo is None:
        return "PUE n/a"
    if hi is None or f"{hi:.2f}" == f"{lo:.2f}":
        return f"PUE {lo:.2f}"
    return f"PUE {lo:.2f}-{hi:.2f}"


def cooling_words(lo: float | None, hi: float | None = None, *, capital: bool = False) -> str:
    """`with cooling (PUE 1.35)` (`With ...` to start a line): the label of the energy with PUE."""
    return f"{'W' if capital else 'w'}ith cooling ({pue_words(lo, hi)})"


# Jobs whose metadata names a framework but no model are grouped under UNNAMED (cocaq.footprint.by_model's
# key, kept in JSON and CSV); a reader is told what the group is and how to name their models (issue 32).
UNNAMED = "(unnamed)"
UNNAMED_WORDS = "jobs that declared no model name"
NAME_MODEL_TIP = (
    "To name the model of jobs that declared none, put `cocaq tag model=NAME` in the job script (or "
    '`#SBATCH --comment "cocaq: model=NAME"`): the user guide\'s "ML models" section has the rest.'
)


def model_words(model: str, framework: str | None) -> str:
    """A models line's name: `mistral-7b (pytorch)`; `jobs that declared no model name, framework pytorch`
    for the unnamed group, never "(unnamed) (pytorch)"."""
    if model == UNNAMED:
        return UNNAMED_WORDS + (f", framework {framework}" if framework else "")
    return model + (f" ({framework})" if framework else "")


# Whose measured jobs a calibrated GPU estimate rests on, by its basis (assumptions["gpu_basis"],
# cocaq.accounting.calibrate and power_bases).
MEASURED_BY = {
    "calibrated-partition": "the site's measured jobs",
    "calibrated-model": "the site's measured jobs",
    "calibrated-series": "the user's own measured jobs of this name",
    "calibrated-user": "the user's own measured jobs",
    "calibrated-meta": "measured jobs of the same declared model",
    "calibrated-gpumem": "measured jobs using as much GPU memory",
    "calibrated-shape": "measured jobs of the same shape",
}


def gpu_estimate_words(a: dict[str, object] | None) -> str | None:
    """What an estimate of a job's GPUs rests on, in one plain sentence (the e-mail's); None where its
    GPUs were not estimated from a learnt or rated power."""
    if not a or "gpu_basis" not in a or "gpu_w" not in a:
        return None
    w, cell = a.get("gpu_w"), a.get("gpu_cell")
    if not isinstance(w, int | float):
        return None
    whose = MEASURED_BY.get(str(a["gpu_basis"]))
    if whose is None:
        tdp, share = a.get("gpu_tdp_w"), a.get("gpu_utilisation", 1.0)
        if a["gpu_basis"] == "tdp" and isinstance(tdp, int | float) and isinstance(share, int | float):
            why = f": {cell}" if cell else ""
            return (
                f"GPUs estimated from their rated power, {tdp:,.0f} W x {share:.0%} each, with no range{why}."
            )
        return f"GPUs estimated at {w:,.0f} W each" + (f" ({cell})." if cell else ".")
    rng = a.get("gpu_w_range")
    span = ""
    if isinstance(rng, list | tuple) and len(rng) == 2 and all(isinstance(x, int | float) for x in rng):
        span = f" (10-90%: {rng[0]:,.0f}-{rng[1]:,.0f} W)"
    return f"GPUs estimated at {w:,.0f} W each{span}, what {whose} drew" + (f": {cell}." if cell else ".")
