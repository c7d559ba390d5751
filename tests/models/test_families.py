"""Families from outside the repository: named by import reference or by an installed
package's entry point, refused with the reason when they cannot be used, and checked by
the same contract as the ten (trainables/contract.py, ``hpo check-family``)."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import models
from hpo.spec import SpecError, parse_spec
from models import FamilyError, get_family, installed_names
from models.family import Network
from tests.hpo.sweep_helpers import tiny_spec
from trainables.contract import run_checks

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "custom_family"


def _module(tmp_path: Path, name: str, body: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module ``name`` in a folder outside the repository, importable from now on."""
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)  # another test's module of the name
    monkeypatch.setattr(models, "_RESOLVED", {})


DESK = (EXAMPLE / "desk_gru.py").read_text()
# The kan record with its network named elsewhere (models.family.Network).
KAN_WITH_NETWORK = """
import dataclasses
from models.family import Network
from models.kan import FAMILY as KAN
FAMILY = dataclasses.replace(KAN, build=Network({!r}))
"""


def test_a_reference_resolves_to_a_family_outside_the_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _module(tmp_path, "outside_gru", DESK, monkeypatch)
    family = get_family("outside_gru:FAMILY")
    assert family.name == "desk_gru" and family.kind == "forecast"
    assert not str(Path(sys.modules["outside_gru"].__file__ or "")).startswith(str(ROOT))
    assert get_family("outside_gru:FAMILY") is family  # resolved once


@pytest.mark.parametrize(
    ("body", "reference", "message"),
    [
        ("", "no_such_module:FAMILY", "cannot import module 'no_such_module' (ModuleNotFoundError"),
        ("import missing_dependency\n", "broken:FAMILY", "No module named 'missing_dependency'"),
        ("FAMILY = 3\n", "broken:FAMILY", "broken:FAMILY is a int, not a models.base.Family"),
        ("X = 1\n", "broken:FAMILY", "module 'broken' has no attribute 'FAMILY'"),
        (
            DESK.replace('    tiny={"hidden": 8},', "    tiny={'hidden': 8}, contract=99,"),
            "broken:FAMILY",
            "was written for family contract 99; this foxhunt-hpo implements 1",
        ),
        (
            KAN_WITH_NETWORK.format("desk_nowhere_nets:build"),
            "broken:FAMILY",
            "family 'broken:FAMILY': network module 'desk_nowhere_nets' cannot be found",
        ),
        (
            KAN_WITH_NETWORK.format("models.nets.kan:biuld"),
            "broken:FAMILY",
            "/models/nets/kan.py) defines no 'biuld'",
        ),
        (
            KAN_WITH_NETWORK.format("models.nets.kan.build"),
            "broken:FAMILY",
            "network 'models.nets.kan.build' is not 'package.module:ATTR'",
        ),
        (
            DESK.replace(
                'shape_settings=frozenset({"hidden", "layers", "loss"})',
                'shape_settings=frozenset({"width"})',
            ),
            "broken:FAMILY",
            "config DeskGRUConfig does not have: ['width']",
        ),
        (
            DESK.replace(
                'shape_settings=frozenset({"hidden", "layers", "loss"})',
                'shape_settings=frozenset({"hidden", "layers", "loss"}), '
                'per_trial_settings=frozenset({"hidden"})',
            ),
            "broken:FAMILY",
            "['hidden'] are both shape_settings and per_trial_settings",
        ),
    ],
)
def test_a_family_that_cannot_be_used_is_refused_with_the_reason(
    body: str, reference: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if body:
        _module(tmp_path, "broken", body, monkeypatch)
    with pytest.raises(FamilyError) as raised:
        get_family(reference)
    assert message in str(raised.value), str(raised.value)


def test_a_network_reference_is_checked_without_importing_its_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A misspelt ``build`` is refused where the record is read (above, with the module's
    file); a right one resolves, bound however a module binds it, and its module is
    imported by the first build, not before."""
    _module(tmp_path, "desk_nets", "def build(config, shape):\n    return 'built'\n", monkeypatch)
    _module(tmp_path, "broken", KAN_WITH_NETWORK.format("desk_nets:build"), monkeypatch)
    family = get_family("broken:FAMILY")
    assert family.build == Network("desk_nets:build") and "desk_nets" not in sys.modules
    assert family.build(None, None) == "built" and "desk_nets" in sys.modules
    for name in models.family_names():  # and the ten records name their networks rightly
        network = get_family(name).build
        assert isinstance(network, Network) and network.problem() is None


@pytest.mark.parametrize(
    "body",
    [
        "if True:\n    from json import dumps as build\n",
        "(build := len)\n",
        "match 1:\n    case build:\n        pass\n",
        "def _install():\n    global build\n    build = len\n_install()\n",
        "for build in [len]:\n    pass\n",
        "globals()['bu' + 'ild'] = len\n",
        "__getattr__, __dir__ = (lambda name: len), (lambda: ['build'])\n",
    ],
)
def test_a_network_module_binding_its_build_any_way_is_accepted(
    body: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _module(tmp_path, "desk_nets", body, monkeypatch)
    assert Network("desk_nets:build").problem() is None


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("def build(:\n", "(SyntaxError: invalid syntax ("),
        ("x = 1\n", "defines no 'build'"),
    ],
)
def test_a_network_module_that_cannot_be_read_or_lacks_its_build_is_named(
    body: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _module(tmp_path, "desk_nets", body, monkeypatch)
    problem = Network("desk_nets:build").problem() or ""
    assert f"network module 'desk_nets' ({tmp_path / 'desk_nets.py'})" in problem
    assert message in problem, problem


def test_an_installed_package_registers_a_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _module(tmp_path, "desk_models_gru", DESK, monkeypatch)
    entries = [
        importlib.metadata.EntryPoint(
            "desk_gru", "desk_models_gru:FAMILY", models.ENTRY_POINT_GROUP
        ),
        importlib.metadata.EntryPoint("kan", "desk_models_gru:FAMILY", models.ENTRY_POINT_GROUP),
    ]
    monkeypatch.setattr(
        importlib.metadata,
        "entry_points",
        lambda group=None: [e for e in entries if e.group == group],
    )
    assert installed_names() == {"desk_gru": "desk_models_gru:FAMILY"}  # kan stays built in
    assert get_family("desk_gru").name == "desk_gru"
    assert get_family("kan").name == "kan"
    assert "desk_gru" in [f.name for f in models.all_families()]


def test_a_spec_naming_a_family_that_does_not_import_is_refused_before_launch(
    tmp_path: Path,
) -> None:
    payload = tiny_spec(tmp_path).model_dump()
    payload.update(families=["kan", "desk_nowhere:FAMILY"], search_space={})
    with pytest.raises(SpecError) as raised:
        parse_spec(payload, source="spec.toml")
    text = str(raised.value)
    assert (
        "families" in text
        and "families[1]" in text
        and "cannot import module 'desk_nowhere'" in text
    )


def test_check_family_passes_the_example_and_the_same_checks_name_what_breaks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The contract, in process: the example meets it; a family whose positions leave
    [-1, 1] fails the precision check, one whose loss reads the host fails that check, and
    the others still run."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    good = run_checks("desk_gru:FAMILY", precisions=("f32", "bf16"), learning=None)
    assert [(r.name, r.passed) for r in good] == [
        ("record", True), ("precision f32", True), ("precision bf16", True),
        ("host reads", True), ("fusion", True),
    ]  # fmt: skip
    assert good[-1].detail == "2 folds fused"
    wide = DESK.replace(
        "class DeskGRU(RegressionHead[DeskGRUConfig]):",
        "class DeskGRU(RegressionHead[DeskGRUConfig]):\n"
        "    def positions(self, batch):\n"
        "        return 2.0 * super().positions(batch) + 1.5\n",
    )
    _module(tmp_path, "wide_gru", wide, monkeypatch)
    results = {r.name: r for r in run_checks("wide_gru:FAMILY", precisions=("f32",), learning=None)}
    assert not results["precision f32"].passed
    assert "positions outside [-1, 1]" in results["precision f32"].detail
    assert results["host reads"].passed and results["fusion"].passed
    reading = DESK.replace(
        "class DeskGRU(RegressionHead[DeskGRUConfig]):",
        "class DeskGRU(RegressionHead[DeskGRUConfig]):\n"
        "    def loss(self, batch):\n"
        "        value = super().loss(batch)\n"
        "        print(float(value))  # a host read in the step\n"
        "        return value\n",
    )
    _module(tmp_path, "reading_gru", reading, monkeypatch)
    results = {
        r.name: r for r in run_checks("reading_gru:FAMILY", precisions=("f32",), learning=None)
    }
    assert not results["host reads"].passed
    assert results["host reads"].detail == "host read of a tensor in the hot loop"
    assert results["precision f32"].passed


@pytest.mark.slow
def test_hpo_check_family_cli_prints_a_table_and_exits_by_the_verdict(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(EXAMPLE)}
    hpo = [sys.executable, "-m", "hpo.cli", "check-family"]
    good = subprocess.run(
        [*hpo, "desk_gru:FAMILY"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert good.returncode == 0, good.stdout[-3000:] + good.stderr[-3000:]
    assert "desk_gru:FAMILY meets the contract (8/8)" in good.stdout
    assert "ok learning: validation Sharpe" in good.stdout
    missing = subprocess.run(
        [*hpo, "desk_nowhere:FAMILY", "--no-learning"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert missing.returncode == 1
    assert "FAILED record: family 'desk_nowhere:FAMILY': cannot import module" in missing.stdout
    assert "desk_nowhere:FAMILY breaks the contract (0/1)" in missing.stdout
