"""What a page handler gets and gives: the request (who asks, what they asked, how to link inside the
app), the answer, and the error that becomes an error page."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cocaq.web.reader import Reader


@dataclass
class Request:
    environ: dict[str, Any]
    path: str  # below the app's mount point (SCRIPT_NAME), "/" at least
    query: dict[str, str]
    root: str  # SCRIPT_NAME: where the app is mounted (OOD: /pun/sys/cocaq)
    reader: Reader
    user: str = field(init=False)

    def __post_init__(self) -> None:
        self.user = self.reader.user

    def arg(self, name: str, default: str = "") -> str:
        return self.query.get(name, default)

    def url(self, path: str, **query: Any) -> str:
        """A link inside the app (its mount point first), with a query of the non-empty values."""
        from urllib.parse import urlencode

        q = urlencode({k: v for k, v in query.items() if v not in (None, "")})
        return self.root + path + (f"?{q}" if q else "")


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    content_type: str
    headers: tuple[tuple[str, str], ...] = ()


class HttpError(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason
