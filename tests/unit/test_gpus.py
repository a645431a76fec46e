"""GPU discovery, the `--gpus` choice, the bind list of a GPU's sandbox, and GPU slots: pure parts,
tested on fake /dev listings and `ldconfig -p` output (the device checks are scripts/gpu_check.sh)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from verl_sf.executor.config import ExecutorConfig
from verl_sf.executor.gpu_slots import GpuSlots, NoGpuFree
from verl_sf.executor.gpus import (
    GpuChoiceError,
    GpuView,
    device_nodes,
    driver_library_dirs,
    gpu_indices,
    parse_gpu_choice,
    parse_gpu_information,
)
from verl_sf.executor.languages import SPECS, Toolchains
from verl_sf.executor.rungs import Landlock
from verl_sf.executor.sandbox import SandboxLauncher, gpu_device_args, sandbox_env

DEV = ["null", "zero", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset", "nvidia0", "nvidia1",
       "nvidia-caps", "nvme0", "nvme0n1", "sda", "kvm", "fuse"]
LDCONFIG = """\
1234 libs found in cache `/etc/ld.so.cache'
\tlibnvidia-ptxjitcompiler.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnvidia-ptxjitcompiler.so.1
\tlibnvidia-ml.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1
\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1
\tlibcudart.so.12 (libc6,x86-64) => /opt/cuda-12/lib64/libcudart.so.12
\tlibc.so.6 (libc6,x86-64, OS ABI: Linux 3.2.0) => /lib/x86_64-linux-gnu/libc.so.6
"""


def test_gpus_are_the_numbered_nodes_beside_the_control_node() -> None:
    assert gpu_indices(DEV) == [0, 1]
    assert gpu_indices(["nvidia0", "nvidia1", "null"]) == []  # no driver control node: no usable GPU
    assert gpu_indices(["null", "zero"]) == []


def test_a_gpu_sandbox_gets_its_own_node_and_the_control_nodes_only() -> None:
    assert device_nodes(1, DEV) == ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia1")
    assert device_nodes(0, ["nvidiactl", "nvidia0"]) == ("/dev/nvidiactl", "/dev/nvidia0")
    view = GpuView(1, device_nodes(1, DEV), ())
    args = gpu_device_args(view)
    bound = args[1::3]
    assert args[0::3] == ["--dev-bind"] * 3 and bound == list(view.nodes)
    assert not any(name in " ".join(args) for name in ("nvidia0", "uvm-tools", "modeset", "caps", "nvme", "kvm"))
    assert gpu_device_args(None) == []


@pytest.mark.parametrize(("spec", "expected"), [("all", [0, 1]), ("none", []), ("", []), ("1", [1]), ("1,0,1", [0, 1]),
                                                 (" ALL ", [0, 1])])
def test_gpu_choice(spec: str, expected: list[int]) -> None:
    assert parse_gpu_choice(spec, [0, 1]) == expected


@pytest.mark.parametrize(("spec", "message"), [("2", "no GPU 2 on this host (it has: 0, 1)"),
                                               ("first", "give 'all', 'none' or GPU indices")])
def test_a_bad_gpu_choice_says_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(GpuChoiceError, match=re.escape(message)):
        parse_gpu_choice(spec, [0, 1])


def test_driver_libraries_from_the_loader_cache_and_a_mounted_driver(tmp_path: Path) -> None:
    mounted = tmp_path / "nvidia" / "lib64"
    mounted.mkdir(parents=True)
    (mounted / "libcuda.so.1").write_bytes(b"")
    cached, extra = driver_library_dirs(LDCONFIG, f"/nonexistent:{mounted}:{mounted}/")
    assert cached == ["/usr/lib/x86_64-linux-gnu"]  # not the toolkit's libcudart, not libc
    assert extra == [str(mounted)]
    assert driver_library_dirs(LDCONFIG, "/usr/lib/x86_64-linux-gnu") == (cached, [])


def test_gpu_information_gives_minor_and_uuid() -> None:
    text = ("Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 33\nGPU UUID: \t GPU-6f1d8c2e-0000-1111-2222-333344445555\n"
            "Bus Location: \t 0000:00:07.0\nDevice Minor: \t 3\n")
    assert parse_gpu_information(text) == (3, "GPU-6f1d8c2e-0000-1111-2222-333344445555")
    assert parse_gpu_information("Model: x\n") == (None, None)
    hidden = "GPU UUID: \t GPU-????????-????-????-????-????????????\nDevice Minor: \t 0\n"
    assert parse_gpu_information(hidden) == (0, None)  # then CUDA_VISIBLE_DEVICES names the index
    assert GpuView(0, ("/dev/nvidiactl", "/dev/nvidia0"), ()).missing_nodes == ["/dev/nvidia-uvm"]


def _toolchains() -> Toolchains:
    return Toolchains("/usr/bin/python3", {}, (), {}, frozenset())


def test_a_gpu_sandbox_names_its_gpu_and_a_mounted_driver(tmp_path: Path) -> None:
    config = ExecutorConfig(python="/usr/bin/python3")
    view = GpuView(0, ("/dev/nvidiactl", "/dev/nvidia0"), ("/usr/lib/x86_64-linux-gnu", "/opt/driver/lib64"),
                   ("/opt/driver/lib64",), "GPU-abc")
    env = sandbox_env(config, _toolchains(), view)
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-abc" and env["LD_LIBRARY_PATH"] == "/opt/driver/lib64"
    plain = sandbox_env(config, _toolchains())
    assert "CUDA_VISIBLE_DEVICES" not in plain and "LD_LIBRARY_PATH" not in plain
    assert GpuView(2, (), ()).env["CUDA_VISIBLE_DEVICES"] == "2"
    launcher = SandboxLauncher(config, _toolchains(), (), Landlock("a test"), gpu=view)
    try:
        assert "/opt/driver/lib64" in launcher.bound_dirs()  # outside /usr: shown read-only
        assert "/usr/lib/x86_64-linux-gnu" not in launcher.bound_dirs()  # /usr is bound whole already
        assert launcher._landlock()["devices"][-2:] == ["/dev/nvidiactl", "/dev/nvidia0"]
    finally:
        launcher.close()


def test_without_a_gpu_the_gpu_languages_are_refused_with_the_reason() -> None:
    toolchains = _toolchains()
    toolchains.missing["cuda"] = ("nvcc",)
    toolchains.refuse_gpu_languages("needs an NVIDIA GPU and the CUDA toolkit: this host has no GPU")
    gpu_languages = {name for name, spec in SPECS.items() if spec.gpu}
    assert gpu_languages == {"cuda", "python_gpu"}
    assert not gpu_languages & set(toolchains.available_languages())
    message = toolchains.missing_message("python_gpu")
    assert message.startswith("language 'python_gpu' needs an NVIDIA GPU and the CUDA toolkit: this host has no GPU;")
    assert "needs 'nvcc', which is not installed on this server and needs an NVIDIA GPU" in \
        toolchains.missing_message("cuda")


def test_gpu_slots_spread_runs_and_hand_a_freed_slot_to_the_first_waiter() -> None:
    async def scenario() -> None:
        slots = GpuSlots([0, 1], per_gpu=1)
        first, second = await slots.acquire(1.0), await slots.acquire(1.0)
        assert {first.index, second.index} == {0, 1}
        waiting = asyncio.ensure_future(slots.acquire(5.0))
        await asyncio.sleep(0)
        assert slots.waiting == 1
        second.release()
        second.release()  # a second release gives nothing back twice
        third = await waiting
        assert third.index == second.index and slots.free[second.index] == 0
        for lease in (first, third):
            lease.release()
        assert slots.free == {0: 1, 1: 1}

    asyncio.run(scenario())


def test_no_free_gpu_slot_within_the_timeout_is_an_error_and_leaves_no_waiter() -> None:
    async def scenario() -> None:
        slots = GpuSlots([0], per_gpu=1)
        held = await slots.acquire(1.0)
        with pytest.raises(NoGpuFree, match="no GPU slot came free within the run's timeout of 0.05 s"):
            await slots.acquire(0.05)
        assert slots.waiting == 0
        cancelled = asyncio.ensure_future(slots.acquire(5.0))
        await asyncio.sleep(0)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        held.release()
        assert slots.free[0] == 1  # the cancelled waiter took nothing

    asyncio.run(scenario())
