"""What a job trains: `cocaq.annotate()` and `cocaq tag` (annotation.py, standard library only, imported
inside users' jobs), the metadata record and its validation (meta.py), and the `model_metadata` rows
derived from jobs' comments and the nodes' records (store.py).  The per-model footprint is a query like
the others: cocaq.footprint.by_model."""
