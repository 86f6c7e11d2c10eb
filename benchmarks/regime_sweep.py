"""Regime exploration for issue 13: which settings of the embedded miniature bring it into the paper's regime.

    python benchmarks/regime_sweep.py --trial baseline          # a preset trial (see TRIALS)
    python benchmarks/regime_sweep.py --settings '{"name": "x", "ft_lr": 3e-5, "pretrain_scale": 100}'
    python benchmarks/regime_sweep.py --list
    python benchmarks/regime_sweep.py --table                   # the results file as a Markdown table

One trial overrides the `tiny` profile's params in memory (params.yaml is read, never written), builds the
DOCCI-like benchmark and the pretraining corpus, pretrains the backbone and fine-tunes plain InfoNCE
(`longclip_ft`) for one epoch, all in a scratch directory (default /tmp/regime_sweep), through the
library's own jobs (`hnclip.commands.data.build_dataset`, `hnclip.training.jobs.pretrain_job` /
`finetune_job`, `hnclip.training.loop.train`). It measures the regime preconditions the pipeline's
`regime` rule checks (params.yaml `regime_targets`) and appends one JSON line to
benchmarks/results/regime_sweep.jsonl:

* pretraining wall time (and the final pretraining logit scale);
* zero-shot R@1 on the DOCCI-like test split, both directions (the fine-tuning run's initial evaluation);
* mean pairwise and mean hardest-negative cosine of the DOCCI test captions under the pretrained text
  encoder (`hnclip.evaluation.caption_geometry`);
* the epoch-1 share of micro-batches with InfoNCE < 1e-3 (`saturated_frac` of the step log) for plain
  fine-tuning with the profile's recipe (logit scale reset to 100, 16 x 8 accumulation, AdamW + cosine
  over the recipe's 4 epochs: the run is stopped at the end of epoch 1, so epoch 1 sees exactly the
  pipeline's learning rates);
* the sibling share of the DOCCI training set (epoch-1 micro-batches of seed 42 holding two captions of
  one family);
* fine-tuning headroom (the default; `--epoch1-only` skips it): plain fine-tuning runs the recipe's full
  epochs, evaluated on the DOCCI-like test split after each, and `headroom` is its best-epoch mean R@1
  (mean of the two directions, the paper's selection) minus the zero-shot mean; with R@1 by edit kind
  (`hnclip.report.edit_kinds`), zero-shot and at the best epoch, and the run's training compute
  (micro-batches and optimizer steps, beside the pretraining's).

Knobs (settings keys; all optional, absent = the profile's value):
  pretrain        dict merged into backbones.tiny_pretrained.pretrain (epochs, lr, batch_size, warmup_steps,
                  weight_decay, sizes)
  pretrain_scale  null: learnable logit scale (the trainer's default); a number: the pretraining logit scale
                  is fixed at that value. The trainer has no such option, so THIS SCRIPT implements it: the
                  scratch model's logit_scale is set to ln(value) and frozen (requires_grad False, so AdamW
                  never sees it) before pretraining.
  model           dict: width (both towers; text heads = width / 32), layers (both towers), patch_size
                  (the image tower's; the tokens per image are (image_size / patch_size)^2 + 1), embed_dim. The
                  script writes an extra open_clip model config under the scratch directory and registers it
                  with open_clip.add_model_config (what hnclip.models.factory does for its own configs).
  variants        {role: {style, family_size, edit_kinds, held_out_colors}} for the roles docci and pretrain:
                  merged into the role's params.yaml `generator:` entry (hnclip.data.synthetic.GENERATOR_OVERRIDES;
                  edit_kinds / held_out_colors hold a detail out, e.g. pretraining pairs that never differ in
                  colour: {"pretrain": {"edit_kinds": ["size", "shape", "texture", "position"]}}).
  docci_sizes     the DOCCI-like dataset's sizes (train / test)
  ft_lr           the fine-tuning recipe's learning rate
  grad_accum      the fine-tuning recipe's accumulation (micro-batches per optimizer step): 1 takes an optimizer
                  step per micro-batch at the same compute (the same micro-batches, 8x the steps)
  method          the fine-tuning method (params.yaml `methods`; default longclip_ft, plain InfoNCE): e.g.
                  hn_clip, whose epoch-1 share of micro-batches with L_HN >= 1e-3 the record then carries
  oracle          true: every micro-batch holds both siblings of each family it draws (families shuffled per
                  epoch, the siblings side by side), the most a near-duplicate-aware objective could be given.
                  THIS SCRIPT implements it by replacing the training loop's micro-batches (training.batching).
  threads         torch threads of every job (default 2)

Pretrained backbones and generated data are cached in the scratch directory by the digest of what
determines them, so trials differing only in fine-tuning settings reuse one pretraining (the record says
so and carries the original pretraining time).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "regime_sweep.jsonl"
BACKBONE = "tiny_pretrained"

SIMPLE = {"docci": {"style": "simple"}, "pretrain": {"style": "simple"}}
TRIALS: dict[str, dict] = {
    "baseline": {},
    "fixed100_pre20": {"pretrain_scale": 100.0, "pretrain": {"epochs": 20}},
    "w128": {"model": {"width": 128}},
    # cheaper image tower (16 tokens per image instead of 64) and fewer layers: the budget (issue 11)
    "adopted_patch16": {"model": {"patch_size": 16}, "threads": 1},
    "adopted_patch16_l3": {"model": {"patch_size": 16, "layers": 3}, "threads": 1},
    "simple_w128": {"model": {"width": 128}, "variants": SIMPLE},
    "simple_w128_fixed100": {"model": {"width": 128}, "pretrain_scale": 100.0, "variants": SIMPLE},
}


def style_shift_grid() -> list[tuple[str, dict]]:
    """The stated grid of the caption-style shift (`--grid style_shift`), most promising first so that a
    partial sweep holds the informative trials: the benchmark grammar's share in the pretraining corpus
    (10, 25, 5, 0 %; the rest today's simple grammar), the benchmark's grammar (flowing, terse), the
    fine-tuning lr (1e-5, 1e-4) and accumulation (8: the recipe; 1: an optimizer step per micro-batch at the
    same compute). 0 % pretrains today's backbone once for both grammars."""
    trials = []
    for grammar in ("flowing", "terse"):
        for share in (0.10, 0.25, 0.05, 0.0):
            pretrain = {"style": "simple" if share == 0 else {"simple": round(1 - share, 2), grammar: share}}
            for lr in (1e-5, 1e-4):
                for accumulation in (8, 1):
                    name = f"shift_{grammar}_pre{round(100 * share)}_lr{lr:g}_acc{accumulation}"
                    trials.append((name, {"variants": {"docci": {"style": grammar}, "pretrain": pretrain},
                                          "ft_lr": lr, "grad_accum": accumulation}))
    return trials


GRIDS = {"style_shift": style_shift_grid}


# ---- settings -> params ------------------------------------------------------------------------------
def digest(obj) -> str:
    from hnclip.hashing import json_sha256
    return json_sha256(obj)[:12]


def model_config(settings: dict, scratch: Path) -> str:
    """The backbone's open_clip config name: params.yaml's, or a variant of it written and registered here."""
    import open_clip
    import yaml

    from hnclip.models.factory import CONFIG_DIR, register_configs
    register_configs()
    base = yaml.safe_load((ROOT / "params.yaml").read_text())["backbones"][BACKBONE]["model_config"]
    changes = settings.get("model")
    if not changes:
        return base
    config = json.loads((CONFIG_DIR / f"{base}.json").read_text())
    if "width" in changes:
        config["vision_cfg"]["width"] = config["text_cfg"]["width"] = int(changes["width"])
        config["text_cfg"]["heads"] = max(1, int(changes["width"]) // 32)
    if "layers" in changes:
        config["vision_cfg"]["layers"] = config["text_cfg"]["layers"] = int(changes["layers"])
    if "patch_size" in changes:
        config["vision_cfg"]["patch_size"] = int(changes["patch_size"])
    if "embed_dim" in changes:
        config["embed_dim"] = int(changes["embed_dim"])
    name = f"hnclip-sweep-{digest(config)}"
    path = scratch / "model_configs" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config, indent=2))
    open_clip.add_model_config(path)
    return name


def build_params(settings: dict, config_name: str, data_root: Path) -> dict:
    import yaml

    from hnclip.config.params import SCHEMA_RELPATH, validate_params
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["profile"] = "tiny"
    profile = params["profiles"]["tiny"]
    profile["data_root"] = str(data_root)
    profile["execution"] = {**profile["execution"], "threads": int(settings.get("threads", 2))}
    if "ft_lr" in settings:
        profile["recipe"] = {**profile["recipe"], "lr": float(settings["ft_lr"])}
    if "grad_accum" in settings:
        profile["recipe"] = {**profile["recipe"], "grad_accum": int(settings["grad_accum"])}
    if "docci_sizes" in settings:
        profile["datasets"]["docci"] = {**profile["datasets"]["docci"], "sizes": dict(settings["docci_sizes"])}
    backbone = params["backbones"][BACKBONE]
    backbone["model_config"] = config_name
    backbone["pretrain"] = {**backbone["pretrain"], **settings.get("pretrain", {})}
    # caption grammar and family size: the generator's own overrides (params.yaml `generator:` entries)
    for role, changes in settings.get("variants", {}).items():
        entry = backbone["pretrain"] if role == "pretrain" else profile["datasets"][role]
        entry["generator"] = {**entry.get("generator", {}), **changes}
    validate_params(params, ROOT / SCHEMA_RELPATH)
    return params


# ---- steps -------------------------------------------------------------------------------------------
def build_data(reg, roles: list[str]) -> float:
    from hnclip.commands.data import build_dataset
    from hnclip.config import paths
    started = time.time()
    for role in roles:
        if not (paths.dataset_dir(reg.profile["data_root"], role) / "dataset.json").is_file():
            build_dataset(reg, role)
    return time.time() - started


@contextlib.contextmanager
def fixed_pretraining_scale(scale: float | None):
    """While pretraining: a scratch model's logit scale is set to ln(scale) and frozen (None: unchanged)."""
    from hnclip.training import model_setup
    original = model_setup.load_backbone

    def load(kind, *args, **kwargs):
        backbone = original(kind, *args, **kwargs)
        if kind == "scratch" and scale is not None:
            import torch
            with torch.no_grad():
                backbone.model.logit_scale.fill_(math.log(scale))
            backbone.model.logit_scale.requires_grad_(False)
        return backbone
    model_setup.load_backbone = load
    try:
        yield
    finally:
        model_setup.load_backbone = original


def pretrain(reg, scale: float | None) -> dict:
    """Pretrain in the current directory (results/backbones/...), or reuse a pretraining done there."""
    from hnclip.config import paths
    from hnclip.io import read_json, read_jsonl
    from hnclip.training.jobs import pretrain_job
    from hnclip.training.loop import train
    meta_path = paths.backbone_dir(BACKBONE) / "sweep_pretrain.json"
    if meta_path.is_file() and paths.backbone_weights(BACKBONE, "pretrained_here", "").is_file():
        return {**read_json(meta_path), "reused": True}
    job = pretrain_job(reg, BACKBONE)
    job.eval_cache_dir = None
    shutil.rmtree(job.checkpoint_dir, ignore_errors=True)
    started = time.time()
    with fixed_pretraining_scale(scale):
        record = train(job)
    wall = time.time() - started
    steps = read_jsonl(paths.backbone_dir(BACKBONE) / "steps.jsonl")
    last = record["history"][-1]["eval"]["pretrain_test"]
    meta = {"wall_s": wall, "optimizer_steps": record["optimizer_steps"], "final_logit_scale": steps[-1]["logit_scale"],
            "final_infonce": steps[-1].get("infonce_mean"),
            "pretrain_test_r1": {d: last[d]["R@1"] for d in ("t2i", "i2t")}, "run_id": job.run_id}
    Path(meta_path).write_text(json.dumps(meta, indent=2))
    return {**meta, "reused": False}


def geometry(reg) -> dict:
    import torch

    from hnclip.commands.stats import _encode
    from hnclip.config import paths
    from hnclip.data.manifest import read_manifest
    from hnclip.evaluation.caption_geometry import caption_geometry, length_statistics
    from hnclip.models.factory import load_weights
    backbone = load_weights(paths.backbone_weights(BACKBONE, "pretrained_here", ""))
    captions = [row.caption for row in read_manifest(reg.test_manifest("docci"), check_images=False)]
    model = backbone.model.eval()
    features = _encode(model, backbone.tokenizer, captions, torch.device("cpu"))
    stats = caption_geometry(features)
    lengths = length_statistics(captions)
    return {"mean_pairwise_cosine": stats["mean_pairwise_cosine"],
            "mean_hardest_negative_cosine": stats["mean_hardest_negative_cosine"],
            "in_batch_share_ge_0.9": stats["in_batch_share_ge_0.9"],
            "mean_words": lengths["mean_words"], "mean_tokens": lengths["mean_tokens"],
            "fraction_truncated": lengths["fraction_truncated"]}


class _StopAfterEpoch(Exception):
    def __init__(self, state: dict):
        super().__init__("stopped")
        self.state = state


def _fresh_plain_finetune_job(reg, method: str = "longclip_ft"):
    """(run id, job) of `method` (default plain fine-tuning) on docci with the profile's recipe, unprobed, its
    old outputs gone."""
    from hnclip.training.jobs import finetune_job
    run_id = reg.run_spec("docci", reg.params["methods"][method], reg.profile["seeds"][0], 1.0).run_id
    job = finetune_job(reg, run_id)
    job.execution = {**job.execution, "grad_probe_every": 0, "keep_epoch_weights": False}
    job.eval_cache_dir = None
    shutil.rmtree(job.checkpoint_dir, ignore_errors=True)
    shutil.rmtree(job.out_dir, ignore_errors=True)
    return run_id, job


def sibling_micro_batches(families: list[list[int]], indices: list[int], micro_batch: int, seed: int,
                          epoch: int) -> list[list[int]]:
    """The oracle's micro-batches of one epoch: the families (lists of row indices) shuffled by (seed, epoch),
    each family's rows side by side, cut into micro-batches (an incomplete tail dropped, as the loop does)."""
    import torch
    wanted = set(indices)
    groups = [g for g in ([i for i in members if i in wanted] for members in families) if g]
    generator = torch.Generator().manual_seed(seed * 1000 + epoch)
    order = [i for k in torch.randperm(len(groups), generator=generator).tolist() for i in groups[k]]
    return [order[i:i + micro_batch] for i in range(0, len(order) - micro_batch + 1, micro_batch)]


@contextlib.contextmanager
def sibling_batches(reg, enabled: bool):
    """While fine-tuning with `enabled`: the loop's (and its loader's) micro-batches put both siblings of every
    family side by side (`sibling_micro_batches`), so each 16-pair micro-batch holds 8 families."""
    if not enabled:
        yield
        return
    import functools

    from hnclip.data.manifest import read_manifest
    from hnclip.data.synthetic import family_of
    from hnclip.training import feeding, loop
    rows = read_manifest(reg.train_manifest("docci"), check_images=False)
    families: dict[str, list[int]] = {}
    for index, row in enumerate(rows):
        families.setdefault(family_of(row.id), []).append(index)
    oracle = functools.partial(sibling_micro_batches, list(families.values()))
    originals = loop.epoch_micro_batches, feeding.epoch_micro_batches
    loop.epoch_micro_batches = feeding.epoch_micro_batches = oracle
    try:
        yield
    finally:
        loop.epoch_micro_batches, feeding.epoch_micro_batches = originals


def finetune_epoch1(reg) -> dict:
    """Plain fine-tuning (`longclip_ft` on docci, the profile's recipe), stopped when epoch 1 ends."""
    from hnclip.report.regime import epoch_share
    from hnclip.training import loop
    run_id, job = _fresh_plain_finetune_job(reg)
    original = loop.end_of_epoch

    def end_of_epoch(job_, trained, state, epoch, eval_sets, device, loss_names):
        raise _StopAfterEpoch(state)
    loop.end_of_epoch = end_of_epoch
    started = time.time()
    try:
        loop.train(job)
        raise RuntimeError("the fine-tuning run ended without an epoch")
    except _StopAfterEpoch as stop:
        state = stop.state
    finally:
        loop.end_of_epoch = original
        shutil.rmtree(job.checkpoint_dir, ignore_errors=True)
    wall = time.time() - started
    steps = state.steps
    zeroshot = state.initial_eval["docci"]
    infonce = [r["infonce"] for r in state.epoch_records]
    return {"run_id": run_id, "lr": job.spec["recipe"]["lr"], "wall_s": wall,
            "zeroshot_r1": {d: zeroshot[d]["R@1"] for d in ("t2i", "i2t")}, "zeroshot_n": zeroshot["n"],
            "epoch1_saturated_frac": epoch_share(steps, 1, "saturated_frac"),
            "epoch1_micro_batches": len(infonce),
            "epoch1_infonce_median": float(np.median(infonce)), "epoch1_infonce_first": infonce[0],
            "epoch1_infonce_last": infonce[-1], "logit_scale_after": steps[-1]["logit_scale"]}


def finetune_full(reg, method: str = "longclip_ft", oracle: bool = False) -> dict:
    """Fine-tuning (`method` on docci, default plain InfoNCE, the profile's recipe) for all its epochs: saturation
    by epoch, R@1 after every epoch, headroom (best mean R@1 minus zero-shot) and R@1 by edit kind."""
    from hnclip.evaluation.selection import mean_r1, select_epochs
    from hnclip.io import read_jsonl
    from hnclip.report.edit_kinds import benchmark_row_kinds, r1_by_kind
    from hnclip.report.regime import epoch_share
    from hnclip.training import loop
    run_id, job = _fresh_plain_finetune_job(reg, method)
    started = time.time()
    try:
        with sibling_batches(reg, oracle):
            record = loop.train(job)
    finally:
        shutil.rmtree(job.checkpoint_dir, ignore_errors=True)
    wall = time.time() - started
    steps = read_jsonl(job.out_dir / "steps.jsonl")
    zeroshot = record["initial_eval"]["docci"]
    chosen = select_epochs(record["history"], "docci", "mean_r1")
    best = chosen["best"]
    kinds, _ = benchmark_row_kinds(reg, "docci")
    by_kind = None if kinds is None else {
        "zeroshot": r1_by_kind(zeroshot["ranks"], kinds), "best_epoch": r1_by_kind(best["metrics"]["ranks"], kinds)}
    micro_batches = sum(h["train"]["micro_batches"] for h in record["history"])
    epochs = range(1, len(record["history"]) + 1)
    return {"run_id": run_id, "method": method, "oracle": oracle, "lr": job.spec["recipe"]["lr"],
            "grad_accum": job.spec["recipe"]["grad_accum"], "wall_s": wall, "epochs": len(record["history"]),
            "zeroshot_r1": {d: zeroshot[d]["R@1"] for d in ("t2i", "i2t")}, "zeroshot_n": zeroshot["n"],
            "epoch1_saturated_frac": epoch_share(steps, 1, "saturated_frac"),
            "saturated_frac_by_epoch": [epoch_share(steps, e, "saturated_frac") for e in epochs],
            "epoch1_hn_unsaturated_frac": epoch_share(steps, 1, "hn_unsaturated_frac"),
            "per_epoch_r1": [{"epoch": e["epoch"], **{d: e["metrics"][d]["R@1"] for d in ("t2i", "i2t")}}
                             for e in chosen["per_epoch"]],
            "best_epoch": best["epoch"], "best_r1": {d: best["metrics"][d]["R@1"] for d in ("t2i", "i2t")},
            "headroom": mean_r1(best["metrics"]) - mean_r1(zeroshot),
            "r1_by_edit_kind": by_kind,
            "compute": {"micro_batches": micro_batches, "optimizer_steps": record["optimizer_steps"],
                        "micro_batch": job.spec["recipe"]["micro_batch"]},
            "logit_scale_after": steps[-1]["logit_scale"]}


def sibling_share(reg) -> float | None:
    from hnclip.data.loader import subset_indices
    from hnclip.data.manifest import read_manifest
    from hnclip.data.synthetic import family_of
    from hnclip.report.regime import sibling_batch_share
    from hnclip.training.batching import epoch_micro_batches
    rows = read_manifest(reg.train_manifest("docci"), check_images=False)
    batches = epoch_micro_batches(subset_indices(len(rows), 1.0), reg.profile["recipe"]["micro_batch"],
                                  reg.profile["seeds"][0], 0)
    return sibling_batch_share(batches, [family_of(row.id) for row in rows])


# ---- one trial ---------------------------------------------------------------------------------------
def run_trial(name: str, settings: dict, scratch: Path, out: Path, headroom: bool = True) -> dict:
    import torch

    from hnclip.config.constants import PRETRAIN_ROLE
    from hnclip.config.registry import Registry
    from hnclip.provenance import git_state
    started = time.time()
    torch.set_num_threads(int(settings.get("threads", 2)))
    scratch.mkdir(parents=True, exist_ok=True)
    config_name = model_config(settings, scratch)
    # data: keyed by what generates it
    probe = build_params(settings, config_name, scratch / "data" / "probe")
    data_key = digest({"docci": probe["profiles"]["tiny"]["datasets"]["docci"],
                       "pretrain": {k: probe["backbones"][BACKBONE]["pretrain"].get(k)
                                    for k in ("variant", "sizes", "data_seed", "generator")}})
    params = build_params(settings, config_name, scratch / "data" / data_key)
    reg = Registry(params, validate=False)
    data_s = build_data(reg, ["docci", PRETRAIN_ROLE])
    # the pretraining depends on its own corpus only: trials that change the DOCCI-like data reuse it
    pre_key = digest({"pretrain": params["backbones"][BACKBONE]["pretrain"],
                      "model": settings.get("model"), "scale": settings.get("pretrain_scale"),
                      "threads": int(settings.get("threads", 2))})
    work = scratch / "pretrain" / pre_key
    work.mkdir(parents=True, exist_ok=True)
    cwd = os.getcwd()
    os.chdir(work)  # the library's paths are relative to the project root: this is the trial's
    try:
        pre = pretrain(reg, settings.get("pretrain_scale"))
        geo = geometry(reg)
        ft = (finetune_full(reg, settings.get("method", "longclip_ft"), bool(settings.get("oracle")))
              if headroom else finetune_epoch1(reg))
        siblings = sibling_share(reg)
    finally:
        os.chdir(cwd)
    from hnclip.models.factory import create
    n_params = sum(p.numel() for p in create(config_name).model.parameters())
    record = {
        "benchmark": "regime_sweep", "trial": name, "settings": settings,
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git": git_state(ROOT), "model_config": config_name, "model_parameters": n_params,
        "scratch": str(work), "threads": int(settings.get("threads", 2)), "cpus": os.cpu_count(),
        "load_average_1min": os.getloadavg()[0],
        "wall_s": {"data": data_s, "pretrain": pre["wall_s"],
                   ("finetune" if headroom else "finetune_epoch1"): ft["wall_s"], "trial": time.time() - started},
        "pretrain": pre, "zeroshot_r1": ft.pop("zeroshot_r1"), "caption_geometry": geo,
        "finetune": ft, "sibling_share": siblings, "headroom": ft.get("headroom"),
        # training compute per run, beside today's (params.yaml): the budget's `matrix_steps_bound_s` scales with it
        "compute": {"pretrain_optimizer_steps": pre["optimizer_steps"],
                    "pretrain_batch_size": params["backbones"][BACKBONE]["pretrain"]["batch_size"],
                    "finetune": ft.get("compute")},
        "resolved": {"docci": params["profiles"]["tiny"]["datasets"]["docci"],
                     "pretrain": params["backbones"][BACKBONE]["pretrain"], "width": width(config_name),
                     "model": model_shape(config_name)},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as handle:
        handle.write(json.dumps(record) + "\n")
    return record


def summary(record: dict) -> str:
    z, g, f = record["zeroshot_r1"], record["caption_geometry"], record["finetune"]
    headroom = "" if record.get("headroom") is None else (
        f"best R@1 {f['best_r1']['t2i']:.1f}/{f['best_r1']['i2t']:.1f} (epoch {f['best_epoch']}), "
        f"headroom {record['headroom']:+.1f}, ")
    return (f"{record['trial']}: pretrain {record['wall_s']['pretrain']:.0f}s"
            f"{' (reused)' if record['pretrain']['reused'] else ''}, zero-shot R@1 {z['t2i']:.1f}/{z['i2t']:.1f}, "
            f"pairwise {g['mean_pairwise_cosine']:.3f} hardest {g['mean_hardest_negative_cosine']:.3f}, "
            f"epoch-1 saturation {f['epoch1_saturated_frac']:.2f} (lr {f['lr']:g}), "
            f"{headroom}siblings {record['sibling_share']:.2f}, trial {record['wall_s']['trial']:.0f}s")


def model_shape(config_name: str) -> dict:
    """Width, layers per tower and patch size of a model config (what the README table lists)."""
    import open_clip
    config = open_clip.get_model_config(config_name)
    vision, text = config["vision_cfg"], config["text_cfg"]
    return {"width": text["width"], "text_layers": text["layers"], "vision_layers": vision["layers"],
            "patch_size": vision["patch_size"], "image_size": vision["image_size"]}


def width(config_name: str) -> int:
    import open_clip

    from hnclip.models.factory import register_configs
    register_configs()
    return int(open_clip.get_model_config(config_name)["text_cfg"]["width"])


def style_label(style) -> str:
    """A caption style or mixture as the table shows it: "flowing", "simple 90 % + flowing 10 %"."""
    if isinstance(style, str):
        return style
    return " + ".join(f"{name} {100 * share:g} %" for name, share in style)


def describe(record: dict) -> str:
    """A short label of a trial's settings (what the README table lists)."""
    s = record["settings"]
    parts = []
    if "resolved" in record:  # the params the trial ran with, through the generator's own defaults
        from hnclip.data.synthetic import variant_spec
        resolved = record["resolved"]
        docci_spec = variant_spec("docci", resolved["docci"].get("generator"))
        docci = {"style": docci_spec.style, "family_size": docci_spec.family_size}
        pretrain_spec = variant_spec("pretrain", resolved["pretrain"].get("generator"))
        pretrain = {"style": pretrain_spec.style}
        model_width, n_train = resolved["width"], resolved["docci"]["sizes"]["train"]
    else:  # records of the trials before the generator had overrides: the defaults of that commit
        docci, pretrain = s.get("variants", {}).get("docci", {}), s.get("variants", {}).get("pretrain", {})
        model_width, n_train = s.get("model", {}).get("width", 64), s.get("docci_sizes", {}).get("train", 512)
    parts.append(f"captions {style_label(docci.get('style', 'flowing'))}/{style_label(pretrain.get('style', 'terse'))}")
    held = s.get("variants", {}).get("pretrain", {})
    if s.get("variants", {}).get("docci", {}).get("edit_kinds"):
        parts.append(f"DOCCI-like pairs differ in {'/'.join(s['variants']['docci']['edit_kinds'])} only")
    if held.get("edit_kinds"):
        parts.append(f"pretraining pairs edit {'/'.join(held['edit_kinds'])} only")
    if held.get("held_out_colors"):
        parts.append(f"pretraining never shows {'/'.join(held['held_out_colors'])}")
    shape = record.get("resolved", {}).get("model")
    if shape and (shape["patch_size"], shape["text_layers"], shape["vision_layers"]) != (8, 4, 4):
        parts.append(f"width {model_width}, {shape['vision_layers']}+{shape['text_layers']} layers, "
                     f"patch {shape['patch_size']}")
    else:
        parts.append(f"width {model_width}")
    scale = s.get("pretrain_scale")
    parts.append("scale learnable" if scale is None else f"scale fixed {scale:g}")
    parts.append(f"{record['pretrain']['optimizer_steps']} pretraining steps")
    fam = docci.get("family_size", 4)
    parts.append(f"families of {fam} in {n_train}")
    finetune = record["finetune"]
    parts.append(f"FT lr {finetune['lr']:g}")
    if finetune.get("grad_accum") is not None:
        parts.append(f"accumulation {finetune['grad_accum']}")
    if finetune.get("method", "longclip_ft") != "longclip_ft":
        parts.append(finetune["method"])
    if finetune.get("oracle"):
        parts.append("oracle (siblings batched together)")
    return ", ".join(parts)


def _percent_list(values) -> str:
    return "/".join("–" if v is None else f"{100 * v:.0f}" for v in values) + " %"


def _edit_kind_cell(record: dict) -> str:
    """R@1 T→I by edit kind at the best epoch (zero-shot in brackets)."""
    by_kind = record["finetune"].get("r1_by_edit_kind")
    if not by_kind:
        return "not measured"
    from hnclip.report.edit_kinds import KIND_LABELS
    return ", ".join(f"{KIND_LABELS.get(kind, kind)} {best['t2i']:.0f} ({by_kind['zeroshot'][kind]['t2i']:.0f})"
                     for kind, best in by_kind["best_epoch"].items() if kind != "all")


def markdown_table(records: list[dict]) -> str:
    lines = ["| setting | pretraining time | zero-shot R@1 T→I/I→T | pairwise / hardest cosine | "
             "epoch-1 saturation | saturation by epoch | sibling share | headroom | L_HN active, epoch 1 | "
             "R@1 T→I by edit kind, best epoch (zero-shot) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        z, g, f = r["zeroshot_r1"], r["caption_geometry"], r["finetune"]
        time_s = f"{r['wall_s']['pretrain']:.0f} s" + (" (reused)" if r["pretrain"]["reused"] else "")
        by_epoch = _percent_list(f["saturated_frac_by_epoch"]) if "saturated_frac_by_epoch" in f else "not measured"
        alive = f.get("epoch1_hn_unsaturated_frac")
        lines.append(f"| {describe(r)} | {time_s} | {z['t2i']:.1f}/{z['i2t']:.1f} | "
                     f"{g['mean_pairwise_cosine']:.2f} / {g['mean_hardest_negative_cosine']:.3f} | "
                     f"{100 * f['epoch1_saturated_frac']:.0f} % | {by_epoch} | {100 * r['sibling_share']:.0f} % | "
                     f"{'not measured' if r.get('headroom') is None else format(r['headroom'], '+.1f')} | "
                     f"{'–' if alive is None else format(100 * alive, '.0f') + ' %'} | {_edit_kind_cell(r)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trial", choices=sorted(TRIALS), help="a preset trial")
    parser.add_argument("--settings", help="a JSON settings dict (with an optional 'name')")
    parser.add_argument("--grid", choices=sorted(GRIDS),
                        help="run a stated grid in order, skipping trials --out already records (resumable)")
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/regime_sweep"))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--list", action="store_true", help="print the preset trials and exit")
    parser.add_argument("--table", action="store_true", help="print the --out records as a Markdown table and exit")
    parser.add_argument("--epoch1-only", action="store_true",
                        help="fine-tune epoch 1 only (saturation, no headroom), as the trials before headroom")
    args = parser.parse_args(argv)
    if args.list:
        print(json.dumps(TRIALS, indent=2))
        return 0
    if args.table:
        print(markdown_table([json.loads(line) for line in args.out.read_text().splitlines() if line.strip()]))
        return 0
    if args.grid:
        done = {json.loads(line)["trial"] for line in args.out.read_text().splitlines() if line.strip()} \
            if args.out.is_file() else set()
        for name, settings in GRIDS[args.grid]():
            if name not in done:
                print(summary(run_trial(name, settings, args.scratch, args.out, headroom=not args.epoch1_only)),
                      file=sys.stderr, flush=True)
        return 0
    if sum(map(bool, (args.trial, args.settings))) != 1:
        parser.error("give exactly one of --trial, --settings and --grid")
    if args.trial:
        name, settings = args.trial, copy.deepcopy(TRIALS[args.trial])
    else:
        settings = json.loads(args.settings)
        name = settings.pop("name", "custom")
    record = run_trial(name, settings, args.scratch, args.out, headroom=not args.epoch1_only)
    print(summary(record), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
