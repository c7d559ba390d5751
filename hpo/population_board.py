"""Population-based training across Tune trials: the board a population's trials rank on.

A population that does not fit one group trial (a family that does not group: dqn, ppo;
``grouping.group_size = 1``; or more trials than a group holds) has its trials in several
Tune trials, on any node. At each interval boundary a trial saves its training state as
a *boundary checkpoint* under the sweep directory
(``pbt/<population>/<trial>/epoch-<n>-<attempt>``, the layout ``hpo train --resume``
reads), then posts its validation Sharpe to the sweep's board (:class:`PopulationBoard`,
one Ray actor per sweep on the driver's node, like the rungs of :mod:`hpo.rungs`), which
answers whether it exploits, and whom.

The board decides asynchronously, at equal training time: a trial that reaches boundary
``n`` ranks among the population's trials that have reached ``n`` so far (Ray Tune's
PBT ranks on every trial's latest result instead, whatever its epoch); if it is in their
bottom quantile (:func:`trainables.pbt.quantile_size`) it copies one drawn from their
top: that trial's boundary checkpoint at ``n``, and settings explored from the ones it
trained with. Nobody waits for anybody: a population larger than the sweep's
concurrency, or with a crashed or slow trial, never hangs (the synchronous mode's
failure in Ray Tune, ray-project/ray#23424). The first trial to reach a boundary has
nobody to rank against and trains on; the later ones see more of the population, so at
a quantile of 0.25 a little more than a quarter of a population exploits per boundary.

Every answer is kept, by trial and epoch, and the board's whole state (scores, boundary
checkpoints, answers, each population's random generator) is written to the sweep
directory after each one (``pbt/board.json``): a trial that re-runs a boundary epoch
after an interrupt gets the answer it got before and loads the same donor checkpoint
(boundary checkpoints are never deleted while the sweep lives), so a resumed sweep does
no exploit twice and loses none. A boundary checkpoint is written to a new place each
attempt, so none is ever read half written or replaced once posted. The lineage a trial
carries is its own (in its checkpoints); the board's file is what ``hpo resume`` starts
the board from.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from cluster.storage import SweepLocation, local_copy
from trainables.pbt import PbtSettings, explore, quantile_size, rng_from_json, rng_to_json

POPULATION_DIR = "pbt"
BOARD_FILE = "board.json"
"""The board's state, in :data:`POPULATION_DIR` (``pbt``: also the boundary checkpoints): not beside Tune's experiment state, whose
top-level JSON files Tune downloads on a restore and uploads again as the sweep goes on
(a stale copy would replace the board's newer file)."""
_ACTOR_PREFIX = "hpo-pbt-board-"
# The boards this driver started: a named actor that is not detached dies with its last
# handle, so the driver keeps one for the sweep's life (trials find it by name).
_BOARDS: dict[str, Any] = {}


class PopulationBoard:
    """The boundaries of a sweep's populations across processes (module docstring).

    ``sweep_dir``: where the state is kept (None: in memory only, for tests)."""

    STATE_VERSION = 1

    def __init__(self, sweep_dir: str | None = None) -> None:
        self.sweep_dir = SweepLocation.parse(sweep_dir) if sweep_dir is not None else None
        # population -> {"rng": state, "boundaries": {epoch: {trial key: entry}},
        #                "decisions": {"<trial key>@<epoch>": decision or None}}
        self.populations: dict[str, dict[str, Any]] = {}
        self.state_dir = self.sweep_dir.child(POPULATION_DIR) if self.sweep_dir else None
        if self.state_dir is not None and self.state_dir.exists(BOARD_FILE):
            self.load_state(json.loads(self.state_dir.read_text(BOARD_FILE)))

    def at_boundary(
        self,
        population: str,
        pbt: Mapping[str, Any],
        trial: str,
        trial_id: str,
        epoch: int,
        score: float | None,
        settings: Mapping[str, float],
        checkpoint: str,
    ) -> dict[str, Any] | None:
        """The trial ``trial`` (its trial key; ``trial_id``: the id its MLflow run knows
        it by) completed boundary ``epoch`` with validation Sharpe ``score`` (None or
        NaN: it neither copies nor is copied: it fell back to f32), having trained with
        ``settings``, its state saved at ``checkpoint`` (its boundary checkpoint).
        Returns its exploit (``epoch``, ``donor`` (the donor's trial id), ``donor_key``,
        ``checkpoint`` (the donor's boundary checkpoint), ``before``, ``after``), or None
        where it trains on as it is. The same trial and epoch always get the same answer
        (and the entry it posted first stays). ``pbt``: the population's
        :meth:`PbtSettings.to_dict`."""
        state = self.populations.setdefault(
            population,
            {"rng": rng_to_json(random.Random(population)), "boundaries": {}, "decisions": {}},
        )
        key = f"{trial}@{epoch}"
        if key in state["decisions"]:
            return state["decisions"][key]
        entries = state["boundaries"].setdefault(str(epoch), {})
        finite = score is not None and math.isfinite(score)
        entries[trial] = {
            "trial_id": trial_id,
            "score": float(score) if finite else None,  # type: ignore[arg-type]
            "settings": dict(settings),
            "checkpoint": checkpoint,
        }
        decision = None
        if finite:
            decision = self._decide(state, PbtSettings.from_dict(pbt), trial, entries, epoch)
        state["decisions"][key] = decision
        self._save()
        return decision

    def _decide(
        self,
        state: dict[str, Any],
        pbt: PbtSettings,
        trial: str,
        entries: Mapping[str, Mapping[str, Any]],
        epoch: int,
    ) -> dict[str, Any] | None:
        scored = {k: e["score"] for k, e in entries.items() if e["score"] is not None}
        if len(scored) < 2:
            return None
        # Worst first; equal scores by trial key, the lower key ranked higher (as
        # choose_exploits ranks by index), so no tie depends on arrival order.
        ranked = sorted(scored, key=lambda k: (scored[k], _descending(k)))
        m = quantile_size(len(ranked), pbt.quantile)
        if trial not in ranked[:m]:
            return None
        rng = rng_from_json(state["rng"])
        donor = rng.choice(sorted(ranked[-m:]))
        source = entries[donor]
        after = explore(source["settings"], pbt.mutations, rng, pbt.resample_probability)
        state["rng"] = rng_to_json(rng)
        return {
            "epoch": epoch,
            "donor": source["trial_id"],
            "donor_key": donor,
            "checkpoint": source["checkpoint"],
            "before": dict(entries[trial]["settings"]),
            "after": after,
        }

    def exploits(self, population: str | None = None) -> int:
        """Exploits decided so far (in ``population``, or all)."""
        return sum(
            1
            for name, state in self.populations.items()
            if population in (None, name)
            for decision in state["decisions"].values()
            if decision is not None
        )

    def state(self) -> dict[str, Any]:
        return {"version": self.STATE_VERSION, "populations": self.populations}

    def load_state(self, state: Mapping[str, Any]) -> None:
        if state.get("version") != self.STATE_VERSION:
            raise ValueError(
                f"{POPULATION_DIR}/{BOARD_FILE}: state version {state.get('version')}, this "
                f"board reads {self.STATE_VERSION}"
            )
        self.populations = {k: dict(v) for k, v in state["populations"].items()}

    def _save(self) -> None:
        if self.state_dir is not None:
            self.state_dir.write_text(BOARD_FILE, json.dumps(self.state()))


def _descending(text: str) -> list[int]:
    """A sort key that orders strings in reverse (for a worst-first ranking's ties)."""
    return [-ord(c) for c in text] + [1]


# ----------------------------------------------------------------------------------------
# what a trial asks (pickled into every trial)


class PopulationExchange:
    """A trial's side of the board (``trainables.population.Exchange``): saves its
    boundary checkpoints under the sweep directory, asks the sweep's board, opens a
    donor's boundary checkpoint. Found by name from any node of the sweep's Ray job; the
    sweep directory must be one every node reaches (as a resumable sweep's storage
    already must)."""

    def __init__(self, sweep_name: str, sweep_dir: str) -> None:
        self.actor_name = _ACTOR_PREFIX + sweep_name
        self.sweep_dir = sweep_dir
        self._actor: Any = None

    def save_boundary_checkpoint(
        self, population: str, trial: str, epoch: int, save: Callable[[Path], object]
    ) -> str:
        """Save ``trial``'s state at ``epoch`` with ``save(directory)`` under the sweep
        directory, at a place no earlier attempt used (an epoch re-run after a resume may
        train to other bits on a GPU, and an upload cut off leaves a partial folder): a
        checkpoint once posted is never replaced, and none is posted before it is whole.
        Returns where it is."""
        attempt = uuid.uuid4().hex[:8]
        name = (
            f"{POPULATION_DIR}/{_path_part(population)}/{_path_part(trial)}/epoch-{epoch}-{attempt}"
        )
        location = SweepLocation.parse(self.sweep_dir)
        target = location.child(name)
        if location.is_local:
            final = target.local_path
            final.parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
            try:
                save(staging / "state")
                (staging / "state").rename(final)  # whole, or not there
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            return target.uri
        from pyarrow import fs as pafs

        with tempfile.TemporaryDirectory(prefix="hpo-pbt-") as tmp:
            save(Path(tmp) / "state")
            filesystem, path = target.filesystem()
            # Posted to the board only after the upload: nobody reads it half written.
            pafs.copy_files(
                str(Path(tmp) / "state"),
                path,
                source_filesystem=pafs.LocalFileSystem(),
                destination_filesystem=filesystem,
            )
        return target.uri

    def at_boundary(
        self, population: str, pbt: Mapping[str, Any], **report: Any
    ) -> dict[str, Any] | None:
        """The board's :meth:`PopulationBoard.at_boundary` for this trial."""
        import ray

        if self._actor is None:
            self._actor = ray.get_actor(self.actor_name)
        decision: dict[str, Any] | None = ray.get(
            self._actor.at_boundary.remote(population, dict(pbt), **report)
        )
        return decision

    @contextlib.contextmanager
    def open_boundary_checkpoint(self, where: str) -> Iterator[Path]:
        """A donor's boundary checkpoint as a local directory."""
        with local_copy(where) as directory:
            yield directory

    def __getstate__(self) -> dict[str, Any]:
        return {"actor_name": self.actor_name, "sweep_dir": self.sweep_dir, "_actor": None}


def _path_part(text: str) -> str:
    """A trial key or population id as one path part (``kan-f32-c000|f32/0`` ->
    ``kan-f32-c000_f32_0``)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)


def start_population_board(sweep_name: str, sweep_dir: str) -> PopulationExchange:
    """Start the sweep's board in the connected Ray job, on this (the driver's) node,
    where the sweep directory is written from (under Ray Client, the head node), from the
    state a previous run of the sweep left there (``hpo resume``), replacing a board a
    sweep of that name left in this Ray session; the exchange its trials use."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    name = _ACTOR_PREFIX + sweep_name
    with contextlib.suppress(ValueError):
        ray.kill(ray.get_actor(name))
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    board = ray.remote(num_cpus=0)(PopulationBoard).options(name=name, scheduling_strategy=here)
    _BOARDS[name] = board.remote(sweep_dir)
    return PopulationExchange(sweep_name, sweep_dir)
