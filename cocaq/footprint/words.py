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
