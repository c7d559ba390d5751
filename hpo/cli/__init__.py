"""The ``hpo`` command line (the console script ``hpo = "hpo.cli:main"``; also
``python -m hpo.cli``).

    hpo families                                       families and their search spaces
    hpo train --family tft --precision bf16 --out runs/tft-bf16 [--epochs 5] [--set lr=3e-4]
    hpo train --resume runs/tft-bf16 [--precision f32] [--epochs 8] [--device cpu]
    hpo predict --checkpoint runs/tft-bf16 --data bars.csv --out positions.csv
    hpo sweep spec.toml                                 a sweep on a local Ray (or --address)
    hpo status hpo-results/NAME                         where it stands; hpo best: its best trials
    hpo compare --experiment NAME --tracking-uri URI    the paired precision comparison
    hpo tracking-server --store ~/mlflow-store                  MLflow server on 127.0.0.1:5000
    hpo submit spec.toml --address http://HEAD:8265 --storage /shared/hpo \\
        --tracking-uri http://127.0.0.1:5000 --follow            sweep on a Ray cluster (Jobs API)
    hpo jobs --address http://HEAD:8265                         the cluster's jobs

One module per area, each command parsing its flags, calling the packages below and
printing: ``_local`` (families, train, predict, profile, check-family), ``_sweeps`` (sweep,
resume, status, best), ``_comparison`` (compare, ensemble), ``_cluster`` (submit, jobs,
tracking-server); ``_options`` holds what they share and ``_app`` registers them.

Heavy imports (torch, ray, mlflow) happen inside the commands so ``hpo --help`` is instant.
"""

from __future__ import annotations

import os

# Ray reads this once, when it is imported: with 0 an embedded local Ray (`hpo sweep`
# without --address, `make demo`) binds its services to 127.0.0.1; Ray's default on Linux
# is every interface. Set here, before any command module can import ray; an explicit
# value is kept.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from hpo.cli._app import app, main, run
from hpo.cli._options import UserError

__all__ = ["UserError", "app", "main", "run"]
