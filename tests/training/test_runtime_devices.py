"""The devices a real replica reports, and its fail-fast when given GPUs it cannot see (CPU
machine: ``CUDA_VISIBLE_DEVICES=0`` with no GPU and no driver stands for a GPU Pod whose
TensorFlow finds none); progress counts steps under ``steps_per_execution``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import training_harness as harness

from trainjob.core import constants, termination
from trainjob.core import progress_events as progress

pytestmark = [pytest.mark.training, pytest.mark.timeout(180)]

CONFIG = {"nan_at_step": 0, "epochs": 1, "steps_per_epoch": 2, "progress_every_steps": 1}


def _train(
    tmp: Path, config: dict[str, Any], **env_extra: str
) -> tuple[int, list[dict[str, Any]], str, str]:
    message = tmp / "termination-log"
    message.write_text("")
    env = harness.replica_env(
        {},
        "worker",
        0,
        entrypoint="trainjob.samples.diverge:build",
        config=config,
        checkpoint_dir=tmp / "ckpt",
        progress_file=tmp / "progress.jsonl",
    )
    env[constants.ENV_TERMINATION_MESSAGE_PATH] = str(message)
    env.update(env_extra)
    result = subprocess.run(
        [sys.executable, *constants.DEFAULT_RUNTIME_COMMAND[1:]],
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    events = [e for e in map(progress.parse_line, result.stdout.splitlines()) if e]
    return result.returncode, events, result.stderr, message.read_text()


def _build_info() -> dict[str, Any]:
    code = "import tensorflow as tf, json; print(json.dumps(dict(tf.sysconfig.get_build_info())))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=harness.base_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    import json

    info: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return info


def test_the_start_event_says_the_replica_trains_on_its_cpu(tmp_path: Path) -> None:
    code, events, err, _ = _train(tmp_path, CONFIG)  # CUDA_VISIBLE_DEVICES="" (no GPU given)
    assert code == 0, err
    start = next(e for e in events if e["event"] == "start")
    devices = start["devices"]
    assert devices["gpus"] == 0 and devices["names"] == [], start
    assert devices["cuda_build"] is _build_info().get("is_cuda_build", False), start


def test_a_replica_given_a_gpu_it_cannot_see_fails_fast_naming_the_library(
    tmp_path: Path,
) -> None:
    code, events, err, message = _train(tmp_path, CONFIG, CUDA_VISIBLE_DEVICES="0")
    assert code == 4, err  # Unsupported: permanent, the same node fails the same way
    assert not [e for e in events if e["event"] in ("start", "step")], events
    cause = termination.read(message).cause
    assert cause is not None, message
    assert "CUDA_VISIBLE_DEVICES=0 gives this replica GPUs but TensorFlow" in cause, cause
    if _build_info().get("is_cuda_build"):
        # No driver on this machine: the first library TF would need is the driver's.
        assert "libcuda.so.1" in cause, cause
    else:
        assert "not a CUDA build" in cause, cause


def test_allow_cpu_fallback_trains_on_and_says_so(tmp_path: Path) -> None:
    config = dict(CONFIG, allow_cpu_fallback=True)
    code, events, err, _ = _train(tmp_path, config, CUDA_VISIBLE_DEVICES="0")
    assert code == 0, err
    assert "Training on the CPU (allow_cpu_fallback)" in err, err
    start = next(e for e in events if e["event"] == "start")
    assert start["devices"]["gpus"] == 0, start


def test_progress_counts_steps_under_steps_per_execution(tmp_path: Path) -> None:
    config = dict(
        CONFIG, epochs=2, steps_per_epoch=6, steps_per_execution=2, progress_every_steps=3
    )
    code, events, err, _ = _train(tmp_path, config)
    assert code == 0, err
    # Hooks run at steps 2, 4, 6, 8, 10, 12: a report each time a multiple of 3 was passed
    # (counting executions would report at steps 6 and 12 only).
    assert [e["step"] for e in events if e["event"] == "step"] == [4, 6, 10, 12], events
    assert events[-1]["event"] == "end" and events[-1]["step"] == 12, events
