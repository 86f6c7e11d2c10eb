"""The text `hnclip plan` prints: rates, dataset sizes, jobs with their hours and time limits, GPU-hours,
peak disk, the critical path, the SLURM settings derived from the plan and the accelerator memory per run."""
from __future__ import annotations

from hnclip.plan.accelerator_memory import format_memory
from hnclip.plan.cost_plan import Plan
from hnclip.plan.gpu_schedule import critical_chain, span_hours, wall_hours


def _hours(value: float) -> str:
    return f"{value:,.2f}"


def format_schedule(plan: Plan, gpus: int) -> list[str]:
    """The wall time and critical path on `gpus` GPUs, and each segment build's span against its one-GPU time."""
    slots = plan.schedule(gpus)
    chain = critical_chain(slots)
    out = [f"On {gpus} GPU(s): {_hours(wall_hours(slots))} h wall clock (list scheduling over the DAG, longest "
           f"remaining chain first; CPU jobs never wait for a GPU). Critical path:"]
    runs: list[list] = []   # consecutive shards of one build: one line
    for slot in chain:
        build = slot.job.name.rpartition("/")[0] if slot.job.rule.endswith("_shard") else slot.job.name
        if runs and runs[-1][0] == build:
            runs[-1][1].append(slot)
        else:
            runs.append([build, [slot]])
    for build, slots_of in runs:
        first, last = slots_of[0], slots_of[-1]
        name = first.job.name if len(slots_of) == 1 else f"{build}/* ({len(slots_of)} shards in turn)"
        out.append(f"  {name} ({_hours(first.start)}-{_hours(last.end)} h"
                   f"{'; ' + first.waited_for if first.waited_for else ''})")
    for gather in (j for j in plan.jobs.values() if j.rule == "auxiliary_segments"):
        shards = [plan.jobs[name] for name in gather.after]
        one_gpu = sum(j.hours for j in shards)
        bound = one_gpu / gpus + max(j.hours for j in shards)
        rate = shards[0].note.rpartition(" at ")[2]
        out.append(f"  segments of {gather.key}: {len(shards)} shards, {_hours(one_gpu)} h on one GPU at "
                   f"{rate} ({plan.rates[rate].per_s:.3g} img/s, {plan.rates[rate].kind}); "
                   f"{_hours(span_hours(slots, list(gather.after)))} h here "
                   f"(one-GPU time / {gpus} + one shard: {_hours(bound)} h)")
    return out


def format_plan(plan: Plan, gpus: int | None = None) -> str:
    s, jobs = plan.settings, list(plan.jobs.values())
    out = [f"hnclip plan: profile {plan.profile} ({plan.model_config}, {plan.parameters:,} parameters)", "",
           "Rates (images/s per GPU; edges, gather: per CPU process; measured, paper, assumed or scaled):"]
    out += [f"  {name:<14} {rate.per_s:8.3g}  {rate.kind:<8}  {rate.source}" for name, rate in plan.rates.items()]
    if plan.indicative:
        out.append("  (these are rates of Long-CLIP-L on an accelerator; this profile trains another backbone or on "
                   "a CPU: its hours are indicative only; measure with benchmarks/throughput.py and pass --rates)")
    out += ["", "Dataset sizes (images):"]
    out += [f"  {role:<8} {split:<10} {'?' if n is None else f'{n:,}':>7}  {source}"
            for (role, split), (n, source) in sorted(plan.sizes.items())]
    header = f"  {'job':<64} {'images':>9} {'hours':>7} {'limit':>6}  after / detail"
    out += ["", "Auxiliary inputs (each shard its own job; a gather assembles the index):", header]
    gathers = [j for j in jobs if j.rule in ("auxiliary_segments", "auxiliary_edges")]
    for gather in sorted(gathers, key=lambda j: (j.key, j.rule != "auxiliary_segments")):
        shards = [plan.jobs[name] for name in gather.after]
        first, last = shards[0], shards[-1]
        name = f"{first.name}..{last.key.rpartition('/')[2]}"
        out.append(f"  {name:<64} {sum(j.images for j in shards):>9,} {_hours(first.hours):>7} "
                   f"{plan.limit_min(first):>6}  {len(shards)} jobs, each {first.note}"
                   + (f" (the last {last.images:,})" if last.images != first.images else "")
                   + "".join(f"; after {dep}" for dep in first.after))
        out.append(f"  {gather.name:<64} {gather.images:>9,} {_hours(gather.hours):>7} {plan.limit_min(gather):>6}  "
                   f"{gather.note}")
    for rule, title in (("train", "Training runs"), ("caption_stats", "Caption statistics")):
        if title:
            out += ["", f"{title}:", header]
        for job in (j for j in jobs if j.rule in (rule, f"{rule}_part")):  # a run's allocations, then the run
            detail = "; ".join(filter(None, [job.note, " + ".join(job.after)]))
            out.append(f"  {job.name:<64} {job.images:>9,} {_hours(job.hours):>7} {plan.limit_min(job):>6}  {detail}")
    evaluations = [j for j in jobs if j.rule == "evaluate"]
    encoding = [j for j in evaluations if j.images]
    out += ["", f"Evaluations: {len(evaluations)} jobs, {len(encoding)} encode (zero-shot and transfer cells: "
                f"{sum(j.images for j in encoding):,} images, {_hours(sum(j.hours for j in encoding))} h, "
                f"limits up to {max((plan.limit_min(j) for j in evaluations), default=0)} min); "
                f"the others read their training record"]
    out += ["", "GPU-hours:"]
    for rule in ("train", "auxiliary_segments_shard", "evaluate", "caption_stats", "step_timing", "pretrain_backbone"):
        chosen = [j for j in jobs if j.rule in (rule, f"{rule}_part")]   # train: its parts too
        if rule in ("step_timing", "pretrain_backbone") and not any(j.gpus for j in chosen):
            continue   # none, or a CPU job (the embedded backbone's pretraining): in the CPU hours below
        out.append(f"  {rule:<24} {len(chosen):>4} jobs {sum(j.images for j in chosen):>12,} images "
                   f"{_hours(sum(j.gpu_hours for j in chosen)):>9} GPU-h")
    total = sum(j.gpu_hours for j in jobs if j.gpus)
    pretraining = ", pretraining" if any(j.rule == "pretrain_backbone" and not j.gpus for j in jobs) else ""
    cpu = sum(j.gpu_hours for j in jobs if not j.gpus and j.images)
    out += [f"  {'total':<24} {sum(1 for j in jobs if j.gpus):>4} GPU jobs {_hours(total):>26} GPU-h "
            f"(+ {_hours(cpu)} CPU-process hours: edge maps, gathers{pretraining})"]
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
    if gpus:
        out += ["", *format_schedule(plan, gpus)]
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
