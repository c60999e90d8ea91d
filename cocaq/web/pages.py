"""The web app's pages: what each one asks the read API and how it shows the answer.

Each page reads through the user's Reader only (cocaq.web.reader) and shows the API's figures with the
words the terminal and the e-mails use (cocaq.footprint.totals_rows, cocaq.footprint.advice_words), so a
figure reads the same on every surface. Every page offers what it shows as JSON (the API's answer as it
came) and CSV (`?format=json`, `?format=csv`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from cocaq.web import render
from cocaq.web.http import Answer, HttpError, Request
from cocaq.web.reader import Refused

if TYPE_CHECKING:
    from cocaq.config import Config

SINCE_CHOICES = ("7d", "30d", "90d", "365d")
JOB_PATTERN = r"[0-9]{1,12}(?:_[0-9]{1,9}|_\[[0-9,\-]{1,64}\]|\+[0-9]{1,4})?"
SORTS = ("end", "start", "job", "elapsed", "gpus", "kwh", "co2", "idle")
PAGE_SIZES = (25, 50, 100, 200)
TREND_MIN_DAYS = 7


def routes(cfg: Config) -> list[tuple[str, Callable[[Request, re.Match[str]], Answer]]]:
    return [
        (r"/", footprint),
        (r"/month/(?P<month>[0-9]{4}-[0-9]{2})", month),
        (r"/jobs", jobs),
        (rf"/jobs/(?P<job>{JOB_PATTERN})", job),
        (rf"/jobs/(?P<job>{JOB_PATTERN})/live\.json", job_live),
        (r"/when", when),
        (r"/labs", labs),
        (r"/labs/(?P<account>[A-Za-z0-9._@+-]{1,128})", lab),
        (r"/help", help_page),
        (r"/static/(?P<name>[a-z0-9-]{1,40}\.(?:css|js))", render.static),
    ]


# --- my footprint -----------------------------------------------------------------------------------------


def footprint(req: Request, m: re.Match[str]) -> Answer:
    since = _choice(req, "since", SINCE_CHOICES, "30d")
    d = req.reader.get(("users", req.user), {"since": since})
    if _format(req) == "json":
        return render.json_answer(d)
    from cocaq.footprint.totals import Footprint
    from cocaq.footprint.totals_rows import totals_rows

    rows = totals_rows(Footprint.from_dict(d).totals)
    if _format(req) == "csv":
        table = [("figure", "value"), *((k.strip(), v) for k, v in rows)]
        return render.csv_answer(table, f"footprint-{since}")
    days = int(since[:-1])
    daily = _daily(req, f"{2 * days}d")
    cut = (datetime.now(UTC) - timedelta(days=days)).date().isoformat()
    now_days = [(d, kwh) for d, kwh, _ in daily if d > cut]  # whole days inside the window
    # the trend: kWh and CO2 per whole UTC day of the daily totals, this window's against the as many
    # days before it (the window's own edges are part days: the tiles' figures count them, a rate not)
    after = _sums([x for x in daily if x[0] > cut])
    before = _sums([x for x in daily if x[0] <= cut][-len(now_days) :] if now_days else [])
    if before is None or after is None or before["days"] < min(TREND_MIN_DAYS, after["days"]):
        before = None  # too few days before to compare (as the e-mail's trend, reports.data.Trend)
    return render.page(
        req,
        "footprint.html",
        title="My footprint",
        d=d,
        rows=rows,
        since=since,
        since_choices=SINCE_CHOICES,
        before=before,
        after=after,
        months=_months(12),
        daily=render.daily_chart(now_days, f"Your energy per day, the last {days} days"),
    )


def _sums(days: list[tuple[str, float, float]]) -> dict[str, float] | None:
    """kWh and CO2 over whole days of the daily totals (None: no day), for a like-for-like trend."""
    if not days:
        return None
    return {"energy_kwh": sum(d[1] for d in days), "co2_kg": sum(d[2] for d in days), "days": len(days)}


def _daily(req: Request, since: str) -> list[tuple[str, float, float]]:
    """(day, kWh, kg CO2) per UTC day from the daily rollups (the export API's rows, summed over
    partitions and labs)."""
    out: dict[str, tuple[float, float]] = {}
    after = 0
    for _ in range(20):  # pages of 10,000 rows: a year of a user's days fits in one
        page = req.reader.get(("export", "rollups"), {"since": since, "user": req.user, "after": after})
        cols = page["columns"]
        i_day, i_kwh, i_co2 = cols.index("day"), cols.index("energy_kwh"), cols.index("co2_kg")
        for r in page["rows"]:
            kwh, co2 = out.get(r[i_day][:10], (0.0, 0.0))
            out[r[i_day][:10]] = (kwh + float(r[i_kwh] or 0.0), co2 + float(r[i_co2] or 0.0))
        if page.get("next") is None:
            break
        after = page["next"]
    return [(d, kwh, co2) for d, (kwh, co2) in sorted(out.items())]


def _months(n: int) -> list[str]:
    t = datetime.now(UTC)
    y, mo = t.year, t.month
    out = []
    for _ in range(n):
        out.append(f"{y:04d}-{mo:02d}")
        y, mo = (y - 1, 12) if mo == 1 else (y, mo - 1)
    return out


def month(req: Request, m: re.Match[str]) -> Answer:
    label = m["month"]
    if not 1 <= int(label[5:]) <= 12:
        raise HttpError(404, f"no month {label}")
    d = req.reader.get(("users", req.user, "month"), {"month": label})
    if _format(req) == "json":
        return render.json_answer(d)
    t = d["totals"]
    if _format(req) == "csv":
        return render.csv_answer([("figure", "value"), *sorted(t.items())], f"month-{label}")
    return render.page(
        req,
        "month.html",
        title=f"My footprint, {datetime.strptime(label, '%Y-%m'):%B %Y}",
        d=d,
        email=render.email_body(d["email"]["html"]),
        months=_months(12),
        label=label,
        daily_fig=render.daily_chart(
            [(p["day"], p["energy_kwh"]) for p in d["daily"]], f"Your energy per day, {label}"
        ),
    )


# --- my jobs ----------------------------------------------------------------------------------------------


def jobs(req: Request, m: re.Match[str]) -> Answer:
    since = _choice(req, "since", SINCE_CHOICES, "30d")
    sort = _choice(req, "sort", SORTS, "end")
    descending = _choice(req, "order", ("desc", "asc"), "desc") == "desc"
    size = int(_choice(req, "size", tuple(str(n) for n in PAGE_SIZES), "50"))
    page_no = _int(req.arg("page", "1"), 1, 10**6, "page")
    filters = {k: req.arg(k) or None for k in ("state", "partition", "model", "name")}
    params = {"since": since, "sort": sort, "descending": descending, "offset": (page_no - 1) * size,
              "limit": size, **filters}  # fmt: skip
    d = req.reader.get(("users", req.user, "jobs"), params)
    if _format(req) == "json":
        return render.json_answer(d)
    if _format(req) == "csv":
        cols = d["columns"]
        return render.csv_answer([tuple(cols), *(tuple(r[c] for c in cols) for r in d["rows"])], "jobs")
    pages = max(1, -(-d["total"] // size))
    state = {"since": since, "sort": sort, "order": "desc" if descending else "asc", "size": size, **filters}
    return render.page(
        req, "jobs.html", title="My jobs", d=d, state=state, page_no=page_no, pages=pages,
        since_choices=SINCE_CHOICES, sizes=PAGE_SIZES, sorts=SORTS,
    )  # fmt: skip


def job(req: Request, m: re.Match[str]) -> Answer:
    d = req.reader.get(("jobs", m["job"]))
    found = d.get("jobs", []) + d.get("arrays", []) + d.get("het_jobs", [])
    if _format(req) == "json":
        return render.json_answer(d)
    if _format(req) == "csv":
        rows: list[tuple[Any, ...]] = [("job_id", "node", "component", "method", "source", "energy_kwh")]
        for j in d.get("jobs", []):
            rows += [(j["job_id"], e["node"], e["component"], e["method"], e["source"], e["energy_kwh"])
                     for e in j.get("energies", [])]  # fmt: skip
        return render.csv_answer(rows, f"job-{m['job']}")
    running = any(j.get("live") for j in d.get("jobs", []))
    return render.page(
        req, "job.html", title=f"Job {m['job']}", d=d, found=found, job_id=m["job"], running=running,
        charts=[render.parts_chart(j) for j in d.get("jobs", [])],
    )  # fmt: skip


def job_live(req: Request, m: re.Match[str]) -> Answer:
    """What `cocaq watch` shows of a running job, as a fragment the job page swaps in (cocaq.js)."""
    d = req.reader.get(("live",), {"jobs": m["job"].split("_")[0].split("+")[0]})
    return render.json_answer({"html": render.fragment("_live.html", req, views=d.get("jobs", [])), **d})


# --- when to run ------------------------------------------------------------------------------------------


def when(req: Request, m: re.Match[str]) -> Answer:
    asked = "hours" in req.query
    hours = _float(req.arg("hours", "6"), 0.0, 744.0, "hours") if asked else 6.0
    within = _float(req.arg("within", "24"), 0.0, 744.0, "within") if asked else 24.0
    d: dict[str, Any] | None = None
    error = None
    if asked:
        try:
            d = req.reader.get(("carbon", "when"), {"hours": hours, "within": within})
        except Refused as exc:
            if exc.status != 400:
                raise
            error = exc.reason
    if error is not None and _format(req) != "html":
        raise HttpError(400, error)
    if _format(req) == "json" and d is not None:
        return render.json_answer(d)
    if _format(req) == "csv" and d is not None:
        rows = [("start", "g_per_kwh", "saving")] + [
            (s["start"], s["g_per_kwh"], s["saving"]) for s in [d["best"], *d["others"]]
        ]
        return render.csv_answer(rows, "when")
    return render.page(req, "when.html", title="When to run", d=d, hours=hours, within=within, error=error)


# --- my labs ----------------------------------------------------------------------------------------------


def labs(req: Request, m: re.Match[str]) -> Answer:
    me = req.reader.get(("whoami",))
    if _format(req) == "json":
        return render.json_answer(me)
    if _format(req) == "csv":
        return render.csv_answer([("lab",), *((a,) for a in me["lab_head_of"])], "labs")
    return render.page(req, "labs.html", title="My labs", me=me)


def lab(req: Request, m: re.Match[str]) -> Answer:
    since = _choice(req, "since", SINCE_CHOICES, "30d")
    d = req.reader.get(("labs", m["account"]), {"since": since, "top": 10})
    if _format(req) == "json":
        return render.json_answer(d)
    if _format(req) == "csv":
        cols = ("user", "jobs", "gpu_hours", "energy_kwh", "co2_kg", "wasted_energy_kwh", "gpu_util_pct")
        return render.csv_answer(
            [cols, *(tuple(u.get(c) for c in cols) for u in d.get("users", []))], f"lab-{m['account']}"
        )
    from cocaq.footprint.totals import Footprint
    from cocaq.footprint.totals_rows import totals_rows

    return render.page(
        req, "lab.html", title=f"Lab {m['account']}", d=d, account=m["account"], since=since,
        since_choices=SINCE_CHOICES, rows=totals_rows(Footprint.from_dict(d).totals),
    )  # fmt: skip


def help_page(req: Request, m: re.Match[str]) -> Answer:
    return render.page(req, "help.html", title="What the figures mean")


# --- query words ------------------------------------------------------------------------------------------


def _format(req: Request) -> str:
    return _choice(req, "format", ("html", "json", "csv"), "html")


def _choice(req: Request, name: str, choices: tuple[str, ...], default: str) -> str:
    v = req.arg(name, default) or default
    if v not in choices:
        raise HttpError(400, f"{name}: expected one of {', '.join(choices)}, got {v[:40]!r}")
    return v


def _int(text: str, lo: int, hi: int, name: str) -> int:
    if not text.isdigit() or not lo <= int(text) <= hi:
        raise HttpError(400, f"{name}: expected a whole number {lo} to {hi}, got {text[:40]!r}")
    return int(text)


def _float(text: str, lo: float, hi: float, name: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise HttpError(400, f"{name}: expected a number of hours, got {text[:40]!r}") from None
    if not lo <= v <= hi:  # (NaN fails both)
        raise HttpError(400, f"{name}: expected {lo:g} to {hi:g} hours, got {text[:40]!r}")
    return v
