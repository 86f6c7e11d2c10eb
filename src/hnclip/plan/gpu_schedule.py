"""The plan's jobs on N GPUs: list scheduling over the DAG (`hnclip plan --gpus N`).

Each job starts as soon as the jobs it waits for have finished and it finds as many free GPUs as it
holds; among the ready jobs the one with the longest chain still ahead of it (itself included, its
"bottom level") starts first, ties by name. A CPU job (no GPU: the edge maps, the gathers) never
waits for a GPU. This is Graham's list scheduling with critical-path priorities: not always optimal,
but never worse than twice the optimum, and the way a workflow engine that starts ready jobs greedily
spends its GPUs (Snakemake with `--resources gpu=N`, a SLURM queue of N GPUs).

The critical path on N GPUs is the chain that set the wall time: from the job that finished last,
back through whichever finished when it started, a job it waited for (`after`) or, where the job
waited for a GPU, the job that freed one.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

from hnclip.errors import UserError
from hnclip.plan.estimates import Job


@dataclass(frozen=True)
class Slot:
    job: Job
    start: float      # hours from the start of the workflow
    end: float
    waited_for: str   # why it started when it did: "after <job>", "a GPU from <job>" or "" (at once)


def bottom_levels(jobs: dict[str, Job]) -> dict[str, float]:
    """Each job's hours plus the longest chain of jobs waiting on it."""
    waiting: dict[str, list[str]] = {name: [] for name in jobs}
    for name, job in jobs.items():
        for dep in job.after:
            if dep in jobs:
                waiting[dep].append(name)
    level: dict[str, float] = {}

    def of(name: str) -> float:
        if name not in level:
            level[name] = jobs[name].hours + max((of(child) for child in waiting[name]), default=0.0)
        return level[name]

    for name in jobs:
        of(name)
    return level


def list_schedule(jobs: dict[str, Job], gpus: int) -> dict[str, Slot]:
    """When each job runs on `gpus` GPUs (hours from the start), by list scheduling."""
    if gpus < 1:
        raise UserError(f"hnclip plan --gpus {gpus}: give at least one GPU")
    too_wide = sorted(name for name, job in jobs.items() if job.gpus > gpus)
    if too_wide:
        raise UserError(f"hnclip plan --gpus {gpus}: {too_wide[0]} needs {jobs[too_wide[0]].gpus} GPUs "
                        f"(execution.gpus_per_run); give at least as many")
    level = bottom_levels(jobs)
    deps = {name: [dep for dep in job.after if dep in jobs] for name, job in jobs.items()}
    left = {name: len(found) for name, found in deps.items()}
    waiting: dict[str, list[str]] = {name: [] for name in jobs}
    for name, found in deps.items():
        for dep in found:
            waiting[dep].append(name)
    ready = [name for name, count in left.items() if count == 0]
    running: list[tuple[float, str]] = []   # (end, name)
    slots: dict[str, Slot] = {}
    free, now, last_freed_by = gpus, 0.0, ""
    while ready or running:
        ready.sort(key=lambda name: (-level[name], name))
        for name in list(ready):
            job = jobs[name]
            if job.gpus <= free:
                free -= job.gpus
                ready.remove(name)
                finished = [dep for dep in deps[name] if slots[dep].end == now]
                why = (f"after {max(finished, key=lambda dep: level[dep])}" if finished and now > 0 else
                       f"a GPU from {last_freed_by}" if now > 0 and job.gpus else "")
                slots[name] = Slot(job, now, now + job.hours, why)
                heapq.heappush(running, (now + job.hours, name))
        if not running:
            break
        now, name = heapq.heappop(running)
        done = [name]
        while running and running[0][0] == now:
            done.append(heapq.heappop(running)[1])
        for name in done:
            free += jobs[name].gpus
            if jobs[name].gpus:
                last_freed_by = name
            for child in waiting[name]:
                left[child] -= 1
                if left[child] == 0:
                    ready.append(child)
    return slots


def wall_hours(slots: dict[str, Slot]) -> float:
    return max((slot.end for slot in slots.values()), default=0.0)


def critical_chain(slots: dict[str, Slot]) -> list[Slot]:
    """The chain of jobs that set the wall time, first to last."""
    if not slots:
        return []
    chain = [max(slots.values(), key=lambda slot: (slot.end, slot.job.name))]
    while chain[-1].waited_for:
        chain.append(slots[chain[-1].waited_for.split(" ")[-1]])
    return chain[::-1]


def span_hours(slots: dict[str, Slot], names: list[str]) -> float:
    """From the first of these jobs starting to the last finishing."""
    chosen = [slots[name] for name in names if name in slots]
    return max(s.end for s in chosen) - min(s.start for s in chosen) if chosen else 0.0
