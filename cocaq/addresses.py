"""What counts as an e-mail address, and the `{user}` templates that make one.

Imported by the config validator as well as by delivery, so it holds nothing but `re` and `string`:
loading a config must stay cheap.
"""

from __future__ import annotations

import re
import string
from urllib.parse import quote

# A deliberately plain addr-spec: dot-atom local part, host name domain, ASCII only. Anything fancier
# (quoted local parts, IP literals, SMTPUTF8) is far more likely a typo or an injection attempt on a
# cluster than a real mailbox; no CR, LF, space, comma or angle bracket can pass.
_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
ADDRESS_RE = re.compile(rf"{_ATOM}(?:\.{_ATOM})*@{_LABEL}(?:\.{_LABEL})*")

# A user name that is plausible on a cluster, for checking a template's result at config load.
SAMPLE_USER = "jane.doe-42"


def looks_like_address(text: str) -> bool:
    """True for `local@domain` within the limits of RFC 5321 (64 and 254 characters)."""
    if not isinstance(text, str) or not ADDRESS_RE.fullmatch(text):
        return False
    local = text.rpartition("@")[0]
    return len(local) <= 64 and len(text) <= 254


def normalise_address(text: str) -> str:
    """The address as recorded and compared: trimmed, domain lower-cased (local parts may not be)."""
    local, at, domain = text.strip().rpartition("@")
    return f"{local}{at}{domain.lower()}" if at else text.strip()


def template_fields(template: str) -> list[str]:
    """The replacement fields of a str.format template, with a ValueError for unbalanced braces."""
    names = []
    for _, name, spec, conv in string.Formatter().parse(template):
        if name is None:
            continue
        if spec or conv:
            raise ValueError(f"{{{name}}} takes no format spec or conversion")
        names.append(name)
    return names


def check_address_template(template: str) -> str | None:
    """Why `template` cannot make addresses (only `{user}` allowed, result must be an address), or None."""
    try:
        names = template_fields(template)
    except ValueError as exc:
        return f"not a valid template ({exc})"
    others = sorted({n for n in names if n != "user"})
    if others:
        return "only {user} may appear, not " + ", ".join("{" + n + "}" for n in others)
    if "user" not in names:
        return "must contain {user} (otherwise every report goes to one address)"
    sample = template.format(user=SAMPLE_USER)
    if not looks_like_address(sample):
        return f"does not make an e-mail address (for user {SAMPLE_USER!r} it gives {sample!r})"
    return None


def apply_address_template(template: str, user: str) -> str | None:
    """The address for `user`, or None where the user's name cannot make one (spaces, CR/LF, '@'...)."""
    if "@" in user:
        return None
    addr = template.format(user=user)
    return normalise_address(addr) if looks_like_address(addr) else None


def check_list_unsubscribe(value: str) -> str | None:
    """Why a List-Unsubscribe setting is unusable, or None. Entries: mailto:, https: or http: URIs."""
    try:
        names = template_fields(value)
    except ValueError as exc:
        return f"not a valid template ({exc})"
    if any(n != "user" for n in names):
        return "only {user} may appear"
    for entry in _entries(value.format(user="user")):
        if any(c.isspace() or ord(c) < 32 or c in "<>," for c in entry):
            return f"{entry!r} is not a URI (no spaces, controls or angle brackets)"
        if not entry.lower().startswith(("mailto:", "https:", "http:")):
            return f"{entry!r}: expected a mailto:, https: or http: URI"
    return None


def list_unsubscribe_header(value: str, user: str | None) -> str:
    """The header value: each URI in angle brackets, `{user}` percent-encoded (it cannot break a header)."""
    filled = value.format(user=quote(user or "", safe=""))
    return ", ".join(f"<{e}>" for e in _entries(filled))


def _entries(value: str) -> list[str]:
    return [e.strip().removeprefix("<").removesuffix(">").strip() for e in value.split(",") if e.strip()]
