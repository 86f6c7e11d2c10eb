"""Regime exploration for issue 13: which settings of the embedded miniature bring it into the paper's regime.

    python benchmarks/regime_sweep.py --trial baseline          # a preset trial (see TRIALS)
    python benchmarks/regime_sweep.py --settings '{"name": "x", "ft_lr": 3e-5, "pretrain_scale": 100}'
    python benchmarks/regime_sweep.py --list
    python benchmarks/regime_sweep.py --table                   # the results file as a Markdown table

One trial overrides the `tiny` profile's params in memory (params.yaml is read, never written), builds the
DOCCI-like benchmark and the pretraining corpus, pretrains the backbone and fine-tunes plain InfoNCE
(`longclip_ft`) for one epoch, all in a scratch directory (default /tmp/regime_sweep), through the
library's own jobs (`hnclip.steps.data.build_dataset`, `hnclip.training.jobs.pretrain_job` /
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
    from hnclip.config import paths
    from hnclip.steps.data import build_dataset
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

    from hnclip.config import paths
    from hnclip.data.manifest import read_manifest
    from hnclip.evaluation.caption_geometry import caption_geometry, length_statistics
    from hnclip.models.factory import load_weights
    from hnclip.steps.stats import _encode
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


def _fresh_plain_finetune_job(reg):
    """(run id, job) of plain fine-tuning on docci with the profile's recipe, unprobed, its old outputs gone."""
    from hnclip.training.jobs import finetune_job
    run_id = reg.run_spec("docci", reg.params["methods"]["longclip_ft"], reg.profile["seeds"][0], 1.0).run_id
    job = finetune_job(reg, run_id)
    job.execution = {**job.execution, "grad_probe_every": 0, "keep_epoch_weights": False}
    job.eval_cache_dir = None
    shutil.rmtree(job.checkpoint_dir, ignore_errors=True)
    shutil.rmtree(job.out_dir, ignore_errors=True)
    return run_id, job


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


def finetune_full(reg) -> dict:
    """Plain fine-tuning (`longclip_ft` on docci, the profile's recipe) for all its epochs: epoch-1 saturation,
    R@1 after every epoch, headroom (best mean R@1 minus zero-shot) and R@1 by edit kind."""
    from hnclip.evaluation.selection import mean_r1, select_epochs
    from hnclip.io import read_jsonl
    from hnclip.report.edit_kinds import benchmark_row_kinds, r1_by_kind
    from hnclip.report.regime import epoch_share
    from hnclip.training import loop
    run_id, job = _fresh_plain_finetune_job(reg)
    started = time.time()
    try:
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
    return {"run_id": run_id, "lr": job.spec["recipe"]["lr"], "wall_s": wall, "epochs": len(record["history"]),
            "zeroshot_r1": {d: zeroshot[d]["R@1"] for d in ("t2i", "i2t")}, "zeroshot_n": zeroshot["n"],
            "epoch1_saturated_frac": epoch_share(steps, 1, "saturated_frac"),
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
        ft = finetune_full(reg) if headroom else finetune_epoch1(reg)
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
    parts.append(f"captions {docci.get('style', 'flowing')}/{pretrain.get('style', 'terse')}")
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
    parts.append(f"FT lr {record['finetune']['lr']:g}")
    return ", ".join(parts)


def markdown_table(records: list[dict]) -> str:
    lines = ["| setting | pretraining time | zero-shot R@1 T→I/I→T | pairwise / hardest cosine | "
             "epoch-1 saturation | sibling share | headroom |", "|---|---|---|---|---|---|---|"]
    for r in records:
        z, g = r["zeroshot_r1"], r["caption_geometry"]
        time_s = f"{r['wall_s']['pretrain']:.0f} s" + (" (reused)" if r["pretrain"]["reused"] else "")
        lines.append(f"| {describe(r)} | {time_s} | {z['t2i']:.1f}/{z['i2t']:.1f} | "
                     f"{g['mean_pairwise_cosine']:.2f} / {g['mean_hardest_negative_cosine']:.3f} | "
                     f"{100 * r['finetune']['epoch1_saturated_frac']:.0f} % | {100 * r['sibling_share']:.0f} % | "
                     f"{'not measured' if r.get('headroom') is None else format(r['headroom'], '+.1f')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trial", choices=sorted(TRIALS), help="a preset trial")
    parser.add_argument("--settings", help="a JSON settings dict (with an optional 'name')")
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
    if bool(args.trial) == bool(args.settings):
        parser.error("give exactly one of --trial and --settings")
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
