"""Tiny sweep specs for end-to-end tests, and readers of what a sweep records: Tune's trial
folders (result rows, checkpoints) and experiment snapshot, and MLflow's child runs."""

from __future__ import annotations

import copy
import json
import pickle
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from hpo.spec import SweepSpec, parse_spec

if TYPE_CHECKING:
    from mlflow.entities import Run

# The one-model sweep of the reliability tests: tft only, in f32.
ONE_TFT: dict[str, Any] = {
    "families": ["tft"],
    "precisions": ["f32"],
    "search_space": {"tft": {"d_model": 8, "n_heads": 1, "lstm_layers": 1}},
}


def tiny_payload(tmp_path: Path, tracking_uri: str | None = None, **overrides: Any) -> dict:
    """The tiny sweep as the YAML a user writes; ``overrides`` replace top-level keys."""
    payload: dict[str, Any] = {
        "name": "e2e",
        "families": ["tft", "dqn"],
        "precisions": ["f32", "bf16"],
        "samples": 1,
        "search": "random",
        "scheduler": "fifo",
        "max_epochs": 2,
        "max_concurrent": 2,
        "storage": str(tmp_path / "results"),
        "tracking_uri": tracking_uri or f"sqlite:///{tmp_path / 'mlflow.db'}",
        "data": {"n_assets": 2, "n_bars": 600},
        "walk_forward": {"n_folds": 1},
        "trainer": {
            "lookback": 16,
            "batch_size": 32,
            "max_steps_per_epoch": 6,
            "rl_iterations": 10,
        },
        "search_space": {
            "tft": {"d_model": 8, "n_heads": 1, "lstm_layers": 1},
            "dqn": {"hidden": 32, "learning_starts": 64},
        },
    }
    payload.update(copy.deepcopy(overrides))
    return payload


def tiny_spec(tmp_path: Path, tracking_uri: str | None = None, **overrides: Any) -> SweepSpec:
    return parse_spec(tiny_payload(tmp_path, tracking_uri, **overrides))


def write_tiny_spec(
    tmp_path: Path, name: str, tracking_uri: str | None = None, **overrides: Any
) -> Path:
    """The tiny sweep named ``name`` as ``tmp_path/<name>.yaml``, for the ``hpo`` CLI: only
    the keys given (defaults stay the CLI's), checked by the spec parser first."""
    payload = tiny_payload(tmp_path, tracking_uri, name=name, **overrides)
    parse_spec(payload)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(payload))
    return path


def trial_runs(uri: str, experiment: str) -> list[Run]:
    """The sweep's child runs (one per trial) in MLflow; [] before the experiment exists."""
    from mlflow.tracking import MlflowClient  # imported here: spec-only tests skip MLflow

    from hpo.tracking import TAG_ROLE

    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return []
    runs = client.search_runs([found.experiment_id], max_results=1000)
    return [r for r in runs if r.data.tags.get(TAG_ROLE) == "trial"]


def trial_dirs(sweep_dir: Path) -> list[Path]:
    return sorted(p for p in sweep_dir.iterdir() if p.is_dir()) if sweep_dir.is_dir() else []


def trial_id(trial_dir: Path) -> str:
    return trial_dir.name.rsplit("-", 1)[-1]


def results(trial_dir: Path) -> list[dict[str, Any]]:
    """Tune's result rows of a trial, one per reported epoch (a line still being written is
    left out). The driver writes them beside its snapshots and copies them to the storage
    path with each snapshot, so they lag the trial by up to one snapshot period."""
    path = trial_dir / "result.json"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break  # the driver is still appending this line
    return rows


def last_result(trial_dir: Path) -> dict[str, Any] | None:
    """The trial's newest complete result row, or None while there is none to read: the
    driver's copy replaces result.json with each snapshot, so a read can meet the file
    empty for a moment even after rows were seen."""
    rows = results(trial_dir)
    return rows[-1] if rows else None


def newest_checkpoint(trial_dir: Path) -> str | None:
    """The name of the trial's newest checkpoint_<index> folder. The worker writes it
    itself, before it reports the epoch, so it is never behind what the driver knows."""
    names = sorted(p.name for p in trial_dir.glob("checkpoint_*"))
    return names[-1] if names else None


def checkpointed_epochs(trial_dir: Path) -> int:
    """How many epochs the trial's worker has checkpointed (one checkpoint per epoch)."""
    newest = newest_checkpoint(trial_dir)
    return 0 if newest is None else int(newest.rsplit("_", 1)[-1]) + 1


def snapshot(sweep_dir: Path) -> dict[str, dict[str, Any]] | None:
    """Tune's newest experiment snapshot in the storage path (what ``hpo resume`` restores):
    {trial id: {"status", "epoch", "checkpoint"}} of the last result it holds per trial. None
    while there is none, or while any file of it is incomplete (a copy under way)."""
    states = sorted(sweep_dir.glob("experiment_state-*.json"))
    if not states:
        return None
    session = states[-1].name.removeprefix("experiment_state-").removesuffix(".json")
    try:
        state = json.loads(states[-1].read_bytes())
        # The snapshot's other files (searcher, callbacks), JSON or pickles whatever their
        # names say; a file cut short is neither.
        for path in sweep_dir.glob(f"*-{session}.*"):
            data = path.read_bytes()
            try:
                json.loads(data)
            except ValueError:
                pickle.loads(data)
    except (OSError, EOFError, ValueError, pickle.UnpicklingError):
        return None
    trials = {}
    for trial_state, runtime in state["trial_data"]:
        trial = json.loads(trial_state) if isinstance(trial_state, str) else trial_state
        meta = json.loads(runtime) if isinstance(runtime, str) else runtime
        last = meta.get("last_result") or {}
        trials[trial["trial_id"]] = {
            "status": trial["status"],
            "epoch": int(last.get("epoch", 0)),
            "checkpoint": last.get("checkpoint_dir_name"),
        }
    return trials


def rung_decisions(sweep_dir: Path) -> dict[int, dict[str, bool]]:
    """ASHA's per-trial decisions (hpo.rungs) as the sweep's newest searcher snapshot
    holds them: rung epoch -> trial key -> went on."""
    newest = max(sweep_dir.glob("sweep-searcher-*.json"), key=lambda p: p.name)
    rungs = json.loads(newest.read_text())["rungs"]
    return {int(m): d for m, d in rungs["decisions"].items()}
