"""Operator settings: a flag wins over its environment variable, which wins over the default;
bad values are errors naming the setting."""

from __future__ import annotations

import pytest

from trainjob_operator import config


def test_defaults_are_cluster_wide_with_metrics_and_no_gang_scheduler() -> None:
    settings = config.from_args([], {})
    assert settings.clusterwide
    assert settings.metrics_port == config.DEFAULT_METRICS_PORT
    assert settings.gang_scheduler == "none"
    assert settings.effective_scheduler_name is None


def test_environment_fills_in_and_flags_win() -> None:
    env = {
        "TRAINJOB_OPERATOR_NAMESPACES": "team-a, team-b",
        "TRAINJOB_CLUSTER_DOMAIN": "cluster.local",
        "TRAINJOB_METRICS_PORT": "9090",
        "TRAINJOB_GANG_SCHEDULER": "volcano",
    }
    from_env = config.from_args([], env)
    assert from_env.namespaces == ("team-a", "team-b")
    assert from_env.cluster_domain == "cluster.local"
    assert from_env.metrics_port == 9090
    assert from_env.effective_scheduler_name == "volcano"
    flagged = config.from_args(
        [
            "-n",
            "ml",
            "--cluster-domain",
            "corp.example",
            "--metrics-port",
            "0",
            "--gang-scheduler",
            "scheduler-plugins",
            "--scheduler-name",
            "my-sched",
        ],
        env,
    )
    assert flagged.namespaces == ("ml",)
    assert flagged.cluster_domain == "corp.example"
    assert flagged.metrics_port == 0
    assert flagged.effective_scheduler_name == "my-sched"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TRAINJOB_METRICS_PORT": "eighty"}, "metrics port"),
        ({"TRAINJOB_GANG_SCHEDULER": "kueue"}, "gang scheduler"),
        ({"TRAINJOB_RESYNC_SECONDS": "soon"}, "resync"),
    ],
)
def test_bad_values_name_the_setting(env: dict[str, str], message: str) -> None:
    with pytest.raises(config.ConfigError, match=message):
        config.from_args([], env)
