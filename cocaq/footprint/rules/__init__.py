"""The advice rules, one module each, behind one interface and registered by name (registry.py), as the
collector's energy sources are: precision, timeouts, failures, failures_late, out_of_memory, notebooks,
fewer_gpus, dataloader, gpu_memory, memory, time_limits, and the jobstats notes (jobstats.py: cpus,
cores_per_gpu, mem_per_gpu, fewer_nodes, unused_gpus, zero_cpu_nodes, mig). What they all read and
return is in base.py; catalog.py lists them in order for the window's suggestions
(cocaq.footprint.advice) and the notes on one job (cocaq.footprint.job_advice).

Importing this package costs nothing; catalog.py imports the rules.
"""
