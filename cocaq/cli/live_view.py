"""How a running job looks in the terminal: `cocaq watch`'s view and the "now" part of `cocaq job`.

The views are cocaq.footprint.live's dicts, from the database or the read API alike.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from cocaq.units import J_PER_KWH

SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float | None]) -> str:
    """Unicode blocks scaled from 0 to the largest value (power has a natural zero); a gap is a space."""
    top = max((v for v in values if v is not None), default=0.0)
    out = []
    for v in values:
        if v is None:
            out.append(" ")
        elif top <= 0:
            out.append(SPARK[0])
        else:
            out.append(SPARK[min(int(v / top * (len(SPARK) - 1) + 0.5), len(SPARK) - 1)])
    return "".join(out)


def _clock(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts).astimezone().strftime("%H:%M:%S")


def _hms(s: float | None) -> str:
    from cocaq.cli.terminal import hms  # (one formatting for `cocaq job`'s run time and this view's)

    return hms(s)


def _date_time(ts: float) -> str:
    """A moment hours or days away, with its date and zone: a bare 00:49:27 reads as a duration."""
    return datetime.fromtimestamp(ts).astimezone().strftime("%Y-%m-%d %H:%M %Z")


def _span(s: float) -> str:
    return f"{s / 60:.0f} min" if s >= 90 else f"{s:.0f} s"


def _w(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f} W"


def live_renderable(v: dict[str, Any], console: Any, header: bool = True) -> Any:
    """One job's live view as rich renderables (a Group); without the job's name line for `cocaq job`."""
    from rich.console import Group

    lines: list[Any] = [_job_line(v)] if header else []
    lines.append(_state_line(v))
    if v["running"]:
        lines += _power_lines(v, console)
    lines += _so_far_lines(v)
    lines += [t for t in (_parts_table(v, console), _gpus_table(v, console)) if t is not None]
    sample = _sample_line(v)
    if sample is not None:
        lines.append(sample)
    return Group(*lines)


def _job_line(v: dict[str, Any]) -> Any:
    """Job 123 (alice, lab, partition) on cluster: `cocaq watch`'s first line."""
    from rich.text import Text

    from cocaq.cli.terminal import term

    who = ", ".join(str(x) for x in (v.get("user"), v.get("account"), v.get("partition")) if x)
    return Text.assemble(
        ("Job ", ""),
        (str(v["job_id"]), "bold"),
        (f" ({term(who)})" if who else "", ""),
        (f" on {term(v['cluster'])}", ""),
    )


def _state_line(v: dict[str, Any]) -> Any:
    """RUNNING for 0:54:31 of a 12:00:00 limit (or the state it ended in, after how long)."""
    from rich.text import Text

    limit = v.get("time_limit_s")
    run = f"{_hms(v['elapsed_s'])}" + (f" of a {_hms(limit)} limit" if limit else "")
    return Text.assemble(
        (v["state"], "bold green" if v["running"] else "bold"),
        (f" for {run}" if v["running"] else f" after {run}", ""),
    )


def _power_lines(v: dict[str, Any], console: Any) -> list[Any]:
    """A running job's power and its parts (a rated-power estimate said as such, never as "now"), and
    the GPUs' recent power as a sparkline that fits the terminal."""
    from rich.text import Text

    from cocaq.footprint.words import COMPONENT_WORDS

    lines: list[Any] = []
    gpu_now = [g["power_w"] for g in v["gpus"] if g["power_w"] is not None]
    parts, estimates = [], []
    if gpu_now:
        parts.append(f"GPUs {_w(sum(gpu_now))} measured")
    for p in v["parts"]:
        word = COMPONENT_WORDS.get(p["component"], p["component"])
        if p["component"] != "gpu" and p["power_w"] is not None:
            parts.append(f"{word} {_w(p['power_w'])} {p['method']} ({p['power_basis']})")
        elif p["component"] == "gpu" and p["method"] == "estimated" and p["power_w"]:
            parts.append(f"GPUs {_w(p['power_w'])} estimated (rated power)")
        else:
            continue
        if p["method"] == "estimated":
            estimates.append(f"{word} {_w(p['power_w'])}")
    est_w = v.get("power_estimated_w") or 0.0
    if estimates and len(estimates) == len(parts):  # a rated-power estimate is not the power "now"
        power = f"Power, estimated from rated power (none of it measured): {_w(v['power_w'])} = "
        lines.append(Text(power + "; ".join(estimates)))
    elif est_w:
        power = f"Power: {_w(v['power_w'])}, {_w(est_w)} of it estimated from rated power"
        lines.append(Text(power + f" = {'; '.join(parts)}"))
    else:
        lines.append(Text(f"Power now: {_w(v['power_w'])}" + (f" = {'; '.join(parts)}" if parts else "")))
    series = [w for _, w in v.get("power_series") or []]
    if any(w is not None for w in series):
        peak = max(w for w in series if w is not None)
        width = max(min(len(series), console.width - 34), 8)
        step = len(series) / width
        cut = [series[min(int(i * step), len(series) - 1)] for i in range(width)]
        lines.append(
            Text(f"GPU power, last {_span(v.get('power_series_span_s') or v['window_s'])}: ")
            + Text(sparkline(cut), style="cyan")
            + Text(f" max {_w(peak)}")
        )
    return lines


def _so_far_lines(v: dict[str, Any]) -> list[Any]:
    """The energy and CO2e so far (measured and estimated, as of when), the projection to the time
    limit and what could not be estimated."""
    from rich.text import Text

    from cocaq.cli.terminal import _kg, _kwh, term
    from cocaq.footprint.advice_words import intensity

    measured, est = v["energy_measured_kwh"], v["energy_estimated_kwh"]
    split = (
        f" ({_kwh(measured)} measured, {_kwh(est)} estimated)"
        if measured and est
        else (" (measured)" if measured else " (estimated)" if est else "")
    )
    as_of = max((p["as_of_ts"] for p in v["parts"] if p["method"] == "measured"), default=None)
    when = ""
    if as_of is not None:
        when = f", as of {_clock(as_of)}" + (f" ({v['now_ts'] - as_of:,.0f} s ago)" if v["running"] else "")
    c = v["carbon"]
    lines: list[Any] = [
        Text(f"Energy so far: {_kwh(v['energy_kwh'])}{split}{when}"),
        Text(
            f"CO2e so far: {_kg(v['co2_kg'])} = {_kwh(v['energy_kwh'])} x PUE {c['pue']:.2f} x "
            f"{intensity(c['g_per_kwh'])} (zone {term(c['zone'])})"
        ),
    ]
    pr = v.get("projection")
    if pr:
        lines.append(
            Text(
                f"At its time limit, {_date_time(pr['until_ts'])}: {_kwh(pr['energy_kwh'])}, "
                f"{_kg(pr['co2_kg'])} CO2e, estimated ({pr['basis']})",
                style="dim",
            )
        )
    if v.get("estimate_note"):
        lines.append(Text(f"Not estimated: {v['estimate_note']}", style="dim"))
    return lines


def _parts_table(v: dict[str, Any], console: Any) -> Any:
    """The energy so far by part, each measured or estimated and how; None without parts."""
    from cocaq.cli.terminal import _kwh, fit_table, term
    from cocaq.footprint.words import COMPONENT_WORDS

    rows = [
        [
            term(COMPONENT_WORDS.get(p["component"], p["component"])),
            term(p["method"]),
            term(p["basis"]),
            _kwh(p["energy_j"] / J_PER_KWH),
        ]
        for p in v["parts"]
    ]
    if not rows:
        return None
    return fit_table(
        console,
        "Energy so far by part",
        [("part", 0), ("method", 0), ("how", 1), ("energy", 0)],
        rows,
        left=("part", "method", "how"),
        complete="--format json",
    )


def _gpus_table(v: dict[str, Any], console: Any) -> Any:
    """Each GPU's power, utilisation (now and its mean over the window), memory and energy so far;
    None without GPUs."""
    from cocaq.cli.terminal import _kwh, fit_table, term
    from cocaq.footprint.words import source_words

    if not v["gpus"]:
        return None
    span = v.get("power_series_span_s") or v["window_s"]
    grows = []
    for g in v["gpus"]:
        util = "-" if g["util_pct"] is None else f"{g['util_pct']:.0f}%"
        if g["util_pct_mean"] is not None:
            util += f" ({g['util_pct_mean']:.0f}%)"
        mem = "-" if g["mem_used_mb"] is None else f"{g['mem_used_mb'] / 1024:,.1f} GB"
        grows.append(
            [
                term(g["node"]),
                term("" if g["index"] is None else g["index"]),
                _w(g["power_w"]),
                util,
                mem,
                "-" if g["energy_j"] is None else _kwh(g["energy_j"] / J_PER_KWH),
                term(source_words(g["source"]) if g["source"] else "not measured"),
                term(g["uuid"]),
            ]
        )
    cols = [("node", 2), ("GPU", 0), ("power", 0), ("util", 0), ("memory", 1), ("energy", 0), ("source", 3),
            ("UUID", 4)]  # fmt: skip
    return fit_table(
        console,
        f"GPUs (utilisation now, and its mean over the last {_span(span)})",
        cols,
        grows,
        left=("node", "source", "UUID"),
        complete="--format json",
    )


def _sample_line(v: dict[str, Any]) -> Any:
    """A running job's last word: how fresh its samples are, or why there are none (a collector that
    stopped is not one that never shipped); None for a job that no longer runs."""
    from rich.text import Text

    if not v["running"]:
        return None
    measured_any = any(p["method"] == "measured" for p in v["parts"])
    if v.get("newest_sample_ts") is not None:
        sample_age = v["now_ts"] - v["newest_sample_ts"]
        return Text(f"Newest sample: {_clock(v['newest_sample_ts'])} ({sample_age:,.0f} s ago)", style="dim")
    if v.get("last_sample_ts") is not None:
        # samples came, then stopped: not "nothing measured" (the GPU memory above came from them)
        last = v["last_sample_ts"]
        est = "" if measured_any else "; the power and energy so far are estimates from rated power"
        return Text(
            f"No sample in the last {_span(v['window_s'])}: the newest is from {_clock(last)} "
            f"({_span(v['now_ts'] - last)} ago): its node's collector may have stopped or be late to "
            f"ship{est}.",
            style="dim",
        )
    if not measured_any:
        return Text(
            "Nothing measured yet: no collector has shipped samples of this job (they come with its "
            "node's next shipment, every [collector] ship_interval_s, where `cocaq collector` runs); "
            "the figures above are estimates from rated power.",
            style="dim",
        )
    return Text("No GPU samples in the window.", style="dim")


def print_live(v: dict[str, Any], console: Any, header: bool = True) -> None:
    console.print(live_renderable(v, console, header=header))


def summary_renderable(views: list[dict[str, Any]], console: Any, user: str) -> Any:
    """All of a user's running jobs, one row each."""
    from rich.console import Group
    from rich.text import Text

    from cocaq.cli.terminal import _kg, _kwh, fit_table, term

    running = [v for v in views if v["running"]]
    if not running:
        return Text(f"None of {user}'s jobs is running (as far as the collectors have shipped).")
    rows = []
    for v in running:
        util = [g["util_pct_mean"] for g in v["gpus"] if g["util_pct_mean"] is not None]
        series = [w for _, w in v.get("power_series") or []][-20:]
        rows.append(
            [
                term(v["job_id"]),
                term(v.get("account") or ""),
                _hms(v["elapsed_s"]),
                _w(v["power_w"]),
                f"{sum(util) / len(util):.0f}%" if util else "-",
                _kwh(v["energy_kwh"]),
                _kg(v["co2_kg"]),
                sparkline(series) if any(w is not None for w in series) else "",
            ]
        )
    total_w = sum(v["power_w"] or 0.0 for v in running)
    est_w = sum(v.get("power_estimated_w") or 0.0 for v in running)
    table = fit_table(
        console,
        f"{user}'s running jobs: {len(running)}, drawing {_w(total_w)}"
        + (
            " now"
            if not est_w
            else " (estimated from rated power: none of it measured)"
            if est_w >= total_w - 0.5
            else f" ({_w(est_w)} of it estimated from rated power)"
        ),
        [
            ("job", 0),
            ("lab", 3),
            ("run time", 1),
            ("power", 0),
            ("GPU util", 2),
            ("energy", 0),
            ("CO2e", 0),
            ("recent power", 4),
        ],
        rows,
        left=("job", "lab", "recent power"),
        complete="--format json",
    )
    return Group(table, Text("cocaq watch JOBID for one job's GPUs and parts; Ctrl-C to stop", style="dim"))
