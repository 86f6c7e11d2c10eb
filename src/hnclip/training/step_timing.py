"""Paired, repeated timing of several runs' optimizer steps: the frameworks of the timing table (Table A3)
take steps on the same accumulation groups, so a ratio of their step times compares like with like. The
library side of one concept at two layers: the command that runs it and writes results/stats/step_timing.json
(`hnclip step-timing`) is `hnclip.commands.step_timing`.

Each run is prepared as the trainer prepares it (`loop.prepare_run`: model, method, optimizer, data) and
takes real optimizer steps (`loop.optimizer_step`) from its initial weights, never from a run's checkpoint.
Round r times one optimizer step of every run on accumulation group `groups[r]`: `rounds` distinct groups
(an epoch's groups, then the next epoch's reshuffled ones where one epoch has too few) in a random order
(seeded), so no batch is timed twice and no batch's cost is confounded with a round's position. Every
timed group is loaded once before timing (the image cache), and `warmup` untimed steps on other groups
come first. Gradient probes are off: the steps alone are timed, as Table A3 compares
training steps.

Where the runs are timed (`alone`): on a GPU each run is loaded alone, timed over all rounds and freed
before the next (four runs on one card would push each off its own compute batch); on a CPU they stay
loaded together and take turns within each round, in a random order per round. Either way a run is
timed only at its own compute batch: a step that falls back to fewer pairs per forward (out of memory)
is an error, and the record keeps each run's compute batch.
"""
from __future__ import annotations

import gc
import os
import random
import time

import torch

from hnclip.training.batching import accumulation_groups, epoch_micro_batches
from hnclip.training.distributed import distributed_session
from hnclip.training.feeding import group_batches
from hnclip.training.loop import TrainJob, fresh_memory_plan, optimizer_step, prepare_run
from hnclip.training.state import LoopState

MIN_ROUNDS = 2


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


Group = tuple[int, int]   # (epoch, accumulation group index)


def timed_groups(per_epoch: int, rounds: int, warmup: int, seed: int) -> tuple[list[Group], list[Group]]:
    """(the warmup steps' groups, the timed rounds' groups): `rounds` distinct (epoch, group) pairs of the
    first epochs that hold them, in a random order (seeded); the warmup takes groups no round times."""
    if per_epoch < 1:
        raise ValueError("the training set gives no accumulation group")
    epochs = -(-(rounds + warmup) // per_epoch)
    order = random.Random(seed).sample([(e, g) for e in range(epochs) for g in range(per_epoch)], epochs * per_epoch)
    return order[rounds:rounds + warmup], order[:rounds]


def paired_step_times(jobs: dict[str, TrainJob], rounds: int, warmup: int, seed: int = 0,
                      alone: bool | None = None) -> dict:
    """{"seconds": {key: [one optimizer step's seconds per round]}, "orders": [the keys' order per round],
    "groups": [the accumulation group timed per round], "compute_batch": {key: pairs per forward}, "alone":
    whether each run was timed alone, ...} for `rounds` timed rounds after `warmup` untimed steps. `alone`:
    None times runs alone on a GPU and in turn on a CPU."""
    if rounds < MIN_ROUNDS or warmup < 1:
        raise ValueError(f"paired timing needs at least {MIN_ROUNDS} rounds and 1 warmup step (got {rounds}, {warmup})")
    keys = list(jobs)
    jobs = {key: _unprobed(job) for key, job in jobs.items()}
    device_names = {job.execution["device"] for job in jobs.values()}
    if len(device_names) != 1:
        raise ValueError(f"the timed runs must share one device, got {sorted(device_names)}")
    device_name = device_names.pop()
    rng = random.Random(seed)
    load_before = os.getloadavg()[0]
    with distributed_session(device_name) as distributed:
        alone = torch.device(distributed.device(device_name)).type == "cuda" if alone is None else alone
        seconds: dict[str, list[float]] = {key: [] for key in keys}
        compute_batch: dict[str, int] = {}
        orders = [rng.sample(keys, len(keys)) for _ in range(rounds)]
        reference: list | None = None
        warm, timed = [], []
        loaded: dict[str, _Timed] = {}
        for key in (keys if alone else [None]):
            for name in ([key] if alone else keys):
                loaded[name] = _Timed(prepare_run(jobs[name], distributed))
                if reference is None:
                    reference = loaded[name].groups(0)
                    warm, timed = timed_groups(len(reference), rounds, warmup, seed)
                elif loaded[name].groups(0) != reference:
                    raise ValueError("the timed runs do not train on the same micro-batches (training set, seed, "
                                     "micro-batch and accumulation must agree): their steps cannot be paired")
                loaded[name].warm_up(warm, timed)
                compute_batch[name] = loaded[name].compute_batch
            for round_index, group in enumerate(timed):
                for name in orders[round_index]:
                    if name in loaded:
                        seconds[name].append(loaded[name].time_step(group))
            if alone:
                loaded.pop(key).free()
        device = str(distributed.device(device_name))
    return {"seconds": seconds, "orders": orders, "groups": [list(g) for g in timed], "rounds": rounds,
            "warmup": warmup, "alone": alone, "compute_batch": compute_batch, "seed": seed, "device": device,
            "threads": torch.get_num_threads(),
            "load_average_1min": {"before": load_before, "after": os.getloadavg()[0]}}


class _Timed:
    """One prepared run, its loop state and memory plan, timed step by step at its own compute batch."""

    def __init__(self, run):
        self.run, self.state, self.plan = run, LoopState(), fresh_memory_plan(run)
        self.compute_batch = self.plan.compute_batch

    def groups(self, epoch: int) -> list[list[list[int]]]:
        """The run's accumulation groups of `epoch` (the trainer's shuffle of that epoch)."""
        run = self.run
        return accumulation_groups(epoch_micro_batches(run.indices, run.recipe["micro_batch"], run.job.spec["seed"],
                                                       epoch), run.recipe["grad_accum"])

    def warm_up(self, warm: list[Group], timed: list[Group]) -> None:
        for epoch, group in dict.fromkeys(timed):  # every timed group's images read once, untimed (image cache)
            group_batches(self.run, epoch, group, self.groups(epoch)[group])
        for group in warm:
            self._step(group)

    def time_step(self, group: Group) -> float:
        _synchronize(self.run.device)
        started = time.perf_counter()
        self._step(group)
        _synchronize(self.run.device)
        return time.perf_counter() - started

    def _step(self, group: Group) -> None:
        epoch, index = group
        optimizer_step(self.run, self.state, self.plan, epoch, index, self.groups(epoch)[index])
        if self.plan.compute_batch != self.compute_batch or self.plan.activation_checkpointing:
            raise RuntimeError(f"{self.run.job.run_id}: out of memory at its own compute batch "
                               f"({self.compute_batch} pairs per forward); it fell back to {self.plan.compute_batch}"
                               f"{' with activation checkpointing' if self.plan.activation_checkpointing else ''}, "
                               "a setting its training does not use: time it on a device with more memory")

    def free(self) -> None:
        device = self.run.device
        del self.run, self.state
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _unprobed(job: TrainJob) -> TrainJob:
    """The job without gradient probes and without a curves writer: its steps alone are timed."""
    from dataclasses import replace
    return replace(job, execution={**job.execution, "grad_probe_every": 0, "loader_workers": 0},
                   curves_dir=None, eval_cache_dir=None)
