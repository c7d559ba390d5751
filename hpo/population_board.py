"""Population-based training across processes: the board a population's Tune trials rank on.

A population whose trials do not share one group trial (a family that does not group:
dqn, ppo, ...) has each member in its own Tune trial, on any node. At each interval
boundary a member saves its training state as a snapshot under the sweep directory
(``pbt/<population>/<member>/epoch-<n>``, the layout ``hpo train --resume`` reads), then
posts its validation Sharpe to the sweep's board (:class:`PopulationBoard`, one Ray actor
per sweep, like :mod:`hpo.rungs`), which answers whether it exploits, and whom.

The board decides asynchronously, at equal training time: a member that reaches boundary
``n`` ranks among the members that have reached ``n`` so far (Ray Tune's PBT ranks on
every trial's latest result instead, whatever its epoch); if it is in their bottom
quantile (:func:`trainables.pbt.quantile_size`) it copies a member drawn from their top,
that member's snapshot at ``n`` and settings explored from the ones that snapshot trained
with. Nobody waits for anybody: a population larger than the sweep's concurrency, or
with a crashed or slow member, never hangs (the synchronous mode's failure in Ray Tune,
ray-project/ray#23424). The first member to reach a boundary has nobody to rank against
and trains on; the later ones see more of the population.

Every decision is kept, by member and epoch, and the board's whole state (scores,
snapshots, decisions, each population's random generator) is written to the sweep
directory after each one (``pbt/board.json``): a member that re-runs a boundary epoch
after an interrupt gets the decision it got before, and loads the same snapshot
(snapshots are never deleted while the sweep lives), so a resumed sweep does no exploit
twice and loses none. The lineage a member carries is its own (in its checkpoints), and
the board's file is what ``hpo resume`` starts the board from.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from cluster.storage import SweepLocation, local_copy
from trainables.pbt import PbtSettings, explore, quantile_size

SNAPSHOT_DIR = "pbt"
BOARD_FILE = "board.json"
"""The board's state, in :data:`SNAPSHOT_DIR`: not beside Tune's experiment state, whose
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
        # population -> {"rng": state, "boundaries": {epoch: {member: entry}},
        #                "decisions": {"member@epoch": decision or None}}
        self.populations: dict[str, dict[str, Any]] = {}
        self.state_dir = self.sweep_dir.child(SNAPSHOT_DIR) if self.sweep_dir else None
        if self.state_dir is not None and self.state_dir.exists(BOARD_FILE):
            self.load_state(json.loads(self.state_dir.read_text(BOARD_FILE)))

    def at_boundary(
        self,
        population: str,
        pbt: Mapping[str, Any],
        member: str,
        trial_id: str,
        epoch: int,
        score: float | None,
        settings: Mapping[str, float],
        snapshot: str,
    ) -> dict[str, Any] | None:
        """``member`` (a trial key; its Tune trial ``trial_id``) completed boundary
        ``epoch`` with validation Sharpe ``score`` (None or NaN: it neither copies nor is
        copied: it fell back to f32), having trained with ``settings``, its state saved at
        ``snapshot``. Returns its exploit (``epoch``, ``donor`` (the donor's Tune trial
        id), ``donor_key``, ``snapshot`` (the donor's), ``before``, ``after``), or None
        where it trains on as it is. The same member and epoch always get the same
        answer. ``pbt``: the population's :meth:`PbtSettings.to_dict`."""
        state = self.populations.setdefault(
            population,
            {"rng": _rng_state(random.Random(population)), "boundaries": {}, "decisions": {}},
        )
        key = f"{member}@{epoch}"
        if key in state["decisions"]:
            return state["decisions"][key]
        entries = state["boundaries"].setdefault(str(epoch), {})
        finite = score is not None and math.isfinite(score)
        entries[member] = {
            "trial_id": trial_id,
            "score": float(score) if finite else None,  # type: ignore[arg-type]
            "settings": dict(settings),
            "snapshot": snapshot,
        }
        decision = None
        if finite:
            decision = self._decide(state, PbtSettings.from_dict(pbt), member, entries, epoch)
        state["decisions"][key] = decision
        self._save()
        return decision

    def _decide(
        self,
        state: dict[str, Any],
        pbt: PbtSettings,
        member: str,
        entries: Mapping[str, Mapping[str, Any]],
        epoch: int,
    ) -> dict[str, Any] | None:
        scored = {m: e["score"] for m, e in entries.items() if e["score"] is not None}
        if len(scored) < 2:
            return None
        # Worst first; equal scores by member key, the lower key ranked higher (as
        # choose_exploits ranks by index), so no tie depends on arrival order.
        ranked = sorted(scored, key=lambda m: (scored[m], _descending(m)))
        m = quantile_size(len(ranked), pbt.quantile)
        if member not in ranked[:m]:
            return None
        rng = _rng(state["rng"])
        donor = rng.choice(sorted(ranked[-m:]))
        source = entries[donor]
        after = explore(source["settings"], pbt.mutations, rng, pbt.resample_probability)
        state["rng"] = _rng_state(rng)
        return {
            "epoch": epoch,
            "donor": source["trial_id"],
            "donor_key": donor,
            "snapshot": source["snapshot"],
            "before": dict(entries[member]["settings"]),
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
                f"{SNAPSHOT_DIR}/{BOARD_FILE}: state version {state.get('version')}, this board reads "
                f"{self.STATE_VERSION}"
            )
        self.populations = {k: dict(v) for k, v in state["populations"].items()}

    def _save(self) -> None:
        if self.state_dir is not None:
            self.state_dir.write_text(BOARD_FILE, json.dumps(self.state()))


def _descending(text: str) -> list[int]:
    """A sort key that orders strings in reverse (for a worst-first ranking's ties)."""
    return [-ord(c) for c in text] + [1]


def _rng(state: list[Any]) -> random.Random:
    rng = random.Random()
    version, internal, gauss = state
    rng.setstate((version, tuple(internal), gauss))
    return rng


def _rng_state(rng: random.Random) -> list[Any]:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


# ----------------------------------------------------------------------------------------
# what a member asks (pickled into every trial)


class PopulationExchange:
    """A member's side of the board (``trainables.trial.Exchange``): saves its snapshots
    under the sweep directory, asks the sweep's board, opens a donor's snapshot. Found
    by name from any node of the sweep's Ray job; the sweep directory must be one every
    node reaches (as a resumable sweep's storage already must)."""

    def __init__(self, sweep_name: str, sweep_dir: str) -> None:
        self.actor_name = _ACTOR_PREFIX + sweep_name
        self.sweep_dir = sweep_dir
        self._actor: Any = None

    def save_snapshot(
        self, population: str, member: str, epoch: int, save: Callable[[Path], object]
    ) -> str:
        """Where ``member``'s state at ``epoch`` is, saving it there with ``save(dir)``
        unless a complete snapshot is there already (an epoch re-run after a resume:
        others may have copied it, so it stays as it was)."""
        name = f"{SNAPSHOT_DIR}/{_path_part(population)}/{_path_part(member)}/epoch-{epoch}"
        location = SweepLocation.parse(self.sweep_dir)
        target = location.child(name)
        if location.exists(name):
            return target.uri
        if location.is_local:
            final = target.local_path
            final.parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
            try:
                save(staging / "state")
                (staging / "state").rename(final)  # whole, or not there: never half written
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
        """The board's :meth:`PopulationBoard.at_boundary` for this member."""
        import ray

        if self._actor is None:
            self._actor = ray.get_actor(self.actor_name)
        decision: dict[str, Any] | None = ray.get(
            self._actor.at_boundary.remote(population, dict(pbt), **report)
        )
        return decision

    @contextlib.contextmanager
    def open_snapshot(self, where: str) -> Iterator[Path]:
        """A donor's snapshot as a local directory."""
        with local_copy(where) as directory:
            yield directory

    def __getstate__(self) -> dict[str, Any]:
        return {"actor_name": self.actor_name, "sweep_dir": self.sweep_dir, "_actor": None}


def _path_part(text: str) -> str:
    """A trial key or population id as one path part (``kan-f32-c000|f32/0`` ->
    ``kan-f32-c000_f32_0``)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)


def start_population_board(sweep_name: str, sweep_dir: str) -> PopulationExchange:
    """Start the sweep's board in the connected Ray job, from the state a previous run of
    the sweep left in ``sweep_dir`` (``hpo resume``), replacing a board a sweep of that
    name left in this Ray session; the exchange its trials use."""
    import ray

    name = _ACTOR_PREFIX + sweep_name
    with contextlib.suppress(ValueError):
        ray.kill(ray.get_actor(name))
    board = ray.remote(num_cpus=0)(PopulationBoard).options(name=name)
    _BOARDS[name] = board.remote(sweep_dir)
    return PopulationExchange(sweep_name, sweep_dir)
