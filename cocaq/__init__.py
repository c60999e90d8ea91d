"""cocaq: what a GPU cluster's jobs cost the planet, per job, user and lab."""

import os as _os

__version__ = "0.1.0"

# In a source checkout the component folders (collector/, prolog_epilog/, reports/, migrations/) sit at the
# repository root, as the design card asks; the wheel ships them inside this package.  Extending __path__
# makes `cocaq.collector` & co. import the same way from both, without a generic top-level name.
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_root, "pyproject.toml")) and _os.path.isdir(
    _os.path.join(_root, "prolog_epilog")
):
    __path__.append(_root)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def annotate(**values: "Any") -> bool:
    """Record this Slurm job's model metadata (model, params, precision, batch_size, epochs, tokens, ...).

    Call it any time, as often as you like: later values win. It never raises, imports only the standard
    library, and outside a Slurm job it warns and does nothing. See cocaq.annotation for the details.
    """
    from cocaq.annotation import update

    return update(values)
