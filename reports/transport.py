"""Where messages go: an SMTP server (STARTTLS, implicit TLS or plain, with login) or an outbox directory.

A transport sends one message to one envelope recipient and says how it failed:

- `SendError(permanent=True)`: this message will never go (a 5xx for this recipient or its data); the
  batch records it and goes on;
- `SendError(permanent=False)`: try again later (a 4xx, a dropped connection, a timeout); the caller
  retries with backoff; `connection=True` means the server itself is unreachable, so the other messages
  would fail the same way;
- `MailError`: nothing can be sent with this configuration (TLS failure, login refused, unknown host,
  unreadable password file); a one-line CocaqError for the CLI.

The SMTP password is read when the connection opens and kept only in a wrapper whose repr hides it; no
message, log line or exception built here contains it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import smtplib
import socket
import ssl
import tempfile
from email.message import EmailMessage
from pathlib import Path
from typing import Protocol

from cocaq.config import Config, Mail
from cocaq.errors import CocaqError

log = logging.getLogger("cocaq.reports")


class MailError(CocaqError):
    """Mail cannot be sent with this configuration or server (TLS, login, host, outbox not writable)."""

    exit_code = 5


class SendError(Exception):
    """One message was not sent; `permanent` says whether trying again can help."""

    def __init__(self, message: str, *, permanent: bool, connection: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent
        self.connection = connection


class Transport(Protocol):
    """Sends a message to one envelope recipient; returns a short note of where it went."""

    def send(self, msg: EmailMessage, sender: str, to: str) -> str: ...

    def close(self) -> None: ...

    def describe(self) -> str: ...


class _Secret:
    """A password that stays out of reprs, logs and tracebacks' locals display."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "<secret>"

    __str__ = __repr__


def read_password(mail: Mail, environ: dict[str, str] | None = None) -> _Secret | None:
    """The SMTP password from the named variable or file (one trailing newline dropped), or None."""
    env = os.environ if environ is None else environ
    if mail.smtp_password_env:
        value = env.get(mail.smtp_password_env)
        if not value:
            raise MailError(
                f"mail: the SMTP password variable ${mail.smtp_password_env} "
                "(mail.smtp_password_env) is not set or empty"
            )
        return _Secret(value)
    if mail.smtp_password_file:
        path = Path(mail.smtp_password_file)
        try:
            value = path.read_text(encoding="utf-8")
            mode = path.stat().st_mode
        except FileNotFoundError:
            raise MailError(f"mail: smtp_password_file {path}: no such file") from None
        except PermissionError:
            raise MailError(f"mail: smtp_password_file {path}: permission denied") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise MailError(f"mail: smtp_password_file {path}: cannot read ({type(exc).__name__})") from None
        if mode & 0o004:
            log.warning("mail: smtp_password_file %s is readable by everyone (chmod 600 it)", path)
        value = value.removesuffix("\n").removesuffix("\r")
        if not value:
            raise MailError(f"mail: smtp_password_file {path} is empty")
        return _Secret(value)
    return None


def _reply_text(resp: bytes | str) -> str:
    text = resp.decode("utf-8", "replace") if isinstance(resp, bytes) else str(resp)
    return " ".join(text.split())[:300]


def _smtp_failure(code: int, resp: bytes | str, what: str) -> SendError:
    """A server reply as a SendError: 4xx transient, anything else (5xx) permanent."""
    transient = 400 <= code < 500
    return SendError(f"{what}: {code} {_reply_text(resp)}", permanent=not transient, connection=code == 421)


class SmtpTransport:
    """One SMTP connection, opened on first use and reused for the batch; reopened after a drop."""

    def __init__(self, mail: Mail, environ: dict[str, str] | None = None) -> None:
        self.mail = mail
        self._environ = environ
        self._password: _Secret | None = None
        self._conn: smtplib.SMTP | None = None

    def __repr__(self) -> str:
        return f"SmtpTransport({self.describe()})"

    def describe(self) -> str:
        m = self.mail
        who = f" as {m.smtp_user}" if m.smtp_user else ""
        return f"smtp {m.smtp_host}:{m.port} ({m.smtp_security}){who}"

    def _where(self) -> str:
        return f"{self.mail.smtp_host}:{self.mail.port}"

    def _tls_context(self) -> ssl.SSLContext:
        try:
            return ssl.create_default_context(cafile=self.mail.smtp_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise MailError(
                f"mail: smtp_ca_file {self.mail.smtp_ca_file}: cannot load CA certificates "
                f"({getattr(exc, 'strerror', None) or exc})"
            ) from None

    def open(self) -> None:
        """Connect, secure and log in now, to fail early (send() otherwise does it on first use)."""
        if self._conn is None:
            self._conn = self._connect()

    def _connect(self) -> smtplib.SMTP:
        m = self.mail
        where = self._where()
        if m.smtp_user and self._password is None:
            self._password = read_password(m, self._environ)
        conn: smtplib.SMTP | None = None
        try:
            if m.smtp_security == "tls":
                conn = smtplib.SMTP_SSL(
                    m.smtp_host, m.port, timeout=m.smtp_timeout_s, context=self._tls_context()
                )
            else:
                conn = smtplib.SMTP(m.smtp_host, m.port, timeout=m.smtp_timeout_s)
            conn.ehlo()
            if m.smtp_security == "starttls":
                if not conn.has_extn("starttls"):
                    raise MailError(
                        f"mail: {where} does not offer STARTTLS (mail.smtp_security = 'starttls')"
                    )
                conn.starttls(context=self._tls_context())
                conn.ehlo()
            if m.smtp_user and self._password is not None:
                if not conn.has_extn("auth"):
                    raise MailError(f"mail: {where} offers no login (AUTH) here; mail.smtp_user is set")
                _login(conn, m.smtp_user, self._password)
        except Exception as exc:
            if conn is not None:
                _close_quietly(conn)
            if isinstance(exc, MailError):
                raise
            raise self._connect_failure(exc) from None
        log.debug("mail: connected to %s", self.describe())
        return conn

    def _connect_failure(self, exc: Exception) -> Exception:
        """A one-line reason that never includes the password (smtplib's replies do not echo it)."""
        where = self._where()
        if isinstance(exc, smtplib.SMTPAuthenticationError):
            return MailError(
                f"mail: login as {self.mail.smtp_user!r} refused by {where}: "
                f"{exc.smtp_code} {_reply_text(exc.smtp_error)}"
            )
        if isinstance(exc, ssl.SSLCertVerificationError):
            return MailError(
                f"mail: TLS failure with {where}: certificate not trusted ({exc.verify_message}); "
                "mail.smtp_ca_file can name the CA that signed it"
            )
        if isinstance(exc, ssl.SSLError):
            return MailError(f"mail: TLS failure with {where}: {exc.reason or exc.__class__.__name__}")
        if isinstance(exc, socket.gaierror):
            return MailError(f"mail: cannot connect to {where}: unknown host {self.mail.smtp_host!r}")
        if isinstance(exc, smtplib.SMTPConnectError | smtplib.SMTPResponseException):
            if 400 <= exc.smtp_code < 500:
                return SendError(
                    f"{where} is not accepting mail now: {exc.smtp_code} {_reply_text(exc.smtp_error)}",
                    permanent=False,
                    connection=True,
                )
            return MailError(f"mail: {where} refused us: {exc.smtp_code} {_reply_text(exc.smtp_error)}")
        if isinstance(exc, ConnectionRefusedError):
            return SendError(
                f"cannot connect to {where}: connection refused", permanent=False, connection=True
            )
        if isinstance(exc, TimeoutError):
            return SendError(f"cannot connect to {where}: timed out", permanent=False, connection=True)
        if isinstance(exc, smtplib.SMTPServerDisconnected):
            return SendError(f"{where} closed the connection", permanent=False, connection=True)
        if isinstance(exc, OSError):
            reason = exc.strerror or exc.__class__.__name__
            return SendError(f"cannot connect to {where}: {reason}", permanent=False, connection=True)
        if isinstance(exc, smtplib.SMTPException):
            return MailError(f"mail: {where}: {exc.__class__.__name__}")
        return MailError(f"mail: {where}: unexpected {exc.__class__.__name__}")

    def send(self, msg: EmailMessage, sender: str, to: str) -> str:
        conn = self._conn or self._connect()
        self._conn = conn
        try:
            conn.send_message(msg, from_addr=sender, to_addrs=[to])
        except smtplib.SMTPRecipientsRefused as exc:
            code, resp = exc.recipients.get(to, (550, b"refused"))
            raise _smtp_failure(code, resp, f"{to} refused by {self._where()}") from None
        except smtplib.SMTPSenderRefused as exc:
            raise _smtp_failure(exc.smtp_code, exc.smtp_error, f"sender {sender} refused") from None
        except smtplib.SMTPServerDisconnected:
            self._drop()
            raise SendError(
                f"{self._where()} closed the connection", permanent=False, connection=True
            ) from None
        except smtplib.SMTPResponseException as exc:  # SMTPDataError and the rest
            if exc.smtp_code == 421:
                self._drop()
            raise _smtp_failure(exc.smtp_code, exc.smtp_error, f"message to {to} refused") from None
        except TimeoutError:
            self._drop()
            raise SendError(f"{self._where()} timed out", permanent=False, connection=True) from None
        except OSError as exc:  # connection reset, TLS record errors mid-stream
            self._drop()
            reason = exc.strerror or exc.__class__.__name__
            raise SendError(f"{self._where()}: {reason}", permanent=False, connection=True) from None
        return f"accepted by {self._where()}"

    def _drop(self) -> None:
        if self._conn is not None:
            _close_quietly(self._conn)
            self._conn = None

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.quit()
            except (smtplib.SMTPException, OSError):
                pass
            finally:
                _close_quietly(self._conn)
                self._conn = None


def _login(conn: smtplib.SMTP, user: str, password: _Secret) -> None:
    """One AUTH attempt, with the first mechanism the server offers (smtplib's order of preference).

    smtplib's own login() tries every offered mechanism in turn: with a wrong password that is several
    failed logins per connection, which some servers count towards locking the account.
    """
    offered = conn.esmtp_features.get("auth", "").upper().split()
    mech = next((m for m in ("CRAM-MD5", "PLAIN", "LOGIN") if m in offered), None)
    if mech is None:
        raise MailError(f"mail: the server offers no login mechanism cocaq knows ({', '.join(offered)})")
    conn.user, conn.password = user, password.reveal()
    try:
        conn.auth(mech, getattr(conn, "auth_" + mech.lower().replace("-", "_")))
    finally:
        conn.password = ""


def _close_quietly(conn: smtplib.SMTP) -> None:
    with contextlib.suppress(OSError):
        conn.close()


_UNSAFE = re.compile(r"[^A-Za-z0-9._@+=-]")


def eml_name(message_id: str) -> str:
    """A file name from a Message-ID: brackets dropped, anything unusual (/, .., controls) made `_`."""
    core = _UNSAFE.sub("_", message_id.strip().strip("<>"))[:200].lstrip(".") or "message"
    return core + ".eml"


class OutboxTransport:
    """Writes each message to `DIR/<Message-ID>.eml`, atomically (a temp file renamed into place).

    The same Message-ID gives the same file, so writing a message again replaces it: with the outbox,
    resending an in-doubt message never duplicates it.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    def __repr__(self) -> str:
        return f"OutboxTransport({str(self.directory)!r})"

    def describe(self) -> str:
        return f"outbox {self.directory}"

    def open(self) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise MailError(f"mail: outbox_dir {self.directory}: {exc.strerror or exc}") from None

    def send(self, msg: EmailMessage, sender: str, to: str) -> str:
        self.open()
        final = self.directory / eml_name(str(msg["Message-ID"] or "message"))
        data = msg.as_bytes()
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".eml", dir=self.directory)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, final)
            tmp = None
            _fsync_dir(self.directory)
        except OSError as exc:
            raise MailError(
                f"mail: outbox_dir {self.directory}: cannot write: {exc.strerror or exc}"
            ) from None
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        return f"written to {final}"

    def close(self) -> None:
        pass


def _fsync_dir(path: Path) -> None:
    """Make the rename itself durable (a crash right after must not lose the file)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def make_transport(cfg: Config, environ: dict[str, str] | None = None) -> SmtpTransport | OutboxTransport:
    """The configured transport; nothing is opened yet."""
    if cfg.mail.transport == "outbox":
        return OutboxTransport(cfg.mail.outbox_dir or os.path.join(cfg.spool_dir, "outbox"))
    return SmtpTransport(cfg.mail, environ)
