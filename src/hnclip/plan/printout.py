"""The text `hnclip plan` prints: rates, dataset sizes, jobs with their hours and time limits, GPU-hours,
peak disk, the critical path, the SLURM settings derived from the plan and the accelerator memory per run."""
from __future__ import annotations

from hnclip.plan.accelerator_memory import format_memory
from hnclip.plan.cost_plan import Plan


def _hours(value: float) -> str:
    return f"{value:,.2f}"


def format_plan(plan: Plan) -> str:
    s, jobs = plan.settings, list(plan.jobs.values())
    out = [f"hnclip plan: profile {plan.profile} ({plan.model_config}, {plan.parameters:,} parameters)", "",
           "Rates (images/s per GPU; auxiliary_edges: per CPU process):"]
    out += [f"  {name:<11} {rate.per_s:8.3g}  {rate.source}" for name, rate in plan.rates.items()]
    if plan.indicative:
        out.append("  (these are rates of Long-CLIP-L on an accelerator; this profile trains another backbone or on "
                   "a CPU: its hours are indicative only; measure with benchmarks/throughput.py and pass --rates)")
    out += ["", "Dataset sizes (images):"]
    out += [f"  {role:<8} {split:<10} {'?' if n is None else f'{n:,}':>7}  {source}"
            for (role, split), (n, source) in sorted(plan.sizes.items())]
    header = f"  {'job':<64} {'images':>9} {'hours':>7} {'limit':>6}  after / detail"
    for rule, title in (("auxiliary_segments", "Auxiliary inputs"), ("auxiliary_edges", None),
                        ("train", "Training runs"), ("caption_stats", "Caption statistics")):
        if title:
            out += ["", f"{title}:", header]
        for job in (j for j in jobs if j.rule == rule):
            detail = "; ".join(filter(None, [job.note, " + ".join(job.after)]))
            out.append(f"  {job.name:<64} {job.images:>9,} {_hours(job.hours):>7} {plan.limit_min(job):>6}  {detail}")
    evaluations = [j for j in jobs if j.rule == "evaluate"]
    encoding = [j for j in evaluations if j.images]
    out += ["", f"Evaluations: {len(evaluations)} jobs, {len(encoding)} encode (zero-shot and transfer cells: "
                f"{sum(j.images for j in encoding):,} images, {_hours(sum(j.hours for j in encoding))} h, "
                f"limits up to {max((plan.limit_min(j) for j in evaluations), default=0)} min); "
                f"the others read their training record"]
    out += ["", "GPU-hours:"]
    for rule in ("train", "auxiliary_segments", "evaluate", "caption_stats"):
        chosen = [j for j in jobs if j.rule == rule]
        out.append(f"  {rule:<20} {len(chosen):>4} jobs {sum(j.images for j in chosen):>12,} images "
                   f"{_hours(sum(j.gpu_hours for j in chosen)):>9} GPU-h")
    total = sum(j.gpu_hours for j in jobs if j.gpus)
    cpu = sum(j.gpu_hours for j in jobs if not j.gpus and j.images)
    out += [f"  {'total':<20} {sum(1 for j in jobs if j.gpus):>4} GPU jobs {_hours(total):>26} GPU-h "
            f"(+ {_hours(cpu)} CPU-process hours of edge maps)"]
    out += ["", "Peak disk (GB; at the end of the run: only resume areas of finished runs are deleted):"]
    out += [f"  {what:<62} {gb:>9,.1f}" for what, gb in plan.disk.items()]
    out.append(f"  {'total':<62} {sum(plan.disk.values()):>9,.1f}")
    if plan.unknown_sizes:
        by_source: dict[str, list[str]] = {}
        for entry in plan.unknown_sizes:
            source, _, name = entry.partition("/")
            by_source.setdefault(source, []).append(name)
        out.append("  not counted (no size in the source table): " +
                   "; ".join(f"{source}: {', '.join(names)}" for source, names in by_source.items()))
    path = plan.critical_path()
    out += ["", f"Critical path ({_hours(sum(j.hours for j in path))} h wall clock, the least on any number of GPUs; "
                f"downloads and dataset builds not counted):"]
    out += [f"  {job.name} ({_hours(job.hours)} h)" for job in path]
    cap = f"{s.partition_limit_min} min" if s.partition_limit_min else "none set"
    out += ["", f"SLURM: time limit = {s.safety_factor:g} x estimate + {s.startup_min:g} min, up to 5 min, "
                f"x attempt; partition limit: {cap} (params.yaml planning, or --partition-limit)",
            "Host memory (mem_mb) of the model-bound rules: " +
            ", ".join(f"{rule} {mb}" for rule, mb in plan.host_mem.items())]
    if plan.memory:
        out += ["", *format_memory(plan.memory)]
    warnings = plan.partition_warnings()
    out += ["", *warnings] if warnings else []
    return "\n".join(out) + "\n"
