"""The sweep spec: one TOML (or YAML) file that says everything about a sweep.

Validated once, at the edge, before anything starts: every error names the field (dotted
path, e.g. ``search_space.tft.dropout``) and the allowed values, and :func:`load_spec`
raises one :class:`SpecError` listing all of them. See ``examples/quick.toml`` for a
commented example.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from models import family_names
from trainables.config import TRAIN_KEYS, DataConfig, TrialBase, TrialConfig
from trainables.precision import POLICY_NAMES

SEARCHERS = ("tpe", "random", "pso")
SCHEDULERS = ("asha", "fifo")
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# Trainer settings a spec may not fix in [trainer]: they are sweep-level fields or per-trial.
NOT_IN_TRAINER = frozenset({"model", "precision", "seed", "epochs", "device"})


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
    """'synthetic' or a CSV/Parquet file or directory (relative to the spec file)."""
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


class SweepSpec(_Strict):
    name: str
    """Sweep name: the MLflow experiment and the results folder."""
    models: list[str] = Field(min_length=1)
    precisions: list[str] = Field(default_factory=lambda: ["f32", "bf16"], min_length=1)
    samples: int = Field(4, ge=1)
    """Configurations sampled per model (per precision unless compare = true)."""
    search: Literal["tpe", "random", "pso"] = "tpe"
    scheduler: Literal["asha", "fifo"] = "asha"
    max_epochs: int = Field(5, ge=1)
    grace_epochs: int = Field(1, ge=1)
    """ASHA: epochs every trial gets before it can be stopped."""
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    compare: bool = False
    """Paired f32-vs-bf16 mode: every sampled config and seed runs once per precision."""
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
    """Per-model overrides: key = constant | {low, high[, log]} | {choices = [...]}."""
    resources: ResourcesSpec = ResourcesSpec()
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

    @field_validator("models")
    @classmethod
    def _models(cls, value: list[str]) -> list[str]:
        known = family_names()
        unknown = [m for m in value if m not in known]
        if unknown:
            raise ValueError(f"unknown model(s) {unknown}; allowed: {list(known)}")
        if len(set(value)) != len(value):
            raise ValueError("lists a model twice")
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

    @model_validator(mode="after")
    def _cross_field(self) -> SweepSpec:
        if self.compare and len(self.precisions) < 2:
            raise ValueError("compare = true needs at least two precisions (e.g. ['f32', 'bf16'])")
        if self.compare and self.scheduler == "asha":
            raise ValueError(
                "compare = true needs scheduler = 'fifo': ASHA would stop the members of a pair "
                "at different epochs and the paired Sharpe difference would compare unequal training"
            )
        if self.grace_epochs > self.max_epochs:
            raise ValueError(
                f"grace_epochs ({self.grace_epochs}) must be <= max_epochs ({self.max_epochs})"
            )
        for model in self.search_space:
            if model not in self.models:
                raise ValueError(
                    f"search_space.{model}: not one of this sweep's models {self.models}"
                )
        return self

    # -- derived ---------------------------------------------------------------------------
    @property
    def n_trials(self) -> int:
        per_config = len(self.seeds) * len(self.precisions)
        return len(self.models) * self.samples * per_config

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
    payload: dict[str, Any], source: str = "<spec>", base_dir: Path | None = None
) -> SweepSpec:
    """Validate a parsed spec; raises :class:`SpecError` naming every bad field."""
    try:
        spec = SweepSpec.model_validate(payload)
    except ValidationError as exc:
        raise SpecError(source, [_describe(err) for err in exc.errors()]) from None
    problems = _deep_checks(spec, base_dir)
    if problems:
        raise SpecError(source, problems)
    if spec.data.source != "synthetic" and base_dir is not None:
        resolved = _resolve_data(spec.data.source, base_dir)
        spec = spec.model_copy(
            update={"data": spec.data.model_copy(update={"source": str(resolved)})}
        )
    return spec


def load_spec(path: Path | str, overrides: dict[str, Any] | None = None) -> SweepSpec:
    """Read a TOML/YAML spec file, apply top-level ``overrides`` (from the CLI), validate."""
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
    return parse_spec(payload, source=str(path), base_dir=path.parent)


def _describe(err: Any) -> str:
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    message = err["msg"]
    if err["type"] == "extra_forbidden":
        message = "unknown field"
        parent = err["loc"][:-1]
        allowed = _fields_at(parent)
        if allowed:
            message += f"; allowed: {allowed}"
    return f"{where}: {message}"


def _fields_at(loc: tuple[Any, ...]) -> list[str]:
    model: Any = SweepSpec
    for part in loc:
        field = model.model_fields.get(part) if hasattr(model, "model_fields") else None
        if field is None or not hasattr(field.annotation, "model_fields"):
            return []
        model = field.annotation
    return sorted(model.model_fields)


def _deep_checks(spec: SweepSpec, base_dir: Path | None) -> list[str]:
    """Checks that need the model registry or the filesystem."""
    from hpo.search.space import trial_space

    problems = []
    for model in spec.models:
        try:
            space = trial_space(model, spec.search_space.get(model))
        except ValueError as exc:
            problems.append(str(exc))
            continue
        except (OverflowError, TypeError) as exc:  # e.g. {low = 10**400} read from YAML
            problems.append(f"search_space.{model}: {exc}")
            continue
        problem = _trial_config_problem(spec, model, space)
        if problem:
            problems.append(problem)
    if spec.data.source != "synthetic":
        try:
            resolved = _resolve_data(spec.data.source, base_dir or Path.cwd())
            found = resolved.exists()
        except (OSError, RuntimeError) as exc:  # name too long; '~user' with no such user
            return [*problems, f"data.source: {spec.data.source!r} is not a usable path ({exc})"]
        if not found:
            problems.append(
                f"data.source: {spec.data.source!r} does not exist (looked at {resolved})"
            )
    return problems


def _trial_config_problem(spec: SweepSpec, model: str, space: Any) -> str | None:
    """Build one trial's configuration (fixed keys, every searched key at its lower bound)
    exactly as a trial would, so settings that would fail in every trial fail here instead,
    before Ray or MLflow start."""
    from models import get_family
    from models.base import Choice

    sample = {k: d.options[0] if isinstance(d, Choice) else d.low for k, d in space.dims.items()}
    trial = TrialConfig(
        model=model,
        precision=spec.precisions[0],
        seed=spec.seeds[0],
        params={**space.fixed, **sample},
        base=spec.trial_base(),
    )
    try:
        config = trial.train_config()
        get_family(model).make_config(config.model_config)
    except (ValueError, TypeError, OverflowError) as exc:
        return f"trainer / search_space.{model}: a trial of {model} would fail: {exc}"
    return None


def _resolve_data(source: str, base_dir: Path) -> Path:
    path = Path(source).expanduser()
    if path.is_absolute():
        return path
    beside_spec = base_dir / path
    return beside_spec if beside_spec.exists() else Path.cwd() / path
