"""Operator settings: a flag wins over its environment variable, which wins over the default;
bad values are errors naming the setting."""

from __future__ import annotations

import pytest

from trainjob_operator import config, leader


def test_defaults_are_cluster_wide_with_metrics_and_no_gang_scheduler() -> None:
    settings = config.from_args([], {})
    assert settings.serves_every_namespace
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


NAMESPACES = ["team-a", "team-b", "ml-prod", "ml-pr-12", "ml-pr-123", "other-pr-123", "kube-x", ""]
# What kopf 1.45.2's own namespace matcher (match_namespace, a private function) selected of
# NAMESPACES for each pattern, recorded once: `--namespace` patterns keep the meaning they had
# when kopf matched them, and the tests read no private kopf module.
SELECTED_BY_KOPF = {
    "team-*": ["team-a", "team-b"],
    "team-a": ["team-a"],
    "!kube-*": ["team-a", "team-b", "ml-prod", "ml-pr-12", "ml-pr-123", "other-pr-123", ""],
    "ml-*, !*-pr-*": ["ml-prod"],
    "ml-*, !*-pr-*, *pr-123": ["ml-prod", "ml-pr-123"],
    "!*-pr-*, *pr-123": ["team-a", "team-b", "ml-prod", "ml-pr-123", "other-pr-123", "kube-x", ""],
    "t?am-[ab]": ["team-a", "team-b"],
    "*": NAMESPACES,
}


@pytest.mark.parametrize("pattern", sorted(SELECTED_BY_KOPF))
def test_namespace_patterns_select_what_kopf_selected(pattern: str) -> None:
    selected = [ns for ns in NAMESPACES if config.namespace_matches(ns, pattern)]
    assert selected == SELECTED_BY_KOPF[pattern]


def test_exact_namespaces_are_watched_one_by_one_and_patterns_cluster_wide() -> None:
    exact = config.from_args(["-n", "team-a", "-n", "team-b"], {})
    assert exact.watched_namespaces == ("team-a", "team-b") and not exact.namespace_patterns
    assert exact.serves("team-a") and not exact.serves("team-c")
    globbed = config.from_args(["-n", "team-a", "-n", "ml-*"], {})
    assert globbed.watched_namespaces == () and globbed.namespace_patterns
    assert globbed.serves("ml-x") and globbed.serves("team-a") and not globbed.serves("team-b")
    negated = config.from_args(["-n", "!kube-*"], {})
    assert negated.watched_namespaces == () and negated.serves("a") and not negated.serves("kube-s")
    everything = config.from_args([], {})
    assert everything.watched_namespaces == () and everything.serves("anything")


def test_serve_deadline_flag_and_environment() -> None:
    assert config.from_args([], {}).serve_deadline_seconds == config.DEFAULT_SERVE_DEADLINE
    env = {"TRAINJOB_SERVE_DEADLINE_SECONDS": "20"}
    assert config.from_args([], env).serve_deadline_seconds == 20.0
    assert config.from_args(["--serve-deadline-seconds", "5"], env).serve_deadline_seconds == 5.0
    with pytest.raises(config.ConfigError, match="serve deadline"):
        config.from_args(["--serve-deadline-seconds", "soon"], {})


def test_missing_credentials_are_one_clear_line() -> None:
    files = {"/home/u/.kube/config", "/etc/kc", config.SERVICE_ACCOUNT_TOKEN}
    exists = files.__contains__
    assert config.credentials_problem({}, "/home/u", exists) is None
    assert config.credentials_problem({"KUBECONFIG": "/nope:/etc/kc"}, "/x", exists) is None
    assert config.credentials_problem({"KUBECONFIG": "/nope"}, "/home/u", exists) == (
        "KUBECONFIG names /nope, which does not exist"
    )
    nothing = config.credentials_problem({}, "/root", exists)
    assert nothing is not None and "no Kubernetes credentials" in nothing
    in_pod = {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}
    assert config.credentials_problem(in_pod, "/root", exists) is None


def test_watch_idle_flag_and_environment() -> None:
    assert config.from_args([], {}).watch_idle_seconds == config.DEFAULT_WATCH_IDLE
    env = {config.ENV_WATCH_IDLE: "30"}
    assert config.from_args([], env).watch_idle_seconds == 30.0
    assert config.from_args(["--watch-idle-seconds", "5"], env).watch_idle_seconds == 5.0
    assert config.from_args(["--watch-idle-seconds", "0"], {}).watch_idle_seconds == 1.0


def test_network_policies_are_on_unless_the_flag_or_environment_says_otherwise() -> None:
    assert config.from_args([], {}).network_policy is True
    assert config.from_args(["--no-network-policy"], {}).network_policy is False
    assert config.from_args([], {config.ENV_NETWORK_POLICY: "false"}).network_policy is False
    assert config.from_args([], {config.ENV_NETWORK_POLICY: "true"}).network_policy is True


def test_leader_election_flags_and_environment() -> None:
    plain = config.from_args([], {})
    assert not plain.leader_elect and plain.leader_election_id == "trainjob-operator"
    assert plain.leader_timing == leader.Timing(15, 10.0, 2.0)  # client-go's defaults
    short = config.from_args(
        [
            "--leader-elect",
            "--leader-election-id=tj.example.com",
            "--leader-election-namespace=ops",
            "--leader-elect-lease-duration=4s",
            "--leader-elect-renew-deadline=3",
            "--leader-elect-retry-period=1",
        ],
        {},
    )
    assert short.leader_elect and short.leader_election_id == "tj.example.com"
    assert short.leader_election_namespace == "ops"
    assert short.leader_timing == leader.Timing(4, 3.0, 1.0)
    env = {"TRAINJOB_LEADER_ELECT": "true", "TRAINJOB_LEADER_ELECT_LEASE_DURATION": "30"}
    from_env = config.from_args([], env)
    assert from_env.leader_elect and from_env.leader_timing.lease_duration == 30


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--leader-elect-lease-duration=10", "--leader-elect-renew-deadline=10"], "longer than"),
        (["--leader-elect-lease-duration=1.5"], "whole seconds"),
        (["--leader-elect-retry-period=often"], "--leader-elect-retry-period: expected seconds"),
        (["--leader-election-id=Trainjob_Operator"], "--leader-election-id: a Lease name"),
    ],
)
def test_bad_leader_election_settings_name_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(config.ConfigError, match=message):
        config.from_args(argv, {})


@pytest.mark.parametrize(
    ("argv", "env", "named"),
    [
        (["--peering=trainjob-operator"], {}, "--peering"),
        (["--peering"], {}, "--peering"),
        (["--priority", "100"], {}, "--priority"),
        (["--standalone"], {}, "--standalone"),
        ([], {"TRAINJOB_PEERING": "trainjob-operator"}, "TRAINJOB_PEERING"),
    ],
)
def test_kopf_peering_settings_are_refused_with_the_way_forward(
    argv: list[str], env: dict[str, str], named: str
) -> None:
    with pytest.raises(config.ConfigError) as refused:
        config.from_args(argv, env)
    assert str(refused.value) == f"{named}: removed: HA now uses a Lease (--leader-elect); " + (
        "without it the operator runs alone"
    )


def test_the_lease_lives_in_the_operators_own_namespace_unless_told() -> None:
    files = {config.SERVICE_ACCOUNT_NAMESPACE: "trainjob-system\n"}
    elect = config.from_args(["--leader-elect"], {})
    assert config.election_namespace(elect, {}, files.get) == "trainjob-system"
    assert config.election_namespace(elect, {"POD_NAMESPACE": "ops"}, files.get) == "ops"
    told = config.from_args(["--leader-elect", "--leader-election-namespace=x"], {})
    assert config.election_namespace(told, {"POD_NAMESPACE": "ops"}, files.get) == "x"
    with pytest.raises(config.ConfigError, match="--leader-election-namespace: needed outside"):
        config.election_namespace(elect, {}, lambda path: None)
