"""The names of a checkpoint's files and directories, without torch: the sweep's driver,
``hpo status`` and the MLflow callback find checkpoints by them; :mod:`trainables.checkpoint`
writes and reads what they name."""

from __future__ import annotations

import re

WEIGHTS_FILE = "model.safetensors"
OPTIM_FILE = "optim.safetensors"
STATE_FILE = "state.safetensors"
META_FILE = "meta.json"
CHECKPOINTS = "checkpoints"  # a run directory's epoch checkpoints (``hpo train --out DIR``)
TENSOR_FILES = (WEIGHTS_FILE, OPTIM_FILE, STATE_FILE)
EPOCH_DIR = re.compile(r"^epoch_(\d{4,})$")
CKPT_SUBDIR = "state"
"""Inside each checkpoint a trial reports to Tune: the directory holding the trial's own
checkpoint (a group trial's: one per trial, by slug)."""
