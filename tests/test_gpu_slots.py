"""GPU slot pool (hnclip.runtime.gpu_slots) with simulated devices (HNCLIP_GPU_SLOTS): real processes,
real flocks. Concurrent holders never share a slot, extra jobs wait, a SIGKILLed holder frees its
slot, and the visible-device variables are set for the holder and restored afterwards. torchrun
ranks are simulated by their environment (WORLD_SIZE, LOCAL_RANK, TORCHELASTIC_RUN_ID, ...): two
concurrent multi-process runs get disjoint devices, and a run waits for a whole set of slots."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hnclip.runtime.gpu_slots import (
    HELD_ENV,
    VISIBLE_DEVICE_VARS,
    acquire_slot,
    release,
    try_lock,
)

ROOT = Path(__file__).resolve().parents[1]

# One job (or one rank of a run): wait for the go file (all jobs contend at once), take a slot, note
# what it saw, hold it for `hold` seconds, note when it let go.
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
    json.dump({"slot": slot, "start": start, "end": end, "run": os.environ.get("TORCHELASTIC_RUN_ID"),
               "local_rank": int(os.environ.get("LOCAL_RANK", 0)), **seen}, f)
"""
TORCHRUN_VARS = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID",
                 "TORCHELASTIC_RESTART_COUNT", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def simulated_gpus(monkeypatch, tmp_path):
    """Three simulated GPUs, no inherited device restriction, a private lock directory."""
    monkeypatch.setenv("HNCLIP_GPU_SLOTS", "3")
    monkeypatch.setenv("HNCLIP_GPU_SLOT_DIR", str(tmp_path / "locks"))
    for var in (*VISIBLE_DEVICE_VARS, *TORCHRUN_VARS, HELD_ENV):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def rank_env(run: str, port: int, local_rank: int, nproc: int) -> dict[str, str]:
    """What torchrun --standalone --nproc_per_node <nproc> gives one of its processes."""
    return {"WORLD_SIZE": str(nproc), "RANK": str(local_rank), "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(nproc), "TORCHELASTIC_RUN_ID": run, "TORCHELASTIC_RESTART_COUNT": "0",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def start_worker(record: Path, hold_s: float, go: Path, extra_env: dict[str, str] | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **(extra_env or {})}
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


def test_devices_a_scheduler_gave_a_run_are_used_as_is(simulated_gpus, monkeypatch):
    for var, value in rank_env("r", 29500, 1, 2).items():
        monkeypatch.setenv(var, value)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")  # SLURM's two GPUs for a 2-process job
    with acquire_slot() as slot:
        assert slot is None and os.environ["CUDA_VISIBLE_DEVICES"] == "3,5"
    assert not (simulated_gpus / "locks").exists()


def test_a_rank_of_a_run_sees_its_run_and_nested_calls_take_nothing(simulated_gpus, monkeypatch):
    # one process per node (LOCAL_WORLD_SIZE 1) of a two-node run: no peer to hand slots to
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "r")
    other = held(simulated_gpus / "locks", 0)
    try:
        with acquire_slot() as slot:
            assert slot == 1 and os.environ["CUDA_VISIBLE_DEVICES"] == "1"
            with acquire_slot() as nested:
                assert nested is None and os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    finally:
        release(other)
    assert "CUDA_VISIBLE_DEVICES" not in os.environ and HELD_ENV not in os.environ
    assert not list((simulated_gpus / "locks").glob("run-*"))  # the hand-out files are cleaned up


def test_a_run_needs_torchrun_identity_and_no_more_processes_than_slots(simulated_gpus, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="TORCHELASTIC_RUN_ID"):
        with acquire_slot():
            pass
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "r")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    with pytest.raises(ValueError, match="4 processes needs 4 GPU slots but there are only 3"):
        with acquire_slot():
            pass


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
        with pytest.raises(TimeoutError, match="for 1 free GPU slot"):
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
    events = sorted([(job["start"], 1) for job in jobs] + [(job["end"], -1) for job in jobs])
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
    assert waiter_record["slot"] == 0 and waiter_record["start"] >= killed_at  # it got the slot the kill freed


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


# ---- torchrun runs ------------------------------------------------------------------------------
Ranks = list[tuple[Path, subprocess.Popen]]


def start_run(tmp: Path, run: str, port: int, nproc: int, hold_s: float, go: Path) -> Ranks:
    """The processes torchrun would start for one run, each with its record file."""
    records = [tmp / f"{run}-rank{rank}.json" for rank in range(nproc)]
    return [(record, start_worker(record, hold_s, go, rank_env(run, port, rank, nproc)))
            for rank, record in enumerate(records)]


def finished(ranks: Ranks, timeout_s: float = 60) -> list[dict]:
    assert [process.wait(timeout=timeout_s) for _, process in ranks] == [0] * len(ranks)
    return [json.loads(record.read_text()) for record, _ in ranks]


def check_runs(jobs: list[dict]) -> None:
    """Each rank sees its run's devices, its own at LOCAL_RANK; jobs holding at once share no device."""
    by_run: dict[str, list[dict]] = {}
    for job in jobs:
        by_run.setdefault(job["run"], []).append(job)
    for run, ranks in by_run.items():
        visible = {job["CUDA_VISIBLE_DEVICES"] for job in ranks}
        assert len(visible) == 1, (run, ranks)  # every rank of a run sees the same devices ...
        devices = visible.pop().split(",")
        assert len(devices) == len(ranks) == len(set(devices))
        for job in ranks:  # ... its own slot at index LOCAL_RANK (what cuda:<LOCAL_RANK> opens)
            assert devices[job["local_rank"]] == str(job["slot"]), (run, job)
            assert job["ASCEND_RT_VISIBLE_DEVICES"] == job["CUDA_VISIBLE_DEVICES"]
    for a in jobs:
        for b in jobs:
            if a["run"] != b["run"] and a["start"] < b["end"] and b["start"] < a["end"]:
                shared = set(a["CUDA_VISIBLE_DEVICES"].split(",")) & set(b["CUDA_VISIBLE_DEVICES"].split(","))
                assert not shared, (a, b)


def test_two_concurrent_torchrun_runs_get_disjoint_devices(simulated_gpus, monkeypatch):
    monkeypatch.setenv("HNCLIP_GPU_SLOTS", "4")
    go = simulated_gpus / "go"
    ranks = [*start_run(simulated_gpus, "run-a", 29500, 2, 1.5, go),
             *start_run(simulated_gpus, "run-b", 29501, 2, 1.5, go)]
    go.touch()
    jobs = finished(ranks)
    check_runs(jobs)
    assert {job["slot"] for job in jobs} == {0, 1, 2, 3}
    assert max(job["start"] for job in jobs) < min(job["end"] for job in jobs)  # all four held at once


def test_a_run_waits_for_a_whole_set_of_slots(simulated_gpus, monkeypatch):
    """3 slots: two 2-process runs and a single job. A run never starts on part of a set (which could
    deadlock two runs), so one run waits for the other; the single job fits beside either."""
    monkeypatch.setenv("HNCLIP_GPU_SLOTS", "3")
    go = simulated_gpus / "go"
    ranks = [*start_run(simulated_gpus, "run-a", 29500, 2, 1.0, go),
             *start_run(simulated_gpus, "run-b", 29501, 2, 1.0, go)]
    single = start_worker(simulated_gpus / "single.json", 1.0, go)
    go.touch()
    jobs = finished(ranks)
    assert single.wait(timeout=60) == 0
    single_job = json.loads((simulated_gpus / "single.json").read_text())
    check_runs([*jobs, single_job])
    first, second = sorted([jobs[:2], jobs[2:]], key=lambda ranks: ranks[0]["start"])
    assert max(job["end"] for job in first) <= min(job["start"] for job in second)


def test_a_killed_run_frees_its_slots(simulated_gpus, monkeypatch):
    monkeypatch.setenv("HNCLIP_GPU_SLOTS", "2")
    go = simulated_gpus / "go"
    go.touch()
    killed = [start_worker(simulated_gpus / f"killed{rank}.json", 300, go, rank_env("killed", 29500, rank, 2))
              for rank in range(2)]
    assert all(wait_for_file(simulated_gpus / f"killed{rank}.json.acquired", 30) for rank in range(2))
    ranks = start_run(simulated_gpus, "next", 29501, 2, 0, go)
    assert all(wait_for_file(Path(f"{record}.waiting"), 30) for record, _ in ranks)
    time.sleep(0.5)
    assert not any(Path(f"{record}.acquired").exists() for record, _ in ranks)  # both slots are taken: it waits
    for process in killed:  # what torchrun does to the other ranks when one fails
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
    jobs = finished(ranks, 30)
    check_runs(jobs)
    assert {job["slot"] for job in jobs} == {0, 1}


# What each rank of a real torchrun launch sees: the launcher's own environment, not a simulation.
TORCHRUN_RANK = """
import json, os, sys, time
from hnclip.runtime.gpu_slots import acquire_slot
with acquire_slot(timeout=60) as slot:
    start = time.time()
    time.sleep(1.0)
    seen = {var: os.environ.get(var) for var in ("CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES")}
    record = {"slot": slot, "start": start, "end": time.time(), "run": os.environ["TORCHELASTIC_RUN_ID"],
              "local_rank": int(os.environ["LOCAL_RANK"]), **seen}
with open(os.path.join(sys.argv[1], f"{os.getpid()}.json"), "w") as f:
    json.dump(record, f)
"""


def test_two_real_torchrun_launches_get_disjoint_devices(simulated_gpus, monkeypatch):
    monkeypatch.setenv("HNCLIP_GPU_SLOTS", "4")
    script = simulated_gpus / "rank.py"
    script.write_text(TORCHRUN_RANK)
    records = simulated_gpus / "records"
    records.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    launches = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                                  "2", str(script), str(records)], env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for launch in launches:
        assert launch.wait(timeout=120) == 0, launch.stderr.read()
        launch.stderr.close()
    jobs = [json.loads(path.read_text()) for path in records.glob("*.json")]
    assert len(jobs) == 4 and len({job["run"] for job in jobs}) == 2
    check_runs(jobs)
    assert not list((simulated_gpus / "locks").glob("run-*"))
