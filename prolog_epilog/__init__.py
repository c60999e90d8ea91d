"""Slurm prolog/epilog hooks: start/end energy snapshots written to a local durable spool."""
