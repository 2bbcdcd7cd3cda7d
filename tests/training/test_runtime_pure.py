"""Pure decisions of the runtime: env parsing, chief/role/strategy rules, the progress schema."""

from __future__ import annotations

import json

import pytest

from trainjob.core import constants, lastwords, termination
from trainjob.core import progress_events as progress
from trainjob.runtime import contract, settings
from trainjob.runtime.exitcodes import ConfigError

pytestmark = pytest.mark.training


def _env(**extra: str) -> dict[str, str]:
    env = {constants.ENV_ENTRYPOINT: "pkg.mod:build"}
    env.update(extra)
    return env


def _tf_config(cluster: dict[str, list[str]], task_type: str, index: int) -> str:
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


def test_single_replica_without_tf_config_is_a_lone_chief_worker() -> None:
    parsed = settings.from_env(_env())
    assert (parsed.task_type, parsed.task_index, parsed.is_chief) == ("worker", 0, True)
    assert parsed.strategy == settings.AUTO and parsed.framework == settings.KERAS
    assert parsed.num_workers == 1


def test_names_are_case_insensitive_and_data_dir_comes_from_config() -> None:
    parsed = settings.from_env(
        _env(
            **{
                constants.ENV_STRATEGY: "multiworkermirrored",
                constants.ENV_FRAMEWORK: "estimator",
                constants.ENV_CONFIG: '{"data_dir": "/d"}',
                settings.ENV_DATA_DIR: "/ignored",
            }
        )
    )
    assert parsed.strategy == settings.MULTI_WORKER_MIRRORED
    assert parsed.framework == settings.ESTIMATOR and parsed.data_dir == "/d"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({constants.ENV_ENTRYPOINT: ""}, "TRAINJOB_ENTRYPOINT is not set"),
        ({constants.ENV_ENTRYPOINT: "pkg.mod"}, "pkg.module:function"),
        ({constants.ENV_STRATEGY: "Horovod"}, "is not one of"),
        ({constants.ENV_CONFIG: "{"}, "not valid JSON"),
        ({constants.ENV_TF_CONFIG: _tf_config({"worker": ["a:1"]}, "worker", 1)}, "out of range"),
        ({constants.ENV_TF_CONFIG: _tf_config({"master": ["a:1"]}, "master", 0)}, "unknown role"),
        (
            {
                constants.ENV_TF_CONFIG: _tf_config({"worker": ["a:1", "b:1"]}, "worker", 1),
                constants.ENV_REPLICA_INDEX: "0",
            },
            "contradicts",
        ),
        (
            {
                constants.ENV_STRATEGY: "ParameterServer",
                constants.ENV_TF_CONFIG: _tf_config(
                    {"worker": ["a:1"], "ps": ["b:1"]}, "worker", 0
                ),
            },
            "needs a chief",
        ),
        (
            {
                constants.ENV_STRATEGY: "Mirrored",
                constants.ENV_TF_CONFIG: _tf_config({"worker": ["a:1", "b:1"]}, "worker", 0),
            },
            "use MultiWorkerMirrored",
        ),
        ({constants.ENV_STRATEGY: "DTensor"}, "DTENSOR_CLIENT_ID"),
        (
            {
                constants.ENV_STRATEGY: "DTensor",
                constants.ENV_DTENSOR_CLIENT_ID: "2",
                constants.ENV_DTENSOR_NUM_CLIENTS: "2",
                constants.ENV_DTENSOR_JOB_NAME: "worker",
                constants.ENV_DTENSOR_JOBS: "a:1,b:1",
            },
            "DTENSOR_JOBS lists",
        ),
    ],
)
def test_invalid_env_is_a_config_error(extra: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        settings.from_env(_env(**extra))


@pytest.mark.parametrize(
    ("cluster", "task", "index", "chief"),
    [
        ({"chief": ("a",), "worker": ("b", "c")}, "chief", 0, True),
        ({"chief": ("a",), "worker": ("b", "c")}, "worker", 0, False),
        ({"worker": ("b", "c")}, "worker", 0, True),
        ({"worker": ("b", "c")}, "worker", 1, False),
        ({"worker": ("b",), "evaluator": ("e",)}, "evaluator", 0, False),
    ],
)
def test_chief_rule(
    cluster: dict[str, tuple[str, ...]], task: str, index: int, chief: bool
) -> None:
    assert settings.is_chief(cluster, task, index) is chief


@pytest.mark.parametrize(
    ("strategy", "task", "role"),
    [
        (settings.PARAMETER_SERVER, "chief", settings.ROLE_TRAIN),
        (settings.PARAMETER_SERVER, "worker", settings.ROLE_SERVE),
        (settings.PARAMETER_SERVER, "ps", settings.ROLE_SERVE),
        (settings.MULTI_WORKER_MIRRORED, "worker", settings.ROLE_TRAIN),
        (settings.MULTI_WORKER_MIRRORED, "evaluator", settings.ROLE_EVALUATE),
    ],
)
def test_task_role(strategy: str, task: str, role: str) -> None:
    assert settings.task_role(strategy, task) == role


def test_progress_line_round_trip_and_schema() -> None:
    record = progress.make_event(
        "epoch",
        replica="worker-0",
        chief=True,
        now=12.5,
        epoch=1,
        step=40,
        logs={"loss": 0.25, "accuracy": 0.9, "val_loss": float("nan")},
        examples_per_sec=1000.0,
    )
    line = progress.format_line(record)
    assert line.startswith(constants.PROGRESS_LINE_PREFIX)
    assert progress.parse_line(line) == record
    assert record["loss"] == 0.25 and record["metrics"] == {"accuracy": 0.9, "val_loss": None}
    assert progress.parse_line("INFO some log line") is None
    with pytest.raises(ValueError, match="unknown progress event"):
        progress.make_event("done", replica="w", chief=False, now=0.0)
    with pytest.raises(ValueError, match="clash"):
        progress.make_event("end", replica="w", chief=False, now=0.0, loss=1.0)


def test_train_spec_validation() -> None:
    spec = contract.TrainSpec(model_fn=lambda: None, dataset_fn=lambda ctx: None)
    contract.validate_train_spec(spec, strategy="MultiWorkerMirrored", framework="Keras")
    with pytest.raises(ConfigError, match="steps_per_epoch is required"):
        contract.validate_train_spec(spec, strategy="ParameterServer", framework="Keras")
    with pytest.raises(ConfigError, match="expects"):
        contract.validate_train_spec(spec, strategy="Default", framework="Estimator")
    bad = contract.TrainSpec(model_fn=lambda: None, dataset_fn=lambda ctx: None, save_freq=0)
    with pytest.raises(ConfigError, match="save_freq"):
        contract.validate_train_spec(bad, strategy="Default", framework="Keras")


def _loop_spec(**overrides: object) -> contract.LoopTrainSpec:
    fields: dict[str, object] = {
        "state_fn": dict,
        "dataset_fn": lambda ctx: None,
        "step_fn": lambda state, batch: {},
        "steps_per_epoch": 10,
    }
    fields.update(overrides)
    return contract.LoopTrainSpec(**fields)  # type: ignore[arg-type]


def test_a_custom_loop_spec_runs_under_every_keras_strategy_but_not_dtensor() -> None:
    for strategy in ("MultiWorkerMirrored", "ParameterServer", "Mirrored", "OneDevice", "Default"):
        contract.validate_train_spec(_loop_spec(), strategy=strategy, framework="Keras")
    with pytest.raises(ConfigError, match=r"expects trainjob\.runtime\.DTensorTrainSpec"):
        contract.validate_train_spec(_loop_spec(), strategy="DTensor", framework="Keras")
    with pytest.raises(ConfigError, match=r"TrainSpec or trainjob\.runtime\.LoopTrainSpec"):
        contract.validate_train_spec(object(), strategy="Default", framework="Keras")


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"steps_per_epoch": 0}, "steps_per_epoch"),
        ({"epochs": 0}, "epochs"),
        ({"checkpoint_every_steps": 0}, "checkpoint_every_steps"),
        ({"reduction": "max"}, "reduction"),
        ({"step_fn": None}, "step_fn"),
    ],
)
def test_an_impossible_custom_loop_spec_is_rejected_naming_its_field(
    overrides: dict[str, object], field: str
) -> None:
    with pytest.raises(ConfigError, match=rf"LoopTrainSpec\.{field}"):
        contract.validate_loop_spec(_loop_spec(**overrides))


def test_loop_state_keys_must_not_clash_with_the_runtime_step_counter() -> None:
    assert contract.validate_loop_state({"model": 1}) == {"model": 1}
    with pytest.raises(ConfigError, match="'step'"):
        contract.validate_loop_state({"step": 1})
    with pytest.raises(ConfigError, match="non-empty mapping"):
        contract.validate_loop_state([1])


def test_loop_saves_at_epoch_ends_or_every_n_steps_and_only_mwms_needs_agreement() -> None:
    from trainjob.runtime import loop_runner

    assert [s for s in range(1, 25) if loop_runner.save_due(s, steps_per_epoch=10, every=None)] == [
        10,
        20,
    ]
    assert [s for s in range(1, 13) if loop_runner.save_due(s, steps_per_epoch=10, every=4)] == [
        4,
        8,
        12,
    ]
    assert loop_runner.epoch_of(19, 10) == 1
    assert not loop_runner.writes_alone("MultiWorkerMirrored", 2)
    assert loop_runner.writes_alone("MultiWorkerMirrored", 1)
    assert loop_runner.writes_alone("ParameterServer", 3)


def test_the_data_dir_becomes_tfds_default_unless_the_user_set_one() -> None:
    from trainjob.runtime import entry

    parsed = settings.from_env(_env(**{settings.ENV_DATA_DIR: "/data"}))
    env: dict[str, str] = {}
    entry.prepare_process_env(env, parsed)
    assert env["TFDS_DATA_DIR"] == "/data"
    own = {"TFDS_DATA_DIR": "/mine"}
    entry.prepare_process_env(own, parsed)
    assert own["TFDS_DATA_DIR"] == "/mine"


def test_steps_per_epoch_none_is_rejected_only_for_several_mwms_workers() -> None:
    spec = contract.TrainSpec(model_fn=dict, dataset_fn=lambda ctx: None)
    with pytest.raises(ConfigError, match=r"TrainSpec\.steps_per_epoch is required"):
        contract.validate_steps_per_epoch(spec, strategy="MultiWorkerMirrored", num_workers=2)
    contract.validate_steps_per_epoch(spec, strategy="MultiWorkerMirrored", num_workers=1)
    contract.validate_steps_per_epoch(spec, strategy="Mirrored", num_workers=1)


def test_exception_line_is_what_python_prints_last() -> None:
    from trainjob.runtime import reporter

    assert reporter.exception_line(ValueError("learning rate must be > 0")) == (
        "ValueError: learning rate must be > 0"
    )
    error = KeyError("images")
    error.add_note("trainjob: a hint")
    assert reporter.exception_line(error) == "KeyError: 'images'"
    assert reporter.exception_line(RuntimeError("first\nsecond")) == "RuntimeError: first"


def test_the_error_goes_beside_the_final_report_and_alone_when_too_long() -> None:
    from trainjob.core import progress as core_progress

    report = termination.with_report(core_progress.Report(replica="chief-0", step=7))
    merged = termination.with_error(report, "ValueError: bad")
    assert termination.read(merged).cause == "ValueError: bad"
    restored = termination.read(merged).report
    assert restored is not None and restored.step == 7
    assert (
        termination.read(termination.with_error("", "ValueError: bad")).cause == "ValueError: bad"
    )
    big = '{"trainjobProgress": {"lastCheckpoint": "' + "x" * 3900 + '"}}'
    alone = termination.with_error(big, "ValueError: " + "y" * 1000)
    assert len(alone) <= termination.LIMIT
    assert termination.PROGRESS_KEY not in alone
    cause = termination.read(alone).cause
    assert cause is not None and len(cause) == lastwords.MAX_CAUSE_CHARS
    assert cause.startswith("ValueError: yyy") and cause.endswith("...")


def test_the_termination_path_is_the_rendered_one_else_the_default_only_in_a_pod() -> None:
    from trainjob.runtime import reporter

    rendered = {constants.ENV_TERMINATION_MESSAGE_PATH: "/tmp/t"}
    assert reporter.termination_path(rendered, lambda _: False) == "/tmp/t"
    assert reporter.termination_path({}, lambda p: p == "/dev/termination-log") == (
        "/dev/termination-log"
    )
    assert reporter.termination_path({}, lambda _: False) is None
