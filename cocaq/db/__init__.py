"""The database: the schema (schema.py), engines and their one-line errors (engine.py), plain DB-API
connections for the login-node commands (dbapi.py), and what differs between PostgreSQL and SQLite
(coltypes.py, sqlfuncs.py, pgurl.py).  `cocaq db upgrade` drives the migrations from migrate.py.

Importing this package costs nothing: `cocaq user` on a login node imports dbapi.py alone."""
