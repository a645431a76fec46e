"""Which NVIDIA GPUs this host has, what of the host a sandbox needs to use one, and which ones
`verl-sf serve --gpus` hands out.

A GPU sandbox gets the driver's control nodes (/dev/nvidiactl, /dev/nvidia-uvm) and its one GPU's
node (/dev/nvidiaN), nothing else of /dev; the driver's user-space libraries (libcuda and the
libnvidia-* it loads) are found as the dynamic loader finds them (`ldconfig -p`, then
$LD_LIBRARY_PATH) and shown read-only.  The parsing is pure, so it is tested on fake listings.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
from collections.abc import Iterable, Mapping
from typing import Optional

from verl_sf.errors import VerlSfError

DEV = "/dev"
CONTROL_NODES = ("nvidiactl", "nvidia-uvm")
"""What every CUDA context opens besides its GPU's node; nvidia-uvm-tools (profilers), nvidia-modeset
(displays) and nvidia-caps (MIG administration) stay out."""
GPU_NODE = re.compile(r"nvidia(\d+)")
DRIVER_LIBRARY = re.compile(r"lib(cuda|nvidia-[\w-]+|nvcuvid)\.so(\.\d+)*")
"""libcuda and what it loads: the PTX JIT (libnvidia-ptxjitcompiler), NVML, the GPU compiler."""
PROC_GPUS = "/proc/driver/nvidia/gpus"
UUID = re.compile(r"(GPU|MIG)-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}")
"""A UUID CUDA_VISIBLE_DEVICES accepts (a driver that hides it prints question marks)."""
CUDA_HOMES = ("CUDA_HOME", "CUDA_PATH")
DEFAULT_CUDA_BIN = "/usr/local/cuda/bin"


class GpuChoiceError(VerlSfError, ValueError):
    """`--gpus` names GPUs this host does not have, or is not a list."""


@dataclasses.dataclass(frozen=True)
class GpuView:
    """What one GPU's sandbox sees of the host: the device nodes bound in, the driver's library
    directories, and how the run's CUDA names the GPU."""

    index: int
    nodes: tuple[str, ...]
    library_dirs: tuple[str, ...]
    """Where the driver's libraries are (bound read-only where outside /usr)."""
    library_path: tuple[str, ...] = ()
    """Those of them the loader's cache does not list: the sandbox's LD_LIBRARY_PATH, as the server's."""
    uuid: Optional[str] = None

    @property
    def missing_nodes(self) -> list[str]:
        """Control nodes CUDA needs that the host has not made yet (nvidia-uvm appears once the module loads)."""
        return [f"{DEV}/{name}" for name in CONTROL_NODES if f"{DEV}/{name}" not in self.nodes]

    @property
    def env(self) -> dict[str, str]:
        """CUDA picks the GPU by its UUID when the driver says it (indices can differ from minors)."""
        return {"CUDA_VISIBLE_DEVICES": self.uuid or str(self.index), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def gpu_indices(dev_entries: Iterable[str]) -> list[int]:
    """The GPUs a /dev listing shows (nvidia0, nvidia1, ...), when the control node is there too."""
    names = set(dev_entries)
    if "nvidiactl" not in names:
        return []
    return sorted(int(m.group(1)) for m in map(GPU_NODE.fullmatch, names) if m)


def device_nodes(index: int, dev_entries: Iterable[str], dev: str = DEV) -> tuple[str, ...]:
    """The nodes one GPU's runs need: the control nodes present and that GPU's own, no other."""
    names = set(dev_entries)
    return tuple(f"{dev}/{name}" for name in (*CONTROL_NODES, f"nvidia{index}") if name in names)


def parse_gpu_choice(spec: str, present: list[int]) -> list[int]:
    """`--gpus`: "" or "none" (no GPU runs), "all", or indices such as "0,1"."""
    spec = spec.strip().lower()
    if spec in ("", "none"):
        return []
    if spec == "all":
        return list(present)
    try:
        chosen = sorted({int(part) for part in spec.split(",") if part.strip()})
    except ValueError:
        raise GpuChoiceError(f"--gpus {spec!r}: give 'all', 'none' or GPU indices such as 0,1") from None
    absent = [index for index in chosen if index not in present]
    if absent:
        have = ", ".join(map(str, present)) or "none"
        raise GpuChoiceError(f"--gpus {spec!r}: no GPU {', '.join(map(str, absent))} on this host (it has: {have})")
    return chosen


def driver_library_dirs(ldconfig_output: str, ld_library_path: str = "") -> tuple[list[str], list[str]]:
    """(directories of the driver's libraries in the loader's cache, from `ldconfig -p` lines
    `name (...) => path`; $LD_LIBRARY_PATH entries outside it that hold libcuda.so.1, as where a
    driver is mounted into a container)."""
    cached: dict[str, None] = {}
    for line in ldconfig_output.splitlines():
        name, arrow, path = line.strip().partition(" => ")
        if arrow and DRIVER_LIBRARY.fullmatch(name.split(" ", 1)[0]):
            cached[os.path.dirname(path.strip())] = None
    extra = [os.path.normpath(entry) for entry in ld_library_path.split(":")
             if entry and os.path.exists(os.path.join(entry, "libcuda.so.1"))]
    return list(cached), [entry for entry in dict.fromkeys(extra) if entry not in cached]


def parse_gpu_information(text: str) -> tuple[Optional[int], Optional[str]]:
    """(device minor, UUID) from a /proc/driver/nvidia/gpus/*/information file."""
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    minor = fields.get("Device Minor", "").strip()
    uuid = fields.get("GPU UUID", "").strip()
    return (int(minor) if minor.isdigit() else None), (uuid if UUID.fullmatch(uuid) else None)


def gpu_uuids(proc_gpus: str = PROC_GPUS) -> dict[int, str]:
    """Device minor -> UUID, as the driver reports them."""
    found: dict[int, str] = {}
    try:
        entries = os.listdir(proc_gpus)
    except OSError:
        return found
    for entry in entries:
        try:
            with open(os.path.join(proc_gpus, entry, "information")) as fh:
                minor, uuid = parse_gpu_information(fh.read())
        except OSError:
            continue
        if minor is not None and uuid:
            found[minor] = uuid
    return found


def _ldconfig() -> str:
    for ldconfig in ("/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"):
        try:
            return subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=20, check=False).stdout
        except OSError:
            continue
    return ""


def host_gpus(dev: str = DEV) -> list[int]:
    try:
        return gpu_indices(os.listdir(dev))
    except OSError:
        return []


def gpu_views(chosen: list[int], dev: str = DEV, environ: Optional[Mapping[str, str]] = None) -> list[GpuView]:
    """One view per chosen GPU (empty when none is chosen: nothing is probed)."""
    if not chosen:
        return []
    environ = os.environ if environ is None else environ
    entries = os.listdir(dev)
    cached, extra = driver_library_dirs(_ldconfig(), environ.get("LD_LIBRARY_PATH", ""))
    uuids = gpu_uuids()
    return [GpuView(index, device_nodes(index, entries, dev), (*cached, *extra), tuple(extra), uuids.get(index))
            for index in chosen]


def cuda_bin_dirs(environ: Optional[Mapping[str, str]] = None) -> list[str]:
    """Where the CUDA toolkit's nvcc is looked for after $PATH: $CUDA_HOME/bin, $CUDA_PATH/bin,
    /usr/local/cuda/bin (the installers' default; not on PATH unless a profile adds it)."""
    environ = os.environ if environ is None else environ
    homes = [os.path.join(environ[name], "bin") for name in CUDA_HOMES if environ.get(name)]
    return list(dict.fromkeys([*homes, DEFAULT_CUDA_BIN]))
