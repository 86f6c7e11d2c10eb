"""Which GPUs a job uses when Snakemake runs several GPU jobs at once on one machine.

`snakemake --cores all --resources gpu=8` caps how many GPUs the running jobs ask for but never
tells a job which devices are its own (snakemake#281): without help every job would pick device 0.
A slot pool fixes that: slot i is GPU i, and holding slot i means holding an exclusive
`fcntl.flock` on `<lock_dir>/slot-<i>.lock`. The kernel drops a flock when its process dies, so a
crashed or killed job frees its slots without any cleanup.

A single-process job takes the first free slot (waiting while all are busy) and sees only that
slot's device. A torchrun run of N local processes takes N slots as one: its local rank 0 picks N
free slots at once (or waits, never holding part of a set, so two runs cannot deadlock), hands
them out through a file in the lock directory, and each rank then holds the flock of its own slot
for as long as it lives. Every rank of the run sees the same N devices, in local-rank order, so
`cuda:<LOCAL_RANK>` (what `hnclip.training.distributed` picks) is the rank's own slot, and two
concurrent runs never share a device. Picking slots and handing them out happens under
`<lock_dir>/pool.lock`, which single-process jobs take too while they pick theirs.

Inside the context CUDA_VISIBLE_DEVICES and ASCEND_RT_VISIBLE_DEVICES point at the job's devices;
afterwards the environment is restored. Enter it before torch initialises CUDA/NPU.

Where there is nothing to share the context does nothing and yields None: on a CPU machine (no
device and no HNCLIP_GPU_SLOTS), where a scheduler has already given the job its devices (the
visible devices are exactly as many as the job has processes: SLURM sets CUDA_VISIBLE_DEVICES to
the GPUs it allocated), and inside a process that already holds its slots (nested calls, child
processes). Where more devices are visible ("2,5,7"), slot i is the i-th device of that list.

Environment: HNCLIP_GPU_SLOTS (number of slots, overriding the device count; also how tests
simulate GPUs) and HNCLIP_GPU_SLOT_DIR (lock directory; default .cache/gpu-slots in the project).
A torchrun rank is recognised by WORLD_SIZE > 1 and identified by TORCHELASTIC_RUN_ID,
TORCHELASTIC_RESTART_COUNT, MASTER_ADDR/MASTER_PORT, LOCAL_RANK and LOCAL_WORLD_SIZE.
"""
from __future__ import annotations

import fcntl
import glob
import json
import os
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from hnclip.hashing import sha256_bytes

SLOTS_ENV = "HNCLIP_GPU_SLOTS"
LOCK_DIR_ENV = "HNCLIP_GPU_SLOT_DIR"
HELD_ENV = "HNCLIP_GPU_SLOT_HELD"  # set while this process holds slots; inherited by its children
DEFAULT_LOCK_DIR = Path(".cache/gpu-slots")
VISIBLE_DEVICE_VARS = ("CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES")
POOL_LOCK = "pool.lock"
POLL_S = 0.1
# How long local rank 0 waits, holding the pool, for the other ranks to take the slots it picked
# for them. torchrun starts the ranks together, so they arrive within seconds; one that died before
# arriving makes torchrun stop the whole run anyway.
HANDOVER_TIMEOUT_S = 600.0


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


# ---- the processes of one torchrun launch ------------------------------------------------------
@dataclass(frozen=True)
class LocalRanks:
    """This process's place among the processes one torchrun launch started on this machine."""
    key: str               # the same for every local rank of one launch (and restart), unique otherwise
    local_rank: int
    local_world_size: int


def local_ranks() -> LocalRanks | None:
    """The launch this process is a rank of, or None outside a multi-process run."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    launch = [os.environ.get(var, "") for var in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT")]
    if not any(launch):
        raise RuntimeError("WORLD_SIZE > 1 but neither TORCHELASTIC_RUN_ID nor MASTER_ADDR/MASTER_PORT is set: "
                           "cannot tell which processes form one run; launch with torchrun")
    # The run id alone is not unique: without --standalone it defaults to "none" for every run.
    # Concurrent runs on one machine differ in their master port; a restart gets fresh slots.
    identity = [*launch, os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"), socket.gethostname()]
    return LocalRanks(key=sha256_bytes("\0".join(identity).encode())[:16],
                      local_rank=int(os.environ.get("LOCAL_RANK", "0")),
                      local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ["WORLD_SIZE"]))


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


def release(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def slot_path(lock_dir: Path, slot: int) -> Path:
    return lock_dir / f"slot-{slot}.lock"


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def _expired(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline


def _wait_for_lock(path: Path, deadline: float | None, what: str) -> int:
    """Poll for an exclusive flock on `path` (flock cannot wait with a timeout)."""
    while True:
        fd = try_lock(path)
        if fd is not None:
            return fd
        if _expired(deadline):
            raise TimeoutError(f"{what} ({path}) stayed busy")
        time.sleep(POLL_S)


def _free_slots(lock_dir: Path, n_slots: int, wanted: int) -> list[tuple[int, int]]:
    """(slot, descriptor) of `wanted` free slots, all locked here; [] (nothing held) if fewer are free."""
    held = []
    for slot in range(n_slots):
        fd = try_lock(slot_path(lock_dir, slot))
        if fd is not None:
            held.append((slot, fd))
            if len(held) == wanted:
                return held
    for _, fd in held:
        release(fd)
    return []


def take_slots(lock_dir: Path, n_slots: int, wanted: int, timeout: float | None,
               handover: Callable[[list[tuple[int, int]]], None] | None = None) -> list[tuple[int, int]]:
    """`wanted` free slots, taken together under the pool lock: (slot, descriptor) each, all held
    by this process (`handover` runs before the pool is let go). Waits while fewer are free, never
    holding part of a set; raises TimeoutError after `timeout` seconds."""
    if wanted > n_slots:
        raise ValueError(f"a run of {wanted} processes needs {wanted} GPU slots but there are only {n_slots}")
    lock_dir.mkdir(parents=True, exist_ok=True)
    deadline = _deadline(timeout)
    while True:
        pool = _wait_for_lock(lock_dir / POOL_LOCK, deadline, "the GPU slot pool")
        try:
            taken = _free_slots(lock_dir, n_slots, wanted)
            if taken and handover is not None:
                handover(taken)
        finally:
            release(pool)
        if taken:
            return taken
        if _expired(deadline):
            raise TimeoutError(f"waited {timeout}s for {wanted} free GPU slot(s) of the {n_slots} in {lock_dir}")
        time.sleep(POLL_S)


# ---- handing a run's slots to its ranks ----------------------------------------------------------
def _assignment_path(lock_dir: Path, key: str) -> Path:
    return lock_dir / f"run-{key}.json"


def _ack_path(lock_dir: Path, key: str, local_rank: int) -> Path:
    return lock_dir / f"run-{key}.rank{local_rank}"


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _lead_run(lock_dir: Path, n_slots: int, ranks: LocalRanks, devices: list[str],
              timeout: float | None) -> tuple[int, int, list[str]]:
    """Local rank 0: pick the run's slots and keep the pool until every rank holds its own."""
    taken = take_slots(lock_dir, n_slots, ranks.local_world_size, timeout,
                       handover=lambda taken: _hand_out(lock_dir, ranks, taken, devices))
    slot, fd = taken[0]
    return slot, fd, [devices[s] for s, _ in taken]


def _hand_out(lock_dir: Path, ranks: LocalRanks, taken: list[tuple[int, int]], devices: list[str]) -> None:
    """With the pool held: let go of the other ranks' slots, publish them, and wait until each rank
    holds its own (nobody else picks slots without the pool); rank 0 keeps the first."""
    for _, fd in taken[1:]:
        release(fd)
    slots = [slot for slot, _ in taken]
    assignment = _assignment_path(lock_dir, ranks.key)
    acks = [_ack_path(lock_dir, ranks.key, rank) for rank in range(1, ranks.local_world_size)]
    _write_atomically(assignment, json.dumps({"slots": slots, "devices": [devices[s] for s in slots]}))
    deadline = _deadline(HANDOVER_TIMEOUT_S)
    try:
        while not all(ack.exists() for ack in acks):
            if _expired(deadline):
                release(taken[0][1])
                raise TimeoutError(f"not every rank of the run took its GPU slot within {HANDOVER_TIMEOUT_S}s")
            time.sleep(POLL_S / 10)
    finally:
        for path in (assignment, *acks):
            path.unlink(missing_ok=True)


def _join_run(lock_dir: Path, ranks: LocalRanks, timeout: float | None) -> tuple[int, int, list[str]]:
    """Local rank > 0: wait for rank 0's assignment, take this rank's slot, say so."""
    assignment = _assignment_path(lock_dir, ranks.key)
    deadline = _deadline(timeout)
    while not assignment.exists():
        if _expired(deadline):
            raise TimeoutError(f"local rank 0 of this run got no GPU slots within {timeout}s")
        time.sleep(POLL_S)
    chosen = json.loads(assignment.read_text())
    slot = chosen["slots"][ranks.local_rank]
    # Rank 0 let go of this slot for us and keeps the pool until we hold it: it is free, unless a
    # process outside this protocol took it.
    fd = _wait_for_lock(slot_path(lock_dir, slot), _deadline(HANDOVER_TIMEOUT_S), f"GPU slot {slot}")
    _ack_path(lock_dir, ranks.key, ranks.local_rank).touch()
    return slot, fd, chosen["devices"]


# ---- environment --------------------------------------------------------------------------------
@contextmanager
def visible_devices(devices: list[str]) -> Iterator[None]:
    """CUDA_VISIBLE_DEVICES and ASCEND_RT_VISIBLE_DEVICES set to `devices` (and the held marker),
    restored afterwards."""
    previous = {var: os.environ.get(var) for var in (*VISIBLE_DEVICE_VARS, HELD_ENV)}
    os.environ.update({var: ",".join(devices) for var in VISIBLE_DEVICE_VARS})
    os.environ[HELD_ENV] = "1"
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
    """Hold this job's GPU slot(s) and make their devices the only visible ones; yields this
    process's slot index, or None where there is nothing to share (no device, a scheduler already
    gave the job its devices, or this process holds its slots already).

    A single process gets one slot. A torchrun rank gets its own slot, and sees all N devices of
    its run, its own at index LOCAL_RANK. Enter it before torch initialises CUDA/NPU: the
    visible-device variables are read only then.
    """
    if os.environ.get(HELD_ENV):
        yield None  # this process (or its parent) holds its slots already
        return
    ranks = local_ranks()
    inherited = inherited_devices()
    if inherited is not None and len(inherited) == (ranks.local_world_size if ranks else 1):
        yield None  # exactly the devices the job needs: a scheduler's (or the user's) choice
        return
    n = slot_count(n_slots)
    if n <= 0:
        yield None
        return
    devices = slot_devices(n, inherited)
    directory = Path(lock_dir or os.environ.get(LOCK_DIR_ENV) or DEFAULT_LOCK_DIR)
    if ranks is None:
        (slot, fd), = take_slots(directory, n, 1, timeout)
        own_devices = [devices[slot]]
    elif ranks.local_rank == 0:
        slot, fd, own_devices = _lead_run(directory, n, ranks, devices, timeout)
    else:
        slot, fd, own_devices = _join_run(directory, ranks, timeout)
    try:
        with visible_devices(own_devices):
            yield slot
    finally:
        release(fd)
