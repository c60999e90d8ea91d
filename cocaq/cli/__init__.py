"""The front-end: every `cocaq ...` command, the demo and the scheduler daemon, over the library below.

app.py holds the root command, the shared options and the error handling; each command group lives in
its own module and is imported only when it is named, so `cocaq user` on a login node stays fast.
Nothing below this package imports it."""


def main(argv: list[str] | None = None) -> None:
    """The `cocaq` console script (entry point `cocaq.cli:main`)."""
    from cocaq.cli.app import main as run

    run(argv)
