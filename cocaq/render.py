"""Terminal, JSON and CSV renderings of footprints (rich for people, JSON/CSV for scripts).

Names, job names, comments and model metadata come from users, so whatever prints them goes through
one of the escapes here:

* `term` for rich: control characters and bidi overrides become `?` (an ANSI escape or a carriage
  return cannot rewrite the terminal), and rich markup such as `[bold]` is shown, not obeyed;
* `csv_cell` for CSV: the same characters as `?`, and a `'` before text that starts with `=`, `+`, `-`,
  `@`, tab or CR, so that a spreadsheet does not run it as a formula;
* `to_json`: the C1 controls, line/paragraph separators and bidi controls, which JSON would carry raw,
  as \\u escapes (the same data).

HTML reports rely on Jinja's autoescape.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import TYPE_CHECKING, Any

from cocaq.footprint import Footprint, equivalents

if TYPE_CHECKING:
    from rich.console import Console

SUMMARY_FIELDS = [
    "jobs",
    "cpu_hours",
    "gpu_hours",
    "energy_kwh",
    "energy_kwh_with_pue",
    "measured_energy_fraction",
    "co2_kg",
    "failed_energy_kwh",
    # what the daily rollups add (after the columns scripts already read)
    "jobs_failed",
    "jobs_cancelled",
    "jobs_timeout",
    "energy_gpu_kwh",
    "energy_cpu_kwh",
    "energy_dram_kwh",
    "energy_other_kwh",
    "energy_measured_kwh",
    "energy_estimated_kwh",
    "gpu_util_pct",
    "idle_gpu_hours",
    "idle_gpu_energy_kwh",
    "co2_embodied_kg",
]


# C0 and C1 controls, DEL, the line/paragraph separators and the bidirectional overrides and isolates
# (which reorder what a terminal shows: "Trojan Source").
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
# What json.dumps leaves raw with ensure_ascii=False (it escapes only \x00-\x1f itself).
_JSON_UNSAFE = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def plain(s: object) -> str:
    """User-supplied text that a terminal shows as text: unsafe characters (see _UNSAFE) become `?`."""
    return _UNSAFE.sub("?", "" if s is None else str(s))


def term(s: object) -> str:
    """`plain`, with rich markup escaped: for text that rich parses (table cells, console.print)."""
    from rich.markup import escape

    return escape(plain(s))


def csv_cell(v: Any) -> str:
    """A CSV value: numbers as `_fmt_csv`; text as `plain` (CSV is often read in a terminal too), and
    with a `'` before it where a spreadsheet would run it as a formula."""
    if not isinstance(v, str):
        return _fmt_csv(v)
    out = plain(v)
    return "'" + out if v.startswith(_FORMULA) else out


def _default(o: Any) -> Any:
    if isinstance(o, datetime):
        return o.isoformat()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def to_json(data: Any) -> str:
    """Indented JSON, non-ASCII kept; the characters in _JSON_UNSAFE as \\u escapes (the same data: in
    json.dumps's output they can only be inside strings)."""
    text = json.dumps(data, indent=2, default=_default, ensure_ascii=False)
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def footprint_csv(fp: Footprint) -> str:
    import csv  # (only CSV output needs it)
    import io

    d = fp.as_dict()
    key = "user" if fp.scope == "user" else "lab"
    cols = [key, "since", "until", *SUMMARY_FIELDS, "rollups_through"]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols)
    w.writerow([csv_cell(d[c]) for c in cols])
    if fp.scope == "account":
        w.writerow([])
        w.writerow(["user", *SUMMARY_FIELDS])
        for m in fp.members:
            w.writerow([csv_cell(m["user"]), *(csv_cell(m[c]) for c in SUMMARY_FIELDS)])
    return buf.getvalue()


def _fmt_csv(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def _kwh(v: float) -> str:
    return f"{v:,.1f} kWh" if v >= 10 else f"{v:,.3f} kWh"


def _kg(v: float) -> str:
    return f"{v:,.1f} kg" if v >= 10 else f"{v:,.3f} kg"


def _source_line(fp: Footprint) -> str:
    """Where the numbers came from, in words."""
    src = fp.source()
    if src["from_jobs"]:
        return "Computed from the jobs table (--from-jobs)."
    if src["rollups_through"] is None:
        return "Computed from the jobs table (the aggregator has not run yet)."
    days = src["rollup_days"]
    if days is None:
        through = src["rollups_through"][:10]
        return f"Computed from the jobs table (no whole day in the window up to {through})."
    return (
        f"Whole days {days['since'][:10]} to {days['until'][:10]} from the daily rollups, the rest from the "
        "jobs table."
    )


def print_footprint(fp: Footprint, console: Console) -> None:
    from rich.table import Table  # only tables need rich; json and csv output stay light

    t = fp.totals
    who = f"user [bold]{term(fp.key)}[/]" if fp.scope == "user" else f"lab [bold]{term(fp.key)}[/]"
    console.print(f"Footprint of {who} from {fp.since:%Y-%m-%d %H:%M} to {fp.until:%Y-%m-%d %H:%M} (UTC)")
    if t.jobs == 0:
        console.print("No jobs ran in this window.")
        return
    tab = Table(show_header=False, box=None, pad_edge=False)
    tab.add_column(style="dim")
    tab.add_column(justify="right")
    ends = ((t.jobs_failed, "failed"), (t.jobs_cancelled, "cancelled"), (t.jobs_timeout, "timed out"))
    outcomes = [f"{n:,} {what}" for n, what in ends if n]
    tab.add_row("jobs", f"{t.jobs:,}" + (f" ({', '.join(outcomes)})" if outcomes else ""))
    tab.add_row("CPU-hours", f"{t.cpu_hours:,.1f}")
    tab.add_row("GPU-hours", f"{t.gpu_hours:,.1f}")
    measured = "" if t.measured_energy_fraction is None else f" ({t.measured_energy_fraction:.0%} measured)"
    tab.add_row("energy", _kwh(t.energy_kwh) + measured)
    parts = [
        f"{name} {_kwh(v)}"
        for name, v in (
            ("GPU", t.energy_gpu_kwh),
            ("CPU", t.energy_cpu_kwh),
            ("memory", t.energy_dram_kwh),
            ("node/other", t.energy_other_kwh),
        )
        if v
    ]
    if parts:
        tab.add_row("  by component", ", ".join(parts))
    tab.add_row("  measured / estimated", f"{_kwh(t.energy_measured_kwh)} / {_kwh(t.energy_estimated_kwh)}")
    tab.add_row("energy incl. cooling (PUE)", _kwh(t.energy_kwh_with_pue))
    tab.add_row("CO2e", _kg(t.co2_kg))
    if t.failed_energy_kwh:
        tab.add_row("on jobs that failed or timed out", _kwh(t.failed_energy_kwh))
    if t.gpu_util_pct is not None:
        tab.add_row("GPU utilisation (energy-weighted)", f"{t.gpu_util_pct:.0f}%")
    if t.idle_gpu_hours or t.idle_gpu_energy_kwh:
        tab.add_row("idle allocated GPUs", f"{t.idle_gpu_hours:,.1f} GPU-h, {_kwh(t.idle_gpu_energy_kwh)}")
    eq = equivalents(t.co2_kg)
    tab.add_row("like driving", f"{eq['car_km']:,.0f} km by car")
    tab.add_row("or charging", f"{eq['smartphone_charges']:,.0f} smartphones")
    if t.co2_embodied_kg:
        tab.add_row("embodied CO2e (hardware, not in CO2e above)", _kg(t.co2_embodied_kg))
    console.print(tab)
    if fp.members:
        m = Table(title="Users", title_justify="left")
        for col in ("user", "jobs", "failed", "GPU-h", "kWh", "kg CO2e", "measured", "GPU util"):
            m.add_column(col, justify="left" if col == "user" else "right")
        for u in fp.members:
            frac = u["measured_energy_fraction"]
            util = u["gpu_util_pct"]
            m.add_row(
                term(u["user"]),
                f"{u['jobs']:,}",
                f"{u['jobs_failed']:,}",
                f"{u['gpu_hours']:,.1f}",
                f"{u['energy_kwh']:,.2f}",
                f"{u['co2_kg']:,.2f}",
                "" if frac is None else f"{frac:.0%}",
                "" if util is None else f"{util:.0f}%",
            )
        console.print(m)
    if fp.top_jobs:
        j = Table(title="Top jobs by energy", title_justify="left")
        for col in ("job", "name", "partition", "state", "hours", "GPUs", "kWh", "kg CO2e", "how"):
            j.add_column(col, justify="right" if col in ("hours", "GPUs", "kWh", "kg CO2e") else "left")
        for tj in fp.top_jobs:
            j.add_row(
                term(tj.job_id),
                term((tj.name or "")[:24]),
                term(tj.partition or ""),
                term(tj.state),
                f"{tj.elapsed_h:,.1f}",
                str(tj.gpus),
                f"{tj.energy_kwh:,.2f}",
                f"{tj.co2_kg:,.2f}",
                "measured" if tj.measured else "estimated",
            )
        console.print(j)
    console.print(f"[dim]{_source_line(fp)}[/]")


def print_job(job: dict[str, Any], console: Console) -> None:
    from rich.table import Table

    console.print(
        f"Job [bold]{term(job['job_id'])}[/] on cluster {term(job['cluster'])}: {term(job['name'] or '')}"
    )
    tab = Table(show_header=False, box=None, pad_edge=False)
    tab.add_column(style="dim")
    tab.add_column()
    facts = [
        ("user", job["user_name"]),
        ("lab (account)", job["account"]),
        ("partition", job["partition"]),
        ("QOS", job["qos"]),
        ("nodes", job["node_list"]),
        ("CPUs", job["alloc_cpus"]),
        ("GPUs", f"{job['alloc_gpus']}" + (f" ({job['gpu_type']})" if job["gpu_type"] else "")),
        ("memory", f"{job['req_mem_mb'] / 1024:,.1f} GB" if job["req_mem_mb"] else None),
        ("submitted", job["submit_time"]),
        ("started", job["start_time"]),
        ("ended", job["end_time"]),
        ("elapsed", f"{job['elapsed_s'] / 3600:,.2f} h"),
        ("state", job["state_detail"] or job["state"] + (" (still running)" if job["is_open"] else "")),
        ("exit code", None if job["exit_code"] is None else f"{job['exit_code']}:{job['exit_signal'] or 0}"),
        ("CPU time", None if job["total_cpu_s"] is None else f"{job['total_cpu_s'] / 3600:,.2f} h"),
    ]
    for k, v in facts:
        if v not in (None, ""):
            tab.add_row(k, term(v))
    console.print(tab)
    e = Table(title="Energy", title_justify="left")
    for col in ("component", "node", "method", "source", "kWh"):
        e.add_column(col, justify="right" if col == "kWh" else "left")
    for row in job["energies"]:
        e.add_row(
            term(row["component"]),
            term(row["node"] or "(all)"),
            term(row["method"]),
            term(row["source"]),
            f"{row['energy_kwh']:,.3f}",
        )
    console.print(e)
    if job.get("gpus"):
        g = Table(title="GPUs (as the node saw them)", title_justify="left")
        for col in ("node", "index", "UUID", "model", "kWh", "source"):
            g.add_column(col, justify="right" if col == "kWh" else "left")
        for row in job["gpus"]:
            kwh = row["energy_kwh"]
            g.add_row(
                term(row["node"]),
                term(row["slurm_index"]),
                term(row["uuid"]),
                term(row["name"] or ""),
                "-" if kwh is None else f"{kwh:,.4f}",
                term(row["source"] or "not measured"),
            )
        console.print(g)
    flag = f" [yellow]({job['carbon_flag']})[/]" if job["carbon_flag"] else ""
    year = f", {job['carbon_year']}" if job["carbon_year"] else ""
    g_kwh = job["carbon_g_per_kwh"]
    console.print(
        f"CO2e: [bold]{_kg(job['co2_kg'])}[/] = {_kwh(job['energy_kwh'])} x PUE {job['pue']:.2f} x "
        f"{'?' if g_kwh is None else f'{g_kwh:.0f}'} g/kWh (zone {job['carbon_zone']}{flag}; "
        f"{job['carbon_source']}{year})"
    )
    m = job.get("metrics")
    if m:
        d = m.get("carbon_detail") or {}
        shares = ", ".join(
            f"{k} {d[k]:.0%}"
            for k in ("series", "nearest", "annual", "world")
            if isinstance(d.get(k), float | int) and d[k]
        )
        if shares:
            console.print(f"[dim]Intensity over the run: {shares} (basis {d.get('basis', '?')})[/]")
        if m["gpu_util_pct"] is not None:
            console.print(
                f"GPU utilisation (energy-weighted): {m['gpu_util_pct']:.0f}%; idle allocated GPUs: "
                f"{m['idle_gpu_hours']:,.2f} GPU-h, {_kwh(m['idle_gpu_energy_kwh'])}"
            )
        if m["co2_embodied_kg"]:
            console.print(f"Embodied (scope 3, not in the CO2e above): {_kg(m['co2_embodied_kg'])}")
    if job.get("assumptions") and job["assumptions"].get("basis") == "estimated from TDP":
        a = job["assumptions"]
        console.print(
            f"[dim]Estimated: CPU {a['cpu_core_seconds'] / 3600:,.2f} core-h ({a['cpu_basis']}) x "
            f"{a['cpu_tdp_w_per_core']} W/core; GPU {a['gpu_tdp_w']} W x {a['gpu_utilisation']:.0%}; memory "
            f"{a['mem_gb']} GB x {a['mem_w_per_gb']} W/GB (profile {a['profile']})[/]"
        )
    if job.get("model"):
        print_model_metadata(job["model"], console)


# The keys of a job's model metadata as `find_jobs` gives them (those of its `sources`), in display order.
MODEL_KEYS = (
    ("model", "model"),
    ("task", "task"),
    ("framework", "framework"),
    ("framework_version", "framework version"),
    ("params", "parameters"),
    ("precision", "precision"),
    ("batch_size", "batch size"),
    ("dataset", "dataset"),
    ("epochs", "epochs"),
    ("tokens", "tokens"),
)


def _meta_value(v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return term(v)
    return f"{v:,}" if isinstance(v, int) else f"{v:,.6g}"


def print_model_metadata(model: dict[str, Any], console: Console) -> None:
    """What the job said it trained or served, each value with where it came from (the job's Slurm
    comment, the in-job API, or what the collector detected)."""
    from rich.table import Table

    sources = model.get("sources") or {}
    t = Table(title="Model metadata", title_justify="left")
    for col in ("key", "value", "source"):
        t.add_column(col)
    for key, label in MODEL_KEYS:
        if model.get(key) is not None:
            t.add_row(label, _meta_value(model[key]), term(sources.get(key, "-")))
    for key, v in sorted((model.get("extra") or {}).items()):
        t.add_row(term(key), _meta_value(v), term(sources.get(key, "-")))
    if t.row_count:
        console.print(t)
