"""The paper's models at their real size: one optimizer step of every framework the paper profile
trains, and SAM ViT-H and CLIP ViT-L/14-336 on one auxiliary image, all randomly initialised, on the CPU.

    nice -n 10 python benchmarks/paper_size_step.py --min-available-gb 12   # real depth, one framework at a time
    python benchmarks/paper_size_step.py --layers 1                        # real widths, one block per tower (CI)

Nothing of the paper profile otherwise runs at real size: the rehearsal trains a width-64, one-block
Long-CLIP layout at 112 px. Here:

* Long-CLIP-L (ViT-L/14 at 224 px, the 768-wide 248-token text tower; `hnclip.rehearsal.miniature_models.LONGCLIP_L`)
  is written as a random state dict in the released checkpoint's key layout and loaded through the loader
  a paper run uses (`model_setup.build_model` -> `factory.load_backbone` -> `longclip.load_longclip`, with the
  file's own sha256 as its pin).
* Each framework (`FRAMEWORKS`: the params.yaml method it is, on Table A3's training set, so GOAL pays its
  released cost-only operations as the timed run does) takes one optimizer step through the trainer's own code:
  the paper profile's run spec from the registry (objective, framework settings, recipe), `build_model`,
  `build_method`, `build_optimizer`, `group_backward` in the batch mode the paper's execution settings give,
  the optimizer step, `after_step` and the logit-scale clamp. One micro-batch of 2 pairs (grad_accum 1),
  images through the model's own 224 px preprocess, synthetic captions longer than the context, so every
  caption fills all 248 tokens. The micro-batch sits at the start of the second epoch, where every term of
  every framework has a non-zero weight (FineLIP ramps L_fine from 0 over the first epoch).
* GOAL's and StructXLIP's auxiliary inputs (segments.jsonl, edges.jsonl) come from the project's builders
  (`build_lism`, `build_edges`) with the paper profile's LISM and edge settings, the CPU segmenter and the
  benchmark's own Long-CLIP as matcher. SAM ViT-H and CLIP ViT-L/14-336 (their transformers configurations,
  random weights, saved in the Hub layout) run separately on one of the images through the project's
  segmenter (`SamSegmenter`, the paper's mask-generation settings) and matcher (`hf_clip_encoders`).

Each framework and each auxiliary model runs in its own forked process (the parent imports, never computes),
so its peak resident memory (`os.wait4`'s ru_maxrss, which includes the parent's imported modules, as a
training process would) is its own. A process checks its losses are finite and that every trainable
parameter got a gradient; a failed check, an exception or a kill is its record's `status`, and the script
exits non-zero if any record is not `ok` (`out_of_memory` included). `--min-available-gb` waits (`--wait-s`)
before each process until the machine has that much memory available; `--memory-floor-gb` kills a process
when the machine's available memory falls below it (recorded as `out_of_memory`), before the kernel's
out-of-memory killer picks some other job. `--layers N` keeps every width, head count, patch, image size and
token count and builds at most N blocks per tower (SAM: its last block global). One JSON line per framework
and per auxiliary model is appended to --out.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmark scripts
from command1_costs import append_record, gemm_gflops, utc_now  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "paper_size_step.jsonl"
PROFILE = "paper"
TRAIN_SET = "dci"      # Table A3's training set: its GOAL run pays the released cost-only operations
MICRO_BATCH, GRAD_ACCUM = 2, 1
DEVICE = "cpu"         # --device: set in the parent before the processes fork (which never touches CUDA)
EPOCH, MICRO_BATCH_INDEX = 1, 0   # the second epoch's first micro-batch: every term weighted (FineLIP's ramp is 1)
IMAGE_SIZE = (1024, 768)  # 4:3 as DOCCI's photos; the towers see their own 224 / 336 / 1024 px input
# framework -> the params.yaml method that trains it
FRAMEWORKS = {"longclip_ft": "longclip_ft", "hn_clip": "hn_clip", "frozen_g": "hn_clip_frozen_g", "lora": "lora",
              "dora": "dora", "finelip": "finelip", "goal": "goal", "structxlip": "structxlip"}
AUXILIARY_MODELS = ("sam_vit_h", "clip_vit_l14_336")
# facebook/sam-vit-huge's vision encoder (its config.json): global attention in every 8th block. Random weights
# are drawn at std 0.02: the config's initializer_range (1e-10) leaves every activation near 1e-20, where the
# CPU's matrix products run about 10x slower than on a trained model's activations.
SAM_VIT_H = {"hidden_size": 1280, "num_hidden_layers": 32, "num_attention_heads": 16, "mlp_dim": 5120,
             "global_attn_indexes": [7, 15, 23, 31], "output_channels": 256, "image_size": 1024, "patch_size": 16,
             "window_size": 14, "initializer_range": 0.02}
# openai/clip-vit-large-patch14-336 (its config.json)
CLIP_L14_336 = {"projection_dim": 768,
                "text": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                         "num_attention_heads": 12, "max_position_embeddings": 77},
                "vision": {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
                           "num_attention_heads": 16, "image_size": 336, "patch_size": 14}}
SAM_POINTS_PER_SIDE = 32   # GOAL's released setting (SamSegmenter's default)
GB = 1024 ** 3
# Trainable parameters a framework leaves without a gradient by design (the check fails on any other):
# FineLIP's released mode trains L_fine alone, a hinge on token cosines that has no temperature, so the
# logit scale gets no gradient (its InfoNCE is a no-grad diagnostic; with + L_HN it trains). AdamW skips a
# parameter without a gradient, so it keeps its reset value.
NO_GRADIENT_BY_DESIGN = {"finelip": {"logit_scale"}}


# ---------------------------------------------------------------------------------------------
# Architectures
# ---------------------------------------------------------------------------------------------

def longclip_architecture(layers: int | None) -> dict:
    """Long-CLIP-L's `longclip_layout_state_dict` arguments, with at most `layers` blocks per tower."""
    from hnclip.rehearsal.miniature_models import LONGCLIP_L
    if layers is None:
        return dict(LONGCLIP_L)
    return {**LONGCLIP_L, "layers": min(layers, LONGCLIP_L["layers"]),
            "text_layers": min(layers, LONGCLIP_L["text_layers"])}


def sam_vision_config(layers: int | None) -> dict:
    depth = SAM_VIT_H["num_hidden_layers"] if layers is None else min(layers, SAM_VIT_H["num_hidden_layers"])
    kept = [i for i in SAM_VIT_H["global_attn_indexes"] if i < depth]
    return {**SAM_VIT_H, "num_hidden_layers": depth, "global_attn_indexes": kept or [depth - 1]}


def clip_configs(layers: int | None) -> dict:
    def tower(config: dict) -> dict:
        depth = config["num_hidden_layers"]
        return {**config, "num_hidden_layers": depth if layers is None else min(layers, depth)}
    return {**CLIP_L14_336, "text": tower(CLIP_L14_336["text"]), "vision": tower(CLIP_L14_336["vision"])}


# ---------------------------------------------------------------------------------------------
# Isolated processes and the machine's memory
# ---------------------------------------------------------------------------------------------

def available_gb() -> float:
    """MemAvailable: what `free` reports as available."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024 / GB
    raise RuntimeError("/proc/meminfo has no MemAvailable")


def total_gb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024 / GB
    raise RuntimeError("/proc/meminfo has no MemTotal")


def _rss_gb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024 / GB
    except OSError:
        pass
    return 0.0


def wait_for_memory(min_gb: float, wait_s: float, max_waits: int, what: str) -> dict:
    """Wait until the machine has `min_gb` available (at most `max_waits` waits of `wait_s`)."""
    waits = 0
    while available_gb() < min_gb and waits < max_waits:
        print(f"{what}: {available_gb():.1f} GB available < {min_gb} GB; waiting {wait_s:.0f} s", flush=True)
        time.sleep(wait_s)
        waits += 1
    return {"available_gb_before": round(available_gb(), 2), "memory_waits": waits,
            "memory_ready": available_gb() >= min_gb}


def run_isolated(fn: Callable[..., dict], *args, floor_gb: float = 0.0, poll_s: float = 0.2) -> dict:
    """`fn(*args)` in a forked process. Returns its result dict (or status error/out_of_memory) with the
    process's own wall time and peak resident memory (ru_maxrss from wait4). The parent kills it if the
    machine's available memory falls below `floor_gb`."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        result_path = Path(handle.name)
    parent_rss = _rss_gb(os.getpid())
    started = time.perf_counter()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: compute, write the result, leave without running the parent's cleanup
        code = 0
        try:
            result = {"status": "ok", **fn(*args)}
        except BaseException as error:  # noqa: BLE001 - every failure is the record's status
            result = {"status": "error", "error": f"{type(error).__name__}: {error}",
                      "traceback": traceback.format_exc()}
            print(result["traceback"], file=sys.stderr, flush=True)
            code = 1
        try:
            result_path.write_text(json.dumps(result, default=str))
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    killed_for_memory, sampled_rss, lowest_available = None, 0.0, available_gb()
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            break
        sampled_rss = max(sampled_rss, _rss_gb(pid))
        lowest_available = min(lowest_available, available_gb())
        if killed_for_memory is None and lowest_available < floor_gb:
            killed_for_memory = {"available_gb": round(lowest_available, 2), "process_rss_gb": round(_rss_gb(pid), 2)}
            os.kill(pid, signal.SIGKILL)
        time.sleep(poll_s)
    wall = time.perf_counter() - started
    text = result_path.read_text() if result_path.exists() else ""
    result_path.unlink(missing_ok=True)
    result = json.loads(text) if text else {}
    measured = {"process_wall_s": round(wall, 2), "peak_rss_gb": round(usage.ru_maxrss * 1024 / GB, 3),
                "sampled_peak_rss_gb": round(sampled_rss, 3), "parent_rss_gb_at_fork": round(parent_rss, 3),
                "lowest_available_gb": round(lowest_available, 2)}
    if killed_for_memory is not None:
        return {**result, "status": "out_of_memory", **measured,
                "error": f"killed by the benchmark: the machine's available memory fell to "
                         f"{killed_for_memory['available_gb']} GB (floor {floor_gb} GB) at a process RSS of "
                         f"{killed_for_memory['process_rss_gb']} GB"}
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        return {**result, "status": "out_of_memory" if signum == signal.SIGKILL else "error", **measured,
                "error": f"killed by signal {signal.Signals(signum).name}"
                         + (" (the kernel's out-of-memory killer?)" if signum == signal.SIGKILL else "")}
    if not result:
        return {"status": "error", **measured, "error": f"exited with status {os.WEXITSTATUS(status)}, no result"}
    return {**result, **measured}


# ---------------------------------------------------------------------------------------------
# Inputs: the checkpoint, two image-caption pairs, their auxiliary inputs, the auxiliary models
# ---------------------------------------------------------------------------------------------

def paper_registry():
    from hnclip.config.params import load_params
    from hnclip.config.registry import Registry
    return Registry(load_params(ROOT / "params.yaml"), PROFILE)


def long_caption(caption: str, count_tokens: Callable[[str], int], context: int) -> str:
    """The caption's sentences repeated until it is longer than the context (it fills all of it)."""
    from hnclip.auxiliary.lism import sentences
    parts, extra = [caption], sentences(caption)
    k = 0
    while count_tokens(" ".join(parts)) <= context:
        parts.append(extra[k % len(extra)] + ".")
        k += 1
    return " ".join(parts)


def write_pairs(folder: Path, tokenizer, context: int, seed: int = 0) -> Path:
    """Two synthetic DOCCI-style scenes at `IMAGE_SIZE` with captions longer than the context: the manifest."""
    import numpy as np
    from PIL import Image

    from hnclip.data.manifest import ManifestRow, write_manifest
    from hnclip.data.synthetic import generate_split
    from hnclip.hashing import file_sha256
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for sample in generate_split("docci", "train", 2, seed, image_size=IMAGE_SIZE[1]):
        path = folder / f"{sample.id}.png"
        Image.fromarray(np.asarray(sample.image)).resize(IMAGE_SIZE, Image.NEAREST).save(path)
        caption = long_caption(sample.caption, lambda text: len(tokenizer.encode(text)) + 2, context)
        rows.append(ManifestRow(id=sample.id, image=path.name, caption=caption, short_caption=None, split="train",
                                source_sha256=file_sha256(path)))
    manifest = folder / "train.jsonl"
    write_manifest(manifest, rows)
    return manifest


def prepare_longclip(work: Path, layers: int | None, aux: dict) -> dict:
    """The Long-CLIP-layout checkpoint, the two pairs and their segments and edge maps (paper settings,
    CPU segmenter, this Long-CLIP as matcher)."""
    import torch

    from hnclip.auxiliary.edges import EdgeSettings, build_edges
    from hnclip.auxiliary.lism import LismSettings, backbone_encoders, build_lism
    from hnclip.auxiliary.segments import CpuSegmenter
    from hnclip.hashing import file_sha256
    from hnclip.models.factory import load_backbone
    from hnclip.rehearsal.miniature_models import save_longclip_checkpoint
    started = time.perf_counter()
    architecture = longclip_architecture(layers)
    checkpoint = save_longclip_checkpoint(work / "longclip-L.pt", **architecture)
    written = time.perf_counter()
    sha256 = file_sha256(checkpoint)
    backbone = load_backbone("longclip", checkpoint, "ViT-L-14-quickgelu", sha256)
    context = backbone.tokenizer.context_length
    manifest = write_pairs(work / "pairs", backbone.tokenizer, context)
    torch.manual_seed(0)
    segments = build_lism(manifest, work / "segments", CpuSegmenter(), backbone_encoders(backbone),
                          LismSettings(**aux["lism"]))
    edges = build_edges(manifest, work / "segments" / "segments.jsonl", work / "edges", EdgeSettings(**aux["edges"]))
    return {"checkpoint": str(checkpoint), "checkpoint_sha256": sha256, "checkpoint_bytes": checkpoint.stat().st_size,
            "architecture": architecture, "manifest": str(manifest), "context": context,
            "segments": str(work / "segments" / "segments.jsonl"), "edges": str(work / "edges" / "edges.jsonl"),
            "auxiliary_summary": {"segments": {k: segments[k] for k in ("images", "with_segment", "no_segment",
                                                                         "mean_segments_kept", "mean_matches")},
                                  "edges": {k: edges[k] for k in ("images", "edge_crops")}},
            "checkpoint_write_s": round(written - started, 2), "prepare_s": round(time.perf_counter() - started, 2)}


def prepare_sam(folder: Path, layers: int | None) -> dict:
    """A random SamModel of ViT-H's configuration in the Hub layout (config.json, preprocessor_config.json,
    model.safetensors); SamImageProcessor's defaults are sam-vit-huge's (1024 px, padded)."""
    import torch
    from transformers import SamConfig, SamImageProcessor, SamModel
    started = time.perf_counter()
    torch.manual_seed(0)
    vision = sam_vision_config(layers)
    model = SamModel(SamConfig(vision_config=vision))
    model.save_pretrained(folder)
    SamImageProcessor().save_pretrained(folder)
    return {"vision_config": vision, "parameters": sum(p.numel() for p in model.parameters()),
            "prepare_s": round(time.perf_counter() - started, 2)}


def prepare_clip(folder: Path, layers: int | None) -> dict:
    """A random CLIPModel of ViT-L/14-336's configuration in the Hub layout of the real repo: the processor
    and tokenizer files as the rehearsal writes them (`save_tiny_clip`), then the real-size config and
    pytorch_model.bin."""
    import torch
    from transformers import CLIPConfig, CLIPModel

    from hnclip.rehearsal.miniature_models import HF_BOS, HF_EOS, clip_bpe, save_tiny_clip
    started = time.perf_counter()
    configs = clip_configs(layers)
    vocab, merges = clip_bpe()
    save_tiny_clip(folder, image_size=configs["vision"]["image_size"], patch=configs["vision"]["patch_size"],
                   text_context=configs["text"]["max_position_embeddings"], vocab=vocab, merges=merges)
    torch.manual_seed(0)
    text = {**configs["text"], "vocab_size": len(vocab), "bos_token_id": vocab[HF_BOS], "eos_token_id": vocab[HF_EOS],
            "pad_token_id": vocab[HF_EOS]}
    model = CLIPModel(CLIPConfig(text_config=text, vision_config=configs["vision"],
                                 projection_dim=configs["projection_dim"]))
    model.config.save_pretrained(folder)
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    return {"config": {**configs, "text": text}, "parameters": sum(p.numel() for p in model.parameters()),
            "prepare_s": round(time.perf_counter() - started, 2)}


PRELOAD = ("torch", "open_clip", "peft", "transformers.pipelines", "transformers.models.sam.modeling_sam",
           "transformers.models.clip.modeling_clip", "hnclip.training.loop", "hnclip.models.longclip",
           "hnclip.models.adapters", "hnclip.losses.finelip", "hnclip.losses.goal", "hnclip.losses.structxlip",
           "hnclip.auxiliary.batches", "hnclip.auxiliary.lism", "hnclip.auxiliary.edges",
           "hnclip.rehearsal.miniature_models", "throughput")


def preload() -> None:
    """Import, in the parent, what the processes run: each forked process starts with it (the imports take
    about 10 s of a loaded 2-core machine) and counts it in its resident memory, as a training process would."""
    import importlib
    for name in PRELOAD:
        importlib.import_module(name)


def machine() -> dict:
    """Where the measurements ran (throughput.py's environment, plus memory and speed); in a process of its
    own, so that the parent never starts torch's threads before it forks."""
    import torch
    from throughput import environment
    return {**environment(torch.device(DEVICE)), "memory_total_gb": round(total_gb(), 1),
            "gemm_gflops_1thread": gemm_gflops()}


# ---------------------------------------------------------------------------------------------
# One optimizer step of one framework
# ---------------------------------------------------------------------------------------------

def paper_job(reg, framework: str, prepared: dict, work: Path):
    """The paper profile's run of `framework` on TRAIN_SET as a TrainJob reading this benchmark's files,
    with the micro-batch of this benchmark; with the paper's recipe and the method's params."""
    from hnclip.training.loop import TrainJob
    method = reg.params["methods"][FRAMEWORKS[framework]]
    run = reg.run_spec(TRAIN_SET, method, reg.profile["seeds"][0], register=False)
    spec = copy.deepcopy(run.spec)
    paper_recipe = dict(spec["recipe"])
    spec["recipe"].update(micro_batch=MICRO_BATCH, grad_accum=GRAD_ACCUM)
    execution = {**reg.profile["execution"], "cost_only_settings": reg.released_costs(run.run_id),
                 "compute_batch": reg.profile["recipe"].get("compute_batch", paper_recipe["micro_batch"]),
                 "threads": min(reg.profile["execution"]["threads"], os.cpu_count() or 1), "device": DEVICE}
    auxiliary = {kind: Path(prepared[kind]) for kind in reg.auxiliary_inputs(run.run_id)}
    job = TrainJob(run_id=run.run_id, spec=spec, spec_hash=run.spec_hash, init_kind="longclip",
                   init_path=Path(prepared["checkpoint"]), model_config=reg.backbone_spec()["model_config"],
                   train_manifest=Path(prepared["manifest"]), eval_manifests={}, out_dir=work / "run",
                   checkpoint_dir=work / "ckpt", execution=execution, evaluation=reg.params["evaluation"],
                   auxiliary=auxiliary, init_sha256=prepared["checkpoint_sha256"])
    return job, paper_recipe, method


def _named_trainable(trained) -> list[tuple[str, Any]]:
    modules = [("", trained.module)] + ([("extra.", trained.extra)] if trained.extra is not None else [])
    return [(prefix + name, p) for prefix, module in modules for name, p in module.named_parameters()
            if p.requires_grad]


def _tower_shapes(model, batch_tokens, pad_id: int) -> dict:
    visual, text = model.visual, model.transformer
    return {"image_size": list(visual.image_size) if isinstance(visual.image_size, tuple) else visual.image_size,
            "patch_size": list(visual.patch_size) if isinstance(visual.patch_size, tuple) else visual.patch_size,
            "vision_width": visual.transformer.width, "vision_layers": visual.transformer.layers,
            "vision_heads": visual.transformer.resblocks[0].attn.num_heads,
            "text_width": text.width, "text_layers": text.layers, "text_heads": text.resblocks[0].attn.num_heads,
            "embed_dim": int(model.text_projection.shape[1]), "vocab_size": int(model.token_embedding.num_embeddings),
            "context_length": int(model.context_length),
            "caption_tokens": [int(n) for n in (batch_tokens != pad_id).sum(dim=1)]}


def train_step(framework: str, job, paper_recipe: dict, method_params: dict) -> dict:
    """One optimizer step of `framework` through the trainer's code; raises if a check fails."""
    import torch

    from hnclip.data.loader import PairDataset
    from hnclip.losses.objective import with_run_seed
    from hnclip.models.towers import PAD_ID
    from hnclip.runtime.device import autocast_context
    from hnclip.training.methods import Position, build_method
    from hnclip.training.model_setup import build_model, effective_precision
    from hnclip.training.schedule import build_optimizer, clamp_logit_scale, set_learning_rates
    from hnclip.training.step import gradient_norm, group_backward, group_backward_mode, require_finite
    started = time.perf_counter()
    spec, recipe, execution = job.spec, job.spec["recipe"], job.execution
    objective = with_run_seed(spec["objective"], spec["seed"])
    torch.set_num_threads(execution["threads"])
    torch.manual_seed(spec["seed"])
    device = torch.device(DEVICE)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    backbone, trained, frozen_text = build_model(job, device)
    loaded = time.perf_counter()
    train_set = PairDataset.from_manifest(job.train_manifest, backbone.preprocess, backbone.tokenizer)
    settings = {**objective.get("settings", {}), **execution.get("cost_only_settings", {})}
    method = build_method(objective["framework"], objective, settings, trained.module, train_set, job.auxiliary,
                          backbone.tokenizer, frozen_text)
    if method.extra_module is not None:
        trained.attach(method.extra_module)
    optimizer = build_optimizer(trained.module, recipe, method.extra_module)
    mode = group_backward_mode(recipe, execution, method)
    precision = effective_precision(device, recipe.get("precision", "fp32"))
    set_learning_rates(optimizer, 1.0)  # the base rates
    batches = [method.to_device(method.load(list(range(MICRO_BATCH))), device)]
    positions = [Position(EPOCH, MICRO_BATCH_INDEX, 1)]
    prepared_s = time.perf_counter()

    def check(values: dict) -> None:
        require_finite(values, job.run_id, job.checkpoint_dir, method.loss_names, EPOCH, 0)

    optimizer.zero_grad(set_to_none=True)
    model = trained.module
    records = group_backward(mode, model, method, batches, positions, objective, frozen_text,
                             lambda: autocast_context(device, precision), check,
                             execution["compute_batch"], recipe["micro_batch"], lambda pairs: None)
    _synchronize(device)
    backward_done = time.perf_counter()
    named = _named_trainable(trained)
    without_grad = [name for name, p in named if p.grad is None]
    expected_without = NO_GRADIENT_BY_DESIGN.get(framework, set()) if objective["gamma"] == 0 else set()
    unexpected_without = [name for name in without_grad if name not in expected_without]
    non_finite_grad = [name for name, p in named if p.grad is not None and not bool(torch.isfinite(p.grad).all())]
    grad_norm = gradient_norm(model)
    optimizer.step()
    method.after_step(model)
    clamp_logit_scale(model, recipe.get("max_logit_scale"))
    _synchronize(device)
    stepped = time.perf_counter()
    non_finite_weights = [name for name, p in named if not bool(torch.isfinite(p.detach()).all())]
    losses = {name: value for name, value in records[0].items() if name in method.loss_names}
    base = backbone.model
    images, tokens = batches[0] if isinstance(batches[0], tuple) else (batches[0].images, batches[0].tokens)
    result = {
        "method": FRAMEWORKS[framework], "label": method_params["label"], "run_id": job.run_id,
        "objective": {k: v for k, v in spec["objective"].items() if k != "settings"},
        "settings": spec["objective"].get("settings"), "cost_only_settings": execution.get("cost_only_settings", {}),
        "batch_mode": mode, "precision": {"requested": recipe.get("precision", "fp32"), "effective": precision},
        "recipe": {k: recipe[k] for k in ("lr", "weight_decay", "module_lr", "decay_all", "adapter") if k in recipe},
        "paper_micro_batch": paper_recipe["micro_batch"], "paper_grad_accum": paper_recipe["grad_accum"],
        "shapes": {**_tower_shapes(base, tokens, PAD_ID), "micro_batch": MICRO_BATCH, "grad_accum": GRAD_ACCUM,
                   "image_tensor": list(images.shape), "token_tensor": list(tokens.shape),
                   "caption_tokens_untruncated": [len(backbone.tokenizer.encode(r.caption)) + 2
                                                  for r in train_set.rows[:MICRO_BATCH]]},
        "position": {"epoch": EPOCH + 1, "micro_batch": MICRO_BATCH_INDEX},
        "losses": losses, "losses_finite": all(math.isfinite(v) for v in losses.values()),
        "grad_norm": grad_norm,
        "trainable_parameters": sum(p.numel() for _, p in named), "trainable_tensors": len(named),
        "model_parameters": sum(p.numel() for p in base.parameters()),
        "extra_module_parameters": sum(p.numel() for p in trained.extra.parameters()) if trained.extra else 0,
        "frozen_text_parameters": sum(p.numel() for p in frozen_text.parameters()) if frozen_text is not None else 0,
        "params_without_grad": without_grad, "params_without_grad_unexpected": unexpected_without,
        "params_with_non_finite_grad": non_finite_grad,
        "params_non_finite_after_step": non_finite_weights,
        "param_groups": [{"name": g["name"], "base_lr": g["base_lr"], "weight_decay": g["weight_decay"],
                          "parameters": sum(p.numel() for p in g["params"])} for g in optimizer.param_groups],
        "method_summary": method.summary, "threads": torch.get_num_threads(),
        "timing_s": {"load_model": round(loaded - started, 2), "data_and_method": round(prepared_s - loaded, 2),
                     "forward_backward": round(backward_done - prepared_s, 2),
                     "optimizer_step": round(stepped - backward_done, 2), "step": round(stepped - prepared_s, 2)},
        "wall_s": round(stepped - started, 2), "device": str(device),
        "peak_device_gb": round(torch.cuda.max_memory_allocated(device) / GB, 3) if device.type == "cuda" else None,
        "self_peak_rss_gb": round(_self_maxrss_gb(), 3)}
    problems = []
    if not result["losses_finite"]:
        problems.append(f"non-finite loss terms {losses}")
    if unexpected_without:
        problems.append(f"{len(unexpected_without)} trainable parameter(s) got no gradient: {unexpected_without}")
    if non_finite_grad:
        problems.append(f"non-finite gradients in {non_finite_grad}")
    if non_finite_weights:
        problems.append(f"non-finite weights after the step in {non_finite_weights}")
    if problems:
        raise CheckFailed("; ".join(problems), result)
    return result


class CheckFailed(AssertionError):
    """A check of the step failed; the measurements so far travel with it into the record."""

    def __init__(self, message: str, measured: dict):
        super().__init__(message)
        self.measured = measured


def _synchronize(device) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _self_maxrss_gb() -> float:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB


def checked_step(framework: str, job, paper_recipe: dict, method_params: dict) -> dict:
    """`train_step`, a failed check kept as the record's status with its measurements."""
    try:
        return train_step(framework, job, paper_recipe, method_params)
    except CheckFailed as failed:
        return {**failed.measured, "status": "check_failed", "error": str(failed)}


# ---------------------------------------------------------------------------------------------
# The auxiliary models on one image
# ---------------------------------------------------------------------------------------------

def run_sam(folder: Path, prepared: dict, aux: dict, threads: int, points_per_side: int) -> dict:
    """The paper's segmenter (SAM through transformers' mask-generation pipeline, 32x32 points, IoU 0.88,
    stability 0.95, 128 points per batch) on one image; the masks through the paper's area filter. Each
    point's masks are upsampled to the image's size before the quality filter: on a CPU that, not the
    encoder, is most of the time, so the CI test asks for fewer points (`points_per_side`)."""
    import torch
    from PIL import Image

    from hnclip.auxiliary.segments import SamSegmenter, segments_of
    from hnclip.data.manifest import read_manifest
    torch.set_num_threads(threads)
    image_path = read_manifest(prepared["manifest"])[0].image
    started = time.perf_counter()
    segmenter = SamSegmenter(folder, points_per_side=points_per_side,
                             points_per_batch=aux["segmenter"].get("points_per_batch", 128), device=DEVICE)
    loaded = time.perf_counter()
    with Image.open(image_path) as opened:
        image = opened.convert("RGB")
    masks = segmenter.masks(image)
    segmented = time.perf_counter()
    kept = segments_of(image, masks, aux["lism"]["min_area"], aux["lism"]["max_area"])
    model = segmenter.generator.model
    return {"model": "SamModel", "settings": segmenter.settings, "image_size": list(image.size),
            "parameters": sum(p.numel() for p in model.parameters()),
            "vision": {k: getattr(model.config.vision_config, k) for k in
                       ("hidden_size", "num_hidden_layers", "num_attention_heads", "global_attn_indexes",
                        "image_size", "patch_size", "window_size", "mlp_dim")},
            "masks": len(masks), "segments_kept": len(kept), "threads": torch.get_num_threads(),
            "timing_s": {"load_model": round(loaded - started, 2), "masks": round(segmented - loaded, 2)},
            "wall_s": round(time.perf_counter() - started, 2), "self_peak_rss_gb": round(_self_maxrss_gb(), 3)}


def run_clip(folder: Path, prepared: dict, threads: int) -> dict:
    """The paper's matcher (`hf_clip_encoders`) on one image: the image and its caption's sentences encoded
    and matched, as LISM does (sentences beyond the 77-token context counted: LISM skips such an image)."""
    import torch
    from PIL import Image

    from hnclip.auxiliary.lism import hf_clip_encoders, match_sentences, sentences
    from hnclip.data.manifest import read_manifest
    torch.set_num_threads(threads)
    row = read_manifest(prepared["manifest"])[0]
    started = time.perf_counter()
    encoders = hf_clip_encoders(folder, device=DEVICE)
    loaded = time.perf_counter()
    with Image.open(row.image) as opened:
        image = opened.convert("RGB")
    texts = sentences(row.caption)
    image_features = encoders.encode_images([image])
    text_features = encoders.encode_texts(texts)
    matches = match_sentences(text_features, image_features)
    encoded = time.perf_counter()
    finite = bool(all(math.isfinite(float(v)) for v in [*image_features.ravel(), *text_features.ravel()]))
    if not finite:
        raise RuntimeError("the matcher's features are not finite")
    return {"model": "CLIPModel", "image_size": list(image.size), "context": encoders.context_length,
            "features": [list(image_features.shape), list(text_features.shape)], "sentences": len(texts),
            "matches": len(matches), "features_finite": finite,
            "sentences_over_context": sum(encoders.count_tokens(t) > encoders.context_length for t in texts),
            "threads": torch.get_num_threads(),
            "timing_s": {"load_model": round(loaded - started, 2), "encode_and_match": round(encoded - loaded, 2)},
            "wall_s": round(time.perf_counter() - started, 2), "self_peak_rss_gb": round(_self_maxrss_gb(), 3)}


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=None,
                        help="at most this many blocks per tower (widths, heads, sizes and tokens stay real)")
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS), help=f"comma-separated, of {list(FRAMEWORKS)}")
    parser.add_argument("--auxiliary-models", default=",".join(AUXILIARY_MODELS),
                        help=f"comma-separated, of {list(AUXILIARY_MODELS)}; '' for none")
    parser.add_argument("--min-available-gb", type=float, default=0.0,
                        help="wait before each process until the machine has this much memory available")
    parser.add_argument("--wait-s", type=float, default=60.0, help="seconds between memory checks")
    parser.add_argument("--max-waits", type=int, default=60, help="then run anyway (the record says so)")
    parser.add_argument("--memory-floor-gb", type=float, default=1.0,
                        help="kill a process when the machine's available memory falls below this")
    parser.add_argument("--sam-points-per-side", type=int, default=SAM_POINTS_PER_SIDE,
                        help=f"SAM's point grid (the paper's: {SAM_POINTS_PER_SIDE}); the CI test asks for fewer")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads of the auxiliary models (default: as the paper's training, capped)")
    parser.add_argument("--workdir", type=Path, default=None, help="keep the generated files here (default: a "
                                                                    "temporary folder, removed at the end)")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda: the steps and the auxiliary models on the "
                                                        "GPU (peak_device_gb: the memory torch allocated there)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON lines are appended here")
    args = parser.parse_args(argv)
    for value, known in ((args.frameworks, FRAMEWORKS), (args.auxiliary_models, AUXILIARY_MODELS)):
        unknown = {v for v in value.split(",") if v} - set(known)
        if unknown:
            parser.error(f"unknown {sorted(unknown)}; expected some of {list(known)}")
    if args.layers is not None and args.layers < 1:
        parser.error("--layers must be at least 1")
    return args


def main(argv: list[str] | None = None) -> list[dict]:
    global DEVICE
    args = parse_args(argv)
    DEVICE = args.device
    frameworks = [f for f in args.frameworks.split(",") if f]
    auxiliary_models = [m for m in args.auxiliary_models.split(",") if m]
    if args.workdir is None:
        holder = tempfile.TemporaryDirectory(prefix="paper_size_step.")
        work = Path(holder.name)
    else:
        holder, work = None, args.workdir
        work.mkdir(parents=True, exist_ok=True)
    reg = paper_registry()
    aux = reg.profile["auxiliary"]
    threads = args.threads or min(reg.profile["execution"]["threads"], os.cpu_count() or 1)
    gate = dict(floor_gb=args.memory_floor_gb)
    records: list[dict] = []

    def ready(what: str) -> dict:
        return wait_for_memory(args.min_available_gb, args.wait_s, args.max_waits, what)

    try:
        preload()
        facts = run_isolated(machine, **gate)
        if facts["status"] != "ok":
            raise SystemExit(f"reading the machine's facts failed: {facts.get('error')}")
        facts = {k: v for k, v in facts.items() if k not in ("status", "process_wall_s", "peak_rss_gb",
                                                              "sampled_peak_rss_gb", "lowest_available_gb")}
        ready("prepare")
        prepared = run_isolated(prepare_longclip, work, args.layers, aux, **gate)
        if prepared["status"] != "ok":
            raise SystemExit(f"preparing the Long-CLIP checkpoint and inputs failed: {prepared.get('error')}\n"
                             f"{prepared.get('traceback', '')}")
        common = {"benchmark": "paper_size_step", "commit": facts["git"]["commit"], "machine": facts,
                  "layers_cap": args.layers, "real_size": args.layers is None,
                  "longclip_architecture": prepared["architecture"],
                  "checkpoint_bytes": prepared["checkpoint_bytes"], "train_set": TRAIN_SET, "profile": PROFILE,
                  "min_available_gb": args.min_available_gb,
                  "prepare": {k: prepared[k] for k in ("checkpoint_write_s", "prepare_s", "process_wall_s",
                                                       "peak_rss_gb", "auxiliary_summary")}}
        for framework in frameworks:
            memory = ready(framework)
            result = run_isolated(checked_step, framework, *paper_job(reg, framework, prepared, work / framework),
                                  **gate)
            records.append(_finish({**common, "part": "train_step", "framework": framework, **memory, **result},
                                   args.out))
        for name in auxiliary_models:
            folder = work / name
            prepare = prepare_sam if name == "sam_vit_h" else prepare_clip
            ready(f"{name} files")
            made = run_isolated(prepare, folder, args.layers, **gate)
            memory = ready(name)
            if made["status"] == "ok":
                if name == "sam_vit_h":
                    result = run_isolated(run_sam, folder, prepared, aux, threads, args.sam_points_per_side,
                                          **gate)
                else:
                    result = run_isolated(run_clip, folder, prepared, threads, **gate)
                result["config"] = made.get("vision_config") or made.get("config")
                result["prepare_s"] = made.get("prepare_s")
            else:
                result = {**made, "error": f"writing the model files failed: {made.get('error')}"}
            records.append(_finish({**common, "part": "auxiliary_model", "framework": name, **memory, **result},
                                   args.out))
    finally:
        if holder is not None:
            holder.cleanup()
    failed = [r for r in records if r["status"] != "ok"]
    if failed:
        raise SystemExit("paper_size_step: " + "; ".join(f"{r['framework']}: {r['status']}: {r.get('error')}"
                                                         for r in failed))
    return records


def _finish(record: dict, out: Path) -> dict:
    record = {"timestamp": utc_now(), **record}
    append_record(out, record)
    line = (f"{record['framework']:18s} {record['status']:14s} wall {record.get('wall_s', float('nan')):8.1f} s  "
            f"peak {record.get('peak_rss_gb', float('nan')):6.2f} GB")
    if record["part"] == "train_step" and "trainable_parameters" in record:
        line += f"  trainable {record['trainable_parameters']:,}"
    print(line, file=sys.stderr, flush=True)
    return record


if __name__ == "__main__":
    main()
