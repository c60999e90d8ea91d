"""Alembic migrations; shipped inside the wheel as `cocaq.migrations`."""
