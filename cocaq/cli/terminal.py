"""Terminal, JSON and CSV renderings of footprints (rich for people, JSON/CSV for scripts).

Names, job names, comments and model metadata come from users, so whatever prints them goes through
one of the escapes here:

* `term` for rich: control characters and bidi overrides become `?` (an ANSI escape or a carriage
  return cannot rewrite the terminal), and rich markup such as `[bold]` is shown, not obeyed;
* `csv_cell` for CSV: the same characters as `?`, and a `'` before text that starts with `=`, `+`, `-`,
  `@`, tab or CR, so that a spreadsheet does not run it as a formula (`cocaq.textsafe`, the rule every
  CSV writer follows);
* `to_json`: the C1 controls, line/paragraph separators and bidi controls, which JSON would carry raw,
  as \\u escapes (the same data).

HTML reports rely on Jinja's autoescape.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import TYPE_CHECKING, Any

from cocaq.accounting.ledger import TIMEOUT_STATES
from cocaq.footprint.advice_words import intensity, num, of_member
from cocaq.footprint.totals import Footprint, Totals
from cocaq.footprint.totals_rows import (
    POSSIBLY_LOST_LABEL,
    POSSIBLY_LOST_NOTE,
    estimate_text,
    totals_rows,
)
from cocaq.footprint.totals_rows import co2_text as _kg
from cocaq.footprint.totals_rows import kwh_text as _kwh
from cocaq.footprint.words import (
    BASIS_WORDS,
    COMPONENT_WORDS,
    DRAWN_WORDS,
    INTENSITY_WORDS,
    cooling_words,
    source_words,
)
from cocaq.textsafe import csv_text, plain
from cocaq.units import S_PER_HOUR

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
    # the energy that did no work, in disjoint parts (cocaq.accounting.ledger; idle GPUs and failed above)
    "jobs_oom",
    "oom_energy_kwh",
    "timeout_energy_kwh",
    "cancelled_energy_kwh",
    "wasted_energy_kwh",
    # the range of the estimated part (calibrated GPU estimates, cocaq.accounting.calibrate)
    "energy_estimated_low_kwh",
    "energy_estimated_high_kwh",
    # when to run (cocaq.accounting.shifting): the jobs that could have waited, what their best starts and
    # pausing would have saved
    "shift_co2_kg",
    "shift_saved_kg",
    "shift_pause_saved_kg",
    # the lowest and highest PUE of the window's jobs: what energy_kwh_with_pue multiplied energy_kwh by
    "pue_min",
    "pue_max",
    # jobs whose GPU count Slurm's accounting does not tell, and GPU jobs with Slurm's gres/gpuutil
    "jobs_gpus_unknown",
    "jobs_gpu_slurm",
]


# What json.dumps leaves raw with ensure_ascii=False (it escapes only \x00-\x1f itself).
_JSON_UNSAFE = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def term(s: object) -> str:
    """`plain`, with rich markup escaped: for text that rich parses (table cells, console.print)."""
    from rich.markup import escape

    return escape(plain(s))


def csv_cell(v: Any) -> str:
    """A CSV value: numbers as `_fmt_csv`; text as `cocaq.textsafe.csv_text` (`plain`, and a `'` before
    it where a spreadsheet would run it as a formula)."""
    return csv_text(v) if isinstance(v, str) else _fmt_csv(v)


def _default(o: Any) -> Any:
    if isinstance(o, datetime):
        return o.isoformat()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def to_json(data: Any) -> str:
    """Indented JSON, non-ASCII kept; the characters in _JSON_UNSAFE as \\u escapes (the same data: in
    json.dumps's output they can only be inside strings)."""
    text = json.dumps(data, indent=2, default=_default, ensure_ascii=False)
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


TOP_JOB_FIELDS = [
    "job_id", "cluster", "name", "partition", "state", "start", "elapsed_h", "gpus", "energy_kwh", "co2_kg",
    "measured", "share", "user",
]  # fmt: skip
ADVICE_FIELDS = [
    "id",
    "title",
    "saving_kwh",
    "saving_kg",
    "upper_bound",
    "change",
    "job_ids",
    "basis",
    "body",
]


def footprint_csv(fp: Footprint) -> str:
    """Every section of the table output as CSV, one after the other, each with its header and separated
    by an empty line: the totals; a lab's users and their total; the top jobs; the advice."""
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
            w.writerow([csv_cell(m["user"]), *(csv_cell(m.get(c)) for c in SUMMARY_FIELDS)])
        w.writerow(["(total)", *(csv_cell(d[c]) for c in SUMMARY_FIELDS)])
    if d.get("top_jobs"):
        w.writerow([])
        w.writerow(["top_job_" + c if c == "share" else c for c in TOP_JOB_FIELDS])
        for j in d["top_jobs"]:
            w.writerow([csv_cell(j.get(c)) for c in TOP_JOB_FIELDS])
    advice = [*d.get("advice", []), *([d["when_to_run"]] if d.get("when_to_run") else [])]
    if advice:
        w.writerow([])
        lead = ["user"] if fp.scope == "account" else []
        w.writerow([*lead, *("advice_" + c if c == "id" else c for c in ADVICE_FIELDS)])
        for a in advice:
            row = [a.get(c) for c in ADVICE_FIELDS]
            row = [" ; ".join(v) if isinstance(v, list | tuple) else v for v in row]
            w.writerow([*(csv_cell(a.get("user")) for _ in lead), *(csv_cell(v) for v in row)])
    return buf.getvalue()


def _fmt_csv(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def _source_line(fp: Footprint) -> str:
    """Where the numbers came from, in words."""
    src = fp.source()
    if src["from_jobs"]:
        return "Computed job by job (--from-jobs)."
    if src["rollups_through"] is None:
        return "Computed job by job (the daily totals have not been made yet: `cocaq aggregate`)."
    days = src["rollup_days"]
    if days is None:
        through = src["rollups_through"][:10]
        return f"Computed job by job (the daily totals reach {through}, no whole day of this window)."
    return (
        f"Whole days {days['since'][:10]} to {days['until'][:10]} from the daily totals, the rest job by "
        "job: "
        "the same figures either way."
    )


def print_footprint(fp: Footprint, console: Console) -> None:
    """`cocaq user` and `cocaq lab` as tables: the totals, a lab's users, the top jobs, the advice and
    where the numbers came from."""
    who = f"user [bold]{term(fp.key)}[/]" if fp.scope == "user" else f"lab [bold]{term(fp.key)}[/]"
    console.print(f"Footprint of {who}, {fp.since:%Y-%m-%d %H:%M} to {fp.until:%Y-%m-%d %H:%M} UTC")
    if fp.within is not None:  # a lab head's view of a member
        console.print(f"Only their jobs in {', '.join(term(a) for a in fp.within)} (the labs you head).")
    if fp.totals.jobs == 0:
        console.print("No jobs ran in this window.")
        return
    console.print(_totals_table(fp.totals))
    if fp.members:
        console.print(_members_table(fp, console))
    if fp.top_jobs:
        console.print(_top_jobs_table(fp, console))
    if fp.advice:
        print_advice(fp.advice, console, lab=fp.scope == "account")
    if fp.when_to_run:
        heading = "[bold]When to run[/] (the same work at cleaner hours)"
        print_advice([fp.when_to_run], console, heading=heading)
    console.print(f"[dim]{_source_line(fp)}[/]")


def _totals_table(t: Totals) -> Any:
    """The window's totals, one labelled row each (cocaq.footprint.totals_rows: the web app's too)."""
    from rich.table import Table  # only tables need rich; json and csv output stay light

    tab = Table.grid(padding=(0, 2))
    tab.add_column(style="dim", no_wrap=True)
    tab.add_column(overflow="fold")
    for label, value in totals_rows(t):
        tab.add_row(label, value)
    return tab


def _members_table(fp: Footprint, console: Console) -> Any:
    """A lab's users, one row each."""
    rows = []
    for u in fp.members:
        frac = u["measured_energy_fraction"]
        util = u["gpu_util_pct"]
        rows.append(
            [
                term(u["user"]),
                f"{u['jobs']:,}",
                num(u["gpu_hours"]),
                _num_kwh(u["energy_kwh"]),
                _kg(u["co2_kg"]),
                _num_kwh(u.get("wasted_energy_kwh", 0.0)),
                _num_kwh(u.get("timeout_energy_kwh", 0.0)),
                "" if util is None else f"{util:.0f}%",
                "" if frac is None else f"{frac:.0%}",
            ]
        )
    cols = [("user", 0), ("jobs", 3), ("GPU-h", 2), ("kWh", 0), ("CO2e", 1), ("no work kWh", 2),
            ("time limit kWh", 5), ("GPU use", 3), ("measured", 4)]  # fmt: skip
    return fit_table(console, f"Users (kWh {DRAWN_WORDS})", cols, rows, left=("user",))


def _top_jobs_table(fp: Footprint, console: Console) -> Any:
    """The window's largest jobs by energy: the share of each the window counts only where one is
    partly outside it, and whose job it is in a lab's."""
    rows = []
    for tj in fp.top_jobs:
        rows.append(
            [
                term(tj.job_id),
                term(tj.name or ""),
                term(tj.partition or ""),
                term(tj.state),
                num(tj.elapsed_h),
                "?" if tj.gpus_unknown else num(tj.gpus),
                _num_kwh(tj.energy_kwh),
                _kg(tj.co2_kg),
                "" if tj.share >= 0.9995 else f"{tj.share:.0%}",
                "measured" if tj.measured else "estimated",
            ]
        )
    cols = [
        ("job", 0), ("name", 5), ("partition", 6), ("state", 4), ("hours", 3), ("GPUs", 2), ("kWh", 0),
        ("CO2e", 1), ("in window", 3), ("how", 7),
    ]  # fmt: skip
    title = f"Top jobs by energy (whole jobs, kWh {DRAWN_WORDS}; 'in window': the share this window counts)"
    if all(tj.share >= 0.9995 for tj in fp.top_jobs):
        cols = cols[:8] + cols[9:]
        rows = [r[:8] + r[9:] for r in rows]
        title = f"Top jobs by energy (kWh {DRAWN_WORDS})"
    if fp.scope == "account":  # whose job it is, after its id
        cols.insert(1, ("user", 1))
        for r, tj in zip(rows, fp.top_jobs, strict=True):
            r.insert(1, term(tj.user or ""))
    return fit_table(console, title, cols, rows, left=("job", "user", "name", "partition", "state", "how"))


def _jobs(n: int) -> str:
    return "job" if n == 1 else "jobs"


def _num_kwh(v: float | None) -> str:
    """A kWh figure in a table column (the header says kWh), through num: 1,019 · 87.7 · 0.018."""
    if v is None:
        return ""
    return num(v)


def fit_table(
    console: Console,
    title: str,
    cols: list[tuple[str, int]],
    rows: list[list[str]],
    *,
    left: tuple[str, ...] = (),
    complete: str = "--format csv",
) -> Any:
    """A table that fits the terminal: columns are dropped, least important first (highest `priority`;
    0 never), rather than numbers cut. Once only priority-0 columns are left, text may end in `…` and a
    number that still does not fit folds onto a second line; no digit is ever lost."""
    from rich.table import Table

    keep = list(range(len(cols)))

    def build() -> Table:
        gone = [cols[i][0] for i in range(len(cols)) if i not in keep]
        caption = (
            f"(too narrow for: {', '.join(gone)}; {complete} {'has it' if len(gone) == 1 else 'has them'})"
            if gone
            else None
        )
        t = Table(
            title=title,
            title_justify="left",
            caption=caption,
            caption_justify="left",
            pad_edge=False,
            collapse_padding=True,
        )
        for i in keep:
            name = cols[i][0]
            t.add_column(
                name,
                justify="left" if name in left else "right",
                no_wrap=name in left,
                overflow="ellipsis" if name in left else "fold",  # a number folds, never loses digits
                max_width=24 if name in ("name", "partition") else None,
            )
        for r in rows:
            t.add_row(*(r[i] for i in keep))
        return t

    width = console.width
    wide = console.options.update_width(100_000)  # the table's natural width, not clamped to the screen
    while True:
        table = build()
        if console.measure(table, options=wide).maximum <= width:
            return table
        droppable = [i for i in keep if cols[i][1] > 0]
        if not droppable:
            return table
        keep.remove(max(droppable, key=lambda i: (cols[i][1], i)))


def print_advice(
    items: list[dict[str, Any]], console: Console, *, lab: bool = False, heading: str | None = None
) -> None:
    """What the jobs suggest, largest saving first, each with the exact change (jobstats-style notes)."""
    from rich.padding import Padding
    from rich.table import Table

    if heading is None:
        heading = ("[bold]What you could change[/] (largest saving first)" if not lab else
                   "[bold]What the lab's members could change[/] (each one's largest saving)")  # fmt: skip
    console.print(heading)
    for n, a in enumerate(items, 1):
        # a lab head reads about their members' jobs: "dave could train ...", never the member's "you ran"
        member = a.get("user") if lab else None
        title = (
            f"{term(member)} could [bold]{term(of_member(a['title']))}[/]"
            if member
            else f"[bold]{term(a['title'])}[/]"
        )
        saving = ""
        if a.get("saving_kwh") is not None:
            up = "up to " if a.get("upper_bound") else "about "
            saving = f": {up}{_kwh(a['saving_kwh'])}"
            if a.get("saving_kg"):
                saving += f", {_kg(a['saving_kg'])} CO2e"
        elif a.get("saving_kg"):  # CO2 alone: the same energy at cleaner hours
            saving = f": about {_kg(a['saving_kg'])} CO2e"
        # wrapped lines hang under the title's text, not at the screen's edge
        head = Table.grid()
        head.add_column(width=4, no_wrap=True)
        head.add_column(overflow="fold")
        head.add_row(f"{n:>2}.", f"{title}{saving}")
        console.print(head)
        for line in a.get("change") or ():
            console.print(Padding(f"[cyan]{term(line)}[/]", (0, 0, 0, 4)), overflow="fold")
        body = (
            f"By {term(member)}'s own jobs in this window; `cocaq user {term(member)}` shows them the detail "
            "and how, and their monthly e-mail says the same."
            if member
            else term(a["body"])
        )
        console.print(Padding(f"[dim]{body}[/]", (0, 0, 0, 4)), overflow="fold")


def _gb(mb: float | None) -> str:
    return "?" if mb is None else f"{num(mb / 1024)} GB"


def hms(s: float | None) -> str:
    """A duration as Slurm writes one: [D-]H:MM:SS."""
    if s is None:
        return "-"
    s = int(max(s, 0))
    d, rest = divmod(s, 86400)
    return (f"{d}-" if d else "") + f"{rest // S_PER_HOUR:d}:{rest % S_PER_HOUR // 60:02d}:{rest % 60:02d}"


def running_time_text(elapsed_s: float, limit_s: float | None) -> str:
    """A running job's run time so far, as its live line says it (`RUNNING for 0:54:31 of a 12:00:00
    limit`), to the second: the two never read as two different times."""
    of = f" of a {hms(limit_s)} limit ({elapsed_s / limit_s:.0%})" if limit_s else ""
    return f"{hms(elapsed_s)} so far{of}"


def cpu_time_text(total_cpu_s: float | None, running: bool) -> str:
    """A job's TotalCPU in words: Slurm adds a step's CPU time when the step ends, so a running job's is
    the ended steps' only, and a finished job's None is one Slurm did not record (not zero)."""
    if running:
        done = "none yet" if total_cpu_s is None else _cpu_time(total_cpu_s)
        return f"{done} (Slurm counts a step's CPU time when the step ends)"
    return "not recorded by Slurm" if total_cpu_s is None else _cpu_time(total_cpu_s)


def _cpu_time(seconds: float) -> str:
    """CPU time as people say it: `5 min` under an hour (never `0.0833 h`), else hours: `2,081 h`."""
    if seconds < S_PER_HOUR:
        return f"{round(seconds / 60)} min" if seconds >= 30 else f"{num(seconds)} s"
    return f"{num(seconds / S_PER_HOUR)} h"


def print_job(job: dict[str, Any], console: Console) -> None:
    """`cocaq job` as tables: the job's facts, then (a finished job's) energy by part, what did no work,
    its GPUs, its CO2e and how it was worked out, its model and the notes on it."""
    console.print(
        f"Job [bold]{term(job['job_id'])}[/] on cluster {term(job['cluster'])}: {term(job['name'] or '')}"
    )
    from rich.table import Table

    tab = Table.grid(padding=(0, 2))
    tab.add_column(style="dim", no_wrap=True)
    tab.add_column(overflow="fold")
    for k, v in _job_facts(job):
        if v not in (None, ""):
            tab.add_row(k, term(v))
    console.print(tab)
    if job.get("live"):
        # running: what the collector measured so far (the caller prints it, cocaq.cli.live_view) replaces
        # the import's estimate of the run so far
        return
    console.print(_job_energy_table(job, console))
    pue = 1.0 if job.get("pue") is None else float(job["pue"])
    with_pue = job.get("energy_kwh_with_pue", job["energy_kwh"] * pue)  # (an older API server: none)
    console.print(f"Energy {cooling_words(pue)}: {_kwh(with_pue)}")
    _print_job_waste(job, console)
    if job.get("gpus"):
        console.print(_job_gpus_table(job, console))
    flag = f" [yellow]({term(job['carbon_flag'])})[/]" if job["carbon_flag"] else ""
    year = f", {job['carbon_year']}" if job["carbon_year"] else ""
    g_kwh = job["carbon_g_per_kwh"]
    console.print(
        f"CO2e: [bold]{_kg(job['co2_kg'])}[/] = {_kwh(job['energy_kwh'])} x PUE {pue:.2f} x "
        f"{'? g CO2e/kWh' if g_kwh is None else intensity(g_kwh)} (zone {term(job['carbon_zone'])}{flag}; "
        f"{term(job['carbon_source'])}{year})"
    )
    if job.get("metrics"):
        _print_job_metrics(job, console)
    from cocaq.accounting.estimate import ESTIMATED_BASES

    if job.get("assumptions") and job["assumptions"].get("basis") in ESTIMATED_BASES:
        a = job["assumptions"]
        console.print(
            f"[dim]Estimated: CPU {num(a['cpu_core_seconds'] / S_PER_HOUR)} core-hours ({a['cpu_basis']}) x "
            f"{num(a['cpu_tdp_w_per_core'])} W per core; "
            + (f"GPU {gpu_basis_text(a)}; " if job["alloc_gpus"] else "")  # no GPU power without GPUs
            + f"memory {num(a['mem_gb'])} GB x {a['mem_w_per_gb']} W/GB (profile {term(a['profile'])})[/]"
        )
    if job.get("model"):
        print_model_metadata(job["model"], console)
    notes = job.get("notes") or []
    if notes:
        print_advice(
            notes, console, heading="[bold]Notes[/] (what to change next time, largest saving first)"
        )


def _job_facts(job: dict[str, Any]) -> list[tuple[str, Any]]:
    """The job's facts as (label, value) rows, as sacct would say them (a row with no value is left
    out by the caller); a running job's run time to the second, as its live line says it."""
    usage = job.get("cpu_usage")
    limit = job.get("time_limit_s")
    elapsed = job["elapsed_s"] / S_PER_HOUR
    facts = [
        ("user", job["user_name"]),
        ("lab (account)", job["account"]),
        ("partition", job["partition"]),
        ("QOS", job["qos"]),
        ("nodes", job["node_list"]),
        ("CPUs", num(job["alloc_cpus"]) + (f", {usage:.0%} busy" if usage is not None else "")),
        ("GPUs", gpus_text(job)),
        ("submitted", job["submit_time"]),
        ("started", job["start_time"]),
        ("ended", job["end_time"]),
        (
            "run time",
            f"{num(elapsed)} h"
            + (
                f" of a {num(limit / S_PER_HOUR)} h limit ({elapsed * S_PER_HOUR / limit:.0%})"
                if limit
                else ""
            ),
        ),
        ("state", job["state_detail"] or job["state"] + (" (still running)" if job["is_open"] else "")),
        ("exit code", None if job["exit_code"] is None else f"{job['exit_code']}:{job['exit_signal'] or 0}"),
        ("CPU time", cpu_time_text(job["total_cpu_s"], bool(job["is_open"]))),
    ]
    if job["is_open"]:  # a running job's run time as its live line says it, to the second
        facts = [(k, running_time_text(job["elapsed_s"], limit) if k == "run time" else v) for k, v in facts]
    return facts + _memory_facts(job)


def _memory_facts(job: dict[str, Any]) -> list[tuple[str, Any]]:
    """The memory asked and used, and the GPU memory held (so far, for a running job)."""
    mem = job.get("memory") or {}
    facts: list[tuple[str, Any]] = []
    if mem.get("requested_mb"):
        used = mem.get("used_per_node_mb")
        per_node = mem.get("requested_per_node_mb")
        # a running job's MaxRSS is of the steps that ended (Slurm adds a step's when it ends)
        so_far = (" yet" if used is None else " by the steps that ended so far") if job["is_open"] else ""
        facts.append(
            (
                "memory",
                f"{_gb(per_node)} per node asked"
                + (f", at most {_gb(used)} used (MaxRSS)" if used is not None else ", use not recorded")
                + so_far,
            )
        )
    if mem.get("gpu_peak_mb") is not None:
        total = mem.get("gpu_total_mb")
        by_slurm = (job.get("metrics") or {}).get("gpu_util_source") == "slurm"
        facts.append(
            (
                "GPU memory",
                (
                    f"at most {_gb(mem['gpu_peak_mb'])} held by one task (Slurm gres/gpumem)"
                    if by_slurm
                    else f"at most {_gb(mem['gpu_peak_mb'])} on one GPU"
                )
                + ((f", each GPU {_gb(total)}" if by_slurm else f" of {_gb(total)}") if total else "")
                + (" so far" if job["is_open"] else ""),
            )
        )
    return facts


def _job_energy_table(job: dict[str, Any], console: Console) -> Any:
    """A finished job's energy by part and node, each with its method and source."""
    rows = [
        [
            term(COMPONENT_WORDS.get(row["component"], row["component"])),
            term(row["node"] or "(all)"),
            term(row["method"]),
            term(source_words(row["source"])),
            _num_kwh(row["energy_kwh"]),
        ]
        for row in job["energies"]
    ]
    # the source says the method too (a counter measures, a rated power estimates): method goes first
    cols = [("part", 0), ("node", 2), ("method", 3), ("source", 1), ("kWh", 0)]
    split = ""
    if "energy_estimated_kwh" in job:
        est = estimate_text(
            job["energy_estimated_kwh"], job["energy_estimated_low_kwh"], job["energy_estimated_high_kwh"]
        )
        split = f" ({_kwh(job['energy_measured_kwh'])} measured, {est})"
    return fit_table(
        console,
        f"Energy {DRAWN_WORDS}: {_kwh(job['energy_kwh'])}{split}",
        cols,
        rows,
        left=("part", "node", "method", "source"),
        complete="--format json",
    )


def _print_job_waste(job: dict[str, Any], console: Console) -> None:
    """The job's energy that did no work, by the ledger's parts, and what hitting its time limit
    possibly lost (nothing, for an interactive session)."""
    w = job.get("waste")
    if w and w.get("wasted_kwh"):
        parts = [
            f"{name} {_kwh(w[k])}"
            for k, name in (
                ("idle_gpu_kwh", "idle GPUs"),
                ("failed_kwh", "failed"),
                ("oom_kwh", "out of memory"),
                ("cancelled_kwh", "cancelled"),
            )
            if w.get(k)
        ]
        console.print(f"Did no work: {_kwh(w['wasted_kwh'])} ({', '.join(parts)})")
    if w and w.get("timeout_kwh"):
        console.print(f"{POSSIBLY_LOST_LABEL.capitalize()}: {_kwh(w['timeout_kwh'])} {POSSIBLY_LOST_NOTE}")
    elif w and w.get("interactive") and str(job.get("state") or "").split(" ")[0] in TIMEOUT_STATES:
        console.print("Ended at its time limit: an interactive session, so nothing was lost")


def _job_gpus_table(job: dict[str, Any], console: Console) -> Any:
    """The job's GPUs as the node saw them, each with its energy and source."""
    grows = [
        [
            term(row["node"]),
            term(row["slurm_index"]),
            term(row["uuid"]),
            term(row["name"] or ""),
            "-" if row["energy_kwh"] is None else _num_kwh(row["energy_kwh"]),
            term(source_words(row["source"]) if row["source"] else "not measured"),
        ]
        for row in job["gpus"]
    ]
    gcols = [("node", 0), ("index", 0), ("UUID", 3), ("model", 2), ("kWh", 0), ("source", 1)]
    return fit_table(
        console,
        "GPUs (as the node saw them)",
        gcols,
        grows,
        left=("node", "UUID", "model", "source"),
        complete="--format json",
    )


def _print_job_metrics(job: dict[str, Any], console: Console) -> None:
    """What the aggregator worked out of a finished job: the carbon intensity's sources over the run,
    its GPU utilisation and idle GPUs, the embodied CO2e and when it could have run."""
    m = job["metrics"]
    w = job.get("waste")
    d = m.get("carbon_detail") or {}
    shares = ", ".join(
        f"{INTENSITY_WORDS[k]} for {d[k]:.0%} of it"
        for k in ("series", "nearest", "annual", "world")
        if isinstance(d.get(k), float | int) and d[k]
    )
    if shares:
        basis = BASIS_WORDS.get(str(d.get("basis")), str(d.get("basis", "?")))
        console.print(f"[dim]Carbon intensity over the run: {shares} ({basis}).[/]")
    if m["gpu_util_pct"] is not None:
        how = (
            "per GPU, the mean over the run by Slurm gres/gpuutil"
            if m.get("gpu_util_source") == "slurm"
            else "energy-weighted"
        )
        console.print(
            f"GPU utilisation: {m['gpu_util_pct']:.0f}% ({how}); GPUs idle "
            f"{num(m['idle_gpu_hours'])} GPU-hours, drawing "
            f"{_kwh((w or {}).get('idle_gpu_kwh', m['idle_gpu_energy_kwh']))}"
        )
    if m["co2_embodied_kg"]:
        embodied = _kg(m["co2_embodied_kg"])
        console.print(f"Embodied CO2e (making the hardware; not in the CO2e above): {embodied}")
    when = when_to_run_line(m.get("when_to_run"), job.get("start_time"), job["co2_kg"])
    if when:
        console.print(when)


def gpus_text(job: dict[str, Any]) -> str | None:
    """The GPUs line of `cocaq job`: the count and model, or why the count is not known."""
    gpus = job["alloc_gpus"]
    if gpus:
        return f"{gpus}" + (f" ({job['gpu_type']})" if job["gpu_type"] else "")
    if not job.get("gpus_unknown"):
        return None
    used = job.get("slurm_gpu_util")
    if used:
        return (
            "unknown: none in the job's TRES, yet Slurm's gres/gpuutil says it used GPUs "
            f"({used:,.0f}% of one GPU over the run); they are not in its energy"
        )
    return (
        f"unknown: none in the job's TRES, and cluster {job['cluster']}'s accounting records no GPUs (no "
        "gres/gpu in AccountingStorageTRES); on a GPU partition, so its GPUs are not in its energy"
    )


def when_to_run_line(w: dict[str, Any] | None, start: Any, co2_kg: float) -> str | None:
    """A finished job's when-to-run figures in one sentence (cocaq.accounting.shifting), or None."""
    if not w or w.get("state") not in ("ok", "pending"):
        return None
    slack = f"{w['slack_h']:,.0f} h" if w.get("slack_h") else "its slack"
    if w["state"] == "pending":
        return (
            f"[dim]When to run: not known yet (the hourly intensity does not cover the {slack} after its "
            "start; the aggregator works it out after the next `cocaq carbon import`).[/]"
        )
    saved, paused = w.get("saved_kg") or 0.0, w.get("pause_saved_kg") or 0.0
    if saved <= 0 or not w.get("best_start") or not co2_kg:
        return f"When to run: it started at the cleanest time within {slack}: no later start emits less."
    best = datetime.fromisoformat(w["best_start"])
    try:
        began = datetime.fromisoformat(str(start))
        later = f" ({num((best - began).total_seconds() / S_PER_HOUR)} h later)"
    except (TypeError, ValueError):
        later = ""
    return (
        f"When to run: started at {best:%Y-%m-%d %H:%M} UTC{later}, within {slack}, it would have emitted "
        f"{saved / co2_kg:.0%} less ({_kg(saved)}); run in the cleanest hours of that window (pausing), "
        f"{paused / co2_kg:.0%} less."
    )


def gpu_basis_text(a: dict[str, Any]) -> str:
    """What a job's GPU estimate rests on, from its assumptions (cocaq.accounting.calibrate's basis
    labels)."""
    basis = a.get("gpu_basis")
    util = a.get("gpu_util_slurm_pct")
    at = f" at {util:.0f}% utilisation by Slurm gres/gpuutil" if isinstance(util, int | float) else ""
    if basis == "slurm-gpuutil-rated":
        return f"{a.get('gpu_w', 0):,.0f} W per GPU{at} ({term(a.get('gpu_cell'))})"
    from cocaq.footprint.words import MEASURED_BY

    whose = MEASURED_BY.get(str(basis))
    if whose:
        lo, hi = (a.get("gpu_w_range") or [None, None])[:2]
        rng = (
            f" (10-90%: {lo:,.0f}-{hi:,.0f} W)"
            if isinstance(lo, int | float) and isinstance(hi, int | float)
            else ""
        )
        cell = term(a.get("gpu_cell"))
        return f"{a.get('gpu_w', 0):,.0f} W per GPU{at}{rng}, what {whose} drew: {cell}"
    tdp = f"{a.get('gpu_tdp_w')} W x {a.get('gpu_utilisation', 1.0):.0%}"
    return tdp + (f" (rated power; {term(a['gpu_cell'])})" if a.get("gpu_cell") else " (rated power)")


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
