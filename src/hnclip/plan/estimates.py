"""What each computing job of a profile costs: the images it processes and its hours at the rates,
the disk the downloads and the runs' checkpoints take, and the host memory of the model-bound rules.

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
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from hnclip.config import paths
from hnclip.config.constants import ADAPTER_FRAMEWORKS, AUXILIARY_INPUTS, TRAINED_FRAMEWORKS
from hnclip.config.registry import Registry
from hnclip.data.real import PAPER_TABLE_A1
from hnclip.data.source_tables import PUBLIC, profile_source, table_name
from hnclip.plan.model_size import adapter_parameters, clip_parameters, model_config
from hnclip.plan.rates import Rate, rate_class
from hnclip.plan.settings import Settings

GB = 1e9
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

    @property
    def name(self) -> str:
        return f"{self.rule}:{self.key}"

    @property
    def hours(self) -> float:
        """Wall-clock hours (a run spread over several GPUs divides its GPU-hours)."""
        return self.gpu_hours / max(self.gpus, 1)


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
