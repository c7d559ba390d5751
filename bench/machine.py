"""Which machine a run is on, in one line: `make test` prints it before pytest, so that a
CI log's time can be set beside the runs of the same processor.

    .venv/bin/python bench/machine.py

Machines of one kind differ: the same suite used 1,650-1,680 CPU-s on a 2.25-GHz AMD
EPYC and 2,880-3,200 on a 2.0-GHz first-generation one (bench/README.md, "Where the test
suite's time goes", thirteenth session). The line gives the processor as the kernel
names it (x86: model name, family and model, clock, vector extensions; arm: implementer
and part codes, features), the CPUs the run may use, and a pure-Python loop's time (best
of 3), a speed that compares across them.
"""

from __future__ import annotations

import os
import timeit
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
# What sets a model's speed here: wide vectors and native bf16 (x86), NEON and SVE (arm).
VECTOR_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "asimd", "sve", "sve2")


def first_processor(text: str) -> dict[str, str]:
    """The ``key: value`` fields of the first processor in a ``/proc/cpuinfo`` text."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def describe(fields: dict[str, str]) -> str:
    """The processor part of the line: ``model name (family F model M, N MHz; vectors)`` on
    x86; on arm, whose kernel names no model, the implementer and part codes."""
    if "model name" in fields:
        name = fields["model name"]
        identity = f"family {fields.get('cpu family', '?')} model {fields.get('model', '?')}"
    else:
        name = "arm" if "CPU implementer" in fields else "unknown processor"
        identity = (
            f"implementer {fields.get('CPU implementer', '?')} part {fields.get('CPU part', '?')}"
        )
    clock = fields.get("cpu MHz")
    try:
        clock_text = f", {float(clock):.0f} MHz" if clock else ""
    except ValueError:
        clock_text = f", {clock} MHz"
    flags = fields.get("flags") or fields.get("Features") or ""
    vectors = [f for f in VECTOR_FLAGS if f in flags.split()]
    if not vectors and "flags" in fields:
        vectors = ["no AVX2"]
    return f"{name} ({identity}{clock_text}; {' '.join(vectors) or 'no vector flags read'})"


def usable_cpus() -> int:
    """The CPUs this process may run on (a container's limit, not the host's count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def python_loop_ms() -> float:
    """The best of 3 runs of ``sum(i * i for i in range(2_000_000))``, in ms."""
    runs = timeit.repeat("sum(i * i for i in range(2_000_000))", number=1, repeat=3)
    return min(runs) * 1000.0


def main() -> None:
    try:
        processor = describe(first_processor(CPUINFO.read_text()))
    except OSError:  # no /proc (not Linux, or a sandbox without it): the architecture
        import platform

        processor = platform.machine() or "unknown processor"
    print(
        f"machine: {processor}, {usable_cpus()} CPUs; "
        f"a Python loop of 2M squares {python_loop_ms():.0f} ms"
    )


if __name__ == "__main__":
    main()
