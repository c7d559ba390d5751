"""The report, the terminal lines and the JSON of a sequential comparison: a family's looks
table, its verdict read through ``Verdict``, the tail line beside an "equivalent" that a
few configurations contradict, and the interval of the mean that the verdict reads."""

from __future__ import annotations

import json
import math

import pytest

from dashboards.report import dom_id, render_report
from dashboards.tables import family_lines, format_interval, verdict_sentence
from hpo.compare import VERDICT_SPLIT, Comparison, compare_trials
from hpo.search.budget import Outcome, SequentialBudget, TrialOutcome
from hpo.stats import sequential_verdict
from tests.hpo.compare_helpers import trial_record

PLAN = (6, 8, 10, 12)
# Skewed but centred (issue 39): most configurations unchanged, one loses 0.2 Sharpe.
KAN = [0.004 * math.sin(3.0 * i) for i in range(12)]
KAN[3] = -0.2
# liquid: bf16 better by far more than the margin.
LIQUID = [0.8 + 0.05 * math.cos(i) for i in range(12)]


def _record(family: str, differences: list[float]) -> dict:
    budget = SequentialBudget(family, PLAN, 0.1, 0.05, "f32", "bf16")
    for i, d in enumerate(differences):
        if budget.done:
            break
        budget.made(f"{family}-c{i:03d}")
        f32 = 0.5 + 0.01 * i
        budget.on_outcome(
            Outcome(
                f"{family}-c{i:03d}",
                (
                    TrialOutcome("f32", 0, {"test_sharpe": f32}),
                    TrialOutcome("bf16", 0, {"test_sharpe": f32 + d}),
                ),
            )
        )
    return budget.record()


@pytest.fixture(scope="module")
def comparison() -> Comparison:
    records = {"kan": _record("kan", KAN), "liquid": _record("liquid", LIQUID)}
    trials = []
    for family, differences in (("kan", KAN), ("liquid", LIQUID)):
        for i in range(records[family]["configs_made"]):
            f32 = 0.5 + 0.01 * i
            trials.append(trial_record(family, "f32", i, 0, f32))
            trials.append(trial_record(family, "bf16", i, 0, f32 + differences[i]))
    return compare_trials(trials, ("f32", "bf16"), sequential=records)


def test_each_family_reads_its_looks(comparison: Comparison) -> None:
    kan = comparison.families["kan"].sequential
    liquid = comparison.families["liquid"].sequential
    assert kan is not None and liquid is not None
    assert [look.decision for look in kan.looks] == sequential_verdict(KAN, PLAN, 0.1)
    assert [look.decision for look in liquid.looks] == sequential_verdict(LIQUID, PLAN, 0.1)
    assert kan.decision == "equivalent" and liquid.decision == "better"
    # The family's verdict is its contrast's on the verdict's split (decision and note).
    kan_verdict = comparison.families["kan"].contrasts["bf16_vs_f32"].verdict()
    assert kan_verdict == "equivalent"
    headline = comparison.families["liquid"].contrasts["bf16_vs_f32"].inference[VERDICT_SPLIT]
    assert headline.verdict == "bf16 better"
    # The JSON that `hpo compare --json` writes: looks with configs, low, high, decision.
    payload = json.loads(json.dumps(comparison.to_dict(), allow_nan=False))
    looks = payload["families"]["kan"]["sequential"]["looks"]
    assert [look["configs"] for look in looks] == [6, 8, 10]
    assert looks[0]["low"] is None and looks[-1]["low"] < 0 < looks[-1]["high"]
    assert payload["families"]["kan"]["sequential"]["decision"] == "equivalent"


def test_the_report_shows_the_looks_the_tail_and_the_verdicts_interval(
    comparison: Comparison,
) -> None:
    html = render_report(comparison)
    for family in ("kan", "liquid"):
        assert f'id="{dom_id("looks", family)}"' in html
        assert f'id="{dom_id("stopped", family)}"' in html
    assert html.count('data-configs="') == 6  # 3 looks each
    assert "equivalent (sequential): at the look at 10 configurations" in html
    # "Equivalent on average" beside the configuration bf16 breaks.
    lines = family_lines(comparison)
    assert lines[0].startswith("kan: equivalent after 10 of up to 12 configurations")
    tail = next(line for line in lines if "loses more than 0.1" in line)
    assert "1 of 10 configurations" in tail and "kan-c003" in tail
    assert tail.strip() in html
    assert "90% interval (t or BCa, the wider)" in html
    inference = comparison.families["kan"].contrasts["bf16_vs_f32"].inference["test"]
    cell = format_interval(inference.mean_tost_low, inference.mean_tost_high)
    assert f'<td class="mean-verdict-interval">{cell}</td>' in html
    # Skew is said (a note with the tail), never a verdict of its own.
    assert inference.verdict == "equivalent" and inference.skewed
    assert "strongly skewed differences (sample skewness" in (inference.verdict_note or "")


def test_a_fixed_design_sentence_reads_the_verdict_enum(comparison: Comparison) -> None:
    contrast = comparison.overall.contrasts["bf16_vs_f32"]
    sentence = verdict_sentence("overall", contrast)
    assert sentence.startswith(f"overall: {contrast.inference[VERDICT_SPLIT].verdict}")
