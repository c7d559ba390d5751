"""bench/search_efficiency.py: the smoke run prints the comparison table, and its in-process
ASHA makes the same decisions as Ray Tune's ``ASHAScheduler``."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.bench_scripts import load_bench_script

ROOT = Path(__file__).resolve().parents[2]
FOUR = ("random", "tpe", "tpe+asha", "pso")


def _table(stdout: str) -> tuple[list[str], list[list[str]]]:
    """The first markdown table in ``stdout``: header and body rows."""
    lines: list[str] = []
    for line in stdout.splitlines():
        if line.startswith("|"):
            lines.append(line)
        elif lines:
            break
    assert len(lines) >= 2 + len(FOUR), stdout
    return _cells(lines[0]), [_cells(line) for line in lines[2:]]


def _smoke(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``bench/<script>`` run with ``args`` (its ``--smoke`` among them), as a user runs it;
    fails the test with its stderr's end when it fails."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip("|").split("|")]


def _pipe_rows(stdout: str) -> tuple[list[str], list[list[str]]]:
    """The header of the first markdown table in ``stdout`` and every table line after its
    separator."""
    lines = [line for line in stdout.splitlines() if line.startswith("|")]
    return _cells(lines[0]), [_cells(line) for line in lines[2:]]


def _tables(stdout: str) -> list[list[dict[str, str]]]:
    """Each markdown table in ``stdout``, its rows keyed by the header's cells."""
    tables: list[list[str]] = [[]]
    for line in stdout.splitlines():
        if line.startswith("|"):
            tables[-1].append(line)
        elif tables[-1]:
            tables.append([])
    return [
        [dict(zip(_cells(t[0]), _cells(line), strict=True)) for line in t[2:]] for t in tables if t
    ]


@pytest.mark.slow
def test_smoke_run_prints_the_table() -> None:
    proc = _smoke("search_efficiency.py", "--smoke")
    assert "target val_sharpe" in proc.stdout
    header, rows = _table(proc.stdout)
    assert header[0] == "searcher"
    ratio = header.index("ratio to random")
    epochs = header.index("median trial-epochs to target")
    by_label = {row[0]: row for row in rows}
    assert set(FOUR) <= set(by_label), proc.stdout
    for label in FOUR:
        value = float(by_label[label][ratio])  # numeric, not "n/a"
        assert math.isfinite(value) and value > 0, by_label[label]
        assert float(by_label[label][epochs]) > 0
    assert float(by_label["random"][ratio]) == 1.0


@pytest.mark.slow
def test_step_ops_smoke_prints_ops_and_time_ratios() -> None:
    """bench/step_ops.py --smoke: a forecast family and an rl learner (kan, dqn) under f32
    and bf16; the optimizer + guard stays within the 40-op budget and the time ratio
    against the bare fused loop is a positive number."""
    proc = _smoke("step_ops.py", "--smoke")
    header, rows = _pipe_rows(proc.stdout)
    cases = {(row[header.index("family")], row[header.index("precision")]) for row in rows}
    assert cases == {(f, p) for f in ("kan", "dqn") for p in ("f32", "bf16")}, proc.stdout
    for row in rows:
        assert int(row[header.index("fwd+bwd ops")]) > 0
        assert 0 < int(row[header.index("opt+guard ops")]) <= 40, row
        ratio = float(row[header.index("ratio")].removesuffix("x"))
        assert math.isfinite(ratio) and ratio > 0, row


@pytest.mark.slow
def test_step_ops_slots_compares_a_fused_trial_step_with_the_folds_one_by_one() -> None:
    """bench/step_ops.py --slots 1 2 --smoke: kan at K = 1 and 2; fusing two folds runs
    fewer ops than stepping them one after another (a tiny kan step: about 0.54x)."""
    proc = _smoke("step_ops.py", "--slots", "1", "2", "--smoke")
    header, body = _pipe_rows(proc.stdout)
    rows = {int(cells[header.index("K")]): cells for cells in body}
    assert set(rows) == {1, 2}, proc.stdout
    two = rows[2]
    unfused, fused = (int(two[header.index(c)]) for c in ("unfused ops", "fused ops"))
    assert fused < 0.7 * unfused, two
    assert float(two[header.index("ops ratio")]) == pytest.approx(fused / unfused, abs=1e-3)


@pytest.mark.slow
def test_sequential_smoke_prints_the_fixed_and_sequential_designs_side_by_side() -> None:
    """bench/sequential.py --smoke: normal and skewness -1 differences at sd/margin 1, 300
    replications: each row has the fixed design's n, the sequential rule's budget and
    expected configurations (fewer than the fixed n), its power (>= 80%) and error rates."""
    proc = _smoke("sequential.py", "--smoke")
    header, rows = _pipe_rows(proc.stdout)
    assert [row[0].split()[0] for row in rows] == ["normal", "skew-1"], proc.stdout
    for row in rows:
        fixed_n = int(row[header.index("fixed n")].split()[0])
        budget = int(row[header.index("seq budget")])
        expected = float(row[header.index("seq E[n] at 0")])
        assert 9 <= expected < fixed_n <= budget + 2, row
        assert float(row[header.index("seq power")]) >= 0.8
        ratio = float(row[header.index("E[n] / fixed")])
        assert 0.5 < ratio < 1.0, row
        lower, upper = (float(x) for x in row[header.index("seq P(eq) at -m / +m")].split("/"))
        assert 0.0 <= lower <= 0.2 and 0.0 <= upper <= 0.2, row  # 300 replications: loose
        assert float(row[header.index("seq P(w or b) at 0")]) == 0.0


def test_sequential_bench_decides_the_fixed_design_as_equivalence_test_does() -> None:
    """The benchmark's vectorized fixed design (fixed_decisions) is hpo.stats.equivalence_test
    on every sample, so its fixed n and error rates are the verdict's."""
    from hpo.stats import equivalence_test

    bench = load_bench_script("sequential.py", "sequential_bench")
    rng = np.random.default_rng(3)
    codes = {"equivalent": 1, "bf16 worse": 2, "bf16 better": 3, "inconclusive": 0}
    for n in (5, 12, 60):  # exact signed-rank counts, and the normal approximation
        d = rng.normal(rng.uniform(-0.2, 0.2, (80, 1)), 0.1, (80, n))
        d[:20] = bench.draw(rng, "contaminated", (20, n)) * 0.1 - 0.05
        expected = [codes[equivalence_test(row, 0.1).verdict] for row in d]
        assert bench.fixed_decisions(d, 0.1).tolist() == expected
        assert len(set(expected)) >= 2


@pytest.mark.slow
def test_pbt_exploit_smoke_compares_in_memory_with_a_checkpoint_and_writes_nothing() -> None:
    """bench/pbt_exploit.py --smoke: kan in f32 and bf16, one exploit in a group of 4; the
    in-memory exploit writes no byte and no file, the checkpoint path writes the
    checkpoint's five files, and both leave the recipient holding the donor's state (the
    script stops otherwise)."""
    proc = _smoke("pbt_exploit.py", "--smoke")
    (rows,) = _tables(proc.stdout)
    assert [(row["family"], row["precision"], row["exploits"]) for row in rows] == [
        ("kan", "f32", "1"),
        ("kan", "bf16", "1"),
    ], proc.stdout
    for row in rows:
        assert row["bytes written in memory"] == "0" and row["files in memory"] == "0", row
        assert int(row["bytes written checkpoint"]) > 0 and row["files checkpoint"] == "5", row
        write, read, load = (float(x) for x in row["write / read / load ms"].split("/"))
        assert min(write, read, load) > 0 and float(row["checkpoint ms"]) > 0, row
        assert float(row["in memory ms"]) > 0 and float(row["unfuse+fuse alone ms"]) > 0, row
        # The ratio of the unrounded times: within what the printed times' rounding to
        # 0.1 ms allows (2.4 ms may be 2.35-2.45, 2% either way).
        ratio = float(row["ratio"].removesuffix("x"))
        checkpoint, in_memory = float(row["checkpoint ms"]), float(row["in memory ms"])
        low = (checkpoint - 0.05) / (in_memory + 0.05)
        high = (checkpoint + 0.05) / (in_memory - 0.05)
        assert low - 0.01 <= ratio <= high + 0.01, row


@pytest.mark.slow
def test_pbt_search_smoke_prints_pbt_asha_and_random_side_by_side() -> None:
    """bench/pbt_search.py --smoke: 2 seeds of two populations of 2 (each its own shape),
    of populations of 2 stopped by ASHA, and of the members without exploits, on the tiny
    task; the table has a row per method with its runs, equal member-epochs, and medians
    of the best validation Sharpe and the chosen trial's test Sharpe beside ASHA's (no
    outcome asserted)."""
    proc = _smoke("pbt_search.py", "--smoke", "--populations", "2", "--asha-sizes", "2")
    main, lineage = _tables(proc.stdout)
    by_method = {row["method"]: row for row in main}
    assert list(by_method) == [
        "pbt-i1x2",
        "pbt-i1/2+asha",
        "population",
        "random+asha",
        "random",
    ], proc.stdout
    for row in by_method.values():
        assert row["runs"] == "2" and row["median member-epochs"] == "8", row
        float(row["median best val_sharpe"])
        float(row["median test_sharpe of chosen"])
        assert row["minus random+asha [95% CI]"].count("[") == 1, row
    assert by_method["random+asha"]["minus random+asha [95% CI]"].startswith("+0.00"), proc.stdout
    assert [row["population"] for row in lineage] == ["pbt-i1x2", "population"]
    assert "wall" in proc.stdout
