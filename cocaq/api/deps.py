"""What the read API's routes share: who asks (the MUNGE caller), the app's context, the time window,
the patterns and query types of their parameters, and who may see a user's rows.

One definition of each, so that every route validates a name, a time or a window the same way and says
the same words when it refuses one.
"""

import grp
import os
import pwd
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC
from typing import TYPE_CHECKING, Annotated, TypeVar

from fastapi import Depends, HTTPException, Path, Query, Request

from cocaq.api import munge
from cocaq.api.client import payload_for
from cocaq.api.context import ApiContext, Decode
from cocaq.db.dbapi import Db
from cocaq.errors import CocaqError
from cocaq.footprint.job_parts import ASK_PATTERN
from cocaq.slurm.record import JOB_ID_PATTERN

if TYPE_CHECKING:
    from cocaq.config import Api as ApiConfig
    from cocaq.footprint.totals import Window

NAME = r"^[A-Za-z0-9._@+-]{1,128}$"  # user and account names (as the hooks accept them)
JOB_OR_ARRAY = rf"^(?:{ASK_PATTERN})$"  # a job, or an array's tasks as squeue prints them (123_[0-9])
WHEN = r"^[0-9A-Za-z:.+ -]{1,40}$"
WHEN_DOC = "30d, 12h, a date (2026-11-01, 20261101) or an ISO time, 1970 to 2200 (cocaq.timeparse)"
LIVE_JOBS = rf"^{JOB_ID_PATTERN}(,{JOB_ID_PATTERN}){{0,99}}$"  # at most cocaq.footprint.live.MAX_JOBS

T = TypeVar("T")


@dataclass(frozen=True)
class Caller:
    user: str
    uid: int
    admin: bool
    heads: frozenset[str]  # the labs (Slurm accounts) this user heads


def munge_decoder(socket: str | None) -> Decode:
    """cocaq.api.munge's decoding through munged at `socket` (None: its default), as a `Decode`."""

    def decode(cred: str) -> tuple[int, bytes]:
        c = munge.decode(cred, socket=socket)
        return c.uid, c.payload

    return decode


async def context(request: Request) -> ApiContext:
    """The app's context (async: no turn through the threadpool to read an attribute)."""
    ctx: ApiContext = request.app.state.context
    return ctx


Context = Annotated[ApiContext, Depends(context)]


def _groups(user: str, gid: int) -> set[str]:
    out = set()
    for g in os.getgrouplist(user, gid):
        try:
            out.add(grp.getgrgid(g).gr_name)
        except KeyError:
            continue
    return out


def caller(request: Request, ctx: Context) -> Caller:
    """The user whose MUNGE credential, made for this very request, came with it; 401 otherwise."""
    api = ctx.cfg.api
    header = request.headers.get("authorization", "")
    scheme, _, cred = header.partition(" ")
    if scheme.upper() != "MUNGE" or not cred.strip():
        raise HTTPException(401, "authenticate with MUNGE: send `Authorization: MUNGE <credential>`")
    try:
        uid, payload = ctx.decode(cred.strip())
    except munge.MungeError as exc:
        raise HTTPException(401, f"MUNGE credential refused: {exc}") from None
    if payload != payload_for(request.method, request.url.path):
        raise HTTPException(401, "MUNGE credential refused: it was made for another request")
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        raise HTTPException(401, f"uid {uid} is not a user here") from None
    return caller_for(api, pw)


def caller_for(api: "ApiConfig", pw: pwd.struct_passwd) -> Caller:
    """What a user may see, by `[api]`: admin by name or group, the labs they head. One rule for the
    API's MUNGE callers and the web app's users, whoever vouched for them."""
    admin = pw.pw_name in api.admin_users or bool(
        api.admin_groups and pw.pw_uid >= 0 and _groups(pw.pw_name, pw.pw_gid) & set(api.admin_groups)
    )
    heads = frozenset(a for a, users in api.lab_heads.items() if pw.pw_name in users)
    return Caller(pw.pw_name, pw.pw_uid, admin, heads)


Who = Annotated[Caller, Depends(caller)]
Since = Annotated[str, Query(pattern=WHEN, description=WHEN_DOC)]
Until = Annotated[str | None, Query(pattern=WHEN)]
ClusterQ = Annotated[str | None, Query(pattern=NAME)]
NameQ = Annotated[str | None, Query(pattern=NAME)]  # a user= or account= filter
NamePath = Annotated[str, Path(pattern=NAME)]  # a user or lab in the path
Top = Annotated[int, Query(ge=0, le=1000)]


def window(since: str, until: str | None) -> "Window":
    """[since, until) from the query's words, dates in UTC; 400 with the reason for a bad or empty one."""
    from cocaq.footprint.lookup import parse_window

    try:
        w = parse_window(since, until, UTC)
    except (ValueError, CocaqError) as exc:
        raise HTTPException(400, f"bad time: {exc}") from None
    if w.until <= w.since:
        raise HTTPException(400, "empty window: until is not after since")
    return w


def known(answer: Callable[[], T]) -> T:
    """A name the database has never seen is a 404 with the reason (the CLI exits 2 on it)."""
    from cocaq.footprint.lookup import UnknownName

    try:
        return answer()
    except UnknownName as exc:
        raise HTTPException(404, str(exc)) from None


def member_of(db: Db, user: str, account: str) -> bool:
    return bool(
        db.rows(
            "SELECT 1 FROM jobs WHERE user_name = %(u)s AND account = %(a)s LIMIT 1",
            {"u": user, "a": account},
        )
    )


def headed_labs(db: Db, who: Caller, user: str) -> tuple[str, ...]:
    """The labs `who` heads that `user` ran jobs in: all a lab head may see of that user."""
    return tuple(a for a in sorted(who.heads) if member_of(db, user, a))
