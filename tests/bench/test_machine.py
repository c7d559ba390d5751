"""bench/machine.py: the line `make test` prints names the processor a run was on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType

from tests.bench_scripts import load_bench_script

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "machine.py"

# The first processor is a 2-core first-generation EPYC's, as its kernel lists it
# (abridged); the second is made up, every value different, so that a parser reading past
# the first processor shows.
CPUINFO = """\
processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 23
model\t\t: 1
model name\t: AMD EPYC
cpu MHz\t\t: 1996.247
flags\t\t: fpu sse4_2 avx fma avx2 sha_ni

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: another processor
cpu MHz\t\t: 3000.000
flags\t\t: fpu avx2 avx512f avx512_bf16
"""

# An arm server's first processor (Neoverse N1: implementer 0x41, part 0xd0c): no model
# name, clock or flags, but Features.
ARM_CPUINFO = """\
processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics
CPU implementer\t: 0x41
CPU architecture: 8
CPU part\t: 0xd0c
"""


def _load_bench() -> ModuleType:
    return load_bench_script("machine.py", "machine_bench")


def test_the_first_processor_is_described_by_family_model_clock_and_vector_extensions() -> None:
    machine = _load_bench()
    fields = machine.first_processor(CPUINFO)
    assert (fields["cpu family"], fields["model"], fields["model name"]) == ("23", "1", "AMD EPYC")
    assert machine.describe(fields) == "AMD EPYC (family 23 model 1, 1996 MHz; avx2)"
    assert machine.describe({"model name": "old", "flags": "fpu sse2", "cpu MHz": "n/a"}) == (
        "old (family ? model ?, n/a MHz; no AVX2)"
    )


def test_an_arm_processor_is_described_by_implementer_part_and_features() -> None:
    machine = _load_bench()
    described = machine.describe(machine.first_processor("\n" + ARM_CPUINFO))
    assert described == "arm (implementer 0x41 part 0xd0c; asimd)"


def test_the_script_prints_one_line_with_the_processor_and_a_loops_time() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH)], capture_output=True, text=True, check=True, timeout=60
    )
    (line,) = done.stdout.splitlines()
    processor, _, rest = line.removeprefix("machine: ").rpartition(", ")
    machine = _load_bench()
    if machine.CPUINFO.is_file():  # the processor this machine's kernel names
        assert processor == machine.describe(machine.first_processor(machine.CPUINFO.read_text()))
    assert processor and line.startswith("machine: ")
    cpus, _, loop = rest.partition(" CPUs; a Python loop of 2M squares ")
    assert int(cpus) == machine.usable_cpus() >= 1
    assert loop.endswith(" ms") and float(loop.removesuffix(" ms")) > 0
