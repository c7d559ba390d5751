"""The Grafana dashboard for a sweep's Ray metrics: valid JSON that Grafana can import,
panels whose PromQL names Ray's exported metrics, and a $node variable every per-node
panel is filtered by."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

DASHBOARD = Path(__file__).resolve().parents[2] / "dashboards" / "grafana" / "ray-sweep.json"
# Ray's Prometheus names (reporter_agent.py gauges, core metrics): what the panels chart.
REQUIRED_METRICS = {
    "ray_actors",  # trials: Tune's trial actors by state (Tune exports no trial counts)
    "ray_tasks",  # running trials per node: the trial actors' running train() tasks
    "ray_node_gram_used",
    "ray_node_gpus_utilization",
    "ray_node_cpu_utilization",
}


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # collapsed rows keep theirs inside
    return out


def _exprs(panel: dict[str, Any]) -> list[str]:
    return [t["expr"] for t in panel.get("targets", [])]


def test_the_dashboard_is_importable(dashboard: dict[str, Any]) -> None:
    assert dashboard["title"] and dashboard["uid"] and dashboard["schemaVersion"] >= 30
    panels = _panels(dashboard)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]


def test_panels_chart_rays_gpu_cpu_and_trial_metrics(dashboard: dict[str, Any]) -> None:
    exprs = [e for p in _panels(dashboard) for e in _exprs(p)]
    used = {m for e in exprs for m in re.findall(r"\b(ray_[a-z_]+)\{", e)}
    assert used >= REQUIRED_METRICS, REQUIRED_METRICS - used
    titles = {p["title"]: p for p in _panels(dashboard)}
    assert any("ray_actors" in e and 'State="ALIVE"' in e for e in _exprs(titles["Trials running"]))
    gram = titles["GPU memory used per node and GPU"]
    # ray_node_gram_used is exported in MiB: the bytes panel must scale it.
    assert gram["fieldConfig"]["defaults"]["unit"] == "bytes"
    assert all("* 1024 * 1024" in e for e in _exprs(gram))
    util = titles["GPU utilization per node and GPU"]
    assert "ray_node_gpus_utilization" in _exprs(util)[0]
    assert "GpuIndex" in _exprs(util)[0]


def test_node_variable_filters_every_per_node_panel(dashboard: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    node = variables["node"]
    assert node["type"] == "query" and node["multi"] and node["includeAll"]
    assert "ray_node_cpu_utilization" in node["query"]["query"]
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["trainable"]["query"] == "ImplicitFunc"
    for panel in _panels(dashboard):
        for expr in _exprs(panel):
            if re.search(r"ray_(node_|tasks|resources)", expr):
                assert 'instance=~"$node"' in expr, (panel["title"], expr)
            assert 'SessionName=~"$session"' in expr, (panel["title"], expr)


@pytest.mark.parametrize("pair", ["()", "{}", '""'])
def test_promql_is_balanced(dashboard: dict[str, Any], pair: str) -> None:
    for panel in _panels(dashboard):
        for expr in _exprs(panel):
            if pair == '""':
                assert expr.count('"') % 2 == 0, expr
            else:
                depth = 0
                for char in expr:
                    depth += (char == pair[0]) - (char == pair[1])
                    assert depth >= 0, expr
                assert depth == 0, expr
