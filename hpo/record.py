"""A sweep's record: ``hpo-sweep.json`` beside Ray Tune's experiment directory.

It holds the validated spec, the MLflow parent run and the tracking URI, so that
``hpo resume DIR`` / ``hpo status DIR`` / ``hpo best DIR`` need nothing but the directory
(a local or shared path, or an object-store URI, see :mod:`cluster.storage`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from cluster.storage import SweepLocation
from hpo.spec import SweepSpec, parse_spec

SWEEP_FILE = "hpo-sweep.json"
SUMMARY_FILE = "hpo-summary.json"


class SweepError(RuntimeError):
    """A sweep cannot start or continue (the message says what to do)."""


@dataclass(frozen=True)
class SweepRecord:
    """What ``hpo-sweep.json`` holds."""

    spec: SweepSpec
    sweep_dir: SweepLocation
    parent_run_id: str
    tracking_uri: str

    def write(self) -> None:
        payload = {
            "spec": self.spec.model_dump(),
            "parent_run_id": self.parent_run_id,
            "tracking_uri": self.tracking_uri,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        self.sweep_dir.write_text(SWEEP_FILE, json.dumps(payload, indent=1))

    @classmethod
    def read(cls, where: str | Path | SweepLocation, *, check_data: bool = True) -> SweepRecord:
        """The record in ``where``, its spec validated again; ``check_data=False`` for
        readers that do not train (status, best): the data need not be reachable there."""
        sweep_dir = SweepLocation.parse(where)
        try:
            found = sweep_dir.exists(SWEEP_FILE)
            text = sweep_dir.read_text(SWEEP_FILE) if found else ""
        except OSError as exc:  # an object store that refuses or cannot be reached
            raise SweepError(f"cannot read {sweep_dir}/{SWEEP_FILE}: {exc}") from exc
        if not found:
            raise SweepError(
                f"{sweep_dir} is not a sweep directory (no {SWEEP_FILE}); pass STORAGE/NAME of a sweep"
            )
        payload = json.loads(text)
        spec = parse_spec(
            payload["spec"],
            source=f"{sweep_dir}/{SWEEP_FILE}",
            check_data=check_data,
        )
        return cls(
            spec=spec,
            sweep_dir=sweep_dir,
            parent_run_id=payload["parent_run_id"],
            tracking_uri=payload["tracking_uri"],
        )
