"""`hnclip plan`: what a profile costs before it runs, and the SLURM limits the workflow derives from it.

For every job of the profile's DAG that computes (each training run of the registry, each auxiliary
build, each evaluation and caption-statistics job) the plan counts the images it processes, turns
them into hours at stated rates, adds the disk the downloads and the runs' checkpoints take, and finds
the critical path: the longest chain of dependent jobs, the least wall time on any number of GPUs.

Images a job processes:
  train               ceil(fraction x training set) x epochs, plus the evaluations it makes while
                      training: its in-domain test sets x (epochs + 1) (the initial weights too)
  auxiliary_segments  the whole training set once (SAM ViT-H masks + CLIP sentence matching, GPU)
  auxiliary_edges     the whole training set once (Canny edge maps, CPU)
  evaluate            the test set once (zero-shot cell) or twice (transfer cell: selected and last
                      weights); an in-domain cell only reads its training record
  caption_stats       the benchmark's test set (captions, at the evaluation rate)
StructXLIP's caption filter (a regex per caption) runs inside its training jobs: no job of its own.

Sizes: a synthetic dataset's from params.yaml; a real one's from its built manifest when present,
else the paper's Table A1 (`hnclip.data.real.PAPER_TABLE_A1`; `hnclip.data.sources` gives the
slightly different counts of the raw files, e.g. 14,575 VG training paragraphs against 14,579).

The workflow books each job's SLURM time limit from the same estimate (`Plan.time_limit_min`:
safety_factor x estimate + startup_min, rounded up to 5 minutes, times the attempt, capped at the
partition limit) and the host memory of the model-bound rules from the parameter count
(`Plan.host_mem_mb`). Settings: params.yaml `planning` (or the `hnclip plan` flags).
"""
from __future__ import annotations

import importlib.util
import json
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from hnclip.config import paths
from hnclip.config.constants import (
    ADAPTER_FRAMEWORKS,
    AUXILIARY_INPUTS,
    CONTEXT_LENGTH,
    DEFAULT_ADAPTER,
    TRAINED_FRAMEWORKS,
)
from hnclip.config.registry import Registry
from hnclip.data.real import PAPER_TABLE_A1
from hnclip.data.source_tables import PUBLIC, profile_source, table_name
from hnclip.errors import UserError
from hnclip.io import read_jsonl

GB = 1e9
# Rules whose SLURM time limit comes from the plan (workflow/rules/*.smk: `runtime=planned_runtime(...)`).
PLANNED_RULES = ("train", "auxiliary_segments", "auxiliary_edges", "evaluate", "caption_stats")
# A killed job of these rules resumes on its retry: training from .cache/checkpoints/<run>/last.pt, the
# auxiliary builds from their shards (hnclip.data.auxiliary.shards). An evaluation starts over.
RESUMABLE_RULES = ("train", "auxiliary_segments", "auxiliary_edges")
# Host memory the process holds before any model: interpreter, torch and (on an accelerator) its runtime.
STARTUP_MEM_MB = {"cpu": 2000, "accelerator": 6000}


@dataclass(frozen=True)
class Rate:
    per_s: float    # images per second on one GPU (auxiliary_edges: one CPU process)
    source: str


_A3 = "paper Table A3 (DCI, 10 epochs, one Ascend 910B, effective batch 128)"
_PLAIN = "assumed equal to plain fine-tuning (Table A3's 55.5 img/s)"
# The default rates: the paper's own measurements where it gives them (Appendix D.1, Table A3), else a
# stated assumption. Rate classes: a run's framework, `full` split by whether it has the token term.
PAPER_RATES = {
    "plain": Rate(55.5, f"{_A3}: Long-CLIP (plain FT), 55.5 img/s"),
    "hnclip": Rate(53.0, f"{_A3}: HN-CLIP, 53 img/s (full-framework runs with the token term)"),
    "goal": Rate(22.0, f"{_A3}: GOAL, about 22 img/s (its released double forward included)"),
    "structxlip": Rate(10.0, f"{_A3}: StructXLIP, about 10 img/s"),
    "finelip": Rate(55.5, f"{_PLAIN}: Table A3 gives no FineLIP figure (it ran in parallel)"),
    "lora": Rate(55.5, f"{_PLAIN}: not in Table A3; adapters skip the weight gradients only"),
    "dora": Rate(55.5, f"{_PLAIN}: not in Table A3"),
    "evaluate": Rate(55.5, f"{_PLAIN}: a forward is about a third of a training step, but evaluation "
                           "encodes in fp32 (training: bf16 autocast)"),
    "segments": Rate(1 / 8.6, "assumed 8.6 s per image: SAM ViT-H automatic masks (32x32 points) take 8.35 s "
                              "on an A100 (meta-pytorch/segment-anything-fast#76; 5-6 s on an RTX 3090, "
                              "facebookresearch/segment-anything#61), plus 0.25 s of CLIP-L/14-336 matching"),
    "edges": Rate(10.0, "assumed: Canny maps of an image and its two top crops, PNG writes, one CPU process"),
}
PAPER_MODEL = "ViT-L-14-quickgelu"   # Long-CLIP-L's architecture: what the paper's rates were measured on
# With a rates file, a class it does not measure is its plain rate times the paper's ratio (auxiliary
# builds run other models: they keep the defaults above).
SCALED_FROM_PLAIN = ("hnclip", "goal", "structxlip", "finelip", "lora", "dora", "evaluate")


@dataclass(frozen=True)
class Settings:
    rates: str = "paper"              # `paper` (PAPER_RATES) or a JSON-lines file of benchmarks/throughput.py
    safety_factor: float = 1.5
    startup_min: float = 15.0         # start, backbone load, data indexing, checkpoint writes
    partition_limit_min: int | None = None   # the longest time limit the partition allows
    concurrent_runs: int = 1          # runs training at once, each holding its resume area while it trains


@dataclass(frozen=True)
class Job:
    rule: str
    key: str
    images: int
    gpu_hours: float        # at the rates; a CPU job's: process-hours
    gpus: int               # accelerators it holds (0: a CPU job)
    after: tuple[str, ...] = ()   # the planned jobs it waits for
    note: str = ""

    @property
    def name(self) -> str:
        return f"{self.rule}:{self.key}"

    @property
    def hours(self) -> float:
        """Wall-clock hours (a run spread over several GPUs divides its GPU-hours)."""
        return self.gpu_hours / max(self.gpus, 1)


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


# ---- settings and rates ---------------------------------------------------------------------------
def parse_minutes(text: str | int) -> int:
    """A time limit in minutes, written as SLURM's --time: minutes, minutes:seconds, hours:minutes:seconds,
    days-hours, days-hours:minutes or days-hours:minutes:seconds (`2880`, `48:00:00`, `2-00:00:00`)."""
    value = str(text).strip()
    if not re.fullmatch(r"(\d+-)?\d+(:\d+){0,2}", value):
        raise UserError(f"partition limit {value!r}: give minutes (2880) or SLURM's D-HH:MM:SS (2-00:00:00)")
    days, _, clock = value.rpartition("-")
    numbers = [int(part) for part in clock.split(":")]
    if days:
        hours, minutes, seconds = (numbers + [0, 0])[:3]
    elif len(numbers) == 3:
        hours, minutes, seconds = numbers
    else:
        hours, (minutes, seconds) = 0, (numbers + [0])[:2]
    return int(days or 0) * 1440 + hours * 60 + minutes + math.ceil(seconds / 60)


def read_rates(path: str | Path, mode: str) -> dict[str, Rate]:
    """The default rates with those a throughput file (benchmarks/throughput.py's JSON lines) measures.
    Per method the last line in the profile's `mode` (accumulate / compute_batch) wins, else the last
    line of any mode; a class it does not measure is its plain rate x the paper's ratio."""
    try:
        rows = read_jsonl(path)
    except FileNotFoundError:
        raise UserError(f"rates file {path} not found; write one with benchmarks/throughput.py") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"rates file {path}: not JSON lines ({exc})") from None
    chosen: dict[str, dict] = {}
    for row in rows:
        method = row.get("method")
        if method not in PAPER_RATES or not row.get("img_per_s"):
            continue
        previous = chosen.get(method)
        if previous is not None and previous.get("mode", mode) == mode and row.get("mode", mode) != mode:
            continue  # a line in the profile's mode is kept over a later one in another mode
        chosen[method] = row
    if not chosen:
        raise UserError(f"rates file {path}: no line has a `method` of {sorted(PAPER_RATES)} and an `img_per_s`")
    rates = dict(PAPER_RATES)
    for method, row in chosen.items():
        where = ", ".join(str(v) for v in (row.get("mode"), row.get("shapes", {}).get("model"),
                                           row.get("device_name") or row.get("device"),
                                           str(row.get("timestamp", ""))[:10]) if v)
        rates[method] = Rate(float(row["img_per_s"]), f"{path}: {method} ({where})")
    if "plain" in chosen:
        plain = rates["plain"].per_s
        for cls in SCALED_FROM_PLAIN:
            if cls not in chosen:
                ratio = PAPER_RATES[cls].per_s / PAPER_RATES["plain"].per_s
                rates[cls] = Rate(plain * ratio, f"{path}: plain x {ratio:.3g} (Table A3's {cls} / plain ratio)")
    return rates


# ---- model size ---------------------------------------------------------------------------------
def model_config(name: str) -> dict:
    """An open_clip model config: this package's (hnclip/models/configs) or open_clip's own, read
    without importing torch."""
    folders = [Path(importlib.util.find_spec("hnclip.models").origin).parent / "configs"]
    spec = importlib.util.find_spec("open_clip")
    if spec and spec.submodule_search_locations:
        folders.append(Path(next(iter(spec.submodule_search_locations))) / "model_configs")
    for folder in folders:
        if (folder / f"{name}.json").is_file():
            return json.loads((folder / f"{name}.json").read_text())
    raise UserError(f"model config {name!r} not found in {[str(f) for f in folders]}")


def _block_parameters(width: int, hidden: int) -> int:
    """One open_clip residual block: attention (in_proj, out_proj), MLP (c_fc, c_proj), two LayerNorms."""
    return 4 * width * width + 4 * width + 2 * width * hidden + hidden + width + 4 * width


def clip_parameters(cfg: dict, context_length: int = CONTEXT_LENGTH) -> int:
    """Parameters of an open_clip CLIP (ViT image tower, transformer text tower) at Long-CLIP's context."""
    vision, text, embed = cfg["vision_cfg"], cfg["text_cfg"], cfg["embed_dim"]
    width, tokens = vision["width"], (vision["image_size"] // vision["patch_size"]) ** 2 + 1
    hidden = int(width * vision.get("mlp_ratio", 4.0))
    image_tower = (3 * vision["patch_size"] ** 2 * width + width + tokens * width + 4 * width
                   + vision["layers"] * _block_parameters(width, hidden) + width * embed)
    width = text["width"]
    hidden = int(width * text.get("mlp_ratio", 4.0))
    text_tower = ((text["vocab_size"] + context_length) * width + 2 * width
                  + text["layers"] * _block_parameters(width, hidden) + width * embed)
    return image_tower + text_tower + 1  # + the logit scale


def adapter_parameters(cfg: dict, kind: str, r: int = DEFAULT_ADAPTER["r"]) -> int:
    """LoRA/DoRA parameters on q, k, v, out and both MLP projections of every block of both towers
    (hnclip.models.adapters); DoRA adds one magnitude per output feature."""
    total = 0
    for tower in (cfg["vision_cfg"], cfg["text_cfg"]):
        width = tower["width"]
        hidden = int(width * tower.get("mlp_ratio", 4.0))
        lora = 4 * r * 2 * width + 2 * r * (width + hidden)
        total += tower["layers"] * (lora + (5 * width + hidden if kind == "dora" else 0))
    return total


# ---- the plan -----------------------------------------------------------------------------------
def rate_class(spec: dict) -> str:
    objective = spec["objective"]
    if objective["framework"] == "full":
        return "hnclip" if float(objective.get("lambda_tok", 0)) > 0 else "plain"
    return objective["framework"]


def evaluation_encodes(reg: Registry, run_id: str, benchmark: str) -> bool:
    """Does `hnclip evaluate` encode (hnclip.steps.evaluate)? For the zero-shot backbone and for benchmarks
    outside the run's training-time evaluation; otherwise it selects from the training record."""
    return reg.is_zeroshot(run_id) or benchmark not in reg.eval_benchmarks(reg.run(run_id).train_set)


def dataset_size(reg: Registry, role: str, split: str) -> tuple[int | None, str]:
    """(images, where the number comes from) of a dataset role's split; None where nothing says."""
    spec = reg.profile["datasets"][role]
    if spec["kind"] == "synthetic":  # Long-DCI's stand-in shares the test images
        return spec["sizes"].get(split, spec["sizes"].get("test") if split == "test_long" else None), "params.yaml"
    manifest = paths.manifest(reg.profile["data_root"], role, split)
    if manifest.is_file():
        with open(manifest, encoding="utf-8") as rows:
            return sum(1 for line in rows if line.strip()), str(manifest)
    if table_name(reg.profile) == PUBLIC and split in PAPER_TABLE_A1.get(role, {}):
        return PAPER_TABLE_A1[role][split], "paper Table A1"
    return None, "unknown until the dataset is built"


class _Builder:
    def __init__(self, reg: Registry, settings: Settings, rates: dict[str, Rate]):
        self.reg, self.settings, self.rates = reg, settings, rates
        self.sizes: dict[tuple[str, str], tuple[int | None, str]] = {}
        backbone = reg.backbone_spec()
        self.model_config = backbone["model_config"]
        self.cfg = model_config(self.model_config)
        self.parameters = clip_parameters(self.cfg)

    def size(self, role: str, split: str) -> int:
        if (role, split) not in self.sizes:
            self.sizes[role, split] = dataset_size(self.reg, role, split)
        return self.sizes[role, split][0] or 0

    def test_size(self, benchmark: str) -> int:
        test = self.reg.params["benchmarks"][benchmark]["test"]
        return self.size(test["dataset"], test["split"])

    def hours(self, images: int, cls: str) -> float:
        return images / self.rates[cls].per_s / 3600

    def jobs(self) -> list[Job]:
        reg, jobs = self.reg, []
        for train_set, kind in reg.auxiliary_builds():
            images = self.size(train_set, "train")
            after = (f"auxiliary_segments:{train_set}",) if kind == "edges" else ()
            jobs.append(Job(f"auxiliary_{kind}", train_set, images, self.hours(images, kind), int(kind == "segments"),
                            after, f"{images:,} images at {kind}"))
        for run_id, run in sorted(reg.runs().items()):
            jobs.append(self.train_job(run_id, run.spec))
        for run_id, benchmark in reg.evaluations():
            zeroshot = reg.is_zeroshot(run_id)
            copies = 1 if zeroshot else 2 if evaluation_encodes(reg, run_id, benchmark) else 0
            images = copies * self.test_size(benchmark)
            jobs.append(Job("evaluate", f"{run_id}/{benchmark}", images, self.hours(images, "evaluate"),
                            int(copies > 0), () if zeroshot else (f"train:{run_id}",),
                            "reads the training record" if not copies else f"{copies} x {images // copies:,} images"))
        for benchmark in reg.params["benchmarks"]:
            images = self.test_size(benchmark)
            jobs.append(Job("caption_stats", benchmark, images, self.hours(images, "evaluate"), 1))
        return jobs

    def train_job(self, run_id: str, spec: dict) -> Job:
        recipe, framework = spec["recipe"], spec["objective"]["framework"]
        per_epoch = math.ceil(spec["fraction"] * self.size(spec["train_set"], "train") - 1e-9)
        evaluated = sum(self.test_size(b) for b in self.reg.eval_benchmarks(spec["train_set"]))
        trained, evals = per_epoch * recipe["epochs"], evaluated * (recipe["epochs"] + 1)
        cls = rate_class(spec)
        # torchrun spreads the HN-CLIP objective's runs over gpus_per_run GPUs; baselines train in one process
        gpus = self.reg.profile["execution"].get("gpus_per_run", 1) if framework in TRAINED_FRAMEWORKS else 1
        return Job("train", run_id, trained + evals, self.hours(trained, cls) + self.hours(evals, "evaluate"), gpus,
                   tuple(f"auxiliary_{kind}:{spec['train_set']}" for kind in AUXILIARY_INPUTS.get(framework, ())),
                   f"{per_epoch:,} x {recipe['epochs']} epochs at {cls} + {evals:,} evaluated")

    # ---- disk and memory ------------------------------------------------------------------------
    def run_disk_gb(self, spec: dict) -> tuple[float, float, float]:
        """(outputs, resume area while training, what stays of it after) of a run. Outputs: model.pt and
        model_selected.pt. The resume area .cache/checkpoints/<run>/: last.pt (the weights, or an adapter
        run's adapters, and AdamW's two moments), the selected epoch's weights and, with keep_epoch_weights,
        every epoch's; once the run has finished only those epochs' weights stay, unless
        keep_resume_checkpoints keeps all of it (`training.outputs.clear_resume_area`)."""
        framework = spec["objective"]["framework"]
        execution = self.reg.profile["execution"]
        weights = 4 * self.parameters
        trainable = adapter_parameters(self.cfg, framework) if framework in ADAPTER_FRAMEWORKS else self.parameters
        last = (4 * trainable if framework in ADAPTER_FRAMEWORKS else weights) + 8 * trainable
        kept_epochs = spec["recipe"]["epochs"] * weights if execution.get("keep_epoch_weights") else 0
        area = last + weights + kept_epochs
        stays = area if execution.get("keep_resume_checkpoints") else kept_epochs
        return 2 * weights / GB, area / GB, stays / GB

    def disk(self) -> tuple[dict[str, float], list[str]]:
        reg = self.reg
        used = [*reg.profile["datasets"].values(), reg.backbone_spec()]
        if reg.auxiliary_builds():  # the segmenter's and the matcher's weights
            used += [entry for entry in reg.profile.get("auxiliary", {}).values() if isinstance(entry, dict)]
        sources = {entry["source"] for entry in used if entry.get("source")}
        downloads, unknown = 0.0, []
        for source in sorted(sources):
            for entry in profile_source(reg.profile, source).files:
                if entry.size is None:
                    unknown.append(f"{source}/{entry.name}")
                else:  # an archive is kept beside its unpacked copy
                    downloads += entry.size * (2 if entry.is_archive else 1) / GB
        runs = [self.run_disk_gb(run.spec) for run in reg.runs().values()]
        checkpoint = 12 * self.parameters / GB if runs else 0.0  # a full run's last.pt: weights + AdamW moments
        training = sorted((area for _, area, _ in runs), reverse=True)[:self.settings.concurrent_runs]
        return {"downloads (archives counted twice: kept and unpacked)": downloads,
                f"run outputs ({len(runs)} x model.pt + model_selected.pt)": sum(out for out, _, _ in runs),
                f"resume areas of {self.settings.concurrent_runs} run(s) training (concurrent_runs)": sum(training),
                "resume areas kept after training (keep_*)": sum(stays for _, _, stays in runs),
                "one checkpoint being replaced (atomic write)": checkpoint}, unknown

    def host_mem(self) -> dict[str, int]:
        """Host RAM (MB) of the model-bound rules: startup + safety x (model copies + one batch of pixels).
        train: the loaded weights twice (checkpoint, model) and its checkpoint payload twice (host copy,
        serialisation); encoding (evaluate, caption_stats): the weights twice."""
        execution, recipe = self.reg.profile["execution"], self.reg.profile["recipe"]
        startup = STARTUP_MEM_MB["cpu" if execution["device"] == "cpu" else "accelerator"]
        weights, image = 4 * self.parameters, 3 * self.cfg["vision_cfg"]["image_size"] ** 2 * 4
        batch = recipe.get("compute_batch", recipe["micro_batch"]) * image
        train = 2 * weights + 2 * (weights + 8 * self.parameters) + batch
        encode = 2 * weights + execution["eval_batch_size"] * image

        def mb(nbytes: int) -> int:
            return 1000 * math.ceil((startup + self.settings.safety_factor * nbytes / 1e6) / 1000)
        return {"train": mb(train), "evaluate": mb(encode), "caption_stats": mb(encode)}


def settings_of(reg: Registry, rates: str | None = None, partition_limit: str | int | None = None) -> Settings:
    """params.yaml `planning` (`partition_limit`: minutes or D-HH:MM:SS), overridden by the arguments."""
    raw = dict(reg.params.get("planning", {}))
    limit = raw.pop("partition_limit", None) if partition_limit is None else partition_limit
    raw.pop("partition_limit", None)
    settings = Settings(**raw, partition_limit_min=None if limit in (None, "") else parse_minutes(limit))
    return replace(settings, rates=rates) if rates else settings


def build_plan(reg: Registry, rates: str | None = None, partition_limit: str | int | None = None) -> Plan:
    """The plan of the registry's profile; `rates` and `partition_limit` override params.yaml `planning`."""
    settings = settings_of(reg, rates, partition_limit)
    recipe = reg.profile["recipe"]
    grouped = recipe.get("compute_batch", recipe["micro_batch"]) > recipe["micro_batch"]
    mode = "compute_batch" if grouped else "accumulate"  # how the trained frameworks' steps run (throughput.py's modes)
    table = PAPER_RATES if settings.rates == "paper" else read_rates(settings.rates, mode)
    builder = _Builder(reg, settings, table)
    jobs = {job.name: job for job in builder.jobs()}
    disk, unknown = builder.disk()
    indicative = settings.rates == "paper" and (reg.backbone_spec()["model_config"] != PAPER_MODEL
                                                or reg.profile["execution"]["device"] == "cpu")
    return Plan(reg.profile_name, settings, table, builder.parameters, builder.model_config, jobs, builder.sizes,
                disk, unknown, builder.host_mem(), indicative)


# ---- the report ---------------------------------------------------------------------------------
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
    warnings = plan.partition_warnings()
    out += ["", *warnings] if warnings else []
    return "\n".join(out) + "\n"
