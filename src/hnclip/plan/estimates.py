"""What each computing job of a profile costs: the images it processes and its hours at the rates,
the disk the downloads and the runs' checkpoints take, and the host memory of the model-bound rules.

Images a job processes:
  train               ceil(fraction x training set) x epochs, plus the evaluations it makes while
                      training: its in-domain test sets x (epochs + 1) (the initial weights too)
  auxiliary_segments_shard  one shard (256 images) of the training set (SAM ViT-H masks + CLIP sentence
                      matching, GPU); auxiliary_segments gathers the shards into the index (CPU)
  auxiliary_edges_shard     one shard of Canny edge maps (CPU); auxiliary_edges gathers them
  evaluate            the test set once (zero-shot cell) or twice (transfer cell: selected and last
                      weights); an in-domain cell only reads its training record
  caption_stats       the benchmark's test set (captions, at the evaluation rate)
StructXLIP's caption filter (a regex per caption) runs inside its training jobs: no job of its own.

Sizes: a synthetic dataset's from params.yaml; a real one's from its built manifest when present,
else the paper's Table A1 (`hnclip.data.real.PAPER_TABLE_A1`; `hnclip.data.sources` gives the
slightly different counts of the raw files, e.g. 14,575 VG training paragraphs against 14,579).
"""
from __future__ import annotations

import configparser
import math
from dataclasses import dataclass
from pathlib import Path

from hnclip.auxiliary.shards import DEFAULT_SHARD_ITEMS, shard_count
from hnclip.config import paths
from hnclip.config.constants import ADAPTER_FRAMEWORKS, AUXILIARY_INPUTS, TRAINED_FRAMEWORKS
from hnclip.config.registry import Registry
from hnclip.data.real import PAPER_TABLE_A1
from hnclip.data.source_tables import PUBLIC, profile_source, table_name
from hnclip.plan.model_size import adapter_parameters, clip_parameters, model_config
from hnclip.plan.rates import Rate, rate_class
from hnclip.plan.settings import Settings

GB = 1e9
KEPT_AFTER_TRAINING = "disk left after training (keep_*)"
# Assumed sizes (nobody measured them): a matched crop is about a sixth of a ~1.5 MP photo, ~0.5 MB as a PNG,
# about four matched candidates (the full image among them) per image; an edge map and its two crops are
# 0/255 'L' PNGs, which compress well.
CROP_PNG_MB_PER_IMAGE = 2.0
EDGE_PNG_MB_PER_IMAGE = 0.15
# DVC's cache types that store an output once (a link to the cache object). A list with `copy`, DVC's default
# `reflink,copy` among them (iterative/dvc#1841: DEFAULT_CACHE_TYPES), copies wherever the filesystem has no
# reflinks (ext4): counted as a second copy, the safe side.
LINKED_CACHE_TYPES = {"reflink", "hardlink", "symlink"}
STEP_TIMING_KEY = "paired"   # the one step_timing job (its rule has no wildcards)
# = hnclip.data.loader.DEFAULT_IMAGE_CACHE_MB (that module imports torch; tests/test_plan_cluster.py holds them equal)
DEFAULT_IMAGE_CACHE_MB = 1024
# A loader worker's own process (interpreter, torch, PIL), beside its image cache: assumed, not measured.
WORKER_MB = 500
# Host memory the process holds before any model: interpreter, torch and (on an accelerator) its runtime.
STARTUP_MEM_MB = {"cpu": 2000, "accelerator": 6000}


@dataclass(frozen=True)
class Job:
    rule: str
    key: str
    images: int
    gpu_hours: float        # at the rates; a CPU job's: process-hours
    gpus: int               # accelerators it holds (0: a CPU job)
    after: tuple[str, ...] = ()   # the planned jobs it waits for
    note: str = ""
    epochs: int = 0         # a training run's epochs (what an allocation may be split by)

    @property
    def name(self) -> str:
        return f"{self.rule}:{self.key}"

    @property
    def hours(self) -> float:
        """Wall-clock hours (a run spread over several GPUs divides its GPU-hours)."""
        return self.gpu_hours / max(self.gpus, 1)


def dvc_cache_type(project: Path = Path(".")) -> tuple[str, bool]:
    """(DVC's cache.type of the project (.dvc/config.local over .dvc/config), does it store outputs once?).
    Unset is DVC's default `reflink,copy`: a copy wherever reflinks are unavailable."""
    parser = configparser.ConfigParser()
    parser.read([project / ".dvc" / "config", project / ".dvc" / "config.local"])
    cache_type = parser.get("cache", "type", fallback="reflink,copy (DVC's default)")
    types = [t.strip() for t in cache_type.split("(")[0].split(",") if t.strip()]
    return cache_type, "copy" not in types and bool(set(types) & LINKED_CACHE_TYPES)


def shard_sizes(items: int, shard_items: int) -> list[int]:
    """The items of each shard of an auxiliary build (`hnclip.auxiliary.shards`: fixed blocks of
    shard_items; the last one holds the rest)."""
    return [min(shard_items, items - k * shard_items) for k in range(shard_count(items, shard_items))]


def evaluation_encodes(reg: Registry, run_id: str, benchmark: str) -> bool:
    """Does `hnclip evaluate` encode (hnclip.commands.evaluate)? For the zero-shot backbone and for benchmarks
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


class ProfileEstimates:
    """The estimates of one profile at given rates; dataset sizes are looked up once and kept in `sizes`."""

    def __init__(self, reg: Registry, settings: Settings, rates: dict[str, Rate]):
        self.reg, self.settings, self.rates = reg, settings, rates
        self.sizes: dict[tuple[str, str], tuple[int | None, str]] = {}
        backbone = reg.backbone_spec()
        self.model_config = backbone["model_config"]
        self.cfg = model_config(self.model_config)
        self.parameters = clip_parameters(self.cfg)

    @property
    def shard_images(self) -> int:
        """`hnclip auxiliary <kind> --shard K`'s blocks (hnclip.commands.auxiliary.shard_items)."""
        return int(self.reg.profile.get("auxiliary", {}).get("shard_images", DEFAULT_SHARD_ITEMS))

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
            jobs += self.auxiliary_jobs(train_set, kind)
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
        jobs += self.pretrain_jobs() + self.step_timing_jobs()
        return jobs

    def pretrain_jobs(self) -> list[Job]:
        """The backbone pretrained here (the embedded profiles' own; the paper profile downloads Long-CLIP)."""
        spec = self.reg.backbone_spec()
        if "pretrain" not in spec:
            return []
        pre = spec["pretrain"]
        images = pre["sizes"]["train"] * pre["epochs"]
        return [Job("pretrain_backbone", self.reg.backbone_name(), images, self.hours(images, "pretrain"),
                    int(self.reg.profile["execution"]["device"] != "cpu"), (),
                    f"{pre['sizes']['train']:,} x {pre['epochs']} epochs at pretrain")]

    def step_timing_jobs(self) -> list[Job]:
        """The timing claims' measurement: each timed run's warm-up and timed optimizer steps, in turn."""
        timing = self.reg.paired_timing()
        if not timing:
            return []
        images, hours, after = 0, 0.0, set()
        for run_id in timing["runs"].values():
            spec = self.reg.run(run_id).spec
            step = spec["recipe"]["micro_batch"] * spec["recipe"].get("grad_accum", 1)
            steps = timing["rounds"] + timing["warmup"]
            images, hours = images + steps * step, hours + self.hours(steps * step, rate_class(spec))
            after |= {f"auxiliary_{kind}:{spec['train_set']}"
                      for kind in AUXILIARY_INPUTS.get(spec["objective"]["framework"], ())}
        return [Job("step_timing", STEP_TIMING_KEY, images, hours, 1, tuple(sorted(after)),
                    f"{len(timing['runs'])} runs x {timing['rounds'] + timing['warmup']} steps")]

    def auxiliary_jobs(self, train_set: str, kind: str) -> list[Job]:
        """An auxiliary build's shard jobs (each its own job: GPUs build them side by side) and the gather
        that assembles the index from them. Edge maps read the gathered segments."""
        shard_images, images = self.shard_images, self.size(train_set, "train")
        after = (f"auxiliary_segments:{train_set}",) if kind == "edges" else ()
        cls = f"{kind}/{train_set}" if f"{kind}/{train_set}" in self.rates else kind  # a measured size, if any
        shards = [Job(f"auxiliary_{kind}_shard", f"{train_set}/{k:05d}", n, self.hours(n, cls),
                      int(kind == "segments"), after, f"{n:,} images at {cls}")
                  for k, n in enumerate(shard_sizes(images, shard_images))]
        gather = Job(f"auxiliary_{kind}", train_set, images, self.hours(images, "gather"), 0,
                     tuple(job.name for job in shards),
                     f"gathers {len(shards)} shard(s) of up to {shard_images} images ({images:,} rows)")
        return [*shards, gather]

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
                   f"{per_epoch:,} x {recipe['epochs']} epochs at {cls} + {evals:,} evaluated", recipe["epochs"])

    # ---- disk and memory ------------------------------------------------------------------------
    def run_disk_gb(self, spec: dict) -> tuple[float, float, float]:
        """(outputs, resume area while training, what stays of it after) of a run. Outputs: model.pt and
        model_selected.pt. The resume area .cache/checkpoints/<run>/: last.pt and previous.pt (each the
        weights, or an adapter run's adapters, and AdamW's two moments: the previous is kept until the new
        one is complete, `training.checkpoint`), the selected epoch's weights of each of the two and, with
        keep_epoch_weights, every epoch's; once the run has finished only those epochs' weights stay,
        unless keep_resume_checkpoints keeps all of it (`training.outputs.clear_resume_area`)."""
        framework = spec["objective"]["framework"]
        execution = self.reg.profile["execution"]
        weights = 4 * self.parameters
        trainable = adapter_parameters(self.cfg, framework) if framework in ADAPTER_FRAMEWORKS else self.parameters
        last = (4 * trainable if framework in ADAPTER_FRAMEWORKS else weights) + 8 * trainable
        kept_epochs = spec["recipe"]["epochs"] * weights if execution.get("keep_epoch_weights") else 0
        area = 2 * (last + weights) + kept_epochs
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
        training = sorted(runs, key=lambda run: run[1], reverse=True)[:self.settings.concurrent_runs]
        outputs = sum(out for out, _, _ in runs)
        cache_type, linked = dvc_cache_type()
        dvc = (f"DVC cache: none more (cache.type {cache_type}: links)" if linked else
               f"DVC cache: the run outputs again (cache.type {cache_type})")
        return {"downloads (archives counted twice: kept and unpacked)": downloads,
                **self.auxiliary_disk(),
                f"run outputs ({len(runs)} x model.pt + model_selected.pt)": outputs,
                dvc: 0.0 if linked else outputs,
                f"resume areas of {self.settings.concurrent_runs} run(s) training (concurrent_runs)":
                    sum(area for _, area, _ in training),
                KEPT_AFTER_TRAINING: sum(stays for _, _, stays in runs),
                "one checkpoint being replaced (atomic write)": checkpoint}, unknown

    def auxiliary_disk(self) -> dict[str, float]:
        """The auxiliary builds' files: GOAL's matched crops as PNGs only with `lism.crop_files` (by default the
        index holds boxes, cut where read: hnclip.auxiliary.lism.LismSettings), StructXLIP's edge PNGs."""
        builds = self.reg.auxiliary_builds()
        if not builds:
            return {}
        lism = self.reg.profile.get("auxiliary", {}).get("lism", {})
        crops = [self.size(role, "train") for role, kind in builds if kind == "segments"]
        edges = [self.size(role, "train") for role, kind in builds if kind == "edges"]
        crop_gb = sum(crops) * CROP_PNG_MB_PER_IMAGE / 1000 if lism.get("crop_files", False) else 0.0
        crop_what = (f"GOAL's crop PNGs ({sum(crops):,} images x {CROP_PNG_MB_PER_IMAGE:g} MB, assumed)"
                     if lism.get("crop_files", False) else "GOAL's crops (lism.crop_files false: boxes, no files)")
        return {crop_what: crop_gb,
                f"StructXLIP's edge PNGs ({sum(edges):,} images x {EDGE_PNG_MB_PER_IMAGE:g} MB, assumed)":
                    sum(edges) * EDGE_PNG_MB_PER_IMAGE / 1000}

    def host_mem(self) -> dict[str, int]:
        """Host RAM (MB) of the model-bound rules: startup + safety x (model copies + one batch of pixels +
        the image loading). train: the loaded weights twice (checkpoint, model) and its checkpoint payload
        twice (host copy, serialisation); encoding (evaluate, caption_stats): the weights twice. Image
        loading (`loading_bytes`): train and evaluate; caption_stats encodes captions only."""
        execution, recipe = self.reg.profile["execution"], self.reg.profile["recipe"]
        startup = STARTUP_MEM_MB["cpu" if execution["device"] == "cpu" else "accelerator"]
        weights, image = 4 * self.parameters, 3 * self.cfg["vision_cfg"]["image_size"] ** 2 * 4
        batch = recipe.get("compute_batch", recipe["micro_batch"]) * image
        train = 2 * weights + 2 * (weights + 8 * self.parameters) + batch
        encode = 2 * weights + execution["eval_batch_size"] * image
        runs = [run.spec for run in self.reg.runs().values()]
        train_loading = max((self.loading_bytes(
            [self.size(spec["train_set"], "train"), *(self.test_size(b) for b in self.reg.eval_benchmarks(
                spec["train_set"]))], image, spec["objective"]["framework"]) for spec in runs), default=0)
        evaluate_loading = max((self.loading_bytes([self.test_size(b)], image) for b in self.reg.params["benchmarks"]),
                               default=0)

        def mb(nbytes: int) -> int:
            return 1000 * math.ceil((startup + self.settings.safety_factor * nbytes / 1e6) / 1000)
        return {"train": mb(train + train_loading), "evaluate": mb(encode + evaluate_loading),
                "caption_stats": mb(encode)}

    def loading_bytes(self, images: list[int], image_bytes: int, framework: str | None = None) -> int:
        """What loading a job's datasets holds on the host (`hnclip.data.loader`): each process that decodes a
        dataset keeps its own LRU cache of decoded images, up to execution.image_cache_mb per dataset (the
        main process: every dataset the job reads; each of the execution.loader_workers workers: the largest
        one), and each worker is a process of its own (WORKER_MB). With execution.image_cache the pixels are
        memory-mapped from one file: shared page cache, nothing decoded per process, and the workers are
        threads of the job (`hnclip.data.feeding.ThreadFeed`), except a training `framework` whose
        micro-batches still decode (GOAL's crops, StructXLIP's edge maps: AUXILIARY_INPUTS); evaluation
        (`framework` None) reads the image cache only."""
        execution = self.reg.profile["execution"]
        image_cache = bool(execution.get("image_cache"))
        forks = not image_cache or framework in AUXILIARY_INPUTS
        workers = int(execution.get("loader_workers", 0)) if forks else 0
        cap = 0 if image_cache else execution.get("image_cache_mb", DEFAULT_IMAGE_CACHE_MB) * 2**20

        def cached(n: int) -> int:
            return int(min(cap, n * image_bytes))
        return sum(cached(n) for n in images) + workers * (WORKER_MB * 10**6 + max(map(cached, images), default=0))
