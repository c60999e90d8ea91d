"""Node collector: samples GPU/CPU energy per job and ships spooled records to the database."""
