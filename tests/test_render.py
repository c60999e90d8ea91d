"""The rendered reports (reports/render.py, reports/charts.py, reports/templates/, `cocaq report`).

Built on the hand-made month of tests/test_report_data.py (March 2025: alice's idle notebook, a two-GPU
job with one idle GPU, failed and timed-out jobs, an intensity series for part of the month, two PUEs,
embodied CO2, model metadata), on SQLite and PostgreSQL. What is checked is what a reader relies on:
the figures of the data layer appear, each with its basis; names from users cannot inject markup; the
HTML fits a phone; the .eml parses back with its charts; sites can replace templates.
"""

from __future__ import annotations

import email
import email.policy
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from cocaq.cli.report import parse_month
from cocaq.config import Config
from cocaq.config_load import load_config
from cocaq.db.engine import make_engine
from cocaq.errors import ConfigError
from cocaq.footprint.advice_words import co2_amount, lower_first
from cocaq.reports import admin_report, charts, data, job_report, lab_report, render, user_report, wording
from cocaq.reports.files import write_email
from cocaq.reports.message import PNG_MAGIC
from cocaq.reports.suggest import suggest_for_user
from tests.conftest import migrated_database, run_cocaq
from tests.test_report_data import MONTH, at, build_month, config

XSS_SCRIPT = "<script>alert(1)</script>"
XSS_ATTR = '"><img src=x onerror=alert(1)>'


@dataclass
class Month:
    engine: Engine
    cfg: Config
    url: str
    tmp: Path
    user: data.UserMonth
    lab: data.LabMonth
    admin: data.AdminMonth
    jobs: list[data.JobReport]


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def month(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Month]:
    tmp = tmp_path_factory.mktemp(f"render-{request.param}")
    url = migrated_database(request.param, tmp, request)
    engine = make_engine(url)
    cfg = config(
        tmp,
        url,
        '[reports]\nsite_name = "HAL"\ncontact = "hpc-help@example.org"\n'
        "[advice]\nmin_kwh = 0.1\n",  # a month of a few kWh: a tenth of a kWh is worth a line here
    )
    build_month(engine, cfg)
    first = {"alice": at(15, 12), "bob": at(8, 6)}
    with engine.connect() as conn:
        user = user_report.user_month(conn, cfg, "alice", MONTH)
        lab = lab_report.lab_month(conn, cfg, "lab_a", MONTH)
        admin = admin_report.admin_month(conn, cfg, MONTH, first_report=first, window_days=7)
        pks = dict(conn.execute(text("SELECT job_id_raw, id FROM jobs")).all())
        jobs = [job_report.job_footprint(conn, cfg, pks[raw]) for raw in (101, 102, 502)]
    yield Month(engine, cfg, url, tmp, user, lab, admin, jobs)
    engine.dispose()


def plain(html: str) -> str:
    """The HTML's text, tags removed and entities kept (what a reader sees, roughly)."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


# --- content ------------------------------------------------------------------------------------------


def test_user_email_says_the_months_figures_and_their_basis(month: Month) -> None:
    m = month.user
    # every suggestion, however small (a real e-mail leaves out those under [advice] min_share and min_kwh)
    every = replace(month.cfg, advice=replace(month.cfg.advice, min_share=0.0, min_kwh=0.0))
    suggestions = suggest_for_user(m, every)
    floor = max(month.cfg.advice.min_kwh, month.cfg.advice.min_share * m.totals.energy_kwh)
    assert suggest_for_user(m, month.cfg) == [s for s in suggestions if (s.saving_kwh or 0) >= floor]
    assert len(suggestions) > len(suggest_for_user(m, month.cfg)) > 0  # the floor keeps some, drops some
    r = render.render_user_month(m, suggestions, every)
    t = m.totals
    # the subject and the e-mail open with the largest saving, computed from her own jobs
    first = suggestions[0]
    assert r.subject.startswith(
        f"[HAL] Save {'up to' if first.upper_bound else 'about'} {wording.kwh(first.saving_kwh)}: "
    )
    assert r.subject.endswith(f"(your March 2025: {wording.kwh(t.energy_kwh)})")
    assert r.text.split("\n\n")[1].startswith(
        f"Hello alice, the one change worth making: {lower_first(first.title)}."
    )
    tr = m.trend
    for part in (r.text, plain(r.html)):
        for figure in (
            wording.kwh(t.energy_kwh),  # energy
            wording.co2(t.co2_kg),  # CO2
            f"{wording.num(m.equivalents.car_km)} km",  # an everyday equivalent
            wording.num(t.gpu_hours),  # GPU-hours
            wording.pct(t.gpu_util_pct),  # energy-weighted utilisation
            wording.trend(tr.gpu_hours, "neutral", "February").text,  # per day: 17/31 GPU-hours against 9/24
            "up 46% per day on February",
            wording.peer_text(m.peers),  # peers, as people say ranks
            f"{wording.num(t.idle_gpu_hours)} GPU-hours",  # idle allocated GPUs: GPU-hours, kWh, CO2
            wording.kwh(t.idle_gpu_kwh),
            wording.co2(t.idle_co2_kg),
            wording.kwh(t.failed_kwh),  # failed jobs: kWh and CO2
            wording.co2(t.failed_co2_kg),
            wording.co2(t.co2_embodied_kg),  # embodied, apart
            "not included",
        ):
            assert figure in part, figure
        # the basis: measured share, zone, sources and fallbacks, PUE range, idle threshold, freshness
        for basis in ("0% measured, 100% estimated", "FR ", "test series", "annual-fallback", "PUE 1.20-1.50",
                      "under 5% utilisation", "Data through"):  # fmt: skip
            assert basis in part, basis
        # top jobs and nearly idle jobs, with ids and dates
        assert "102 notebook" in part and "10 Mar" in part and "101 two-gpus" in part and "3 Mar" in part
        # the suggestion with its evidence and saving
        (s,) = [x for x in suggestions if x.id == "fewer-gpus"]
        flat = " ".join(part.split())
        assert s.title in flat and wording.saving_text(s) in flat and " ".join(s.change[0].split()) in flat
        assert "101: 1 of its 2 GPUs idle" in part  # which GPU, from the per-GPU samples
    assert "Questions or corrections: hpc-help@example.org" in r.text
    # her models, and what bf16 did to the energy per epoch of her llama-7b runs (one sentence)
    (c,) = m.model_comparisons
    tip = wording.model_tip(m.model_comparisons)
    assert tip == (
        f"Your llama-7b runs in bf16 at batch size 32 used {wording.kwh(c.best.kwh_per_unit)} per epoch, "
        f"{(1 - c.best.kwh_per_unit / c.worst.kwh_per_unit) * 100:.0f}% less than in fp32."
    )
    for part in (r.text, plain(r.html)):
        assert "Your models" in part or "YOUR MODELS" in part
        assert tip in part and "bert-base" in part and "pytorch" in part
        assert wording.kwh(m.models[0].energy_kwh) in part or wording.num(m.models[0].energy_kwh) in part
    # without a comparison, the models but no sentence; without metadata, no section
    r2 = render.render_user_month(replace(m, model_comparisons=()), [], month.cfg)
    assert "llama-7b" in r2.text and "Precision and batch size" not in r2.text + r2.html
    r3 = render.render_user_month(replace(m, models=(), model_comparisons=()), [], month.cfg)
    assert "YOUR MODELS" not in r3.text and "Your models" not in r3.html
    # the daily chart: attached once, shown by Content-ID
    assert [cid for cid, _ in r.images] == ["daily"] and r.images[0][1].startswith(PNG_MAGIC)
    assert 'src="cid:daily"' in r.html


def test_lab_email_has_its_users_models_idle_waste_and_weeks(month: Month) -> None:
    m = month.lab
    r = render.render_lab_month(m, month.cfg)
    a = m.advice[0]
    assert r.subject.startswith(f"[HAL] lab_a, March 2025: {a.user} could save ")  # the largest saving first
    page = plain(r.html)
    for part in (r.text, page):
        assert f"The largest saving in your lab: {a.user} could" in part
        assert wording.kwh(m.totals.energy_kwh) in part and wording.co2(m.totals.co2_kg) in part
        assert wording.trend(m.trend.gpu_hours, "neutral", "February").text in part  # trend, per day
        for u in m.users:
            assert u.user in part and wording.num(u.energy_kwh) in part
        assert "llama-7b" in part and "bert-base" in part and "pytorch" in part  # models
        assert "35%" in part  # alice's idle share of her GPU-hours (6 of 17)
        assert "PUE 1.20-1.50" in part and "test series" in part
    assert {cid for cid, _ in r.images} == {"weekly", "users"}
    assert all(f'src="cid:{cid}"' in r.html for cid, _ in r.images)
    assert "3 Mar-9 Mar" in r.text  # ISO weeks clipped to the month


def test_admin_email_covers_the_site(month: Month) -> None:
    m = month.admin
    r = render.render_admin_email(m, month.cfg)
    assert r.subject.startswith("[HAL] Site report March 2025 (all clusters): ")
    cids = [cid for cid, _ in r.images]
    assert cids == [
        "labs", "partitions", "weeks", "util", "idle", "intensity", "carbon_week_0", "shift", "models",
        "waste_trend", "before-after",
    ]  # fmt: skip
    assert all(f'src="cid:{cid}"' in r.html and png.startswith(PNG_MAGIC) for cid, png in r.images)
    for part in (r.text, plain(r.html)):
        assert wording.kwh(m.totals.energy_kwh) in part
        for g in m.by_lab:  # energy and CO2 by lab
            assert g.key in part and wording.num(g.energy_kwh) in part
            assert wording.co2(g.co2_kg) in part or co2_amount(g.co2_kg) in part  # a sentence, or a CO2e cell
        for c in m.coverage:  # measured vs estimated by partition
            assert wording.num(c.estimated_kwh) in part
        for g in m.by_partition:  # the cost of a GPU-hour, by partition
            if g.gpu_hours > 0:
                assert wording.num(1000 * g.co2_kg / g.gpu_hours) in part, g.key
        assert "carol" in part  # top user
        assert "90-100%" in part  # utilisation distribution
        assert "alice" in part and "lab_a" in part  # idle waste ranking, failed energy by lab
        assert "TIMEOUT" in part and "time limit" in part  # how jobs ended: time-outs apart from failures
        assert "The largest lever this month" in part and m.advice[0].label in part
        assert "FR" in part and wording.num(m.intensity[0].g_per_kwh) in part  # intensity used
        assert "not a controlled effect" in part  # before/after, and what it is not
        for x in m.models:  # energy and CO2 by model
            assert x.model_name in part and wording.num(x.energy_kwh) in part
        assert "ML models" in part or "ML MODELS" in part
    ba = m.before_after
    assert ba is not None and wording.share(ba.idle_share_before) in r.text
    assert "80%" in r.text and "idle 80% -> 0%" in r.text  # alice: idle share before -> after


def test_admin_interactive_page_is_standalone(month: Month) -> None:
    page = render.render_admin_html(month.admin, month.cfg)
    assert page.startswith("<!DOCTYPE html>")
    # plotly.js is inside the page (a script without src), and the page around it loads nothing
    scripts = re.findall(r"<script([^>]*)>(.*?)</script>", page, re.S)
    assert all("src" not in attrs for attrs, _ in scripts)
    bundle = max((body for _, body in scripts), key=len)
    assert len(bundle) > 1_000_000 and "Plotly" in bundle  # plotly.js itself, embedded
    outside = page.replace(bundle, "")
    assert not re.search(r"<(script|link|img|iframe)[^>]*\b(src|href)\s*=", outside, re.I)
    assert "http://" not in outside and "https://" not in outside  # not even a link in our own markup
    for name in ("labs", "partitions", "weeks", "util", "idle", "intensity", "carbon_week_0", "shift",
                 "models", "waste_trend", "before-after"):  # fmt: skip
        assert f'id="chart-{name}"' in page, name
    assert outside.count("Plotly.newPlot") == 11 and "llama-7b" in outside
    assert "observational, not a controlled effect" in outside and "carol" in outside


def test_job_footprint_one_and_digest(month: Month) -> None:
    j101, j102, j502 = month.jobs
    one = render.render_jobs([j101], month.cfg)
    # the subject names the one change the job's own figures back, and what it would have saved
    n = j101.notes[0]
    assert n.saving_kwh and "GPU" in n.title
    assert one.subject == (
        f"[HAL] Job 101 (two-gpus): {wording.kwh(j101.energy_kwh)}; next time {n.title[0].lower()}{n.title[1:]}"
        f" ({'up to' if n.upper_bound else 'about'} {wording.kwh(n.saving_kwh)} less)"
    )
    plain_job = render.render_jobs([replace(j101, notes=())], month.cfg)  # nothing to change: the footprint
    assert plain_job.subject == (
        f"[HAL] Job 101 (two-gpus): {wording.kwh(j101.energy_kwh)}, {wording.co2(j101.co2_kg)}"
    )
    for part in (one.text, plain(one.html)):
        assert re.search(r"GPUs:? 1\.6\b", part) and re.search(r"CPUs:? (40 Wh|0\.04)\b", part)  # components
        assert "estimated" in part  # and the method
        assert "x PUE 1.20 x 23 g CO2e/kWh (FR, test series" in part  # CO2 and its basis
        assert wording.co2(j101.co2_embodied_kg) in part and "apart" in part  # embodied apart
        assert "75%" in part and wording.kwh(j101.idle_kwh) in part  # GPU use and idle
        # idle time of several GPUs is GPU-hours, and says so (it read "idle 14 h" for 14 GPU-hours of 32 GPUs)
        assert re.search(rf"idle\b[^.]*? {re.escape(wording.num(j101.idle_gpu_hours))} GPU-hours", part), part
        assert "estimate from rated power" in part  # the source, in words
        # notes: the line to change; its time limit is sized on the user's runs of the kind, and this is
        # the only one (issue 32): no --time from one run
        assert "#SBATCH --gres=gpu:1" in part and "a few more completed runs" in part
        assert "#SBATCH --time=" not in part
    assert one.images == () and "<a " not in one.html and "<img" not in one.html  # link- and image-free
    digest = render.render_jobs([j102, j101, j502], month.cfg)
    assert digest.subject.startswith("[HAL] 3 jobs: ")
    assert digest.text.index("- 102") < digest.text.index("- 101")  # most energy first
    assert "Not final yet" in digest.text and "still RUNNING" in digest.text  # the running job says so
    assert "<a " not in digest.html and "<img" not in digest.html
    with pytest.raises(ValueError):
        render.render_jobs([], month.cfg)


# --- safety --------------------------------------------------------------------------------------------


def test_names_from_users_are_text_in_html_and_plain_text(month: Month) -> None:
    m = month.user
    top = [replace(month.user.top_jobs[0], name=XSS_SCRIPT), replace(month.user.top_jobs[1], name=XSS_ATTR)]
    idle = [replace(month.user.idle_jobs[0], name="\x1b[31mred\x1b[0m\r\nBcc: x@example.org")]
    # model names come from job comments and `cocaq tag`: anything at all
    models = (replace(m.models[0], model_name=XSS_SCRIPT, framework="\x1b[31mred"), *m.models[1:])
    comparisons = (replace(m.model_comparisons[0], model=XSS_ATTR),)
    evil = replace(m, user=XSS_ATTR, top_jobs=(*top, *m.top_jobs[2:]), idle_jobs=tuple(idle), models=models,
                   model_comparisons=comparisons)  # fmt: skip
    lab = month.lab
    evil_lab = replace(lab, account=XSS_SCRIPT, users=(replace(lab.users[0], user=XSS_ATTR), *lab.users[1:]),
                       models=(replace(lab.models[0], model_name=XSS_ATTR), *lab.models[1:]))  # fmt: skip
    adm = month.admin
    evil_adm = replace(adm, by_lab=(replace(adm.by_lab[0], key=XSS_ATTR), *adm.by_lab[1:]),
                       models=(replace(adm.models[0], model_name=XSS_SCRIPT), *adm.models[1:]))  # fmt: skip
    job = replace(month.jobs[0], name=XSS_SCRIPT, state_detail=XSS_ATTR)
    for r in (
        render.render_user_month(evil, [], month.cfg),
        render.render_lab_month(evil_lab, month.cfg),
        render.render_admin_email(evil_adm, month.cfg),
        render.render_jobs([job], month.cfg),
    ):
        assert "<script" not in r.html.lower() and "<img src=x" not in r.html  # no element made of a name
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in r.html or "&#34;&gt;&lt;img src=x" in r.html
        assert "<script>alert(1)" in r.text or '"><img src=x' in r.text  # plain text says it as it is...
        assert "&lt;" not in r.text and "&#34;" not in r.text and "&amp;" not in r.text  # ...not escaped
        assert "\x1b" not in r.text and "\r" not in r.text
        assert "\n" not in r.subject and "\r" not in r.subject
    page = render.render_admin_html(evil_adm, month.cfg)
    assert "<img src=x" not in page and "&#34;&gt;&lt;img src=x" in page
    assert "<script>alert(1)</script>" not in page  # the model's name: escaped in the table and the chart
    # each hostile model name in the user's e-mail: in the table, and in the comparison's sentence
    r = render.render_user_month(evil, [], month.cfg)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in r.html and f"Your {XSS_ATTR[:40]} runs" not in r.html
    assert "Your &#34;&gt;&lt;img src=x onerror=alert(1)&gt; runs in bf16" in r.html
    assert f"Your {XSS_ATTR} runs in bf16" in r.text and "?[31mred" not in r.text and "\x1b" not in r.text


def test_email_html_is_mail_safe_and_fits_a_phone(month: Month) -> None:
    """Inline styles, no scripts, no remote content, no fixed width over 640 px."""
    rendered = [
        render.render_user_month(month.user, suggest_for_user(month.user, month.cfg), month.cfg),
        render.render_lab_month(month.lab, month.cfg),
        render.render_admin_email(month.admin, month.cfg),
        render.render_jobs(month.jobs, month.cfg),
    ]
    for r in rendered:
        h = r.html
        assert "<script" not in h.lower() and "<link" not in h.lower() and "<iframe" not in h.lower()
        assert not re.search(r"\b(src|href|background)\s*=\s*[\"']?(https?:)?//", h, re.I)
        srcs = re.findall(r"\bsrc\s*=\s*\"([^\"]*)\"", h)
        assert all(s.startswith("cid:") for s in srcs), srcs
        assert {s[4:] for s in srcs} == {cid for cid, _ in r.images}
        for w in re.findall(r"\bwidth\s*=\s*\"?(\d+)", h, re.I):
            assert int(w) <= 640, w
        for w in re.findall(r"(?<![-\w])(?:min-)?width\s*:\s*(\d+)px", h, re.I):
            assert int(w) <= 640, w
        # layout does not depend on <style>: the only one holds a media query for narrow screens
        styles = re.findall(r"<style[^>]*>(.*?)</style>", h, re.S)
        assert len(styles) == 1 and "@media" in styles[0]
        assert h.count('style="') > 50
        assert '<meta name="viewport"' in h and "max-width:600px" in h


def test_eml_parses_back_with_its_parts_and_charts(month: Month, tmp_path: Path) -> None:
    r = render.render_admin_email(month.admin, month.cfg)
    paths = write_email(tmp_path, "admin", r, month.cfg, "admins@example.org")
    assert [p.name for p in paths] == ["admin.html", "admin.eml"]
    msg = email.message_from_bytes(paths[1].read_bytes(), policy=email.policy.default)
    assert isinstance(msg, EmailMessage)
    assert msg.get_content_type() == "multipart/alternative" and msg["Subject"] == r.subject
    plain_part, related = msg.get_payload()  # type: ignore[misc]
    assert plain_part.get_content_type() == "text/plain" and related.get_content_type() == "multipart/related"
    assert plain_part.get_content() == r.text
    html_part, *images = related.get_payload()
    assert html_part.get_content_type() == "text/html" and html_part.get_content() == r.html
    got = {img["Content-ID"].strip("<>"): img.get_content() for img in images}
    assert got == dict(r.images)
    for cid in got:
        assert f"cid:{cid}" in html_part.get_content()
    assert all(
        img.get_content_type() == "image/png" and img.get_content_disposition() == "inline" for img in images
    )
    # the browser copy has the charts inline
    page = paths[0].read_text()
    assert "cid:" not in page and page.count('src="data:image/png;base64,') == len(r.images)


def test_a_month_without_jobs(month: Month) -> None:
    with month.engine.connect() as conn:
        nobody = user_report.user_month(conn, month.cfg, "nobody", MONTH)
        empty_lab = lab_report.lab_month(conn, month.cfg, "lab_z", MONTH)
    r = render.render_user_month(nobody, [], month.cfg)
    assert "you ran no jobs" in r.text and "you ran no jobs" in r.html and r.images == ()
    r = render.render_lab_month(empty_lab, month.cfg)
    assert "Nobody in lab_z ran jobs" in r.text and r.images == ()


# --- templates ------------------------------------------------------------------------------------------


def test_site_templates_override_the_packaged_ones(month: Month, tmp_path: Path) -> None:
    site = tmp_path / "templates"
    site.mkdir()
    (site / "user_month.txt").write_text("Hi {{ m.user }}: {{ t.energy_kwh|kwh }} at {{ site }}.\n")
    theme = (render.TEMPLATES / "_theme.html").read_text()
    (site / "_theme.html").write_text(theme.replace("background-color:#f0fdf4", "background-color:#123456"))
    (site / "subjects.txt").write_text("{{ site }} says: {{ report }}\n")
    cfg = load_config(
        _write(tmp_path / "c.toml", f'database_url = "{month.url}"\n[reports]\ntemplate_dir = "{site}"\n'), {}
    )
    assert cfg.reports.template_dir == str(site)
    m = month.user
    r = render.render_user_month(m, suggest_for_user(m, month.cfg), cfg)
    assert r.text == f"Hi alice: {wording.kwh(m.totals.energy_kwh)} at cluster.\n"  # the default site name
    assert "background-color:#123456" in r.html  # the site's theme, in the packaged user_month.html
    assert r.subject == "cluster says: user_month"
    # the packaged templates are unchanged for everyone else
    assert (
        "background-color:#f0fdf4"
        in render.render_user_month(m, suggest_for_user(m, month.cfg), month.cfg).html
    )


def _write(p: Path, s: str) -> Path:
    p.write_text(s)
    return p


def test_reports_config(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text(
        '[reports]\nsite_name = "HAL"\ncontact = "help@example.org"\nadmins = ["Root@Example.ORG", "b@example.org"]\n'
        'lab_heads = { lab_nlp = ["head@example.org"], "lab x" = "x@example.org" }\nbefore_after_days = 14\n'
    )
    r = load_config(good, {}).reports
    assert (r.site_name, r.contact, r.before_after_days) == ("HAL", "help@example.org", 14)
    assert r.admins == ("Root@example.org", "b@example.org")
    assert r.lab_heads == {"lab_nlp": ("head@example.org",), "lab x": ("x@example.org",)}
    env = load_config(good, {"COCAQ_REPORTS__ADMINS": "a@example.org, c@example.org"}).reports
    assert env.admins == ("a@example.org", "c@example.org")
    for body, message in (
        ('template_dir = "/no/such/dir"', "config: reports.template_dir: /no/such/dir: no such directory"),
        (f'template_dir = "{good}"', f"config: reports.template_dir: {good}: not a directory"),
        ('admins = ["not an address"]', "config: reports.admins: 'not an address' is not an e-mail address"),
        ('lab_heads = "x@example.org"', "config: reports.lab_heads: expected a table"),
        (
            "before_after_days = 0",
            "config: reports.before_after_days: expected a number between 1.0 and 366.0",
        ),
        ('colour = "green"', "config: reports.colour: unknown key"),
    ):
        bad = tmp_path / "bad.toml"
        bad.write_text(f"[reports]\n{body}\n")
        with pytest.raises(ConfigError) as e:
            load_config(bad, {})
        assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)


# --- charts -----------------------------------------------------------------------------------------------


def test_charts_are_small_fast_pngs() -> None:
    from PIL import Image

    days = [str(d) for d in range(1, 32)]
    values = [float(d % 7) * 3.5 for d in range(31)]
    util = [None if d % 7 == 6 else 40.0 + d for d in range(31)]
    args = dict(
        unit="kWh", line=charts.Series("GPU utilisation", util, charts.COLOURS["util"]), line_max=100.0
    )
    png = charts.bar_chart("Energy per day", days, [charts.Series("energy", values, charts.COLOURS["energy"])],
                           label_every=7, **args)  # type: ignore[arg-type]  # fmt: skip
    img = Image.open(__import__("io").BytesIO(png))
    assert img.size == (charts.WIDTH * charts.SCALE, 250 * charts.SCALE) and img.mode == "P"
    assert len(png) < 60_000
    colours = {c for _n, c in img.convert("RGB").getcolors(1 << 16) or []}
    assert (
        (255, 255, 255) in colours
        and charts.COLOURS["energy"] in colours
        and charts.COLOURS["util"] in colours
    )
    # a thousand user e-mails (one chart each) must render and send within a minute on two cores: charts are
    # drawn with Pillow alone, no plotting or array library (the time per chart: bench/bench_render.py)
    code = (
        "import sys\nfrom cocaq.reports import charts\n"
        "charts.bar_chart('e', [str(d) for d in range(1, 32)], [charts.Series('e', [1.0] * 31, (0, 0, 0))],"
        " unit='kWh', label_every=7)\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'matplotlib', 'plotly', 'numpy', 'pandas'}))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr
    # empty and tiny data still make a readable chart
    assert (
        charts.bar_chart("Nothing", days, [charts.Series("e", [0.0] * 31, (0, 0, 0))], unit="kWh")[:8]
        == PNG_MAGIC
    )
    assert charts.hbar_chart("None", [], [], unit="kWh")[:8] == PNG_MAGIC
    assert charts.nice_ticks(0.012) == [0.0, 0.0025, 0.005, 0.0075, 0.01, 0.0125]
    assert charts.nice_ticks(420) == [0.0, 100.0, 200.0, 300.0, 400.0, 500.0]
    assert [charts.fmt_tick(v, 2.5) for v in (0, 2.5, 5)] == ["0.0", "2.5", "5.0"]


def test_rendering_user_emails_compiles_the_templates_once(
    month: Month, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rendering (templates + chart) of one user's e-mail, the part of a batch this module owns: 1,000 must
    render and send in 60 s, so the templates are compiled once per process, not once per e-mail (the time
    per e-mail: bench/bench_render.py; the whole batch: bench/bench_reports.py)."""
    import jinja2

    m = month.user
    s = suggest_for_user(m, month.cfg)
    render.render_user_month(m, s, month.cfg)  # templates compiled once per process
    compiled: list[str | None] = []
    real = jinja2.Environment.compile

    def counting(self: jinja2.Environment, source: Any, name: str | None = None, *a: Any, **kw: Any) -> Any:
        compiled.append(name)
        return real(self, source, name, *a, **kw)

    monkeypatch.setattr(jinja2.Environment, "compile", counting)
    for _ in range(50):
        render.render_user_month(m, s, month.cfg)
    assert compiled == [], compiled


# --- the CLI ------------------------------------------------------------------------------------------------


def test_cli_report_to_files_and_by_mail(month: Month, cli_env: dict[str, str], tmp_path: Path) -> None:
    outbox = tmp_path / "outbox"
    config(
        tmp_path,
        month.url,
        f'[mail]\ntransport = "outbox"\noutbox_dir = "{outbox}"\naddress_template = "{{user}}@example.org"\n'
        '[reports]\nadmins = ["admins@example.org"]\nlab_heads = { lab_a = ["head-a@example.org"] }\n',
    )
    env = dict(cli_env, COCAQ_CONFIG=str(tmp_path / "c.toml"))
    out = tmp_path / "out"
    r = run_cocaq(["report", "user", "alice", "--month", "2025-03", "--out", str(out)], env)
    assert r.code == 0, r.err
    assert r.out.split() == [str(out / "user-alice-2025-03.html"), str(out / "user-alice-2025-03.eml")]
    eml = email.message_from_bytes((out / "user-alice-2025-03.eml").read_bytes(), policy=email.policy.default)
    assert eml["To"] == "alice@example.org" and "March 2025" in eml["Subject"]
    r = run_cocaq(["report", "lab", "lab_a", "--month", "2025-03", "--out", str(out)], env)
    assert r.code == 0 and (out / "lab-lab_a-2025-03.eml").exists(), r.err
    r = run_cocaq(["report", "admin", "--month", "2025-03", "-M", "c", "--out", str(out)], env)
    assert r.code == 0, r.err
    page = (out / "admin-2025-03-c.html").read_text()
    assert "Plotly.newPlot" in page and (out / "admin-2025-03-c-email.eml").exists()
    # by mail: once, then already sent, then again with --force
    r = run_cocaq(["report", "user", "alice", "--month", "2025-03", "--send"], env)
    assert r.code == 0 and "mail: 1 sent" in r.err, r.err
    r = run_cocaq(["report", "user", "alice", "--month", "2025-03", "--send"], env)
    assert r.code == 0 and "0 sent, 1 already sent" in r.err, r.err
    r = run_cocaq(["report", "user", "alice", "--month", "2025-03", "--send", "--force"], env)
    assert r.code == 0 and "mail: 1 sent" in r.err, r.err
    r = run_cocaq(["report", "lab", "lab_a", "--month", "2025-03", "--send"], env)
    assert r.code == 0 and "mail: 1 sent" in r.err, r.err
    r = run_cocaq(["report", "admin", "--month", "2025-03", "--send"], env)
    assert r.code == 0 and "mail: 1 sent" in r.err, r.err
    sent = sorted(p.name for p in outbox.rglob("*.eml"))
    assert len(sent) == 4, sent  # alice twice (forced), the lab head, the admins
    with month.engine.connect() as conn:
        kinds = {k for (k,) in conn.execute(text("SELECT kind FROM sent_reports WHERE status = 'sent'"))}
    assert kinds == {"user-monthly", "lab:lab_a", "admin-monthly"}  # the kinds `cocaq report send` uses
    # the admin report now knows alice's first report (today): her after-window is not over
    r = run_cocaq(["report", "admin", "--month", "2025-03", "--out", str(out)], env)
    assert r.code == 0, r.err
    admin_text = (out / "admin-2025-03-email.eml").read_bytes()
    assert b"Not over yet: 1 user" in admin_text
    # one-line errors
    r = run_cocaq(["report", "lab", "lab_b", "--month", "2025-03", "--send"], env)
    assert r.code == 2 and "no address for the heads of 'lab_b'" in r.err and "lab_heads" in r.err
    r = run_cocaq(["report", "user", "alice", "--month", "2025-13", "--out", str(out)], env)
    assert r.code == 2 and "--month '2025-13': expected a month like 2026-03" in r.err
    r = run_cocaq(["report", "user", "alice", "--month", "2025-03"], env)
    assert r.code == 2 and "--out DIR" in r.err and "--send" in r.err
    with month.engine.begin() as conn:  # leave the module's database as the other tests expect it
        conn.execute(text("DELETE FROM sent_reports"))


def test_month_argument() -> None:
    from datetime import UTC, datetime

    assert parse_month("2025-03") == datetime(2025, 3, 1, tzinfo=UTC)
    assert parse_month(None, now=datetime(2026, 1, 15, tzinfo=UTC)) == datetime(2025, 12, 1, tzinfo=UTC)
    assert [wording.num(x) for x in (0, 0.012345, 0.5, 3.14159, 12.34, 99.96, 1234.5)] == [
        "0", "0.0123", "0.5", "3.14", "12.3", "100", "1,234",
    ]  # fmt: skip
    assert [wording.co2(x) for x in (0.0453, 1.5, 2500)] == ["45.3 g CO2e", "1.5 kg CO2e", "2.5 t CO2e"]
    assert wording.pct(0.4) == "0.4%" and wording.share(0.25) == "25%" and wording.pct(None) == "n/a"
