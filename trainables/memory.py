"""Peak memory of one trial, counted from its start, in a process that runs many trials.

Tune reuses a worker for several trials (``reuse_actors``), so process-wide figures
(``torch.cuda.max_memory_allocated``, the resident set's high-water mark) would report an
earlier trial's peak. :class:`TrialMemory` is created at the start of the trainer's
construction and measures from there. :func:`freeze_long_lived_objects` keeps the
collection it starts with cheap in a Tune worker. :func:`pause_collection` and
:func:`imports_without_collection` keep the collector out of a process's imports.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# torch is imported where a CUDA trial is measured: a sweep's driver (no torch) returns
# its freed heap with release_freed_memory before a comparison.


class TrialMemory:
    """Peak memory of one trial, counted from its start (the trainer's construction), so
    that a worker reused for several trials (Tune's ``reuse_actors``) reports each trial's
    own peak, not the process's.

    * CUDA: peak bytes allocated by torch's caching allocator
      (``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` at the
      start) minus what was allocated at the start: this trial's tensors, the quantity
      ``cluster.profiler`` measures to size GPU shares.
    * CPU: growth of the process's resident set over the trial: the kernel's high-water
      mark (``VmHWM``, reset at the start through ``/proc/self/clear_refs``) minus the
      resident set at the start, taken after the garbage collector and glibc's
      ``malloc_trim`` returned what an earlier trial freed. It counts all the host
      memory the trial added (tensors, Python objects, allocator slack), not tensors
      alone. Where the high-water mark cannot be reset (not Linux) the resident set is
      sampled at each read instead, a lower bound of the peak.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._sampled = 0
        gc.collect()  # a previous trial's cycles (models, optimizers) are freed first
        if device.type == "cuda":
            import torch

            torch.cuda.reset_peak_memory_stats(device)
            self._baseline = torch.cuda.memory_allocated(device)
            self._hwm = False
            return
        _return_freed_heap()
        self._hwm = _reset_resident_peak()
        self._baseline = _resident_bytes()

    def peak_mb(self) -> float:
        if self.device.type == "cuda":
            import torch

            peak = torch.cuda.max_memory_allocated(self.device)
        elif self._hwm:
            peak = _proc_status_bytes("VmHWM") or _resident_bytes()
        else:
            self._sampled = max(self._sampled, _resident_bytes())
            peak = self._sampled
        return max(peak - self._baseline, 0) / 2**20


# How many more trial starts freeze what survived (see freeze_long_lived_objects).
_FREEZES_LEFT = [2]


def freeze_long_lived_objects() -> None:
    """Called by the Tune trainable at the top of each trial, before anything of the trial
    exists: collect, then move the survivors into gc's permanent generation, which later
    collections skip, at the first two trial starts of the process.

    The full ``gc.collect()`` that :class:`TrialMemory` runs at each trial start (so that
    an earlier trial's cycles are freed before the baseline is read) walks every object in
    the process, torch's, Ray's, Tune's and pandas' included: a large part of a short
    trial's time in the worker (bench/README.md, "Ray Tune overhead"). The first freeze
    takes the imports done when the actor loaded; the second what the first trial
    imported lazily (the family's module, for one); from then on a collection walks only
    what the current trial created.

    Nothing of ours is alive at these two points (the previous trial's objects were just
    collected, this one's not built yet), so nothing of a trial is frozen: a frozen
    object is still freed by reference counting, but one that becomes garbage inside a
    reference cycle never is. What Tune itself set up for those two trials is frozen with
    the rest: a bounded one-off. Not called outside Tune workers (the CLI's ``hpo train``,
    the profiler, tests): there the trainer's plain collection stays."""
    if _FREEZES_LEFT[0] <= 0:
        return
    gc.collect()
    gc.freeze()
    _FREEZES_LEFT[0] -= 1


# --------------------------------------------------------------------------------------
# The collector during a process's imports
#
# Importing torch, Ray Tune and MLflow makes some 400,000 objects that live as long as the
# process, and the cyclic collector, which runs every 700 allocations, walks the growing
# heap again and again meanwhile: 0.3 s of the sweep driver's 2.6 s of imports (MLflow,
# Tune) and 0.45 s of a trial worker's 3.4 s (torch, Tune, the trainer), on the critical
# path of every sweep (bench/README.md, "A sweep's fixed cost"). Those imports leave only
# a few thousand objects of cyclic garbage.

_PAUSED_AT_START = [False]  # pause_collection turned the collector off


def pause_collection() -> None:
    """Turn the cyclic collector off for a process's import-heavy start: ``hpo sweep`` and
    ``hpo resume`` until the driver's imports are done (:func:`resume_collection`, in
    ``hpo.sweep``); ``hpo status`` and ``best``, which read a sweep and end, and ``hpo
    sweep --plan`` (Ray's start, the profiles' tasks, mostly waiting) to the end. A
    collector already off stays off, and resume_collection leaves it so."""
    if gc.isenabled():
        gc.disable()
        _PAUSED_AT_START[0] = True


def resume_collection() -> None:
    """Where a process's long work is about to start: freeze what the paused start made,
    then collect as usual. A no-op unless :func:`pause_collection` turned the collector
    off.

    Freezing moves every object alive now into the permanent generation, which later
    collections skip. So it is called before the objects of the long work exist (a
    sweep's Tune objects, freed when Tune's run ends: frozen in a cycle, they never would
    be): what is frozen is the imports and what lives as long as the process. The
    imports' few thousand objects of cyclic garbage (about a megabyte) are frozen with
    them, once, rather than found by a walk of the whole heap (0.2 s)."""
    if _PAUSED_AT_START[0]:
        _PAUSED_AT_START[0] = False
        gc.freeze()
        gc.enable()


@contextlib.contextmanager
def imports_without_collection() -> Iterator[None]:
    """The block (its imports) with the collector off, and as it was after it. Nothing is
    frozen here: a Tune worker's trial freezes what survives at its start
    (:func:`freeze_long_lived_objects`)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def release_freed_memory() -> None:
    """Collect unreachable objects and hand the freed heap back to the OS: between two
    phases of a process whose second must not stack its peak on the first's leftovers (a
    sweep's driver after Tune, before the comparison)."""
    gc.collect()
    _return_freed_heap()


def _return_freed_heap() -> None:
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _reset_resident_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # 5: reset the peak resident set size (Linux >= 4.0)
    except OSError:
        return False
    return _proc_status_bytes("VmHWM") is not None


def _proc_status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024  # reported in kB
    except OSError:
        return None
    return None


def _resident_bytes() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)
