"""Reports: Jinja2 e-mails and HTML admin reports, sent over SMTP.

Delivery (how messages are addressed, sent exactly once and recorded) lives in small modules, imported
where used so that `import cocaq.reports` stays cheap:

- `addresses`: what an address is; `{user}` templates (also used by the config validator);
- `message`: building the MIME message (text + HTML + inline images, safe headers);
- `transport`: SMTP and the outbox directory, and how each fails;
- `recipients`: a user's address, opt-outs, the per-address daily throttle;
- `ledger`: the exactly-once record in `sent_reports`;
- `deliver`: sending a batch, and its one-line summary.
"""
