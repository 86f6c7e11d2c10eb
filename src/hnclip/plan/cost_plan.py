"""`hnclip plan`: what a profile costs before it runs, and the SLURM limits the workflow derives from it.

For every job of the profile's DAG that computes (each training run of the registry, each auxiliary
build, each evaluation and caption-statistics job) the plan counts the images it processes, turns
them into hours at stated rates, adds the disk the downloads and the runs' checkpoints take, and finds
the critical path: the longest chain of dependent jobs, the least wall time on any number of GPUs.
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
from dataclasses import dataclass, field

from hnclip.config.registry import Registry
from hnclip.errors import UserError
from hnclip.plan.accelerator_memory import FrameworkMemory, memory_model
from hnclip.plan.estimates import Job, ProfileEstimates
from hnclip.plan.rates import PAPER_MODEL, PAPER_RATES, Rate, read_rates
from hnclip.plan.settings import Settings, settings_of

# Rules whose SLURM time limit comes from the plan (workflow/rules/*.smk: `runtime=planned_runtime(...)`).
PLANNED_RULES = ("train", "auxiliary_segments", "auxiliary_edges", "evaluate", "caption_stats")
# A killed job of these rules resumes on its retry: training from .cache/checkpoints/<run>/last.pt, the
# auxiliary builds from their shards (hnclip.auxiliary.shards). An evaluation starts over.
RESUMABLE_RULES = ("train", "auxiliary_segments", "auxiliary_edges")


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
        rule = name.partition(":")[0]
        same_rule = [self.limit_min(job) for job in self.jobs.values() if job.rule == rule]
        if name not in self.jobs and not same_rule:
            self.job(name)  # names the unknown job
        limit = (self.limit_min(self.jobs[name]) if name in self.jobs else max(same_rule)) * attempt
        cap = self.settings.partition_limit_min
        return min(limit, cap) if cap else limit

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
            then = (f"resumes on each retry: {math.ceil(need / cap)} allocations (the SLURM profile's "
                    f"`retries` must allow them)" if job.rule in RESUMABLE_RULES else
                    "does not resume: it will time out; run it on a longer partition")
            lines.append(f"  {job.name}: estimate {job.hours:.1f} h, limit {need} min; {then}")
        return lines

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


def build_plan(reg: Registry, rates: str | None = None, partition_limit: str | int | None = None) -> Plan:
    """The plan of the registry's profile; `rates` and `partition_limit` override params.yaml `planning`."""
    settings = settings_of(reg, rates, partition_limit)
    recipe = reg.profile["recipe"]
    grouped = recipe.get("compute_batch", recipe["micro_batch"]) > recipe["micro_batch"]
    mode = "compute_batch" if grouped else "accumulate"  # how the trained frameworks' steps run (throughput.py's modes)
    table = PAPER_RATES if settings.rates == "paper" else read_rates(settings.rates, mode)
    estimates = ProfileEstimates(reg, settings, table)
    jobs = {job.name: job for job in estimates.jobs()}
    disk, unknown = estimates.disk()
    indicative = settings.rates == "paper" and (reg.backbone_spec()["model_config"] != PAPER_MODEL
                                                or reg.profile["execution"]["device"] == "cpu")
    return Plan(reg.profile_name, settings, table, estimates.parameters, estimates.model_config, jobs, estimates.sizes,
                disk, unknown, estimates.host_mem(), indicative, memory_model(reg))
