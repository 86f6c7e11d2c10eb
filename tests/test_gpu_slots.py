"""GPU slot pool (hnclip.runtime.gpu_slots) with simulated devices (HNCLIP_GPU_SLOTS): real processes,
real flocks. Concurrent holders never share a slot, extra jobs wait, a SIGKILLed holder frees its
slot, and the visible-device variables are set for the holder and restored afterwards."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hnclip.runtime.gpu_slots import (
    VISIBLE_DEVICE_VARS,
    acquire_slot,
    release,
    try_lock,
)

ROOT = Path(__file__).resolve().parents[1]

# One job: wait for the go file (all jobs contend at once), take a slot, note what it saw, hold it
# for `hold` seconds, note when it let go.
WORKER = """
import json, os, sys, time
from hnclip.runtime.gpu_slots import acquire_slot
record, hold, go = sys.argv[1], float(sys.argv[2]), sys.argv[3]
while not os.path.exists(go):
    time.sleep(0.01)
open(record + ".waiting", "w").close()
with acquire_slot(timeout=60) as slot:
    start = time.time()
    seen = {var: os.environ.get(var) for var in ("CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES")}
    open(record + ".acquired", "w").close()
    time.sleep(hold)
    end = time.time()
with open(record, "w") as f:
    json.dump({"slot": slot, "start": start, "end": end, **seen}, f)
"""


@pytest.fixture
def simulated_gpus(monkeypatch, tmp_path):
    """Three simulated GPUs, no inherited device restriction, a private lock directory."""
    monkeypatch.setenv("HNCLIP_GPU_SLOTS", "3")
    monkeypatch.setenv("HNCLIP_GPU_SLOT_DIR", str(tmp_path / "locks"))
    for var in (*VISIBLE_DEVICE_VARS, "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def start_worker(record: Path, hold_s: float, go: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.Popen([sys.executable, "-c", WORKER, str(record), str(hold_s), str(go)], env=env)


def wait_for_file(path: Path, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def held(lock_dir: Path, slot: int) -> int:
    """Hold `slot` as another job would (flock is per open file, so this works in-process too)."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    fd = try_lock(lock_dir / f"slot-{slot}.lock")
    assert fd is not None
    return fd


def test_slot_device_is_visible_inside_and_restored_after(simulated_gpus, monkeypatch):
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "0,1,2")
    other = held(simulated_gpus / "locks", 0)
    try:
        with acquire_slot() as slot:
            assert slot == 1
            assert os.environ["CUDA_VISIBLE_DEVICES"] == os.environ["ASCEND_RT_VISIBLE_DEVICES"] == "1"
            with acquire_slot() as nested:  # this process is pinned now: no second slot
                assert nested is None and os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    finally:
        release(other)
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    assert os.environ["ASCEND_RT_VISIBLE_DEVICES"] == "0,1,2"


def test_cpu_machine_is_a_no_op(simulated_gpus, monkeypatch):
    monkeypatch.setenv("HNCLIP_GPU_SLOTS", "0")
    with acquire_slot() as slot:
        assert slot is None and "CUDA_VISIBLE_DEVICES" not in os.environ
    assert not (simulated_gpus / "locks").exists()


def test_device_pinned_by_a_scheduler_is_used_as_is(simulated_gpus, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")  # what SLURM sets for a job with one GPU
    with acquire_slot() as slot:
        assert slot is None and os.environ["CUDA_VISIBLE_DEVICES"] == "5"
    assert not (simulated_gpus / "locks").exists()


def test_torchrun_ranks_are_left_alone(simulated_gpus, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with acquire_slot() as slot:
        assert slot is None and "CUDA_VISIBLE_DEVICES" not in os.environ


def test_slots_map_onto_an_inherited_device_list(simulated_gpus, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6,7")
    other = held(simulated_gpus / "locks", 0)
    try:
        with acquire_slot() as slot:
            assert slot == 1 and os.environ["CUDA_VISIBLE_DEVICES"] == "6"
    finally:
        release(other)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,6,7"
    monkeypatch.setenv("HNCLIP_GPU_SLOTS", "4")
    with pytest.raises(ValueError, match="4 GPU slots but only 3 visible devices"):
        with acquire_slot():
            pass


def test_busy_pool_times_out(simulated_gpus):
    other = held(simulated_gpus / "locks", 0)
    started = time.monotonic()
    try:
        with pytest.raises(TimeoutError, match="all 1 GPU slots"):
            with acquire_slot(n_slots=1, timeout=0.3):
                pass
    finally:
        release(other)
    assert time.monotonic() - started >= 0.3
    with acquire_slot(n_slots=1, timeout=0.3) as slot:  # free again once released
        assert slot == 0


def test_concurrent_jobs_never_share_a_slot_and_extra_jobs_wait(simulated_gpus):
    n_jobs, hold_s = 7, 0.6
    records = [simulated_gpus / f"job{i}.json" for i in range(n_jobs)]
    go = simulated_gpus / "go"
    workers = [start_worker(record, hold_s, go) for record in records]
    go.touch()
    assert [w.wait(timeout=120) for w in workers] == [0] * n_jobs
    jobs = [json.loads(record.read_text()) for record in records]
    assert {job["slot"] for job in jobs} == {0, 1, 2}
    for job in jobs:  # each job saw its own slot's device, under both variables
        assert job["CUDA_VISIBLE_DEVICES"] == job["ASCEND_RT_VISIBLE_DEVICES"] == str(job["slot"])
    for a in jobs:  # holding intervals overlap only across different slots
        for b in jobs:
            if a is not b and a["slot"] == b["slot"]:
                assert a["end"] <= b["start"] or b["end"] <= a["start"], (a, b)
    # 7 jobs on 3 slots: at most 3 at once, so somebody waited for a slot to come free.
    events = sorted([(job["start"], 1) for job in jobs] + [(job["end"], -1) for job in jobs], key=lambda e: (e[0], e[1]))
    running = peak = 0
    for _, change in events:
        running += change
        peak = max(peak, running)
    assert peak == 3
    assert max(job["start"] for job in jobs) - min(job["start"] for job in jobs) >= hold_s


def test_sigkilled_holder_frees_its_slot(simulated_gpus, monkeypatch):
    monkeypatch.setenv("HNCLIP_GPU_SLOTS", "1")
    go = simulated_gpus / "go"
    go.touch()
    holder = start_worker(simulated_gpus / "holder.json", 300, go)
    assert wait_for_file(simulated_gpus / "holder.json.acquired", 30)
    waiter = start_worker(simulated_gpus / "waiter.json", 0, go)
    assert wait_for_file(simulated_gpus / "waiter.json.waiting", 30)
    time.sleep(0.5)
    assert not (simulated_gpus / "waiter.json.acquired").exists()  # the only slot is taken: it waits
    killed_at = time.time()
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)
    assert waiter.wait(timeout=30) == 0
    waiter_record = json.loads((simulated_gpus / "waiter.json").read_text())
    assert waiter_record["slot"] == 0 and waiter_record["start"] - killed_at < 2.0


def test_slot_count_defaults_to_the_device_count(simulated_gpus, monkeypatch):
    import hnclip.runtime.gpu_slots as gpu_slots
    monkeypatch.delenv("HNCLIP_GPU_SLOTS")
    monkeypatch.setattr(gpu_slots, "device_count", lambda: 2)
    other = held(simulated_gpus / "locks", 0)
    try:
        with acquire_slot() as slot:
            assert slot == 1 and os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    finally:
        release(other)
    monkeypatch.setattr(gpu_slots, "device_count", lambda: 0)  # a CPU machine
    with acquire_slot() as slot:
        assert slot is None and "CUDA_VISIBLE_DEVICES" not in os.environ
