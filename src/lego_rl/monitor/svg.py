"""Small SVG charts drawn here (no plotting library, no script): line charts and stacked bars, as strings to
inline in the HTML report. Every text that comes from the run is escaped.

Steps are integers, so a step axis only ever carries integer ticks (a two-step run is labelled 0 and 1, never
-0.5 ... 1.5). Text never overlaps: the legend gets the width its longest (cut) name needs and the height its
entry count needs, and ticks are spaced for their labels."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from html import escape

PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
W, H = 900, 260
"""Default chart size (px); ``small=True`` charts are half as wide, two to a row."""
L, T, B = 64, 24, 34
"""Plot margins: left (y ticks), top, bottom (x ticks); the right margin holds the legend."""
FONT = 11
CHAR_W = 7.0
"""Width budgeted per character at ``FONT`` px (wider than the average glyph: a safe bound for labels)."""
LEGEND_CHARS = 32
"""Legend names longer than this are cut (the full name is in the element's tooltip)."""
LEGEND_ROW = 16


def y_ticks(h: float) -> int:
    return max(2, min(5, int((h - T - B) // (FONT * 2.5))))


@dataclass(frozen=True)
class _Frame:
    """A chart's geometry: size, legend width, data ranges, and whether y is log10; the left margin is as
    wide as the longest y tick label needs."""

    w: float
    h: float
    r: float
    xs: tuple[float, float]
    ys: tuple[float, float]
    log: bool

    @cached_property
    def left(self) -> float:
        labels = _labels(_ticks(*self.ys, y_ticks(self.h)), self.log)
        return max(L, max(len(s) for s in labels) * CHAR_W + 12)

    def sx(self, v: float) -> float:
        x0, x1 = self.xs
        return self.left + (v - x0) / ((x1 - x0) or 1) * (self.w - self.left - self.r)

    def sy(self, v: float) -> float:
        y0, y1 = self.ys
        return self.h - B - (v - y0) / ((y1 - y0) or 1) * (self.h - T - B)


def _ticks(lo: float, hi: float, n: int = 5, *, integer: bool = False) -> list[float]:
    """About ``n`` round values in [lo, hi]; with ``integer`` only whole numbers (a step is never 0.5)."""
    if hi <= lo:
        return [float(math.ceil(lo))] if integer and math.ceil(lo) <= hi else [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    if integer:
        step = max(1.0, float(math.ceil(step)))
    start = math.ceil(lo / step) * step
    return [start + i * step for i in range(int((hi - start) / step + 1e-9) + 1)]


def _fmt(v: float, digits: int = 6) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 10000 or abs(v) < 0.01:
        return f"{v:.{max(1, digits - 5)}e}"
    return f"{v:.{digits}g}"


def _labels(values: Sequence[float], log: bool) -> list[str]:
    """Tick labels with as few digits as keep neighbours apart (0.99998 and 0.99999 are not both "1")."""
    shown = [10**v for v in values] if log else list(values)
    for digits in range(3, 13):
        labels = [_fmt(v, digits) for v in shown]
        if len(set(labels)) == len(labels):
            return labels
    return labels


def _cut(text: str, width: float) -> str:
    """``text`` cut to what fits in ``width`` px (the whole of it is the chart's tooltip and label)."""
    n = int(width // CHAR_W)
    return text if len(text) <= n else text[: n - 1] + "…"


def _legend_width(names: Sequence[str]) -> float:
    longest = max((min(len(n), LEGEND_CHARS) for n in names), default=0)
    return 26 + longest * CHAR_W + 8


def _height(base: float, entries: int) -> float:
    """Tall enough for every legend entry."""
    return max(base, T + 10 + entries * LEGEND_ROW + B)


def _open(title: str, f: _Frame, x_label: str, integer_x: bool) -> list[str]:
    out = [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {f.w:.0f} {f.h:.0f}" width="{f.w:.0f}" '
            f'height="{f.h:.0f}" role="img" aria-label="{escape(title)}" font-size="{FONT}">'
            f"<title>{escape(title)}</title>"
        ),
        f'<text x="{f.left:.0f}" y="{T - 8}" font-weight="bold">{escape(_cut(title, f.w - f.left))}</text>',
        f'<rect x="{f.left:.0f}" y="{T}" width="{f.w - f.left - f.r:.0f}" height="{f.h - T - B:.0f}" '
        'fill="#fff" stroke="#ccc"/>',
    ]
    ys = _ticks(*f.ys, y_ticks(f.h))
    for v, label in zip(ys, _labels(ys, f.log), strict=True):
        y = f.sy(v)
        out.append(
            f'<line x1="{f.left:.0f}" x2="{f.w - f.r:.0f}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
            f'<text x="{f.left - 6:.0f}" y="{y + 4:.1f}" text-anchor="end">{label}</text>'
        )
    labels = [_fmt(v) for v in _ticks(*f.xs, 8, integer=integer_x)]
    widest = max((len(s) for s in labels), default=1) * CHAR_W + 12
    x_ticks = max(1, min(8, int((f.w - f.left - f.r) // widest)))
    for v in _ticks(*f.xs, x_ticks, integer=integer_x):
        out.append(f'<text x="{f.sx(v):.1f}" y="{f.h - B + 16:.0f}" text-anchor="middle">{_fmt(v)}</text>')
    out.append(f'<text x="{(f.left + f.w - f.r) / 2:.0f}" y="{f.h - 4:.0f}" text-anchor="middle">{escape(x_label)}</text>')
    return out


def _legend(f: _Frame, names: Sequence[str], colours: Sequence[str]) -> list[str]:
    out = []
    for i, (name, colour) in enumerate(zip(names, colours, strict=True)):
        y = T + 10 + i * LEGEND_ROW
        cut = name if len(name) <= LEGEND_CHARS else name[: LEGEND_CHARS - 1] + "…"
        out.append(
            f'<rect x="{f.w - f.r + 10:.0f}" y="{y - 8}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{f.w - f.r + 26:.0f}" y="{y + 1}"><title>{escape(name)}</title>{escape(cut)}</text>'
        )
    return out


def line_chart(
    title: str,
    series: dict[str, list[tuple[float, float]]],
    *,
    x_label: str = "step",
    log: bool = False,
    hline: float | None = None,
    y_range: tuple[float, float] | None = None,
    integer_x: bool = True,
    small: bool = False,
) -> str:
    """A line (and a dot per point when there are few) per named series; ``hline``: a dashed limit.
    ``integer_x``: x is a step (integer ticks only); ``small``: half width, for charts side by side."""
    pts = {k: [(x, math.log10(y) if log else y) for x, y in v if not log or y > 0] for k, v in series.items()}
    pts = {k: v for k, v in pts.items() if v}
    if not pts:
        return f'<p class="empty">{escape(title)}: no data</p>'
    xs_all = [x for v in pts.values() for x, _ in v]
    ys_all = [y for v in pts.values() for _, y in v]
    limit = None if hline is None else (math.log10(hline) if log and hline > 0 else hline)
    if limit is not None:
        ys_all.append(limit)
    lo, hi = min(xs_all), max(xs_all)
    xs = (lo, hi) if hi > lo else ((lo - 0.5, lo + 0.5) if integer_x else (lo, lo + 1))
    ys = y_range or (min(ys_all), max(ys_all))
    if ys[1] <= ys[0]:  # a constant: centred, on a scale of its own size (lr 1e-6 is not drawn at 0)
        pad = abs(ys[0]) * 0.1 or 0.5
        ys = (ys[0] - pad, ys[0] + pad)
    r = _legend_width(list(pts))
    f = _Frame(W / 2 if small else W, _height(H * 0.8 if small else H, len(pts)), r, xs, ys, log)
    out = _open(title, f, x_label, integer_x)
    colours = [PALETTE[i % len(PALETTE)] for i in range(len(pts))]
    for colour, (_, v) in zip(colours, pts.items(), strict=True):
        path = " ".join(f"{f.sx(x):.1f},{f.sy(y):.1f}" for x, y in v)
        out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{path}"/>')
        if len(v) <= 40:
            out.extend(f'<circle cx="{f.sx(x):.1f}" cy="{f.sy(y):.1f}" r="3" fill="{colour}"/>' for x, y in v)
    if limit is not None:
        y = f.sy(limit)
        out.append(
            f'<line x1="{f.left:.0f}" x2="{f.w - f.r:.0f}" y1="{y:.1f}" y2="{y:.1f}" stroke="#d62728" '
            'stroke-dasharray="6 4"/>'
        )
    out += _legend(f, list(pts), colours)
    out.append("</svg>")
    return "\n".join(out)


def stacked_bars(
    title: str,
    xs: Sequence[int],
    layers: Mapping[str, Sequence[float]],
    *,
    x_label: str = "step",
    colours: dict[str, str] | None = None,
    y_max: float | None = None,
    tips: bool = True,
) -> str:
    """One bar per x, its ``layers`` stacked bottom-up in dict order; ``y_max`` fixes the top (1 for shares).
    ``tips``: a tooltip per bar segment (left out on long runs, where they would dominate the file)."""
    if not xs or not layers:
        return f'<p class="empty">{escape(title)}: no data</p>'
    totals = [sum(layer[i] for layer in layers.values()) for i in range(len(xs))]
    top = y_max or max(totals) or 1.0
    names = list(layers)
    f = _Frame(W, _height(H, len(names)), _legend_width(names), (min(xs) - 0.5, max(xs) + 0.5), (0.0, top), False)
    out = _open(title, f, x_label, True)
    bw = max(1.0, (f.w - f.left - f.r) / (max(xs) - min(xs) + 1) * 0.8)
    cols = [(colours or {}).get(n, PALETTE[i % len(PALETTE)]) for i, n in enumerate(names)]
    for i, x in enumerate(xs):
        base = 0.0
        for name, colour in zip(names, cols, strict=True):
            v = layers[name][i]
            if v <= 0:
                continue
            y_top, y_bot = f.sy(base + v), f.sy(base)
            tip = f"<title>step {x}: {escape(name)} {v:.3g}</title>" if tips else ""
            out.append(
                f'<rect x="{f.sx(x) - bw / 2:.1f}" y="{y_top:.1f}" width="{bw:.1f}" '
                f'height="{max(0.5, y_bot - y_top):.1f}" fill="{colour}">{tip}</rect>'
            )
            base += v
    out += _legend(f, names, cols)
    out.append("</svg>")
    return "\n".join(out)
