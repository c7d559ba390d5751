"""A benchmark script of ``bench/`` as a module, for the tests of its smoke modes and its
functions (``bench/`` is a folder of scripts, not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH_DIR = Path(__file__).resolve().parents[1] / "bench"


def load_bench_script(filename: str, module_name: str) -> ModuleType:
    """``bench/<filename>`` imported as ``module_name``, a new module at each call."""
    spec = importlib.util.spec_from_file_location(module_name, BENCH_DIR / filename)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module
