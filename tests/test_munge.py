"""cocaq.api.munge against the real munged on this machine: both backends, real users, real replay cache."""

from __future__ import annotations

import os
import pickle
import pwd
import shutil
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cocaq.api import munge
from cocaq.api.munge import MungeError

ROOT = Path(__file__).resolve().parent.parent
CLUSTER_SH = ROOT / "tests" / "slurm" / "cluster.sh"
MUNGED = "/usr/sbin/munged"
KEY = Path("/etc/munge/munge.key")
USERS = {"alice": 1001, "bob": 1002}  # as tests/slurm/cluster.sh creates them on a fresh machine


def _round_trip() -> bool:
    """munged answers: `munge -n | unmunge`, without a shell."""
    try:
        cred = subprocess.run(["munge", "-n"], capture_output=True, timeout=5)
        if cred.returncode != 0:
            return False
        return subprocess.run(["unmunge"], input=cred.stdout, capture_output=True, timeout=5).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _cluster_up() -> None:
    from tests.slurmkit import cluster_lock

    with cluster_lock():  # not while another worker's Slurm tests have hooks in slurm.conf
        p = subprocess.run([str(CLUSTER_SH), "up"], capture_output=True, text=True, timeout=1200)
    if p.returncode != 0:
        pytest.fail(f"tests/slurm/cluster.sh up failed ({p.returncode}): {(p.stdout + p.stderr)[-2000:]}")


def _start_munged() -> None:
    """As tests/slurm/cluster.sh starts it: as the munge user, its run directory made first."""
    if shutil.which("start-stop-daemon"):
        subprocess.run(["install", "-d", "-o", "munge", "-g", "munge", "-m", "755", "/run/munge"], check=True)
        daemon = ["start-stop-daemon", "--start", "--oknodo", "--chuid", "munge:munge"]
        subprocess.run(
            [*daemon, "--pidfile", "/run/munge/munged.pid", "--exec", MUNGED], check=True, timeout=30
        )
    else:
        subprocess.run([MUNGED], check=True, timeout=30)
    deadline = time.monotonic() + 15
    while not _round_trip():
        if time.monotonic() > deadline:
            pytest.fail(f"started {MUNGED} but `munge -n | unmunge` still fails after 15 s")
        time.sleep(0.2)


@pytest.fixture(scope="module", autouse=True)
def munged() -> None:
    """A running munged and the users alice and bob; starts or installs what is missing."""
    if os.geteuid() != 0:
        pytest.skip("needs root: makes credentials as alice and bob, may start munged")
    installed = os.path.exists(MUNGED) and shutil.which("munge") and shutil.which("unmunge")
    if not installed or not KEY.is_file() or KEY.stat().st_size == 0:
        _cluster_up()  # installs munge, makes the key, starts munged
    if not _round_trip():
        _start_munged()
    for user in USERS:
        try:
            pwd.getpwnam(user)
        except KeyError:  # as tests/slurm/cluster.sh makes them
            subprocess.run(["useradd", "-m", "-s", "/bin/bash", user], check=True, timeout=30)


@pytest.fixture(params=["library", "binary"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "library" and munge._library() is None:
        pytest.fail("libmunge cannot be loaded although munge is installed (libmunge2)")
    monkeypatch.setenv("COCAQ_MUNGE_BACKEND", request.param)
    yield request.param


def _as_user(user: str, payload: str) -> str:
    p = subprocess.run(["runuser", "-u", user, "--", "munge", "-s", payload], capture_output=True, timeout=10)
    assert p.returncode == 0, p.stderr
    return p.stdout.decode().strip()


def _one_line(e: MungeError) -> str:
    text = str(e)
    assert text and "\n" not in text and e.code != 0
    return text


# ------------------------------------------------------------------------------------------- success


@pytest.mark.parametrize(
    "payload",
    [b"", b"cocaq user --since 30d", bytes(range(256)), b"a\0b\n\nMUNGE:\n"],
    ids=["empty", "text", "all-bytes", "nul-and-blank-lines"],
)
def test_root_round_trip(backend: str, payload: bytes) -> None:
    before = time.time()
    cred = munge.encode(payload)
    assert cred.startswith("MUNGE:") and cred.endswith(":") and cred.isascii()
    got = munge.decode(cred)
    assert (got.uid, got.gid, got.payload) == (0, 0, payload)
    assert got.encode_time is not None and int(before) - 1 <= got.encode_time <= time.time() + 1
    assert got.ttl is not None and got.ttl > 0  # munged's default (300 unless configured)


def test_ttl_round_trips(backend: str) -> None:
    assert munge.decode(munge.encode(b"x", ttl=60)).ttl == 60


@pytest.mark.parametrize("user", sorted(USERS))
def test_other_users_credential(backend: str, user: str) -> None:
    pw = pwd.getpwnam(user)
    assert pw.pw_uid == USERS[user], "tests/slurm/cluster.sh makes alice 1001 and bob 1002"
    got = munge.decode(_as_user(user, f"footprint of {user}"))
    assert (got.uid, got.gid, got.payload) == (pw.pw_uid, pw.pw_gid, f"footprint of {user}".encode())


def test_decode_in_a_thread_pool(backend: str) -> None:
    """The server decodes concurrently: one context per call, nothing shared."""
    creds = {munge.encode(f"n={i}".encode()): f"n={i}".encode() for i in range(40)}
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(munge.decode, creds))
    assert [c.payload for c in got] == list(creds.values())
    assert {c.uid for c in got} == {0}


# ------------------------------------------------------------------------------------ munged says no


def test_replayed(backend: str) -> None:
    cred = munge.encode(b"once")
    assert munge.decode(cred).payload == b"once"
    with pytest.raises(MungeError) as e:
        munge.decode(cred)
    assert e.value.code == munge.EMUNGE_CRED_REPLAYED
    assert _one_line(e.value) == "credential replayed"


def test_replayed_from_another_user(backend: str) -> None:
    cred = _as_user("alice", "mine")
    assert munge.decode(cred).uid == USERS["alice"]
    with pytest.raises(MungeError) as e:
        munge.decode(cred)
    assert e.value.code == munge.EMUNGE_CRED_REPLAYED


def test_expired(backend: str) -> None:
    # munged: expired once its clock (whole seconds) is past encode time + ttl, i.e. 1-2 s after
    # encoding with ttl=1 (no skew allowance on this side). Decode first at the earliest sure time.
    t0 = time.time()
    cred = munge.encode(b"late", ttl=1)
    time.sleep(max(0.0, int(t0) + 2.05 - time.time()))
    deadline = time.monotonic() + 5
    while True:
        try:
            munge.decode(cred)
            code = 0
        except MungeError as e:
            code = e.code
            if code == munge.EMUNGE_CRED_EXPIRED:
                assert _one_line(e) == "credential expired"
                break
        assert code in (0, munge.EMUNGE_CRED_REPLAYED), code  # not yet expired (a slow clock tick)
        assert time.monotonic() < deadline, "a ttl=1 credential is not expired 7 s after encoding"
        time.sleep(0.1)
    assert time.time() - t0 < 7


def test_tampered(backend: str) -> None:
    cred = munge.encode(b"pay me")
    i = len(cred) // 2
    bad = cred[:i] + ("A" if cred[i] != "A" else "B") + cred[i + 1 :]
    with pytest.raises(MungeError) as e:
        munge.decode(bad)
    assert e.value.code in (munge.EMUNGE_CRED_INVALID, munge.EMUNGE_BAD_CRED), _one_line(e.value)


def test_truncated_but_well_formed(backend: str) -> None:
    """Cut in the middle and closed with ':' again: the shape check passes, munged rejects it."""
    cred = munge.encode(b"cut")
    with pytest.raises(MungeError) as e:
        munge.decode(cred[: len(cred) // 2] + ":")
    _one_line(e.value)


@pytest.mark.parametrize("what", ["decode", "encode"])
def test_wrong_socket(backend: str, tmp_path: Path, what: str) -> None:
    sock = str(tmp_path / "munge.socket.2")
    cred = munge.encode(b"kept")
    with pytest.raises(MungeError) as e:
        munge.decode(cred, socket=sock) if what == "decode" else munge.encode(b"x", socket=sock)
    assert e.value.code == munge.EMUNGE_SOCKET
    assert _one_line(e.value).startswith(f"cannot reach munged at {sock}: ")
    assert munge.decode(cred).payload == b"kept"  # the failed attempt did not use the credential up


def test_socket_that_is_a_plain_file(backend: str, tmp_path: Path) -> None:
    sock = tmp_path / "not-a-socket"
    sock.write_text("")
    with pytest.raises(MungeError) as e:
        munge.decode(munge.encode(), socket=str(sock))
    assert e.value.code == munge.EMUNGE_SOCKET and str(sock) in _one_line(e.value)


def test_explicit_default_socket(backend: str) -> None:
    assert munge.decode(munge.encode(b"s"), socket=munge.DEFAULT_SOCKET).payload == b"s"


# ---------------------------------------------------------------- rejected before munged sees them


def _malformed(cred: str) -> dict[str, object]:
    middle = len(cred) // 2
    return {
        "empty": "",
        "garbage": "garbage",
        "prefix-only": "MUNGE:",
        "empty-body": "MUNGE::",
        "truncated": cred[:middle],
        "no-prefix": cred[6:],
        "lowercase-prefix": "munge:" + cred[6:],
        "over-long": "MUNGE:" + "A" * 5000 + ":",
        "non-ascii": cred[:middle] + "é" + cred[middle:],
        "non-ascii-digit": cred[:middle] + "٣" + cred[middle + 1 :],
        "nul": cred[:middle] + "\0" + cred[middle:],
        "newline": cred + "\n",
        "space": " " + cred,
        "two-credentials": cred + cred,
        "bytes": cred.encode(),
        "none": None,
    }


MALFORMED_IDS = list(_malformed("MUNGE:AAAA:"))


@pytest.mark.parametrize("case", MALFORMED_IDS)
def test_malformed_never_reaches_munged(backend: str, case: str) -> None:
    cred = munge.encode(b"x")
    bad = _malformed(cred)[case]
    # A socket that does not exist: a shape error, not a socket error, proves munged was not asked.
    with pytest.raises(MungeError) as e:
        munge.decode(bad, socket="/nonexistent/munge.socket")  # type: ignore[arg-type]
    assert e.value.code == munge.EMUNGE_BAD_CRED
    assert _one_line(e.value).startswith("malformed credential")
    assert munge.decode(cred).payload == b"x"  # and the good one was not used up


def test_max_len(backend: str) -> None:
    cred = munge.encode(b"y" * 100)
    with pytest.raises(MungeError, match="longer than 64"):
        munge.decode(cred, max_len=64)
    assert munge.decode(cred, max_len=len(cred)).payload == b"y" * 100


# ----------------------------------------------------------------------------------- API details


@pytest.mark.parametrize("ttl", [-2, 1.5, True, "60"])
def test_bad_ttl(backend: str, ttl: object) -> None:
    with pytest.raises(MungeError) as e:
        munge.encode(b"", ttl=ttl)  # type: ignore[arg-type]
    assert e.value.code == munge.EMUNGE_BAD_ARG


def test_unknown_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COCAQ_MUNGE_BACKEND", "smoke-signals")
    with pytest.raises(MungeError, match="COCAQ_MUNGE_BACKEND"):
        munge.encode()


def test_error_codes_are_libmunge_s() -> None:
    """The module's constants name the same errors as the installed libmunge (munge.h's munge_err_t)."""
    lib = munge._library()
    assert lib is not None
    expected = {
        "EMUNGE_SUCCESS": b"Success",
        "EMUNGE_SNAFU": b"Internal error",
        "EMUNGE_BAD_ARG": b"Invalid argument",
        "EMUNGE_BAD_LENGTH": b"Exceeded maximum message length",
        "EMUNGE_OVERFLOW": b"Buffer overflow",
        "EMUNGE_NO_MEMORY": b"Out of memory",
        "EMUNGE_SOCKET": b"Socket communication error",
        "EMUNGE_TIMEOUT": b"Socket timeout",
        "EMUNGE_BAD_CRED": b"Invalid credential format",
        "EMUNGE_BAD_VERSION": b"Invalid credential version",
        "EMUNGE_BAD_CIPHER": b"Invalid cipher type",
        "EMUNGE_BAD_MAC": b"Invalid MAC type",
        "EMUNGE_BAD_ZIP": b"Invalid compression type",
        "EMUNGE_BAD_REALM": b"Unrecognized security realm",
        "EMUNGE_CRED_INVALID": b"Invalid credential",
        "EMUNGE_CRED_EXPIRED": b"Expired credential",
        "EMUNGE_CRED_REWOUND": b"Rewound credential",
        "EMUNGE_CRED_REPLAYED": b"Replayed credential",
        "EMUNGE_CRED_UNAUTHORIZED": b"Unauthorized credential",
    }
    assert {name: lib.strerror(getattr(munge, name)) for name in expected} == expected


def test_no_library_falls_back_to_the_programs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where libmunge cannot be loaded (as if libmunge2 were missing): munge/unmunge, unless forced."""
    monkeypatch.setattr(munge, "_lib_state", [None])
    monkeypatch.delenv("COCAQ_MUNGE_BACKEND", raising=False)
    assert munge.decode(munge.encode(b"via programs")).payload == b"via programs"
    monkeypatch.setenv("COCAQ_MUNGE_BACKEND", "library")
    with pytest.raises(MungeError, match="libmunge cannot be loaded"):
        munge.encode()


def test_error_pickles() -> None:
    e = pickle.loads(pickle.dumps(MungeError(munge.EMUNGE_CRED_EXPIRED, "credential\nexpired")))
    assert (e.code, str(e)) == (munge.EMUNGE_CRED_EXPIRED, "credential expired")
