"""Reports: Jinja2 e-mails and HTML admin reports, sent over SMTP."""
