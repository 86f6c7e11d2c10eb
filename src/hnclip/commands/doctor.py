"""`hnclip doctor`: whether this machine can run a profile before anything is booked.

It prints the device the profile's jobs would compute on, what decides it (torch's version and CUDA build,
the NVIDIA driver, torch_npu, the driver requirements.lock's torch build needs:
hnclip.runtime.accelerator_needs), the free disk against the plan's peak (`hnclip plan`) and whether the
profile's device needs are met. Its exit status is 1 exactly when a GPU job of the profile would refuse to
start here (`execution.require_accelerator` and no accelerator), so a batch script can run it first.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from hnclip.config.registry import Registry

GB = 1e9


@dataclass
class Checkup:
    lines: list[str]
    device_needs_met: bool
    disk_short_gb: float      # the plan's peak disk minus the free disk (<= 0: enough)


def free_disk_gb(path: Path) -> tuple[float, Path]:
    """Free space of the filesystem holding `path` (its nearest existing ancestor), and that ancestor."""
    where = path.resolve()
    while not where.exists():
        where = where.parent
    return shutil.disk_usage(where).free / GB, where


def checkup(reg: Registry, root: Path = Path("."), lock: Path | None = None) -> Checkup:
    """What `hnclip doctor` prints for the active profile of `reg`, run from the project root `root`."""
    from hnclip.plan.cost_plan import build_plan
    from hnclip.runtime.accelerator_needs import findings
    from hnclip.runtime.device import available_devices, device_needs_problem, resolve_device
    lock = lock if lock is not None else root / "requirements.lock"
    execution = reg.profile["execution"]
    problem = device_needs_problem(execution, lock)
    requested = execution["device"]
    try:
        resolved = str(resolve_device(requested))
    except ValueError as error:  # DeviceUnavailableError: an explicit device that is absent
        resolved = f"unavailable ({error})"
    lines = [f"profile: {reg.profile_name}",
             f"device: execution.device {requested} -> {resolved}"
             f" (require_accelerator: {str(bool(execution.get('require_accelerator'))).lower()})"]
    lines += findings(available_devices(), lock).lines()
    plan = build_plan(reg)
    peak = sum(plan.disk.values())
    free, where = free_disk_gb(root / reg.profile["data_root"])
    free_root, root_fs = free_disk_gb(root)
    short = peak - min(free, free_root)
    disk = f"disk: {free_root:,.1f} GB free at {root_fs}"
    if where != root_fs and free != free_root:
        disk += f", {free:,.1f} GB at {where} (data_root)"
    lines.append(disk + f"; the plan's peak: {peak:,.1f} GB ("
                 + (f"short by {short:,.1f} GB)" if short > 0 else "enough)"))
    lines.append("device needs: met" if problem is None else f"device needs: NOT MET: {problem}")
    return Checkup(lines, problem is None, short)
