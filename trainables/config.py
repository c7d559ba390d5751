"""The trial configuration: what the trainer owns, what the model family owns.

A sweep samples one flat dict per trial (``{"lr": 3e-4, "hidden": 64, "gamma": 0.97}``).
:func:`split_trial_config` is the one place that dict is divided: keys that name a
:class:`TrainConfig` field go to the trainer, keys that name a field of the family's config
dataclass go to the model, anything else is an error naming the key and the known ones.

:class:`TrialConfig` is the one codec of the dict a Ray Tune trial carries: the sweep's
searcher encodes it (``to_dict``), the trainable, packing and the benchmarks decode it
(``from_dict``) and turn it into a :class:`TrainConfig` (``train_config``). The dict stays
plain JSON because Tune stores it in the experiment state and the searcher in its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from models import get_family
from trainables.pbt import PbtSettings
from trainables.precision_names import POLICY_NAMES
from trainables.trial_keys import GROUP_KEY as GROUP_KEY
from trainables.trial_keys import is_group_trial as is_group_trial
from trainables.trial_keys import trial_key, trial_slugs
from trainables.trial_keys import trial_slug as trial_slug

CUDA_GRAPHS_SETTINGS: tuple[str, ...] = ("auto", "on", "off")
FUSE_SETTINGS: tuple[str, ...] = ("auto", "on", "off")


@dataclass(frozen=True)
class DataConfig:
    """Where the bars come from."""

    source: str = "synthetic"
    """``synthetic`` (the embedded generator) or a path: a CSV/Parquet file or a directory."""
    n_assets: int = 4
    """Synthetic only: number of assets."""
    n_bars: int = 1500
    """Synthetic only: bars per asset."""
    seed: int = 0
    """Synthetic only: generator seed (the trial seed does not change the data)."""
    signal: float = 0.15
    """Synthetic only: strength of the planted AR(1) signal (0 = unpredictable)."""


@dataclass(frozen=True)
class TrainConfig:
    """Everything the shared trainer needs besides the family's own settings."""

    family: str = "tft"
    """Family name (``hpo families`` lists them)."""
    precision: str = "f32"
    """Precision policy: f32, bf16, bf16-mixed, fp16-mixed or auto."""
    epochs: int = 10
    """Training epochs; each epoch trains every walk-forward fold once, then validates."""
    seed: int = 0
    """Seeds model init, minibatch order, exploration and dropout."""
    lr: float = 1e-3
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    batch_size: int = 64
    """Supervised minibatch size (windows, each with every asset)."""
    grad_clip: float | None = 1.0
    """Clip the global gradient norm to this value (None: no clipping)."""
    lookback: int = 32
    """Bars in each input window."""
    max_steps_per_epoch: int | None = None
    """Supervised: cap on minibatches per fold per epoch (None: one pass over the split)."""
    rl_iterations: int = 40
    """RL: collect-then-learn cycles per fold per epoch."""
    cost: float = 1e-4
    """Transaction cost per unit of turnover (1e-4 = 1 basis point)."""
    periods_per_year: float = 252.0
    """Bars per year, for annualizing Sharpe and Sortino."""
    n_folds: int = 2
    """Walk-forward folds (one model per fold, trained side by side)."""
    val_fraction: float = 0.15
    """Share of the bars in each fold's validation window."""
    test_fraction: float = 0.2
    """Share of the bars held out as the final test period (reported, never selected on)."""
    purge: int = 1
    """Decision bars dropped before validation because their labels overlap it."""
    embargo: int = 5
    """Further bars left out between training and validation."""
    fallback_after: int = 8
    """K: consecutive non-finite steps under bf16 that switch the trial to f32."""
    log_every: int = 50
    """Optimizer steps between host reads of the device counters."""
    device: str = "auto"
    """auto (cuda when present), cpu or cuda[:N]."""
    cuda_graphs: str = "auto"
    """Capture each fold's training step (forward, loss, backward, guarded update, guard
    counters) in a CUDA graph and replay it: ``auto`` on a CUDA device for a family whose
    record declares its step static (``Family.static_step``), ``on`` on a CUDA device for
    any forecast family, ``off`` never. Without CUDA, for rl families, and when a capture
    fails, the step runs eagerly and the reason is logged; the ``cuda_graphs`` metric says
    which ran (1 replayed, 0 eager)."""
    fuse: str = "auto"
    """Train the walk-forward folds fused, one vmapped model with a fold in each slot of
    its leading dimension (``trainables.stacked``): ``auto`` wherever the family fuses on this
    device (``Family.fusable``; on a CPU only where ``Family.fuse_on_cpu``) and there are
    two folds or more; ``on`` wherever the family fuses at all (a single fold too: the
    benchmarks' baseline); ``off`` never. Where the folds cannot fuse (a fold shorter
    than a batch, a module vmap cannot batch) they train one after another and the
    reason is logged; the ``fused_folds`` metric says how many trained fused."""
    data: DataConfig = field(default_factory=DataConfig)
    model_config: Mapping[str, Any] = field(default_factory=dict)
    """The family's settings (fields of its config dataclass) that differ from defaults."""

    def __post_init__(self) -> None:
        _check(
            self.precision in POLICY_NAMES,
            "precision",
            self.precision,
            f"one of {list(POLICY_NAMES)}",
        )
        _check(self.epochs >= 1, "epochs", self.epochs, "an integer >= 1")
        _check(self.lr > 0, "lr", self.lr, "a number > 0")
        _check(self.batch_size >= 1, "batch_size", self.batch_size, "an integer >= 1")
        _check(self.lookback >= 2, "lookback", self.lookback, "an integer >= 2")
        _check(self.n_folds >= 1, "n_folds", self.n_folds, "an integer >= 1")
        _check(self.cost >= 0, "cost", self.cost, "a number >= 0")
        _check(
            self.cuda_graphs in CUDA_GRAPHS_SETTINGS,
            "cuda_graphs",
            self.cuda_graphs,
            f"one of {list(CUDA_GRAPHS_SETTINGS)}",
        )
        _check(self.fallback_after >= 1, "fallback_after", self.fallback_after, "an integer >= 1")
        _check(self.fuse in FUSE_SETTINGS, "fuse", self.fuse, f"one of {list(FUSE_SETTINGS)}")
        get_family(self.family)  # unknown family -> error naming the known ones

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["model_config"] = dict(self.model_config)
        return out

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> TrainConfig:
        values = dict(values)
        data = DataConfig(**values.pop("data", {}))
        return cls(data=data, **values)

    def replace(self, **changes: Any) -> TrainConfig:
        return dataclasses.replace(self, **changes)


TRAIN_KEYS = frozenset(f.name for f in dataclasses.fields(TrainConfig)) - {"data", "model_config"}
DATA_KEYS = frozenset(f.name for f in dataclasses.fields(DataConfig))


def _check(ok: bool, name: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ValueError(f"{name} must be {allowed}, got {value!r}")


def split_trial_config(
    family_name: str, flat: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Divide a flat config into (trainer keys, model keys, ``data.*`` keys); unknown keys raise."""
    model_keys = set(get_family(family_name).config_fields())
    train: dict[str, Any] = {}
    model_values: dict[str, Any] = {}
    data_values: dict[str, Any] = {}
    unknown = []
    for key, value in flat.items():
        if key in model_keys:
            model_values[key] = value
        elif key in TRAIN_KEYS:
            train[key] = value
        elif key.startswith("data.") and key.removeprefix("data.") in DATA_KEYS:
            data_values[key.removeprefix("data.")] = value
        else:
            unknown.append(key)
    if unknown:
        raise ValueError(
            f"unknown setting(s) {sorted(unknown)} for family {family_name!r}; trainer settings: "
            f"{sorted(TRAIN_KEYS)}; data settings: {sorted('data.' + k for k in DATA_KEYS)}; "
            f"{family_name} settings: {sorted(model_keys)}"
        )
    return train, model_values, data_values


def build_train_config(
    family: str, flat: Mapping[str, Any], data: DataConfig | None = None, **base: Any
) -> TrainConfig:
    """A :class:`TrainConfig` from a flat dict of settings over ``base`` and ``data`` defaults."""
    train, model_values, data_values = split_trial_config(family, flat)
    data = dataclasses.replace(data or DataConfig(), **data_values)
    merged_model = {**base.pop("model_config", {}), **model_values}
    return TrainConfig(family=family, data=data, model_config=merged_model, **{**base, **train})


RETRY_FLOOR_KEY = "gpu_fraction_floor"
"""Trial-dict key of :attr:`TrialConfig.gpu_fraction_floor` (present only after an OOM)."""
RETRY_GPU_TYPE_KEY = "gpu_type"
"""Trial-dict key of :attr:`TrialConfig.gpu_type` (present only after an OOM on a typed node)."""
RETRY_ATTEMPT_KEY = "oom_attempt"
"""Trial-dict key of :attr:`TrialConfig.attempt` (present only after an OOM)."""
_TRIAL_REQUIRED = ("family", "precision", "seed", "params", "base")
PBT_KEY = "pbt"
"""Trial- and group-trial-dict key of a population's :class:`~trainables.pbt.PbtSettings`."""
POPULATION_KEY = "population"
"""Trial-dict key of :attr:`TrialConfig.population` (a population across processes only)."""
_TRIAL_OPTIONAL = (
    "config_id",
    "pair_id",
    RETRY_FLOOR_KEY,
    RETRY_GPU_TYPE_KEY,
    RETRY_ATTEMPT_KEY,
    PBT_KEY,
    POPULATION_KEY,
)


@dataclass(frozen=True)
class TrialBase:
    """What every trial of a sweep shares (the ``base`` of each trial dict)."""

    epochs: int
    """Epochs per trial (the spec's ``max_epochs``)."""
    trainer: Mapping[str, Any] = field(default_factory=dict)
    """:class:`TrainConfig` fields fixed for the sweep (walk-forward settings included)."""
    data: DataConfig = field(default_factory=DataConfig)

    def to_dict(self) -> dict[str, Any]:
        return {
            "epochs": self.epochs,
            "trainer": dict(self.trainer),
            "data": dataclasses.asdict(self.data),
        }

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> TrialBase:
        return cls(
            epochs=int(values["epochs"]),
            trainer=dict(values.get("trainer", {})),
            data=DataConfig(**values.get("data", {})),
        )


@dataclass(frozen=True)
class TrialConfig:
    """One Ray Tune trial's config. Its dict form (:meth:`to_dict`) is::

    {"family", "precision", "seed", "config_id", "pair_id",
     "params": {flat settings}, "base": TrialBase.to_dict()
     [, "gpu_fraction_floor", "gpu_type", "oom_attempt"][, "pbt", "population"]}
    """

    family: str
    precision: str
    seed: int
    params: Mapping[str, Any]
    """The flat settings of this trial: the stream's fixed keys plus the sampled ones."""
    base: TrialBase
    config_id: str = ""
    """The sampled configuration this trial runs (the searcher's suggestion): its seeds,
    and in compare mode its precisions, are the configuration's trials."""
    pair_id: str = ""
    """Shared by the trials of one configuration and seed that differ only in precision."""
    gpu_fraction_floor: float = 0.0
    """The least GPU share after a CUDA OOM (0: none); packing never asks for less."""
    gpu_type: str = ""
    """After a CUDA OOM, the GPU type it ran out of memory on: the floor is a share of that
    type's GPU, so the retry goes there again, also from a resumed sweep whose packer has
    placed nothing yet ("": the packer chooses)."""
    attempt: int = 0
    """OOM retries before this one (0: the first attempt). Attempts are ordered by it: a
    floor need not grow (each half of a split group asks half a GPU, after a whole one)."""
    pbt: PbtSettings | None = None
    """How its population trains, where it is a trial of a population spanning Tune trials
    in a Tune trial of its own. A group trial's trials carry nothing: the group trial
    carries its population's settings (and id, where the population spans it)."""
    population: str = ""
    """The population it belongs to (its first configuration's id), with :attr:`pbt`."""

    def train_config(self) -> TrainConfig:
        """The shared trainer's config of this trial."""
        return build_train_config(
            self.family,
            self.params,
            data=self.base.data,
            precision=self.precision,
            seed=self.seed,
            epochs=self.base.epochs,
            **self.base.trainer,
        )

    def with_floor(self, floor: float, gpu_type: str = "") -> TrialConfig:
        """The OOM retry of this trial: at least ``floor`` of a ``gpu_type`` GPU (the type
        it had, where the OOM report names none), one attempt later."""
        return dataclasses.replace(
            self,
            gpu_fraction_floor=float(floor),
            gpu_type=gpu_type or self.gpu_type,
            attempt=self.attempt + 1,
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "family": self.family,
            "precision": self.precision,
            "seed": self.seed,
            "config_id": self.config_id,
            "pair_id": self.pair_id,
            "params": dict(self.params),
            "base": self.base.to_dict(),
        }
        if self.gpu_fraction_floor > 0:
            out[RETRY_FLOOR_KEY] = self.gpu_fraction_floor
        if self.gpu_type:
            out[RETRY_GPU_TYPE_KEY] = self.gpu_type
        if self.attempt:
            out[RETRY_ATTEMPT_KEY] = self.attempt
        if self.pbt is not None:
            out[PBT_KEY] = self.pbt.to_dict()
            out[POPULATION_KEY] = self.population
        return out

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> TrialConfig:
        """Decode a trial dict; a missing or unknown key raises naming it."""
        missing = [k for k in _TRIAL_REQUIRED if k not in config]
        unknown = sorted(set(config) - set(_TRIAL_REQUIRED) - set(_TRIAL_OPTIONAL))
        if missing or unknown:
            raise ValueError(
                f"not a trial config: missing {missing}, unknown {unknown}; keys are "
                f"{list(_TRIAL_REQUIRED)} and optionally {list(_TRIAL_OPTIONAL)}"
            )
        return cls(
            family=str(config["family"]),
            precision=str(config["precision"]),
            seed=int(config["seed"]),
            params=dict(config["params"]),
            base=TrialBase.from_dict(config["base"]),
            config_id=str(config.get("config_id", "")),
            pair_id=str(config.get("pair_id", "")),
            gpu_fraction_floor=float(config.get(RETRY_FLOOR_KEY) or 0.0),
            gpu_type=str(config.get(RETRY_GPU_TYPE_KEY) or ""),
            attempt=int(config.get(RETRY_ATTEMPT_KEY) or 0),
            pbt=PbtSettings.from_dict(config[PBT_KEY]) if config.get(PBT_KEY) else None,
            population=str(config.get(POPULATION_KEY) or ""),
        )


@dataclass(frozen=True)
class GroupTrialConfig:
    """One Ray Tune trial that trains several trials as one group
    (:class:`trainables.group.TrainerGroup`). Its dict form is::

    {"family", "precision", "config_id", "group": [trial dicts][, "pbt": {...}[, "population"]]}

    where family and precision are its trials' own (they share them) and config_id the
    first trial's (a group may hold several configurations of one shape): Tune's trial
    table, directory names and the sweep's progress read them as from any trial. A group
    trial whose trials are a population (``scheduler = "pbt"``) carries its
    :class:`~trainables.pbt.PbtSettings` under ``"pbt"``."""

    trials: tuple[TrialConfig, ...]
    pbt: PbtSettings | None = None
    population: str = ""
    """With ``pbt``: the population its trials belong to where it spans several group
    trials ("": the population is this group trial's trials). Its trials then exploit
    through the sweep's board and boundary checkpoints, as trials alone do."""

    def __post_init__(self) -> None:
        if not self.trials:
            raise ValueError("a group trial needs at least one trial")
        first = self.trials[0]
        for t in self.trials[1:]:
            if (t.family, t.precision) != (first.family, first.precision):
                raise ValueError(
                    f"a group trial's trials share family and precision: "
                    f"{trial_key(t.to_dict())!r} is {t.family}/{t.precision}, "
                    f"{trial_key(first.to_dict())!r} {first.family}/{first.precision}"
                )

    def to_dict(self) -> dict[str, Any]:
        first = self.trials[0]
        out: dict[str, Any] = {
            "family": first.family,
            "precision": first.precision,
            "config_id": first.config_id,
            GROUP_KEY: [t.to_dict() for t in self.trials],
        }
        if self.pbt is not None:
            out[PBT_KEY] = self.pbt.to_dict()
        if self.population:
            out[POPULATION_KEY] = self.population
        return out

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> GroupTrialConfig:
        pbt = config.get(PBT_KEY)
        return cls(
            trials=tuple(TrialConfig.from_dict(t) for t in config[GROUP_KEY]),
            pbt=PbtSettings.from_dict(pbt) if pbt is not None else None,
            population=str(config.get(POPULATION_KEY) or ""),
        )

    def train_configs(self) -> list[TrainConfig]:
        return [t.train_config() for t in self.trials]

    def slugs(self) -> list[str]:
        """Each trial's name in reports and checkpoint paths (:func:`trial_slugs`)."""
        return trial_slugs([t.to_dict() for t in self.trials])


def share_sized_by(config: Mapping[str, Any]) -> tuple[TrialConfig, int]:
    """(trial, trials of its group) a Tune trial's GPU share is sized and placed by: the
    trial itself and 1, or a group trial's first trial (it carries the group's OOM floor
    and GPU type) and the group's size."""
    if is_group_trial(config):
        trials = GroupTrialConfig.from_dict(config).trials
        return trials[0], len(trials)
    return TrialConfig.from_dict(config), 1


def parse_assignments(items: list[str]) -> dict[str, Any]:
    """``["lr=3e-4", "hidden=64", "distributional=true"]`` -> typed dict (CLI ``--set``)."""
    import json

    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set expects key=value, got {item!r}")
        raw = raw.strip()
        lowered = raw.lower()
        value: Any
        if lowered in ("true", "false"):
            value = lowered == "true"
        elif lowered in ("none", "null"):
            value = None
        else:
            try:
                value = json.loads(raw)
            except json.JSONDecodeError:
                value = raw
        if isinstance(value, list):
            value = tuple(value)
        out[key.strip()] = value
    return out
