"""The GPU example as the operator sees it: Kueue's podSets and the gang's minResources count
the workers' GPUs, and the chief and ps ask for none (pure: no cluster, no GPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from trainjob.core import constants, render, spec, tfconfig
from trainjob_operator import config, gang
from trainjob_operator import kueue_workload as kw

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mnist-gpu-parameter-server.yaml"


def _job() -> spec.TrainJob:
    raw: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    raw["metadata"]["namespace"] = "team-a"
    return spec.parse(raw)


def test_kueue_podsets_carry_the_workers_gpus_and_none_for_chief_and_ps() -> None:
    job = _job()
    options = render.RenderOptions(namespace="team-a")
    owner = render.Owner(name=job.name, uid="uid-1")
    workload = kw.build_workload(job, "team-a", owner, options, kw.Priority(None, None))
    gpus = {
        podset["name"]: (
            podset["count"],
            podset["template"]["spec"]["containers"][0]
            .get("resources", {})
            .get("limits", {})
            .get(constants.GPU_RESOURCE),
        )
        for podset in workload["spec"]["podSets"]
    }
    assert gpus == {"chief": (1, None), "ps": (1, None), "worker": (2, 1)}
    images = {
        p["name"]: p["template"]["spec"]["containers"][0]["image"]
        for p in workload["spec"]["podSets"]
    }
    # Only the GPU workers pull the (heavier) CUDA image.
    assert images == {
        "chief": "trainjob/trainjob:0.1.0",
        "ps": "trainjob/trainjob:0.1.0",
        "worker": "trainjob/trainjob:0.1.0-gpu",
    }


def test_the_gang_needs_the_two_worker_gpus() -> None:
    job = _job()
    settings = config.Settings(gang_scheduler=config.GANG_SCHEDULER_PLUGINS)
    resources = gang.min_resources(job, gang.render_options(job, settings, "team-a"), {})
    assert resources[constants.GPU_RESOURCE] == "2"


def test_a_chief_without_gpus_keeps_ring_all_reduce() -> None:
    # The coordinator asks for no GPU: "every chief/worker has one" is false, nothing rendered.
    assert tfconfig.worker_gpus(_job()) == 0
