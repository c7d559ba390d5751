"""Property-based tests of the sweep spec loader (issue 8, "Bad input").

Promise: any payload or file either loads into a ``SweepSpec`` whose invariants hold, or
fails with one ``SpecError`` whose every problem names the field (a dotted path that starts
at a key of the input or a spec field) or, for a file that cannot be parsed at all, the
file itself. No other exception type escapes, and the ``hpo sweep`` command given an
invalid spec exits 2 before anything starts: no results folder, no MLflow database, no Ray.

The number of inputs each property tried is counted in ``TRIED`` and printed at the end of
the module (``pytest -s``); docs/reliability.md quotes those counts.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import sys
import tempfile
import tomllib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, assume, event, example, given, note, settings
from hypothesis import strategies as st

from hpo.spec import NAME_PATTERN, NOT_IN_TRAINER, SpecError, SweepSpec, load_spec, parse_spec
from models import family_names, get_family
from trainables.config import TRAIN_KEYS
from trainables.precision import POLICY_NAMES

TRIED: Counter[str] = Counter()
SETTINGS = settings(
    deadline=None,
    derandomize=True,  # the same inputs in every CI run; a failure reproduces as is
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

FAMILIES = tuple(family_names())
TRAINER_KEYS = sorted(
    TRAIN_KEYS - NOT_IN_TRAINER - {"n_folds", "val_fraction", "test_fraction", "purge", "embargo"}
)
SECTIONS = ("data", "walk_forward", "resources", "trainer", "search_space")
FIELDS = tuple(SweepSpec.model_fields)
# Problems about a file that could not be read or parsed: they name the file (SpecError.source).
FILE_LEVEL = ("file not found", "cannot read as UTF-8 text", "not valid ", "the top level must be")


@pytest.fixture(scope="module", autouse=True)
def _report_counts() -> Iterator[None]:
    yield
    print(f"\nspec properties, inputs tried: {dict(sorted(TRIED.items()))}")


# -- strategies --------------------------------------------------------------------------
# Values that have broken validators before: non-finite floats, integers beyond float and
# int64, paths the OS refuses ("~user" with no such user, a 600-character name, NUL).
EDGE_NUMBERS = st.sampled_from(
    [math.nan, math.inf, -math.inf, 10**400, -(10**400), 2**63, 2**64, -1, 0, 1e308, -0.0]
)
EDGE_TEXT = st.sampled_from(["", " ", "~nouser_zz/x", "a" * 600, "a\x00b", "ok\n", "synthetic"])


def _huge_or_odd_numbers() -> st.SearchStrategy[Any]:
    return st.one_of(
        EDGE_NUMBERS,
        st.integers(),
        st.integers(min_value=2**63 - 2, max_value=2**63 + 2),
        st.floats(),  # NaN, +-inf, subnormals, -0.0
    )


SCALARS = st.one_of(
    EDGE_NUMBERS,
    EDGE_TEXT,
    st.none(),
    st.booleans(),
    _huge_or_odd_numbers(),
    st.text(max_size=12),  # any unicode but lone surrogates
    st.sampled_from(["measured", "tft", "f32", "fifo", "asha"]),
)
JUNK: st.SearchStrategy[Any] = st.one_of(
    SCALARS,
    st.recursive(
        SCALARS,
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
        ),
        max_leaves=6,
    ),
)
KEYS = st.text(min_size=1, max_size=8) | st.sampled_from([*FIELDS, "low", "high", "choices", "log"])


def _override(model: str) -> st.SearchStrategy[dict[str, Any]]:
    """A search_space table for ``model``: real or made-up keys, any shape of value."""
    family = get_family(model)
    keys = (
        st.sampled_from(sorted({*family.config_fields(), *TRAINER_KEYS, "lr", "data.n_bars"}))
        | KEYS
    )
    number = _huge_or_odd_numbers()
    value = st.one_of(
        JUNK,
        st.fixed_dictionaries({"low": number, "high": number}, optional={"log": JUNK}),
        st.fixed_dictionaries({"choices": st.lists(JUNK, max_size=3) | JUNK}),
        st.dictionaries(
            st.sampled_from(["low", "high", "log", "choices", "step"]), JUNK, max_size=4
        ),
    )
    return st.dictionaries(keys, value, max_size=3)


@st.composite
def valid_payloads(draw: st.DrawFn) -> dict[str, Any]:
    families = draw(st.lists(st.sampled_from(FAMILIES), min_size=1, max_size=3, unique=True))
    compare = draw(st.booleans())
    precisions = draw(
        st.lists(
            st.sampled_from(POLICY_NAMES), min_size=2 if compare else 1, max_size=3, unique=True
        )
    )
    max_epochs = draw(st.integers(1, 6))
    payload: dict[str, Any] = {
        "name": draw(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,10}", fullmatch=True)),
        "families": families,
        "precisions": precisions,
        "samples": draw(st.integers(1, 8)),
        "search": draw(st.sampled_from(["tpe", "random", "pso"])),
        "scheduler": "fifo" if compare else draw(st.sampled_from(["asha", "fifo"])),
        "max_epochs": max_epochs,
        "grace_epochs": draw(st.integers(1, max_epochs)),
        "seeds": draw(st.lists(st.integers(0, 99), min_size=1, max_size=3)),
        "compare": compare,
        "data": {"source": "synthetic", "n_assets": draw(st.integers(1, 8)), "n_bars": 400},
        "walk_forward": {"n_folds": draw(st.integers(1, 3)), "val_fraction": 0.2},
        "trainer": {"lookback": draw(st.integers(2, 32))},
        "resources": {"cpu": 1.0, "gpu": draw(st.sampled_from([0, 0.25, 1, "measured"]))},
    }
    if draw(st.booleans()):
        family = draw(st.sampled_from(families))
        payload["search_space"] = {
            family: {"dropout" if family == "tft" else "lr": {"low": 1e-4, "high": 0.1}}
        }
    return payload


@st.composite
def mutated_payloads(draw: st.DrawFn, at_least: int = 1) -> dict[str, Any]:
    """A valid payload with 1-4 mutations: wrong types, out-of-range numbers, unknown keys
    at every level, deleted keys, nested junk, duplicate families, random search spaces."""
    payload = draw(valid_payloads())
    # mostly one mutation, so the checks behind the first failing one run too
    for _ in range(draw(st.sampled_from([at_least, 1, 1, 1, 2, 3, 4]))):
        kind = draw(
            st.sampled_from(
                # hypothesis favours early entries: the ones that reach the deeper checks first
                [
                    "range_override",
                    "data_source",
                    "set_nested",
                    "search_space",
                    "unknown_key",
                    "set_top",
                    "dup_model",
                    "replace_section",
                    "delete",
                ]
            )
        )
        note(f"mutation {kind}")
        if kind == "set_top":
            payload[draw(st.sampled_from(FIELDS))] = draw(JUNK)
        elif kind == "set_nested":
            section = draw(st.sampled_from(SECTIONS[:3]))
            target = payload.setdefault(section, {})
            if isinstance(target, dict):
                key = draw(
                    st.sampled_from(sorted(SweepSpec.model_fields[section].annotation.model_fields))
                )
                target[key] = draw(JUNK)
        elif kind == "unknown_key":
            where = draw(st.sampled_from([None, *SECTIONS]))
            target = payload if where is None else payload.setdefault(where, {})
            if isinstance(target, dict):
                target[draw(KEYS)] = draw(JUNK)
        elif kind == "delete" and payload:
            payload.pop(draw(st.sampled_from(sorted(payload))))
        elif (
            kind == "dup_model"
            and isinstance(payload.get("families"), list)
            and payload["families"]
        ):
            payload["families"] = [*payload["families"], draw(st.sampled_from(payload["families"]))]
        elif kind == "search_space":
            model = draw(st.sampled_from(FAMILIES) | st.text(max_size=6))
            override = draw(_override(model if model in FAMILIES else "tft"))
            payload["search_space"] = {model: override}
        elif kind == "replace_section":
            payload[draw(st.sampled_from(SECTIONS))] = draw(JUNK)
        elif kind == "data_source" and isinstance(payload.get("data"), dict):
            payload["data"]["source"] = draw(EDGE_TEXT | st.text(max_size=20))
        elif kind == "range_override" and isinstance(payload.get("families"), list):
            # a real searchable setting of a model of this sweep, with odd bounds
            model = draw(
                st.sampled_from([m for m in payload["families"] if m in FAMILIES] or ["tft"])
            )
            key = draw(st.sampled_from(sorted(get_family(model).search_space) or ["lr"]))
            bound = EDGE_NUMBERS | st.floats()
            table = draw(
                st.fixed_dictionaries({"low": bound, "high": bound}, optional={"log": JUNK})
            )
            payload["search_space"] = {model: {key: table}}
    return payload


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)  # beyond int64 is invalid TOML, which is part of the test
    if isinstance(value, float):
        return (
            "nan"
            if math.isnan(value)
            else ("inf" if value > 0 else "-inf")
            if math.isinf(value)
            else repr(value)
        )
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    return "null"  # TOML has no null: an invalid document, also part of the test


def _toml_key(key: Any) -> str:
    key = str(key)
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key, ensure_ascii=False)


def to_toml(payload: dict[str, Any]) -> str:
    return "".join(f"{_toml_key(k)} = {_toml_value(v)}\n" for k, v in payload.items())


@st.composite
def spec_files(draw: st.DrawFn) -> tuple[str, bytes]:
    """(suffix, bytes): arbitrary text, arbitrary bytes, or a serialized mutated payload,
    optionally damaged by inserting/deleting characters or adding a BOM."""
    suffix = draw(st.sampled_from([".toml", ".yaml", ".yml", ""]))
    source = draw(st.sampled_from(["text", "bytes", "structured", "structured", "structured"]))
    note(f"file kind {source}{suffix}")
    if source == "bytes":
        return suffix, draw(st.binary(max_size=200))
    if source == "text":
        text = draw(
            st.text(max_size=120)
            | st.text(alphabet="[]{}=:-\"'#.,\n abc123", max_size=80)
            | st.sampled_from(
                [
                    "[" * 1000,
                    "- " * 2000,
                    "a = " + "[" * 1000,
                    "&a [*a]",
                    "!!python/object:os.system x",
                ]
            )
        )
    else:
        payload = draw(mutated_payloads(at_least=0))
        text = (
            to_toml(payload)
            if suffix in (".toml", "")
            else yaml.safe_dump(payload, allow_unicode=True)
        )
        if draw(st.booleans()):
            pos = draw(st.integers(0, len(text)))
            text = text[:pos] + draw(st.text(max_size=4)) + text[pos + draw(st.integers(0, 3)) :]
    if draw(st.booleans()):
        text = "\ufeff" + text
    encoding = draw(st.sampled_from(["utf-8", "utf-8", "utf-16", "latin-1"]))
    return suffix, text.encode(encoding, errors="replace")


# -- the property's checks ---------------------------------------------------------------
def _resolves(payload: Any, path: str) -> bool:
    """Whether the problem's location starts at a key of ``payload`` or a spec field."""
    heads = [str(k) for k in payload] if isinstance(payload, dict) else []
    return any(path == h or path.startswith((f"{h}.", f"{h}:", f"{h} ")) for h in [*heads, *FIELDS])


def check_problems(error: SpecError, payload: Any) -> None:
    assert error.problems, "a SpecError must list at least one problem"
    for problem in error.problems:
        assert isinstance(problem, str) and problem
        if problem.startswith(FILE_LEVEL) or problem == "(top level): nested too deeply":
            continue  # the whole file is at fault; SpecError.source names it
        if problem.startswith("(top level)"):
            # a cross-field rule: it must name the fields it relates
            assert any(f in problem for f in FIELDS), problem
            continue
        assert _resolves(payload, problem), f"problem does not name a field: {problem!r}"


def check_spec(spec: SweepSpec) -> None:
    """Invariants of an accepted spec (what the sweep relies on)."""
    assert NAME_PATTERN.fullmatch(spec.name)
    assert spec.families and len(set(spec.families)) == len(spec.families)
    assert set(spec.families) <= set(FAMILIES)
    assert set(spec.precisions) <= set(POLICY_NAMES) and len(set(spec.precisions)) == len(
        spec.precisions
    )
    assert 1 <= spec.grace_epochs <= spec.max_epochs
    assert set(spec.search_space) <= set(spec.families)
    assert not spec.compare or (spec.scheduler == "fifo" and len(spec.precisions) >= 2)
    for value in (
        spec.resources.cpu,
        spec.resources.headroom,
        spec.data.signal,
        spec.walk_forward.val_fraction,
    ):
        assert math.isfinite(value)
    gpu = spec.resources.gpu
    assert gpu == "measured" or (math.isfinite(gpu) and gpu >= 0)
    assert spec.n_trials >= 1


def _outcome(kind: str, call: Any, payload: Any) -> SweepSpec | None:
    TRIED[kind] += 1
    try:
        spec = call()
    except SpecError as exc:
        event(f"{kind}: SpecError")
        check_problems(exc, payload)
        return None
    # Any other exception type propagates and fails the test with its traceback.
    event(f"{kind}: loaded")
    check_spec(spec)
    return spec


# -- properties --------------------------------------------------------------------------
VALID = {"name": "ok", "families": ["tft"]}


@settings(SETTINGS, max_examples=150)
@given(payload=mutated_payloads())
# Inputs that escaped as other exception types (or passed) before the fixes, pinned:
@example(payload={**VALID, "resources": {"gpu": math.inf}})  # OverflowError
@example(payload={**VALID, "resources": {"gpu": math.nan}})  # accepted
@example(payload={**VALID, "resources": {"cpu": math.inf}})  # accepted
@example(payload={**VALID, "name": "ok\n"})  # accepted
@example(payload={**VALID, "data": {"source": "~nouser_zz/x.csv"}})  # RuntimeError
@example(payload={**VALID, "data": {"source": "a" * 600}})  # OSError ENAMETOOLONG
@example(payload={**VALID, "search_space": {"tft": {"dropout": {"low": 10**400, "high": 1.0}}}})
def test_parse_spec_loads_or_names_the_field(payload: dict[str, Any]) -> None:
    _outcome(
        "parse_spec(mutated payload)", lambda: parse_spec(payload, "<prop>", Path.cwd()), payload
    )


@settings(SETTINGS, max_examples=100)
@given(payload=st.dictionaries(st.sampled_from(FIELDS) | KEYS, JUNK, max_size=8))
def test_parse_spec_on_arbitrary_tables(payload: dict[str, Any]) -> None:
    _outcome(
        "parse_spec(arbitrary table)", lambda: parse_spec(payload, "<prop>", Path.cwd()), payload
    )


@settings(SETTINGS, max_examples=120)
@given(
    file=spec_files(), overrides=st.fixed_dictionaries({}, optional={"name": JUNK, "compare": JUNK})
)
@example(file=(".toml", b"\xff\xfe\x00bad"), overrides={})  # UnicodeDecodeError
@example(file=(".yaml", b"[" * 1000), overrides={})  # RecursionError
@example(file=(".yaml", b"name: ok\nfamilies: [tft]\nresources: {gpu: .inf}\n"), overrides={})
def test_load_spec_file_loads_or_names_the_field(
    file: tuple[str, bytes], overrides: dict[str, Any]
) -> None:
    suffix, data = file
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"spec{suffix}"
        path.write_bytes(data)
        payload: Any = None
        with contextlib.suppress(Exception):  # what the loader should see, for the path check
            text = data.decode("utf-8")
            payload = yaml.safe_load(text) if suffix in (".yaml", ".yml") else tomllib.loads(text)
            if isinstance(payload, dict):
                payload.update({k: v for k, v in overrides.items() if v is not None})
        note(f"file bytes: {data[:300]!r}")
        _outcome("load_spec(file)", lambda: load_spec(path, overrides), payload)


def test_load_spec_file_errors_name_the_file(tmp_path: Path) -> None:
    """Errors about the whole file carry its path (checked once, outside hypothesis)."""
    for name, data in [("a.toml", b"\xff\xfe\x00"), ("b.yaml", b"- 1"), ("c.toml", b"x = ")]:
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(SpecError) as info:
            load_spec(path)
        assert info.value.source == str(path) and str(path) in str(info.value)
    with pytest.raises(SpecError, match="file not found"):
        load_spec(tmp_path / "missing.toml")


# -- the CLI: an invalid spec starts nothing ---------------------------------------------
@settings(SETTINGS, max_examples=6)
@given(payload=mutated_payloads(), as_yaml=st.booleans())
def test_sweep_cli_on_invalid_spec_exits_2_and_starts_nothing(
    payload: dict[str, Any], as_yaml: bool
) -> None:
    import ray

    import cluster.connect
    import hpo.sweep
    from hpo import cli

    payload.pop("storage", None)  # defaults: ./hpo-results and sqlite:///mlflow.db, in the tmp cwd
    payload.pop("tracking_uri", None)
    started: list[str] = []

    def refuse(what: str) -> Any:
        def spy(*args: Any, **kwargs: Any) -> Any:
            started.append(what)
            raise AssertionError(f"{what} called for an invalid spec")

        return spy

    ray_was_up = ray.is_initialized()
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp)
        spec = Path(tmp) / ("spec.yaml" if as_yaml else "spec.toml")
        spec.write_text(
            yaml.safe_dump(payload, allow_unicode=True) if as_yaml else to_toml(payload),
            encoding="utf-8",
        )
        try:
            load_spec(spec)
            valid = True
        except SpecError:
            valid = False
        assume(not valid)
        TRIED["hpo sweep CLI (invalid spec)"] += 1
        mp.setattr(ray, "init", refuse("ray.init"))
        mp.setattr(cluster.connect, "ensure_ray", refuse("ensure_ray"))
        mp.setattr(hpo.sweep, "run_sweep", refuse("run_sweep"))
        mp.setattr(sys, "argv", ["hpo", "sweep", str(spec)])
        stderr = io.StringIO()
        with (
            contextlib.redirect_stderr(stderr),
            contextlib.redirect_stdout(io.StringIO()),
            pytest.raises(SystemExit) as info,
        ):
            cli.run()
        assert info.value.code == 2, stderr.getvalue()
        assert "invalid sweep spec" in stderr.getvalue()
        assert started == []
        assert sorted(os.listdir(tmp)) == [spec.name], "the failed sweep left files behind"
    assert ray.is_initialized() == ray_was_up


def test_sweep_cli_error_text_is_not_read_as_markup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpo import cli

    spec = tmp_path / "spec.toml"
    spec.write_text('name = "ok"\nfamilies = ["tft"]\n"[/x]" = 1\n', encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["hpo", "sweep", str(spec)])
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), pytest.raises(SystemExit) as info:
        cli.run()
    assert info.value.code == 2 and "[/x]" in stderr.getvalue()
