"""What the CLI, the read API and the reports ask of the database: footprints of a user, a lab or a group
over a window (totals.py), per ML model (by_model.py), one row per job (jobfacts.py) and the advice drawn
from those rows (advice.py).

Importing this package costs nothing; `cocaq user` on a login node imports totals.py and what it needs."""
