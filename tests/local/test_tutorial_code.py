"""`trainjob run` with a user's own code written as in TensorFlow's tutorials: a package found
through the container's own PYTHONPATH (kept locally as in its Pod) that calls an unchanged
`tfds.load("mnist")` (no data_dir: TFDS_DATA_DIR points every replica at the offline data, which
is prepared for any entrypoint, not only the bundled samples)."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from .conftest import command_replica, finish_run, job_manifest, read_events, start_run, write_job

pytestmark = pytest.mark.training

RUN_TIMEOUT = 240

USER_CODE = """
import tensorflow as tf
import tensorflow_datasets as tfds
from trainjob import runtime


def build(ctx):
    def state_fn():
        model = tf.keras.Sequential(
            [tf.keras.Input((28, 28, 1)), tf.keras.layers.Flatten(), tf.keras.layers.Dense(10)]
        )
        return {"model": model, "optimizer": tf.keras.optimizers.SGD(0.1)}

    def dataset_fn(input_context):
        ds = tfds.load("mnist", split="train[:256]", as_supervised=True)  # as in the tutorials
        return ds.map(lambda x, y: (tf.cast(x, tf.float32) / 255.0, y)).repeat().batch(32)

    loss_object = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def step_fn(state, batch):
        x, y = batch
        with tf.GradientTape() as tape:
            loss = loss_object(y, state["model"](x, training=True))
        grads = tape.gradient(loss, state["model"].trainable_variables)
        state["optimizer"].apply_gradients(zip(grads, state["model"].trainable_variables))
        return {"loss": loss}

    return runtime.LoopTrainSpec(
        state_fn=state_fn, dataset_fn=dataset_fn, step_fn=step_fn, steps_per_epoch=3
    )
"""


def _finish(run: subprocess.Popen[bytes], log: Path) -> tuple[int, str]:
    return finish_run(run, log, RUN_TIMEOUT)


def test_user_package_on_the_template_pythonpath_loads_tfds_mnist_unchanged(
    tmp_path: Path,
) -> None:
    package = tmp_path / "user_code" / "tutorial_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text(textwrap.dedent(USER_CODE))
    container = {
        "name": "tensorflow",
        "image": "user-image",
        "env": [{"name": "PYTHONPATH", "value": str(tmp_path / "user_code")}],
    }
    manifest = job_manifest(
        "tutorial",
        {"worker": {"replicas": 1, "template": {"spec": {"containers": [container]}}}},
        image="user-image",
        runtime={"entrypoint": "tutorial_pkg.train:build"},
    )
    write_job(tmp_path / "job.yaml", manifest)
    data_dir = tmp_path / "tfds"  # empty: prepared because the job has a runtime entrypoint
    log = tmp_path / "out.log"
    args = ["-f", "job.yaml", "--run-dir", "run", "--data-dir", str(data_dir), "--quiet"]
    code, out = _finish(start_run(args, tmp_path, log), log)
    assert code == 0, out + (tmp_path / "run" / "logs" / "worker-0.log").read_text()
    assert (data_dir / "mnist" / "3.0.1" / "dataset_info.json").is_file()
    ends = [e for e in read_events(tmp_path / "run") if e["event"] == "end"]
    assert ends and ends[-1]["status"] == "succeeded" and ends[-1]["step"] == 3, ends


def test_every_replica_gets_the_template_pythonpath_first_and_tfds_data_dir(
    tmp_path: Path,
) -> None:
    code = (
        "import os, trainjob; "
        "print('PP=' + os.environ['PYTHONPATH']); print('TFDS=' + os.environ['TFDS_DATA_DIR'])"
    )
    replica = command_replica(code)
    replica["template"]["spec"]["containers"][0]["env"] = [
        {"name": "PYTHONPATH", "value": "/opt/user-code"}
    ]
    write_job(tmp_path / "job.yaml", job_manifest("env-check", {"worker": replica}))
    log = tmp_path / "out.log"
    args = ["-f", "job.yaml", "--run-dir", "run", "--data-dir", "/srv/tfds", "--quiet"]
    exit_code, out = _finish(start_run(args, tmp_path, log), log)
    assert exit_code == 0, out
    lines = (tmp_path / "run" / "logs" / "worker-0.log").read_text().splitlines()
    (python_path,) = [line.removeprefix("PP=") for line in lines if line.startswith("PP=")]
    assert python_path.split(os.pathsep)[0] == "/opt/user-code", python_path
    assert "TFDS=/srv/tfds" in lines
