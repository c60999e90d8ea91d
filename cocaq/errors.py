"""Errors that the CLI turns into one line and a non-zero exit, never a traceback."""


class CocaqError(Exception):
    """A problem the user can fix; its message is shown as one line: control characters and lone
    surrogates (from a key, a file name, a value the user wrote) as escapes."""

    exit_code = 1

    def __str__(self) -> str:
        text = super().__str__()
        if text.isprintable():
            return text
        return "".join(
            c if c.isprintable() and not 0xD800 <= ord(c) < 0xE000 else c.encode("unicode_escape").decode()
            for c in text
        )


class UsageError(CocaqError):
    """Bad command-line input (a duration, a date, a format)."""

    exit_code = 2


class OutputError(CocaqError):
    """An output (a file named with -o, standard output) cannot be written: a missing directory, no
    permission, a full disk. Exit 1, as other failures of the environment rather than of the input."""


class ConfigError(CocaqError):
    """A bad configuration key or value; the message names the key."""

    exit_code = 2


class DatabaseError(CocaqError):
    """The database cannot be reached or is not migrated."""

    exit_code = 3


class InputError(CocaqError):
    """Unreadable input data (a dump that is not sacct output, say)."""

    exit_code = 4
