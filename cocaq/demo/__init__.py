"""The demo's made-up site, generated and run through the real import path, measurement and reports.

- `site`: the cluster (partitions, metered nodes, its config) and its users with their habits;
- `jobs`: their jobs, drawn from fixed random streams; `sacct`: those jobs as `sacct --parsable2` prints
  them; `other_clusters`: two more clusters with the holes real accounting has;
- `gpu_samples`: the collector's GPU samples of the metered nodes; `ml_metadata`: the models jobs declare
  and the collector detects; `carbon_series`: real hours of a grid's intensity, replayed;
- `month`: `cocaq demo`'s month, built and reported; `study`: `cocaq demo --study`'s six months of a larger
  site running the e-mail study, with a known effect planted.

Only the command (`cocaq/cli/demo.py`, which says what was built) imports it
(tests/test_layers.py): nothing a site runs depends on made-up data.
"""
