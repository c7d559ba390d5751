"""The board of populations across processes (hpo/population_board.py), in process:
who copies whom at a boundary, at equal training time; every answer kept, and kept in
the sweep directory, so a restarted board answers as the first did and draws on from
where it was."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from hpo.population_board import BOARD_FILE, POPULATION_DIR, PopulationBoard
from trainables.pbt import PbtSettings, Range, explore

PBT = PbtSettings(
    interval_epochs=1,
    quantile=0.25,
    resample_probability=0.25,
    mutations={"lr": Range(1e-5, 1e-1, log=True)},
).to_dict()


def _post(board: PopulationBoard, member: str, epoch: int, score: float | None) -> Any:
    return board.at_boundary(
        "pop",
        PBT,
        trial=member,
        trial_id=f"t-{member}",
        epoch=epoch,
        score=score,
        settings={"lr": 1e-3 * (1 + ord(member[-1]) - ord("a"))},
        checkpoint=f"/checkpoints/{member}/{epoch}",
    )


def test_a_member_ranks_among_those_at_its_boundary_and_the_worst_copies_the_top() -> None:
    board = PopulationBoard()
    # Epoch 1: a (1.0), b (3.0), c (2.0) arrive; nobody is worst among fewer than 2, and
    # with 2 or 3 at quantile 0.25 one is bottom: b is not, c is not (a is lower).
    assert _post(board, "a", 1, 1.0) is None  # alone at its boundary
    assert _post(board, "b", 1, 3.0) is None  # the better of two
    assert _post(board, "c", 1, 2.0) is None  # a is the worst of three
    # An epoch-2 score never ranks against epoch 1's.
    assert _post(board, "a", 2, -5.0) is None
    decision = _post(board, "d", 1, 0.5)  # the worst of four: copies the best, b
    assert decision is not None
    assert (decision["donor"], decision["donor_key"], decision["checkpoint"]) == (
        "t-b",
        "b",
        "/checkpoints/b/1",
    )
    assert decision["before"] == {"lr": 4e-3} and decision["epoch"] == 1
    # The explored settings come from the donor's, drawn from the population's stream
    # after the donor's draw (one choice among the top quantile's one member).
    rng = random.Random("pop")
    rng.choice(["b"])
    assert decision["after"] == explore(
        {"lr": 2e-3}, PbtSettings.from_dict(PBT).mutations, rng, 0.25
    )
    assert board.exploits() == 1 and board.exploits("other") == 0


def test_a_member_without_a_score_neither_copies_nor_is_copied() -> None:
    board = PopulationBoard()
    assert _post(board, "a", 1, None) is None
    assert _post(board, "b", 1, float("nan")) is None
    assert _post(board, "c", 1, 1.0) is None  # alone among the scored
    decision = _post(board, "d", 1, 0.0)
    assert decision is not None and decision["donor_key"] == "c"


def test_equal_scores_rank_by_member_key_not_by_arrival() -> None:
    for order in (["a", "b"], ["b", "a"]):
        board = PopulationBoard()
        decisions = {m: _post(board, m, 1, 1.0) for m in order}
        # Equal scores: the higher key ranks lower, so b copies a whatever came first.
        assert decisions["a"] is None
        if order[-1] == "b":
            assert decisions["b"] is not None and decisions["b"]["donor_key"] == "a"


def test_a_restarted_board_answers_as_before_and_draws_on_from_its_file(tmp_path: Path) -> None:
    scores = {"a": 3.0, "b": 2.0, "c": 1.0, "d": 0.0}
    uninterrupted = PopulationBoard()
    for epoch in (1, 2):
        for member, score in scores.items():
            _post(uninterrupted, member, epoch, score)

    first = PopulationBoard(str(tmp_path))
    for member, score in scores.items():
        _post(first, member, 1, score)
    saved = json.loads((tmp_path / POPULATION_DIR / BOARD_FILE).read_text())
    assert saved["populations"]["pop"]["decisions"]["d@1"]["donor_key"] == "a"

    restarted = PopulationBoard(str(tmp_path))  # hpo resume starts the board from the file
    # A member that re-runs its boundary epoch gets the answer it got, whatever it posts.
    assert _post(restarted, "d", 1, 99.0) == first.populations["pop"]["decisions"]["d@1"]
    for member, score in scores.items():
        _post(restarted, member, 2, score)
    assert restarted.populations == uninterrupted.populations


def test_a_board_file_of_another_version_is_refused(tmp_path: Path) -> None:
    (tmp_path / POPULATION_DIR).mkdir()
    (tmp_path / POPULATION_DIR / BOARD_FILE).write_text(
        json.dumps({"version": 99, "populations": {}})
    )
    with pytest.raises(ValueError, match=r"pbt/board\.json: state version 99"):
        PopulationBoard(str(tmp_path))
