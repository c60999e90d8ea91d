"""The names of the sources of a job's energy rows (`job_energy.source`), apart from the estimates that
write them (cocaq.accounting.estimate) so that what only reads them (the ledger, and through it `cocaq
user` on a login node) loads none of the estimating: calibration, carbon zones, Slurm records.
Standard library only."""

from __future__ import annotations

SOURCE_TDP = "tdp-estimate"
SOURCE_SLURM = "slurm-consumed-energy"
SOURCE_CALIBRATED = (
    "calibrated-estimate"  # GPU power from the site's measured jobs (cocaq.accounting.calibrate)
)
SOURCE_SAMPLES = (
    "nvml-samples"  # the GPUs' share the aggregator takes out of SOURCE_SLURM (cocaq.accounting.ledger)
)
# ConsumedEnergy under acct_gather_energy/gpu ([slurm] consumed_energy = "gpus"): the job's GPUs, measured
SOURCE_SLURM_GPU = "slurm-gpu-energy"
# GPUs that nothing measured, from Slurm's gres/gpuutil (the power at that use: calibrated, else rated)
SOURCE_SLURM_UTIL = "slurm-gpuutil-estimate"
