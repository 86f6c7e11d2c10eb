"""`hnclip plan`: what a profile costs before it runs, and the SLURM limits the workflow derives from it.

For every job of the profile's DAG that computes (each training run of the registry, each shard of an
auxiliary build and its gather, each evaluation and caption-statistics job, the step timing, the embedded
backbone's pretraining) the plan counts the images it processes, turns them into hours at stated rates,
adds the disk the downloads and the runs' checkpoints take, and finds the critical path: the longest
chain of dependent jobs, the least wall time on any number of GPUs; on N GPUs, `Plan.schedule` (list
scheduling, `schedule`). With a partition limit, a training run that does not fit one allocation is
split into allocations of whole epochs (`split_by_epochs`: `train_part` jobs, then the run's `train`).
The pieces: the rates (`rates`), the settings (`settings`), the model's size
(`model_size`), each job's images, hours, disk and memory (`estimates`) and the printed
text (`printout`).

The accelerator memory each kind of training run needs, and which plan of the out-of-memory ladder fits
24-80 GB cards, comes from the shapes (`accelerator_memory`).

The workflow books each job's SLURM time limit from the same estimate (`Plan.time_limit_min`:
safety_factor x estimate + startup_min, rounded up to 5 minutes, times the attempt, capped at the
partition limit) and the host memory of the model-bound rules from the parameter count
(`Plan.host_mem_mb`). Settings: params.yaml `planning` (or the `hnclip plan` flags).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from itertools import chain

from hnclip.config.registry import Registry
from hnclip.errors import UserError
from hnclip.plan.accelerator_memory import FrameworkMemory, memory_model
from hnclip.plan.estimates import Job, ProfileEstimates
from hnclip.plan.gpu_schedule import Slot, list_schedule
from hnclip.plan.rates import PAPER_MODEL, PAPER_RATES, Rate, read_auxiliary_rates, read_rates
from hnclip.plan.settings import Settings, settings_of

# Rules whose SLURM time limit comes from the plan (workflow/rules/*.smk: `runtime=planned_runtime(...)`).
TRAIN_PART = "train_part"   # a training run's allocation of whole epochs before its last (`--until-epoch`)
PLANNED_RULES = ("train", TRAIN_PART, "auxiliary_segments_shard", "auxiliary_segments", "auxiliary_edges_shard",
                 "auxiliary_edges", "evaluate", "caption_stats", "step_timing", "pretrain_backbone")
# A killed job of these rules resumes on its retry: training from .cache/checkpoints/<run>/last.pt. A shard
# job (256 images) and an evaluation start over.
RESUMABLE_RULES = ("train", TRAIN_PART)


@dataclass
class Plan:
    profile: str
    settings: Settings
    rates: dict[str, Rate]
    parameters: int
    model_config: str
    jobs: dict[str, Job]
    sizes: dict[tuple[str, str], tuple[int | None, str]]
    disk: dict[str, float]                         # what -> GB
    unknown_sizes: list[str] = field(default_factory=list)
    host_mem: dict[str, int] = field(default_factory=dict)
    indicative: bool = False      # paper rates on a profile that is not the paper's setting
    memory: list[FrameworkMemory] = field(default_factory=list)  # accelerator memory per kind of run
    shard_images: int = 256       # images per shard of the auxiliary builds (auxiliary.shard_images)

    def job(self, name: str) -> Job:
        if name not in self.jobs:
            raise UserError(f"hnclip plan: no planned job {name!r} in profile {self.profile!r}")
        return self.jobs[name]

    def limit_min(self, job: Job) -> int:
        """A first attempt's time limit: safety_factor x estimate + startup, up to a multiple of 5 minutes."""
        minutes = self.settings.safety_factor * job.hours * 60 + self.settings.startup_min
        return 5 * math.ceil(minutes / 5)

    def time_limit_min(self, name: str, attempt: int = 1) -> int:
        """What the workflow books for a job's attempt: its limit times the attempt, at most the partition's.
        A job no table asks for (an ad-hoc target, e.g. another benchmark of a run) gets the longest
        limit of its rule's planned jobs."""
        rule, _, key = name.partition(":")
        same_rule = [self.limit_min(job) for job in self.jobs.values() if job.rule == rule]
        if name not in self.jobs and not same_rule and rule.endswith("_shard"):
            same_rule = [self.limit_min(self.full_shard(rule, key))]   # a dataset whose size was unknown
        if name not in self.jobs and not same_rule:
            self.job(name)  # names the unknown job
        limit = (self.limit_min(self.jobs[name]) if name in self.jobs else max(same_rule)) * attempt
        cap = self.settings.partition_limit_min
        return min(limit, cap) if cap else limit

    def full_shard(self, rule: str, key: str) -> Job:
        """A full shard of an auxiliary build the plan could not size (no manifest yet, no Table A1 count: the
        workflow learns its shards from the `dataset` checkpoint, after the plan was made)."""
        kind, dataset = rule.removeprefix("auxiliary_").removesuffix("_shard"), key.partition("/")[0]
        cls = f"{kind}/{dataset}" if f"{kind}/{dataset}" in self.rates else kind
        return Job(rule, key, self.shard_images, self.shard_images / self.rates[cls].per_s / 3600,
                   int(kind == "segments"))

    def host_mem_mb(self) -> dict[str, int]:
        return dict(self.host_mem)

    def over_limit(self) -> list[Job]:
        cap = self.settings.partition_limit_min
        return [job for job in self.jobs.values() if cap and self.limit_min(job) > cap]

    def partition_warnings(self) -> list[str]:
        """One line per job whose limit exceeds the partition limit (none when no limit is set)."""
        jobs, cap = self.over_limit(), self.settings.partition_limit_min
        if not jobs:
            return []
        lines = [f"hnclip plan: {len(jobs)} job(s) need more than the partition limit of {cap} min "
                 f"(planning.partition_limit, --partition-limit); each is booked {cap} min:"]
        for job in jobs:
            need = self.limit_min(job)
            then = (f"not one epoch fits an allocation: it resumes on each retry, {math.ceil(need / cap)} "
                    f"allocations (the SLURM profile's `retries` must allow them)" if job.rule in RESUMABLE_RULES else
                    "does not resume: it will time out; run it on a longer partition")
            lines.append(f"  {job.name}: estimate {job.hours:.1f} h, limit {need} min; {then}")
        return lines

    def schedule(self, gpus: int) -> dict[str, Slot]:
        """When each job runs on `gpus` GPUs (list scheduling, `hnclip.plan.gpu_schedule`)."""
        return list_schedule(self.jobs, gpus)

    def train_parts(self, run_id: str) -> list[int]:
        """The epochs after which a run's allocations end before its last one (none: it trains in one)."""
        return [int(job.key.rpartition("/")[2]) for job in self.jobs.values()
                if job.rule == TRAIN_PART and job.key.rpartition("/")[0] == run_id]

    def critical_path(self) -> list[Job]:
        """The chain of dependent jobs with the most wall-clock hours."""
        longest: dict[str, tuple[float, list[Job]]] = {}

        def ending_at(name: str) -> tuple[float, list[Job]]:
            if name not in longest:
                job = self.jobs[name]
                hours, chain = max((ending_at(dep) for dep in job.after if dep in self.jobs),
                                   key=lambda item: item[0], default=(0.0, []))
                longest[name] = (hours + job.hours, [*chain, job])
            return longest[name]

        return max((ending_at(name) for name in self.jobs), key=lambda item: item[0], default=(0.0, []))[1]


def epochs_per_allocation(job: Job, settings: Settings) -> int:
    """How many of a training run's epochs one allocation holds under the partition limit (its limit, rounded
    up to 5 minutes, at most the limit); the run's epochs where no limit is set or all fit."""
    cap = settings.partition_limit_min
    if not cap or job.rule != "train" or not job.epochs or job.hours <= 0:
        return job.epochs
    epoch_min = settings.safety_factor * job.hours * 60 / job.epochs   # the evaluations spread over the epochs
    return max(0, min(job.epochs, math.floor((5 * (cap // 5) - settings.startup_min) / epoch_min)))


def split_by_epochs(job: Job, settings: Settings) -> list[Job]:
    """A training run over the partition limit as a chain of allocations of whole epochs: `train_part`
    jobs (`hnclip train --until-epoch E`: through epoch E, then exits after its checkpoint) and the
    run's own `train` job for the last epochs, which writes its outputs. A run of which not even one
    epoch fits stays whole (and is reported)."""
    per = epochs_per_allocation(job, settings)
    if per in (0, job.epochs):
        return [job]
    share = 1 / job.epochs
    parts, after = [], job.after
    for until in range(per, job.epochs, per):
        parts.append(Job(TRAIN_PART, f"{job.key}/{until}", round(job.images * share * per),
                         job.gpu_hours * share * per, job.gpus, after,
                         f"epochs {until - per + 1}-{until} of {job.epochs} (--until-epoch {until})", per))
        after = (parts[-1].name,)
    rest = job.epochs - len(parts) * per
    last = replace(job, images=round(job.images * share * rest), gpu_hours=job.gpu_hours * share * rest,
                   after=after, note=f"{job.note}; its last {rest} epoch(s) here, after {len(parts)} part(s)")
    return [*parts, last]


def build_plan(reg: Registry, rates: str | None = None, partition_limit: str | int | None = None,
               auxiliary_rates: str | None = None) -> Plan:
    """The plan of the registry's profile; `rates`, `partition_limit` and `auxiliary_rates` override
    params.yaml `planning`."""
    settings = settings_of(reg, rates, partition_limit, auxiliary_rates)
    recipe = reg.profile["recipe"]
    grouped = recipe.get("compute_batch", recipe["micro_batch"]) > recipe["micro_batch"]
    mode = "compute_batch" if grouped else "accumulate"  # how the trained frameworks' steps run (throughput.py's modes)
    table = PAPER_RATES if settings.rates == "paper" else read_rates(settings.rates, mode,
                                                                     reg.backbone_spec()["model_config"])
    if settings.auxiliary_rates:
        table = {**table, **read_auxiliary_rates(settings.auxiliary_rates)}
    estimates = ProfileEstimates(reg, settings, table)
    jobs = {job.name: job for job in chain.from_iterable(split_by_epochs(job, settings) for job in estimates.jobs())}
    disk, unknown = estimates.disk()
    indicative = settings.rates == "paper" and (reg.backbone_spec()["model_config"] != PAPER_MODEL
                                                or reg.profile["execution"]["device"] == "cpu")
    return Plan(reg.profile_name, settings, table, estimates.parameters, estimates.model_config, jobs, estimates.sizes,
                disk, unknown, estimates.host_mem(), indicative, memory_model(reg), estimates.shard_images)
