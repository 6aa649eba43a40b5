"""Small SVG charts drawn here (no plotting library, no script): line charts and stacked bars, as strings to
inline in the HTML report. Every text that comes from the run is escaped."""

from __future__ import annotations

import math
from collections.abc import Sequence
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
L, R, T, B = 64, 170, 16, 34
"""Plot margins: left (y ticks), right (legend), top, bottom (x ticks)."""


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step) * step
    return [start + i * step for i in range(int((hi - start) / step + 1e-9) + 1)]


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1000 or abs(v) < 0.01:
        return f"{v:.1e}"
    return f"{v:g}"


def _frame(
    title: str, xs: tuple[float, float], ys: tuple[float, float], log: bool, x_label: str
) -> list[str]:
    (x0, x1), (y0, y1) = xs, ys
    out = [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" height="{H}" '
            f'role="img" aria-label="{escape(title)}">'
        ),
        f'<rect x="{L}" y="{T}" width="{W - L - R}" height="{H - T - B}" fill="#fff" stroke="#ccc"/>',
    ]
    for v in _ticks(y0, y1):
        y = _sy(v, ys)
        label = f"{10**v:.3g}" if log else _fmt(v)
        out.append(
            f'<line x1="{L}" x2="{W - R}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
            f'<text x="{L - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{label}</text>'
        )
    for v in _ticks(x0, x1, 8):
        x = _sx(v, xs)
        out.append(f'<text x="{x:.1f}" y="{H - B + 16}" text-anchor="middle" font-size="11">{_fmt(v)}</text>')
    out.append(
        f'<text x="{(L + W - R) / 2}" y="{H - 4}" text-anchor="middle" font-size="11">'
        f"{escape(x_label)}</text>"
    )
    return out


def _sx(v: float, xs: tuple[float, float]) -> float:
    x0, x1 = xs
    return L + (v - x0) / ((x1 - x0) or 1) * (W - L - R)


def _sy(v: float, ys: tuple[float, float]) -> float:
    y0, y1 = ys
    return H - B - (v - y0) / ((y1 - y0) or 1) * (H - T - B)


def _legend(names: Sequence[str], colours: Sequence[str]) -> list[str]:
    out = []
    for i, (name, colour) in enumerate(zip(names, colours, strict=True)):
        y = T + 10 + i * 16
        out.append(
            f'<rect x="{W - R + 10}" y="{y - 8}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{W - R + 26}" y="{y + 1}" font-size="11">{escape(name[:24])}</text>'
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
) -> str:
    """A line (and a dot per point when there are few) per named series; ``hline``: a dashed limit."""
    pts = {k: [(x, math.log10(y) if log else y) for x, y in v if not log or y > 0] for k, v in series.items()}
    pts = {k: v for k, v in pts.items() if v}
    if not pts:
        return f'<p class="empty">{escape(title)}: no data</p>'
    xs_all = [x for v in pts.values() for x, _ in v]
    ys_all = [y for v in pts.values() for _, y in v]
    limit = None if hline is None else (math.log10(hline) if log and hline > 0 else hline)
    if limit is not None:
        ys_all.append(limit)
    xs = (min(xs_all), max(xs_all) if max(xs_all) > min(xs_all) else min(xs_all) + 1)
    ys = y_range or (min(ys_all), max(ys_all))
    if ys[1] <= ys[0]:
        ys = (ys[0] - 0.5, ys[0] + 0.5)
    out = _frame(title, xs, ys, log, x_label)
    colours = [PALETTE[i % len(PALETTE)] for i in range(len(pts))]
    for colour, (_, v) in zip(colours, pts.items(), strict=True):
        path = " ".join(f"{_sx(x, xs):.1f},{_sy(y, ys):.1f}" for x, y in v)
        out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{path}"/>')
        if len(v) <= 40:
            out.extend(
                f'<circle cx="{_sx(x, xs):.1f}" cy="{_sy(y, ys):.1f}" r="3" fill="{colour}"/>' for x, y in v
            )
    if limit is not None:
        y = _sy(limit, ys)
        out.append(
            f'<line x1="{L}" x2="{W - R}" y1="{y:.1f}" y2="{y:.1f}" stroke="#d62728" stroke-dasharray="6 4"/>'
        )
    out += _legend(list(pts), colours)
    out.append("</svg>")
    return "\n".join(out)


def stacked_bars(
    title: str,
    xs: Sequence[int],
    layers: dict[str, Sequence[float]],
    *,
    x_label: str = "step",
    colours: dict[str, str] | None = None,
) -> str:
    """One bar per x, its ``layers`` stacked bottom-up in dict order."""
    if not xs or not layers:
        return f'<p class="empty">{escape(title)}: no data</p>'
    totals = [sum(layer[i] for layer in layers.values()) for i in range(len(xs))]
    top = max(totals) or 1.0
    xr = (min(xs) - 0.5, max(xs) + 0.5)
    yr = (0.0, top)
    out = _frame(title, xr, yr, False, x_label)
    bw = max(1.0, (W - L - R) / len(xs) * 0.8)
    names = list(layers)
    cols = [(colours or {}).get(n, PALETTE[i % len(PALETTE)]) for i, n in enumerate(names)]
    for i, x in enumerate(xs):
        base = 0.0
        for name, colour in zip(names, cols, strict=True):
            v = layers[name][i]
            if v <= 0:
                continue
            y_top, y_bot = _sy(base + v, yr), _sy(base, yr)
            out.append(
                f'<rect x="{_sx(x, xr) - bw / 2:.1f}" y="{y_top:.1f}" width="{bw:.1f}" '
                f'height="{max(0.5, y_bot - y_top):.1f}" fill="{colour}"><title>step {x}: '
                f"{escape(name)} {v:g}</title></rect>"
            )
            base += v
    out += _legend(names, cols)
    out.append("</svg>")
    return "\n".join(out)
