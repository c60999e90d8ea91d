"""ML model metadata of a job: parsing the Slurm comment, validating any source, merging sources.

Every value comes from a user (a comment, a file written from inside the job) or from what the collector
saw in the job's processes, and is read by root on the nodes and by the server. So nothing here trusts
its input: keys must have a plain shape, strings are stripped of control characters and cut to a bound,
numbers must parse and lie in a sane range, and anything refused is reported as a one-line reason while
the rest is kept. Stdlib only: the epilog imports this.

Sources, from least to most trusted for a key: `detected` (the collector's guess), `comment` (declared
at submission), `api` (declared from inside the job by `cocaq.annotate` or `cocaq tag`, and the latest).
"""

from __future__ import annotations

import math
import re

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

SOURCES = ("detected", "comment", "api")  # later wins
RANK = {s: i for i, s in enumerate(SOURCES)}
MAX_FILE = 64 * 1024  # an annotation file, read by root
MAX_STR = 256
MAX_KEY = 64
MAX_EXTRA = 32
MAX_KEYS = 64  # keys looked at in one input; more is refused as a whole

# key -> (column, kind, max length or (lo, hi))
STR, INT, NUM = "str", "int", "num"
KNOWN: dict[str, tuple[str, str, Any]] = {
    "model": ("model_name", STR, 256),
    "task": ("task", STR, 64),
    "framework": ("framework", STR, 64),
    "framework_version": ("framework_version", STR, 64),
    "params": ("parameters", INT, (1, 10**15)),
    "precision": ("precision", STR, 32),
    "batch_size": ("batch_size", INT, (1, 10**9)),
    "dataset": ("dataset", STR, 256),
    "epochs": ("epochs", NUM, (0, 10**7)),
    "tokens": ("tokens", INT, (0, 10**18)),
}
ALIASES = {
    "model_name": "model",
    "parameters": "params",
    "n_params": "params",
    "num_params": "params",
    "dtype": "precision",
    "batch": "batch_size",
    "batchsize": "batch_size",
    "bs": "batch_size",
    "epoch": "epochs",
    "num_tokens": "tokens",
    "version": "framework_version",
}
FRAMEWORKS = {
    "torch": "pytorch",
    "pytorch": "pytorch",
    "pt": "pytorch",
    "tf": "tensorflow",
    "tensorflow": "tensorflow",
    "keras": "keras",
    "jax": "jax",
    "flax": "jax",
    "paddle": "paddle",
    "paddlepaddle": "paddle",
    "mxnet": "mxnet",
    "onnxruntime": "onnxruntime",
}
PRECISIONS = {
    "bfloat16": "bf16",
    "bf16": "bf16",
    "bf16-mixed": "bf16-mixed",
    "float16": "fp16",
    "half": "fp16",
    "fp16": "fp16",
    "16": "fp16",
    "16-mixed": "fp16-mixed",
    "fp16-mixed": "fp16-mixed",
    "float32": "fp32",
    "single": "fp32",
    "fp32": "fp32",
    "32": "fp32",
    "tf32": "tf32",
    "float64": "fp64",
    "double": "fp64",
    "fp64": "fp64",
    "fp8": "fp8",
    "int8": "int8",
    "int4": "int4",
    "nf4": "nf4",
}
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
_CONTROL = {i: None for i in [*range(0, 32), 127, *range(0x80, 0xA0)]}
_BIDI = {i: None for i in [0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]}
# Lone UTF-16 surrogates (JSON's "\ud800") are no text: they cannot be encoded, stored or sent.
_SURROGATES = {i: 0xFFFD for i in range(0xD800, 0xE000)}
_CLEAN = {**_CONTROL, **_BIDI, **_SURROGATES}
_SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
# `cocaq:` then its key=value pairs; a value may be quoted. The part ends at `;`, `|` or a newline.
_SECTION = re.compile(r"cocaq:([^;|\n]*)", re.IGNORECASE)
_PAIR = re.compile(r"""([A-Za-z_][A-Za-z0-9_.-]{0,63})=("[^"]*"|'[^']*'|[^\s"']+)""")


def clean_str(value: str, limit: int = MAX_STR) -> tuple[str, bool]:
    """(printable text, was cut): no control or bidi-override characters, lone surrogates as U+FFFD, at
    most `limit` characters."""
    head = value[: 2 * limit + 64]  # bounded work on a megabyte of text; the rest is cut anyway
    text = head.translate(_CLEAN).strip()
    return text[:limit], len(text) > limit or len(head) < len(value)


def parse_number(value: Any) -> float | None:
    """A finite number from an int, a float or text such as `8e9`, `8B`, `1.5k`, `7_000_000`; else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return float(value) if abs(value) < 10**300 else None  # float() of a larger int overflows
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if not isinstance(value, str) or len(value) > 40:
        return None
    s = value.strip().replace("_", "").lower()
    mult = 1.0
    if s and s[-1] in _SUFFIX:
        mult, s = _SUFFIX[s[-1]], s[:-1]
    try:
        x = float(s) * mult
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def canonical_key(key: str) -> str:
    """Known keys and their aliases in lower case (`BS` -> `batch_size`); other keys as given."""
    low = key.lower()
    return ALIASES.get(low, low) if low in ALIASES or low in KNOWN else key


def _value(key: str, raw: Any, problems: list[str]) -> tuple[str, Any] | None:
    """(canonical key, validated value), or None with the reason in `problems`."""
    key = canonical_key(key)
    spec = KNOWN.get(key)
    if spec is None:  # kept in extra: a short string, a number or a bool
        if isinstance(raw, bool):
            return key, raw
        if isinstance(raw, int):  # compared as an int: math.isfinite(10**400) overflows
            if abs(raw) < 10**18:
                return key, raw
            return _refuse(key, "out of range", problems)
        if isinstance(raw, float):
            if math.isfinite(raw) and abs(raw) < 1e18:
                return key, raw
            return _refuse(key, "out of range", problems)
        if isinstance(raw, str):
            text, cut = clean_str(raw)
            if cut:
                problems.append(f"{key}: longer than {MAX_STR} characters, cut")
            return key, text
        return _refuse(key, f"a {type(raw).__name__} (only text, numbers and true/false are kept)", problems)
    _col, kind, bound = spec
    if kind == STR:
        if isinstance(raw, bool) or not isinstance(raw, str | int | float):
            return _refuse(key, f"must be text, not a {type(raw).__name__}", problems)
        text, cut = clean_str(str(raw), int(bound))
        if cut:
            problems.append(f"{key}: longer than {bound} characters, cut")
        if not text:
            return _refuse(key, "empty", problems)
        if key == "framework":
            text = FRAMEWORKS.get(text.lower(), text.lower())
        elif key == "precision":
            text = PRECISIONS.get(text.lower(), text.lower())
        return key, text
    x = parse_number(raw)
    lo, hi = bound
    if x is None:
        return _refuse(key, f"must be a number, got {_show(raw)}", problems)
    if not lo <= x <= hi:
        return _refuse(key, f"{x:g} is out of range [{lo:g}, {hi:g}]", problems)
    if kind == INT:
        return key, round(x)
    return key, x


def _refuse(key: str, why: str, problems: list[str]) -> tuple[str, Any] | None:
    problems.append(f"{key}: {why}; ignored")
    return None


def _show(raw: Any) -> str:
    if isinstance(raw, int) and abs(raw) >= 10**40:  # (str() of an int over 4,300 digits raises)
        return "a number of over 40 digits"
    return repr(clean_str(str(raw), 40)[0])


def validate(data: Mapping[str, Any] | Any, problems: list[str]) -> dict[str, Any]:
    """The valid part of one source's key/value mapping (canonical keys); reasons for the rest."""
    if not isinstance(data, dict):
        problems.append(f"metadata must be a key/value object, not a {type(data).__name__}; ignored")
        return {}
    if len(data) > MAX_KEYS:
        problems.append(f"{len(data)} keys (at most {MAX_KEYS}); ignored")
        return {}
    out: dict[str, Any] = {}
    extra = 0
    for k, v in data.items():
        if not isinstance(k, str) or not _KEY.fullmatch(k):
            problems.append(f"key {_show(k)} is not a plain name; ignored")
            continue
        if v is None:
            continue
        got = _value(k, v, problems)
        if got is None:
            continue
        key, value = got
        if key not in KNOWN and key not in out:
            if extra >= MAX_EXTRA:
                problems.append(f"{key}: more than {MAX_EXTRA} extra keys; ignored")
                continue
            extra += 1
        out[key] = value
    return out


def parse_comment(comment: str | None, problems: list[str] | None = None) -> dict[str, Any]:
    """The validated `key=value` pairs after `cocaq:` in a Slurm comment (other text is left alone).

    `#SBATCH --comment "cocaq: model=llama-3-8b precision=bf16 batch_size=32"`; a value may be quoted
    (`model="llama 3"`); several `cocaq:` parts merge, a later key winning; bare words (`cocaq:notify`) are
    flags for other features and are skipped here.
    """
    probs = [] if problems is None else problems
    raw: dict[str, Any] = {}
    if not comment:
        return {}
    for section in _SECTION.finditer(comment[:4096]):
        for m in _PAIR.finditer(section.group(1)):
            v = m.group(2)
            if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'":
                v = v[1:-1]
            raw[m.group(1)] = v
    return validate(raw, probs) if raw else {}


def merge(layers: Iterable[tuple[str, Mapping[str, Any]]]) -> tuple[dict[str, Any], dict[str, str]]:
    """(values, source per key) from (source, values) layers; a more trusted source wins, then a later one.

    Layers of one source are applied in the order given (give them oldest first).
    """
    ordered = sorted(enumerate(layers), key=lambda p: (RANK.get(p[1][0], -1), p[0]))
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for _i, (source, data) in ordered:
        for k, v in data.items():
            values[k] = v
            sources[k] = source
    return values, sources


def to_row(values: Mapping[str, Any], sources: Mapping[str, str]) -> dict[str, Any]:
    """The `model_metadata` columns of merged values: known keys in their columns, the rest in `extra`."""
    row: dict[str, Any] = {spec[0]: None for spec in KNOWN.values()}
    extra: dict[str, Any] = {}
    for k, v in values.items():
        if k in KNOWN:
            row[KNOWN[k][0]] = v
        else:
            extra[k] = v
    row["extra"] = extra or None
    row["sources"] = dict(sorted(sources.items())) or None
    return row
