"""The fine-tuning loop: accumulation groups of micro-batch contrastive steps, AdamW with the run's
schedule, evaluation after every epoch, resumable checkpoints and a step log.

Evaluation inside the training job is here too: the initial weights once (shared between runs that start
from them, `initial_evaluation`), and the exported weights after every epoch (`end_of_epoch`), whose
Recall@K, computed by `hnclip.evaluation.retrieval.evaluate_model`, the tables report. train.json names
the code of its numbers (`code`: this loop, the function that computed the loss terms in the run's batch
mode, the recall function), from the function objects the run used.

The contrastive softmax runs over one micro-batch (as in the paper: micro-batch 16, 8x
accumulation = effective batch 128). Data order is a pure function of (seed, epoch) (`batching`),
and the resume checkpoint holds the trained weights, optimizer, position and RNG state, so a killed
run that is restarted reaches the same weights as an uninterrupted one.

The loop's parts, one job each (as open_clip_train keeps them apart): `model_setup` (initial weights,
framework, precision), `schedule` (optimizer, learning rate), `batching`, `step` (one group's gradient
in the run's batch mode), `memory` (out-of-memory fallbacks), `selection` (the selected epoch's weights),
`checkpoint`, `state`, `outputs` (records, retention).
Options: objective.framework full | lora | dora | finelip | goal | structxlip (`methods`),
recipe.precision, recipe.exact_batch, execution.compute_batch, execution.grad_probe_every (`probe`),
torchrun (`distributed`).
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from hnclip import provenance
from hnclip.data.loader import PairDataset, loading_options, subset_indices
from hnclip.errors import UserError
from hnclip.evaluation.retrieval import evaluate_model
from hnclip.hashing import file_sha256, json_sha256, weights_digest
from hnclip.io import read_json, write_json
from hnclip.losses.objective import with_run_seed
from hnclip.models.factory import save_weights
from hnclip.models.towers import compile_towers
from hnclip.runtime.device import autocast_context, configure_tf32
from hnclip.training import memory
from hnclip.training.batching import accumulation_groups, epoch_micro_batches
from hnclip.training.checkpoint import (
    CheckpointWriter,
    load_checkpoint,
    remove_stale_parts,
    selected_weights_path,
)
from hnclip.training.compute_batch import compute_batch_backward
from hnclip.training.curves import TrainingCurves
from hnclip.training.distributed import Distributed, distributed_session
from hnclip.training.exact_batch import exact_batch_backward
from hnclip.training.faults import Faults
from hnclip.training.feeding import MicroBatchFeed, group_batches
from hnclip.training.frameworks import TrainedModel
from hnclip.training.methods import Method, Position, build_method
from hnclip.training.model_setup import build_model, effective_precision
from hnclip.training.outputs import (
    clear_resume_area,
    record_settings,
    run_origin,
    training_summary,
    write_outputs,
)
from hnclip.training.probe import GradientProbe
from hnclip.training.schedule import build_optimizer, clamp_logit_scale, cosine_lr, set_learning_rates
from hnclip.training.selection import epoch_weights_path, selected_epoch, selected_weights_file
from hnclip.training.state import LoopState, timed
from hnclip.training.step import (
    NonFiniteLossError,  # noqa: F401 - part of this module's API
    gradient_norm,
    group_backward,
    group_backward_mode,
    require_finite,
    step_record,
    summarise_epoch,
)

DEFAULT_CHECKPOINT_MINUTES = 10   # execution.checkpoint_every_minutes: a kill loses at most this much training


@dataclass
class TrainJob:
    run_id: str
    spec: dict            # objective, recipe, seed, fraction: everything that defines the run
    spec_hash: str
    init_kind: str        # pretrained_here | longclip | scratch
    init_path: Path | None
    model_config: str
    train_manifest: Path
    eval_manifests: dict[str, Path]   # benchmark -> test manifest, evaluated after every epoch
    out_dir: Path
    checkpoint_dir: Path
    execution: dict
    evaluation: dict
    extra_inputs: dict = field(default_factory=dict)
    auxiliary: dict = field(default_factory=dict)   # baseline inputs: GOAL segments, StructXLIP edges
    eval_cache_dir: Path | None = None   # where initial-weight evaluations are shared between runs (None: not)
    # keep the weights of the epoch selected on this benchmark (model_selected.pt; None: keep none)
    selection_benchmark: str | None = None
    # every: evaluate after every epoch (fine-tuning: selection, convergence figures); last: after the
    # last epoch only (backbone pretraining, whose record reports only its final score)
    evaluate_epochs: str = "every"
    # the sha256 a downloaded init checkpoint must have (the profile's source table); None: the release's pin
    init_sha256: str | None = None
    curves_dir: Path | None = None   # TensorBoard curves of this run (logs/<profile>/<run>; None: none)
    # train (resuming) through this epoch (1-based), commit its checkpoint and stop: a part of a run that
    # fits a partition's time limit; the last epoch (or None) finishes the run and writes its outputs
    until_epoch: int | None = None


def train(job: TrainJob) -> dict:
    """Train one run; under torchrun (WORLD_SIZE > 1) this process is one rank of it."""
    with distributed_session(job.execution["device"]) as distributed:
        return _train(job, distributed)


@dataclass
class _Run:
    """Everything the loop uses, built once per job."""
    job: TrainJob
    distributed: Distributed
    device: torch.device
    precision: str
    objective: dict
    trained: TrainedModel
    frozen_text: torch.nn.Module | None
    method: Method
    optimizer: torch.optim.Optimizer
    mode: str
    probe: GradientProbe | None
    indices: list[int]
    micro_per_epoch: int
    total_steps: int
    eval_sets: dict
    faults: Faults
    tf32: bool | None       # TF32 matmuls on CUDA (None: not applicable on this device)
    feed: MicroBatchFeed | None = None   # loader workers' micro-batches (execution.loader_workers > 0)
    checkpoints: CheckpointWriter | None = None   # the resume checkpoints' background writer (rank 0)
    resume: dict | None = None   # the checkpoint resumed from and any newer that failed to load (train.json)
    train_set: PairDataset | None = None

    @property
    def recipe(self) -> dict:
        return self.job.spec["recipe"]

    def autocast(self):
        return autocast_context(self.device, self.precision)


def prepare_run(job: TrainJob, distributed: Distributed) -> _Run:
    """Everything a job's optimizer steps use: model, method, optimizer, data (also for hnclip.training.step_timing)."""
    spec, execution, recipe = job.spec, job.execution, job.spec["recipe"]
    objective = with_run_seed(spec["objective"], spec["seed"])  # seed: shuffled-G keys
    torch.set_num_threads(execution["threads"])
    torch.manual_seed(spec["seed"])  # the same on every rank: identical initial (adapter) weights
    device = distributed.device(execution["device"])
    tf32 = configure_tf32(device, execution.get("tf32", True))
    backbone, trained, frozen_text = build_model(job, device)
    if execution.get("compile"):  # in place: state-dict keys, hence checkpoints and exports, unchanged
        compile_towers(trained.module)
    cache, loading = execution.get("cache_images", True), loading_options(execution)
    train_set = PairDataset.from_manifest(job.train_manifest, backbone.preprocess, backbone.tokenizer, cache,
                                          **loading)
    # the run's protocol settings plus the released code's cost-only operations it executes (not its identity)
    settings = {**objective.get("settings", {}), **execution.get("cost_only_settings", {})}
    method = build_method(objective["framework"], objective, settings, trained.module, train_set,
                          job.auxiliary, backbone.tokenizer, frozen_text)
    if method.extra_module is not None:
        if distributed.world_size > 1:
            raise UserError(f"{job.run_id}: the {method.framework} framework trains in one process; "
                            f"set execution.gpus_per_run: 1")
        trained.attach(method.extra_module)
    distributed.broadcast_from_main(trained.module)
    indices = subset_indices(len(train_set), spec["fraction"])
    eval_sets = {name: PairDataset.from_manifest(path, backbone.preprocess, backbone.tokenizer, cache, **loading)
                 for name, path in job.eval_manifests.items()} if distributed.is_main else {}  # rank 0 evaluates
    micro, accum = recipe["micro_batch"], recipe["grad_accum"]
    if len(indices) < micro:
        raise ValueError(f"{job.run_id}: {len(indices)} training pairs is fewer than one micro-batch ({micro})")
    distributed.check_micro_batch(micro)
    micro_per_epoch = len(epoch_micro_batches(indices, micro, spec["seed"], 0))
    total_steps = recipe["epochs"] * len(accumulation_groups(list(range(micro_per_epoch)), accum))
    return _Run(job, distributed, device, effective_precision(device, recipe.get("precision", "fp32")), objective,
                trained, frozen_text, method, build_optimizer(trained.module, recipe, method.extra_module),
                group_backward_mode(recipe, execution, method),
                GradientProbe.from_settings(execution, objective) if method.encodes_plain_pairs else None,
                indices, micro_per_epoch, total_steps, eval_sets, Faults.from_env(), tf32, train_set=train_set)


def fresh_memory_plan(run: _Run) -> memory.MemoryPlan:
    """The memory plan of a run that has not fallen back yet: its compute batch (compute mode) or micro-batch."""
    micro = run.recipe["micro_batch"]
    return memory.MemoryPlan(run.job.execution.get("compute_batch", micro) if run.mode == "compute" else micro, micro)


def _resume(run: _Run) -> tuple[LoopState, memory.MemoryPlan]:
    """The loop state and memory plan to continue from: the checkpoint's (and memory.json's), or fresh."""
    job = run.job
    if run.distributed.is_main:  # a kill during a save leaves its temporary file (5.1 GB for a paper-size checkpoint)
        for path in remove_stale_parts(job.checkpoint_dir) + remove_stale_parts(job.out_dir):
            print(f"{job.run_id}: removed {path}, left by a write that was killed", file=sys.stderr)
    records, origin = record_settings(job), run_origin(job)
    restored = load_checkpoint(job.checkpoint_dir, job.spec_hash, run.trained, run.optimizer, records, origin)
    run.resume = restored.record() if restored is not None else None
    state = LoopState.from_dict(restored.state) if restored is not None else LoopState()
    state.records, state.origin = records, origin
    plan = fresh_memory_plan(run).resumed_from(state.memory)
    plan = plan.resumed_from(memory.read_memory_lesson(job.checkpoint_dir))  # a fallback after the checkpoint
    return state, plan


def optimizer_step(run: _Run, state: LoopState, plan: memory.MemoryPlan, epoch: int, group_index: int,
                   group: list[list[int]]) -> list[dict]:
    """One optimizer step on accumulation group `group_index` of `epoch`; returns its loss records."""
    job, method, model, recipe = run.job, run.method, run.trained.module, run.recipe
    accum = recipe["grad_accum"]
    factor = cosine_lr(state.step, run.total_steps, 1.0, recipe["warmup_steps"]) if method.lr_factor is None \
        else method.lr_factor(epoch * run.micro_per_epoch + group_index * accum, recipe["epochs"] * run.micro_per_epoch,
                              accum)  # a method with its released schedule (FineLIP)
    set_learning_rates(run.optimizer, factor)
    batches = group_batches(run, epoch, group_index, group)  # on the main process or from loader workers
    positions = [Position(epoch, group_index * accum + k, run.micro_per_epoch) for k in range(len(batches))]
    if run.probe is not None and run.probe.due(state.step):
        probe_started = time.time()
        # the probe's forward precision is a setting: the paper reports exact zeros "in fp32"
        probe_autocast = run.autocast if job.execution.get("grad_probe_precision", "fp32") == "run" \
            else contextlib.nullcontext
        measured = run.probe.measure(model, run.trained.trainable_parameters(), *batches[0], run.frozen_text,
                                     probe_autocast, run.distributed, (positions[0].epoch, positions[0].micro_batch),
                                     with_bf16=run.probe.bf16_due(state.step))
        state.grad_probe.append({"step": state.step, "epoch": epoch + 1, **measured})
        state.timers["probe_s"] += time.time() - probe_started
    check = functools.partial(require_finite, run_id=job.run_id, checkpoint_dir=job.checkpoint_dir,
                              loss_names=method.loss_names, epoch=epoch, step=state.step)

    def attempt(current: memory.MemoryPlan) -> list[dict]:
        run.optimizer.zero_grad(set_to_none=True)  # a failed attempt's partial gradients are dropped
        if current.activation_checkpointing:  # never turned off again once a fallback turned it on
            memory.set_activation_checkpointing(model, True)
        before = functools.partial(run.faults.before_forward, state.step,
                                   checkpointing=current.activation_checkpointing)
        return group_backward(run.mode, model, method, batches, positions, run.objective, run.frozen_text,
                              run.autocast, check, current.compute_batch, recipe["micro_batch"], before)

    def remember(current: memory.MemoryPlan) -> None:
        memory.write_memory_lesson(job.checkpoint_dir, current)
        run.faults.after_fallback()

    if run.distributed.world_size > 1:  # an error on one rank cannot be retried alone: the collectives would hang
        records = attempt(plan)
    else:
        records = memory.run_within_memory(
            attempt, plan, run.device, lambda line: print(f"{job.run_id}: {line}", file=sys.stderr), state.step,
            remember, exhausted=f"{job.run_id}: out of memory at optimizer step {state.step + 1} with "
                                f"{plan.micro_batch} pairs per forward and activation checkpointing; the "
                                f"micro-batch is part of the recipe: use a device with more memory")
    run.distributed.average_gradients(run.trained.trainable_parameters())  # once per step, after accumulation
    grad_norm = gradient_norm(model)
    run.optimizer.step()
    method.after_step(model)
    clamp_logit_scale(model, recipe.get("max_logit_scale"))
    contrastive_batch = recipe["micro_batch"] * len(batches) if run.mode == "exact" else recipe["micro_batch"]
    state.step += 1
    state.group = group_index + 1
    state.epoch_records.extend(records)
    state.steps.append(step_record(state.step, epoch, recipe["lr"] * factor, grad_norm, model, records, run.mode,
                                   contrastive_batch, method.loss_names))  # a short last group is smaller
    return records


# ---- evaluation inside the training job ------------------------------------------------------------------
def evaluate_all(model, eval_sets: dict, job, device) -> dict:
    """Recall@K of `model` on every test set the run is evaluated on (`evaluate_model`), by benchmark."""
    image_features: dict = {}  # DCI and Long-DCI share their test images: encoded once per set of weights
    return {name: evaluate_model(model, data, job.evaluation["recall_ks"], job.evaluation["tie_rule"],
                                 job.execution["eval_batch_size"], device, image_features=image_features)
            for name, data in eval_sets.items()}


def initial_evaluation(model, eval_sets: dict, job, device) -> dict:
    """`evaluate_all` of the weights a run starts from. Every run from the same initial weights has
    the same one, so it is computed once and read back by the others (keyed by the weights' and
    test manifests' sha256, the evaluation settings and the device type)."""
    if job.eval_cache_dir is None:
        return evaluate_all(model, eval_sets, job, device)
    key = json_sha256({"weights": weights_digest(model), "device": device.type, "evaluation": job.evaluation,
                       "manifests": {name: file_sha256(path) for name, path in job.eval_manifests.items()}})
    cached = job.eval_cache_dir / f"{key}.json"
    if cached.exists():
        return read_json(cached)
    result = evaluate_all(model, eval_sets, job, device)
    write_json(cached, result)
    return result


def end_of_epoch(job, trained, state: LoopState, epoch: int, eval_sets: dict, device, loss_names) -> dict:
    """Evaluate and fingerprint the exported (for adapters: merged) weights of this epoch."""
    exported = trained.export()
    if job.execution.get("keep_epoch_weights"):
        save_weights(exported, job.model_config, epoch_weights_path(job.checkpoint_dir, epoch + 1))
    evaluated = job.evaluate_epochs == "every" or epoch + 1 == job.spec["recipe"]["epochs"]
    entry = {"epoch": epoch + 1, "step": state.step, "train": summarise_epoch(state.epoch_records, loss_names),
             "eval": evaluate_all(exported, eval_sets, job, device) if evaluated else {},
             "weights_sha256": weights_digest(exported)}
    if selected_epoch(job, state.history + [entry]) == entry["epoch"]:
        # A new best: written before the resume checkpoint that commits this epoch, and the previous
        # best's file is removed only after that commit (_commit_selection), so a kill never loses both.
        save_weights(exported, job.model_config, selected_weights_path(job.checkpoint_dir, entry["epoch"]))
    return entry


# ---- the run --------------------------------------------------------------------------------------------
def loss_function(mode: str, method: Method):
    """The function that computed a run's loss terms in its batch mode: in `micro` mode the method's own
    (`Method.loss_function`, what its `terms` call); in `compute` mode the group terms `compute_batch_backward`
    computes with (the step passes none of its own: its default); in `exact` mode `exact_batch_backward`,
    which computes the group's terms itself."""
    if mode == "compute":
        return inspect.signature(compute_batch_backward).parameters["terms"].default
    if mode == "exact":
        return exact_batch_backward
    return method.loss_function


def run_code(run: _Run) -> dict:
    """What train.json's `code` names, from the function objects this run used: the training loop, the
    function that computed its loss terms, and the one that computed its Recall@K after each epoch."""
    return {"training": provenance.code_name(train),
            "loss_terms": provenance.code_name(loss_function(run.mode, run.method)),
            "recall": provenance.code_name(evaluate_model)}


def _train(job: TrainJob, distributed: Distributed) -> dict:
    started = time.time()
    run = prepare_run(job, distributed)
    main = distributed.is_main
    last_epoch = _last_epoch(job)
    state, plan = _resume(run)
    resumed_from = state.step or None
    if main:
        selected_weights_file(job, state.history)  # a resume area that lost them fails now, not after training
        run.checkpoints = CheckpointWriter(job.checkpoint_dir)
    if job.execution.get("loader_workers", 0) > 0:  # begun now: the workers start and load during the evaluation
        start = (state.epoch, state.group) if state.epoch < last_epoch else None
        run.feed = MicroBatchFeed(run, job.execution["loader_workers"], start, last_epoch)
    failed, curves = True, None
    try:
        if main and state.initial_eval is None:  # the starting point (zero-shot init), for "does fine-tuning help?"
            with timed(state.timers, "eval_s"):
                state.initial_eval = initial_evaluation(run.trained.export(), run.eval_sets, job, run.device)
        progress = tqdm(total=run.total_steps, initial=state.step, desc=job.run_id, unit="step", disable=not main,
                        mininterval=1 if sys.stderr.isatty() else 15, file=sys.stderr)
        curves = TrainingCurves(job.curves_dir if main else None, state.step)
        _epochs(run, state, plan, progress, curves, last_epoch)
        failed = False
    finally:
        if curves is not None:
            curves.close()
        if run.feed is not None:
            run.feed.close()
        if run.checkpoints is not None:
            _finish_writes(run.checkpoints, failed)
    progress.close()
    wall = time.time() - started
    finished = state.epoch >= job.spec["recipe"]["epochs"]
    if not main or not finished:  # a rank beside the main one, or a part of a run (`until_epoch`)
        return {"run_id": job.run_id, "rank": distributed.rank, "optimizer_steps": state.step, "wall_time_s": wall,
                "epochs_done": state.epoch, "finished": finished}
    record = write_outputs(job, run.trained.export(), state, wall, resumed_from, run.device,
                           training_summary(run, state, plan), run_code(run))
    clear_resume_area(job)
    return record


def _last_epoch(job: TrainJob) -> int:
    """The epoch this job trains through (1-based): the run's last, or `until_epoch`."""
    epochs = job.spec["recipe"]["epochs"]
    if job.until_epoch is None:
        return epochs
    if not 1 <= job.until_epoch <= epochs:
        raise UserError(f"{job.run_id}: --until-epoch {job.until_epoch} is not an epoch of this run (1 to {epochs})")
    return job.until_epoch


def _finish_writes(checkpoints: CheckpointWriter, failed: bool) -> None:
    """Wait for the checkpoint in flight; when the loop already failed, its error is the one raised."""
    if not failed:
        checkpoints.wait(final=True)
        return
    try:
        checkpoints.wait(final=True)
    except RuntimeError as error:
        print(f"also: {error}", file=sys.stderr)


def checkpoint_due(execution: dict, step: int, since_s: float) -> bool:
    """A mid-epoch resume checkpoint after this optimizer step: every `checkpoint_every_steps` steps where
    set, and whenever `checkpoint_every_minutes` (default 10) of wall time have passed since the last one."""
    every_steps = execution.get("checkpoint_every_steps")
    return bool(every_steps and step % every_steps == 0) or \
        since_s >= 60 * execution.get("checkpoint_every_minutes", DEFAULT_CHECKPOINT_MINUTES)


def _commit_selection(job: TrainJob, histories: list[list[dict]]) -> None:
    """Once a checkpoint is committed: drop the selected weights of epochs that neither it nor the
    checkpoint before it (the fallback of a resume) selects."""
    if job.selection_benchmark is None:
        return
    keep = {selected_weights_path(job.checkpoint_dir, selected_epoch(job, history) or 0) for history in histories}
    for path in job.checkpoint_dir.glob("selected_epoch_*.pt"):
        if path not in keep:
            path.unlink()


def _epochs(run: _Run, state: LoopState, plan: memory.MemoryPlan, progress, curves: TrainingCurves,
            last_epoch: int) -> None:
    """Train from the state's position through `last_epoch`, evaluating and checkpointing each epoch's end."""
    job, recipe, main, micro = run.job, run.recipe, run.distributed.is_main, run.recipe["micro_batch"]
    checkpoints, committed = run.checkpoints, list(state.history)  # the history the newest checkpoint holds
    last_saved = time.monotonic()

    def save(after=None) -> None:
        nonlocal last_saved
        checkpoints.save(job.spec_hash, run.trained, run.optimizer, state, after)
        last_saved = time.monotonic()

    for epoch in range(state.epoch, last_epoch):
        groups = accumulation_groups(epoch_micro_batches(run.indices, micro, job.spec["seed"], epoch),
                                     recipe["grad_accum"])
        for group_index in range(state.group, len(groups)):
            step_started = time.time()
            with timed(state.timers, "train_s"):
                records = optimizer_step(run, state, plan, epoch, group_index, groups[group_index])
            curves.step(state.steps[-1], micro * state.steps[-1]["micro_batches"], time.time() - step_started,
                        run.device)
            state.memory = plan.as_dict()
            progress.update(1)
            progress.set_postfix(loss=f"{records[-1]['total']:.3g}", refresh=False)
            # (an epoch's last step is saved by the end-of-epoch checkpoint just below)
            if main and group_index + 1 < len(groups) and \
                    checkpoint_due(job.execution, state.step, time.monotonic() - last_saved):
                save()
            if main and run.faults.kill_after_step is not None:
                checkpoints.wait()  # an injected kill models one that comes after the write is on disk
            run.faults.after_step(state.step)
        if main:
            checkpoints.wait()  # the last write's selection is committed before this epoch's selection is written
            with timed(state.timers, "eval_s"):
                state.history.append(end_of_epoch(job, run.trained, state, epoch, run.eval_sets, run.device,
                                                  run.method.loss_names))
            curves.epoch(state.history[-1])
        state.epoch, state.group, state.epoch_records = epoch + 1, 0, []
        if main:
            histories = [committed, list(state.history)]
            save(lambda: _commit_selection(job, histories))
            committed = histories[1]
        run.distributed.barrier()  # the other ranks wait for rank 0's evaluation
