"""Fuzz (issue 33, point 1): the node metrics endpoint's bearer token against hostile requests and hostile
token files. A real Exporter serves over real HTTP with a token; raw requests with any Authorization
header (bytes a client may send: control characters, latin-1, huge, the token's prefixes and
extensions, other schemes) get 401 and never the series, and the server goes on answering; only the
exact token gets 200. Any token file content is either one token or a one-line ConfigError that shows
none of the file.
"""

from __future__ import annotations

import os
import socket
import string
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cocaq.collector import metrics_auth
from cocaq.collector.metrics import Exporter
from cocaq.errors import ConfigError
from tests.promkit import free_port

BUDGET = settings(
    max_examples=int(os.environ.get("COCAQ_FUZZ_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
TOKEN = b"fuzz-T0ken.0123456789"


@pytest.fixture(scope="module")
def served() -> Iterator[int]:
    port = free_port()
    e = Exporter("c", "n", "/nonexistent")
    e.serve("127.0.0.1", port, metrics_auth.Auth(TOKEN))
    try:
        yield port
    finally:
        e.close()


def _raw(port: int, header: bytes | None) -> bytes:
    """The status line of GET /metrics with this Authorization header value (raw bytes, as sent)."""
    req = b"GET /metrics HTTP/1.0\r\nHost: x\r\n"
    if header is not None:
        req += b"Authorization: " + header + b"\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(req + b"\r\n")
        s.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    return got


HEADER = st.one_of(
    st.binary(max_size=200).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b"")),
    st.builds(
        lambda scheme, sep, tok: scheme + sep + tok,
        st.sampled_from([b"Bearer", b"bearer", b"BEARER", b"Basic", b"Token", b"", b"Bearer\t"]),
        st.sampled_from([b" ", b"  ", b"\t", b""]),
        st.one_of(
            st.just(TOKEN[:-1]),
            st.just(TOKEN + b"x"),
            st.just(TOKEN.upper()),
            st.binary(max_size=64).map(lambda b: TOKEN + b.replace(b"\r", b"").replace(b"\n", b"")),
            st.text(string.printable.strip(), max_size=40).map(str.encode),
        ),
    ),
)


@BUDGET
@given(header=HEADER)
@example(header=b"Bearer " + TOKEN[:-1])
@example(header=b"Bearer " + b"x" * 70000)
@example(header=b"Bearer \xff\xfe" + TOKEN)
@example(header=b"Basic " + TOKEN)
def test_any_other_authorization_is_401_and_never_the_series(served: int, header: bytes) -> None:
    got = _raw(served, header)
    status = got.split(b"\r\n", 1)[0]
    scheme, _, given = header.partition(b" ")
    if scheme.lower() == b"bearer" and given.strip(b" \t") == TOKEN:
        assert status.endswith(b" 200 OK"), got[:200]
        return
    assert b" 401 " in status or b" 400 " in status or b" 431 " in status, got[:300]
    assert b"cocaq_collector_up" not in got
    if b" 401 " in status:
        assert b"WWW-Authenticate: Bearer" in got


def test_the_server_goes_on_after_the_fuzzing(served: int) -> None:
    assert _raw(served, b"Bearer " + TOKEN).split(b"\r\n", 1)[0].endswith(b" 200 OK")
    assert b" 401 " in _raw(served, None).split(b"\r\n", 1)[0]


@BUDGET
@given(content=st.binary(max_size=5000))
@example(content=b"")
@example(content=b"a" * 4097)
@example(content=b"\xef\xbb\xbftoken\n")
@example(content=b"tok en\n")
@example(content=b"token\r\n")
@example(content=b"\ttoken \n\n")
def test_any_token_file_is_one_token_or_a_one_line_error_showing_none_of_it(
    tmp_path_factory: pytest.TempPathFactory, content: bytes
) -> None:
    p = tmp_path_factory.mktemp("tok") / "t"
    p.write_bytes(content)
    os.chmod(p, 0o600)
    try:
        token = metrics_auth.read_token(str(p))
    except ConfigError as exc:
        # exactly the one message, the path aside: nothing of the file's content
        assert str(exc).replace(str(p), "PATH") == (
            "config: collector.metrics_token_file: PATH must hold one token"
            " (1 to 4096 visible ASCII characters, no spaces, one line)"
        )
        return
    assert token == content.strip() and 1 <= len(token) <= 4096
    assert all(0x21 <= c <= 0x7E for c in token)


@pytest.mark.parametrize("special", ["/dev/zero", "/dev/null", "/proc/self/environ", "/dev/stdin"])
def test_special_files_are_refused_without_reading_them(special: str, tmp_path: Path) -> None:
    """(A device or a /proc file is not a regular file of root's with mode 0600, or is empty.)"""
    with pytest.raises(ConfigError) as exc:
        metrics_auth.read_token(special)
    assert "\n" not in str(exc.value)
