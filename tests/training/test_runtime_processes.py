"""Exit codes and progress lines of real ``trainjob train`` processes, one per failure kind
(single replica, no TF_CONFIG), plus the offline tfds data and pure settings decisions."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import training_harness as harness

from trainjob.core import constants, termination
from trainjob.core import progress_events as progress
from trainjob.runtime import exitcodes, settings
from trainjob.runtime.exitcodes import FailureKind

pytestmark = [pytest.mark.training, pytest.mark.timeout(180)]

FAST = {"epochs": 1, "steps_per_epoch": 5, "model": "mlp", "batch_size": 32}


def _run(
    tmp: Path, env_extra: dict[str, str], timeout: float = 120
) -> tuple[int, list[dict[str, Any]], str]:
    env = harness.replica_env(
        {},
        "worker",
        0,
        entrypoint="trainjob.samples.mnist:build",
        config=FAST,
        checkpoint_dir=tmp / "ckpt",
        progress_file=tmp / "progress.jsonl",
    )
    env.update(env_extra)
    result = subprocess.run(
        # Exactly what rendered pods run: `python -m trainjob train`.
        [sys.executable, *constants.DEFAULT_RUNTIME_COMMAND[1:]],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    lines = [progress.parse_line(line) for line in result.stdout.splitlines()]
    return result.returncode, [e for e in lines if e], result.stdout + result.stderr


def _code(kind: FailureKind) -> int:
    return exitcodes.exit_code(kind)


def test_invalid_config_exits_2(tmp_path: Path) -> None:
    code, _, out = _run(tmp_path, {constants.ENV_CONFIG: "[1, 2]"})
    assert code == _code(FailureKind.INVALID_CONFIG), out
    assert "must be a JSON object" in out


def test_bad_entrypoint_exits_3(tmp_path: Path) -> None:
    code, events, out = _run(tmp_path, {constants.ENV_ENTRYPOINT: "no_such_pkg.train:build"})
    assert code == _code(FailureKind.INVALID_ENTRYPOINT), out
    assert events[-1]["event"] == "end" and events[-1]["status"] == "InvalidEntrypoint"


def test_exception_in_user_code_exits_1(tmp_path: Path, mnist_data_dir: Path) -> None:
    # A model that cannot take the data: Keras raises inside fit (a user bug, permanent).
    config = dict(FAST, data_dir=str(mnist_data_dir), batch_size=0)
    code, _, out = _run(tmp_path, {constants.ENV_CONFIG: json.dumps(config)})
    assert code == _code(FailureKind.USER_CODE_ERROR), out


def test_estimator_on_current_tf_exits_4(tmp_path: Path) -> None:
    code, _, out = _run(
        tmp_path,
        {
            constants.ENV_FRAMEWORK: "Estimator",
            constants.ENV_ENTRYPOINT: "trainjob.samples.mnist_estimator:build",
        },
    )
    assert code == _code(FailureKind.UNSUPPORTED), out
    assert "trainjob-legacy" in out


def test_single_replica_trains_exports_and_reports(tmp_path: Path, mnist_data_dir: Path) -> None:
    config = dict(FAST, data_dir=str(mnist_data_dir), epochs=2, progress_every_steps=5)
    code, events, out = _run(tmp_path, {constants.ENV_CONFIG: json.dumps(config)})
    assert code == 0, out
    kinds = [e["event"] for e in events]
    assert kinds == ["start", "step", "epoch", "checkpoint", "step", "epoch", "checkpoint", "end"]
    assert events[-1]["export"] == str(tmp_path / "ckpt" / "export")
    assert events[-1]["step"] == 10 and isinstance(events[-1]["loss"], float)
    # The progress file (local mode) carries the same events as stdout.
    assert harness.read_events(tmp_path / "progress.jsonl") == events


def test_sigterm_mid_training_saves_backup_and_exits_143(
    tmp_path: Path, mnist_data_dir: Path
) -> None:
    config = dict(
        FAST,
        data_dir=str(mnist_data_dir),
        epochs=50,
        steps_per_epoch=20,
        progress_every_steps=5,
        step_delay_ms=20,
    )
    prog = tmp_path / "progress.jsonl"
    env = harness.replica_env(
        {},
        "worker",
        0,
        entrypoint="trainjob.samples.mnist:build",
        config=config,
        checkpoint_dir=tmp_path / "ckpt",
        progress_file=prog,
    )
    replica = harness.start("worker-0", env, tmp_path)
    try:
        harness.wait_until(
            lambda: [
                e for e in harness.read_events(prog) if e["event"] == "step" and e["epoch"] >= 1
            ],
            120,
            "a step of epoch 1",
            [replica],
        )
        replica.signal(signal.SIGTERM)
        codes = harness.wait_exit([replica], 30)
    finally:
        harness.stop_all([replica])
    assert codes["worker-0"] == 143, replica.log
    events = harness.read_events(prog)
    assert [e for e in events if e["event"] == "checkpoint" and e.get("reason") == "preempted"]
    assert events[-1]["event"] == "end" and events[-1]["status"] == "Preempted"
    assert list((tmp_path / "ckpt" / "backup").glob("**/checkpoint"))


def test_prepared_mnist_loads_offline_and_shards_per_worker(mnist_data_dir: Path) -> None:
    script = (
        "import json, sys, tensorflow as tf, tensorflow_datasets as tfds\n"
        "from trainjob.runtime import data\n"
        "d = sys.argv[1]\n"
        "full = tfds.load('mnist', split='train', data_dir=d, as_supervised=True)\n"
        "ctx = [tf.distribute.InputContext(2, i, 1) for i in range(2)]\n"
        "shards = [data.load_sharded('mnist', data_dir=d, input_context=c) for c in ctx]\n"
        "n = [sum(1 for _ in s) for s in shards]\n"
        "labels = sorted(int(y) for s in shards for _, y in s)\n"
        "test = sum(1 for _ in tfds.load('mnist', split='test', data_dir=d))\n"
        "print('RESULT', json.dumps([sum(1 for _ in full), n, len(set(labels)), test]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(mnist_data_dir)],
        env=harness.base_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("RESULT ")]
    total, shard_sizes, classes, test = json.loads(line.split(" ", 1)[1])
    # 5,000 real digits: 4,280 train / 720 test (MNIST's 6:1), all 10 classes, disjoint shards.
    assert (total, test, classes) == (4280, 720, 10)
    assert shard_sizes == [2140, 2140]


@pytest.mark.parametrize(
    ("cluster", "gpus", "expected"),
    [
        ({}, 0, settings.DEFAULT),
        ({}, 1, settings.ONE_DEVICE),
        ({}, 4, settings.MIRRORED),
        ({"worker": ("a:1", "b:1")}, 0, settings.MULTI_WORKER_MIRRORED),
        ({"chief": ("a:1",), "worker": ("b:1",), "ps": ("c:1",)}, 0, settings.PARAMETER_SERVER),
    ],
)
def test_auto_strategy(cluster: dict[str, tuple[str, ...]], gpus: int, expected: str) -> None:
    assert (
        settings.resolve_strategy(settings.AUTO, cluster, num_gpus=gpus, has_tpu=False) == expected
    )
    assert (
        settings.resolve_strategy(settings.AUTO, cluster, num_gpus=gpus, has_tpu=True)
        == settings.TPU
    )


def test_finite_dataset_without_steps_per_epoch_and_examples_per_sec_from_the_data(
    tmp_path: Path, mnist_data_dir: Path
) -> None:
    """A tutorial-style dataset (720 test digits in batches of 16, not config.batch_size) and no
    steps_per_epoch, under MirroredStrategy, where tf-keras wants a step count."""
    env = {
        constants.ENV_ENTRYPOINT: "tutorial_entrypoints:finite_test_split",
        constants.ENV_STRATEGY: "Mirrored",
        constants.ENV_CONFIG: json.dumps(
            {"data_dir": str(mnist_data_dir), "progress_every_steps": 1}
        ),
        "PYTHONPATH": f"{harness.REPO_ROOT}:{Path(__file__).parent}",
    }
    code, events, out = _run(tmp_path, env)
    assert code == 0, out
    epochs = [e for e in events if e["event"] == "epoch"]
    assert [e["step"] for e in epochs] == [45, 90]  # one pass of 720 / 16 per epoch
    # The rate times the second epoch's duration is about the 720 examples it read, not
    # 45 x 64 = 2,880. Its duration is measured inside the epoch, from its first step's event
    # to its end: the gap between two epoch events also holds the first epoch's callbacks
    # (its checkpoint), which on a loaded machine took twice the epoch itself (2,130 then).
    first_step = min(e["time"] for e in events if e["event"] == "step" and 45 < e["step"] <= 90)
    duration = epochs[1]["time"] - first_step
    assert 250 < epochs[1]["examples_per_sec"] * duration < 1100, epochs


def test_a_slice_beyond_the_offline_mnist_fails_with_its_size(
    tmp_path: Path, mnist_data_dir: Path
) -> None:
    env = {
        constants.ENV_ENTRYPOINT: "tutorial_entrypoints:tutorial_slice",
        constants.ENV_CONFIG: json.dumps({"data_dir": str(mnist_data_dir)}),
        "PYTHONPATH": f"{harness.REPO_ROOT}:{Path(__file__).parent}",
    }
    code, _, out = _run(tmp_path, env)
    assert code == _code(FailureKind.USER_CODE_ERROR), out
    assert "incompatible with 4280 examples" in out
    assert "has train 4,280, test 720 examples, not 60,000 / 10,000" in out


def test_an_unbatched_dataset_of_scalars_counts_one_example_per_element(tmp_path: Path) -> None:
    """TensorFlow's ParameterServer sample (`Dataset.range(1, 6)` summed into a Variable):
    counting examples by `tf.shape(x)[0]` failed on its scalars; each is one example."""
    env = {
        constants.ENV_ENTRYPOINT: "tutorial_entrypoints:scalar_sum_loop",
        constants.ENV_CONFIG: json.dumps({"epochs": 1}),
        "PYTHONPATH": f"{harness.REPO_ROOT}:{Path(__file__).parent}",
    }
    code, events, out = _run(tmp_path, env)
    assert code == 0, out
    epochs = [e for e in events if e["event"] == "epoch"]
    assert len(epochs) == 1 and epochs[0]["step"] == 5, events
    assert epochs[0]["metrics"]["total"] == 15.0  # 1 + 2 + 3 + 4 + 5, one per step
    assert epochs[0]["examples_per_sec"] > 0


def test_a_failed_replica_writes_its_exception_line_to_its_termination_message(
    tmp_path: Path,
) -> None:
    """What the kubelet keeps after the Pod (and its log) is gone: the job's status quotes it."""
    message = tmp_path / "termination-log"
    message.write_text("")
    env = {
        constants.ENV_ENTRYPOINT: "tutorial_entrypoints:learning_rate_check",
        constants.ENV_TERMINATION_MESSAGE_PATH: str(message),
        "PYTHONPATH": f"{harness.REPO_ROOT}:{Path(__file__).parent}",
    }
    code, _, out = _run(tmp_path, env)
    assert code == _code(FailureKind.USER_CODE_ERROR), out
    text = message.read_text()
    assert termination.read(text).cause == "ValueError: learning rate must be > 0", text
    # The chief's final progress report stays beside it for the operator's progress status.
    report = termination.read(text).report
    assert report is not None and report.state == "Failed", text


def test_the_runtimes_callbacks_cost_nothing_in_the_batches_keras_times(
    tmp_path: Path, mnist_data_dir: Path
) -> None:
    """tf-keras times the batch hooks of the first batches and, when they took longer than the
    batches, warns "Callback method `on_train_batch_end` is slow compared to the batch time
    ... Check your callbacks". The runtime's TensorBoard callback wrote the train function's
    graph at the end of the first batch (79-209 ms measured here for the sample CNN, against
    batches of 5-15 ms): the first `trainjob run` of the example showed that warning about a
    callback the user never wrote. The graph is now written at the end of the first epoch."""
    config = {
        "epochs": 1, "steps_per_epoch": 10, "model": "cnn", "batch_size": 16,
        "data_dir": str(mnist_data_dir),
    }  # fmt: skip
    env = {
        constants.ENV_ENTRYPOINT: "hook_timing:build",
        constants.ENV_CONFIG: json.dumps(config),
        "PYTHONPATH": f"{harness.REPO_ROOT}:{Path(__file__).parent}",
    }
    code, _, out = _run(tmp_path, env)
    assert code == 0, out
    report = json.loads((tmp_path / "ckpt" / "hook_times.json").read_text())
    # Every callback fit ran but the test's own (History is tf-keras' own; the rest are the
    # runtime's): about 0.5 ms in all over the 6 batches now. 30 ms leaves room for a loaded
    # machine and is well below the graph's cost.
    spent = {name: s for name, s in report["seconds"].items() if name != "Report"}
    assert len(spent) >= 3, report
    assert sum(spent.values()) < 0.030, spent
    assert "slow compared to the batch time" not in out, out
    # TensorBoard's Graphs tab still has the graph: written once, at the epoch's end.
    assert report["train_records"].get("graph_def") == 1, report
