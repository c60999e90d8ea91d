"""Reading Slurm's own outputs (sacct, squeue) through its CLIs."""
