"""A sweep's trials as rows: what ``hpo status``, ``hpo best``, ensembles and the summary read.

Value types and pure functions over them; :func:`trial_rows` reads Ray Tune's experiment
state (no MLflow, no data: it works from any machine that reaches the storage).

Words for where a trial is, each for one idea:

* *terminated* (:attr:`TrialStatus.terminated`): Tune's status TERMINATED: the trial ran
  its course (to its last epoch, stopped by the scheduler, diverged, or out of memory),
  as opposed to PENDING, RUNNING, PAUSED or ERROR;
* *done* (:attr:`TrialRow.done`): a trial with its final result: terminated, and not an
  OOM attempt whose retry is still to run;
* *completed* (``hpo.compare``'s trial state): done with a finite validation Sharpe, as
  opposed to *diverged*.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster.storage import SweepLocation


class TrialStatus(str):
    """A trial's Tune status (``PENDING``, ``RUNNING``, ``PAUSED``, ``TERMINATED``,
    ``ERROR``)."""

    @property
    def terminated(self) -> bool:
        """The trial ran its course (see the module docstring)."""
        return self == "TERMINATED"


@dataclass(frozen=True)
class TrialRow:
    """One trial of a sweep as Tune last recorded it (one OOM attempt, for ``retried``)."""

    trial_id: str
    family: str
    precision: str
    seed: int
    pair_id: str
    status: TrialStatus
    epochs: int
    val_sharpe: float | None
    test_sharpe: float | None
    fell_back_to_f32: bool
    diverged: bool
    params: dict[str, Any]
    checkpoint: str | None
    config_id: str = ""
    gpu_fraction_floor: float = 0.0  # > 0: an OOM retry's attempt
    attempt: int = 0  # OOM retries before this attempt (records before it: by the floor)
    oom_retry_gpu_fraction: float | None = None  # ran out of GPU memory; retry at this share
    gpu_s: float = 0.0  # GPU share x seconds of its epochs so far, on CUDA (trainables.trial)
    cpu_s: float = 0.0  # process CPU seconds of its epochs so far
    exploits: int = 0  # population-based training: times it copied another trial so far
    # population-based training: the settings its exploits changed, as it finished with
    # them (``params`` are what the sweep started it with); see :func:`explored_settings`
    explored: dict[str, float] = field(default_factory=dict)
    # population-based training: the population it belongs to (a group trial's id, or the
    # id a population spanning Tune trials gives its trials) and its exploits, as pbt_lineage reports them
    population: str = ""
    lineage: list[dict[str, Any]] = field(default_factory=list)

    @property
    def done(self) -> bool:
        """Ran to its end, and is not an OOM attempt whose retry is still to run."""
        return self.status.terminated and self.oom_retry_gpu_fraction is None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def trial_rows(where: str | Path | SweepLocation, *, retried: bool = False) -> list[TrialRow]:
    """Every trial of a sweep with its status, final metrics and newest checkpoint.

    A trial that ran out of GPU memory runs again as a new Tune trial: its rows are the
    attempts. Only the newest attempt of each trial is a row unless ``retried``; the OOM
    attempts it replaced are left out (see :func:`latest_attempts`)."""
    sweep_dir = SweepLocation.parse(where)
    if not sweep_dir.has_tune_state():
        return []  # no trial has been recorded yet
    return rows_of_trials(_tune_trials(sweep_dir.uri), sweep_dir, retried=retried)


def rows_of_trials(
    trials: list[Any], sweep_dir: SweepLocation, *, retried: bool = False
) -> list[TrialRow]:
    """:func:`trial_rows` of Tune trials at hand (read from storage, or those the sweep's
    driver holds when its experiment ends: :class:`hpo.final_trials.FinalTrials`)."""
    from trainables.checkpoint_files import CKPT_SUBDIR
    from trainables.config import RETRY_ATTEMPT_KEY, RETRY_FLOOR_KEY

    rows = []
    for trial in trials:
        for trial_id, config, result, state in _trials_in(trial):
            checkpoint = trial.checkpoint
            rows.append(
                TrialRow(
                    trial_id=trial_id,
                    family=config.get("family", "?"),
                    precision=config.get("precision", "?"),
                    seed=int(config.get("seed", 0)),
                    pair_id=config.get("pair_id", ""),
                    status=TrialStatus(trial.status),
                    epochs=int(result.get("epoch", 0)),
                    val_sharpe=_finite(result.get("val_sharpe")),
                    test_sharpe=_finite(result.get("test_sharpe")),
                    fell_back_to_f32=bool(result.get("fell_back_to_f32")),
                    diverged=bool(result.get("diverged")),
                    params=dict(config.get("params", {})),
                    checkpoint=sweep_dir.uri_of(f"{checkpoint.path}/{state}")
                    if checkpoint is not None
                    and not (state != CKPT_SUBDIR and result.get("diverged"))
                    else None,
                    config_id=str(config.get("config_id", "")),
                    gpu_fraction_floor=float(config.get(RETRY_FLOOR_KEY) or 0.0),
                    attempt=int(config.get(RETRY_ATTEMPT_KEY) or 0),
                    oom_retry_gpu_fraction=_finite(result.get("oom_retry_gpu_fraction"))
                    if result.get("oom")
                    else None,
                    gpu_s=_finite(result.get("gpu_s_total")) or 0.0,
                    cpu_s=_finite(result.get("cpu_s_total")) or 0.0,
                    exploits=int(_finite(result.get("pbt_exploits")) or 0),
                    explored=explored_settings(result),
                    population=_population(trial, config),
                    lineage=list(result.get("pbt_lineage") or []),
                )
            )
    return rows if retried else latest_attempts(rows)


def _tune_trials(uri: str) -> list[Any]:
    """Tune's trials as its newest experiment snapshot holds them (status, config, last
    result, checkpoint). ``ExperimentAnalysis`` also reads every trial's whole result
    history into a DataFrame when it is made, which no row needs: seconds and hundreds of
    MB at a thousand trials, after Tune read them all once already at the sweep's end."""
    from ray.tune import ExperimentAnalysis

    class Snapshot(ExperimentAnalysis):
        def _fetch_trial_dataframes(self) -> dict[str, Any]:
            return {}

    return list(Snapshot(uri).trials)


def _trials_in(trial: Any) -> list[tuple[str, Mapping[str, Any], dict[str, Any], str]]:
    """(trial id, config, last result, checkpoint subpath) of each trial a Tune trial
    holds: itself, or each trial of a group trial (``trainables.trial._train_group``)."""
    from trainables.checkpoint_files import CKPT_SUBDIR
    from trainables.trial_keys import trials_of

    result = trial.last_result or {}
    held = trials_of(trial.trial_id, trial.config)
    if held[0][2] == "":  # a trial of its own
        return [(trial.trial_id, trial.config, result, CKPT_SUBDIR)]
    reported = result.get("trials") or {}
    return [
        (trial_id, config, dict(reported.get(slug) or {}), f"{CKPT_SUBDIR}/{slug}")
        for trial_id, config, slug in held
    ]


def latest_attempts(rows: list[TrialRow]) -> list[TrialRow]:
    """``rows`` without the OOM attempts that a retry of the same trial replaced.

    Trial ids are not chronological; attempts are: each retry carries its attempt number
    (:attr:`~trainables.config.TrialConfig.attempt`), so a trial's newest attempt is the
    one with the largest."""
    newest: dict[tuple[str, str, int], TrialRow] = {}
    for row in rows:
        key = (row.config_id, row.precision, row.seed)
        if row.config_id and (key not in newest or row.attempt > newest[key].attempt):
            newest[key] = row
    return [
        r
        for r in rows
        if not (
            r.config_id
            and r.oom_retry_gpu_fraction is not None
            and newest[(r.config_id, r.precision, r.seed)] is not r
        )
    ]


def spent_hours(rows: list[TrialRow]) -> dict[str, dict[str, float]]:
    """GPU- and CPU-hours spent so far per precision (and ``all``), as the trials last
    reported them: pass every attempt (``trial_rows(..., retried=True)``), since an OOM
    attempt's time was spent too, up to its last completed epoch."""
    spent: dict[str, dict[str, float]] = {"all": {"gpu_hours": 0.0, "cpu_hours": 0.0}}
    for row in rows:
        for key in ("all", row.precision):
            into = spent.setdefault(key, {"gpu_hours": 0.0, "cpu_hours": 0.0})
            into["gpu_hours"] += row.gpu_s / 3600.0
            into["cpu_hours"] += row.cpu_s / 3600.0
    return spent


def best_rows(
    rows: list[TrialRow], family: str | None = None, precision: str | None = None
) -> list[TrialRow]:
    """The best trial (final validation Sharpe) per (family, precision)."""
    best: dict[tuple[str, str], TrialRow] = {}
    for row in rows:
        if (
            (family and row.family != family)
            or (precision and row.precision != precision)
            or row.val_sharpe is None
        ):
            continue
        key = (row.family, row.precision)
        if key not in best or row.val_sharpe > (best[key].val_sharpe or float("-inf")):
            best[key] = row
    return [best[k] for k in sorted(best)]


def explored_settings(result: Mapping[str, Any]) -> dict[str, float]:
    """A population trial's settings that its exploits changed, by name, at the values it
    finished with: its last exploit's ``after`` where that differs from its first
    exploit's ``before`` (what the sweep started it with), from the ``pbt_lineage`` of
    its last result entry. Empty for a trial that never exploited."""
    lineage = result.get("pbt_lineage") or []
    if not lineage:
        return {}
    started, finished = lineage[0]["before"], lineage[-1]["after"]
    return {name: float(v) for name, v in finished.items() if started.get(name) != v}


def settings_by_epoch(
    row: TrialRow, names: Iterable[str] = ()
) -> dict[str, list[tuple[int, float]]]:
    """A population trial's mutable settings at each epoch it trained (1 to
    ``row.epochs``), by name: what the sweep started it with until its first exploit, then
    each exploit's ``after`` from the epoch after it. ``names``: those to give (a
    population's, so a trial that never exploited has a line for each too), besides
    those its lineage records; a trial's starting value comes from its first exploit's
    ``before``, else its ``params``, else its family's default. A name with no value
    anywhere is left out."""
    wanted = sorted({*names, *(n for e in row.lineage for n in e["before"])})
    out = {}
    for name in wanted:
        value = row.lineage[0]["before"].get(name) if row.lineage else None
        if value is None:
            value = row.params.get(name, _family_default(row.family, name))
        if not isinstance(value, int | float) or isinstance(value, bool):
            continue
        changes = {int(e["epoch"]): float(e["after"][name]) for e in row.lineage}
        points = []
        current = float(value)
        for epoch in range(1, row.epochs + 1):
            points.append((epoch, current))
            current = changes.get(epoch, current)  # an exploit after this epoch
        out[name] = points
    return out


def _family_default(family: str, name: str) -> Any:
    """``family``'s default of model setting ``name`` (None: no such setting, or a family
    that does not import here)."""
    import dataclasses

    from models import FamilyError, get_family

    try:
        return dataclasses.asdict(get_family(family).make_config({})).get(name)
    except FamilyError:
        return None


def _population(trial: Any, config: Mapping[str, Any]) -> str:
    """The population a trial belongs to ("" outside population-based training): the id
    a population spanning several Tune trials gives its trials (or their group trials),
    or its group trial's id where the group is the population."""
    from trainables.config import PBT_KEY, POPULATION_KEY

    held = trial.config or {}
    for source in (config, held):  # a trial's own config, or its group trial's
        if source.get(POPULATION_KEY):
            return str(source[POPULATION_KEY])
    return str(trial.trial_id) if held.get(PBT_KEY) else ""


def _finite(value: Any) -> float | None:
    if isinstance(value, int | float) and value == value and abs(value) != float("inf"):
        return float(value)
    return None
