"""The sweep spec: one TOML (or YAML) file that says everything about a sweep.

Validated once, at the edge, before anything starts: every error names the field (dotted
path, e.g. ``search_space.tft.dropout``) and the allowed values, and :func:`load_spec`
raises one :class:`SpecError` listing all of them. Parsing also builds every family's
walk-forward splits on the spec's bars (the file is loaded once), so settings no trial
could split are refused here rather than in every trial. See ``examples/quick.toml`` for a
commented example.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from models import FamilyError, family_names, get_family, installed_names, is_reference
from trainables.config import TRAIN_KEYS, DataConfig, TrialBase, TrialConfig
from trainables.precision_names import POLICY_NAMES

SEARCHERS = ("tpe", "random", "pso")
SCHEDULERS = ("asha", "fifo", "pbt")
_BOOL = TypeAdapter(bool)  # pydantic's own reading of a bool field (true, 1, "yes", ...)
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# Trainer settings a spec may not fix in [trainer]: they are sweep-level fields or per-trial.
NOT_IN_TRAINER = frozenset({"family", "precision", "seed", "epochs", "device"})


class SpecError(ValueError):
    """An invalid sweep spec; ``problems`` holds one message per bad field."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"invalid sweep spec {source}:\n{lines}")


class _Strict(BaseModel):
    # allow_inf_nan=False: `cpu = inf` or `gpu = nan` (valid TOML/YAML floats) would pass the
    # range checks (nan compares false) and fail only once Ray is asked for the resources.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class DataSpec(_Strict):
    source: str = "synthetic"
    """'synthetic' or a CSV/Parquet file or directory: a relative path is looked up beside
    the spec file, then in the working directory, and stored absolute (workers run
    elsewhere)."""
    n_assets: int = Field(4, ge=1, le=512)
    n_bars: int = Field(1500, ge=200)
    seed: int = 0
    signal: float = Field(0.15, ge=0.0, lt=1.0)


class WalkForwardSpec(_Strict):
    n_folds: int = Field(2, ge=1, le=20)
    val_fraction: float = Field(0.15, gt=0.0, lt=0.5)
    test_fraction: float = Field(0.2, ge=0.0, lt=0.5)
    purge: int = Field(1, ge=0)
    embargo: int = Field(5, ge=0)


class ResourcesSpec(_Strict):
    cpu: float = Field(1.0, gt=0.0)
    """CPUs per trial (also the trial's torch thread count)."""
    gpu: float | Literal["measured"] = 0.0
    """GPU share per trial: a fraction in [0, 1], a whole count, or 'measured' (from VRAM)."""
    headroom: float = Field(0.15, ge=0.0, le=2.0)
    """Measured packing only: extra share of the measured peak kept free."""

    @field_validator("gpu")
    @classmethod
    def _gpu(cls, value: float | str) -> float | str:
        if isinstance(value, str):
            return value
        if value < 0 or (value > 1 and value != int(value)):
            raise ValueError("must be a fraction in [0, 1], a whole number of GPUs, or 'measured'")
        return value


class ComparisonSpec(_Strict):
    """``[comparison]``: settings of the paired comparison (``compare = true``), fixed
    before the results are seen. A table of its own because ``compare`` is the bool that
    turns the mode on."""

    margin: float = Field(0.1, gt=0.0)
    """Equivalence margin on the paired difference of annualised Sharpe ratios: bf16 is
    "as good" when the 90% interval of the mean per-configuration difference (t or BCa,
    the wider; repeated over the looks in a sequential comparison) lies inside +-margin
    (the TOST verdict). Default 0.1 (``hpo.compare.DEFAULT_MARGIN``;
    README "The f32-versus-bf16 comparison" says why)."""
    sequential: bool = False
    """Decide each family in steps (docs/statistics.md, "Deciding in steps"): the searcher
    keeps adding configurations to a family until its verdict is decided, its budget
    (``max_configs``) is spent, or continuing is futile. ``samples`` is then the first
    look's size. Needs ``compare = true`` and exactly two precisions."""
    max_configs: int | None = Field(None, ge=1)
    """Sequential only, and required there: the most configurations a family may get (its
    budget, the last look), at least ``samples``. A configuration whose trials leave no
    finite difference is replaced and does not count."""
    look_every: int | None = Field(None, ge=1)
    """Sequential only: configurations added to a family between two looks. Unset:
    ``hpo.stats.DEFAULT_LOOK_EVERY``, recorded with the sweep when it starts
    (:meth:`SweepSpec.with_looks_recorded`) so a resume looks where it started to."""
    in_flight: int | None = Field(None, ge=1)
    """Sequential only: configurations of an undecided family that may run at once, however
    close its next look (with a look after every configuration, a family would otherwise
    run one at a time). Those still running when the family decides are recorded and
    never read: at most ``in_flight - 1`` configurations' cost past a decision, more once
    other families decided and handed their share on (``SequentialBudget.in_flight_now``). Unset:
    :data:`DEFAULT_IN_FLIGHT`; raise it where the cluster has more slots than families x
    2 (a GPU packs tens of trials)."""


DEFAULT_IN_FLIGHT = 2
"""``comparison.in_flight`` unless set: a family's two configurations run at once, as
they did with looks every 2 (``hpo.stats.DEFAULT_LOOK_EVERY`` was 2 until the rule looked
after every configuration)."""


class PbtSpec(_Strict):
    """``[pbt]``: population-based training (``scheduler = "pbt"``; docs/search.md,
    "Population-based training"). A population is ``population_size`` configurations x
    ``seeds`` of one family, precision and shape: one group trial's trials where the
    family's trials group, else each a Tune trial of its own."""

    population_size: int | None = Field(None, ge=1)
    """Configurations per population (unset: ``samples``, one population per family and
    precision). ``samples`` must be a multiple of it: ``samples / population_size``
    populations, each of its own shape (the shape settings are drawn once per
    population), so a search over shapes is not held to the first one drawn."""

    interval_epochs: int = Field(2, ge=1)
    """Epochs between exploit rounds: after every ``interval_epochs``-th epoch but the
    last, the bottom ``quantile`` of the population copies the top."""
    quantile: float = Field(0.25, gt=0.0, le=0.5)
    """The share of the population that copies (the bottom) and is copied (the top),
    ranked on the epoch's validation Sharpe; at least one trial each, at most half."""
    resample_probability: float = Field(0.25, ge=0.0, le=1.0)
    """A mutated setting's chance of a fresh draw from its range rather than a
    perturbation (x0.8 / x1.2 on a log range)."""
    early_stopping: Literal["none", "asha"] = "none"
    """'asha': ASHA across populations. Each population is one group trial; after each
    epoch it asks the sweep's rungs (``grace_epochs``, then x2; :mod:`hpo.rungs`, Ray's
    rule) with its best trial's validation Sharpe, before it exploits, and a population
    below the rung's cutoff ends there, all its trials, freeing its slot for the sweep's
    next population (each of its own shape). At equal trial-epochs a sweep can then
    afford more populations (``samples``) than without. Needs every population to be one
    group trial (``grouping.group_size`` >= ``population_size`` x seeds, a family that
    groups) and at least two populations in the sweep (one bracket for all of them, as
    for trials under ASHA)."""
    mutations: dict[str, Any] | None = None
    """What a recipient explores after an exploit, by setting name: ``{low, high[,
    log]}`` or ``{choices = [...]}``, each a setting every family of the sweep lets a
    population change (lr, weight_decay, the family's float per-trial settings). Unset:
    every such setting the family's search space searches, with its range there (lr and
    weight decay on their log ranges by default)."""


DEFAULT_GROUP_SIZE = 8
"""Trials per group trial when ``[grouping] group_size`` is not set: the largest group
the trainer-level bench measures (bench/README.md, "Group trials, trainer level"); a
sweep's groups are usually smaller (one ask's configurations x seeds)."""


class GroupingSpec(_Strict):
    group_size: int = Field(DEFAULT_GROUP_SIZE, ge=1, le=64)
    """Trials of one precision that train as one group trial, fused
    (``trainables.group``): up to this many per Tune trial; 1 runs every trial alone. A
    group holds the seeds of a configuration and further configurations of the same shape
    (they differ only in what a group trial's trials may: lr, weight decay, and the family's own, such as
    the position scale and dropout rates; ``trainables.trial_keys.per_trial_settings``). Forecast
    families only (rl families run ungrouped). Compare mode groups further configurations
    only where the space searches nothing else: its statistics take configurations as
    independent draws, so it never holds a searched shape. With ``resources.gpu =
    "measured"`` a group trial's share is profiled for its fused group. Unset:
    :data:`DEFAULT_GROUP_SIZE`."""
    configs_per_ask: dict[str, Annotated[int, Field(ge=1)]] | None = None
    """Recorded by ``hpo sweep`` when the sweep starts, not written by hand: for each family
    whose trials group, how many configurations of one shape its searcher asks at a time
    (:meth:`SweepSpec.configs_per_ask`). A resumed sweep groups as it started, whatever a
    later version would decide (one whose families let trials differ in more settings
    would otherwise form groups, and ASHA rungs per trial, midway through a sweep)."""


class SweepSpec(_Strict):
    name: str
    """Sweep name: the MLflow experiment and the results folder."""
    families: list[str] = Field(min_length=1)
    precisions: list[str] = Field(default_factory=lambda: ["f32", "bf16"], min_length=1)
    samples: int = Field(4, ge=1)
    """Configurations sampled per family (per precision unless compare = true)."""
    search: Literal["tpe", "random", "pso"] = "tpe"
    scheduler: Literal["asha", "fifo", "pbt"] = "asha"
    """ASHA by default; FIFO when compare = true leaves it out; 'pbt': population-based
    training, set by the ``[pbt]`` table (search mode only)."""
    pbt: PbtSpec | None = None
    """Population-based training's settings (``scheduler = "pbt"`` only; unset: the
    defaults)."""
    max_epochs: int = Field(5, ge=1)
    grace_epochs: int = Field(1, ge=1)
    """ASHA: epochs every trial (or population, with ``pbt.early_stopping = "asha"``) gets
    before it can be stopped."""
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    compare: bool = False
    """Paired f32-vs-bf16 mode: every sampled config and seed runs once per precision."""
    comparison: ComparisonSpec = ComparisonSpec()
    max_concurrent: int | None = Field(None, ge=1)
    max_failures: int = Field(2, ge=0)
    """Retries of a trial whose process died (from its newest checkpoint)."""
    search_seed: int = 0
    metric: Literal["val_sharpe"] = "val_sharpe"
    data: DataSpec = DataSpec()
    walk_forward: WalkForwardSpec = WalkForwardSpec()
    trainer: dict[str, Any] = Field(default_factory=dict)
    """Trainer settings fixed for every trial (lookback, batch_size, cost, ...)."""
    search_space: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Per-family overrides: key = constant | {low, high[, log]} | {choices = [...]}."""
    resources: ResourcesSpec = ResourcesSpec()
    grouping: GroupingSpec = GroupingSpec()
    storage: str = "hpo-results"
    """Where Ray keeps results and checkpoints (a path or an object-store URI)."""
    tracking_uri: str = "sqlite:///mlflow.db"

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME_PATTERN.fullmatch(value):  # match() lets a trailing newline through
            raise ValueError(
                "must start with a letter or digit and use only letters, digits, '_', '.', '-'"
            )
        return value

    @field_validator("families")
    @classmethod
    def _families(cls, value: list[str]) -> list[str]:
        """Registered names, installed names, or import references to a family (resolved
        with the other checks that need the families, see :func:`parse_spec`)."""
        known = family_names()
        unknown = [m for m in value if m not in known and not is_reference(m)]
        unknown = [m for m in unknown if m not in installed_names()]
        if unknown:
            raise ValueError(
                f"unknown family(ies) {unknown}; allowed: {list(known)}, a name an installed "
                "package registers, or an import reference 'package.module:ATTR'"
            )
        if len(set(value)) != len(value):
            raise ValueError("lists a family twice")
        return value

    @field_validator("precisions")
    @classmethod
    def _precisions(cls, value: list[str]) -> list[str]:
        unknown = [p for p in value if p not in POLICY_NAMES]
        if unknown:
            raise ValueError(f"unknown precision(s) {unknown}; allowed: {list(POLICY_NAMES)}")
        if len(set(value)) != len(value):
            raise ValueError("lists a precision twice")
        return value

    @field_validator("trainer")
    @classmethod
    def _trainer(cls, value: dict[str, Any]) -> dict[str, Any]:
        allowed = sorted(TRAIN_KEYS - NOT_IN_TRAINER - _SPEC_LEVEL_KEYS)
        bad = [k for k in value if k not in allowed]
        if bad:
            raise ValueError(f"unknown or sweep-level key(s) {bad}; allowed: {allowed}")
        return value

    @model_validator(mode="before")
    @classmethod
    def _compare_runs_fifo(cls, data: Any) -> Any:
        """compare = true without a scheduler chooses FIFO (an explicit ASHA stays an error)."""
        if isinstance(data, dict) and "scheduler" not in data and "compare" in data:
            try:
                compare = _BOOL.validate_python(data["compare"])
            except ValidationError:
                return data  # the field's own validation reports it
            if compare:
                return {**data, "scheduler": "fifo"}
        return data

    @model_validator(mode="after")
    def _cross_field(self) -> SweepSpec:
        if self.compare and len(self.precisions) < 2:
            raise ValueError("compare = true needs at least two precisions (e.g. ['f32', 'bf16'])")
        if self.compare and self.scheduler == "asha":
            raise ValueError(
                "compare = true needs scheduler = 'fifo' (or no scheduler, which is FIFO in "
                "compare mode): ASHA would stop the trials of a seed pair at different epochs and "
                "the paired Sharpe difference would compare unequal training"
            )
        self._check_pbt()
        if self.grace_epochs > self.max_epochs:
            raise ValueError(
                f"grace_epochs ({self.grace_epochs}) must be <= max_epochs ({self.max_epochs})"
            )
        self._check_sequential()
        for family in self.search_space:
            if family not in self.families:
                raise ValueError(
                    f"search_space.{family}: not one of this sweep's families {self.families}"
                )
        for family, asks in (self.grouping.configs_per_ask or {}).items():
            where = f"grouping.configs_per_ask.{family}"
            if family not in self.families:
                raise ValueError(f"{where}: not one of this sweep's families {self.families}")
            if asks > self.group_size:
                raise ValueError(
                    f"{where} = {asks} is over grouping.group_size ({self.group_size}): one "
                    "ask's configurations share groups of at most that many trials"
                )
        return self

    def _check_pbt(self) -> None:
        """``scheduler = "pbt"`` and its ``[pbt]`` table, each message naming its field.
        The checks that need the families are :func:`_pbt_problems`'s."""
        if self.scheduler != "pbt":
            if self.pbt is not None:
                raise ValueError("pbt: the [pbt] table needs scheduler = 'pbt'")
            return
        if self.compare:
            raise ValueError(
                "scheduler = 'pbt' cannot run with compare = true: the paired unit of the "
                "comparison is a fixed configuration, and population-based training changes "
                "a trial's settings and weights while it trains"
            )
        interval = self.pbt_table.interval_epochs
        if interval >= self.max_epochs:
            raise ValueError(
                f"pbt.interval_epochs = {interval} leaves no interval boundary before the "
                f"last epoch (max_epochs = {self.max_epochs}): no trial would ever exploit; "
                f"set it below max_epochs"
            )
        size = self.population_size
        if self.samples % size:
            raise ValueError(
                f"pbt.population_size = {size} does not divide samples = {self.samples}: "
                "every population has the same size"
            )
        population = size * len(self.seeds)
        if population < 2:
            raise ValueError(
                f"samples: population-based training needs a population of at least 2 "
                f"trials; population_size (default: samples) x seeds is {population}"
            )
        populations = self.samples // size * len(self.families) * len(self.precisions)
        if self.pbt_table.early_stopping == "asha" and populations < 2:
            raise ValueError(
                "pbt.early_stopping = 'asha' ranks populations against each other, and "
                f"samples = {self.samples} / population_size = {size} makes one population "
                "in this sweep: set pbt.population_size to a divisor of samples below it"
            )
        if self.pbt_table.early_stopping == "asha" and self.grace_epochs >= self.max_epochs:
            raise ValueError(
                "pbt.early_stopping = 'asha' has no rung before the last epoch: grace_epochs "
                f"= {self.grace_epochs}, max_epochs = {self.max_epochs}; lower grace_epochs"
            )

    def population_spans_trials(self, family: str) -> bool:
        """Whether a population of ``family`` spans several Tune trials and so exploits
        through the sweep's board and boundary checkpoints (:mod:`hpo.population_board`): its trials
        do not group, or the population (``population_size`` x seeds) is larger than
        one group trial."""
        if self.scheduler != "pbt":
            return False
        return not self.groups(family) or self.population_size * len(self.seeds) > self.group_size

    @property
    def population_size(self) -> int:
        """Configurations per population (``pbt.population_size``, default ``samples``)."""
        return self.pbt_table.population_size or self.samples

    @property
    def pbt_table(self) -> PbtSpec:
        """The ``[pbt]`` table, or its defaults."""
        return self.pbt if self.pbt is not None else PbtSpec()

    def pbt_mutations(self, family: str) -> dict[str, Any]:
        """What a recipient of ``family`` explores (:data:`trainables.pbt.Mutation` by
        setting name): ``pbt.mutations``, else every setting a population may change
        (:func:`trainables.pbt.mutable_setting_names`) that the family's space searches
        as a float range, or as choices of numbers, with that range. Raises ValueError
        naming the field."""
        from hpo.search.space import dim_from_override, trial_space
        from models.family import Choice, Float, Int
        from trainables.pbt import Range, mutable_setting_names

        names = mutable_setting_names(get_family(family))
        explicit = self.pbt_table.mutations
        mutations: dict[str, Any] = {}
        if explicit is not None:
            for name, value in explicit.items():
                where = f"pbt.mutations.{name}"
                if name not in names:
                    raise ValueError(
                        f"{where}: not a setting a population of {family} may change; "
                        f"allowed: {list(names)}"
                    )
                dim = dim_from_override(where, value)
                if dim is None:
                    raise ValueError(f"{where} must be {{low, high[, log]}} or {{choices = [...]}}")
                mutations[name] = _mutation(where, dim)
            if not mutations:
                raise ValueError("pbt.mutations: empty; name at least one setting to explore")
            return mutations
        dims = trial_space(family, self.search_space.get(family)).dims
        for name in names:
            dim = dims.get(name)
            if isinstance(dim, Float | Int):
                mutations[name] = Range(float(dim.low), float(dim.high), dim.log)
            elif isinstance(dim, Choice) and all(
                isinstance(o, float) and not isinstance(o, bool) for o in dim.options
            ):
                mutations[name] = [float(o) for o in dim.options]
        if not mutations:
            raise ValueError(
                f"pbt.mutations: the search space of {family} searches none of the settings a "
                f"population may change ({', '.join(names)}): search one of them, or name "
                "them in [pbt.mutations]"
            )
        return mutations

    def _check_sequential(self) -> None:
        """``[comparison] sequential`` and its settings, each message naming its field."""
        comparison = self.comparison
        if not comparison.sequential:
            for key in ("max_configs", "look_every", "in_flight"):
                if getattr(comparison, key) is not None:
                    raise ValueError(
                        f"comparison.{key}: only for a sequential comparison "
                        "(comparison.sequential = true)"
                    )
            return
        if not self.compare:
            raise ValueError(
                "comparison.sequential = true needs compare = true: it decides the paired "
                "comparison of each family"
            )
        if len(self.precisions) != 2:
            raise ValueError(
                f"comparison.sequential = true needs exactly two precisions (a reference "
                f"and the other, e.g. ['f32', 'bf16']), got {self.precisions}"
            )
        if self.search != "random":
            # Its looks take the configurations made so far as independent draws of one
            # distribution; an adaptive searcher's later draws come from another.
            raise ValueError(
                f"comparison.sequential = true needs search = 'random', got "
                f"{self.search!r}: each look takes the configurations so far as independent "
                "draws of the space, which an adaptive searcher's are not"
            )
        if comparison.max_configs is None:
            raise ValueError(
                "comparison.max_configs: required with comparison.sequential = true: the "
                f"most configurations a family may get (>= samples, {self.samples})"
            )
        if comparison.max_configs < self.samples:
            raise ValueError(
                f"comparison.max_configs = {comparison.max_configs} is below samples "
                f"({self.samples}), the first look: it must be >= samples"
            )
        from hpo.stats import MIN_FIRST_LOOK  # scipy: only where a sequential spec is read

        if comparison.max_configs < MIN_FIRST_LOOK:
            raise ValueError(
                f"comparison.max_configs = {comparison.max_configs} can never reach a "
                f"verdict: the sequential rule decides from {MIN_FIRST_LOOK} configurations "
                f"(looks before it only report); set max_configs >= {MIN_FIRST_LOOK}"
            )

    # -- derived ---------------------------------------------------------------------------
    @property
    def sequential(self) -> bool:
        """A sequential comparison (``[comparison] sequential = true``)."""
        return self.comparison.sequential

    @property
    def configs_per_family(self) -> int:
        """Configurations a family (a stream) gets at most: ``samples``, or in a sequential
        comparison its budget ``comparison.max_configs`` (replacements of configurations
        without a finite difference not counted)."""
        if self.sequential and self.comparison.max_configs is not None:
            return self.comparison.max_configs
        return self.samples

    @property
    def n_trials(self) -> int:
        """Trials planned; in a sequential comparison the most it may run (families
        decided early run fewer)."""
        per_config = len(self.seeds) * len(self.precisions)
        return len(self.families) * self.configs_per_family * per_config

    @property
    def look_every(self) -> int:
        """Configurations between two looks of a sequential comparison (the spec's, else
        ``hpo.stats.DEFAULT_LOOK_EVERY``)."""
        if self.comparison.look_every is not None:
            return self.comparison.look_every
        from hpo.stats import DEFAULT_LOOK_EVERY  # scipy: only where a sequential sweep runs

        return DEFAULT_LOOK_EVERY

    @property
    def in_flight(self) -> int:
        """Configurations of an undecided family running at once in a sequential
        comparison (the spec's, else :data:`DEFAULT_IN_FLIGHT`)."""
        if self.comparison.in_flight is not None:
            return self.comparison.in_flight
        return DEFAULT_IN_FLIGHT

    def with_looks_recorded(self) -> SweepSpec:
        """This spec with a sequential comparison's ``look_every`` decided, as a sweep
        records it (a resume looks where the sweep started to, whatever a later default)."""
        if not self.sequential or self.comparison.look_every is not None:
            return self
        comparison = self.comparison.model_copy(update={"look_every": self.look_every})
        return self.model_copy(update={"comparison": comparison})

    @property
    def group_size(self) -> int:
        """Trials per group trial at most (``grouping.group_size``)."""
        return self.grouping.group_size

    def groups(self, family: str) -> bool:
        """Whether ``family``'s trials train in group trials: a family that fuses (rl
        families never group; a family whose module does not import where a sweep is read
        back counts as ungrouped) and a group size over 1, or, in a sweep's record, a
        number of configurations per ask recorded for it (``grouping.configs_per_ask``)."""
        try:
            record = get_family(family)
        except FamilyError:
            return False
        if record.kind == "rl" or not record.fuses:
            return False
        if self.grouping.configs_per_ask is not None:
            return family in self.grouping.configs_per_ask  # as the sweep decided when it started
        return self.group_size > 1

    def configs_per_ask(self, family: str) -> int:
        """Configurations of one shape the searcher asks for ``family`` at a time: as many
        as fit a group beside their seeds, where a setting a group's trials may differ in is
        searched (lr, weight decay, the family's own:
        :func:`trainables.trial_keys.per_trial_settings`); 1 otherwise. Compare mode asks for several
        only where the space searches nothing else: every draw then has the ask's shape
        without holding it, and each configuration stays an independent draw of the
        space, as its statistics take it (holding a searched shape would correlate the
        configurations). In a sweep's record, as recorded
        (``grouping.configs_per_ask``) but never more than this version decides: an ask it
        cannot hold to one shape would form groups whose trials differ in a shape."""
        if self.scheduler == "pbt" and not self.compare and not self.groups(family):
            return self.population_size  # a population across processes: one ask, one shape
        if not self.groups(family):
            return 1
        decided = self.population_size if self.scheduler == "pbt" else self._configs_per_ask(family)
        recorded = (self.grouping.configs_per_ask or {}).get(family)
        return decided if recorded is None else min(recorded, decided)

    def _configs_per_ask(self, family: str) -> int:
        from hpo.search.space import trial_space
        from trainables.trial_keys import per_trial_settings

        try:
            dims = trial_space(family, self.search_space.get(family)).dims
        except (FamilyError, ValueError):
            return 1
        varying = per_trial_settings(get_family(family))
        if not any(key in dims for key in varying):
            return 1  # every configuration of one shape would be the same configuration
        if self.compare and any(key not in varying for key in dims):
            return 1
        return max(1, self.group_size // len(self.seeds))

    def with_grouping_recorded(self) -> SweepSpec:
        """This spec with its grouping decided (``grouping.configs_per_ask``), as a sweep
        records it."""
        asks = {f: self.configs_per_ask(f) for f in self.families if self.groups(f)}
        grouping = self.grouping.model_copy(update={"configs_per_ask": asks})
        return self.model_copy(update={"grouping": grouping})

    def trials_per_group(self, family: str) -> int:
        """Trials in ``family``'s largest group trial (1: its trials run alone): one ask's
        trials of one precision, split evenly into groups of at most
        :attr:`group_size` (the searcher's ``_even_chunks``)."""
        if not self.groups(family):
            return 1
        trials = min(self.configs_per_ask(family), self._largest_ask) * len(self.seeds)
        return -(-trials // -(-trials // self.group_size))

    @property
    def _largest_ask(self) -> int:
        """Most configurations a stream asks for at once: ``samples`` (a sequential
        comparison asks the first look's, then up to the next look's or its ``in_flight``,
        whichever is more, and a family alone undecided takes every family's
        ``in_flight``)."""
        if not self.sequential:
            return self.samples
        return max(self.samples, self.look_every, self.in_flight * len(self.families))

    @property
    def forms_groups(self) -> bool:
        """Whether some Tune trial of this sweep holds several trials."""
        return self.n_tune_trials < self.n_trials

    @property
    def asha_per_tune_trial(self) -> bool:
        """Ray Tune's ASHA scheduler stops Tune trials: an ungrouped ASHA sweep's."""
        return self.scheduler == "asha" and not self.forms_groups

    @property
    def asha_per_trial(self) -> bool:
        """ASHA decides per trial (:mod:`hpo.rungs`, asked by the trials) rather than per
        Tune trial: a grouped sweep's, where one Tune trial holds several trials."""
        return self.scheduler == "asha" and self.forms_groups

    @property
    def asha_per_population(self) -> bool:
        """ASHA across populations (``pbt.early_stopping = "asha"``): each population, one
        group trial, asks the sweep's rungs (:mod:`hpo.rungs`) with its best trial's
        validation Sharpe before it exploits, keyed by the population's identity."""
        return self.scheduler == "pbt" and self.pbt_table.early_stopping == "asha"

    @property
    def rungs_on_board(self) -> bool:
        """Whether the sweep's rungs run as a board its trials ask (saved with the
        searcher's state, so a resumed sweep's decisions stand)."""
        return self.asha_per_trial or self.asha_per_population

    @property
    def n_tune_trials(self) -> int:
        """Ray Tune trials planned: :attr:`n_trials` with each group trial counted once
        (``grouping.group_size``; rl families run ungrouped)."""
        size, seeds = self.group_size, len(self.seeds)
        configs = self.configs_per_family
        total = 0
        for family in self.families:
            if not self.groups(family):
                total += configs * len(self.precisions) * seeds
                continue
            asks = self.configs_per_ask(family)
            full, rest = divmod(configs, asks)
            groups = full * -(-asks * seeds // size) + (-(-rest * seeds // size) if rest else 0)
            total += groups * len(self.precisions)
        return total

    def trial_base(self) -> TrialBase:
        """Settings every trial shares (the ``base`` of each trial's config)."""
        return TrialBase(
            epochs=self.max_epochs,
            trainer={**self.walk_forward.model_dump(), **self.trainer},
            data=DataConfig(**self.data.model_dump()),
        )

    def base_trial_settings(self) -> dict[str, Any]:
        """:meth:`trial_base` as the plain dict that travels in each trial's config."""
        return self.trial_base().to_dict()


# Walk-forward settings have their own table; keep them out of [trainer].
_SPEC_LEVEL_KEYS = frozenset(WalkForwardSpec.model_fields)


def parse_spec(
    payload: dict[str, Any],
    source: str = "<spec>",
    base_dir: Path | None = None,
    *,
    check_data: bool = True,
) -> SweepSpec:
    """Validate a parsed spec; raises :class:`SpecError` naming every bad field.

    ``check_data=False`` skips the checks that need the data or the families (that the
    source exists, the walk-forward splits on its bars, that each family imports and
    builds): for reading back a sweep whose spec was checked in full when it started (its
    data path is stored absolute), from where the data may not be mounted or a family's
    module may not import."""
    try:
        spec = SweepSpec.model_validate(payload)
    except ValidationError as exc:
        raise SpecError(source, [_describe(err) for err in exc.errors()]) from None
    problems: list[str] = []
    if check_data:
        spec, problems = _with_absolute_data(spec, base_dir or Path.cwd())
        problems = [*_family_problems(spec, data_ok=not problems), *problems]
    if problems:
        raise SpecError(source, problems)
    return spec


def load_spec(
    path: Path | str, overrides: dict[str, Any] | None = None, *, compare: bool = False
) -> SweepSpec:
    """Read a TOML/YAML spec file, apply top-level ``overrides`` (from the CLI), validate.

    ``compare``: the command line's compare mode (``--compare``): compare = true, and FIFO
    over the file's scheduler (paired trials must all finish), except a ``"pbt"`` one,
    which stays for the spec to refuse with its reason (population-based training changes
    the fixed configuration a pair compares)."""
    path = Path(path)
    if not path.is_file():
        raise SpecError(str(path), ["file not found"])
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(str(path), [f"cannot read as UTF-8 text: {exc}"]) from None
    try:
        if path.suffix in (".yaml", ".yml"):
            payload = yaml.safe_load(text) or {}
        else:
            payload = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise SpecError(
            str(path), [f"not valid {path.suffix.lstrip('.').upper() or 'TOML'}: {exc}"]
        ) from None
    except RecursionError:
        raise SpecError(str(path), ["(top level): nested too deeply"]) from None
    if not isinstance(payload, dict):
        raise SpecError(str(path), ["the top level must be a table of settings"])
    payload.update({k: v for k, v in (overrides or {}).items() if v is not None})
    if compare:
        payload["compare"] = True
        if payload.get("scheduler") != "pbt":
            payload["scheduler"] = "fifo"
    return parse_spec(payload, source=str(path), base_dir=path.parent)


_FIELD_PATH = re.compile(r"[a-z_]+(?:\.[a-z_]+)*")


def _describe(err: Any) -> str:
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    message = err["msg"]
    if not err["loc"] and err["type"] == "value_error":
        # A cross-field rule whose message starts with the field it is about: said as is.
        text = message.removeprefix("Value error, ")
        head = _FIELD_PATH.match(text)
        named = head is not None and head.group(0).split(".")[0] in SweepSpec.model_fields
        if named and head is not None and text[head.end() : head.end() + 1] in (":", " "):
            return text
    if err["type"] == "extra_forbidden":
        message = "unknown field"
        parent = err["loc"][:-1]
        allowed = _fields_at(parent)
        if allowed:
            message += f"; allowed: {allowed}"
    return f"{where}: {message}"


def _fields_at(loc: tuple[Any, ...]) -> list[str]:
    import typing

    model: Any = SweepSpec
    for part in loc:
        field = model.model_fields.get(part) if hasattr(model, "model_fields") else None
        # A table that may be left out (``pbt: PbtSpec | None``): its model.
        tables = [
            t
            for t in (typing.get_args(field.annotation) or (field.annotation,) if field else ())
            if hasattr(t, "model_fields")
        ]
        if not tables:
            return []
        model = tables[0]
    return sorted(model.model_fields)


def _with_absolute_data(spec: SweepSpec, base_dir: Path) -> tuple[SweepSpec, list[str]]:
    """The spec with its data source as an absolute path (Ray workers do not share the
    driver's working directory), or the problem with the source."""
    if spec.data.source == "synthetic":
        return spec, []
    try:
        resolved = _resolve_data(spec.data.source, base_dir)
        found = resolved.exists()
    except (OSError, RuntimeError) as exc:  # name too long; '~user' with no such user
        return spec, [f"data.source: {spec.data.source!r} is not a usable path ({exc})"]
    if not found:
        return spec, [f"data.source: {spec.data.source!r} does not exist (looked at {resolved})"]
    data = spec.data.model_copy(update={"source": str(resolved)})
    return spec.model_copy(update={"data": data}), []


def _family_problems(spec: SweepSpec, data_ok: bool) -> list[str]:
    """Checks that need the family registry, and (when the data source is usable) the
    walk-forward splits of every family's trials on the spec's bars."""
    from hpo.search.space import trial_space

    problems = []
    shapes: dict[DataConfig, tuple[int, int]] = {}
    for i, family in enumerate(spec.families):
        try:
            get_family(family)
        except FamilyError as exc:
            problems.append(f"families[{i}]: {exc}")
            continue
        try:
            space = trial_space(family, spec.search_space.get(family))
        except ValueError as exc:
            problems.append(str(exc))
            continue
        except (OverflowError, TypeError) as exc:  # e.g. {low = 10**400} read from YAML
            problems.append(f"search_space.{family}: {exc}")
            continue
        if spec.scheduler == "pbt":
            pbt_problem = _pbt_problem(spec, i, family)
            if pbt_problem:
                problems.append(pbt_problem)
                continue
        problem = _trial_config_problem(spec, family, space)
        if problem is None and data_ok:
            problem = _splits_problem(spec, family, space, shapes)
        if problem:
            problems.append(problem)
    return list(dict.fromkeys(problems))  # a spec-level problem is said once, not per family


def _pbt_problem(spec: SweepSpec, index: int, family: str) -> str | None:
    """Why ``family`` cannot train as a population of ``spec``'s (None: it can): its
    mutations, or ASHA across populations where a population is not one group trial. A
    population of any size trains: in one group trial where it fits one (exploits are
    copies in memory), else across Tune trials through the sweep's board
    (:meth:`SweepSpec.population_spans_trials`)."""
    try:
        spec.pbt_mutations(family)
    except (ValueError, TypeError) as exc:
        return str(exc)
    if spec.asha_per_population and spec.population_spans_trials(family):
        return (
            "pbt.early_stopping = 'asha' stops whole populations, each one group trial, but "
            f"a population of families[{index}] = {family!r} spans Tune trials: "
            f"{_why_population_spans(spec, family)}"
        )
    return None


def _why_population_spans(spec: SweepSpec, family: str) -> str:
    """Why ``family``'s population is not one group trial, and what to change (for the
    refusal of ASHA across populations)."""
    record = get_family(family)
    if record.kind == "rl" or not record.fuses:
        return (
            f"{family} trials never train in group trials; leave pbt.early_stopping out "
            "or sweep this family apart"
        )
    if not spec.groups(family):
        return "grouping.group_size is 1; raise it to population_size x seeds or more"
    population = spec.population_size * len(spec.seeds)
    return (
        f"population_size x seeds = {population} > grouping.group_size = {spec.group_size}; "
        "raise grouping.group_size or lower pbt.population_size"
    )


def _mutation(where: str, dim: Any) -> Any:
    """A spec dimension as a :data:`trainables.pbt.Mutation`: a range (floats), or the
    choices, each a number."""
    from models.family import Choice
    from trainables.pbt import Range

    if isinstance(dim, Choice):
        if not all(isinstance(o, int | float) and not isinstance(o, bool) for o in dim.options):
            raise ValueError(f"{where}.choices must be numbers, got {list(dim.options)}")
        return [float(o) for o in dim.options]
    if dim.log and dim.low <= 0:
        raise ValueError(f"{where}: a log range needs low > 0, got {dim.low}")
    return Range(float(dim.low), float(dim.high), dim.log)


def _trial_config_problem(spec: SweepSpec, family: str, space: Any) -> str | None:
    """Build one trial's configuration (fixed keys, every searched key at its lower bound)
    exactly as a trial would, so settings that would fail in every trial fail here instead,
    before Ray or MLflow start."""
    from models import get_family
    from models.family import Choice

    sample = {k: d.options[0] if isinstance(d, Choice) else d.low for k, d in space.dims.items()}
    trial = TrialConfig(
        family=family,
        precision=spec.precisions[0],
        seed=spec.seeds[0],
        params={**space.fixed, **sample},
        base=spec.trial_base(),
    )
    try:
        config = trial.train_config()
        get_family(family).make_config(config.model_config)
    except (ValueError, TypeError, OverflowError) as exc:
        return f"trainer / search_space.{family}: a trial of {family} would fail: {exc}"
    return None


def _resolve_data(source: str, base_dir: Path) -> Path:
    """``source`` as an absolute path: as given, else beside the spec, else in the cwd."""
    path = Path(source).expanduser()
    if not path.is_absolute():
        beside_spec = base_dir / path
        path = beside_spec if beside_spec.exists() else Path.cwd() / path
    return path.resolve()


# Settings that shape the walk-forward splits, and which end of a searched range needs the
# most bars (True: the high end). In the order the spec's tables list them.
_SPLIT_SETTINGS = {
    "data.n_bars": False,
    "n_folds": True,
    "val_fraction": True,
    "test_fraction": True,
    "purge": True,
    "embargo": True,
    "lookback": True,
}
# walk_forward's arguments -> the setting behind each (the first decision time is the
# features' warm-up plus the lookback, so a message about it or about the bar count is
# about the lookback too).
_SPLIT_ARGUMENTS = {
    "n_bars": ("data.n_bars", "lookback"),
    "first_valid": ("data.n_bars", "lookback"),
    "n_folds": ("n_folds",),
    "val_fraction": ("val_fraction",),
    "test_fraction": ("test_fraction",),
    "purge": ("purge",),
    "embargo": ("embargo",),
}


def _splits_problem(
    spec: SweepSpec, family: str, space: Any, shapes: dict[DataConfig, tuple[int, int]]
) -> str | None:
    """Build the walk-forward splits of ``family``'s trials on the spec's bars, with every
    searched split setting at the end that needs the most bars, exactly as a trial builds
    them (:func:`trainables.data.walk_forward`); the problem names the spec fields."""
    from trainables.market import market_splits

    params = dict(space.fixed)
    for key, high in _SPLIT_SETTINGS.items():
        if key in space.dims:
            params[key] = _extreme(space.dims[key], high)
    trial = TrialConfig(
        family=family,
        precision=spec.precisions[0],
        seed=spec.seeds[0],
        params=params,
        base=spec.trial_base(),
    )
    try:
        config = trial.train_config()
    except (ValueError, TypeError):
        return None  # the extreme itself is invalid: the trial-config check speaks for it

    def names(keys: list[str]) -> str:
        return ", ".join(_split_field(spec, family, space, k) for k in keys)

    try:
        if config.data not in shapes:
            shapes[config.data] = _bar_shape(config.data)
        n_bars, warmup = shapes[config.data]
    except (OSError, ValueError) as exc:
        return f"{names(['data.n_bars'])}: cannot build features from the bars: {exc}"
    try:
        market_splits(n_bars, warmup, config)  # exactly what each trial builds
    except ValueError as exc:
        named = set(re.findall(r"\b(" + "|".join(_SPLIT_ARGUMENTS) + r")\b", str(exc)))
        keys = {k for arg in named for k in _SPLIT_ARGUMENTS[arg]}
        fields = names([k for k in _SPLIT_SETTINGS if k in keys] or ["data.n_bars"])
        whose = f" for {family}" if "search_space." in fields else ""
        return f"{fields}: the walk-forward splits cannot be built{whose}: {exc}"
    return None


def _split_field(spec: SweepSpec, family: str, space: Any, key: str) -> str:
    """The spec field that sets split setting ``key`` for ``family``'s trials."""
    if key == "data.n_bars" and spec.data.source != "synthetic":
        return "data.source"  # a file's bars are what they are
    if key in space.dims or key in space.fixed:
        return f"search_space.{family}.{key}"
    if key == "data.n_bars":
        return key
    return "trainer.lookback" if key == "lookback" else f"walk_forward.{key}"


def _extreme(dim: Any, high: bool) -> Any:
    from models.family import Choice

    if isinstance(dim, Choice):
        numbers = [o for o in dim.options if isinstance(o, int | float) and not isinstance(o, bool)]
        if not numbers:
            return dim.options[0]
        return max(numbers) if high else min(numbers)
    return dim.high if high else dim.low


def _bar_shape(data: DataConfig) -> tuple[int, int]:
    """(bars, the features' warm-up) of a data source: what the splits depend on. The
    synthetic generator runs for one asset (the bar count is the spec's); a file is loaded
    once and its first asset's features computed."""
    import dataclasses

    from trainables.data import make_features
    from trainables.market import load_bars_source

    if data.source == "synthetic":
        bars = load_bars_source(dataclasses.replace(data, n_assets=1))
    else:
        bars = load_bars_source(data)
        bars = dataclasses.replace(
            bars,
            assets=bars.assets[:1],
            **{k: getattr(bars, k)[:, :1] for k in ("open", "high", "low", "close", "volume")},
        )
    return bars.n_bars, make_features(bars).first_valid
