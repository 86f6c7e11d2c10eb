"""Which GPU a job uses when Snakemake runs several GPU jobs at once on one machine.

`snakemake --cores all --resources gpu=8` caps how many GPU jobs run at the same time but never
tells a job which device is its own (snakemake#281): without help every job would pick device 0.
A slot pool fixes that: slot i is GPU i, and holding slot i means holding an exclusive
`fcntl.flock` on `<lock_dir>/slot-<i>.lock`. `acquire_slot()` takes the first free slot (waiting
while all are busy), points CUDA_VISIBLE_DEVICES and ASCEND_RT_VISIBLE_DEVICES at that slot's
device for the duration, then restores the environment. The kernel drops a flock when its process
dies, so a crashed or killed job frees its slot without any cleanup.

Where there is nothing to share the context does nothing and yields None: on a CPU machine (no
device and no HNCLIP_GPU_SLOTS), where a scheduler has already pinned the job to one device
(SLURM sets CUDA_VISIBLE_DEVICES to the GPU it allocated), and in a torchrun rank (WORLD_SIZE > 1). Where the visible devices are a list
("2,5,7"), slot i is the i-th device of that list.

Environment: HNCLIP_GPU_SLOTS (number of slots, overriding the device count; also how tests
simulate GPUs) and HNCLIP_GPU_SLOT_DIR (lock directory; default .cache/gpu-slots in the project).
"""
from __future__ import annotations

import fcntl
import glob
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

SLOTS_ENV = "HNCLIP_GPU_SLOTS"
LOCK_DIR_ENV = "HNCLIP_GPU_SLOT_DIR"
DEFAULT_LOCK_DIR = Path(".cache/gpu-slots")
VISIBLE_DEVICE_VARS = ("CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES")
POLL_S = 0.1


def inherited_devices() -> list[str] | None:
    """The device list this process was restricted to (by a scheduler or the user), or None."""
    for var in VISIBLE_DEVICE_VARS:
        value = os.environ.get(var)
        if value is not None:
            return [device.strip() for device in value.split(",") if device.strip()]
    return None


def device_count() -> int:
    """CUDA GPUs, else Ascend NPUs, counted without initialising either runtime: both read the
    visible-device variable once, at initialisation, so counting must not initialise them.
    torch.cuda.device_count() asks NVML (torch.cuda.is_available() would initialise CUDA); the
    NPUs are counted by their driver's device files (/dev/davinci<N>)."""
    import torch  # lazily: slow to import, and not needed when HNCLIP_GPU_SLOTS is set
    return torch.cuda.device_count() or len(glob.glob("/dev/davinci[0-9]*"))


def slot_count(n_slots: int | None = None) -> int:
    if n_slots is not None:
        return n_slots
    if os.environ.get(SLOTS_ENV):
        return int(os.environ[SLOTS_ENV])
    return device_count()


def slot_devices(n_slots: int, inherited: list[str] | None) -> list[str]:
    """The device of each slot: slot i is GPU i, or the i-th of an inherited device list."""
    if inherited is None:
        return [str(slot) for slot in range(n_slots)]
    if n_slots > len(inherited):
        raise ValueError(f"{n_slots} GPU slots but only {len(inherited)} visible devices ({','.join(inherited)})")
    return inherited[:n_slots]


# ---- locks --------------------------------------------------------------------------------------
def try_lock(path: Path) -> int | None:
    """An open descriptor holding an exclusive flock on `path`, or None when another holder has it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())  # who holds it, for a person looking at the directory
    return fd


def wait_for_free_slot(lock_dir: Path, n_slots: int, timeout: float | None) -> tuple[int, int]:
    """(slot, descriptor) of the first free slot; polls while all are taken (flock cannot wait on
    "any of n"). Raises TimeoutError after `timeout` seconds."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        for slot in range(n_slots):
            fd = try_lock(lock_dir / f"slot-{slot}.lock")
            if fd is not None:
                return slot, fd
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"all {n_slots} GPU slots in {lock_dir} stayed busy for {timeout}s")
        time.sleep(POLL_S)


def release(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


# ---- environment --------------------------------------------------------------------------------
@contextmanager
def visible_device(device: str) -> Iterator[None]:
    """CUDA_VISIBLE_DEVICES and ASCEND_RT_VISIBLE_DEVICES set to `device`, restored afterwards."""
    previous = {var: os.environ.get(var) for var in VISIBLE_DEVICE_VARS}
    os.environ.update({var: device for var in VISIBLE_DEVICE_VARS})
    try:
        yield
    finally:
        for var, value in previous.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


@contextmanager
def acquire_slot(n_slots: int | None = None, lock_dir: str | os.PathLike | None = None,
                 timeout: float | None = None) -> Iterator[int | None]:
    """Hold a free GPU slot and make its device the only visible one; yields the slot index, or
    None where there is nothing to share (no device, or a scheduler already pinned one).

    Enter it before torch initialises CUDA/NPU: the visible-device variables are read only then.
    """
    inherited = inherited_devices()
    if inherited is not None and len(inherited) == 1:
        yield None  # the scheduler's choice; it also keeps other jobs off this device
        return
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        yield None  # a torchrun rank: the launcher placed the ranks (LOCAL_RANK), one device each
        return
    n = slot_count(n_slots)
    if n <= 0:
        yield None
        return
    devices = slot_devices(n, inherited)
    directory = Path(lock_dir or os.environ.get(LOCK_DIR_ENV) or DEFAULT_LOCK_DIR)
    slot, fd = wait_for_free_slot(directory, n, timeout)
    try:
        with visible_device(devices[slot]):
            yield slot
    finally:
        release(fd)
