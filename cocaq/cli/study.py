"""`cocaq study`: the e-mail study's draw (`assign`) and where it stands (`status`); cocaq.study.assign.

The group is open: another module adds its commands to it (`from cocaq.cli.study import study`, then
`@study.command("report")`). Errors are one line; with no `[study] start` every command says so.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click

from cocaq.errors import UsageError

if TYPE_CHECKING:
    from cocaq.cli.app import Ctx
    from cocaq.config import Config

STRATA = {
    -1: "joined after the draw",
    0: "no GPU-hours in the baseline",
    1: "lowest GPU-hours quartile",
    2: "second quartile",
    3: "third quartile",
    4: "highest quartile",
}


def _require(cfg: Config) -> None:
    from cocaq.study.assign import NO_STUDY

    if cfg.study.start is None:
        raise UsageError(NO_STUDY)


def is_admin(cfg: Config) -> bool:
    """Whether whoever runs this may see a study's random seed (whoever has it can tell every user's
    arm): root, or an admin of the read API, `[api] admin_users` and members of `[api] admin_groups`."""
    import grp
    import os
    import pwd

    uid = os.geteuid()
    if uid == 0:
        return True
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        return False
    if pw.pw_name in cfg.api.admin_users:
        return True
    groups = set()
    for gid in os.getgrouplist(pw.pw_name, pw.pw_gid) if cfg.api.admin_groups else ():
        try:
            groups.add(grp.getgrgid(gid).gr_name)
        except KeyError:
            continue
    return bool(groups & set(cfg.api.admin_groups))


def _seed_words(seed: int | None, random: bool, admin: bool) -> str:
    """The seed as `study status` says it: a random one to admins only."""
    if not random:
        return f"seed {seed}"
    if seed is None:
        return "seed to be drawn at random by the first draw"
    return f"seed {seed} (drawn at random)" if admin else "seed drawn at random (shown to admins)"


def _by_stratum(arms: Mapping[str, Mapping[int, int]], opted: Mapping[str, int] | None = None) -> list[str]:
    """Counts per stratum and arm as aligned text lines (a short table; no rich needed)."""
    from cocaq.config import STUDY_ARMS

    strata = sorted({s for a in arms.values() for s in a} or {0})
    label = {s: f"{s:>2} {STRATA.get(s, '')}" for s in strata}
    width = max(len("opted out (kept in arm)"), *(len(x) for x in label.values()))
    lines = [f"{'stratum':<{width}}  " + "  ".join(f"{a:>9}" for a in STUDY_ARMS)]
    for s in strata:
        cells = "  ".join(f"{arms.get(a, {}).get(s, 0):>9,}" for a in STUDY_ARMS)
        lines.append(f"{label[s]:<{width}}  {cells}")
    total = "  ".join(f"{sum(arms.get(a, {}).values()):>9,}" for a in STUDY_ARMS)
    lines.append(f"{'all':<{width}}  {total}")
    if opted is not None:
        lines.append(
            f"{'opted out (kept in arm)':<{width}}  "
            + "  ".join(f"{opted.get(a, 0):>9,}" for a in STUDY_ARMS)
        )
    return lines


@click.group()
def study() -> None:
    """The e-mail study ([study]): who is e-mailed and who is held out, and what it found."""


@study.command("assign")
@click.pass_obj
def assign_cmd(obj: Ctx) -> None:
    """Draw the study's arms now: the baseline's users the first time, then users seen since.

    A user drawn once keeps their arm; the scheduler's senders draw on their own when the start month
    has begun, so this is needed only to draw earlier or to see the draw."""
    from collections import defaultdict

    from sqlalchemy import select

    from cocaq.db.schema import StudyArm
    from cocaq.reports.recipients import AddressBook
    from cocaq.study.assign import assign, note_opted_out

    cfg = obj.cfg
    _require(cfg)
    engine = obj.engine()
    now = datetime.now(UTC)
    with engine.begin() as conn:
        summary = assign(conn, cfg, now)
    key = summary.key
    with engine.connect() as conn:
        names = sorted(conn.execute(select(StudyArm.user_name).where(StudyArm.study == key)).scalars())
    book = AddressBook.load(engine, cfg.mail, names)  # the opt-out file, as the senders read it
    with engine.begin() as conn:
        summary.opted_out += note_opted_out(conn, key, now, [u for u in names if book.for_user(u).opted_out])
    click.echo(summary.line())
    if summary.first_draw and summary.random_seed:
        click.echo(
            "  its seed was drawn at random and kept with the study (`cocaq study status` shows admins)"
        )
    if summary.added:
        arms: dict[str, dict[int, int]] = defaultdict(dict)
        for (arm, stratum), n in summary.drawn.items():
            arms[arm][stratum] = n
        for line in _by_stratum(arms):
            click.echo("  " + line)
    click.echo("  " + _plan_line(engine, cfg, now))


def _plan_line(engine: Any, cfg: Config, now: datetime) -> str:
    """`cocaq study plan`'s headline for the configured study, cheaply (the chosen design only, 200
    simulations), or why there is none: one line."""
    from cocaq.study.plan import headline, site_plan

    with engine.connect() as conn:
        return headline(site_plan(conn, cfg, now, simulations=200, table=False))


@study.command("status")
@click.option(
    "-o", "--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True
)
@click.pass_obj
def status_cmd(obj: Ctx, fmt: str) -> None:
    """The study's months and its arms as drawn: users by stratum, and those found opted out."""
    from cocaq.study.assign import status

    cfg = obj.cfg
    _require(cfg)
    engine = obj.engine()
    now = datetime.now(UTC)
    with engine.connect() as conn:
        st = status(conn, cfg, now)
    admin = is_admin(cfg)
    if fmt == "json":
        click.echo(json.dumps(st.as_dict(seed=admin or not st.random), indent=2))
        return
    months = f"{st.start} to {st.end}" if st.end else f"from {st.start} (no end month set)"
    if st.running:
        state = "running"
    elif now < datetime.fromisoformat(f"{st.start}-01T00:00:00+00:00"):
        state = "not started"
    else:
        state = "ended"
    import shutil
    import textwrap

    width = max(shutil.get_terminal_size((100, 24)).columns, 40)
    click.echo(textwrap.fill(f"study {st.key}: {months}, {state}", width, subsequent_indent="    "))
    for said in (
        f"baseline: the {st.baseline_months} month(s) before {st.start}; hold-out share "
        f"{st.holdout_share:g}, {_seed_words(st.seed, st.random, admin)}",
        f"primary outcome: {st.primary} ({st.declared})",
    ):
        click.echo(textwrap.fill(said, width, initial_indent="  ", subsequent_indent="    "))
    if st.drawn_at is None:
        click.echo(
            f"  not drawn yet: the first e-mail run in {st.start} draws it, or `cocaq study assign` now"
        )
        return
    click.echo(f"  drawn {st.drawn_at:%Y-%m-%d %H:%M} UTC")
    for line in _by_stratum(st.arms, st.opted_out):
        click.echo("  " + line)
