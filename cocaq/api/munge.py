"""MUNGE credentials: how `cocaq user` on a login node proves its uid to the read API.

Every Slurm cluster already runs munged with one key on all nodes, so the client encodes a
credential with its local munged and the server decodes it with its own; munged, not cocaq,
vouches for the uid, rejects expired and rewound credentials and refuses a second decode (replay).

libmunge is called through ctypes, each call with its own context (the server decodes in a thread
pool and a context must not be shared); where the library cannot be loaded the `munge`/`unmunge`
programs do the same. COCAQ_MUNGE_BACKEND=library|binary forces one. The module imports only
the standard library, and ctypes/subprocess only when used: the client path runs on login nodes.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass

TYPE_CHECKING = False  # not `typing`: 2 ms more on the client's path
if TYPE_CHECKING:
    import ctypes
    from typing import Any

# munge_err_t, as in munge.h (munge 0.5.x; the values have not changed since 0.5).
EMUNGE_SUCCESS = 0
EMUNGE_SNAFU = 1
EMUNGE_BAD_ARG = 2
EMUNGE_BAD_LENGTH = 3
EMUNGE_OVERFLOW = 4
EMUNGE_NO_MEMORY = 5
EMUNGE_SOCKET = 6
EMUNGE_TIMEOUT = 7
EMUNGE_BAD_CRED = 8
EMUNGE_BAD_VERSION = 9
EMUNGE_BAD_CIPHER = 10
EMUNGE_BAD_MAC = 11
EMUNGE_BAD_ZIP = 12
EMUNGE_BAD_REALM = 13
EMUNGE_CRED_INVALID = 14
EMUNGE_CRED_EXPIRED = 15
EMUNGE_CRED_REWOUND = 16
EMUNGE_CRED_REPLAYED = 17
EMUNGE_CRED_UNAUTHORIZED = 18

# munge_opt_t, as in munge.h.
_OPT_TTL = 4
_OPT_ENCODE_TIME = 6
_OPT_SOCKET = 8

DEFAULT_SOCKET = "/run/munge/munge.socket.2"  # munged's compiled-in default on Debian/RHEL packages
BACKEND_ENV = "COCAQ_MUNGE_BACKEND"
BINARY_TIMEOUT_S = 5.0

# What the caller is told: short and fixed for the codes a client can cause, munge's text otherwise.
_MESSAGES = {
    EMUNGE_BAD_CRED: "malformed credential",
    EMUNGE_BAD_VERSION: "malformed credential (unsupported version)",
    EMUNGE_BAD_CIPHER: "malformed credential (unsupported cipher)",
    EMUNGE_BAD_MAC: "malformed credential (unsupported MAC)",
    EMUNGE_BAD_ZIP: "malformed credential (unsupported compression)",
    EMUNGE_BAD_REALM: "credential from an unknown security realm",
    EMUNGE_CRED_INVALID: "invalid credential (altered, or encoded with another MUNGE key)",
    EMUNGE_CRED_EXPIRED: "credential expired",
    EMUNGE_CRED_REWOUND: "credential rewound (encoded in the future: are the clocks in sync?)",
    EMUNGE_CRED_REPLAYED: "credential replayed",
    EMUNGE_CRED_UNAUTHORIZED: "credential not for this decoder (uid/gid restriction)",
}

# "MUNGE:" + base64 + ":"; munge's own parser is more lenient, ours runs before anything reaches munged.
_CRED_RE = re.compile(r"MUNGE:[A-Za-z0-9+/]+={0,2}:")


class MungeError(Exception):
    """One-line reason; `code` is libmunge's munge_err_t (0 never raised)."""

    code: int

    def __init__(self, code: int, message: str) -> None:
        self.code = code if code != EMUNGE_SUCCESS else EMUNGE_SNAFU
        super().__init__(" ".join(message.split()))  # one line, whatever munge said

    def __reduce__(self) -> tuple[type[MungeError], tuple[int, str]]:  # picklable (process pools)
        return type(self), (self.code, str(self))


@dataclass(frozen=True)
class Credential:
    """What munged vouched for: the encoder's uid/gid and the payload it sealed."""

    uid: int
    gid: int
    payload: bytes
    encode_time: float | None  # epoch seconds, from the credential
    ttl: int | None  # seconds the credential was valid for


def encode(payload: bytes = b"", *, ttl: int | None = None, socket: str | None = None) -> str:
    """A credential for the calling process's uid/gid, carrying `payload`.

    ttl: seconds (None or 0: munged's default, -1: its maximum). socket: munged's socket
    (None: the default). Raises MungeError, e.g. EMUNGE_SOCKET when munged is not there.
    """
    payload = bytes(memoryview(payload))  # bytes-like only: bytes(5) would be five NULs
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < -1):
        raise MungeError(EMUNGE_BAD_ARG, f"bad ttl {ttl!r}: seconds, 0 (default) or -1 (maximum)")
    if _use_library():
        return _lib_encode(payload, ttl, socket)
    return _bin_encode(payload, ttl, socket)


def decode(cred: str, *, socket: str | None = None, max_len: int = 4096) -> Credential:
    """The verified contents of `cred`, or MungeError: there is no other way out.

    The string is checked for shape (ASCII "MUNGE:<base64>:", at most max_len characters) before
    munged sees it. munged then checks the MAC, the TTL and its replay cache: a credential
    decodes once, so the server must decode each credential exactly once.
    """
    _check_shape(cred, max_len)
    if _use_library():
        return _lib_decode(cred, socket)
    return _bin_decode(cred, socket)


def _check_shape(cred: object, max_len: int) -> None:
    if not isinstance(cred, str):
        raise MungeError(EMUNGE_BAD_CRED, "malformed credential (not a string)")
    if len(cred) > max_len:
        raise MungeError(EMUNGE_BAD_CRED, f"malformed credential (longer than {max_len} characters)")
    if not cred.isascii() or _CRED_RE.fullmatch(cred) is None:
        raise MungeError(EMUNGE_BAD_CRED, "malformed credential")


def _error(code: int, socket: str | None, detail: str) -> MungeError:
    if code == EMUNGE_SOCKET:
        return MungeError(code, f"cannot reach munged at {socket or DEFAULT_SOCKET}: {detail}")
    return MungeError(code, _MESSAGES.get(code) or detail or f"munge error {code}")


# ---------------------------------------------------------------------------------- backend choice


def _use_library() -> bool:
    """True: libmunge; False: the munge/unmunge programs. Read per call (the tests switch it)."""
    choice = os.environ.get(BACKEND_ENV, "").strip().lower()
    if choice == "binary":
        return False
    if choice == "library":
        if _library() is None:
            raise MungeError(EMUNGE_SNAFU, f"{BACKEND_ENV}=library but libmunge cannot be loaded")
        return True
    if choice not in ("", "auto"):
        raise MungeError(EMUNGE_BAD_ARG, f"{BACKEND_ENV}={choice!r}: expected library or binary")
    return _library() is not None


# ----------------------------------------------------------------------------------------- libmunge


class _Lib:
    """libmunge's functions with their C signatures, and libc's free for what they allocate."""

    def __init__(self, lib: ctypes.CDLL, free: Any) -> None:
        import ctypes

        self.ctypes = ctypes
        self.time_t: Any = getattr(ctypes, "c_time_t", ctypes.c_long)  # c_time_t: Python >= 3.12
        self.free = free
        free.argtypes, free.restype = [ctypes.c_void_p], None
        self.ctx_create = lib.munge_ctx_create
        self.ctx_create.argtypes, self.ctx_create.restype = [], ctypes.c_void_p
        self.ctx_destroy = lib.munge_ctx_destroy
        self.ctx_destroy.argtypes, self.ctx_destroy.restype = [ctypes.c_void_p], None
        self.ctx_strerror = lib.munge_ctx_strerror
        self.ctx_strerror.argtypes, self.ctx_strerror.restype = [ctypes.c_void_p], ctypes.c_char_p
        # Variadic: no argtypes; each call passes explicit ctypes objects (int, char *, pointers),
        # which the x86-64 and aarch64 Linux ABIs pass the same way as fixed arguments.
        self.ctx_set = lib.munge_ctx_set
        self.ctx_set.restype = ctypes.c_int
        self.ctx_get = lib.munge_ctx_get
        self.ctx_get.restype = ctypes.c_int
        self.encode = lib.munge_encode
        self.encode.argtypes = [
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.c_void_p,
            ctypes.c_char_p,  # const void *buf: bytes, NULs included (the length says where it ends)
            ctypes.c_int,
        ]
        self.encode.restype = ctypes.c_int
        self.decode = lib.munge_decode
        self.decode.argtypes = [
            ctypes.c_char_p,
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.POINTER(ctypes.c_int),
            ctypes.POINTER(ctypes.c_uint32),  # uid_t
            ctypes.POINTER(ctypes.c_uint32),  # gid_t
        ]
        self.decode.restype = ctypes.c_int
        self.strerror = lib.munge_strerror
        self.strerror.argtypes, self.strerror.restype = [ctypes.c_int], ctypes.c_char_p


_lib_lock = threading.Lock()
_lib_state: list[_Lib | None] = []  # [] not tried yet; [None] not loadable


def _library() -> _Lib | None:
    if _lib_state:
        return _lib_state[0]
    with _lib_lock:
        if not _lib_state:
            _lib_state.append(_load_library())
    return _lib_state[0]


def _load_library() -> _Lib | None:
    import ctypes

    lib = None
    try:  # the soname first: find_library runs ldconfig, tens of milliseconds on a login node
        lib = ctypes.CDLL("libmunge.so.2")
    except OSError:
        import ctypes.util

        name = ctypes.util.find_library("munge")
        if name:
            try:
                lib = ctypes.CDLL(name)
            except OSError:
                lib = None
    if lib is None:
        return None
    try:
        return _Lib(lib, ctypes.CDLL(None).free)  # the process's libc, whose malloc libmunge uses
    except AttributeError:  # not libmunge after all
        return None


class _Ctx:
    """A fresh munge_ctx_t for one call, with the socket set; destroyed on exit."""

    def __init__(self, lib: _Lib, socket: str | None) -> None:
        self.lib = lib
        self.socket = socket
        self.ptr = lib.ctx_create()
        if not self.ptr:
            raise MungeError(EMUNGE_NO_MEMORY, "cannot create a MUNGE context")

    def __enter__(self) -> _Ctx:
        try:
            if self.socket is not None:
                self.set(_OPT_SOCKET, self.lib.ctypes.c_char_p(os.fsencode(self.socket)))
            else:  # for messages: the socket libmunge will use
                self.socket = os.fsdecode(self.get(_OPT_SOCKET, self.lib.ctypes.c_char_p) or b"") or None
        except BaseException:
            self.lib.ctx_destroy(self.ptr)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.lib.ctx_destroy(self.ptr)

    def set(self, opt: int, value: Any) -> None:
        c = self.lib.ctypes  # variadic: a bare int would go as a 32-bit int, the pointer too
        err = self.lib.ctx_set(c.c_void_p(self.ptr), c.c_int(opt), value)
        if err:
            raise self.error(err)

    def get(self, opt: int, ctype: Any) -> Any:
        c, v = self.lib.ctypes, ctype()
        return v.value if self.lib.ctx_get(c.c_void_p(self.ptr), c.c_int(opt), c.byref(v)) == 0 else None

    def error(self, err: int) -> MungeError:
        detail = self.lib.ctx_strerror(self.ptr) or self.lib.strerror(err) or b""
        return _error(err, self.socket, detail.decode("utf-8", "replace"))


def _lib_encode(payload: bytes, ttl: int | None, socket: str | None) -> str:
    lib = _library()
    assert lib is not None
    c = lib.ctypes
    with _Ctx(lib, socket) as ctx:
        if ttl is not None:
            ctx.set(_OPT_TTL, c.c_int(ttl))
        out = c.c_void_p()
        err = lib.encode(c.byref(out), ctx.ptr, payload, len(payload))
        try:
            if err:
                raise ctx.error(err)
            return (c.string_at(out) if out.value else b"").decode("ascii")
        finally:
            if out.value:
                lib.free(out)


def _lib_decode(cred: str, socket: str | None) -> Credential:
    lib = _library()
    assert lib is not None
    c = lib.ctypes
    with _Ctx(lib, socket) as ctx:
        buf, n, uid, gid = c.c_void_p(), c.c_int(0), c.c_uint32(), c.c_uint32()
        err = lib.decode(cred.encode("ascii"), ctx.ptr, c.byref(buf), c.byref(n), c.byref(uid), c.byref(gid))
        try:  # libmunge allocates the payload for some errors too (expired, rewound, replayed)
            if err:
                raise ctx.error(err)
            payload = c.string_at(buf, n.value) if buf.value and n.value > 0 else b""
        finally:
            if buf.value:
                lib.free(buf)
        encode_time = ctx.get(_OPT_ENCODE_TIME, lib.time_t)
        ttl = ctx.get(_OPT_TTL, c.c_int)
        return Credential(
            uid=uid.value,
            gid=gid.value,
            payload=payload,
            encode_time=float(encode_time) if encode_time is not None else None,
            ttl=ttl,
        )


# ------------------------------------------------------------------------ munge/unmunge programs


def _program(name: str) -> str:
    import shutil

    for path in (f"/usr/bin/{name}", shutil.which(name)):
        if path and os.access(path, os.X_OK):
            return path
    raise MungeError(EMUNGE_SNAFU, f"MUNGE is not installed: neither libmunge nor the {name} program found")


def _run(argv: list[str], stdin: bytes, socket: str | None) -> tuple[int, bytes, str]:
    import subprocess

    if socket is not None:
        argv += ["--socket", socket]
    env = {**os.environ, "LC_ALL": "C"}
    try:
        p = subprocess.run(argv, input=stdin, capture_output=True, timeout=BINARY_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        raise _error(EMUNGE_SOCKET, socket, f"no answer in {BINARY_TIMEOUT_S:g} s") from None
    except OSError as e:
        raise MungeError(EMUNGE_SNAFU, f"cannot run {argv[0]}: {e}") from None
    # "unmunge: Error: Failed to access ...": the last line says why, without the program's name.
    lines = p.stderr.decode("utf-8", "replace").strip().splitlines()
    detail = lines[-1].split("Error:", 1)[-1].strip() if lines else ""
    return p.returncode, p.stdout, detail


def _bin_encode(payload: bytes, ttl: int | None, socket: str | None) -> str:
    # The payload goes through stdin, never argv (which every user on the node can read).
    argv = [_program("munge"), *(["--no-input"] if not payload else [])]
    if ttl is not None:
        argv += ["--ttl", str(ttl)]
    rc, out, detail = _run(argv, payload, socket)
    if rc != 0:
        raise _error(rc if 0 < rc <= EMUNGE_CRED_UNAUTHORIZED else EMUNGE_SNAFU, socket, detail)
    cred = out.decode("ascii", "replace").strip()
    if not cred.startswith("MUNGE:"):
        raise MungeError(EMUNGE_SNAFU, "munge printed no credential")
    return cred


def _number(value: str | None) -> int | None:
    """`1001`, or `alice (1001)` as unmunge prints without --numeric."""
    if value is None:
        return None
    m = re.fullmatch(r"(?:.*\()?(-?\d+)\)?", value.strip())
    return int(m.group(1)) if m else None


def _bin_decode(cred: str, socket: str | None) -> Credential:
    rc, out, detail = _run([_program("unmunge"), "--numeric"], cred.encode("ascii"), socket)
    head, sep, payload = out.partition(b"\n\n")
    meta: dict[str, str] = {}
    for line in head.decode("utf-8", "replace").splitlines():
        key, colon, value = line.partition(":")
        if colon:
            meta[key.strip()] = value.strip()
    status = _number(meta.get("STATUS"))
    if rc != 0 or status != 0:
        code = rc if 0 < rc <= EMUNGE_CRED_UNAUTHORIZED else (status or EMUNGE_SNAFU)
        raise _error(code, socket, detail)
    uid, gid, length = (_number(meta.get(k)) for k in ("UID", "GID", "LENGTH"))
    if uid is None or gid is None or length is None or not sep or len(payload) != length:
        raise MungeError(EMUNGE_SNAFU, "unmunge succeeded but its output could not be read")
    encode_time = _number(meta.get("ENCODE_TIME"))
    return Credential(
        uid=uid,
        gid=gid,
        payload=payload,
        encode_time=float(encode_time) if encode_time is not None else None,
        ttl=_number(meta.get("TTL")),
    )
