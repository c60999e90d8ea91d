"""cocaq: what a GPU cluster's jobs cost the planet, per job, user and lab."""

# The one place the version is written: pyproject.toml reads it (hatch's [tool.hatch.version]), `cocaq
# --version` reads the installed metadata made from it, and CHANGELOG.md's newest section names it.
__version__ = "0.1.0"

# The component folders (collector/, prolog_epilog/, reports/, migrations/) sit at the repository root, as
# the design card asks; cocaq/ holds a relative symlink to each, so that `cocaq.collector` & co. are plain
# subpackages in a checkout (for Python, mypy and import graphs alike) and the wheel ships them inside.

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def annotate(**values: "Any") -> bool:
    """Record this Slurm job's model metadata (model, params, precision, batch_size, epochs, tokens, ...).

    Call it any time, as often as you like: later values win. It never raises, imports only the standard
    library, and outside a Slurm job it warns and does nothing. See cocaq.ml.annotation for the details.
    """
    from cocaq.ml.annotation import update

    return update(values)
