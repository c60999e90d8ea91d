"""A real SMTP server in the test process (aiosmtpd), a throw-away CA, and helpers for the mail tests.

The server speaks plain SMTP, STARTTLS or implicit TLS, can require AUTH, and records every message it
accepts; per-address rules make it refuse a recipient for good (550) or for now (451, N times).
"""

from __future__ import annotations

import email
import email.policy
import socket
import ssl
import subprocess
import threading
from dataclasses import dataclass, field
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from tests.builders import toml_table

# The smallest valid PNG (1x1, transparent): what the report charts will be, in miniature.
PNG_1X1 = bytes.fromhex(
    "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489"
    "0000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
)


@dataclass
class Received:
    mail_from: str
    rcpt_tos: list[str]
    content: bytes
    tls: bool
    login: str | None

    @property
    def message(self) -> EmailMessage:
        msg = email.message_from_bytes(self.content, policy=email.policy.default)
        assert isinstance(msg, EmailMessage)
        return msg


@dataclass
class Recorder:
    """The aiosmtpd handler: accepts, refuses or defers per recipient, and keeps what it accepted."""

    messages: list[Received] = field(default_factory=list)
    reject: set[str] = field(default_factory=set)  # 550 at RCPT
    defer_rcpt: dict[str, int] = field(default_factory=dict)  # 451 at RCPT, this many times
    defer_data: int = 0  # 451 at DATA, this many times
    lock: threading.Lock = field(default_factory=threading.Lock)

    async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str, options: Any) -> str:
        with self.lock:
            if address in self.reject:
                return "550 5.1.1 <" + address + ">: no such user"
            if self.defer_rcpt.get(address, 0) > 0:
                self.defer_rcpt[address] -= 1
                return "451 4.3.0 try again later"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        with self.lock:
            if self.defer_data > 0:
                self.defer_data -= 1
                return "451 4.3.0 temporary failure, try again"
            login = session.auth_data.login.decode() if isinstance(session.auth_data, LoginPassword) else None
            tls = bool(session.ssl) or server.transport.get_extra_info("ssl_object") is not None
            self.messages.append(
                Received(envelope.mail_from, list(envelope.rcpt_tos), envelope.content, tls, login)
            )
        return "250 2.0.0 Ok: queued"

    def to(self, address: str) -> list[EmailMessage]:
        return [r.message for r in self.messages if address in r.rcpt_tos]


class Authenticator:
    """Accepts exactly one login and password."""

    def __init__(self, user: str, password: str) -> None:
        self.user, self.password = user.encode(), password.encode()

    def __call__(
        self, server: Any, session: Any, envelope: Any, mechanism: str, auth_data: Any
    ) -> AuthResult:
        ok = (
            isinstance(auth_data, LoginPassword)
            and auth_data.login == self.user
            and auth_data.password == self.password
        )
        # handled=False: aiosmtpd answers itself (235, or 535 on failure).
        return AuthResult(success=ok, handled=False, auth_data=auth_data if ok else None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Certs:
    ca: Path  # what clients trust (mail.smtp_ca_file)
    cert: Path  # the server's certificate, for localhost and 127.0.0.1, signed by ca
    key: Path

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.cert, self.key)
        return ctx


def make_certs(directory: Path) -> Certs:
    """A CA and a server certificate signed by it: `cryptography` where installed, else the openssl CLI."""
    directory.mkdir(parents=True, exist_ok=True)
    certs = Certs(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    try:
        import cryptography  # noqa: F401
    except ImportError:
        _certs_openssl(directory, certs)
    else:
        _certs_cryptography(certs)
    return certs


def _certs_cryptography(certs: Certs) -> None:
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "cocaq test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    certs.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    certs.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    certs.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )


def _certs_openssl(directory: Path, certs: Certs) -> None:
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=directory, timeout=60)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", str(certs.ca), "-days", "2",
        "-subj", "/CN=cocaq test CA",
        "-addext", "basicConstraints=critical,CA:TRUE,pathlen:0",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature")  # fmt: skip
    run("req", *ec, "-keyout", str(certs.key), "-out", "server.csr", "-subj", "/CN=localhost")
    (directory / "ext.cnf").write_text(
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=critical,CA:FALSE\n"
        "extendedKeyUsage=serverAuth\n"
    )
    run("x509", "-req", "-in", "server.csr", "-CA", str(certs.ca), "-CAkey", "ca.key",
        "-CAcreateserial", "-out", str(certs.cert), "-days", "2", "-extfile", "ext.cnf")  # fmt: skip


class SmtpServer:
    """aiosmtpd on 127.0.0.1 in a thread: `security` is "none", "starttls" or "tls" (implicit)."""

    def __init__(
        self,
        security: str = "none",
        certs: Certs | None = None,
        login: tuple[str, str] | None = None,
    ) -> None:
        self.recorder = Recorder()
        self.port = free_port()
        self.security = security
        kwargs: dict[str, Any] = {}
        if security in ("starttls", "tls"):
            assert certs is not None, "TLS needs certificates"
        if security == "starttls":
            assert certs is not None
            kwargs.update(tls_context=certs.server_context(), require_starttls=True)
        elif security == "tls":
            assert certs is not None
            kwargs.update(ssl_context=certs.server_context())
        if login is not None:
            kwargs.update(
                authenticator=Authenticator(*login),
                auth_required=True,
                auth_require_tls=security != "none",
            )
        self.controller = Controller(self.recorder, hostname="127.0.0.1", port=self.port, **kwargs)

    def __enter__(self) -> SmtpServer:
        self.controller.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.controller.stop()

    @property
    def messages(self) -> list[Received]:
        return self.recorder.messages


def mail_toml(server: SmtpServer | None = None, **keys: Any) -> str:
    """A [mail] table for a config file; `server` fills in host, port and security."""
    table: dict[str, Any] = {"retry_base_delay_s": 0.001, "from_address": "HPC reports <hpc@example.org>"}
    if server is not None:
        table.update(smtp_host="127.0.0.1", smtp_port=server.port, smtp_security=server.security)
    table.update(keys)
    return toml_table("mail", table)
