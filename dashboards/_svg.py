"""Hand-built inline SVG plots for the comparison report (no plotting dependency).

Every plot is one ``<svg>`` element with the id and classes the caller gives, a
``<title>`` for screen readers, and classed children (``point``, ``median``,
``zero-line``, ``ci-band``, ``curve``, ``bar``) so a browser test can count what is drawn.
Coordinates are rounded to 0.1 px to keep the HTML small and deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

import numpy as np

# Okabe-Ito: distinguishable with the common colour-vision deficiencies.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00")
_DASH = ' stroke-dasharray="5 3"'


def _f(value: float) -> str:
    return f"{value:.1f}"


def _attr(value: object) -> str:
    return escape(str(value), quote=True)


def nice_ticks(low: float, high: float, target: int = 5) -> list[float]:
    """Round tick values (1, 2, 5 x 10^k steps) covering [low, high]."""
    if not (math.isfinite(low) and math.isfinite(high)) or high <= low:
        return [low] if math.isfinite(low) else []
    raw = (high - low) / max(target, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    start = math.ceil(low / step) * step
    ticks = []
    value = start
    while value <= high + step * 1e-9:
        ticks.append(round(value, 12) + 0.0)
        value += step
    return ticks


def _tick_label(value: float) -> str:
    text = f"{value:.3g}"
    return "0" if text in ("-0", "0") else text


class _Linear:
    """Maps a data interval onto a pixel interval."""

    def __init__(self, domain: tuple[float, float], pixels: tuple[float, float]) -> None:
        low, high = domain
        if not high > low:
            low, high = low - 0.5, high + 0.5
        self.low, self.high = low, high
        self.p0, self.p1 = pixels

    def __call__(self, value: float) -> float:
        return self.p0 + (value - self.low) / (self.high - self.low) * (self.p1 - self.p0)


def padded_range(values: Sequence[float], pad: float = 0.08) -> tuple[float, float]:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return (-1.0, 1.0)
    low, high = min(finite), max(finite)
    span = high - low or max(abs(high), 1.0) * 0.5
    return (low - pad * span, high + pad * span)


def _open(svg_id: str, classes: str, width: int, height: int, title: str) -> list[str]:
    return [
        f'<svg id="{_attr(svg_id)}" class="{_attr(classes)}" '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
        f'aria-labelledby="{_attr(svg_id)}-title">',
        f'<title id="{_attr(svg_id)}-title">{escape(title)}</title>',
        f'<text class="plot-title" x="{width / 2:.1f}" y="16" text-anchor="middle">'
        f"{escape(title)}</text>",
    ]


def _y_axis(scale: _Linear, x: float, x_end: float, label: str, height: int) -> list[str]:
    out = [
        f'<line class="axis" x1="{_f(x)}" y1="{_f(scale.p1)}" x2="{_f(x)}" y2="{_f(scale.p0)}"/>'
    ]
    for tick in nice_ticks(scale.low, scale.high):
        y = scale(tick)
        out.append(
            f'<line class="grid" x1="{_f(x)}" y1="{_f(y)}" x2="{_f(x_end)}" y2="{_f(y)}"/>'
            f'<text class="tick" x="{_f(x - 4)}" y="{_f(y + 3)}" text-anchor="end">'
            f"{_tick_label(tick)}</text>"
        )
    mid = (scale.p0 + scale.p1) / 2
    out.append(
        f'<text class="axis-label" transform="translate(12 {_f(mid)}) rotate(-90)" '
        f'text-anchor="middle">{escape(label)}</text>'
    )
    return out


def _x_axis(scale: _Linear, y: float, y_top: float, label: str) -> list[str]:
    out = [
        f'<line class="axis" x1="{_f(scale.p0)}" y1="{_f(y)}" x2="{_f(scale.p1)}" y2="{_f(y)}"/>'
    ]
    for tick in nice_ticks(scale.low, scale.high):
        x = scale(tick)
        out.append(
            f'<line class="grid" x1="{_f(x)}" y1="{_f(y_top)}" x2="{_f(x)}" y2="{_f(y)}"/>'
            f'<text class="tick" x="{_f(x)}" y="{_f(y + 13)}" text-anchor="middle">'
            f"{_tick_label(tick)}</text>"
        )
    mid = (scale.p0 + scale.p1) / 2
    out.append(
        f'<text class="axis-label" x="{_f(mid)}" y="{_f(y + 28)}" text-anchor="middle">'
        f"{escape(label)}</text>"
    )
    return out


def _jitter(i: int) -> float:
    """Deterministic spread in [-1, 1] (golden-ratio sequence): same picture every run."""
    return ((i * 0.6180339887498949) % 1.0) * 2.0 - 1.0


def distribution_plot(
    svg_id: str,
    title: str,
    groups: Sequence[tuple[str, Sequence[tuple[str, float]], str]],
    y_label: str,
) -> str:
    """Violins (Gaussian KDE) with the individual values and the median, one per group.

    ``groups``: ``(label, [(point name, value), ...], colour)``; non-finite values are
    left out of the plot (the tables count them). A group with fewer than two distinct
    values shows its points only: a density of one value is not a distribution.
    """
    from scipy import stats

    width, height = 380, 270
    left, right, top, bottom = 50, 12, 28, 44
    values = [v for _, pts, _ in groups for _, v in pts if math.isfinite(v)]
    y = _Linear(padded_range(values), (height - bottom, top))
    out = _open(svg_id, "plot plot-dist", width, height, title)
    out += _y_axis(y, left, width - right, y_label, height)
    slot = (width - left - right) / max(len(groups), 1)
    half = min(slot * 0.38, 60.0)
    for g, (label, points, colour) in enumerate(groups):
        cx = left + slot * (g + 0.5)
        finite = [(name, v) for name, v in points if math.isfinite(v)]
        data = np.array([v for _, v in finite], dtype=np.float64)
        group_cls = f"group group-{_attr(label)}"
        out.append(f'<g class="{group_cls}" data-label="{_attr(label)}">')
        if data.size >= 2 and np.ptp(data) > 0:
            kde = stats.gaussian_kde(data)
            # Cut at the observed extremes (no density drawn where no trial landed).
            grid = np.linspace(data.min(), data.max(), 80)
            density = kde(grid)
            widths = density / density.max() * half
            right_side = [f"{_f(cx + w)},{_f(y(v))}" for v, w in zip(grid, widths, strict=True)]
            left_side = [
                f"{_f(cx - w)},{_f(y(v))}" for v, w in zip(grid[::-1], widths[::-1], strict=True)
            ]
            out.append(
                f'<polygon class="violin" points="{" ".join(right_side + left_side)}" '
                f'fill="{colour}" fill-opacity="0.3" stroke="{colour}"/>'
            )
        for i, (name, v) in enumerate(finite):
            out.append(
                f'<circle class="point" cx="{_f(cx + _jitter(i) * half * 0.35)}" '
                f'cy="{_f(y(v))}" r="3" fill="{colour}"><title>{escape(name)}: {v:+.3f}'
                "</title></circle>"
            )
        if data.size:
            med = float(np.median(data))
            out.append(
                f'<line class="median" x1="{_f(cx - half * 0.6)}" y1="{_f(y(med))}" '
                f'x2="{_f(cx + half * 0.6)}" y2="{_f(y(med))}" stroke="#222"/>'
            )
        else:
            out.append(
                f'<text class="empty" x="{_f(cx)}" y="{_f((y.p0 + y.p1) / 2)}" '
                'text-anchor="middle">no finished trials</text>'
            )
        out.append(
            f'<text class="group-label" x="{_f(cx)}" y="{_f(height - bottom + 16)}" '
            f'text-anchor="middle">{escape(label)} (n={data.size})</text></g>'
        )
    out.append("</svg>")
    return "".join(out)


def paired_difference_plot(
    svg_id: str,
    title: str,
    differences: Sequence[tuple[str, float]],
    centre: float,
    ci: tuple[float, float],
    x_label: str,
    colour: str,
    footer: str,
    centre_label: str = "median",
) -> str:
    """Strip plot of the paired differences with the zero line, a centre estimate
    (``line.centre``, named by ``centre_label``) and its CI band."""
    width, height = 380, 200
    left, right, top, bottom = 16, 16, 28, 60
    finite = [(name, d) for name, d in differences if math.isfinite(d)]
    span = [d for _, d in finite] + [0.0] + [c for c in ci if math.isfinite(c)]
    x = _Linear(padded_range(span), (left, width - right))
    y_mid = (top + height - bottom) / 2
    band = (height - bottom - top) * 0.4
    out = _open(svg_id, "plot plot-diff", width, height, title)
    out += _x_axis(x, height - bottom, top, x_label)
    low, high = ci
    if math.isfinite(low) and math.isfinite(high):
        out.append(
            f'<rect class="ci-band" x="{_f(x(low))}" y="{_f(top)}" '
            f'width="{_f(max(x(high) - x(low), 1.0))}" height="{_f(height - bottom - top)}" '
            f'fill="{colour}" fill-opacity="0.15"><title>CI [{low:+.3f}, {high:+.3f}]</title></rect>'
        )
    out.append(
        f'<line class="zero-line" x1="{_f(x(0.0))}" y1="{_f(top)}" x2="{_f(x(0.0))}" '
        f'y2="{_f(height - bottom)}" stroke="#444" stroke-dasharray="4 3"/>'
    )
    for i, (name, d) in enumerate(finite):
        out.append(
            f'<circle class="point" cx="{_f(x(d))}" cy="{_f(y_mid + _jitter(i) * band)}" r="3.2" '
            f'fill="{colour}"><title>{escape(name)}: {d:+.3f}</title></circle>'
        )
    if math.isfinite(centre):
        out.append(
            f'<line class="centre" x1="{_f(x(centre))}" y1="{_f(top)}" x2="{_f(x(centre))}" '
            f'y2="{_f(height - bottom)}" stroke="#222" stroke-width="2">'
            f"<title>{escape(centre_label)} {centre:+.3f}</title></line>"
        )
    out.append(
        f'<text class="footer" x="{_f(width / 2)}" y="{_f(height - 6)}" text-anchor="middle">'
        f"{escape(footer)}</text></svg>"
    )
    return "".join(out)


def curves_plot(
    svg_id: str,
    title: str,
    panels: Sequence[tuple[str, Sequence[tuple[str, str, Sequence[tuple[int, float]], bool]]]],
    y_label: str,
    columns: int = 4,
) -> str:
    """Small multiples, one per pair: its trials' metric per epoch overlaid.

    ``panels``: ``(pair name, [(series label, colour, [(epoch, value), ...], dashed),
    ...])``. All panels share both axes, so the pairs can be compared with each other too.
    """
    panel_w, panel_h, gap = 180, 120, 14
    left, top = 44, 46
    rows = max(math.ceil(len(panels) / columns), 1)
    width = left + columns * (panel_w + gap)
    height = top + rows * (panel_h + gap + 16)
    points = [p for _, series in panels for _, _, curve, _ in series for p in curve]
    steps = [s for s, _ in points]
    x_dom = (min(steps, default=0), max(steps, default=1))
    y_dom = padded_range([v for _, v in points])
    out = _open(svg_id, "plot plot-curves", width, height, title)
    # Legend: one entry per series label, in first-seen order.
    legend: dict[str, tuple[str, bool]] = {}
    for _, series in panels:
        for label, colour, _, dashed in series:
            legend.setdefault(label, (colour, dashed))
    lx = float(left)
    for label, (colour, dashed) in legend.items():
        out.append(
            f'<g class="legend-item"><line x1="{_f(lx)}" y1="30" x2="{_f(lx + 18)}" y2="30" '
            f'stroke="{colour}" stroke-width="2.5"{_DASH if dashed else ""}/>'
            f'<text x="{_f(lx + 22)}" y="34">'
            f"{escape(label)}</text></g>"
        )
        lx += 34 + 6.5 * len(label)  # ~6.5 px per character at 11 px
    for k, (name, series) in enumerate(panels):
        col, row = k % columns, k // columns
        x0 = left + col * (panel_w + gap)
        y0 = top + row * (panel_h + gap + 16) + 14
        x = _Linear((float(x_dom[0]), float(x_dom[1])), (x0, x0 + panel_w))
        y = _Linear(y_dom, (y0 + panel_h, y0))
        out.append(f'<g class="pair-panel" data-pair="{_attr(name)}">')
        out.append(
            f'<rect class="panel" x="{x0}" y="{y0}" width="{panel_w}" height="{panel_h}" '
            'fill="none" stroke="#ccc"/>'
            f'<text class="panel-title" x="{_f(x0 + panel_w / 2)}" y="{_f(y0 - 4)}" '
            f'text-anchor="middle">{escape(name)}</text>'
        )
        if y.low < 0 < y.high:
            out.append(
                f'<line class="zero-line" x1="{x0}" y1="{_f(y(0.0))}" x2="{x0 + panel_w}" '
                f'y2="{_f(y(0.0))}" stroke="#999" stroke-dasharray="3 3"/>'
            )
        if col == 0:
            for tick in nice_ticks(y.low, y.high, 3):
                out.append(
                    f'<text class="tick" x="{_f(x0 - 4)}" y="{_f(y(tick) + 3)}" '
                    f'text-anchor="end">{_tick_label(tick)}</text>'
                )
        for label, colour, curve, dashed in series:
            finite = [(s, v) for s, v in curve if math.isfinite(v)]
            if not finite:
                continue
            coords = " ".join(f"{_f(x(s))},{_f(y(v))}" for s, v in finite)
            out.append(
                f'<polyline class="curve" data-series="{_attr(label)}" points="{coords}" '
                f'fill="none" stroke="{colour}" stroke-width="1.8"{_DASH if dashed else ""}>'
                f"<title>{escape(name)} {escape(label)}</title></polyline>"
            )
            last_s, last_v = finite[-1]
            out.append(
                f'<circle class="curve-end" cx="{_f(x(last_s))}" cy="{_f(y(last_v))}" r="2.5" '
                f'fill="{colour}"/>'
            )
        out.append("</g>")
    out.append(
        f'<text class="axis-label" x="{_f(width / 2)}" y="{height - 2}" text-anchor="middle">'
        f"epoch (x from {x_dom[0]} to {x_dom[1]}); y: {escape(y_label)}</text></svg>"
    )
    return "".join(out)


def bars_plot(
    svg_id: str,
    title: str,
    panels: Sequence[tuple[str, Sequence[tuple[str, float, str]]]],
) -> str:
    """Side-by-side bar charts, each with its own scale: ``(metric label, [(group,
    value, colour), ...])``. Non-finite values are drawn as "not recorded"."""
    panel_w, height = 170, 210
    left, gap, top, bottom = 44, 30, 30, 40
    width = left + len(panels) * (panel_w + gap)
    out = _open(svg_id, "plot plot-bars", width, height, title)
    for k, (metric, bars) in enumerate(panels):
        x0 = left + k * (panel_w + gap)
        finite = [v for _, v, _ in bars if math.isfinite(v)]
        y = _Linear((0.0, max(finite, default=1.0) * 1.15), (height - bottom, top + 10))
        out.append(f'<g class="bar-panel" data-metric="{_attr(metric)}">')
        out.append(
            f'<text class="panel-title" x="{_f(x0 + panel_w / 2)}" y="{top}" '
            f'text-anchor="middle">{escape(metric)}</text>'
            f'<line class="axis" x1="{x0}" y1="{height - bottom}" x2="{x0 + panel_w}" '
            f'y2="{height - bottom}"/>'
        )
        slot = panel_w / max(len(bars), 1)
        for i, (group, value, colour) in enumerate(bars):
            bx = x0 + slot * i + slot * 0.15
            bw = slot * 0.7
            if math.isfinite(value):
                out.append(
                    f'<rect class="bar" data-group="{_attr(group)}" x="{_f(bx)}" '
                    f'y="{_f(y(value))}" width="{_f(bw)}" height="{_f(y(0.0) - y(value))}" '
                    f'fill="{colour}"><title>{escape(group)}: {value:.4g}</title></rect>'
                    f'<text class="bar-value" x="{_f(bx + bw / 2)}" y="{_f(y(value) - 3)}" '
                    f'text-anchor="middle">{value:.3g}</text>'
                )
            else:
                out.append(
                    f'<text class="bar-missing" x="{_f(bx + bw / 2)}" y="{_f(y(0.0) - 6)}" '
                    'text-anchor="middle">n/a</text>'
                )
            out.append(
                f'<text class="group-label" x="{_f(bx + bw / 2)}" y="{height - bottom + 14}" '
                f'text-anchor="middle">{escape(group)}</text>'
            )
        out.append("</g>")
    out.append("</svg>")
    return "".join(out)
