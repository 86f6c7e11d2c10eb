"""Device selection, mixed precision and device provenance.

Preference for "auto": Ascend NPU > CUDA > Apple MPS > CPU. `torch_npu` is optional and imported
lazily; importing it can fail in many ways besides ImportError (missing CANN libraries, a torch
version mismatch, driver errors), so any exception simply means "no NPU".
"""
from __future__ import annotations

import contextlib
import importlib
import platform
import re
from pathlib import Path
from typing import ContextManager

import torch

from hnclip.errors import UserError
from hnclip.runtime.accelerator_needs import LOCK_FILE, findings, refusal

DEVICE_PREFERENCE = ("npu", "cuda", "mps", "cpu")
PRECISIONS = ("fp32", "bf16")
AUTOCAST_DEVICE_TYPES = ("cuda", "npu")  # where "bf16" turns on autocast; elsewhere it stays fp32


class DeviceUnavailableError(UserError, RuntimeError):
    """The requested device is not present on this machine."""


class AcceleratorRequiredError(DeviceUnavailableError):
    """The profile needs an accelerator (execution.require_accelerator) and only the CPU would run."""


# ---------------------------------------------------------------------------------------------
# Probes (module-level so tests can monkeypatch them)
# ---------------------------------------------------------------------------------------------

def import_torch_npu():
    """The `torch_npu` module, or None when it is absent or fails to import for any reason."""
    try:
        return importlib.import_module("torch_npu")
    except Exception:  # noqa: BLE001 - CANN/driver/version errors are not ImportErrors
        return None


def npu_count() -> int:
    if import_torch_npu() is None:
        return 0
    try:
        return int(torch.npu.device_count()) if torch.npu.is_available() else 0
    except Exception:  # noqa: BLE001 - an installed but broken runtime means no usable NPU
        return 0


def cuda_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def mps_count() -> int:
    mps = getattr(torch.backends, "mps", None)
    return int(mps is not None and mps.is_available())


def available_devices() -> dict[str, int]:
    """Device type -> number of devices, for every type present (cpu always is)."""
    counts = {"npu": npu_count(), "cuda": cuda_count(), "mps": mps_count(), "cpu": 1}
    return {kind: count for kind, count in counts.items() if count > 0}


# ---------------------------------------------------------------------------------------------
# Selection
# ---------------------------------------------------------------------------------------------

_DEVICE_PATTERN = re.compile(r"^(?P<kind>cpu|cuda|npu|mps)(?::(?P<index>\d+))?$")


def parse_device(requested: str | torch.device) -> tuple[str, int | None]:
    """("cuda", 1) for "cuda:1". Parsed by hand: torch.device("npu") only parses once torch_npu is imported."""
    if isinstance(requested, torch.device):
        return requested.type, requested.index
    match = _DEVICE_PATTERN.match(requested.strip().lower())
    if match is None:
        raise ValueError(f"not a device: {requested!r} (expected 'auto', 'cpu', 'cuda[:N]', 'npu[:N]' or 'mps')")
    index = match.group("index")
    return match.group("kind"), None if index is None else int(index)


def _describe_available(available: dict[str, int]) -> str:
    return ", ".join(kind if kind == "cpu" else f"{kind} (x{count})" for kind, count in available.items())


def _torch_device(kind: str, index: int | None) -> torch.device:
    if kind in ("npu", "cuda"):
        return torch.device(kind, index or 0)
    return torch.device(kind)


def resolve_device(requested: str | torch.device = "auto") -> torch.device:
    """"auto" picks the best present device; "cpu", "cuda", "cuda:1", "npu", "npu:0", "mps" are checked.

    A requested device that is absent raises `DeviceUnavailableError` naming what is available.
    """
    available = available_devices()
    if isinstance(requested, str) and requested.strip().lower() == "auto":
        kind = next(kind for kind in DEVICE_PREFERENCE if kind in available)
        return _torch_device(kind, 0)
    kind, index = parse_device(requested)
    if kind not in available or (index or 0) >= available[kind]:
        raise DeviceUnavailableError(
            f"requested device {requested!r} is not available; available: {_describe_available(available)}")
    return _torch_device(kind, index)


def device_needs_problem(execution: dict, lock: Path = LOCK_FILE) -> str | None:
    """Why a job of this execution section would refuse to start here (`hnclip.runtime.accelerator_needs.refusal`);
    None when its needs are met: no `require_accelerator`, an explicit `device: cpu`, or an accelerator answers."""
    requested = str(execution.get("device", "auto")).strip().lower()
    if not execution.get("require_accelerator") or requested == "cpu":
        return None
    available = available_devices()
    if requested == "auto":
        if set(available) - {"cpu"}:
            return None
    else:
        kind, index = parse_device(requested)
        if kind in available and (index or 0) < available[kind]:
            return None
    return refusal(requested, findings(available, lock))


def require_device_needs(execution: dict, lock: Path = LOCK_FILE) -> None:
    """Raise AcceleratorRequiredError where `device_needs_problem` finds a problem."""
    problem = device_needs_problem(execution, lock)
    if problem:
        raise AcceleratorRequiredError(problem)


def configure_tf32(device: torch.device | str, enabled: bool = True) -> bool | None:
    """TF32 for fp32 matmuls and convolutions on CUDA (execution.tf32, default on): fp32 evaluation, the
    gradient probe's fp32 half, FineLIP's fp32 training, SAM and the matcher run on tensor cores with a
    10-bit mantissa instead of full fp32, several times faster on A100/H100-class GPUs. Returns the
    setting in force for the records: True/False on CUDA, None where TF32 does not apply (CPU, NPU, MPS)."""
    kind = device.type if isinstance(device, torch.device) else parse_device(device)[0]
    if kind != "cuda":
        return None
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    return enabled


def compute_device(execution: dict, requested: str | None = None) -> torch.device:
    """The device a job computes on (`resolve_device` of execution.device, or `requested`), with TF32 set
    as execution.tf32 asks (`configure_tf32`). Whether the job may run here at all is the CLI's check for its
    GPU verbs (`require_device_needs`): a job that loads a model without needing a GPU (a gather) must not refuse."""
    device = resolve_device(requested or execution["device"])
    configure_tf32(device, execution.get("tf32", True))
    return device


def empty_cache(device: torch.device | str) -> None:
    """Hand the caching allocator's unused blocks on `device`'s backend back to the device: CUDA,
    Ascend NPU (`torch.npu`, present once torch_npu is imported) or MPS; nothing to do on the CPU."""
    kind, _ = parse_device(device)
    if kind == "npu" and import_torch_npu() is None:
        return
    backend = getattr(torch, kind, None) if kind in ("cuda", "npu", "mps") else None
    if backend is not None and hasattr(backend, "empty_cache"):
        backend.empty_cache()


# ---------------------------------------------------------------------------------------------
# Precision
# ---------------------------------------------------------------------------------------------

def autocast_context(device: torch.device | str, precision: str = "fp32") -> ContextManager:
    """bf16 autocast on cuda/npu for precision "bf16"; a null context (plain fp32) otherwise.

    CPU and MPS stay in fp32 even for "bf16": CPU bf16 autocast is slow and numerically different
    from what the accelerators do, and the CPU path exists for tests and the tiny profile.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; expected one of {PRECISIONS}")
    device_type, _ = parse_device(device)
    if precision == "bf16" and device_type in AUTOCAST_DEVICE_TYPES:
        return torch.autocast(device_type=device_type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


# ---------------------------------------------------------------------------------------------
# Provenance
# ---------------------------------------------------------------------------------------------

def _device_name(device: torch.device) -> str:
    index = device.index or 0
    if device.type == "cuda":
        return torch.cuda.get_device_name(index)
    if device.type == "npu":
        return str(torch.npu.get_device_name(index))
    if device.type == "mps":
        return "Apple MPS"
    return platform.processor() or platform.machine() or "cpu"


def describe_device(device: torch.device | str) -> dict:
    """Name, type, index, count and library versions of `device`, for provenance records."""
    device = device if isinstance(device, torch.device) else _torch_device(*parse_device(device))
    torch_npu = import_torch_npu() if device.type == "npu" else None
    return {
        "type": device.type,
        "index": device.index,
        "name": _device_name(device),
        "count": available_devices().get(device.type, 0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda if device.type == "cuda" else None,
        "torch_npu": getattr(torch_npu, "__version__", None),
    }
