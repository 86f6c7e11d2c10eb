"""Paired, repeated timing of several runs' optimizer steps: the frameworks of the timing table (Table A3)
take turns on the same accumulation groups, so whatever else shares the machine slows them alike. The
library side of one concept at two layers: the command that runs it and writes results/stats/step_timing.json
(`hnclip step-timing`) is `hnclip.commands.step_timing`.

Each run is prepared as the trainer prepares it (`loop.prepare_run`: model, method, optimizer, data) and
takes real optimizer steps (`loop.optimizer_step`) from its initial weights, never from a run's checkpoint.
Round r times one optimizer step of every run on accumulation group r mod `warmup` of epoch 1 (the warmup
rounds, run and dropped, load each of these groups once into the image cache, so reading images is not
timed), the runs in an order rotated by one each round, so none is always first. Gradient probes are off:
the steps alone are timed, as Table A3 compares training steps.
"""
from __future__ import annotations

import os
import time

import torch

from hnclip.training.batching import accumulation_groups, epoch_micro_batches
from hnclip.training.distributed import distributed_session
from hnclip.training.loop import TrainJob, fresh_memory_plan, optimizer_step, prepare_run
from hnclip.training.state import LoopState


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def paired_step_times(jobs: dict[str, TrainJob], rounds: int, warmup: int) -> dict:
    """{"seconds": {key: [one optimizer step's seconds per round]}, "orders": [the keys' order per round],
    "groups": [the accumulation group timed per round], ...} for `rounds` timed rounds after `warmup`."""
    if rounds < 2 or warmup < 1:
        raise ValueError(f"paired timing needs at least 2 rounds and 1 warmup round (got {rounds}, {warmup})")
    keys = list(jobs)
    jobs = {key: _unprobed(job) for key, job in jobs.items()}
    device_names = {job.execution["device"] for job in jobs.values()}
    if len(device_names) != 1:
        raise ValueError(f"the timed runs must share one device, got {sorted(device_names)}")
    with distributed_session(device_names.pop()) as distributed:
        runs = {key: prepare_run(job, distributed) for key, job in jobs.items()}
        groups = {key: accumulation_groups(epoch_micro_batches(run.indices, run.recipe["micro_batch"],
                                                               run.job.spec["seed"], 0), run.recipe["grad_accum"])
                  for key, run in runs.items()}
        reference = groups[keys[0]]
        if any(g != reference for g in groups.values()):
            raise ValueError("the timed runs do not train on the same micro-batches (training set, seed, micro-batch "
                             "and accumulation must agree): their steps cannot be paired")
        states = {key: LoopState() for key in keys}
        plans = {key: fresh_memory_plan(run) for key, run in runs.items()}
        seconds: dict[str, list[float]] = {key: [] for key in keys}
        orders, timed_groups = [], []
        load_before = os.getloadavg()[0]
        for round_index in range(warmup + rounds):
            group_index = round_index % min(warmup, len(reference))
            shift = round_index % len(keys)
            order = keys[shift:] + keys[:shift]
            for key in order:
                run = runs[key]
                _synchronize(run.device)
                started = time.perf_counter()
                optimizer_step(run, states[key], plans[key], 0, group_index, reference[group_index])
                _synchronize(run.device)
                if round_index >= warmup:
                    seconds[key].append(time.perf_counter() - started)
            if round_index >= warmup:
                orders.append(order)
                timed_groups.append(group_index)
        device = str(next(iter(runs.values())).device)
    return {"seconds": seconds, "orders": orders, "groups": timed_groups, "rounds": rounds, "warmup": warmup,
            "device": device, "threads": torch.get_num_threads(),
            "load_average_1min": {"before": load_before, "after": os.getloadavg()[0]}}


def _unprobed(job: TrainJob) -> TrainJob:
    """The job without gradient probes and without a curves writer: its steps alone are timed."""
    from dataclasses import replace
    return replace(job, execution={**job.execution, "grad_probe_every": 0, "loader_workers": 0},
                   curves_dir=None, eval_cache_dir=None)
