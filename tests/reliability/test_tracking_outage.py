"""The MLflow tracking server is stopped for 30 s in the middle of a sweep and started
again: the driver buffers what it could not send and, at the end, every epoch's metric
points of every trial are in MLflow, once each."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from cluster.tracking_server import start_tracking_server
from hpo.sweep import run_sweep
from hpo.tracking import TAG_ROLE
from tests.hpo.sweep_helpers import tiny_spec

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(900)]
EPOCHS = 8
OUTAGE_S = 30.0


def test_thirty_second_outage_loses_no_metric_point(ray_session, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "mlflow-store"
    server = start_tracking_server(store, port=0)
    restarted: list = []
    try:
        port = server.port
        spec = tiny_spec(
            tmp_path,
            tracking_uri=server.uri,
            name="outage",
            models=["tft"],
            precisions=["f32"],
            samples=2,
            max_epochs=EPOCHS,
            trainer={"lookback": 16, "batch_size": 32, "max_steps_per_epoch": 15},
            search_space={"tft": {"d_model": 8, "n_heads": 1, "lstm_layers": 1}},
        )
        events: dict[str, float] = {}

        def outage() -> None:
            client = MlflowClient(server.uri)
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:  # wait for the first epoch to reach MLflow
                experiment = client.get_experiment_by_name("outage")
                if experiment is not None:
                    runs = client.search_runs([experiment.experiment_id])
                    if any(
                        r.data.tags.get(TAG_ROLE) == "trial" and "val_sharpe" in r.data.metrics
                        for r in runs
                    ):
                        break
                time.sleep(0.5)
            server.stop()
            events["down"] = time.monotonic()
            time.sleep(OUTAGE_S)
            restarted.append(start_tracking_server(store, port=port))
            events["up"] = time.monotonic()

        controller = threading.Thread(target=outage, daemon=True)
        controller.start()
        rows = run_sweep(spec)
        controller.join(timeout=400)
    finally:
        server.stop()
        for other in restarted:
            other.stop()
    assert "down" in events and "up" in events
    assert len(rows) == 2 and all(r.status == "TERMINATED" and r.epochs == EPOCHS for r in rows)

    with start_tracking_server(store, port=0) as final:
        client = MlflowClient(final.uri)
        experiment = client.get_experiment_by_name("outage")
        children = [
            r
            for r in client.search_runs([experiment.experiment_id])
            if r.data.tags.get(TAG_ROLE) == "trial"
        ]
        assert len(children) == 2
        for run in children:
            assert run.info.status == "FINISHED"
            for key in ("val_sharpe", "train_loss", "test_sharpe"):
                steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
                assert sorted(steps) == list(range(1, EPOCHS + 1)), (key, steps)
