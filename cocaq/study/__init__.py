"""The e-mail study (`[study]`, docs/study.md): do the e-mails change what users do?

`assign` draws each user into the e-mailed or the hold-out arm, once, and keeps the draw in `study_arms`;
the senders (reports.batch, reports.jobmail, reports.alerts) ask it who is held out while the study runs;
`analysis` compares the arms (pandas and numpy, imported there only). This package itself imports
nothing, so that a sender that only asks about the hold-out loads no analysis code.
"""
