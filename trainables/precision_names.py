"""The precision policies' names, without torch: the spec and a trial's config check a
precision against them in the sweep's driver; :mod:`trainables.precision` builds the
policy each one names (and re-exports these)."""

from __future__ import annotations

POLICY_NAMES: tuple[str, ...] = ("f32", "tf32", "bf16", "bf16-mixed", "fp16-mixed", "auto")
