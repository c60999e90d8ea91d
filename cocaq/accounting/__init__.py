"""From Slurm's accounting and the nodes' measurements to each job's energy and CO2, and the rollups.

importer.py writes jobs in bulk; estimate.py gives the energy of what nothing measured, calibrate.py
learns the GPU power those estimates use from the measured jobs; measured.py joins the nodes' records to
the jobs; reconcile.py and recompute.py redo what changed; ledger.py is the one breakdown of a job's
energy that every surface adds up; window.py the share of a job that counts in a time window;
aggregate.py turns jobs into carbon over time, with the GPU use by hour from the samples (gpu_hours.py),
and rebuilds the daily rollups (rollups.py)."""
