"""The front-end: every `cocaq ...` command, over the library below.

Each module parses a command's options and says what came of it; the work is below (the demo's site in
cocaq.demo, the scheduler's service in cocaq.scheduler). app.py holds the root command, the shared
options and the error handling; each command group lives in its own module and is imported only when it
is named, so `cocaq user` on a login node stays fast. Nothing below this package imports it."""


def main(argv: list[str] | None = None) -> None:
    """The `cocaq` console script (entry point `cocaq.cli:main`)."""
    from cocaq.cli.app import main as run

    run(argv)
