"""Fine-tuning loop: micro-batch contrastive steps, gradient accumulation, AdamW + cosine,
evaluation after every epoch, resumable checkpoints, a step log and non-finite-loss guards. The
weights of the epoch selected on the run's own benchmark are kept as model_selected.pt (transfer cells).

The contrastive softmax runs over one micro-batch (as in the paper: micro-batch 16, 8x
accumulation = effective batch 128). Data order is a pure function of (seed, epoch), and the
resume checkpoint holds the trained weights, optimizer, position and RNG state, so a killed run
that is restarted reaches the same weights as an uninterrupted one.

Options (all off by default; the default path is the plain loop above):
  objective.framework  full | lora | dora  (`hnclip.training.frameworks`; recipe.adapter)
  recipe.precision     bf16 autocast on cuda/npu, fp32 elsewhere; losses always in fp32
  recipe.exact_batch   each accumulation group is one contrastive batch (`hnclip.training.exact_batch`)
  execution.grad_probe_every  L_CLIP vs L_HN gradient probe (`hnclip.training.probe`)
  torchrun             multi-process data parallelism (`hnclip.training.distributed`)
"""
from __future__ import annotations

import contextlib
import copy
import functools
import math
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from hnclip import provenance
from hnclip.data.loader import PairDataset, subset_indices
from hnclip.errors import StaleArtifactError, UserError
from hnclip.evaluation.retrieval import evaluate_model
from hnclip.evaluation.selection import select_epochs
from hnclip.hashing import file_sha256, json_sha256, state_dict_digest, weights_digest
from hnclip.io import atomic_path, read_json, write_json, write_jsonl
from hnclip.losses.objective import TOKEN_LOSS_CHUNK, loss_terms, with_run_seed  # noqa: F401 - part of this module's API
from hnclip.models.factory import load_backbone, save_weights
from hnclip.runtime.device import AUTOCAST_DEVICE_TYPES, autocast_context
from hnclip.training.checkpoint import checkpoint_path, load_checkpoint, save_checkpoint, selected_weights_path
from hnclip.training.compute_batch import compute_batch_backward, fit_compute_batch
from hnclip.training.distributed import Distributed, distributed_session
from hnclip.training.exact_batch import exact_batch_backward
from hnclip.training.frameworks import TrainedModel
from hnclip.training.methods import Method, Position, build_method
from hnclip.training.probe import GradientProbe, probe_summary

SATURATION_THRESHOLD = 1e-3
# Every named term a framework logs (HN-CLIP; FineLIP: fine; GOAL: org seg patch text; StructXLIP: g sc rs lsc).
LOSS_TERMS = ("infonce", "hn", "tok", "fine", "org", "seg", "patch", "text", "g", "sc", "rs", "lsc", "total")


class NonFiniteLossError(UserError, RuntimeError):
    pass


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
    stop_after_steps: int | None = None   # test hook: SIGKILL this process after that optimizer step
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


# ---- pieces ------------------------------------------------------------------------------------
def build_optimizer(model: torch.nn.Module, recipe: dict, extra_module: torch.nn.Module | None = None
                    ) -> torch.optim.AdamW:
    """AdamW over the trainable parameters. Open_clip's rule by default: no weight decay on gains,
    biases, embeddings and the logit scale; `recipe.decay_all` decays every parameter (GOAL's and
    StructXLIP's released optimizers). An extra module (FineLIP's aggregators) is its own group at
    `recipe.module_lr`. Each group keeps its `base_lr`; the schedule scales all of them alike."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        exclude = param.ndim < 2 or "bn" in name or "ln" in name or "bias" in name or "logit_scale" in name \
            or "embedding" in name
        (no_decay if exclude and not recipe.get("decay_all") else decay).append(param)
    lr, weight_decay = recipe["lr"], recipe["weight_decay"]
    groups = [{"params": no_decay, "weight_decay": 0.0, "base_lr": lr, "name": "backbone_no_decay"},
              {"params": decay, "weight_decay": weight_decay, "base_lr": lr, "name": "backbone"}]
    if extra_module is not None:
        groups.append({"params": [p for p in extra_module.parameters() if p.requires_grad],
                       "weight_decay": weight_decay, "base_lr": recipe.get("module_lr", lr), "name": "module"})
    groups = [g for g in groups if g["params"]]
    for group in groups:
        group["lr"] = group["base_lr"]
    return torch.optim.AdamW(groups, lr=lr)


def set_learning_rates(optimizer: torch.optim.Optimizer, factor: float) -> None:
    """Scale every group's base rate by the schedule's factor at this step."""
    for group in optimizer.param_groups:
        group["lr"] = group["base_lr"] * factor


def cosine_lr(step: int, total_steps: int, base_lr: float, warmup_steps: int) -> float:
    if step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return 0.5 * base_lr * (1 + math.cos(math.pi * min(1.0, progress)))


def epoch_micro_batches(indices: list[int], micro_batch: int, seed: int, epoch: int) -> list[list[int]]:
    """Shuffled micro-batches of one epoch; the incomplete tail is dropped so every softmax has
    the same number of candidates."""
    generator = torch.Generator().manual_seed(seed * 1000 + epoch)
    order = [indices[i] for i in torch.randperm(len(indices), generator=generator).tolist()]
    return [order[i:i + micro_batch] for i in range(0, len(order) - micro_batch + 1, micro_batch)]


def accumulation_groups(micro_batches: list, grad_accum: int) -> list[list]:
    return [micro_batches[i:i + grad_accum] for i in range(0, len(micro_batches), grad_accum)]


def frozen_text_encoder(model: torch.nn.Module) -> torch.nn.Module:
    """A frozen copy of the initial text tower only (Table 3c): the image tower is not copied."""
    visual = model.visual
    model.visual = None
    try:
        frozen = copy.deepcopy(model)
    finally:
        model.visual = visual
    frozen.requires_grad_(False).eval()
    return frozen


def gradient_norm(model: torch.nn.Module) -> float:
    norms = [p.grad.detach().norm(2) for p in model.parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0


def effective_precision(device: torch.device, requested: str) -> str:
    """bf16 only where `autocast_context` turns autocast on (cuda, npu); fp32 elsewhere."""
    return "bf16" if requested == "bf16" and device.type in AUTOCAST_DEVICE_TYPES else "fp32"


def record_settings(job: TrainJob) -> dict:
    """What the run's records depend on beyond its spec (the train rule's other params): a resume
    checkpoint is used only under the same ones."""
    execution = job.execution
    probe_every = int(execution.get("grad_probe_every", 0) or 0)
    return {"evaluation": job.evaluation, "eval_manifests": sorted(job.eval_manifests),
            "grad_probe_every": probe_every,
            "grad_probe_precision": execution.get("grad_probe_precision", "fp32"),
            "grad_probe_bf16_every": int(execution.get("grad_probe_bf16_every", 1)) if probe_every else None,
            "cost_only_steps": execution.get("cost_only_steps")}


def run_origin(job: TrainJob) -> dict:
    """The content a run starts from: sha256 of its initial weights (a download's from its verified marker)
    and of its training manifest. A resume checkpoint is used only from the same (see load_checkpoint)."""
    from hnclip.data.download import recorded_sha256
    return {"init_weights": recorded_sha256(job.init_path) if job.init_path else None,
            "train_manifest": file_sha256(job.train_manifest)}


def _fresh_state() -> dict:
    return {"epoch": 0, "group": 0, "step": 0, "history": [], "steps": [], "epoch_records": [], "grad_probe": []}


# ---- one optimizer step's gradient -------------------------------------------------------------
def _require_finite(values: dict, job: TrainJob, epoch: int, step: int) -> None:
    if not all(math.isfinite(v) for name, v in values.items() if name in LOSS_TERMS):
        raise NonFiniteLossError(
            f"{job.run_id}: non-finite loss at epoch {epoch + 1}, optimizer step {step + 1} "
            f"({values}); no update was applied and the last good checkpoint "
            f"({checkpoint_path(job.checkpoint_dir)}, step {step}) is kept. Lower the learning rate or "
            f"check the data, then rerun to resume from it.")


def _micro_batch_backward(model, method: Method, batches, positions, autocast, check) -> list[dict]:
    """Default mode: each micro-batch is its own contrastive batch; gradients are averaged."""
    records = []
    for batch, position in zip(batches, positions, strict=True):
        terms = method.terms(model, batch, position, autocast)
        values = {name: float(value.detach()) for name, value in terms.items()}
        check(values)
        (terms["total"] / len(batches)).backward()
        records.append(values)
    return records


def _exact_batch_backward(model, batches, objective, frozen_text, autocast, check, margin_key=None) -> list[dict]:
    record = exact_batch_backward(model, batches, objective, frozen_text, autocast, margin_key)
    check(record)  # after backward, but still before the optimizer step: no update is applied
    return [record]


def _step_record(step: int, epoch: int, lr: float, grad_norm: float, model, records: list[dict],
                 batch_mode: str, contrastive_batch: int) -> dict:
    return {"step": step, "epoch": epoch + 1, "lr": lr, "grad_norm": grad_norm,
            "logit_scale": float(model.logit_scale.detach().exp()),
            **{f"{k}_mean": sum(r[k] for r in records) / len(records) for k in records[0] if k in LOSS_TERMS},
            "saturated_frac": sum(r["infonce"] < SATURATION_THRESHOLD for r in records) / len(records),
            # L_HN at or above the threshold still has a gradient while InfoNCE saturates (the regime report)
            **({"hn_unsaturated_frac": sum(r["hn"] >= SATURATION_THRESHOLD for r in records) / len(records)}
               if all("hn" in r for r in records) else {}),
            "micro_batches": sum(r.get("micro_batches", 1) for r in records),  # an exact-batch record is a group
            "batch_mode": batch_mode, "contrastive_batch": contrastive_batch}


# ---- the loop ----------------------------------------------------------------------------------
def _summarise_epoch(records: list[dict]) -> dict:
    # exact_batch records stand for a whole group of micro-batches
    summary = {"micro_batches": sum(r.get("micro_batches", 1) for r in records)}
    for term in LOSS_TERMS:
        values = [r[term] for r in records if term in r]
        if values:
            summary[f"{term}_mean"] = sum(values) / len(values)
            summary[f"{term}_saturated_frac"] = sum(v < SATURATION_THRESHOLD for v in values) / len(values)
    return summary


def _evaluate_all(model, eval_sets: dict, job: TrainJob, device) -> dict:
    image_features: dict = {}  # DCI and Long-DCI share their test images: encoded once per set of weights
    return {name: evaluate_model(model, data, job.evaluation["recall_ks"], job.evaluation["tie_rule"],
                                 job.execution["eval_batch_size"], device, image_features=image_features)
            for name, data in eval_sets.items()}


def _initial_evaluation(model, eval_sets: dict, job: TrainJob, device) -> dict:
    """`_evaluate_all` of the weights a run starts from. Every run from the same initial weights has
    the same one, so it is computed once and read back by the others (keyed by the weights' and
    test manifests' sha256, the evaluation settings and the device type)."""
    if job.eval_cache_dir is None:
        return _evaluate_all(model, eval_sets, job, device)
    key = json_sha256({"weights": weights_digest(model), "device": device.type, "evaluation": job.evaluation,
                       "manifests": {name: file_sha256(path) for name, path in job.eval_manifests.items()}})
    cached = job.eval_cache_dir / f"{key}.json"
    if cached.exists():
        return read_json(cached)
    result = _evaluate_all(model, eval_sets, job, device)
    write_json(cached, result)
    return result


def _end_of_epoch(job: TrainJob, trained: TrainedModel, state: dict, epoch: int, eval_sets: dict, device) -> dict:
    """Evaluate and fingerprint the exported (for adapters: merged) weights of this epoch."""
    exported = trained.export()
    if job.execution.get("keep_epoch_weights"):
        save_weights(exported, job.model_config, job.checkpoint_dir / f"epoch_{epoch + 1:02d}.pt")
    evaluated = job.evaluate_epochs == "every" or epoch + 1 == job.spec["recipe"]["epochs"]
    entry = {"epoch": epoch + 1, "step": state["step"], "train": _summarise_epoch(state["epoch_records"]),
             "eval": _evaluate_all(exported, eval_sets, job, device) if evaluated else {},
             "weights_sha256": weights_digest(exported)}
    if _selected_epoch(job, state["history"] + [entry]) == entry["epoch"]:
        # A new best: written before the resume checkpoint that commits this epoch, and the previous
        # best's file is removed only after that commit (_prune_selected), so a kill never loses both.
        save_weights(exported, job.model_config, selected_weights_path(job.checkpoint_dir, entry["epoch"]))
    return entry


# ---- the checkpoint selected on the run's own benchmark (its transfer cells use it) -------------
def _selected_epoch(job: TrainJob, history: list[dict]) -> int | None:
    """The epoch `select_epochs` picks on the job's selection benchmark (None: no epoch, or none kept)."""
    if job.selection_benchmark is None or not history:
        return None
    return select_epochs(history, job.selection_benchmark, job.evaluation["selection_metric"])["best"]["epoch"]


def _selected_weights_file(job: TrainJob, history: list[dict]) -> Path | None:
    """Where the resume area holds the selected epoch's weights: its own file, or the epoch's kept
    weights (keep_epoch_weights). Raises if neither is there: they cannot be recomputed."""
    epoch = _selected_epoch(job, history)
    if epoch is None:
        return None
    candidates = [selected_weights_path(job.checkpoint_dir, epoch), job.checkpoint_dir / f"epoch_{epoch:02d}.pt"]
    found = next((path for path in candidates if path.is_file()), None)
    if found is None:
        raise StaleArtifactError(f"{job.run_id}: the weights of epoch {epoch}, selected on {job.selection_benchmark}, "
                                 f"are not in {job.checkpoint_dir} (a resume checkpoint written before selected "
                                 f"checkpoints were kept?); delete {job.checkpoint_dir} to retrain this run")
    return found


def _prune_selected(job: TrainJob, history: list[dict]) -> None:
    """After a resume checkpoint committed `history`: drop the weights of epochs no longer selected."""
    if job.selection_benchmark is None:
        return
    keep = selected_weights_path(job.checkpoint_dir, _selected_epoch(job, history) or 0)
    for path in job.checkpoint_dir.glob("selected_epoch_*.pt"):
        if path != keep:
            path.unlink()


def _build_model(job: TrainJob, device: torch.device):
    """(backbone, trained model, frozen text tower or None) as the run starts: init weights, logit
    scale reset, then the framework's wrapping (the frozen-G tower is copied from the bare CLIP)."""
    recipe, objective = job.spec["recipe"], job.spec["objective"]
    backbone = load_backbone(job.init_kind, job.init_path, job.model_config, job.init_sha256)
    base = backbone.model.to(device).train()
    if recipe.get("reset_logit_scale"):
        with torch.no_grad():
            base.logit_scale.fill_(math.log(recipe["reset_logit_scale"]))
    frozen_text = frozen_text_encoder(base) if objective["margin"] == "frozen" else None
    trained = TrainedModel.build(base, objective.get("framework", "full"), recipe.get("adapter"))
    return backbone, trained, frozen_text


def train(job: TrainJob) -> dict:
    """Train one run; under torchrun (WORLD_SIZE > 1) this process is one rank of it."""
    with distributed_session(job.execution["device"]) as distributed:
        return _train(job, distributed)


def _clamp_logit_scale(model, max_scale: float | None) -> None:
    """`recipe.max_logit_scale`: clamp exp(logit_scale) after every step (None: unclamped, as chosen
    for the paper's recipe, which does not say; open_clip's trainer clamps at 100)."""
    if max_scale is not None:
        with torch.no_grad():
            model.logit_scale.clamp_(max=math.log(max_scale))


def _group_backward_mode(recipe: dict, execution: dict, method: Method) -> str:
    """micro (default), exact (one contrastive batch per group) or compute (several micro-batches
    per forward, each its own contrastive group; an execution choice, see `compute_batch`)."""
    if recipe.get("exact_batch"):
        if not method.encodes_plain_pairs:
            raise UserError(f"recipe.exact_batch is not available for the {method.framework} framework")
        return "exact"
    if execution.get("compute_batch", recipe["micro_batch"]) > recipe["micro_batch"] and method.encodes_plain_pairs:
        return "compute"
    return "micro"


def _train(job: TrainJob, distributed: Distributed) -> dict:
    started = time.time()
    spec, execution = job.spec, job.execution
    recipe, objective = spec["recipe"], with_run_seed(spec["objective"], spec["seed"])  # seed: shuffled-G keys
    main = distributed.is_main
    torch.set_num_threads(execution["threads"])
    torch.manual_seed(spec["seed"])  # the same on every rank: identical initial (adapter) weights
    device = distributed.device(execution["device"])
    precision = effective_precision(device, recipe.get("precision", "fp32"))
    autocast = functools.partial(autocast_context, device, precision)

    backbone, trained, frozen_text = _build_model(job, device)
    model = trained.module
    cache = execution.get("cache_images", True)
    train_set = PairDataset.from_manifest(job.train_manifest, backbone.preprocess, backbone.tokenizer, cache)
    # the run's protocol settings plus the released code's cost-only steps it executes (not its identity)
    settings = {**objective.get("settings", {}), **execution.get("cost_only_steps", {})}
    method = build_method(objective["framework"], objective, settings, model, train_set,
                          job.auxiliary, backbone.tokenizer, frozen_text)
    if method.extra_module is not None:
        if distributed.world_size > 1:
            raise UserError(f"{job.run_id}: the {method.framework} framework trains in one process; "
                            f"set execution.gpus_per_run: 1")
        trained.attach(method.extra_module)
    distributed.broadcast_from_main(model)
    indices = subset_indices(len(train_set), spec["fraction"])
    eval_sets = {name: PairDataset.from_manifest(path, backbone.preprocess, backbone.tokenizer, cache)
                 for name, path in job.eval_manifests.items()} if main else {}  # rank 0 evaluates

    micro, accum = recipe["micro_batch"], recipe["grad_accum"]
    if len(indices) < micro:
        raise ValueError(f"{job.run_id}: {len(indices)} training pairs is fewer than one micro-batch ({micro})")
    distributed.check_micro_batch(micro)
    micro_per_epoch = len(epoch_micro_batches(indices, micro, spec["seed"], 0))
    steps_per_epoch = len(accumulation_groups(list(range(micro_per_epoch)), accum))
    total_steps = recipe["epochs"] * steps_per_epoch
    optimizer = build_optimizer(model, recipe, method.extra_module)
    mode = _group_backward_mode(recipe, execution, method)
    compute_batch = execution.get("compute_batch", micro) if mode == "compute" else micro
    probe = GradientProbe.from_settings(execution, objective) if method.encodes_plain_pairs else None

    records, origin = record_settings(job), run_origin(job)
    state = load_checkpoint(job.checkpoint_dir, job.spec_hash, trained, optimizer, records, origin) or _fresh_state()
    state["records"], state["origin"] = records, origin
    state.setdefault("grad_probe", [])
    timers = state.setdefault("timers", {"eval_s": 0.0, "probe_s": 0.0, "train_s": 0.0})
    resumed_from = state["step"] if state["step"] else None
    if main:
        _selected_weights_file(job, state["history"])  # a resume area that lost them fails now, not after training
    if main and "initial_eval" not in state:  # the starting point (zero-shot init), for "does fine-tuning help?"
        with _timed(timers, "eval_s"):
            state["initial_eval"] = _initial_evaluation(trained.export(), eval_sets, job, device)
    progress = tqdm(total=total_steps, initial=state["step"], desc=job.run_id, unit="step", disable=not main,
                    mininterval=1 if sys.stderr.isatty() else 15, file=sys.stderr)
    for epoch in range(state["epoch"], recipe["epochs"]):
        groups = accumulation_groups(epoch_micro_batches(indices, micro, spec["seed"], epoch), accum)
        for group_index in range(state["group"], len(groups)):
            step_started = time.time()
            factor = cosine_lr(state["step"], total_steps, 1.0, recipe["warmup_steps"]) if method.lr_factor is None \
                else method.lr_factor(epoch * micro_per_epoch + group_index * accum, recipe["epochs"] * micro_per_epoch,
                                      accum)  # a method with its released schedule (FineLIP)
            set_learning_rates(optimizer, factor)
            optimizer.zero_grad(set_to_none=True)
            batches = [method.to_device(method.load(distributed.local_slice(ix)), device) for ix in groups[group_index]]
            positions = [Position(epoch, group_index * accum + k, micro_per_epoch) for k in range(len(batches))]
            margin_keys = [(p.epoch, p.micro_batch) for p in positions]  # each group's shuffled-G key
            if probe is not None and probe.due(state["step"]):
                probe_started = time.time()
                # the probe's forward precision is a setting: the paper reports exact zeros "in fp32"
                probe_autocast = autocast if execution.get("grad_probe_precision", "fp32") == "run" \
                    else contextlib.nullcontext
                measured = probe.measure(model, trained.trainable_parameters(), *batches[0], frozen_text,
                                         probe_autocast, distributed, margin_keys[0],
                                         with_bf16=probe.bf16_due(state["step"]))
                state["grad_probe"].append({"step": state["step"], "epoch": epoch + 1, **measured})
                timers["probe_s"] += time.time() - probe_started
            check = functools.partial(_require_finite, job=job, epoch=epoch, step=state["step"])
            if mode == "exact":
                records = _exact_batch_backward(model, batches, objective, frozen_text, autocast, check,
                                                margin_keys[0])
            elif mode == "compute":
                if state["step"] == 0 and "compute_batch_used" not in state:
                    compute_batch = _fit_compute_batch(model, optimizer, batches, objective, frozen_text, autocast,
                                                       compute_batch, micro, device)
                state["compute_batch_used"] = compute_batch = state.get("compute_batch_used", compute_batch)
                records = compute_batch_backward(model, batches, objective, frozen_text, autocast, check,
                                                 compute_batch, micro, margin_keys=margin_keys)
            else:
                records = _micro_batch_backward(model, method, batches, positions, autocast, check)
            distributed.average_gradients(trained.trainable_parameters())  # once per step, after accumulation
            grad_norm = gradient_norm(model)
            optimizer.step()
            method.after_step(model)
            _clamp_logit_scale(model, recipe.get("max_logit_scale"))
            state["step"] += 1
            state["group"] = group_index + 1
            state["epoch_records"].extend(records)
            contrastive_batch = micro * len(batches) if mode == "exact" else micro  # a short last group is smaller
            state["steps"].append(_step_record(state["step"], epoch, recipe["lr"] * factor, grad_norm,
                                               model, records, mode, contrastive_batch))
            timers["train_s"] += time.time() - step_started
            progress.update(1)
            progress.set_postfix(loss=f"{records[-1]['total']:.3g}", refresh=False)
            # (an epoch's last step is saved by the end-of-epoch checkpoint just below)
            if main and state["step"] % execution["checkpoint_every_steps"] == 0 and group_index + 1 < len(groups):
                save_checkpoint(job.checkpoint_dir, job.spec_hash, trained, optimizer, state)
            if job.stop_after_steps and state["step"] >= job.stop_after_steps:
                progress.close()
                os.kill(os.getpid(), signal.SIGKILL)  # simulate a scheduler kill (tests)
        if main:
            with _timed(timers, "eval_s"):
                state["history"].append(_end_of_epoch(job, trained, state, epoch, eval_sets, device))
        state.update(epoch=epoch + 1, group=0, epoch_records=[])
        if main:
            save_checkpoint(job.checkpoint_dir, job.spec_hash, trained, optimizer, state)
            _prune_selected(job, state["history"])
        distributed.barrier()  # the other ranks wait for rank 0's evaluation and checkpoint
    progress.close()
    wall = time.time() - started
    if not main:
        return {"run_id": job.run_id, "rank": distributed.rank, "optimizer_steps": state["step"], "wall_time_s": wall}
    training = {"framework": trained.framework, "batch_mode": mode,
                "compute_batch": state.get("compute_batch_used", micro),
                "precision": {"requested": recipe.get("precision", "fp32"), "effective": precision},
                "processes": distributed.world_size, "grad_probe": probe_summary(probe, state["grad_probe"]),
                "grad_probe_precision": execution.get("grad_probe_precision", "fp32") if probe else None,
                "timing_s": dict(timers), "method": method.summary,
                "released_costs": execution.get("cost_only_steps", {}),
                "param_groups": [{"name": g["name"], "base_lr": g["base_lr"], "weight_decay": g["weight_decay"],
                                  "parameters": sum(p.numel() for p in g["params"])}
                                 for g in optimizer.param_groups]}
    return _write_outputs(job, trained.export(), state, backbone_info(job), wall, resumed_from, device, training)


@contextlib.contextmanager
def _timed(timers: dict, key: str):
    started = time.time()
    try:
        yield
    finally:
        timers[key] += time.time() - started


def _fit_compute_batch(model, optimizer, batches, objective, frozen_text, autocast, requested: int, micro: int,
                       device) -> int:
    """The largest compute batch up to `requested` whose step fits in memory (accelerators only:
    on a CPU the requested value is used as it is)."""
    if device.type == "cpu" or requested <= micro:
        return requested

    def try_step(size: int) -> None:
        compute_batch_backward(model, batches, objective, frozen_text, autocast, lambda record: None, size, micro,
                               margin_keys=[(0, k) for k in range(len(batches))])  # any: its gradients are dropped
        optimizer.zero_grad(set_to_none=True)
    return fit_compute_batch(try_step, requested, micro, lambda line: print(line, file=sys.stderr), device)


def backbone_info(job: TrainJob) -> dict:
    return {"kind": job.init_kind, "model_config": job.model_config,
            "path": str(job.init_path) if job.init_path else None}


def _write_outputs(job: TrainJob, model, state: dict, init: dict, wall: float, resumed_from, device,
                   training: dict) -> dict:
    job.out_dir.mkdir(parents=True, exist_ok=True)
    model_path = job.out_dir / "model.pt"
    save_weights(model, job.model_config, model_path)
    saved_matches = _saved_weights_match(model_path, state["history"])
    outputs = {"model": {"path": str(model_path), "sha256": provenance.file_sha256(model_path)}}
    selected = _write_selected(job, state["history"])
    if selected is not None:
        outputs["model_selected"] = selected.pop("output")
    write_jsonl(job.out_dir / "steps.jsonl", state["steps"])
    if training["grad_probe"] is not None:
        write_jsonl(job.out_dir / "grad_probe.jsonl", state["grad_probe"])
    inputs = {"train_manifest": job.train_manifest, **{f"eval_manifest:{k}": v for k, v in job.eval_manifests.items()},
              **job.extra_inputs}
    if job.init_path:
        inputs["init_weights"] = job.init_path
    record = provenance.record(
        "train", inputs=inputs, spec=job.spec, spec_hash=job.spec_hash, wall_time_s=wall,
        params={"evaluation": job.evaluation, "grad_probe_every": job.execution.get("grad_probe_every", 0)},
        device={"type": str(device), "threads": job.execution["threads"], "processes": training["processes"]},
        extra={"run_id": job.run_id, "init": init, "initial_eval": state["initial_eval"],
               "history": state["history"], "training": training,
               "outputs": outputs, "selected_checkpoint": selected,
               "resumed_from_step": resumed_from, "optimizer_steps": state["step"],
               "final_weights_sha256": state["history"][-1]["weights_sha256"] if state["history"] else None,
               "saved_weights_match_last_epoch": saved_matches,
               **_throughput(job, state, wall, training["timing_s"])})
    write_json(job.out_dir / "train.json", record)
    return record


def _saved_weights_match(model_path: Path, history: list[dict]) -> bool | None:
    """Reread model.pt and check it holds exactly the weights evaluated at the last epoch, so its
    evaluation records can be taken from the per-epoch metrics without re-encoding."""
    if not history:
        return None
    _require_weights(model_path, history[-1]["weights_sha256"], "the last epoch")
    return True


def _require_weights(path: Path, weights_sha256: str, evaluated: str) -> None:
    saved = torch.load(path, map_location="cpu", weights_only=True)["state_dict"]
    if state_dict_digest(saved) != weights_sha256:
        raise RuntimeError(f"{path}: the saved weights differ from those evaluated at {evaluated} "
                           f"(sha256 {weights_sha256}); the file was not written intact")


def _write_selected(job: TrainJob, history: list[dict]) -> dict | None:
    """Copy the selected epoch's weights from the resume area to model_selected.pt, checked against
    the weights that epoch's metrics were computed on; returns what train.json records of it."""
    source = _selected_weights_file(job, history)
    if source is None:
        return None
    epoch = _selected_epoch(job, history)
    weights_sha256 = next(h["weights_sha256"] for h in history if h["epoch"] == epoch)
    target = job.out_dir / "model_selected.pt"
    with atomic_path(target) as tmp:
        shutil.copyfile(source, tmp)
        _require_weights(tmp, weights_sha256, f"epoch {epoch}")  # only an intact copy is renamed into place
    return {"benchmark": job.selection_benchmark, "metric": job.evaluation["selection_metric"], "epoch": epoch,
            "weights_sha256": weights_sha256,
            "output": {"path": str(target), "sha256": provenance.file_sha256(target)}}


def _throughput(job: TrainJob, state: dict, wall: float, timing: dict) -> dict:
    """Training images per second: over the whole job (per-epoch evaluation included), and over
    the optimizer steps alone, without evaluation and gradient-probe time (what Table A3 reports)."""
    images = job.spec["recipe"]["micro_batch"] * sum(h["train"]["micro_batches"] for h in state["history"])
    training_s = timing["train_s"] - timing["probe_s"]
    return {"images_per_second": images / wall if wall > 0 else 0.0,
            "training_time_s": training_s,
            "training_images_per_second": images / training_s if training_s > 0 else 0.0}
