"""[mail] configuration, addresses, the address map and opt-out files, and how messages are built."""

from __future__ import annotations

import email
import email.policy
from datetime import UTC, datetime
from email.message import EmailMessage
from pathlib import Path

import pytest

from cocaq.addresses import (
    apply_address_template,
    check_address_template,
    list_unsubscribe_header,
    looks_like_address,
)
from cocaq.config import Config
from cocaq.config_load import load_config
from cocaq.errors import ConfigError
from cocaq.reports.message import build_message, new_message_id, parse_sender
from cocaq.reports.recipients import load_address_map, load_opt_out
from cocaq.reports.transport import MailError, OutboxTransport, eml_name
from tests.mailkit import PNG_1X1


def cfg_from(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> Config:
    p = tmp_path / "cocaq.toml"
    p.write_text(text)
    return load_config(p, environ=env or {})


def test_mail_defaults_and_every_key(tmp_path: Path) -> None:
    m = load_config(None, environ={}).mail
    assert (m.transport, m.smtp_host, m.port, m.smtp_security) == ("smtp", "localhost", 25, "none")
    assert m.max_per_user_per_day == 10 and m.in_doubt == "resend"
    text = """
[mail]
transport = "outbox"
outbox_dir = "/var/spool/cocaq/outbox"
smtp_host = "smtp.example.org"
smtp_security = "starttls"
smtp_user = "cocaq"
smtp_password_file = "/etc/cocaq/smtp.secret"
smtp_ca_file = "/etc/ssl/site-ca.pem"
smtp_timeout_s = 10
from_address = "HPC reports <hpc@example.org>"
address_template = "{user}@example.org"
address_map = "/etc/cocaq/addresses.csv"
opt_out_file = "/etc/cocaq/opt-out.txt"
max_per_user_per_day = 3
retry_attempts = 5
retry_base_delay_s = 0.5
in_doubt = "skip"
list_unsubscribe = "mailto:hpc@example.org?subject=unsubscribe%20{user}"
"""
    m = cfg_from(tmp_path, text).mail
    assert m.transport == "outbox" and m.port == 587 and m.smtp_user == "cocaq"
    assert m.max_per_user_per_day == 3 and m.retry_attempts == 5 and m.in_doubt == "skip"
    assert cfg_from(tmp_path, "[mail]\nsmtp_security = 'tls'\n").mail.port == 465


def test_the_readme_example_is_a_valid_config(tmp_path: Path) -> None:
    readme = (Path(__file__).resolve().parent.parent / "docs" / "admin-guide.md").read_text()
    block = readme.split("```toml\n[mail]\n", 1)[1].split("```", 1)[0]
    m = cfg_from(tmp_path, "[mail]\n" + block, {"SMTP_PASSWORD": "x"}).mail
    assert (m.smtp_host, m.port, m.smtp_security, m.smtp_user) == (
        "smtp.example.org",
        587,
        "starttls",
        "cocaq",
    )


def test_smtp_host_and_port_from_the_environment(tmp_path: Path) -> None:
    text = "[mail]\nsmtp_host = 'from-file.example.org'\nsmtp_port = 25\n"
    m = cfg_from(tmp_path, text, {"COCAQ_SMTP_HOST": "mx.example.org", "COCAQ_SMTP_PORT": "2525"}).mail
    assert (m.smtp_host, m.port) == ("mx.example.org", 2525)
    m = cfg_from(
        tmp_path, text, {"COCAQ_MAIL__SMTP_SECURITY": "tls", "COCAQ_MAIL__MAX_PER_USER_PER_DAY": "2"}
    ).mail
    assert (m.smtp_security, m.max_per_user_per_day) == ("tls", 2)
    # COCAQ_SMTP_HOST wins over COCAQ_MAIL__SMTP_HOST (documented).
    env = {"COCAQ_SMTP_HOST": "short.example.org", "COCAQ_MAIL__SMTP_HOST": "long.example.org"}
    assert cfg_from(tmp_path, "", env).mail.smtp_host == "short.example.org"


def test_the_password_variable_is_not_a_setting_and_not_in_the_config(tmp_path: Path) -> None:
    text = "[mail]\nsmtp_host = 'localhost'\nsmtp_user = 'u'\nsmtp_password_env = 'COCAQ_SMTP_PASSWORD'\n"
    cfg = cfg_from(tmp_path, text, {"COCAQ_SMTP_PASSWORD": "hunter2-secret"})
    assert "hunter2-secret" not in repr(cfg)
    assert cfg.mail.smtp_password_env == "COCAQ_SMTP_PASSWORD"


@pytest.mark.parametrize(
    ("text", "env", "message"),
    [
        ("[mail]\ntransport = 'pigeon'\n", {}, "mail.transport: expected one of smtp, outbox, got 'pigeon'"),
        ("[mail]\nsmtp_security = 'ssl'\n", {}, "mail.smtp_security: expected one of starttls, tls, none"),
        ("[mail]\nsmtp_port = 70000\n", {}, "mail.smtp_port: expected a number between 1.0 and 65535.0"),
        ("", {"COCAQ_SMTP_PORT": "smtp"}, "mail.smtp_port: expected a number, got 'smtp'"),
        ("[mail]\nsmtp_port = 25.5\n", {}, "mail.smtp_port: expected a whole number"),
        ("[mail]\nsmtp_host = 'a b'\n", {}, "mail.smtp_host: expected a host name"),
        ("[mail]\nsmtp_pasword_env = 'X'\n", {}, "mail.smtp_pasword_env: unknown key"),
        ("[mail]\nsmtp_user = 'u'\n", {}, "mail.smtp_user: say where its password is"),
        ("[mail]\nsmtp_password_env = 'P'\n", {}, "mail.smtp_user: needed with a password"),
        ("[mail]\nsmtp_user='u'\nsmtp_password_env='A'\nsmtp_password_file='/f'\n", {}, "not both"),
        (
            "[mail]\nsmtp_user='u'\nsmtp_password_env='not a name'\n",
            {},
            "expected the name of an environment",
        ),
        (
            "[mail]\nsmtp_host='mx.example.org'\nsmtp_user='u'\nsmtp_password_env='P'\n",
            {},
            "needs smtp_security 'starttls' or 'tls'",
        ),
        ("[mail]\naddress_template = '{user}'\n", {}, "does not make an e-mail address"),
        ("[mail]\naddress_template = '{login}@example.org'\n", {}, "only {user} may appear, not {login}"),
        ("[mail]\naddress_template = '{user}@{domain}'\n", {}, "only {user} may appear, not {domain}"),
        ("[mail]\naddress_template = 'admin@example.org'\n", {}, "must contain {user}"),
        ("[mail]\naddress_template = '{user!r}@example.org'\n", {}, "not a valid template"),
        ("[mail]\naddress_template = '{user}@exa mple.org'\n", {}, "does not make an e-mail address"),
        ("[mail]\naddress_template = '{user@example.org'\n", {}, "not a valid template"),
        ("[mail]\nfrom_address = 'not an address'\n", {}, "mail.from_address: expected an address"),
        ("[mail]\nfrom_address = 'a@example.org, b@example.org'\n", {}, "mail.from_address: expected"),
        ('[mail]\nfrom_address = "x@example.org\\r\\nBcc: y@evil.org"\n', {}, "mail.from_address"),
        (
            "[mail]\nlist_unsubscribe = 'ftp://x'\n",
            {},
            "mail.list_unsubscribe: 'ftp://x': expected a mailto:",
        ),
        ('[mail]\nlist_unsubscribe = "mailto:a@b\\r\\nBcc: c@d"\n', {}, "mail.list_unsubscribe"),
        ("[mail]\nin_doubt = 'maybe'\n", {}, "mail.in_doubt: expected one of resend, skip"),
        ("[mail]\nretry_attempts = 0\n", {}, "mail.retry_attempts: expected a number between 1.0"),
        ("[mail]\nmax_per_user_per_day = -1\n", {}, "mail.max_per_user_per_day: expected a number"),
        ("mail = 3\n", {}, "mail: expected a table"),
    ],
)
def test_bad_mail_config_is_one_line_naming_the_key(
    tmp_path: Path, text: str, env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        cfg_from(tmp_path, text, env)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_addresses_and_templates() -> None:
    assert looks_like_address("jane.doe+hpc@mail.example.org")
    for bad in (
        "jane",
        "jane@",
        "@example.org",
        "a b@example.org",
        "a@example.org\r\nBcc: x@y.z",
        "a@-x.org",
    ):
        assert not looks_like_address(bad), bad
    assert check_address_template("{user}@Example.ORG") is None
    assert apply_address_template("{user}@Example.ORG", "alice") == "alice@example.org"
    # A user name that cannot make an address gives none, rather than a broken header.
    assert apply_address_template("{user}@example.org", "bob\r\nBcc: evil@example.com") is None
    assert apply_address_template("{user}@example.org", "eve@evil.org") is None
    assert list_unsubscribe_header(
        "mailto:hpc@example.org?subject=stop%20{user}, https://x.org/u/{user}", "a b\r\n"
    ) == ("<mailto:hpc@example.org?subject=stop%20a%20b%0D%0A>, <https://x.org/u/a%20b%0D%0A>")


def test_address_map_csv_skips_and_reports_bad_lines(tmp_path: Path) -> None:
    p = tmp_path / "addresses.csv"
    p.write_text(
        "user,address\n"
        "alice,alice@lab.example.org\n"
        "# a comment\n"
        "\n"
        "bob;bob@example.org\n"  # line 5: wrong separator
        "carol,not-an-address\n"  # line 6
        "dave,Dave@Example.ORG\n"
        "alice,alice.new@lab.example.org\n"  # line 8: later wins, said so
        "erin,erin@example.org,extra\n"  # line 9
    )
    mapping, problems = load_address_map(p)
    assert mapping == {"alice": "alice.new@lab.example.org", "dave": "Dave@example.org"}
    assert [pr.split(": ", 1)[1] for pr in problems] == [
        "line 5: expected user,address, got 'bob;bob@example.org'",
        "line 6: 'not-an-address' is not an e-mail address",
        "line 8: alice is also on line 2; line 8 is used",
        "line 9: expected user,address, got 'erin,erin@example.org,extra'",
    ]


def test_address_map_toml_skips_and_reports_bad_lines(tmp_path: Path) -> None:
    p = tmp_path / "addresses.toml"
    p.write_text(
        '# user = "address"\n'
        'alice = "alice@lab.example.org"\n'
        'bob = "bob@example.org\n'  # line 3: unterminated string
        "carol = 42\n"  # line 4
        '"d.e" = "de@example.org"\n'
        'frank = "frank at example.org"\n'  # line 6
    )
    mapping, problems = load_address_map(p)
    assert mapping == {"alice": "alice@lab.example.org", "d.e": "de@example.org"}
    assert [pr.split(": ", 2)[1] for pr in problems] == ["line 3", "line 4", "line 6"]
    assert "not an e-mail address" in problems[2]


def test_opt_out_file(tmp_path: Path) -> None:
    p = tmp_path / "opt-out.txt"
    p.write_text("# users who asked not to be mailed\nalice\nBob@Example.org   # by address\nfoo bar\n")
    entries, problems = load_opt_out(p)
    assert entries == {"alice", "bob@example.org"}
    assert problems == [f"{p}: line 4: expected one user name or address, got 'foo bar'"]


def parse(msg: EmailMessage) -> EmailMessage:
    out = email.message_from_bytes(msg.as_bytes(), policy=email.policy.default)
    assert isinstance(out, EmailMessage)
    return out


def test_message_structure_headers_and_inline_images() -> None:
    sender = parse_sender("HPC reports <hpc@example.org>")
    mid = new_message_id(sender)
    assert mid.startswith("<") and mid.endswith("@example.org>")
    when = datetime(2026, 11, 1, 6, 0, tzinfo=UTC)
    msg = parse(
        build_message(
            sender=sender,
            to="alice@example.org",
            to_name="Alice Liddell",
            subject="Your cluster footprint, October 2026 — 12.3 kg CO₂",
            text="plain text body",
            html='<p>html body</p><img src="cid:chart-1"><img src="cid:chart-2">',
            images=[("chart-1", PNG_1X1), ("chart-2", PNG_1X1 + b"2")],
            message_id=mid,
            date=when,
            list_unsubscribe="<mailto:hpc@example.org?subject=unsubscribe>",
        )
    )
    assert msg["From"] == "HPC reports <hpc@example.org>"
    assert msg["To"] == "Alice Liddell <alice@example.org>"
    assert msg["Subject"] == "Your cluster footprint, October 2026 — 12.3 kg CO₂"
    assert msg["Message-ID"] == mid and msg["Auto-Submitted"] == "auto-generated"
    assert msg["List-Unsubscribe"] == "<mailto:hpc@example.org?subject=unsubscribe>"
    assert email.utils.parsedate_to_datetime(msg["Date"]) == when
    assert msg.get_content_type() == "multipart/alternative"
    text, related = msg.get_payload()  # type: ignore[misc]
    assert text.get_content_type() == "text/plain" and text.get_content().strip() == "plain text body"
    assert related.get_content_type() == "multipart/related"
    html, *imgs = related.get_payload()
    assert html.get_content_type() == "text/html" and "cid:chart-1" in html.get_content()
    assert {i["Content-ID"]: i.get_content() for i in imgs} == {
        "<chart-1>": PNG_1X1,
        "<chart-2>": PNG_1X1 + b"2",
    }
    assert all(i.get_content_type() == "image/png" and i.get_content_disposition() == "inline" for i in imgs)
    assert msg.get_body(("html",)) is html and msg.get_body(("plain",)) is text


def test_message_without_html_is_plain_and_bad_images_are_refused() -> None:
    sender = parse_sender("hpc@example.org")
    msg = parse(
        build_message(sender=sender, to="a@example.org", subject="s", text="t", message_id="<x@example.org>")
    )
    assert msg.get_content_type() == "text/plain" and "List-Unsubscribe" not in msg
    with pytest.raises(ValueError, match="not a PNG"):
        build_message(sender=sender, to="a@example.org", subject="s", text="t", html="h",
                      images=[("c", b"GIF89a")], message_id="<x@y>")  # fmt: skip
    with pytest.raises(ValueError, match="Content-ID"):
        build_message(sender=sender, to="a@example.org", subject="s", text="t", html="h",
                      images=[("a>b", PNG_1X1)], message_id="<x@y>")  # fmt: skip
    with pytest.raises(ValueError, match="HTML part"):
        build_message(sender=sender, to="a@example.org", subject="s", text="t", images=[("c", PNG_1X1)],
                      message_id="<x@y>")  # fmt: skip
    with pytest.raises(ValueError, match="not an e-mail address"):
        build_message(sender=sender, to="a@example.org\r\nBcc: x@evil.org", subject="s", text="t",
                      message_id="<x@y>")  # fmt: skip


def test_header_injection_in_subject_and_name_adds_no_header() -> None:
    sender = parse_sender("hpc@example.org")
    raw = build_message(
        sender=sender,
        to="bob@example.org",
        to_name="Bob\r\nBcc: evil@example.com",
        subject="Report\r\nBcc: evil@example.com\nX-Injected: yes\r\n\r\nfake body",
        text="t",
        message_id=new_message_id(sender),
    ).as_bytes()
    msg = parse_bytes(raw)
    assert "Bcc" not in msg and "X-Injected" not in msg
    assert msg["Subject"] == "Report Bcc: evil@example.com X-Injected: yes fake body"
    assert msg["To"].addresses[0].addr_spec == "bob@example.org"  # type: ignore[attr-defined]
    assert b"\nBcc:" not in raw and b"\nX-Injected:" not in raw


def parse_bytes(raw: bytes) -> EmailMessage:
    out = email.message_from_bytes(raw, policy=email.policy.default)
    assert isinstance(out, EmailMessage)
    return out


def test_outbox_writes_atomically_under_a_safe_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert eml_name("<1.2.cocaq@example.org>") == "1.2.cocaq@example.org.eml"
    assert eml_name("<../../etc/passwd@x>") == "_.._etc_passwd@x.eml"
    sender = parse_sender("hpc@example.org")
    box = OutboxTransport(tmp_path / "outbox")
    msg = build_message(
        sender=sender, to="a@example.org", subject="s", text="t", message_id="<../a/b@example.org>"
    )
    note = box.send(msg, sender.addr_spec, "a@example.org")
    files = sorted(p.name for p in (tmp_path / "outbox").iterdir())
    assert files == ["_a_b@example.org.eml"] and note.endswith("_a_b@example.org.eml")
    assert parse_bytes((tmp_path / "outbox" / files[0]).read_bytes())["To"] == "a@example.org"
    # The same Message-ID again replaces the file: no temp files left, no second copy.
    box.send(msg, sender.addr_spec, "a@example.org")
    assert sorted(p.name for p in (tmp_path / "outbox").iterdir()) == files

    # A failure before the rename leaves neither a partial .eml nor a temp file behind.
    def broken_replace(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("cocaq.reports.transport.os.replace", broken_replace)
    other = build_message(
        sender=sender, to="a@example.org", subject="s", text="t", message_id="<new@example.org>"
    )
    with pytest.raises(MailError, match="cannot write: No space left on device"):
        box.send(other, sender.addr_spec, "a@example.org")
    assert sorted(p.name for p in (tmp_path / "outbox").iterdir()) == files
