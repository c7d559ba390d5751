"""The population report of a population-based training sweep: one self-contained HTML
file (inline CSS and SVG, no script, no network request), drawing each trial's
settings over epochs, population by population, and listing who copied whom.

    hpo status STORAGE/NAME --html populations.html

Stable hooks (``<setting>``: a mutated setting's name, reduced to ``[A-Za-z0-9_-]``):

* ``svg#settings-<setting>.plot-curves`` - the setting per epoch, one panel per
  population, one line per trial (a step at each exploit: the epoch after it trains
  with the explored value); log10 where every value is positive;
* ``table#trials`` - each trial's population, number in it, id, exploits and final validation
  Sharpe; ``table#exploits`` - every exploit: population, epoch, recipient, donor, the
  settings before and after.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

from dashboards._svg import PALETTE, curves_plot
from dashboards.report import CSP, dom_id
from hpo.trials import TrialRow, settings_by_epoch

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto;
       max-width: 1280px; padding: 0 24px 48px; color: #1b1b1b; }
h1 { font-size: 22px; margin: 24px 0 4px; } h2 { font-size: 18px; margin: 28px 0 8px; }
.meta { color: #555; font-size: 12.5px; }
table { border-collapse: collapse; margin: 8px 0 12px; font-size: 12.5px;
        font-variant-numeric: tabular-nums; }
th, td { border-bottom: 1px solid #ddd; padding: 3px 6px; text-align: right; }
th:first-child, td:first-child, td.text { text-align: left; }
thead th { border-bottom: 2px solid #999; background: #f6f6f6; }
svg.plot { background: #fff; border: 1px solid #e3e3e3; max-width: 100%; height: auto; }
svg text { font-size: 11px; fill: #333; } svg .plot-title { font-size: 12.5px; font-weight: 600; }
svg .axis { stroke: #666; } svg .grid { stroke: #eee; }
"""


def render_population_report(sweep: str, rows: Sequence[TrialRow]) -> str:
    """The report of ``rows`` (a sweep's trial rows; those in no population are left
    out), for the sweep named ``sweep``."""
    members = [r for r in rows if r.population]
    populations = sorted({r.population for r in members})
    by_population = {
        p: sorted((r for r in members if r.population == p), key=lambda r: r.trial_id)
        for p in populations
    }
    # Every trial of a population gets a line for each setting any of them explored (and
    # lr and weight decay, which every population may change).
    explored = {
        p: {"lr", "weight_decay", *(n for r in rows for e in r.lineage for n in e["before"])}
        for p, rows in by_population.items()
    }
    trajectories = {r.trial_id: settings_by_epoch(r, explored[r.population]) for r in members}
    names = sorted({n for t in trajectories.values() for n in t})
    exploits = sum(len(r.lineage) for r in members)
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        f"<title>{escape(sweep)}: populations</title><style>{_CSS}</style></head><body>",
        f"<h1>{escape(sweep)}: population-based training</h1>",
        f'<p class="meta">{len(populations)} population(s), {len(members)} trial(s), '
        f"{exploits} exploit(s). Each line is one trial's setting per epoch; it steps "
        "where the trial copied another after an epoch and trained on with the explored "
        "value.</p>",
    ]
    for name in names:
        parts.append(f"<h2>{escape(name)} per epoch</h2>")
        parts.append(_setting_plot(name, by_population, trajectories))
    parts.append("<h2>Trials</h2>")
    parts.append(_members_table(by_population))
    parts.append("<h2>Exploits</h2>")
    parts.append(_exploits_table(by_population))
    parts.append("</body></html>")
    return "\n".join(parts)


def _setting_plot(
    name: str,
    by_population: dict[str, list[TrialRow]],
    trajectories: dict[str, dict[str, list[tuple[int, float]]]],
) -> str:
    values = [v for t in trajectories.values() for _, v in t.get(name, [])]
    log = bool(values) and all(v > 0 for v in values)
    panels = []
    for population, rows in by_population.items():
        series = []
        for i, row in enumerate(rows):
            points = trajectories[row.trial_id].get(name)
            if not points:
                continue
            curve = [(e, math.log10(v) if log else v) for e, v in points]
            series.append((f"trial {i + 1}", PALETTE[i % len(PALETTE)], curve, False))
        panels.append((f"{population} ({rows[0].family} {rows[0].precision})", series))
    return curves_plot(
        dom_id("settings", name),
        f"{name} per epoch, by population" + (" (log10)" if log else ""),
        panels,
        f"log10 {name}" if log else name,
        columns=min(4, max(1, len(panels))),
    )


def _members_table(by_population: dict[str, list[TrialRow]]) -> str:
    lines = [
        '<table id="trials"><thead><tr><th>population</th><th>number</th><th>trial</th>'
        "<th>exploits</th><th>final val Sharpe</th></tr></thead><tbody>"
    ]
    for population, rows in by_population.items():
        for i, row in enumerate(rows):
            sharpe = "" if row.val_sharpe is None else f"{row.val_sharpe:+.3f}"
            lines.append(
                f'<tr><td class="text">{escape(population)}</td><td>{i + 1}</td>'
                f'<td class="text">{escape(row.trial_id)}</td><td>{len(row.lineage)}</td>'
                f"<td>{sharpe}</td></tr>"
            )
    lines.append("</tbody></table>")
    return "".join(lines)


def _exploits_table(by_population: dict[str, list[TrialRow]]) -> str:
    lines = [
        '<table id="exploits"><thead><tr><th>population</th><th>after epoch</th>'
        "<th>recipient</th><th>donor</th><th>settings before</th><th>after</th></tr>"
        "</thead><tbody>"
    ]
    for population, rows in by_population.items():
        member = {r.trial_id: i + 1 for i, r in enumerate(rows)}
        by_key = {f"{r.config_id}|{r.precision}/{r.seed}": i + 1 for i, r in enumerate(rows)}
        entries = sorted(
            ((int(e["epoch"]), row.trial_id, e) for row in rows for e in row.lineage),
            key=lambda x: (x[0], x[1]),
        )
        for epoch, recipient, e in entries:
            # The donor by its trial key (a group trial's lineage names it by slug).
            key = str(e.get("donor_key", ""))
            donor_name = f"trial {by_key[key]}" if key in by_key else key
            lines.append(
                f'<tr><td class="text">{escape(population)}</td><td>{epoch}</td>'
                f'<td class="text">trial {member[recipient]}</td>'
                f'<td class="text">{escape(donor_name)}</td>'
                f'<td class="text">{escape(_settings(e["before"]))}</td>'
                f'<td class="text">{escape(_settings(e["after"]))}</td></tr>'
            )
    lines.append("</tbody></table>")
    return "".join(lines)


def _settings(values: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.3g}" for k, v in sorted(values.items()))
