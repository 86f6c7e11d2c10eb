"""The whole training loop's images/s (feeding, optimizer steps, per-epoch evaluation, checkpoints) against
the optimizer steps alone, on the CPU (or a GPU: --device), and how many images each epoch decodes.

    python benchmarks/loop_throughput.py [--train 256] [--test 128] [--epochs 2] [--workers 2] [--repeats 0]
    python benchmarks/loop_throughput.py --shapes paper --device cuda ...   # benchmarks/gpu_check.sh

Data: --train and --test photographic-like JPEGs of 1,500 x 1,000 (DOCCI's and DCI's size;
`data_loading.photo_like`), preprocessed at 224 px as Long-CLIP-L's (open_clip's eval transform). Model: a
tiny CLIP at 224 px (width 64, 2 layers per tower, patch 32), from scratch; HN-CLIP's objective (gamma 0.5,
lambda_tok 1), micro-batch 16 x 2 accumulation, fp32, one torch thread, --workers loader workers (threads
from the image cache, processes where JPEGs are decoded: `hnclip.data.feeding`). `--shapes paper` trains
Long-CLIP-L's towers at random init instead, 16 x 8 pairs in bf16 (the paper profile's recipe), for a GPU
(`--device cuda`; its step-only runs keep every micro-batch on the device).

Runs, each a real `hnclip.training.loop.train`:
* `image_cache`: the splits' image caches built first (`hnclip.data.image_cache`, their decodes counted),
  then trained with execution.image_cache on;
* `decode`: the same run decoding JPEGs (the LRU of decoded images, each worker its own);
* `step_only`: the same run's optimizer steps on micro-batches prepared beforehand (no feeding, no
  evaluation, no checkpoint), as many as the loop takes, after one warm-up step, before the loops and
  after them (the ratios use their mean);
* `alternated` (--repeats N): N more image-cache loops, each followed by a step-only run, so that every
  loop is bracketed by step-only runs on either side: each loop's ratio against the mean of its bracket,
  and their median. Step-only rates drift by a third within one process on a shared VM; a 10 % criterion
  needs the pairs, not one of each;
* `feed_only_*`: one epoch's micro-batches made on the main process alone, from the cache or by decoding:
  the feed's CPU time per image, against a step's (`cpu_share_of_a_step`), which on a machine with a
  core free per worker the loop does not wait for. On a shared machine (`load_average` above `cpus`) the
  rates measure the other processes as much as the loop.
Each loop run also records where `_epochs`' wall time goes (`observed`: phases with their wall seconds,
share, calls and the main thread's CPU seconds; each step's wait for its micro-batches), and the CPU
seconds of the job's main thread, its other threads (the checkpoint writer) and its loader workers. These
are shares within one run, robust to the machine's load as rates are not. On Linux with autogroup
scheduling (`/proc/sys/kernel/sched_autogroup_enabled`, recorded) a loaded machine gives the job's
session one share of the cores, so the workers' and the writer thread's CPU time comes out of the step's.
--no-decode skips the decoding run and feed.
A checkpoint is due every --checkpoint-every optimizer steps and at each epoch's end (default 2: a stress
of the background writer; the project's default, every 10 minutes, is at epoch ends only in a loop this
short: --checkpoint-every 1000). The loop's time is
`_epochs` (first step to last epoch's checkpoint; the initial evaluation before it is excluded). Decodes
are counted across the job's processes (`PairDataset.decodes`) at every epoch's end, before and after its
evaluation. The checkpoint record gives the loop's cost of checkpointing (host copy + waiting for a write
in flight) beside the writer thread's own time (what a synchronous write would have cost the loop).
One JSON line is appended to benchmarks/results/loop_throughput.jsonl.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "loop_throughput.jsonl"
MODEL = "loop-bench-224"
MODEL_CONFIG = {"embed_dim": 64, "quick_gelu": True,
                "vision_cfg": {"image_size": 224, "layers": 2, "width": 64, "patch_size": 32, "head_width": 32},
                "text_cfg": {"context_length": 248, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2}}


@dataclasses.dataclass(frozen=True)
class Shapes:
    """The model and recipe a loop trains (--shapes)."""
    model: str
    micro_batch: int
    grad_accum: int
    precision: str
    eval_batch: int


SHAPES = {"tiny": Shapes(MODEL, 16, 2, "fp32", 64),
          # the paper profile's: Long-CLIP-L's towers at random init (no download), 16 x 8 pairs, bf16 autocast
          "paper": Shapes("ViT-L-14-quickgelu", 16, 8, "bf16", 256)}


def _write_photo(path_seed_index: tuple[Path, int, int]) -> None:
    from data_loading import photo_like
    path, seed, index = path_seed_index
    photo_like(np.random.default_rng([seed, index])).save(path, quality=90)


def write_split(folder: Path, split: str, n: int, seed: int, processes: int = 1) -> Path:
    """n 1,500 x 1,000 JPEGs (each from its own seed, made by `processes` processes) and their manifest
    `<split>.jsonl`."""
    from hnclip.data.manifest import ManifestRow, write_manifest
    (folder / "images").mkdir(parents=True, exist_ok=True)
    photos = [(folder / "images" / f"{split}{i:05d}.jpg", seed, i) for i in range(n)]
    if processes > 1:
        with multiprocessing.get_context("fork").Pool(processes) as pool:
            pool.map(_write_photo, photos, chunksize=4)
    else:
        for photo in photos:
            _write_photo(photo)
    rows = []
    for i in range(n):
        name = f"images/{split}{i:05d}.jpg"
        rows.append(ManifestRow(f"{split}{i:05d}", name, f"a photograph, number {i} of the {split} split, with "
                                f"{['red', 'green', 'blue', 'grey'][i % 4]} tones", None, split, "0" * 64))
    write_manifest(folder / f"{split}.jsonl", rows)
    return folder / f"{split}.jsonl"


def make_job(manifests: dict, out: Path, epochs: int, workers: int, image_cache: bool, checkpoint_every: int,
             shapes: Shapes = SHAPES["tiny"], device: str = "cpu"):
    from hnclip.training.loop import TrainJob
    spec = {"train_set": "docci", "fraction": 1.0, "seed": 0,
            "objective": {"framework": "full", "gamma": 0.5, "lambda_tok": 1.0, "margin": "live"},
            "recipe": {"epochs": epochs, "micro_batch": shapes.micro_batch, "grad_accum": shapes.grad_accum,
                       "lr": 1e-4, "weight_decay": 0.01, "warmup_steps": 0, "reset_logit_scale": 100.0,
                       "precision": shapes.precision}}
    execution = {"device": device, "threads": 1, "eval_batch_size": shapes.eval_batch,
                 "checkpoint_every_steps": checkpoint_every, "keep_epoch_weights": False, "loader_workers": workers,
                 "image_cache": image_cache, "grad_probe_every": 0, "tf32": True}
    return TrainJob(run_id=f"loop-{'cache' if image_cache else 'decode'}", spec=spec, spec_hash="b" * 64,
                    init_kind="scratch", init_path=None, model_config=shapes.model, train_manifest=manifests["train"],
                    eval_manifests={"docci": manifests["test"]}, out_dir=out / "run", checkpoint_dir=out / "ckpt",
                    execution=execution, evaluation={"recall_ks": [1, 5], "tie_rule": "pessimistic",
                                                     "selection_metric": "mean_r1"})


class PhaseTimers:
    """Wall seconds, main-thread CPU seconds and calls of named phases. A phase entered inside another
    phase of the same `family` is not counted again (CheckpointWriter.save waits for the write in flight)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._inside: set[str] = set()
        self.each: dict[str, list[float]] = {}   # every call's wall seconds, in order
        self.on = False  # counting: within the loop's `_epochs` only (not the feed's start before the initial
        # evaluation, nor the job's final wait for its last checkpoint)

    def wrap(self, name: str, function, family: str | None = None):
        family = family or name

        def timed(*args, **kwargs):
            if family in self._inside or not self.on:
                return function(*args, **kwargs)
            self._inside.add(family)
            started, cpu = time.perf_counter(), time.thread_time()
            try:
                return function(*args, **kwargs)
            finally:
                self._inside.discard(family)
                self.each.setdefault(name, []).append(time.perf_counter() - started)
                self.seconds[name] = self.seconds.get(name, 0.0) + self.each[name][-1]
                self.cpu[name] = self.cpu.get(name, 0.0) + time.thread_time() - cpu
                self.calls[name] = self.calls.get(name, 0) + 1
        return timed

    def shares(self, wall_s: float) -> dict:
        """Each phase's wall seconds, their share of `wall_s`, and the main thread's CPU seconds in it."""
        return {name: {"s": round(value, 3), "share": round(value / wall_s, 3), "calls": self.calls[name],
                       "main_thread_cpu_s": round(self.cpu[name], 3)}
                for name, value in self.seconds.items()}


@contextlib.contextmanager
def observed():
    """Patch the loop to time `_epochs` and its phases, and count each epoch's decodes; yields what it saw.

    Phases (wall seconds, calls and share of `_epochs`' wall time): `feed` (`group_batches`: waiting for the
    next group's micro-batches and moving them), `feed_start` (a pass of the loader workers begun, within
    `feed`), `backward` (the group's forward and backward, `group_backward`), `optimizer_step` (the whole
    step, `feed` and `backward` included), `checkpoint_save` (host copy; a wait for a write in flight) and
    `checkpoint_wait`, `end_of_epoch` (evaluation, weights digest), `other` (the rest: logging, progress,
    per-epoch batching)."""
    import hnclip.training.loop as loop
    from hnclip.data.feeding import LoadFeed, ThreadFeed
    from hnclip.data.loader import PairDataset
    from hnclip.training.checkpoint import CheckpointWriter
    seen = {"datasets": [], "epochs": [], "loop_s": None, "phases": PhaseTimers(), "feeds_created": 0}
    phases = seen["phases"]
    real_from_manifest, real_end, real_epochs = PairDataset.from_manifest.__func__, loop.end_of_epoch, loop._epochs
    real_feed_inits = {feed: feed.__init__ for feed in (LoadFeed, ThreadFeed)}

    def from_manifest(cls, *args, **kwargs):
        seen["datasets"].append(real_from_manifest(cls, *args, **kwargs))
        return seen["datasets"][-1]

    def end_of_epoch(*args, **kwargs):
        train_set, test_set = seen["datasets"][:2]
        before, started = (train_set.decodes, test_set.decodes), time.perf_counter()
        entry = real_end(*args, **kwargs)
        seen["epochs"].append({"train_decodes_so_far": before[0],
                               "eval_decodes_this_evaluation": test_set.decodes - before[1],
                               "end_of_epoch_s": round(time.perf_counter() - started, 3)})
        return entry

    def epochs(*args, **kwargs):
        started, cpu, thread_cpu = time.perf_counter(), time.process_time(), time.thread_time()
        phases.on = True
        try:
            real_epochs(*args, **kwargs)
        finally:
            phases.on = False
        seen["loop_s"] = time.perf_counter() - started
        seen["main_thread_cpu_s"] = time.thread_time() - thread_cpu
        seen["other_threads_cpu_s"] = time.process_time() - cpu - seen["main_thread_cpu_s"]  # the checkpoint writer

    def feed_init(self, *args, **kwargs):
        seen["feeds_created"] += 1
        seen["feed_kind"] = type(self).__name__
        real_feed_inits[type(self)](self, *args, **kwargs)

    with contextlib.ExitStack() as stack:
        patch = stack.enter_context(_patching())
        patch(PairDataset, "from_manifest", classmethod(from_manifest))
        patch(loop, "end_of_epoch", phases.wrap("end_of_epoch", end_of_epoch))
        patch(loop, "_epochs", epochs)
        patch(loop, "group_batches", phases.wrap("feed", loop.group_batches))
        patch(loop, "group_backward", phases.wrap("backward", loop.group_backward))
        patch(loop, "optimizer_step", phases.wrap("optimizer_step", loop.optimizer_step))
        for feed in (LoadFeed, ThreadFeed):
            patch(feed, "start", phases.wrap("feed_start", feed.start))
            patch(feed, "__init__", feed_init)
        patch(CheckpointWriter, "save", phases.wrap("checkpoint_save", CheckpointWriter.save, "checkpoint"))
        patch(CheckpointWriter, "wait", phases.wrap("checkpoint_wait", CheckpointWriter.wait, "checkpoint"))
        yield seen


@contextlib.contextmanager
def _patching():
    undo = []

    def patch(owner, name, value):
        undo.append((owner, name, owner.__dict__[name]))
        setattr(owner, name, value)
    try:
        yield patch
    finally:
        for owner, name, value in reversed(undo):
            setattr(owner, name, value)


def loop_run(job) -> dict:
    from hnclip.training.loop import train
    children = os.times()
    with observed() as seen:
        record = train(job)
    children = os.times().children_user + os.times().children_system - children.children_user - \
        children.children_system  # the loader workers, reaped when the feed closes
    micro = job.spec["recipe"]["micro_batch"]
    images = job.spec["recipe"]["epochs"] * (len(seen["datasets"][0]) // micro) * micro
    evaluation_s = sum(epoch["end_of_epoch_s"] for epoch in seen["epochs"])  # evaluation and weights digest
    wall, phases = seen["loop_s"], seen["phases"]
    shares = phases.shares(wall)
    accounted = sum(phases.seconds.get(name, 0.0) for name in ("optimizer_step", "end_of_epoch", "checkpoint_save",
                                                                 "checkpoint_wait"))
    shares["other"] = {"s": round(wall - accounted, 3), "share": round((wall - accounted) / wall, 3)}
    steps = phases.calls.get("optimizer_step", 0)
    return {"images": images, "loop_s": round(wall, 2),
            # where the loop's wall time goes (one run: shares do not depend on the machine's load as rates do)
            "phases": shares, "feeds_created": seen["feeds_created"], "feed_kind": seen.get("feed_kind"),
            "feed_wait_s_each_step": [round(value, 3) for value in phases.each.get("feed", [])],
            "backward_s_per_step": round(phases.seconds.get("backward", 0.0) / max(steps, 1), 4),
            "backward_main_thread_cpu_s_per_step": round(phases.cpu.get("backward", 0.0) / max(steps, 1), 4),
            # CPU seconds of the job's threads and processes during the loop (workers: all their life) and the
            # main thread's over the loop's wall seconds: below 1 it waited (for the feed, the checkpoint writer,
            # or a core that other threads or processes held)
            "cpu_s": {"main_thread": round(seen["main_thread_cpu_s"], 2),
                      "other_threads": round(seen["other_threads_cpu_s"], 2), "loader_workers": round(children, 2)},
            "main_thread_cpu_share_of_wall": round(seen["main_thread_cpu_s"] / wall, 3),
            "loop_images_per_s": round(images / seen["loop_s"], 1),
            "end_of_epoch_evaluation_s": round(evaluation_s, 2),
            "loop_without_evaluation_images_per_s": round(images / (seen["loop_s"] - evaluation_s), 1),
            # and without the loop's checkpoint time (host copies, waits for a write in flight): in a loop of a
            # few steps an epoch the epoch-end checkpoints weigh far more than in the paper profile's epochs
            "loop_without_evaluation_or_checkpoints_images_per_s": round(images / (seen["loop_s"] - evaluation_s - sum(
                phases.seconds.get(name, 0.0) for name in ("checkpoint_save", "checkpoint_wait"))), 1),
            "optimizer_steps_s": round(record["training"]["timing_s"]["train_s"], 2),
            "checkpoints": record["training"]["checkpoints"],
            "decodes_per_epoch": seen["epochs"], "images_decoded": record["training"]["images_decoded"]}


def step_only(job) -> dict:
    """The run's optimizer steps on micro-batches loaded beforehand: one warm-up step, then as many steps
    as the loop takes (the epoch's, once per epoch of the job)."""
    import hnclip.training.loop as loop
    from hnclip.training.batching import accumulation_groups, epoch_micro_batches
    from hnclip.training.distributed import distributed_session
    from hnclip.training.state import LoopState
    recipe = job.spec["recipe"]
    with distributed_session(job.execution["device"]) as distributed:
        run = loop.prepare_run(job, distributed)
        plan, state = loop.fresh_memory_plan(run), LoopState()
        groups = accumulation_groups(epoch_micro_batches(run.indices, recipe["micro_batch"], job.spec["seed"], 0),
                                     recipe["grad_accum"])
        ready = [[run.method.to_device(run.method.load(ix), run.device) for ix in group] for group in groups]
        phases = PhaseTimers()
        phases.on = True
        with _patching() as patch:
            patch(loop, "group_batches", lambda run_, epoch, index, group: ready[index])
            loop.optimizer_step(run, state, plan, 0, 0, groups[0])  # warm-up
            patch(loop, "group_backward", phases.wrap("backward", loop.group_backward))
            _synchronize(run.device)
            started, cpu = time.perf_counter(), time.thread_time()
            for _ in range(recipe["epochs"]):
                for index, group in enumerate(groups):
                    loop.optimizer_step(run, state, plan, 0, index, group)
            _synchronize(run.device)
            seconds, cpu_s = time.perf_counter() - started, time.thread_time() - cpu
    steps = len(groups) * recipe["epochs"]
    images = steps * recipe["grad_accum"] * recipe["micro_batch"]
    return {"images": images, "steps_s": round(seconds, 2), "images_per_s": round(images / seconds, 1),
            "backward_s_per_step": round(phases.seconds["backward"] / steps, 4),
            "backward_main_thread_cpu_s_per_step": round(phases.cpu["backward"] / steps, 4),
            "main_thread_cpu_share_of_wall": round(cpu_s / seconds, 3)}


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def alternated(loop_job, steps_job, repeats: int, step_rate_before: float) -> dict:
    """`repeats` x (image-cache loop, step-only run), after a step-only run at `step_rate_before` images/s:
    each loop's rates against the mean of the step-only runs either side of it."""
    if repeats < 1:
        return {}
    steps, pairs = [step_rate_before], []
    for r in range(repeats):
        loop = loop_run(loop_job(r))
        steps.append(step_only(steps_job)["images_per_s"])
        bracket = statistics.mean(steps[-2:])
        pairs.append({"loop_images_per_s": loop["loop_images_per_s"],
                      "loop_without_evaluation_images_per_s": loop["loop_without_evaluation_images_per_s"],
                      "step_only_images_per_s": steps[-2:],
                      "loop_vs_step_only": round(loop["loop_images_per_s"] / bracket, 3),
                      "loop_without_evaluation_vs_step_only": round(
                          loop["loop_without_evaluation_images_per_s"] / bracket, 3),
                      "backward_s_per_step": loop["backward_s_per_step"], "cpu_s": loop["cpu_s"]})
    return {"pairs": pairs, **{f"median_{name}": round(statistics.median(p[name] for p in pairs), 3)
                               for name in ("loop_vs_step_only", "loop_without_evaluation_vs_step_only")}}


def feed_only(manifests: dict, image_cache: bool, shapes: Shapes, backbone) -> dict:
    """One epoch of training micro-batches made on this process alone (no workers, no steps): the CPU time
    feeding costs per image, which the loop's workers spend beside the steps (the cached pixels normalized
    here, or JPEGs decoded, each once: an epoch through a fresh dataset)."""
    from hnclip.data.loader import PairDataset
    data = PairDataset.from_manifest(manifests["train"], backbone.preprocess, backbone.tokenizer,
                                     image_cache=image_cache)
    micro = shapes.micro_batch
    spans = [list(range(start, start + micro)) for start in range(0, len(data) - micro + 1, micro)]
    started, cpu = time.perf_counter(), time.process_time()
    for span in spans:
        data.batch(span)
    seconds, cpu_s = time.perf_counter() - started, time.process_time() - cpu
    images = len(spans) * micro
    return {"images": images, "seconds": round(seconds, 2), "cpu_ms_per_image": round(1000 * cpu_s / images, 2),
            "images_per_s": round(images / seconds, 1), "decodes": data.decodes}


def _autogroup() -> bool | None:
    """Whether the kernel shares CPU time between sessions (autogroups) rather than threads (None: unknown)."""
    try:
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
    except OSError:
        return None


def main(argv: list[str] | None = None) -> dict:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import open_clip
    from command1_costs import _commit, append_record, utc_now

    from hnclip.data.image_cache import PixelTransform, write_image_cache
    from hnclip.models.factory import create
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=256, help="training images (1,500 x 1,000 JPEGs)")
    parser.add_argument("--test", type=int, default=128, help="test images, evaluated after every epoch")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--checkpoint-every", type=int, default=2, help="optimizer steps between checkpoints")
    parser.add_argument("--no-decode", action="store_true", help="skip the run and feed that decode JPEGs")
    parser.add_argument("--repeats", type=int, default=0,
                        help="image-cache loops alternated with step-only runs after the first pair")
    parser.add_argument("--shapes", choices=sorted(SHAPES), default="tiny",
                        help="tiny: the CPU model above; paper: Long-CLIP-L's towers, 16 x 8 pairs, bf16 (a GPU's)")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (with --shapes paper: benchmarks/gpu_check.sh)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    shapes = SHAPES[args.shapes]
    torch.set_num_threads(1)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / f"{MODEL}.json").write_text(json.dumps(MODEL_CONFIG))
        open_clip.add_model_config(root / f"{MODEL}.json")
        started = time.perf_counter()
        manifests = {"train": write_split(root / "data", "train", args.train, 0, max(args.workers, 1)),
                     "test": write_split(root / "data", "test", args.test, 1, max(args.workers, 1))}
        generated_s = time.perf_counter() - started
        with contextlib.redirect_stderr(sys.stdout):   # open_clip's "no pretrained weights" warning
            backbone = create(shapes.model)   # its preprocessing and tokenizer (the jobs build their own model)
        transform = PixelTransform.from_preprocess(backbone.preprocess)
        started = time.perf_counter()
        caches = {split: json.loads(write_image_cache(path, transform, workers=args.workers).read_text())
                  for split, path in manifests.items()}
        cache_s = time.perf_counter() - started
        def job(name: str, image_cache: bool = True):
            return make_job(manifests, root / name, args.epochs, args.workers, image_cache, args.checkpoint_every,
                            shapes, args.device)
        steps_job = job("steps")
        steps_before = step_only(steps_job)  # before and after the loops: a bracket on a machine whose load drifts
        runs = {"image_cache": loop_run(job("cache")),
                **({} if args.no_decode else {"decode": loop_run(job("decode", image_cache=False))}),
                "step_only_before": steps_before, "step_only": step_only(steps_job)}
        runs |= {"alternated": alternated(lambda r: job(f"cache{r}"), steps_job, args.repeats,
                                          runs["step_only"]["images_per_s"]),
                 "feed_only_image_cache": feed_only(manifests, True, shapes, backbone),
                 **({} if args.no_decode else {"feed_only_decode": feed_only(manifests, False, shapes, backbone)})}
    step_rate = statistics.mean([runs["step_only_before"]["images_per_s"], runs["step_only"]["images_per_s"]])
    for name in [name for name in ("feed_only_image_cache", "feed_only_decode") if name in runs]:  # per step's
        runs[name]["cpu_share_of_a_step"] = round(runs[name]["cpu_ms_per_image"] / (1000 / step_rate), 3)
    for name in [name for name in ("image_cache", "decode") if name in runs]:
        runs[name]["loop_vs_step_only"] = round(runs[name]["loop_images_per_s"] / step_rate, 3)
        for rate in ("loop_without_evaluation", "loop_without_evaluation_or_checkpoints"):
            runs[name][f"{rate}_vs_step_only"] = round(runs[name][f"{rate}_images_per_s"] / step_rate, 3)
    return append_record(args.out, {
        "benchmark": "loop_throughput", "timestamp": utc_now(), "commit": _commit(ROOT),
        "cpus": len(os.sched_getaffinity(0)), "main_threads": 1, "workers": args.workers,
        "autogroup_scheduling": _autogroup(),
        # the machine's 1-minute load average before and after: above the CPU count, other processes
        # shared the cores and the rates are theirs as much as the loop's
        "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)],
        "device": args.device, "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
        "shapes": args.shapes, "model": {"name": shapes.model, **(MODEL_CONFIG if shapes.model == MODEL else {})},
        "micro_batch": shapes.micro_batch, "grad_accum": shapes.grad_accum, "precision": shapes.precision,
        "epochs": args.epochs, "checkpoint_every_steps": args.checkpoint_every,
        "data": {"train": args.train, "test": args.test, "size": [1500, 1000], "input_px": 224,
                 "generated_s": round(generated_s, 1)},
        "image_cache_build": {"seconds": round(cache_s, 2), "decodes": sum(c["shape"][0] for c in caches.values()),
                              "bytes": sum(c["array"]["bytes"] for c in caches.values())},
        "runs": runs})


if __name__ == "__main__":
    main()
