"""The SMTP transport against a real SMTP server (aiosmtpd, in this process), and `cocaq mail test`.

STARTTLS and implicit TLS with a certificate made for the test, AUTH, and the one-line failures an admin
sees: connection refused, TLS not trusted, login refused (never showing the password).
"""

from __future__ import annotations

import base64
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from cocaq.config import Config
from cocaq.config_load import load_config
from cocaq.reports.message import build_message, new_message_id, parse_sender
from cocaq.reports.transport import MailError, SendError, SmtpTransport, make_transport
from tests.conftest import run_cocaq
from tests.mailkit import PNG_1X1, Certs, SmtpServer, _certs_openssl, free_port, mail_toml, make_certs

PASSWORD = "Tr0ub4dor&3-not-for-logs"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture
def starttls_server(certs: Certs) -> Iterator[SmtpServer]:
    with SmtpServer("starttls", certs, login=("cocaq", PASSWORD)) as server:
        yield server


def config(tmp_path: Path, text: str) -> Config:
    p = tmp_path / "cocaq.toml"
    p.write_text(text)
    return load_config(p, environ={})


def message(to: str = "alice@example.org") -> tuple[object, str]:
    sender = parse_sender("HPC reports <hpc@example.org>")
    msg = build_message(
        sender=sender,
        to=to,
        subject="test",
        text="plain",
        html='<p>html</p><img src="cid:chart">',
        images=[("chart", PNG_1X1)],
        message_id=new_message_id(sender),
    )
    return msg, sender.addr_spec


def test_starttls_and_login(tmp_path: Path, certs: Certs, starttls_server: SmtpServer) -> None:
    text = mail_toml(
        starttls_server, smtp_user="cocaq", smtp_password_env="SMTP_PW", smtp_ca_file=str(certs.ca)
    )
    transport = SmtpTransport(config(tmp_path, text).mail, environ={"SMTP_PW": PASSWORD})
    msg, sender = message()
    assert transport.send(msg, sender, "alice@example.org") == f"accepted by 127.0.0.1:{starttls_server.port}"
    transport.send(message("bob@example.org")[0], sender, "bob@example.org")  # the same connection
    transport.close()
    got = starttls_server.messages
    assert [(r.rcpt_tos, r.tls, r.login, r.mail_from) for r in got] == [
        (["alice@example.org"], True, "cocaq", "hpc@example.org"),
        (["bob@example.org"], True, "cocaq", "hpc@example.org"),
    ]
    parsed = got[0].message
    assert parsed["Message-ID"] == msg["Message-ID"]  # type: ignore[index]
    assert parsed.get_body(("plain",)).get_content().strip() == "plain"  # type: ignore[union-attr]
    assert "cid:chart" in parsed.get_body(("html",)).get_content()  # type: ignore[union-attr]
    imgs = [p for p in parsed.walk() if p.get_content_type() == "image/png"]
    assert [(i["Content-ID"], i.get_content()) for i in imgs] == [("<chart>", PNG_1X1)]  # type: ignore[attr-defined]
    assert PASSWORD not in repr(transport)


def test_implicit_tls(tmp_path: Path, certs: Certs) -> None:
    with SmtpServer("tls", certs) as server:
        transport = make_transport(config(tmp_path, mail_toml(server, smtp_ca_file=str(certs.ca))))
        msg, sender = message()
        transport.send(msg, sender, "alice@example.org")
        transport.close()
        assert [(r.rcpt_tos, r.tls) for r in server.messages] == [(["alice@example.org"], True)]


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl CLI")
def test_certificates_from_the_openssl_cli_work_too(tmp_path: Path) -> None:
    """The fixture's fallback where `cryptography` is not installed."""
    certs = Certs(tmp_path / "ca.pem", tmp_path / "server.pem", tmp_path / "server.key")
    _certs_openssl(tmp_path, certs)
    with SmtpServer("starttls", certs) as server:
        transport = make_transport(config(tmp_path, mail_toml(server, smtp_ca_file=str(certs.ca))))
        transport.send(message()[0], "hpc@example.org", "alice@example.org")
        transport.close()
        assert [r.tls for r in server.messages] == [True]


def test_untrusted_certificate_is_a_tls_failure(tmp_path: Path, certs: Certs) -> None:
    for security in ("starttls", "tls"):
        with SmtpServer(security, certs) as server:
            transport = make_transport(config(tmp_path, mail_toml(server)))  # no smtp_ca_file
            with pytest.raises(MailError) as info:
                transport.send(message()[0], "hpc@example.org", "alice@example.org")
            assert str(info.value).startswith(f"mail: TLS failure with 127.0.0.1:{server.port}: certificate")
            assert "smtp_ca_file" in str(info.value) and "\n" not in str(info.value)
            assert server.messages == []


def test_starttls_required_but_not_offered(tmp_path: Path) -> None:
    with SmtpServer("none") as server:
        transport = make_transport(config(tmp_path, mail_toml(server, smtp_security="starttls")))
        with pytest.raises(MailError, match="does not offer STARTTLS"):
            transport.send(message()[0], "hpc@example.org", "alice@example.org")


def test_wrong_password_never_shows_the_password(
    tmp_path: Path, certs: Certs, starttls_server: SmtpServer, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = "Wr0ng-" + PASSWORD
    (tmp_path / "pw").write_text(wrong + "\n")
    (tmp_path / "pw").chmod(0o600)
    text = mail_toml(
        starttls_server,
        smtp_user="cocaq",
        smtp_password_file=str(tmp_path / "pw"),
        smtp_ca_file=str(certs.ca),
    )
    cfg = config(tmp_path, text)
    caplog.set_level(logging.DEBUG)
    transport = make_transport(cfg)
    with pytest.raises(MailError) as info:
        transport.send(message()[0], "hpc@example.org", "alice@example.org")
    err = info.value
    assert str(err).startswith(f"mail: login as 'cocaq' refused by 127.0.0.1:{starttls_server.port}: 535")
    for shown in (str(err), repr(err), repr(transport), repr(cfg), caplog.text):
        assert wrong not in shown and PASSWORD not in shown
    assert err.__cause__ is None and err.__suppress_context__  # no chained smtplib exception to print
    b64 = base64.b64encode(f"\0cocaq\0{wrong}".encode()).decode()
    assert not any(b64 in r.getMessage() for r in caplog.records if r.name.startswith("cocaq"))
    assert starttls_server.messages == []


def test_missing_password_variable(tmp_path: Path, certs: Certs, starttls_server: SmtpServer) -> None:
    text = mail_toml(
        starttls_server, smtp_user="cocaq", smtp_password_env="NO_SUCH_VAR", smtp_ca_file=str(certs.ca)
    )
    transport = SmtpTransport(config(tmp_path, text).mail, environ={})
    with pytest.raises(MailError, match=r"\$NO_SUCH_VAR \(mail.smtp_password_env\) is not set"):
        transport.send(message()[0], "hpc@example.org", "alice@example.org")


def test_connection_refused_is_transient(tmp_path: Path) -> None:
    port = free_port()
    transport = make_transport(config(tmp_path, f"[mail]\nsmtp_host = '127.0.0.1'\nsmtp_port = {port}\n"))
    with pytest.raises(SendError) as info:
        transport.send(message()[0], "hpc@example.org", "alice@example.org")
    assert str(info.value) == f"cannot connect to 127.0.0.1:{port}: connection refused"
    assert not info.value.permanent and info.value.connection


def test_recipient_refused_permanently_or_for_now(tmp_path: Path) -> None:
    with SmtpServer() as server:
        server.recorder.reject.add("nobody@example.org")
        server.recorder.defer_rcpt["later@example.org"] = 1
        transport = make_transport(config(tmp_path, mail_toml(server)))
        with pytest.raises(SendError) as info:
            transport.send(message("nobody@example.org")[0], "hpc@example.org", "nobody@example.org")
        assert info.value.permanent and "550" in str(info.value)
        with pytest.raises(SendError) as info:
            transport.send(message("later@example.org")[0], "hpc@example.org", "later@example.org")
        assert not info.value.permanent and not info.value.connection and "451" in str(info.value)
        # The connection survives both refusals.
        transport.send(message("later@example.org")[0], "hpc@example.org", "later@example.org")
        assert len(server.messages) == 1


# --- cocaq mail test ------------------------------------------------------------------------------------


def write_config(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "cocaq.toml"
    p.write_text(text)
    return p


def test_cli_mail_test_over_starttls_with_login(
    tmp_path: Path, cli_env: dict[str, str], certs: Certs, starttls_server: SmtpServer
) -> None:
    text = mail_toml(
        starttls_server,
        smtp_user="cocaq",
        smtp_password_env="COCAQ_SMTP_PASSWORD",
        smtp_ca_file=str(certs.ca),
    )
    env = dict(cli_env, COCAQ_SMTP_PASSWORD=PASSWORD)
    r = run_cocaq(
        ["--config", str(write_config(tmp_path, text)), "mail", "test", "--to", "Admin@Example.ORG"], env
    )
    assert r.code == 0, r.err
    assert r.err.startswith(
        f"mail: test message to Admin@example.org accepted by 127.0.0.1:{starttls_server.port}"
    )
    assert PASSWORD not in r.err + r.out
    (got,) = starttls_server.messages
    assert got.rcpt_tos == ["Admin@example.org"] and got.tls and got.login == "cocaq"
    msg = got.message
    assert msg["Subject"].startswith("cocaq test message") and msg["Auto-Submitted"] == "auto-generated"
    assert msg.get_body(("plain",)) is not None and msg.get_body(("html",)) is not None


def test_cli_mail_test_to_the_outbox(tmp_path: Path, cli_env: dict[str, str]) -> None:
    text = mail_toml(transport="outbox", outbox_dir=str(tmp_path / "outbox"))
    r = run_cocaq(
        ["--config", str(write_config(tmp_path, text)), "mail", "test", "--to", "a@example.org"], cli_env
    )
    assert r.code == 0, r.err
    (eml,) = (tmp_path / "outbox").iterdir()
    assert eml.suffix == ".eml" and f"written to {eml}" in r.err


def test_cli_mail_test_failures_are_one_line(
    tmp_path: Path, cli_env: dict[str, str], certs: Certs, starttls_server: SmtpServer
) -> None:
    def run(text: str, to: str = "a@example.org", **env: str) -> tuple[int, str]:
        r = run_cocaq(
            ["--config", str(write_config(tmp_path, text)), "mail", "test", "--to", to], dict(cli_env, **env)
        )
        assert r.err.count("\n") == 1 and "Traceback" not in r.err, r.err
        return r.code, r.err.strip()

    port = free_port()
    assert run(f"[mail]\nsmtp_host = '127.0.0.1'\nsmtp_port = {port}\n") == (
        5,
        f"cocaq: error: mail: test message to a@example.org not sent: cannot connect to 127.0.0.1:{port}: "
        "connection refused",
    )
    code, err = run(mail_toml(starttls_server))  # the test CA is not trusted
    assert code == 5 and err.startswith(
        f"cocaq: error: mail: TLS failure with 127.0.0.1:{starttls_server.port}"
    )
    login = dict(smtp_user="cocaq", smtp_password_env="SMTP_PW", smtp_ca_file=str(certs.ca))
    code, err = run(mail_toml(starttls_server, **login), SMTP_PW="wrong-" + PASSWORD)
    assert (
        code == 5 and err.startswith("cocaq: error: mail: login as 'cocaq' refused") and "wrong-" not in err
    )
    assert run(mail_toml(starttls_server), to="a@b\r\nBcc: c@d") == (
        2,
        "cocaq: error: --to 'a@b\\r\\nBcc: c@d': expected an e-mail address like alice@example.org",
    )
    code, err = run("[mail]\naddress_template = '{login}@x.org'\n")
    assert code == 2 and "mail.address_template" in err
    assert starttls_server.messages == []
