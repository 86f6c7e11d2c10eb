"""What decides whether torch sees an accelerator here: its build, the NVIDIA driver, torch_npu, the lock.

`device: auto` falls back to the CPU when no accelerator answers, which is right for the embedded profile
and wrong for the paper's: a torch built for a newer CUDA than the driver supports sees no GPU, and a
paper-size run would start on the CPU and take months. A profile whose `execution.require_accelerator` is
true therefore refuses to start a GPU job on the CPU unless its device is explicitly `cpu`
(hnclip.runtime.device.require_device_needs), with an error built here (`refusal`): torch's version and CUDA
build, whether torch sees a GPU, the driver version from /proc or nvidia-smi, torch_npu, and the driver the
lock's torch build needs. `hnclip doctor` prints the same findings.
"""
from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import torch

# The oldest Linux x86_64 driver each CUDA release supports: NVIDIA's CUDA Toolkit release notes, table
# "CUDA Toolkit and Corresponding Driver Versions" (CUDA 13.0 GA >= 580.65.06, CUDA 12.8 GA >= 570.26;
# https://docs.nvidia.com/cuda/archive/13.0.0/cuda-toolkit-release-notes/index.html#cuda-driver).
MIN_DRIVER = {"13.0": "580.65.06", "12.8": "570.26"}
# The torch builds ./setup.sh installs (HNCLIP_TORCH_BUILD) and the CUDA release each is built for.
TORCH_BUILDS = {"cu130": "13.0", "cu128": "12.8", "cpu": None}
NVIDIA_PROC_VERSION = Path("/proc/driver/nvidia/version")
LOCK_FILE = Path("requirements.lock")
_PROC_PATTERN = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)")


def nvidia_driver() -> tuple[str | None, str]:
    """(driver version, where it was read) from /proc/driver/nvidia/version or nvidia-smi; (None, why)."""
    if NVIDIA_PROC_VERSION.is_file():
        match = _PROC_PATTERN.search(NVIDIA_PROC_VERSION.read_text(errors="replace"))
        if match:
            return match.group(1), str(NVIDIA_PROC_VERSION)
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=20).stdout.split()
        except (OSError, subprocess.SubprocessError) as error:
            return None, f"nvidia-smi failed ({error})"
        if out:
            return out[0], "nvidia-smi"
        return None, "nvidia-smi answered without a driver version"
    return None, f"no {NVIDIA_PROC_VERSION} and no nvidia-smi"


def torch_npu_version() -> str | None:
    """torch_npu's installed version, read from its metadata (importing it can fail for CANN reasons)."""
    for name in ("torch_npu", "torch-npu"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text))


def driver_supports(driver: str | None, cuda: str | None) -> bool | None:
    """Whether `driver` is at least the one CUDA `cuda` needs; None where unknown (no driver, no table row)."""
    if driver is None or cuda not in MIN_DRIVER:
        return None
    return _version(driver) >= _version(MIN_DRIVER[cuda])


def lock_torch_build(lock: Path = LOCK_FILE) -> dict | None:
    """The torch build requirements.lock installs: {"torch": version, "build": cu130|cu128|cpu|..., "cuda":
    "13.0" or None}; None without a lock or a torch pin. A pin without a local version (torch==2.14.1) is
    PyPI's build, whose CUDA release the lock's nvidia-cuda-runtime pin gives."""
    if not lock.is_file():
        return None
    pins = dict(line.strip().split("==", 1) for line in lock.read_text().splitlines()
                if "==" in line and not line.lstrip().startswith("#"))
    pins = {name.lower(): version for name, version in pins.items()}
    if "torch" not in pins:
        return None
    version, _, local = pins["torch"].partition("+")
    if local:
        return {"torch": version, "build": local, "cuda": TORCH_BUILDS.get(local)}
    runtime = pins.get("nvidia-cuda-runtime") or pins.get("nvidia-cuda-runtime-cu12")
    if runtime is None:
        return {"torch": version, "build": "cpu", "cuda": None}
    cuda = ".".join(runtime.split(".")[:2])
    return {"torch": version, "build": f"cu{cuda.replace('.', '')}", "cuda": cuda}


@dataclass
class Findings:
    torch: str
    torch_cuda: str | None          # the CUDA release torch is built for (None: a CPU or NPU build)
    cuda_available: bool
    devices: dict[str, int]
    driver: str | None
    driver_source: str
    torch_npu: str | None
    lock: dict | None

    def lines(self) -> list[str]:
        accelerators = {kind: count for kind, count in self.devices.items() if kind != "cpu"}
        lock = self.lock
        needs = "no requirements.lock here"
        if lock is not None:
            needs = (f"requirements.lock installs torch {lock['torch']} ({lock['build']}"
                     + (f", CUDA {lock['cuda']}: needs NVIDIA driver >= {MIN_DRIVER[lock['cuda']]})"
                        if lock["cuda"] in MIN_DRIVER else ")"))
        supported = driver_supports(self.driver, self.torch_cuda)
        driver = (f"{self.driver} (from {self.driver_source})" if self.driver else f"none found ({self.driver_source})")
        if supported is not None:
            driver += (f": supports CUDA {self.torch_cuda}" if supported else
                       f": too old for CUDA {self.torch_cuda} (needs >= {MIN_DRIVER[self.torch_cuda]})")
        return [f"torch: {self.torch} (CUDA build: {self.torch_cuda or 'none'}; "
                f"torch.cuda.is_available(): {self.cuda_available})",
                f"NVIDIA driver: {driver}",
                f"torch_npu: {self.torch_npu or 'not installed'}",
                "accelerators: " + (", ".join(f"{kind} x{count}" for kind, count in accelerators.items()) or "none"),
                f"lock: {needs}"]


def findings(devices: dict[str, int], lock: Path = LOCK_FILE) -> Findings:
    """What decides the device here; `devices`: hnclip.runtime.device.available_devices()."""
    driver, source = nvidia_driver()
    return Findings(torch.__version__, torch.version.cuda, torch.cuda.is_available(), devices,
                    driver, source, torch_npu_version(), lock_torch_build(lock))


def refusal(requested: str, found: Findings) -> str:
    """Why a job that needs an accelerator refuses to start here, and what to change."""
    return (f"this profile needs an accelerator (execution.require_accelerator: true), but device {requested!r} "
            f"finds none here: it would run on the CPU. Found: " + "; ".join(found.lines()) + ". "
            "Install a driver the torch build supports, or a torch build the driver supports (./setup.sh with "
            "HNCLIP_TORCH_BUILD=" + "|".join(TORCH_BUILDS) + ", docs/paper-run.md), or check that this job "
            "was given a GPU; to run on the CPU on purpose, set the profile's execution.device: cpu.")
