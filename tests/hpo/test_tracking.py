"""The MLflow tracking callback without Ray: child runs, epochs logged once, buffered
retries while the store is away, rejected writes dropped and counted, no secrets in params."""

from __future__ import annotations

import sqlite3
import threading
from types import SimpleNamespace
from typing import Any

import pytest
import requests
from mlflow.exceptions import MlflowException, RestException
from mlflow.protos.databricks_pb2 import TEMPORARILY_UNAVAILABLE
from mlflow.tracking import MlflowClient

from hpo.tracking import MlflowSweepCallback, start_sweep_run, trial_params


def _trial(trial_id: str, **params: Any) -> SimpleNamespace:
    config = {
        "family": "tft",
        "precision": "bf16",
        "seed": 0,
        "pair_id": "tft-c000-s0",
        "config_id": "tft-c000",
        "params": {"lr": 1e-3, **params},
        "base": {},
    }
    return SimpleNamespace(trial_id=trial_id, config=config, last_result={}, error_file=None)


BF16_SEED_0 = "tags.precision = 'bf16' and tags.seed = '0'"


def _precision_seed(run: Any) -> str:
    """A trial run's ``precision/seed`` from its tags."""
    return f"{run.data.tags['precision']}/{run.data.tags['seed']}"


def _setup(uri: str) -> tuple[MlflowSweepCallback, MlflowClient, str]:
    client = MlflowClient(uri)
    parent = start_sweep_run(
        client, "track", {"name": "track", "api_token": "s3cr3t"}, compare=False
    )
    return MlflowSweepCallback(uri, "track", parent), client, parent


def test_epochs_logged_once_and_run_reused_after_restart(mlflow_uri: str) -> None:
    callback, client, parent = _setup(mlflow_uri)
    trial = _trial("t1")
    callback.on_trial_start(0, [], trial)
    for epoch in (1, 2):
        callback.on_trial_result(
            0, [], trial, {"epoch": epoch, "val_sharpe": 0.5 * epoch, "train_loss": 1.0}
        )
    assert callback.flush()
    # A new driver after a crash: fresh callback, the same trial re-reports epoch 2 then 3.
    again = MlflowSweepCallback(callback.tracking_uri, "track", parent)
    for epoch in (2, 3):
        again.on_trial_result(
            0, [], trial, {"epoch": epoch, "val_sharpe": 0.5 * epoch, "train_loss": 1.0}
        )
    trial.last_result = {"epoch": 3}
    again.on_trial_complete(0, [], trial)
    assert again.flush()
    runs = client.search_runs([callback.experiment_id], filter_string="tags.trial_id = 't1'")
    assert len(runs) == 1
    run_id = runs[0].info.run_id
    assert runs[0].data.tags["mlflow.parentRunId"] == parent
    assert [m.step for m in client.get_metric_history(run_id, "val_sharpe")] == [1, 2, 3]
    assert client.get_run(run_id).info.status == "FINISHED"


def test_nothing_lost_while_the_store_is_away(mlflow_uri: str) -> None:
    """The store is unreachable from before the trial starts: its run, params, three
    epochs and its closing all wait in order and land once the store is back."""
    callback, client, _ = _setup(mlflow_uri)
    outage = {"on": True}
    for name in (
        "create_run",
        "log_batch",
        "set_terminated",
        "search_runs",
        "get_experiment_by_name",
    ):
        real = getattr(callback.client, name)

        def flaky(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
            if outage["on"]:
                raise ConnectionError("tracking server down")
            return _real(*args, **kwargs)

        setattr(callback.client, name, flaky)
    trial = _trial("t2")
    callback.on_trial_start(0, [], trial)
    for epoch in (1, 2, 3):
        callback.on_trial_result(0, [], trial, {"epoch": epoch, "val_sharpe": float(epoch)})
    trial.last_result = {"epoch": 3}
    callback.on_trial_complete(0, [], trial)
    assert len(callback.outbox.pending) == 5 and "t2" not in callback.run_ids
    outage["on"] = False
    callback.on_experiment_end([])
    assert not callback.outbox.pending
    run_id = callback.run_ids["t2"]
    assert [m.step for m in client.get_metric_history(run_id, "val_sharpe")] == [1, 2, 3]
    assert client.get_run(run_id).info.status == "FINISHED"
    assert client.get_run(run_id).data.params["lr"] == "0.001"


def test_a_slow_store_does_not_hold_up_tune(mlflow_uri: str) -> None:
    """Tune's hooks return while the store is still busy with the call they queued."""
    callback, client, _ = _setup(mlflow_uri)
    trial = _trial("t4")
    callback.on_trial_start(0, [], trial)
    assert callback.flush()
    gate = threading.Event()
    real = callback.client.log_batch

    def slow(*args: Any, **kwargs: Any) -> Any:
        gate.wait(60)
        return real(*args, **kwargs)

    callback.client.log_batch = slow  # type: ignore[method-assign]
    callback.on_trial_result(0, [], trial, {"epoch": 1, "val_sharpe": 0.25})
    # Returned with the call still waiting on the gate (a synchronous hook would have
    # returned only after the gate's 60 s, with nothing left pending).
    assert not gate.is_set() and len(callback.outbox.pending) == 1
    gate.set()
    assert callback.flush()
    history = client.get_metric_history(callback.run_ids["t4"], "val_sharpe")
    assert [(m.step, m.value) for m in history] == [(1, 0.25)]


def test_a_resumed_sweep_deletes_runs_of_trials_it_never_recorded(mlflow_uri: str) -> None:
    callback, client, parent = _setup(mlflow_uri)
    kept, orphan = _trial("t5"), _trial("t6")
    for trial in (kept, orphan):
        callback.on_trial_start(0, [], trial)
    assert callback.flush()
    # The resumed driver's first step: Tune restored only t5 (t6 started after the last
    # experiment snapshot, and its configuration will run again as a new trial).
    resumed = MlflowSweepCallback(mlflow_uri, "track", parent)
    resumed.on_step_begin(0, [kept])
    resumed.on_step_begin(1, [kept, _trial("t7")])  # later steps: new trials are left alone
    assert resumed.flush()
    children = client.search_runs(
        [callback.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent}'"
    )
    assert [r.data.tags["trial_id"] for r in children] == ["t5"]
    assert client.get_run(callback.run_ids["t6"]).info.lifecycle_stage == "deleted"


def test_no_credentials_in_params(mlflow_uri: str) -> None:
    params = trial_params(
        _trial("t3", auth_token="abc", aws_secret_access_key="k", hidden=8).config
    )
    assert "hidden" in params and "lr" in params
    assert not any("token" in k or "secret" in k for k in params)
    _, client, parent = _setup(mlflow_uri)
    assert "api_token" not in client.get_run(parent).data.params


def _rejected(code: str = "INVALID_PARAMETER_VALUE") -> RestException:
    """What an MLflow server answers a call it refuses (HTTP 4xx with an error code)."""
    return RestException({"error_code": code, "message": "Got invalid value nan for metric"})


def test_a_rejected_write_is_dropped_and_counted_and_later_writes_land(mlflow_uri: str) -> None:
    callback, client, parent = _setup(mlflow_uri)
    trial = _trial("t8")
    callback.on_trial_start(0, [], trial)
    assert callback.flush()
    real = callback.client.log_batch

    def rejecting(run_id: str, metrics: Any = (), params: Any = (), tags: Any = ()) -> Any:
        if any(m.key == "val_sharpe" and m.step == 2 for m in metrics):
            raise _rejected()
        return real(run_id, metrics=metrics, params=params, tags=tags)

    callback.client.log_batch = rejecting  # type: ignore[method-assign]
    for epoch in (1, 2, 3):
        callback.on_trial_result(0, [], trial, {"epoch": epoch, "val_sharpe": float(epoch)})
    trial.last_result = {"epoch": 3}
    callback.on_trial_complete(0, [], trial)
    # Before: the rejected epoch-2 call was retried forever and held back epoch 3 and the
    # trial's closing, so this flush timed out.
    assert callback.flush(timeout_s=20)
    run_id = callback.run_ids["t8"]
    assert [m.step for m in client.get_metric_history(run_id, "val_sharpe")] == [1, 3]
    assert client.get_run(run_id).info.status == "FINISHED"
    parent_run = client.get_run(parent)
    assert parent_run.data.metrics["hpo.dropped_writes"] == 1.0
    assert parent_run.data.tags["hpo.last_dropped_write"].startswith("metrics of t8 epoch 2:")


def test_the_outbox_retries_transient_failures_in_order_and_drops_rejections() -> None:
    from hpo.tracking import _Outbox

    sent: list[str] = []
    transient = {
        "b": [
            requests.ConnectionError("connection refused"),
            MlflowException("database is locked", error_code=TEMPORARILY_UNAVAILABLE),
        ]
    }

    def call(name: str) -> Any:
        def run() -> None:
            if transient.get(name):
                raise transient[name].pop(0)
            if name == "a":
                raise _rejected("RESOURCE_DOES_NOT_EXIST")
            sent.append(name)

        return run

    reported: list[str] = []
    outbox = _Outbox(on_drop=lambda what, exc: reported.append(what))
    for name in "abc":
        outbox.send(name, call(name))
    assert outbox.flush(timeout_s=20)
    outbox.close()
    assert sent == ["b", "c"]  # b after its two retries, c only after b
    assert reported == ["a"] and [what for what, _ in outbox.dropped] == ["a"]


def test_a_stores_internal_error_gets_a_few_retries_then_is_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # MLflow's SQL store raises INTERNAL_ERROR for any exception it does not classify,
    # deterministic ones included: retried forever, one such call blocked every later one.
    import hpo.tracking as tracking

    monkeypatch.setattr(tracking, "INTERNAL_ERROR_RETRIES", 2)
    tries: list[str] = []

    def broken() -> None:
        tries.append("a")
        try:
            raise ValueError("cannot serialize this value")
        except ValueError as exc:
            raise MlflowException(str(exc), error_code="INTERNAL_ERROR") from exc

    sent: list[str] = []
    outbox = tracking._Outbox(max_backoff_s=0.01)
    outbox.send("a", broken)
    outbox.send("b", lambda: sent.append("b"))
    assert outbox.flush(timeout_s=20)
    outbox.close()
    assert len(tries) == 3 and sent == ["b"]  # 1 try + 2 retries, then b goes through
    assert [what for what, _ in outbox.dropped] == ["a"]
    # A connection failure MLflow wraps as INTERNAL_ERROR keeps its unlimited retries.
    assert tracking.retry_limit(_raised_from(requests.ConnectionError("refused"))) is None
    assert tracking.retry_limit(_rejected("INTERNAL_ERROR")) is None  # a server's 500
    assert tracking.retry_limit(_rejected("INVALID_PARAMETER_VALUE")) == 0


def _raised_from(cause: BaseException) -> MlflowException:
    """MLflow's REST client wraps a requests failure into a plain MlflowException."""
    try:
        try:
            raise cause
        except Exception as exc:
            raise MlflowException(f"API request failed with exception {exc}") from exc
    except MlflowException as wrapped:
        return wrapped


@pytest.mark.parametrize(
    ("exc", "retry"),
    [
        (requests.ConnectionError("refused"), True),
        (requests.Timeout("read timed out"), True),
        (ConnectionResetError("reset by peer"), True),
        (_raised_from(requests.ConnectionError("refused")), True),
        (MlflowException("locked", error_code=TEMPORARILY_UNAVAILABLE), True),
        (_rejected("INTERNAL_ERROR"), True),
        (_rejected("REQUEST_LIMIT_EXCEEDED"), True),
        (sqlite3.OperationalError("database is locked"), True),
        (_rejected("INVALID_PARAMETER_VALUE"), False),
        (_rejected("RESOURCE_DOES_NOT_EXIST"), False),
        (_rejected("BAD_REQUEST"), False),
        (_rejected("NOT_IMPLEMENTED"), False),
        (sqlite3.OperationalError("no such column: x"), False),
        (KeyError("t9"), False),
    ],
)
def test_which_failures_are_retried(exc: BaseException, retry: bool) -> None:
    from hpo.tracking import may_succeed_later

    assert may_succeed_later(exc) is retry


def test_the_sweep_experiment_opens_as_model_training_in_mlflow_3(mlflow_uri: str) -> None:
    _, client, parent = _setup(mlflow_uri)
    experiment = client.get_experiment(client.get_run(parent).info.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    # An experiment made before (or by hand) without the tag gets it; a kind set is kept.
    older = client.create_experiment("older")
    chosen = client.create_experiment("chosen", tags={"mlflow.experimentKind": "finetuning"})
    for name in ("older", "chosen"):
        start_sweep_run(client, name, {"name": name}, compare=False)
    assert client.get_experiment(older).tags["mlflow.experimentKind"] == "custom_model_development"
    assert client.get_experiment(chosen).tags["mlflow.experimentKind"] == "finetuning"


def test_ending_runs_prints_no_view_run_links(
    mlflow_uri: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """MLflow prints the "View run / View experiment" pair from ``_log_url`` when a run
    ends on a tracking server (a RestStore); the sweep's tracking turns that off."""
    flag = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"
    monkeypatch.setenv(flag, "false")
    monkeypatch.delenv(flag)  # absent, as in a user's shell; restored after the test
    _setup(mlflow_uri)
    server = MlflowClient("http://127.0.0.1:9")  # a RestStore; nothing listens there
    # Silenced, _log_url returns before it fetches the run it would print (which would
    # fail here): no request, no output.
    server._tracking_client._log_url("0" * 32)
    assert capsys.readouterr().out == ""


def test_an_oom_retry_continues_its_trials_run(mlflow_uri: str) -> None:
    """The retry (a new trial id, the same configuration, precision and seed, a floor)
    continues the run
    the OOM closed, even from a driver that restarted in between (found by its tags)."""
    callback, client, parent = _setup(mlflow_uri)
    first = _trial("t9")
    callback.on_trial_start(0, [], first)
    callback.on_trial_result(0, [], first, {"epoch": 1, "val_sharpe": 0.2})
    first.last_result = {"epoch": 2, "oom": 1, "oom_retry_gpu_fraction": 0.3,
                         "failure_reason": "CUDA out of memory"}  # fmt: skip
    callback.on_trial_result(0, [], first, first.last_result)
    callback.on_trial_complete(0, [], first)
    assert callback.flush()
    for driver in ("same", "restarted"):
        runner = callback if driver == "same" else MlflowSweepCallback(mlflow_uri, "track", parent)
        retry = _trial(f"t1-{driver}")  # ids are not chronological: t1 < t9
        retry.config.update(gpu_fraction_floor=0.3)
        runner.on_trial_start(0, [], retry)
        for epoch in (1, 2):
            runner.on_trial_result(0, [], retry, {"epoch": epoch, "val_sharpe": 0.5 * epoch})
        retry.last_result = {"epoch": 2, "val_sharpe": 1.0}
        runner.on_trial_complete(0, [], retry)
        assert runner.flush()
    (run,) = client.search_runs([callback.experiment_id], filter_string=BF16_SEED_0)
    tags = run.data.tags
    assert run.info.status == "FINISHED" and tags["trial_status"] == "completed"
    assert tags["trial_id"] == "t1-restarted" and tags["hpo.oom_attempts"] == "t9,t1-same"
    assert "failure_reason" not in tags
    assert (run.data.metrics["val_sharpe"], run.data.metrics["oom"]) == (1.0, 0.0)
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "val_sharpe")]
    assert sorted(steps) == [1, 1, 1, 2, 2]


def test_a_resumed_oom_retry_logs_its_own_epochs_past_those_of_the_attempt_before(
    mlflow_uri: str,
) -> None:
    """The OOM attempt logged epochs 1-3 into the trial's run; its retry logged epoch 1
    and the driver stopped. After the restart the retry re-reports epochs 2 and 3 from its
    checkpoint: they are the retry's and must land, not be taken for points already
    logged (the attempt's epochs 2 and 3 are someone else's)."""
    callback, client, parent = _setup(mlflow_uri)
    attempt = _trial("t9")
    callback.on_trial_start(0, [], attempt)
    for epoch in (1, 2, 3):
        callback.on_trial_result(0, [], attempt, {"epoch": epoch, "val_sharpe": -1.0})
    attempt.last_result = {"epoch": 4, "oom": 1, "oom_retry_gpu_fraction": 0.3}
    callback.on_trial_result(0, [], attempt, attempt.last_result)
    callback.on_trial_complete(0, [], attempt)
    retry = _trial("t1")
    retry.config.update(gpu_fraction_floor=0.3)
    callback.on_trial_start(0, [], retry)
    callback.on_trial_result(0, [], retry, {"epoch": 1, "val_sharpe": 1.0})
    assert callback.flush()
    state = callback.get_state()  # what Tune saved with the sweep

    resumed = MlflowSweepCallback(mlflow_uri, "track", parent)
    resumed.set_state(state)
    resumed.on_trial_start(0, [], retry)
    for epoch in (2, 3):
        resumed.on_trial_result(0, [], retry, {"epoch": epoch, "val_sharpe": float(epoch)})
    retry.last_result = {"epoch": 3, "val_sharpe": 3.0}
    resumed.on_trial_complete(0, [], retry)
    assert resumed.flush()
    (run,) = client.search_runs([callback.experiment_id], filter_string=BF16_SEED_0)
    assert run.data.metrics["val_sharpe"] == 3.0
    history = client.get_metric_history(run.info.run_id, "val_sharpe")
    retry_points = sorted((m.step, m.value) for m in history if m.value >= 0)
    assert retry_points == [(1, 1.0), (2, 2.0), (3, 3.0)]


def test_a_group_oom_fails_its_trials_runs_and_their_retry_continues_them(
    mlflow_uri: str,
) -> None:
    """A group trial runs out of memory: each of its trials still training logs the OOM
    and its run closes as an OOM (not as completed); the trial that had ended keeps its
    finished run. The retry group's trials (new Tune trial, floors) continue the runs: one
    run per trial in all."""
    from trainables.config import GROUP_KEY

    callback, client, _ = _setup(mlflow_uri)

    def trial(seed: int, floor: float = 0.0) -> dict[str, Any]:
        config = _trial("m").config
        config.update(seed=seed, pair_id=f"tft-c000-s{seed}")
        if floor:
            config["gpu_fraction_floor"] = floor
        return config

    def group(trial_id: str, configs: list[dict[str, Any]]) -> SimpleNamespace:
        config = {"family": "tft", "precision": "bf16", "config_id": "tft-c000", GROUP_KEY: configs}
        return SimpleNamespace(trial_id=trial_id, config=config, last_result={}, error_file=None)

    first = group("t9", [trial(0), trial(1), trial(2)])
    callback.on_trial_start(0, [], first)
    entries = {s: {"epoch": 1, "val_sharpe": 0.1} for s in ("bf16-s0", "bf16-s1", "bf16-s2")}
    entries["bf16-s1"]["stopped"] = 1
    callback.on_trial_result(0, [], first, {"epoch": 1, "trials": entries})
    oom = {"epoch": 2, "oom": 1, "oom_retry_gpu_fraction": 0.4, "failure_reason": "CUDA OOM"}
    first.last_result = {**oom, "trials": {**entries, "bf16-s0": oom, "bf16-s2": oom}}
    callback.on_trial_result(0, [], first, first.last_result)
    callback.on_trial_complete(0, [], first)
    assert callback.flush()
    runs = {
        _precision_seed(r): r
        for r in client.search_runs([callback.experiment_id])
        if r.data.tags.get("seed")  # not the sweep's parent run
    }
    assert {m: (r.info.status, r.data.tags["trial_status"]) for m, r in runs.items()} == {
        "bf16/0": ("FAILED", "oom"),
        "bf16/1": ("FINISHED", "completed"),
        "bf16/2": ("FAILED", "oom"),
    }
    assert runs["bf16/0"].data.metrics["oom"] == 1.0

    retry = group("t1", [trial(0, 0.4), trial(2, 0.4)])
    callback.on_trial_start(0, [], retry)
    done = {s: {"epoch": 2, "val_sharpe": 0.9} for s in ("bf16-s0", "bf16-s2")}
    callback.on_trial_result(0, [], retry, {"epoch": 2, "trials": done})
    retry.last_result = {"epoch": 2, "trials": done}
    callback.on_trial_complete(0, [], retry)
    assert callback.flush()
    after = [r for r in client.search_runs([callback.experiment_id]) if r.data.tags.get("seed")]
    assert len(after) == 3  # no run of its own for a retried trial
    by_trial = {_precision_seed(r): r for r in after}
    for name in ("bf16/0", "bf16/2"):
        run = by_trial[name]
        assert (run.info.status, run.data.metrics["val_sharpe"]) == ("FINISHED", 0.9)
        assert run.data.tags["hpo.oom_attempts"] == f"t9-bf16-s{name[-1]}"
        assert run.data.tags["hpo.group_id"] == "t1"  # the group trial the retry ran in
    assert by_trial["bf16/1"].data.tags["hpo.group_id"] == "t9"


def test_checkpoint_returns_are_verified_against_their_listed_checksum(tmp_path: Any) -> None:
    import hashlib
    import json

    from pyarrow import fs

    from hpo.tracking import checkpoint_returns
    from trainables.checkpoint_files import CKPT_SUBDIR, META_FILE
    from trainables.returns_file import RETURNS_FILE

    state = tmp_path / CKPT_SUBDIR
    state.mkdir()
    text = "split,fold,timestamp,return\n"
    (state / RETURNS_FILE).write_text(text)
    checkpoint = SimpleNamespace(filesystem=fs.LocalFileSystem(), path=str(tmp_path))

    def listed(checksums: dict[str, str]) -> None:
        (state / META_FILE).write_text(json.dumps({"checksums": checksums}))

    listed({RETURNS_FILE: hashlib.sha256(text.encode()).hexdigest()})
    assert checkpoint_returns(checkpoint) == text
    listed({RETURNS_FILE: "0" * 64})
    with pytest.raises(ValueError, match="checksum mismatch"):
        checkpoint_returns(checkpoint)
    listed({})  # every file a checkpoint holds is listed: an unlisted one is not trusted
    with pytest.raises(ValueError, match=r"returns\.csv: not listed in meta\.json's checksums"):
        checkpoint_returns(checkpoint)


def test_only_a_restored_trial_searches_for_its_run(mlflow_uri: str) -> None:
    """A trial this driver created never had a run: its run is created without a search
    over the sweep's runs (which costs in proportion to them). A trial Tune restored with
    the sweep finds its run again."""

    def spy(callback: MlflowSweepCallback) -> list[str]:
        filters: list[str] = []
        real = callback.client.search_runs

        def search_runs(*args: Any, **kwargs: Any) -> Any:
            filters.append(str(kwargs.get("filter_string", "")))
            return real(*args, **kwargs)

        callback.client.search_runs = search_runs  # type: ignore[method-assign]
        return filters

    callback, client, parent = _setup(mlflow_uri)
    searched = spy(callback)
    callback.on_step_begin(0, [])  # a new sweep: Tune restored no trial
    for name in ("n0", "n1", "n2"):
        callback.on_trial_start(0, [], _trial(name))
    assert callback.flush()
    assert searched == [] and sorted(callback.run_ids) == ["n0", "n1", "n2"]

    resumed = MlflowSweepCallback(mlflow_uri, "track", parent)  # its state was lost
    searched = spy(resumed)
    restored = _trial("n0")
    resumed.on_step_begin(0, [restored])
    resumed.on_trial_start(0, [], restored)
    resumed.on_trial_start(0, [], _trial("n3"))  # created by the resumed driver
    assert resumed.flush()
    assert resumed.run_ids["n0"] == callback.run_ids["n0"]
    assert [f for f in searched if "trial_id" in f] == [
        f"tags.trial_id = 'n0' and tags.`mlflow.parentRunId` = '{parent}'"
    ]
    # The parent, n0 and n3 (n1 and n2, not restored, were deleted as orphans).
    assert len(client.search_runs([callback.experiment_id])) == 3


def test_a_population_logs_settings_per_epoch_and_each_trials_lineage(
    mlflow_uri: str, tmp_path: Any
) -> None:
    """A population's group trial reports each trial's settings and lineage: the settings
    are metrics of their own name per epoch, and each trial's run holds pbt_lineage.json
    (replaced as it grows), naming its donors by trial id."""
    import json

    from trainables.config import GROUP_KEY

    callback, client, _ = _setup(mlflow_uri)

    def trial(seed: int) -> dict[str, Any]:
        config = _trial("m").config
        config.update(seed=seed, pair_id=f"tft-c000-s{seed}")
        return config

    config = {"family": "tft", "precision": "bf16", "config_id": "tft-c000"}
    group = SimpleNamespace(
        trial_id="t9", config={**config, GROUP_KEY: [trial(0), trial(1)]}, last_result={}
    )
    callback.on_trial_start(0, [], group)
    exploit = {
        "epoch": 1,
        "donor": "bf16-s0",
        "donor_key": "tft-c000|bf16/0",
        "before": {"lr": 1e-3},
        "after": {"lr": 1.2e-3},
    }
    for epoch, lr, lineage in ((1, 1e-3, []), (2, 1.2e-3, [exploit])):
        entries = {
            "bf16-s0": {"epoch": epoch, "val_sharpe": 1.0, "lr": 2e-3, "pbt_lineage": []},
            "bf16-s1": {"epoch": epoch, "val_sharpe": 0.5, "lr": lr, "pbt_lineage": lineage},
        }
        callback.on_trial_result(0, [], group, {"epoch": epoch, "trials": entries})
    assert callback.flush() and callback.experiment_id is not None
    runs = {
        _precision_seed(r): r
        for r in client.search_runs([callback.experiment_id])
        if r.data.tags.get("seed")  # not the sweep's parent run
    }
    history = client.get_metric_history(runs["bf16/1"].info.run_id, "lr")
    assert [(m.step, m.value) for m in history] == [(1, 1e-3), (2, 1.2e-3)]

    def lineage_of(name: str) -> Any:
        path = client.download_artifacts(runs[name].info.run_id, "pbt_lineage.json", tmp_path)
        return json.loads(open(path).read())

    assert lineage_of("bf16/0") == {"trial_id": "t9-bf16-s0", "exploits": []}
    assert lineage_of("bf16/1") == {
        "trial_id": "t9-bf16-s1",
        "exploits": [
            {
                "epoch": 1,
                "donor_trial_id": "t9-bf16-s0",
                "donor_key": "tft-c000|bf16/0",
                "before": {"lr": 1e-3},
                "after": {"lr": 1.2e-3},
            }
        ],
    }
