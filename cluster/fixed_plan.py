"""The plan of a sweep without measured shares (a fixed GPU number per trial, or none):
text only, no profiling and no torch, so the driver of such a sweep never imports the
profiler (:mod:`cluster.packing_plan` plans measured shares)."""

from __future__ import annotations

import math


def render_fixed_plan(gpu: float | str, cpu: float, group_size: int = 1) -> str:
    """The plan of a sweep without measured shares: a fixed GPU number per trial, no GPUs
    asked, or ``"measured"`` on a cluster without GPU nodes (the packer needs one). With
    ``group_size`` > 1 a Tune trial is a group of up to that many trials (one fused
    model in the trial's share), and the plan counts the trials too."""
    if gpu == "measured":
        return (
            "GPU packing plan: resources.gpu = 'measured', but the cluster has no GPU nodes: "
            "nothing to profile or pack (add GPU nodes, or set resources.gpu = 0 to train on CPUs)"
        )
    share = float(gpu)
    groups = (
        f"; group trials of up to {group_size} trials (fused, one share each)"
        if group_size > 1
        else ""
    )
    if share <= 0:
        return (
            f"GPU packing plan: no GPUs asked (resources.gpu = 0): each trial takes {cpu:g} "
            f"CPU(s){groups}"
        )
    if share < 1:
        trials = math.floor(1 / share + 1e-9)
        per_gpu = f"{trials} trials per GPU"
        if group_size > 1:
            per_gpu = f"{trials} group trials per GPU, up to {trials * group_size} trials"
    else:
        per_gpu = "whole GPUs"
    return (
        f"GPU packing plan: a fixed resources.gpu = {share:g} per trial ({per_gpu}, "
        f"{cpu:g} CPU(s) each{groups}; not measured: set resources.gpu = 'measured' to size "
        "shares from each trial's VRAM)"
    )
