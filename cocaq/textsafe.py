"""User-supplied text (job, user and model names, comments) made inert for a terminal and a spreadsheet.

One place for the rule every CSV writer follows (`cocaq user/lab/models -o csv`, `cocaq export`, `cocaq
carbon zones -o csv`, the demo's CSVs): a text cell that starts with `=`, `+`, `-`, `@`, tab or CR gets a
`'` before it, so that Excel or LibreOffice show it instead of running it as a formula (`=HYPERLINK(...)`),
and control characters become `?` (a CSV is read in a terminal too). Numbers are never touched: a
negative number stays a number. Standard library only: the API server and `cocaq export` import it.
"""

from __future__ import annotations

import re
from typing import Any

# C0 and C1 controls, DEL, the line/paragraph separators and the bidirectional overrides and isolates
# (which reorder what a terminal shows: "Trojan Source").
UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def plain(s: object) -> str:
    """User-supplied text that a terminal shows as text: unsafe characters (see UNSAFE) become `?`."""
    return UNSAFE.sub("?", "" if s is None else str(s))


def csv_text(s: str) -> str:
    """A text cell of a CSV: `plain`, with a `'` before it where a spreadsheet would run it as a formula."""
    out = plain(s)
    return "'" + out if s.startswith(FORMULA_START) else out


def csv_value(v: Any) -> Any:
    """`csv_text` for text, anything else (numbers, None, datetimes) as it is, for csv.writer."""
    return csv_text(v) if isinstance(v, str) else v
