"""The HTML comparison report: self-contained, every plot and table findable by id, and it
opens in headless Chromium without console errors (screenshot kept in test-artifacts/)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from dashboards.report import CSP, dom_id, render_report, write_report
from dashboards.tables import format_num, format_p
from hpo.compare import Comparison, compare_trials, comparison_from_mlflow
from tests.hpo.compare_helpers import SyntheticSweep, pair_id, paired_records, shared_sweep

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CONTRAST = "bf16_vs_f32"


class _Elements(HTMLParser):
    """Every start tag with its attributes, and the element ids in document order."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.ids: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {k: v or "" for k, v in attrs}
        self.tags.append((tag, attributes))
        if "id" in attributes:
            assert attributes["id"] not in self.ids, f"duplicate id {attributes['id']}"
            self.ids[attributes["id"]] = tag


def _count_inside(parsed: _Elements, tag: str, cls: str, svg_id: str) -> int:
    """Elements ``<tag class="... cls ...">`` inside ``<svg id="svg_id">``."""
    inside, count = False, 0
    for t, a in parsed.tags:
        if t == "svg":
            inside = a.get("id") == svg_id
        elif inside and t == tag and cls in a.get("class", "").split():
            count += 1
    return count


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> SyntheticSweep:
    return shared_sweep(tmp_path_factory)


@pytest.fixture(scope="module")
def comparison(sweep: SyntheticSweep) -> Comparison:
    return comparison_from_mlflow(sweep.experiment, sweep.tracking_uri, precisions=("f32", "bf16"))


@pytest.fixture(scope="module")
def html(comparison: Comparison) -> str:
    return render_report(comparison)


@pytest.fixture(scope="module")
def parsed(html: str) -> _Elements:
    parser = _Elements()
    parser.feed(html)
    return parser


@pytest.mark.parametrize("scope", ["tft", "dqn", "overall"])
def test_every_scope_has_its_plots_and_tables(parsed: _Elements, scope: str) -> None:
    assert parsed.ids[dom_id("family", scope)] == "section"
    assert parsed.ids[dom_id("stats", scope)] == "table"
    assert parsed.ids[dom_id("counts", scope)] == "table"
    assert parsed.ids[dom_id("selection", scope)] == "table"
    for split in ("val", "test"):
        assert parsed.ids[dom_id("dist", scope, CONTRAST, split)] == "svg"
        assert parsed.ids[dom_id("diff", scope, CONTRAST, split)] == "svg"
    if scope != "overall":
        assert parsed.ids[dom_id("curves", scope, CONTRAST)] == "svg"
        assert parsed.ids[dom_id("resources", scope)] == "svg"


@pytest.mark.parametrize("scope", ["tft", "dqn", "overall"])
def test_plots_draw_exactly_the_pairs_the_statistics_use(
    parsed: _Elements, comparison: Comparison, scope: str
) -> None:
    owner = comparison.overall if scope == "overall" else comparison.families[scope]
    for split in ("val", "test"):
        used = owner.contrasts[CONTRAST].split(split).n_pairs_used
        diff_id = dom_id("diff", scope, CONTRAST, split)
        assert _count_inside(parsed, "circle", "point", diff_id) == used
        assert _count_inside(parsed, "line", "zero-line", diff_id) == 1
        assert _count_inside(parsed, "line", "centre", diff_id) == 1
        dist_id = dom_id("dist", scope, CONTRAST, split)
        assert _count_inside(parsed, "circle", "point", dist_id) == 2 * used
        assert _count_inside(parsed, "polygon", "violin", dist_id) == 2


def test_curves_overlay_both_trials_of_every_pair(parsed: _Elements) -> None:
    curves = dom_id("curves", "tft", CONTRAST)
    assert _count_inside(parsed, "g", "pair-panel", curves) == 6
    # 6 pairs x 2 trials; the diverged trial's curve stops at its last good epoch.
    assert _count_inside(parsed, "polyline", "curve", curves) == 12
    assert _count_inside(parsed, "rect", "bar", dom_id("resources", "tft")) == 4


def test_stats_table_shows_the_computed_numbers(html: str, comparison: Comparison) -> None:
    val = comparison.families["tft"].contrasts[CONTRAST].val
    inference = comparison.families["tft"].contrasts[CONTRAST].inference["val"]
    table = re.search(r'<table id="stats-tft".*?</table>', html, re.S)
    assert table is not None
    row = re.search(r'<tr data-contrast="bf16_vs_f32" data-split="val">.*?</tr>', table.group(0))
    assert row is not None
    cells = row.group(0)
    assert f'<td class="n-pairs">{val.n_pairs_used}</td>' in cells
    assert '<td class="n-excluded">1</td>' in cells
    assert f'<td class="ci">[{val.hl_low:+.3f}, {val.hl_high:+.3f}]</td>' in cells
    assert f'<td class="ci-confidence">{val.hl_confidence:.1%}</td>' in cells
    assert f"{val.wilcoxon_pvalue:.3f}" in cells
    assert f'<td class="text method">{inference.wilcoxon_method}</td>' in cells
    assert pair_id("tft", 2) in html  # the excluded pair is named in the notes
    described = re.search(r'<table id="describe-tft".*?</table>', html, re.S)
    assert described is not None
    row = re.search(r'<tr data-contrast="bf16_vs_f32" data-split="val">.*?</tr>', described[0])
    assert row is not None
    assert f'<td class="median-diff">{val.median_difference:+.3f}</td>' in row[0]


def test_report_is_self_contained(html: str, parsed: _Elements) -> None:
    assert f'content="{CSP}"' in html
    assert not any(t == "script" for t, _ in parsed.tags)
    for tag, attributes in parsed.tags:
        for name in ("src", "href", "xlink:href", "action", "data"):
            value = attributes.get(name)
            if value is not None:
                assert value.startswith(("#", "data:")), f"<{tag} {name}={value!r}>"
    assert "url(" not in html and "@import" not in html
    assert "reading-notes" in parsed.ids


def test_the_header_names_the_trials_deep_link_as_text(html: str, comparison: Comparison) -> None:
    found = re.search(r'<p id="mlflow-link".*?</p>', html, re.S)
    assert found is not None
    assert "mlflow ui --backend-store-uri" in found[0]  # a local store: serve it first
    assert (
        f"http://127.0.0.1:5000/#/experiments/{comparison.experiment_id}/runs?"
        "workflowType=machine_learning&amp;searchFilter=" in found[0]
    )
    assert "href" not in found[0]  # text to copy: the report links to nothing outside


def test_write_report_writes_the_rendered_html(comparison: Comparison, tmp_path: Path) -> None:
    path = write_report(comparison, tmp_path / "sub" / "report.html")
    text = path.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and 'id="summary-table"' in text
    assert not list(path.parent.glob("*.tmp"))


def _first_body_element(html: str) -> str:
    body = html.split("<body>", 1)[1]
    return re.sub(r"<header[^>]*>\s*", "", body, count=1).lstrip()


def test_the_first_line_states_the_verdict(html: str, comparison: Comparison) -> None:
    first = _first_body_element(html)
    assert first.startswith('<h1 id="verdict">')
    headline = re.sub(r"<[^>]+>", " ", first.split("</h1>", 1)[0])
    overall = comparison.overall.contrasts[CONTRAST].verdict()
    assert overall is not None
    assert headline.strip().startswith("Verdict, bf16 vs f32 (held-out test Sharpe, margin ±0.10)")
    assert f": {overall}" in headline
    for model in ("tft", "dqn"):
        assert f"{model} {comparison.families[model].contrasts[CONTRAST].verdict()}" in headline


def test_one_sentence_per_family_explains_its_verdict(html: str, comparison: Comparison) -> None:
    block = re.search(r'<ul id="verdicts">(.*?)</ul>', html, re.S)
    assert block is not None
    items = re.findall(r"<li>(.*?)</li>", block.group(1))
    assert [i.split(":", 1)[0] for i in items] == ["dqn", "tft", "overall"]
    for item, scope in zip(items, comparison.scopes, strict=True):
        inference = scope.contrasts[CONTRAST].inference["test"]
        assert item.startswith(f"{scope.scope}: {inference.verdict}")
        assert f"[{inference.tost_low:+.3f}, {inference.tost_high:+.3f}]" in item
        assert item.count(". ") == 0 and item.endswith(".")  # one sentence


def _separated() -> Comparison:
    # bf16 is f32 + 5 everywhere: MWU and KS p-values far below 0.05.
    f32 = [[0.1 * g] for g in range(8)]
    bf16 = [[0.1 * g + 5.0 + 0.01 * g] for g in range(8)]
    return compare_trials(paired_records("tft", f32, bf16), ("f32", "bf16"))


def test_mann_whitney_and_ks_are_descriptive_not_emphasised() -> None:
    comparison = _separated()
    val = comparison.families["tft"].contrasts[CONTRAST].val
    assert val.mannwhitney_pvalue < 0.05 and val.ks_pvalue < 0.05
    html = render_report(comparison)
    table = re.search(r'<table id="describe-tft".*?</table>', html, re.S)
    assert table is not None
    assert "MWU p (descriptive)" in table.group(0) and "KS p (descriptive)" in table.group(0)
    row = re.search(r'<tr data-contrast="bf16_vs_f32" data-split="val">.*?</tr>', table.group(0))
    assert row is not None
    cells = re.findall(r"<td([^>]*)>([^<]*)</td>", row.group(0))
    descriptive = [(attrs, text) for attrs, text in cells if "descriptive" in attrs]
    assert [text for _, text in descriptive] == ["&lt;0.001", "&lt;0.001"]
    assert not any("significant" in attrs for attrs, _ in descriptive)
    # The paired test (Wilcoxon, 8 of 8 positive: exact p = 2/256) is shown raw; what is
    # emphasised is its adjusted value (BH q, one family: the same 0.008).
    tested = re.search(r'<table id="stats-tft".*?</table>', html, re.S)
    assert tested is not None
    row = re.search(r'<tr data-contrast="bf16_vs_f32" data-split="val">.*?</tr>', tested[0])
    assert row is not None
    assert '<td class="raw-p" title="exact">0.008</td>' in row.group(0)
    assert '<td class="adjusted-p bh-q significant">0.008</td>' in row.group(0)


def test_reading_notes_count_the_tests_bh_adjusted(html: str, comparison: Comparison) -> None:
    notes = re.search(r'<section id="reading-notes">.*?</section>', html, re.S)
    assert notes is not None
    text = notes.group(0)
    n = comparison.families["tft"].contrasts[CONTRAST].inference["val"].bh_n_tests
    assert n == 2
    assert f"{n} tests per adjustment here, one per family" in text
    assert "twenty" not in text and "ten families and two splits" not in text


def test_the_seed_table_keeps_every_seed_of_a_configuration() -> None:
    f32 = [[0.5, 0.6, 0.7], [0.2, 0.1, 0.0]]
    bf16 = [[0.6, 0.8, 0.7], [0.1, 0.1, 0.3]]
    comparison = compare_trials(paired_records("tft", f32, bf16), ("f32", "bf16"))
    html = render_report(comparison)
    parsed = _Elements()
    parsed.feed(html)
    table = re.search(r'<table id="seeds-tft-bf16_vs_f32".*?</table>', html, re.S)
    assert table is not None
    rows = re.findall(r'<tr data-unit="([^"]+)" data-pair="([^"]+)">(.*?)</tr>', table.group(0))
    assert [(u, p) for u, p, _ in rows] == [
        (f"tft-c00{g}", f"tft-c00{g}-s{s}") for g in range(2) for s in range(3)
    ]
    means = re.findall(r"<td class='unit-mean'>([^<]+)</td>", table.group(0))
    # val then test per configuration: (0.1 + 0.2 + 0.0) / 3 and (-0.1 + 0.0 + 0.3) / 3.
    assert means == ["+0.100", "+0.100", "+0.067", "+0.067"]
    # The plots draw the 2 configurations the statistics use, not the 6 seed pairs.
    assert _count_inside(parsed, "circle", "point", dom_id("diff", "tft", CONTRAST, "val")) == 2


# ---------------------------------------------------------------------------------------
# Headless Chromium (Debian's `chromium` package; the test set-up installs it).

needs_chromium = pytest.mark.skipif(
    not (os.path.exists(CHROMIUM) and os.access(CHROMIUM, os.X_OK)),
    reason=f"{CHROMIUM} not installed (Debian: apt-get install -y chromium)",
)


def _chromium(page: Path, profile: Path, *mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            "--enable-logging=stderr",
            "--v=0",
            *mode,
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _console_messages(stderr: str) -> list[str]:
    # Chromium logs every console message (errors, warnings, CSP violations, failed
    # loads) as "...:INFO:CONSOLE:<line>] "<message>", source: <url> (<line>)".
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


@needs_chromium
def test_the_console_check_sees_errors(tmp_path: Path) -> None:
    """The harness itself: a console error on a page is seen, so an empty list means
    something."""
    page = tmp_path / "canary.html"
    page.write_text(
        '<!DOCTYPE html><html><body><script>console.error("canary-42")</script></body></html>'
    )
    run = _chromium(page, tmp_path / "profile", "--dump-dom")
    assert run.returncode == 0, run.stderr[-2000:]
    assert any('"canary-42"' in m for m in _console_messages(run.stderr))


@needs_chromium
def test_report_opens_in_headless_chromium_without_console_errors(
    comparison: Comparison, tmp_path: Path
) -> None:
    page = write_report(comparison, tmp_path / "report.html")
    dom = _chromium(page, tmp_path / "profile-dom", "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert _console_messages(dom.stderr) == []
    parsed = _Elements()
    parsed.feed(dom.stdout)  # the DOM the browser built, not our string
    for scope in ("tft", "dqn", "overall"):
        assert parsed.ids[dom_id("stats", scope)] == "table"
        assert parsed.ids[dom_id("dist", scope, CONTRAST, "val")] == "svg"
        assert parsed.ids[dom_id("diff", scope, CONTRAST, "val")] == "svg"
        assert parsed.ids[dom_id("overfitting", scope)] == "table"
    assert parsed.ids[dom_id("pairtests", "tft", CONTRAST)] == "table"
    assert parsed.ids["summary-table"] == "table"
    # The verdict comes first: the body's first element with text is h1#verdict.
    body = [t for t, _ in parsed.tags].index("body")
    assert parsed.tags[body + 2] == ("h1", {"id": "verdict"})
    assert comparison.families["tft"].contrasts[CONTRAST].verdict() in dom.stdout

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "comparison-report.png"
    shot.unlink(missing_ok=True)
    run = _chromium(
        page, tmp_path / "profile-shot", f"--screenshot={shot}", "--window-size=1400,6000"
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert _console_messages(run.stderr) == []
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 50_000
    shutil.copy2(page, ARTIFACTS / "comparison-report.html")


_MEASURE = """<script>
const width = document.documentElement.clientWidth;
const wide = [...document.querySelectorAll("table, svg")]
  .filter((e) => e.getBoundingClientRect().right > width + 1)
  .map((e) => e.id || e.tagName);
const scrolled = [...document.querySelectorAll(".table-wrap")]
  .filter((e) => e.scrollWidth > e.clientWidth + 1)
  .map((e) => e.firstElementChild.id);
const cost = document.getElementById("cost").getBoundingClientRect();
document.body.dataset.layout = JSON.stringify(
  {page: document.documentElement.scrollWidth, width, wide, scrolled, costTop: cost.top,
   costBottom: cost.bottom});
</script>"""


@needs_chromium
def test_report_tables_fit_1280_px_and_the_cost_panel_is_on_the_first_screen(
    comparison: Comparison, tmp_path: Path
) -> None:
    """Measured in the browser: a copy of the report with a measuring script (the report
    itself allows no script) laid out in a 1280 x 900 window."""
    html = render_report(comparison)
    html = html.replace(f'<meta http-equiv="Content-Security-Policy" content="{CSP}">', "")
    page = tmp_path / "measured.html"
    page.write_text(html.replace("</body>", _MEASURE + "</body>"), encoding="utf-8")
    run = _chromium(page, tmp_path / "profile", "--window-size=1280,900", "--dump-dom")
    assert run.returncode == 0, run.stderr[-2000:]
    found = re.search(r'data-layout="([^"]*)"', run.stdout)
    assert found is not None, run.stdout[:2000]
    layout = json.loads(found.group(1).replace("&quot;", '"'))
    assert layout["scrolled"] == [] and layout["wide"] == [], layout
    assert layout["page"] <= layout["width"], layout  # no horizontal scrollbar
    assert layout["costBottom"] <= 900, layout  # verdict and cost: the first screen


# ---------------------------------------------------------------------------------------
# Return-series statistics: pair tests and overfitting


def test_pair_tests_table_shows_jkm_and_hac_per_pair_and_split(
    html: str, comparison: Comparison
) -> None:
    table = re.search(r'<table id="pairtests-tft-bf16_vs_f32".*?</table>', html, re.S)
    assert table is not None
    tests = comparison.families["tft"].contrasts[CONTRAST].pair_tests
    rows = re.findall(r'<tr data-pair="([^"]+)" data-split="(val|test)">(.*?)</tr>', table.group(0))
    assert [(p, s) for p, s, _ in rows] == [(p, s) for p in tests for s in ("val", "test")]
    for pair, split, cells in rows:
        t = tests[pair][split]
        assert f'<td class="jkm-p descriptive">{format_p(t.jkm_pvalue)}</td>' in cells
        assert f'<td class="hac-p">{format_p(t.hac_pvalue)}</td>' in cells
    diverged = dict(((p, s), c) for p, s, c in rows)[(pair_id("tft", 2), "val")]
    assert "not available" in diverged and "diverged" in diverged


def test_overfitting_table_shows_pbo_min_trl_and_spearman(
    html: str, comparison: Comparison
) -> None:
    for scope in ("tft", "dqn"):
        fit = comparison.families[scope].overfitting
        table = re.search(rf'<table id="overfitting-{scope}".*?</table>', html, re.S)
        assert table is not None
        values = dict(
            re.findall(r'<tr class="([a-z-]+)">.*?<td class="value">([^<]*)</td>', table.group(0))
        )
        assert values["pbo"] == format_num(fit.pbo)
        assert values["min-trl"] == str(math.ceil(fit.min_trl))
        assert values["spearman"] == format_num(fit.val_test_spearman, True)
    dqn = re.search(r'<table id="overfitting-dqn".*?</table>', html, re.S).group(0)  # type: ignore[union-attr]
    assert "not available: 1 of 11 completed trials have no returns artifact" in dqn


# ---------------------------------------------------------------------------------------
# Issue 25: adjusted values bold, the pair test is the bootstrap, MinTRL against luck,
# the mean beside the HL, and the power table in the reading notes and the README.


def test_only_adjusted_p_values_are_bold() -> None:
    comparison = _separated()  # one family, 8 of 8 configurations better by ~5
    inference = comparison.families["tft"].contrasts[CONTRAST].inference["val"]
    assert inference.holm_p_better == pytest.approx(2 / 256)  # 1/256, two directions
    html = render_report(comparison)
    for table_id in ("stats-tft", "summary-table"):
        table = re.search(rf'<table id="{table_id}".*?</table>', html, re.S)
        assert table is not None
        cells = re.findall(r"<td([^>]*)>([^<]*)</td>", table.group(0))
        bold = [attrs for attrs, _ in cells if "significant" in attrs]
        assert bold and all("adjusted-p" in attrs for attrs in bold), table_id
        raw = [text for attrs, text in cells if "raw-p" in attrs]
        assert "0.008" in raw  # the raw Wilcoxon p is shown, not emphasised
    row = re.search(
        r'<table id="stats-tft".*?<tr data-contrast="bf16_vs_f32" data-split="val">(.*?)</tr>',
        html,
        re.S,
    )
    assert row is not None
    assert '<td class="adjusted-p holm-better significant">0.008</td>' in row.group(1)


def test_the_pair_test_is_the_bootstrap_bh_adjusted_and_jkm_is_descriptive(
    html: str, comparison: Comparison
) -> None:
    table = re.search(r'<table id="pairtests-tft-bf16_vs_f32".*?</table>', html, re.S)
    assert table is not None
    head = table.group(0).split("</thead>")[0]
    assert "bootstrap p" in head and "BH q" in head and "JKM p (descriptive)" in head
    tests = comparison.families["tft"].contrasts[CONTRAST].pair_tests
    rows = re.findall(r'<tr data-pair="([^"]+)" data-split="(val|test)">(.*?)</tr>', table.group(0))
    for pair, split, cells in rows:
        t = tests[pair][split]
        assert f'<td class="raw-p boot-p">{format_p(t.boot_pvalue)}</td>' in cells
        assert f'<td class="jkm-p descriptive">{format_p(t.jkm_pvalue)}</td>' in cells
        cls = "adjusted-p boot-q" + (" significant" if t.boot_p_bh <= 0.05 else "")
        assert f'<td class="{cls}">{format_p(t.boot_p_bh)}</td>' in cells


def test_min_trl_is_shown_against_luck_and_against_zero(html: str, comparison: Comparison) -> None:
    fit = comparison.families["tft"].overfitting
    table = re.search(r'<table id="overfitting-tft".*?</table>', html, re.S)
    assert table is not None
    rows = dict(
        re.findall(r'<tr class="([a-z0-9-]+)"><td class="text">([^<]*)</td>', table.group(0))
    )
    assert "selection-aware" in rows["min-trl-sr0"]
    assert "vs 0, selection ignored" in rows["min-trl"]
    values = dict(
        re.findall(r'<tr class="([a-z0-9-]+)">.*?<td class="value">([^<]*)</td>', table.group(0))
    )
    expected = str(math.ceil(fit.min_trl_sr0)) if math.isfinite(fit.min_trl_sr0) else "—"
    assert values["min-trl-sr0"] == expected


def test_the_mean_difference_and_its_ci_stand_beside_the_hl(
    html: str, comparison: Comparison
) -> None:
    val = comparison.families["tft"].contrasts[CONTRAST].val
    table = re.search(r'<table id="stats-tft".*?</table>', html, re.S)
    assert table is not None
    assert "mean diff [95% t CI]" in table.group(0)
    assert (
        f'<td class="mean-diff">{val.mean_difference:+.3f} '
        f"[{val.mean_low:+.3f}, {val.mean_high:+.3f}]</td>"
    ) in table.group(0)


def _power_rows() -> list[tuple[str, str, str]]:
    from hpo.stats import EQUIVALENCE_POWER, POWER_TABLE_SD_RATIOS, configs_for_equivalence

    return [
        (f"{r:g}", str(EQUIVALENCE_POWER[r]), str(configs_for_equivalence(r)))
        for r in POWER_TABLE_SD_RATIOS
    ]


def test_the_reading_notes_give_the_power_table_and_the_error_of_many_claims(html: str) -> None:
    notes = re.search(r'<section id="reading-notes">.*?</section>', html, re.S)
    assert notes is not None
    text = notes.group(0)
    table = re.search(r'<table id="power-table".*?</table>', text, re.S)
    assert table is not None
    cells = re.findall(
        r"<tr><td>([^<]+)</td><td>([^<]+)</td><td class='approx'>([^<]+)</td></tr>",
        table.group(0),
    )
    assert cells == _power_rows()
    assert "Holm" in text and "two-sided 10%" in text
    assert "bootstrap" in text and "descriptive" in text


def test_the_readme_gives_the_same_power_table() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    section = readme.split("## The f32-versus-bf16 comparison", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| *([0-9.]+) *\| *([0-9]+) *\| *([0-9]+) *\|$", section, re.M)
    assert rows == _power_rows()
