"""Charts for the report e-mails, as small PNGs drawn with Pillow.

Why Pillow and not matplotlib: a site sends a thousand user e-mails in one batch, each with a chart, and
the whole batch must render and send within a minute on a small head node; matplotlib takes a few hundred
milliseconds per figure, this takes about ten. Why PNG: mail clients show inline PNGs (by Content-ID)
where they block scripts, SVG and remote images.

Each chart is drawn at twice its display size (sharp on phones and high-density screens) and reduced to
a small palette before it is saved, which halves both the encoding time and the size. A chart always has
a title, its unit, labelled axes and a legend when it shows more than one series; an empty chart says so.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

SCALE = 2  # drawn at 2x the size the HTML shows it at
WIDTH = 420  # design width (px): shown at up to 560 px on a desktop and ~340 px on a phone, readable on both

INK = (17, 24, 39)
MUTED = (107, 114, 128)
GRID = (229, 231, 235)
AXIS = (156, 163, 175)
WHITE = (255, 255, 255)

# The reports' colours, by what they show (one meaning, one colour, in every chart).
COLOURS: dict[str, tuple[int, int, int]] = {
    "energy": (37, 99, 235),
    "measured": (29, 78, 216),
    "estimated": (147, 197, 253),
    "co2": (71, 85, 105),
    "util": (217, 119, 6),
    "idle": (220, 38, 38),
    "failed": (234, 88, 12),
    "before": (148, 163, 184),
    "after": (22, 163, 74),  # better than before
    "worse": (217, 119, 6),  # an "after" that is worse than before
    "pause": (8, 145, 178),  # a job run in the cleanest hours of its window, pausing in between
}
# Lines of several zones or groups, in order.
CYCLE = ((37, 99, 235), (217, 119, 6), (22, 163, 74), (147, 51, 234), (220, 38, 38), (8, 145, 178))

_FONT_FILES = {
    False: (
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/TTF/DejaVuSans.ttf",
        "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    ),
    True: (
        "/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf",
        "/usr/share/fonts/dejavu/DejaVuSans-Bold.ttf",
        "/usr/share/fonts/TTF/DejaVuSans-Bold.ttf",
        "/usr/share/fonts/truetype/liberation/LiberationSans-Bold.ttf",
    ),
}


@lru_cache(maxsize=32)
def _font(size: int, bold: bool = False) -> Any:
    """A TrueType font at `size` device pixels: DejaVu Sans where installed, else Pillow's built-in one
    (Pillow >= 10.1 ships a scalable default font, so no file is needed)."""
    from PIL import ImageFont

    for path in _FONT_FILES[bold]:
        try:
            return ImageFont.truetype(path, size)
        except OSError:
            continue
    return ImageFont.load_default(size=size)


@dataclass(frozen=True)
class Series:
    """One series: a value per category (None: no value, a gap in a line), in one colour (or, for bars,
    one per category where `colours` gives one: an "after" bar green or orange by whether it is better)."""

    name: str
    values: Sequence[float | None]
    colour: tuple[int, int, int]
    colours: Sequence[tuple[int, int, int] | None] | None = None

    def colour_at(self, i: int) -> tuple[int, int, int]:
        c = self.colours[i] if self.colours is not None and i < len(self.colours) else None
        return c or self.colour


def nice_ticks(top: float, n: int = 5) -> list[float]:
    """Round tick values from 0 to at least `top`: steps of 1, 2, 2.5 or 5 x 10^k."""
    if not math.isfinite(top) or top <= 0:
        return [0.0, 0.25, 0.5, 0.75, 1.0]
    raw = top / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw * (1 - 1e-9))
    count = math.ceil(top / step - 1e-9)
    return [step * i for i in range(count + 1)]


def fmt_tick(v: float, step: float) -> str:
    """A tick value with as many decimals as the step needs (0, 2.5, 5, 7.5; 0, 0.02, 0.04)."""
    decimals = max(0, -math.floor(math.log10(step) + 1e-9)) if step > 0 else 0
    while decimals < 6 and abs(step * 10**decimals - round(step * 10**decimals)) > 1e-6:
        decimals += 1
    return f"{v:,.{decimals}f}"


class _Canvas:
    """A white image at SCALE with drawing in display pixels (the chart code never sees the scale)."""

    def __init__(self, width: int, height: int) -> None:
        from PIL import Image, ImageDraw

        self.w, self.h = width, height
        self.img = Image.new("RGB", (width * SCALE, height * SCALE), WHITE)
        self.draw = ImageDraw.Draw(self.img)

    def text(
        self,
        xy: tuple[float, float],
        s: str,
        size: int = 11,
        *,
        bold: bool = False,
        fill: tuple[int, int, int] = INK,
        anchor: str = "la",
    ) -> None:
        self.draw.text(
            (xy[0] * SCALE, xy[1] * SCALE), s, font=_font(size * SCALE, bold), fill=fill, anchor=anchor
        )

    def text_width(self, s: str, size: int = 11, bold: bool = False) -> float:
        return float(self.draw.textlength(s, font=_font(size * SCALE, bold))) / SCALE

    def rect(self, x0: float, y0: float, x1: float, y1: float, fill: tuple[int, int, int]) -> None:
        if x1 < x0:
            x0, x1 = x1, x0
        if y1 < y0:
            y0, y1 = y1, y0
        self.draw.rectangle(
            (round(x0 * SCALE), round(y0 * SCALE), max(round(x1 * SCALE) - 1, round(x0 * SCALE)),
             max(round(y1 * SCALE) - 1, round(y0 * SCALE))),
            fill=fill,
        )  # fmt: skip

    def line(self, pts: Sequence[tuple[float, float]], fill: tuple[int, int, int], width: float = 1) -> None:
        if len(pts) >= 2:
            self.draw.line(
                [(x * SCALE, y * SCALE) for x, y in pts], fill=fill, width=round(width * SCALE), joint="curve"
            )

    def dot(self, x: float, y: float, r: float, fill: tuple[int, int, int]) -> None:
        self.draw.ellipse(((x - r) * SCALE, (y - r) * SCALE, (x + r) * SCALE, (y + r) * SCALE), fill=fill)

    def crop(self, height: float) -> None:
        """Keep the top `height` display pixels (a chart whose height follows its content)."""
        from PIL import ImageDraw

        self.h = min(self.h, math.ceil(height))
        self.img = self.img.crop((0, 0, self.w * SCALE, self.h * SCALE))
        self.draw = ImageDraw.Draw(self.img)

    def png(self) -> bytes:
        # Mapped onto a fixed palette of the report colours blended with white (the anti-aliased edges):
        # a tenth of the time of an adaptive quantiser, and half the size and encoding time of RGB.
        from PIL import Image

        img = self.img.quantize(palette=_palette(), dither=Image.Dither.NONE)
        buf = io.BytesIO()
        img.save(buf, "PNG", compress_level=3)
        return buf.getvalue()


@lru_cache(maxsize=1)
def _palette() -> Any:
    from PIL import Image

    bases = [INK, MUTED, GRID, AXIS, *COLOURS.values(), *CYCLE]
    cols: list[tuple[int, ...]] = [WHITE]
    for b in bases:
        for k in range(1, 9):
            a = k / 8
            col = tuple(round(255 * (1 - a) + c * a) for c in b)
            if min(col) < 244:  # near-white blends would take the background's place (Pillow's
                cols.append(col)  # palette lookup is coarser than 8 bits per channel)
    cols = list(dict.fromkeys(cols))[:256]
    pal = Image.new("P", (1, 1))
    flat = [x for c in cols for x in c]
    pal.putpalette(flat + [255] * (768 - len(flat)))
    return pal


def _header(c: _Canvas, title: str, subtitle: str | None, legend: Sequence[Series]) -> float:
    """Title, subtitle (wrapped to the width) and legend at the top; returns where the plot may start."""
    c.text((12, 10), _clip(c, title, 15, c.w - 24, bold=True), 15, bold=True)
    y = 31.0
    if subtitle:
        for line in _wrap(c, subtitle, 11, c.w - 24)[:3]:
            c.text((12, y), line, 11, fill=MUTED)
            y += 15
        y += 2
    if len(legend) > 1:
        x = 12.0
        for s in legend:
            w = c.text_width(s.name, 11) + 26
            if x + w > c.w - 8 and x > 12:
                x, y = 12.0, y + 16
            c.rect(x, y + 2, x + 10, y + 12, s.colour)
            c.text((x + 14, y), s.name, 11)
            x += w
        y += 17
    return y + 8


def _wrap(c: _Canvas, text: str, size: int, max_w: float) -> list[str]:
    lines: list[str] = []
    cur = ""
    for word in text.split():
        trial = f"{cur} {word}".strip()
        if cur and c.text_width(trial, size) > max_w:
            lines.append(cur)
            cur = word
        else:
            cur = trial
    return [*lines, cur] if cur else lines


def _no_data(c: _Canvas, x0: float, y0: float, x1: float, y1: float, message: str) -> None:
    c.text(((x0 + x1) / 2, (y0 + y1) / 2), message, 12, fill=MUTED, anchor="mm")


def bar_chart(
    title: str,
    labels: Sequence[str],
    bars: Sequence[Series],
    *,
    unit: str,
    subtitle: str | None = None,
    line: Series | None = None,
    line_unit: str | None = None,
    line_max: float | None = None,
    stacked: bool = True,
    label_every: int = 1,
    value_labels: Callable[[float], str] | None = None,
    width: int = WIDTH,
    height: int = 250,
    empty: str = "nothing to show this month",
) -> bytes:
    """Vertical bars per category (stacked, or side by side), with an optional line on a right-hand axis
    (e.g. GPU utilisation in % over energy in kWh). `label_every` thins the category labels."""
    c = _Canvas(width, height)
    legend = [*bars, *([line] if line is not None else [])]
    top = _header(c, title, subtitle, legend if len(legend) > 1 else [])
    n = len(labels)
    if stacked:
        totals = [sum(s.values[i] or 0.0 for s in bars) for i in range(n)]
    else:
        totals = [max((s.values[i] or 0.0 for s in bars), default=0.0) for i in range(n)]
    vmax = max(totals, default=0.0)
    ticks = nice_ticks(vmax) if vmax > 0 else [0.0, 1.0]
    step = ticks[1] - ticks[0]
    tick_labels = [fmt_tick(t, step) for t in ticks]
    left = 12 + max(c.text_width(t, 11) for t in tick_labels) + 6
    right = float(width - 12)
    lvals = [v for v in (line.values if line else []) if v is not None]
    lmax = line_max if line_max is not None else (max(lvals, default=0.0) or 1.0)
    lticks = nice_ticks(lmax) if line is not None else []
    if line is not None:
        lstep = lticks[1] - lticks[0]
        right -= max(c.text_width(fmt_tick(t, lstep), 11) for t in lticks) + 6
    bottom = float(height - 24)
    plot_top = top + 22  # room for the units above the axes
    c.text((12, top), unit, 11, fill=MUTED)
    if line is not None and line_unit:
        c.text((width - 12, top), line_unit, 11, fill=line.colour, anchor="ra")
    span = bottom - plot_top
    ymax = ticks[-1]
    for t, label in zip(ticks, tick_labels, strict=True):
        y = bottom - span * t / ymax
        c.line([(left, y), (right, y)], GRID if t else AXIS)
        c.text((left - 6, y), label, 11, fill=MUTED, anchor="rm")
    if line is not None:
        lstep = lticks[1] - lticks[0]
        for t in lticks:
            c.text(
                (right + 6, bottom - span * t / lticks[-1]),
                fmt_tick(t, lstep),
                11,
                fill=line.colour,
                anchor="lm",
            )
    if n == 0 or (vmax <= 0 and not lvals):
        _no_data(c, left, plot_top, right, bottom, empty)
        return c.png()
    slot = (right - left) / n
    gap = max(1.0, slot * 0.22)
    for i in range(n):
        x0 = left + slot * i + gap / 2
        x1 = left + slot * (i + 1) - gap / 2
        if stacked:
            base = 0.0
            for s in bars:
                v = s.values[i] or 0.0
                if v > 0:
                    y0, y1 = bottom - span * (base + v) / ymax, bottom - span * base / ymax
                    c.rect(x0, y0, x1, y1, s.colour_at(i))
                    base += v
        else:
            w = (x1 - x0) / max(len(bars), 1)
            for k, s in enumerate(bars):
                v = s.values[i] or 0.0
                if v > 0:
                    c.rect(x0 + w * k, bottom - span * v / ymax, x0 + w * (k + 1) - 1, bottom, s.colour_at(i))
                    if value_labels is not None:
                        c.text((x0 + w * (k + 0.5), bottom - span * v / ymax - 2), value_labels(v), 11,
                               fill=INK, anchor="md")  # fmt: skip
        if value_labels is not None and stacked and totals[i] > 0:
            c.text(
                ((x0 + x1) / 2, bottom - span * totals[i] / ymax - 2),
                value_labels(totals[i]),
                11,
                anchor="md",
            )
        if i % label_every == 0 or n <= 12:
            c.text((left + slot * (i + 0.5), bottom + 5), labels[i], 11, fill=MUTED, anchor="ma")
    if line is not None:
        _draw_line(c, line, left, slot, bottom, span, lticks[-1])
    return c.png()


def _draw_line(
    c: _Canvas, line: Series, left: float, slot: float, bottom: float, span: float, top: float
) -> None:
    """A bar chart's line, a point at the middle of each category's slot on the right-hand axis (0 to
    `top`, values above it drawn at it); a missing value breaks it, and a point alone is drawn as a dot."""
    seg: list[tuple[float, float]] = []
    for i, lv in enumerate([*line.values, None]):
        if lv is None:
            c.line(seg, line.colour, 2)
            if len(seg) == 1:
                c.dot(seg[0][0], seg[0][1], 2.5, line.colour)
            seg = []
            continue
        seg.append((left + slot * (i + 0.5), bottom - span * min(lv, top) / top))


def hbar_chart(
    title: str,
    labels: Sequence[str],
    bars: Sequence[Series],
    *,
    unit: str,
    subtitle: str | None = None,
    value_labels: Callable[[int], str] | None = None,
    width: int = WIDTH,
    row: int = 24,
    empty: str = "nothing to show this month",
) -> bytes:
    """Horizontal stacked bars, one row per label (rankings: labs, partitions, users), each with its value
    written at the end of the bar. The height follows the number of rows."""
    legend = list(bars) if len(bars) > 1 else []
    n = len(labels)
    c = _Canvas(width, int(31 + 47 + 50 + 25 + max(n, 1) * row + 32))  # the most the header takes; cropped
    top = _header(c, title, subtitle, legend)
    names = [_clip(c, s, 11, 120) for s in labels]
    left = 12 + max((c.text_width(s, 11) for s in names), default=0.0) + 8
    totals = [sum(s.values[i] or 0.0 for s in bars) for i in range(n)]
    vmax = max(totals, default=0.0)
    texts = [value_labels(i) if value_labels else fmt_tick(totals[i], 0.1) for i in range(n)]
    right = width - 12 - max((c.text_width(t, 11) for t in texts), default=0.0) - 6
    bottom = top + max(n, 1) * row
    ticks = nice_ticks(vmax) if vmax > 0 else [0.0, 1.0]
    step = ticks[1] - ticks[0]
    for t in ticks:
        x = left + (right - left) * t / ticks[-1]
        c.line([(x, top), (x, bottom)], GRID if t else AXIS)
        c.text((x, bottom + 4), fmt_tick(t, step), 11, fill=MUTED, anchor="ma")
    c.text((right, bottom + 17), unit, 11, fill=MUTED, anchor="ra")
    c.crop(bottom + 34)
    if n == 0 or vmax <= 0:
        _no_data(c, left, top, right, bottom, empty)
        return c.png()
    for i in range(n):
        y0 = top + row * i + row * 0.18
        y1 = top + row * (i + 1) - row * 0.18
        base = 0.0
        for s in bars:
            v = s.values[i] or 0.0
            if v > 0:
                x0 = left + (right - left) * base / ticks[-1]
                x1 = left + (right - left) * (base + v) / ticks[-1]
                c.rect(x0, y0, max(x1, x0 + 1), y1, s.colour)
                base += v
        c.text((left - 8, (y0 + y1) / 2), names[i], 11, anchor="rm")
        c.text(
            (left + (right - left) * base / ticks[-1] + 5, (y0 + y1) / 2),
            texts[i],
            11,
            fill=MUTED,
            anchor="lm",
        )
    return c.png()


def line_chart(
    title: str,
    labels: Sequence[str],
    lines: Sequence[Series],
    *,
    unit: str,
    subtitle: str | None = None,
    label_every: int = 1,
    y_from_zero: bool = True,
    width: int = WIDTH,
    height: int = 230,
    empty: str = "nothing to show this month",
) -> bytes:
    """Lines over categories (days); None values leave gaps. A single point is drawn as a dot."""
    c = _Canvas(width, height)
    top = _header(c, title, subtitle, lines)
    vals = [v for s in lines for v in s.values if v is not None]
    vmax = max(vals, default=0.0)
    ticks = nice_ticks(vmax) if vmax > 0 else [0.0, 1.0]
    step = ticks[1] - ticks[0]
    tick_labels = [fmt_tick(t, step) for t in ticks]
    left = 12 + max(c.text_width(t, 11) for t in tick_labels) + 6
    right = float(width - 14)
    bottom = float(height - 24)
    plot_top = top + 22
    c.text((12, top), unit, 11, fill=MUTED)
    span = bottom - plot_top
    for t, label in zip(ticks, tick_labels, strict=True):
        y = bottom - span * t / ticks[-1]
        c.line([(left, y), (right, y)], GRID if t else AXIS)
        c.text((left - 6, y), label, 11, fill=MUTED, anchor="rm")
    n = len(labels)
    if n == 0 or not vals:
        _no_data(c, left, plot_top, right, bottom, empty)
        return c.png()
    slot = (right - left) / n
    for i in range(n):
        if i % label_every == 0 or n <= 12:
            c.text((left + slot * (i + 0.5), bottom + 5), labels[i], 11, fill=MUTED, anchor="ma")
    for s in lines:
        seg: list[tuple[float, float]] = []
        for i, v in enumerate([*s.values, None]):
            if v is None:
                c.line(seg, s.colour, 2)
                for x, y in seg if len(seg) <= 3 else []:
                    c.dot(x, y, 2.5, s.colour)
                seg = []
                continue
            seg.append((left + slot * (i + 0.5), bottom - span * v / ticks[-1]))
    return c.png()


def _blend(c: tuple[int, int, int], a: float) -> tuple[int, int, int]:
    """`c` over white at opacity `a` (eighths keep to the palette, `_palette`)."""
    r, g, b = (round(255 * (1 - a) + x * a) for x in c)
    return (r, g, b)


# A heatmap's bins, from the lowest values to the highest: green (cleaner) to red, the reports' good and bad.
HEAT = (
    _blend(COLOURS["after"], 1.0),
    _blend(COLOURS["after"], 0.5),
    _blend(COLOURS["util"], 0.5),
    _blend(COLOURS["util"], 1.0),
    _blend(COLOURS["idle"], 1.0),
)


def _round(v: float, span: float) -> str:
    """A legend's bound: whole numbers where the values span 10 or more, else as many decimals as needed."""
    decimals = 0 if span >= 10 or span == 0 else min(6, 1 - math.floor(math.log10(span)))
    return f"{v:,.{decimals}f}"


def heatmap_chart(
    title: str,
    rows: Sequence[str],
    columns: Sequence[str],
    values: Sequence[Sequence[float | None]],
    *,
    unit: str,
    subtitle: str | None = None,
    label_every: int = 1,
    width: int = WIDTH,
    empty: str = "nothing to show this month",
) -> bytes:
    """A grid of rows x columns coloured by value in len(HEAT) equal bins from the lowest value to the
    highest (a palette image cannot hold a smooth scale), the bins' ranges in a legend under it; None
    cells are left grey."""
    c = _Canvas(width, 400)
    top = _header(c, title, subtitle, [])
    vals = [v for r in values for v in r if v is not None]
    left = 12 + max((c.text_width(r, 11) for r in rows), default=0.0) + 6
    right = float(width - 12)
    cell_w = (right - left) / max(len(columns), 1)
    cell_h = 18.0
    bottom = top + cell_h * len(rows)
    if not vals:
        _no_data(c, left, top, right, bottom, empty)
        c.crop(bottom + 8)
        return c.png()
    lo, hi = min(vals), max(vals)
    step = (hi - lo) / len(HEAT) if hi > lo else 1.0

    def colour(v: float) -> tuple[int, int, int]:
        return HEAT[min(int((v - lo) / step), len(HEAT) - 1)]

    for i, name in enumerate(rows):
        y = top + cell_h * i
        c.text((left - 6, y + cell_h / 2), name, 11, fill=MUTED, anchor="rm")
        for j, v in enumerate(values[i]):
            x = left + cell_w * j
            c.rect(x, y, x + cell_w - 1, y + cell_h - 1, GRID if v is None else colour(v))
    for j, name in enumerate(columns):
        if j % label_every == 0:
            c.text((left + cell_w * j, bottom + 4), name, 11, fill=MUTED, anchor="la")
    y = bottom + 24
    c.text((12, y), unit, 11, fill=MUTED)
    x = 12 + c.text_width(unit, 11) + 10
    bins = [(lo + step * k, lo + step * (k + 1)) for k in range(len(HEAT))] if hi > lo else [(lo, lo)]
    for k, (a, b) in enumerate(bins):
        label = f"{_round(a, hi - lo)}-{_round(b, hi - lo)}" if hi > lo else _round(a, abs(a))
        w = c.text_width(label, 11) + 24
        if x + w > width - 8:
            x, y = 12.0, y + 16
        c.rect(x, y + 2, x + 10, y + 12, HEAT[k] if hi > lo else colour(lo))
        c.text((x + 14, y), label, 11)
        x += w
    c.crop(y + 22)
    return c.png()


def _clip(c: _Canvas, s: str, size: int, max_w: float, bold: bool = False) -> str:
    """`s` shortened with an ellipsis to fit `max_w` display pixels."""
    if c.text_width(s, size, bold) <= max_w:
        return s
    while s and c.text_width(s + "…", size, bold) > max_w:
        s = s[:-1]
    return s + "…"
