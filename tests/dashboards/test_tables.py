"""The verdict's one-sentence explanation says where the interval lies."""

from __future__ import annotations

from dashboards.report import render_report
from dashboards.tables import family_lines, verdict_sentence, verdict_text
from hpo.compare import VERDICT_SPLIT, compare_trials, comparison_tags
from hpo.stats import Verdict
from tests.hpo.compare_helpers import paired_records


def _sentence(diffs: list[float]) -> str:
    records = paired_records("tft", [[0.5]] * len(diffs), [[0.5 + d] for d in diffs])
    comparison = compare_trials(records, ("f32", "bf16"), margin=0.1)
    return verdict_sentence("tft", comparison.families["tft"].contrasts["bf16_vs_f32"])


def test_an_inconclusive_verdict_with_few_configurations_says_where_the_interval_lies() -> None:
    # With 4 configurations no 90% signed-rank interval exists (the widest covers 87.5%),
    # so the verdict is inconclusive whatever the data: the sentence must not claim the
    # interval "reaches beyond the margin" when it lies inside it or wholly below it.
    inside = _sentence([0.01, 0.0, -0.01, 0.02])
    assert "inconclusive" in inside and "inside the margin" in inside
    assert "reaches beyond" not in inside
    below = _sentence([-1.0, -1.0, -1.0, -1.0])
    assert "inconclusive" in below and "wholly below the margin" in below
    straddles = _sentence([-0.3, 0.05, 0.2, -0.15, 0.4, -0.05, 0.1, 0.25])
    assert "reaches beyond the margin" in straddles


def test_a_skewed_family_is_not_called_equivalent_and_its_tail_is_named() -> None:
    noise = [0.01, -0.01, 0.02, -0.02, 0.0, 0.015, -0.015, 0.005, -0.005, 0.012]
    sentence = _sentence([*noise, *(-x for x in noise[:9]), -0.5])
    assert sentence.startswith("tft: inconclusive")
    assert "skew" in sentence and "tft-c019" in sentence
    assert "mean" in sentence


def test_an_equivalent_verdict_states_the_mean_interval_too() -> None:
    noise = [0.01, -0.01, 0.02, -0.02, 0.0, 0.015, -0.015, 0.005, -0.005, 0.012]
    sentence = _sentence(noise)
    assert sentence.startswith("tft: equivalent")
    assert "mean" in sentence and "90% interval (t or BCa, the wider)" in sentence


def test_a_claim_lost_to_the_holm_adjustment_says_so() -> None:
    worse = [-0.5, -0.45, -0.6, -0.55, -0.4, -0.52]
    calm = [0.01, -0.02, 0.0, 0.015, -0.01, 0.005]
    records = paired_records("a", [[0.5]] * 6, [[0.5 + d] for d in worse])
    for family in "bcde":
        records += paired_records(family, [[0.5]] * 6, [[0.5 + d] for d in calm])
    comparison = compare_trials(records, ("f32", "bf16"), margin=0.1)
    sentence = verdict_sentence("a", comparison.families["a"].contrasts["bf16_vs_f32"])
    assert sentence.startswith("a: inconclusive")
    assert "Holm" in sentence and "10 one-sided claims" in sentence


def test_the_tables_decide_from_the_decision_never_from_its_words() -> None:
    # An equivalent family whose decision is then INCONCLUSIVE with a note that says
    # "equivalent": every line reads the enum, so the cell, the sentence, the family line,
    # the report and the tag all say inconclusive, and print the words as they are.
    noise = [0.01, -0.01, 0.02, -0.02, 0.0, 0.015, -0.015, 0.005, -0.005, 0.012]
    records = paired_records("tft", [[0.5]] * len(noise), [[0.5 + d] for d in noise])
    comparison = compare_trials(records, ("f32", "bf16"), margin=0.1)
    contrast = comparison.families["tft"].contrasts["bf16_vs_f32"]
    inference = contrast.inference[VERDICT_SPLIT]
    assert inference.decision is Verdict.EQUIVALENT and inference.verdict == "equivalent"
    inference.decision = Verdict.INCONCLUSIVE
    inference.decision_note = "equivalent by the interval, bf16 worse by the plan"
    text = "inconclusive: equivalent by the interval, bf16 worse by the plan"
    assert verdict_text(contrast) == inference.verdict == text
    sentence = verdict_sentence("tft", contrast)
    assert sentence.startswith(f"tft: {text}: the ")
    assert "both inside the margin" not in sentence  # the EQUIVALENT sentence
    assert "wholly below" not in sentence  # nor the WORSE one
    assert family_lines(comparison)[0].startswith(f"tft: {text} with 10 configurations")
    assert f'<td class="text verdict">{text}</td>' in render_report(comparison)
    assert comparison_tags(comparison)["cmp.tft.verdict"] == text
