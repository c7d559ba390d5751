"""Population-based training's policy: which trials exploit which, and how a recipient
explores its settings (Jaderberg et al. 2017). Pure Python, no torch: the copy itself is
:meth:`trainables.group.TrainerGroup.exploit`.

    pairs = choose_exploits(scores, rng, quantile=0.25)  # [(recipient, donor), ...]
    for recipient, donor in pairs:
        settings = explore(group.mutable_settings(donor), mutations, rng)
        group.exploit(recipient, donor, settings)

As in Jaderberg et al. and Ray, the recipient explores from the donor's settings (it
took the donor's state, which was trained with them), not from its own.

Every random draw goes through the ``random.Random`` passed in, in a fixed order (the
recipients worst first; the mutated settings by name), so a population resumed with the
generator's saved state (``rng.getstate()``) replays the same exploits and explorations.
Conventions follow Ray Tune's ``PopulationBasedTraining`` where it has one (the quantile's
rounding, the 0.8 / 1.2 perturbation factors, a choice moving to a neighbour); where this
module differs it says so.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from models.family import Family

PERTURBATION_FACTORS = (0.8, 1.2)
"""Ray's default factors: a perturbed setting is 0.8 or 1.2 times what it was."""


class Range(NamedTuple):
    """A continuous setting's search range; ``log``: sampled and perturbed on a log scale
    (``low`` > 0)."""

    low: float
    high: float
    log: bool = False


Mutation = Range | Sequence[float]
"""How a setting may change: a :class:`Range`, or its choices (a list, in order)."""


def quantile_size(n: int, quantile: float) -> int:
    """How many of ``n`` eligible trials make the bottom (and the top) quantile:
    ``ceil(quantile * n)`` (so any share of a population of 2 or more moves at least one
    trial), at most ``n // 2`` (a trial is never both donor and recipient). Ray's
    rounding: 4 trials at 0.25 -> 1, 5 -> 2, 8 -> 2, 2 or 3 -> 1."""
    if not 0 < quantile <= 0.5:
        raise ValueError(f"quantile must be in (0, 0.5], got {quantile}")
    return min(math.ceil(quantile * n), n // 2)


def choose_exploits(
    scores: Sequence[float | None], rng: random.Random, quantile: float = 0.25
) -> list[tuple[int, int]]:
    """(recipient, donor) index pairs: each trial in the bottom ``quantile`` of ``scores``
    (higher is better: the interval's validation Sharpe) copies a trial drawn uniformly
    from the top quantile.

    A score of None (a trial that cannot take part: diverged, stopped, fallen back to f32,
    done) or NaN leaves the trial out of the ranking; the quantiles are of the eligible
    trials (:func:`quantile_size`), and with fewer than 2 of them nothing happens. Equal
    scores rank by index, the lower index higher, so the ranking never depends on the
    order a sort happens to leave. Recipients come worst first, each drawing its donor
    in turn (one ``rng.choice`` each), so a replay with the same generator state draws
    the same donors."""
    eligible = [i for i, s in enumerate(scores) if s is not None and not math.isnan(s)]
    if len(eligible) < 2:
        return []
    # Worst first: lowest score, and among equal scores the higher index.
    ranked = sorted(eligible, key=lambda i: (scores[i], -i))
    m = quantile_size(len(ranked), quantile)
    bottom, top = ranked[:m], ranked[-m:]
    return [(recipient, rng.choice(top)) for recipient in bottom]


def explore(
    settings: Mapping[str, float],
    mutations: Mapping[str, Mutation],
    rng: random.Random,
    resample_probability: float = 0.25,
) -> dict[str, float]:
    """A recipient's new settings: ``settings`` with each one ``mutations`` names changed.

    With probability ``resample_probability`` a setting is drawn afresh: uniformly from
    its choices, or from its range (log-uniformly for a log range). Otherwise it is
    perturbed:

    - a log range's value is multiplied by 0.8 or 1.2 (Ray's factors; a step of
      log(1.2) either way on the log scale lr and weight decay are searched on);
    - a linear range's value moves by 0.2 of the range's width, down or up. Ray multiplies
      these too; here the step is of the width because many linear ranges start at 0
      (dropout, an entropy weight), where a product could never leave 0;
    - a choice moves to a neighbour in the list's order, down or up (a value not among
      the choices is drawn afresh, as Ray does).

    Perturbed values are clipped to the range (a choice at an end stays there when it
    would move out). Settings are mutated in order of their names; each takes one
    ``rng.random()`` for the resample decision and then one draw, so the same generator
    state gives the same result. Settings ``mutations`` does not name are kept as they
    are; a mutation of a setting ``settings`` lacks is refused (a misspelt name)."""
    if not 0 <= resample_probability <= 1:
        raise ValueError(f"resample_probability must be in [0, 1], got {resample_probability}")
    unknown = sorted(set(mutations) - set(settings))
    if unknown:
        raise ValueError(f"mutations of settings the trial does not have: {unknown}")
    out = dict(settings)
    for name in sorted(mutations):
        mutation, value = mutations[name], settings[name]
        resample = rng.random() < resample_probability
        if isinstance(mutation, Range):
            out[name] = _explore_range(name, value, mutation, resample, rng)
        else:
            out[name] = _explore_choices(name, value, list(mutation), resample, rng)
    return out


def _explore_range(name: str, value: float, r: Range, resample: bool, rng: random.Random) -> float:
    if not r.low <= r.high:
        raise ValueError(f"{name}: range low {r.low} > high {r.high}")
    if r.log and r.low <= 0:
        raise ValueError(f"{name}: a log range needs low > 0, got {r.low}")
    if resample:
        if r.log:
            return math.exp(rng.uniform(math.log(r.low), math.log(r.high)))
        return rng.uniform(r.low, r.high)
    factor = rng.choice(PERTURBATION_FACTORS)
    moved = value * factor if r.log else value + (factor - 1.0) * (r.high - r.low)
    return min(max(moved, r.low), r.high)


def _explore_choices(
    name: str, value: float, choices: list[float], resample: bool, rng: random.Random
) -> float:
    if not choices:
        raise ValueError(f"{name}: no choices to explore")
    if resample or value not in choices:
        return rng.choice(choices)
    index = choices.index(value) + rng.choice((-1, 1))
    return choices[min(max(index, 0), len(choices) - 1)]


def rng_to_json(rng: random.Random) -> list[Any]:
    """A population's generator state as JSON (``rng.getstate()``, its tuple a list)."""
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def rng_from_json(state: Sequence[Any]) -> random.Random:
    """The generator :func:`rng_to_json` saved, drawing on where it was."""
    version, internal, gauss = state
    rng = random.Random()
    rng.setstate((version, tuple(internal), gauss))
    return rng


def mutation_to_dict(mutation: Mutation) -> dict[str, Any]:
    """A mutation as JSON (a trial config's, a spec table's form): ``{low, high, log}``
    or ``{choices}``."""
    if isinstance(mutation, Range):
        return {"low": mutation.low, "high": mutation.high, "log": mutation.log}
    return {"choices": [float(c) for c in mutation]}


def mutation_from_dict(value: Mapping[str, Any]) -> Mutation:
    """The inverse of :func:`mutation_to_dict`."""
    if "choices" in value:
        return [float(c) for c in value["choices"]]
    return Range(float(value["low"]), float(value["high"]), bool(value.get("log", False)))


@dataclass(frozen=True)
class PbtSettings:
    """How a population trains (the spec's ``[pbt]`` table, resolved for one family):
    what a group trial running population-based training carries in its config."""

    interval_epochs: int
    """Epochs between two exploit rounds: the population ranks and exploits after every
    ``interval_epochs``-th epoch, never after the last."""
    quantile: float
    """The bottom (and top) share of the population: :func:`choose_exploits`."""
    resample_probability: float
    """A mutated setting's chance of a fresh draw rather than a perturbation: :func:`explore`."""
    mutations: Mapping[str, Mutation]
    """The settings a recipient explores, by name, each with its range or choices."""

    def __post_init__(self) -> None:
        if self.interval_epochs < 1:
            raise ValueError(f"interval_epochs must be >= 1, got {self.interval_epochs}")
        quantile_size(2, self.quantile)  # raises on a quantile out of (0, 0.5]
        if not 0 <= self.resample_probability <= 1:
            raise ValueError(
                f"resample_probability must be in [0, 1], got {self.resample_probability}"
            )
        if not self.mutations:
            raise ValueError("a population needs at least one mutation")

    def is_boundary(self, epoch: int, epochs: int) -> bool:
        """Whether a population that completed ``epoch`` of its ``epochs`` exploits now:
        at every ``interval_epochs``-th epoch but the last (nothing trains after it)."""
        return 0 < epoch < epochs and epoch % self.interval_epochs == 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "interval_epochs": self.interval_epochs,
            "quantile": self.quantile,
            "resample_probability": self.resample_probability,
            "mutations": {k: mutation_to_dict(m) for k, m in sorted(self.mutations.items())},
        }

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> PbtSettings:
        return cls(
            interval_epochs=int(value["interval_epochs"]),
            quantile=float(value["quantile"]),
            resample_probability=float(value["resample_probability"]),
            mutations={k: mutation_from_dict(m) for k, m in value["mutations"].items()},
        )


def mutable_setting_names(family: Family) -> tuple[str, ...]:
    """The settings population-based training may change in ``family``'s trials (what
    :meth:`trainables.group.TrainerGroup.mutable_settings` holds): lr, weight decay and the family's
    per-trial model settings that are floats (by their defaults), in that order, the
    family's by name."""
    defaults = dataclasses.asdict(family.make_config({}))
    own = sorted(n for n in family.per_trial_settings if isinstance(defaults.get(n), float))
    return ("lr", "weight_decay", *own)
