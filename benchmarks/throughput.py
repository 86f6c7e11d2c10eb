"""Training throughput of one optimizer step of every framework, and the evaluation's encoding rate.

    python benchmarks/throughput.py            # paper shapes, on cuda if present
    python benchmarks/throughput.py --small    # CPU-feasible shapes (what the tests run)

Paper shapes: random-initialised ViT-L-14-quickgelu at context 248 (no download), 224 px images,
random captions of 150 +- 30 tokens, micro-batch 16 x 8 accumulation = 128 pairs per optimizer
step, AdamW (lr 2e-6, weight decay 0.01). `accumulate` runs the 8 micro-batches one forward and
backward each (the training loop's default); `compute_batch` encodes 128 pairs per forward and
computes the same 16-way terms per micro-batch (`hnclip.training.compute_batch`), halving the
compute batch if it runs out of memory (the record says which value ran). Inputs are generated on
the device once, so the figure is the model step alone, without data loading.

Methods: plain (InfoNCE), hnclip (L_HN + L_tok), lora, dora (the adapter baselines) and the machinery
baselines finelip, goal, structxlip, each at the paper profile's precision (params.yaml: the profile's
`recipe.precision`, bf16, with the method's `recipe_overrides`: FineLIP fp32) and TF32 setting
(`execution.tf32`); on the CPU everything runs in fp32, as training does there. The baselines run
only `accumulate`: their micro-batch (16 pairs) is their forward, whatever `compute_batch` says
(`training.step.group_backward_mode`); a `compute_batch` request for them is skipped. Their terms are
their own loss functions on random inputs shaped as their loaders give them: FineLIP with its
cross-modal module (optimised beside the CLIP); GOAL with one segment crop and sentence per pair (a
random box of the patch grid, a span of a quarter of the caption) and without the released cost-only
operations (only the run Table A3 times pays them); StructXLIP with its global edge map and 2 edge
crops per pair (5 images per pair through the image tower) and one chunk of 6 tokens every 10 caption
tokens (an assumed density; the real count depends on the captions). Each row carries `pairs_per_forward`
and `precision`.

Execution options, each recorded in every row: `--adamw fused` (default: fused AdamW where every
parameter is on CUDA, `training.schedule.adamw_implementation`) or `default` (torch's default, the
earlier path); `--text-attention causal` (default: the causal flag, `models.towers.text_transformer`)
or `mask` (open_clip's float mask, the earlier path); `--compile` (`models.towers.compile_towers`,
execution.compile; off by default).

`--methods evaluate` (in the default list) times what evaluation does: a test set of --eval-images
random images and captions encoded in batches of --eval-batch (captions sorted by length), no
gradients, fp32 (TF32 as the profile says), images per second of the whole pass (`method` and `mode`
`evaluate`).

Each (method, mode) gets a fresh model and optimizer, runs --warmup steps, then --steps timed
steps (synchronised); img_per_s = pairs per step / median step time. Peak memory is
torch.cuda.max_memory_allocated over the timed steps on cuda; on CPU it is the process's maxrss,
which only grows (so it is an upper bound for later measurements of one invocation). One JSON line
per measurement is appended to --out.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import os
import platform
import resource
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable
from unittest import mock

import torch
import yaml

import hnclip.models.towers as towers
from hnclip.config import objective_keys
from hnclip.losses.objective import loss_terms
from hnclip.models.factory import create
from hnclip.models.towers import PAD_ID
from hnclip.provenance import git_state, library_versions
from hnclip.runtime.device import autocast_context, configure_tf32
from hnclip.training.compute_batch import compute_batch_backward
from hnclip.training.frameworks import TrainedModel
from hnclip.training.memory import fit_compute_batch
from hnclip.training.schedule import adamw_implementation

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "throughput.jsonl"
SOT, EOT, CONTEXT = 49406, 49407, 248
LR, WEIGHT_DECAY = 2e-6, 0.01
MODES = ("accumulate", "compute_batch")
PLAIN = {"gamma": 0.0, "lambda_tok": 0.0, "g_source": "live"}
HN_CLIP = {"gamma": 0.5, "lambda_tok": 1.0, "g_source": "live"}
# method -> (framework, objective); LoRA/DoRA are the paper's adapter baselines (InfoNCE, r 16, alpha 32);
# FineLIP, GOAL, StructXLIP train their own objectives (their global term InfoNCE: gamma 0)
METHODS = {"plain": ("full", PLAIN), "hnclip": ("full", HN_CLIP), "lora": ("lora", PLAIN), "dora": ("dora", PLAIN),
           "finelip": ("finelip", PLAIN), "goal": ("goal", PLAIN), "structxlip": ("structxlip", PLAIN)}
EVALUATE = "evaluate"
BASELINES = ("finelip", "goal", "structxlip")
# the params.yaml method each benchmark method is (its recipe_overrides: the precision it trains in)
PARAMS_METHODS = {"plain": "longclip_ft", "hnclip": "hn_clip", "lora": "lora", "dora": "dora", "finelip": "finelip",
                  "goal": "goal", "structxlip": "structxlip"}
PROFILE = "paper"
ADAMW = ("fused", "default")
TEXT_ATTENTION = ("causal", "mask")
STRUCTX_CHUNK_EVERY, STRUCTX_CHUNK_TOKENS, STRUCTX_CROPS = 10, 6, 2


@dataclass(frozen=True)
class Shapes:
    model: str
    image_size: int
    caption_tokens: int      # mean caption length; lengths are uniform in +- 20 %
    micro_batch: int
    grad_accum: int
    compute_batch: int       # requested pairs per forward in compute_batch mode

    @property
    def pairs(self) -> int:
        return self.micro_batch * self.grad_accum


PAPER = Shapes("ViT-L-14-quickgelu", 224, 150, 16, 8, 128)
SMALL = Shapes("hnclip-tiny", 64, 20, 4, 2, 8)


def random_inputs(shapes: Shapes, device: torch.device, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One accumulation group of random images and captions (SOT, random word ids, EOT, padding)."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(shapes.pairs, 3, shapes.image_size, shapes.image_size, generator=generator)
    low, high = round(0.8 * shapes.caption_tokens), min(CONTEXT, round(1.2 * shapes.caption_tokens))
    tokens = torch.full((shapes.pairs, CONTEXT), PAD_ID, dtype=torch.long)
    for row, length in enumerate(torch.randint(low, high + 1, (shapes.pairs,), generator=generator).tolist()):
        tokens[row, 0], tokens[row, length - 1] = SOT, EOT
        tokens[row, 1:length - 1] = torch.randint(1, SOT, (length - 2,), generator=generator)
    pairs = zip(images.split(shapes.micro_batch), tokens.split(shapes.micro_batch))
    return [(images.to(device), tokens.to(device)) for images, tokens in pairs]


def accumulate_backward(model, batches, objective, frozen_text, autocast, check) -> list[dict]:
    """The training loop's default mode: one forward and backward per micro-batch."""
    records = []
    for images, tokens in batches:
        terms = loss_terms(model, images, tokens, objective, frozen_text, autocast)
        values = {name: float(value.detach()) for name, value in terms.items()}
        check(values)
        (terms["total"] / len(batches)).backward()
        records.append(values)
    return records


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _autocast(device: torch.device, precision: str = "bf16"):
    """The training precision context (`runtime.device.autocast_context`): bf16 autocast on CUDA for a
    bf16 recipe, plain fp32 otherwise (the CPU always)."""
    return functools.partial(autocast_context, device, precision)


def _peak_memory_gb(device: torch.device) -> tuple[float, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9, "torch.cuda.max_memory_allocated (timed steps)"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9, "maxrss (whole process so far)"


@dataclass(frozen=True)
class Options:
    """How a measurement executes (recorded in each row)."""
    adamw: str = "fused"
    text_attention: str = "causal"
    compile: bool = False


def paper_settings(method: str) -> dict:
    """The paper profile's precision and TF32 for `method`, and its framework's protocol settings."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())  # plain YAML: a bare device venv may lack jsonschema
    profile = params["profiles"][PROFILE]
    recipe = {**profile["recipe"], **params["methods"][PARAMS_METHODS[method]].get("recipe_overrides", {})}
    framework = METHODS[method][0]
    return {"precision": recipe["precision"], "tf32": bool(profile["execution"].get("tf32", True)),
            "framework_settings": dict(params["frameworks"].get(framework, {}))}


def _with_lengths(batches):
    """Each micro-batch with its captions' lengths (EOT position + 1)."""
    return [(images, tokens, (tokens.argmax(dim=-1) + 1).tolist()) for images, tokens in batches]


def goal_batches(model, batches, generator: torch.Generator) -> list:
    """GOAL micro-batches around the random pairs: a random segment crop per image (a random box of the
    patch grid selects its tokens) and a sentence of a quarter of its caption (its span in the caption)."""
    from hnclip.losses.goal import GoalBatch
    grid = model.visual.grid_size
    out = []
    for images, tokens, lengths in _with_lengths(batches):
        size = images.shape[0]
        mask = torch.zeros(size, grid[0] * grid[1] + 1, dtype=torch.bool)
        spans, sentences = torch.zeros(size, 2, dtype=torch.long), torch.full_like(tokens, PAD_ID).cpu()
        for row, length in enumerate(lengths):
            top, left = (int(torch.randint(0, g // 2, (1,), generator=generator)) for g in grid)
            box = torch.zeros(grid, dtype=torch.bool)
            box[top:top + grid[0] // 2, left:left + grid[1] // 2] = True
            mask[row, 1:] = box.flatten()
            words = max(1, (length - 2) // 4)
            start = 1 + int(torch.randint(0, max(1, length - 2 - words), (1,), generator=generator))
            spans[row] = torch.tensor([start, words])
            sentences[row, 0], sentences[row, 1:words + 1] = SOT, tokens[row, start:start + words].cpu()
            sentences[row, words + 1] = EOT
        device = images.device
        out.append(GoalBatch(images, tokens, torch.randn(images.shape, generator=generator).to(device),
                             sentences.to(device), mask.to(device), spans.to(device)))
    return out


def structxlip_batches(batches, generator: torch.Generator) -> list:
    """StructXLIP micro-batches around the random pairs: a global edge map and STRUCTX_CROPS edge crops per
    image, the caption as its own filtered caption, a chunk of STRUCTX_CHUNK_TOKENS tokens every
    STRUCTX_CHUNK_EVERY tokens."""
    from hnclip.losses.structxlip import StructXBatch
    out = []
    for images, tokens, lengths in _with_lengths(batches):
        size, device = images.shape[0], images.device
        spans = [[(start, min(start + STRUCTX_CHUNK_TOKENS, length - 1))
                  for start in range(1, length - 1, STRUCTX_CHUNK_EVERY)] for length in lengths]
        crops = torch.randn(size, STRUCTX_CROPS, *images.shape[1:], generator=generator).to(device)
        edges = torch.randn(images.shape, generator=generator).to(device)
        valid = torch.ones(size, dtype=torch.bool, device=device)
        out.append(StructXBatch(images, tokens, tokens.clone(), edges, valid, crops,
                                valid[:, None].expand(size, STRUCTX_CROPS).clone(), spans))
    return out


def baseline_terms(method: str, model, batches, settings: dict, objective: dict, autocast, generator
                   ) -> tuple[list, Callable, torch.nn.Module | None, Callable[[torch.nn.Module], None]]:
    """(micro-batches, terms(model, batch), extra module, after-step) of a machinery baseline."""
    if method == "finelip":
        from hnclip.losses.finelip import build_finelip_module, finelip_loss_terms
        from hnclip.training.methods import FINELIP_TRAINER_SETTINGS
        loss_settings = {k: v for k, v in settings.items() if k not in FINELIP_TRAINER_SETTINGS}
        module = build_finelip_module(model, loss_settings).to(next(model.parameters()).device)
        return (batches, lambda model, batch: finelip_loss_terms(model, module, *batch, objective, loss_settings, 1.0,
                                                                  autocast), module, lambda model: None)
    if method == "goal":
        from hnclip.losses.goal import GoalSettings, goal_loss_terms
        goal_settings = GoalSettings.from_dict({**{k: v for k, v in settings.items() if k != "anomaly_detection"},
                                                "double_forward": False})  # a run that pays no released costs
        return (goal_batches(model, batches, generator),
                lambda model, batch: goal_loss_terms(model, batch, objective, goal_settings, autocast), None,
                lambda model: None)
    from hnclip.losses.structxlip import clamp_logit_scale_, structxlip_loss_terms
    loss_settings = {k: settings[k] for k in ("weights", "floors", "decay_epochs", "chunk_tokens")}
    return (structxlip_batches(batches, generator),
            lambda model, batch: structxlip_loss_terms(model, batch, objective, loss_settings, 1, autocast), None,
            lambda model: clamp_logit_scale_(model, settings["max_log_scale"]))


def build_model(method: str, shapes: Shapes, device: torch.device, options: Options) -> torch.nn.Module:
    framework = METHODS[method][0]
    torch.manual_seed(0)
    model = TrainedModel.build(create(shapes.model).model.to(device).train(), framework).module
    if options.compile:
        towers.compile_towers(model)
    return model


def _optimizer(parameters: list, options: Options) -> torch.optim.AdamW:
    groups = [{"params": parameters}]
    implementation = adamw_implementation(groups) if options.adamw == "fused" else {}
    return torch.optim.AdamW(groups, lr=LR, weight_decay=WEIGHT_DECAY, **implementation)


def _text_attention(options: Options):
    """The earlier float-mask text attention for `--text-attention mask`, else nothing changed."""
    if options.text_attention == "mask":
        return mock.patch.object(towers, "uses_causal_flag", lambda transformer: False)
    return contextlib.nullcontext()


def _execution_fields(model, options: Options, optimizer, settings: dict, device: torch.device,
                      autocast_on: bool) -> dict:
    text = getattr(model, "get_base_model", lambda: model)().transformer
    causal = options.text_attention == "causal" and towers.uses_causal_flag(text)
    return {"precision": "bf16 autocast" if autocast_on else "fp32",
            "paper_precision": settings["precision"],
            "tf32": bool(device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32),
            "fused_adamw": bool(optimizer.defaults.get("fused")), "adamw_option": options.adamw,
            "text_attention": "causal flag" if causal else "float mask", "compile": options.compile}


def measure(method: str, mode: str, shapes: Shapes, device: torch.device, steps: int, warmup: int,
            log=print, options: Options = Options()) -> dict:
    """Time `steps` optimizer steps of one method in one mode; returns the measurement's fields."""
    framework, objective = METHODS[method]
    settings = paper_settings(method)
    configure_tf32(device, settings["tf32"])
    model = build_model(method, shapes, device, options)
    batches, autocast = random_inputs(shapes, device), _autocast(device, settings["precision"])
    with autocast():
        autocast_on = torch.is_autocast_enabled(device.type)
    extra, after_step = None, (lambda model: None)
    if method in BASELINES:
        generator = torch.Generator().manual_seed(1)
        batches, terms_of, extra, after_step = baseline_terms(method, model, batches, settings["framework_settings"],
                                                              objective, autocast, generator)
    parameters = [p for m in (model, extra) if m is not None for p in m.parameters() if p.requires_grad]
    optimizer = _optimizer(parameters, options)

    def backward_baseline() -> list[dict]:
        records = []
        for batch in batches:
            terms = terms_of(model, batch)
            records.append({"total": float(terms["total"].detach())})
            (terms["total"] / len(batches)).backward()
        return records

    first_losses = []  # the first step's micro-batch totals: equal across execution options within tolerance

    def step(compute_batch: int) -> None:
        optimizer.zero_grad(set_to_none=True)
        with _text_attention(options):
            if method in BASELINES:
                records = backward_baseline()
            elif mode == "accumulate":
                records = accumulate_backward(model, batches, objective, None, autocast, lambda _: None)
            else:
                records = compute_batch_backward(model, batches, objective, None, autocast, lambda _: None,
                                                 compute_batch, shapes.micro_batch)
        if not first_losses:
            first_losses.extend(record["total"] for record in records)
        optimizer.step()
        after_step(model)
        _synchronize(device)

    compute_batch = shapes.micro_batch
    if mode == "compute_batch":  # the fitting step is the first warm-up step
        compute_batch = fit_compute_batch(step, shapes.compute_batch, shapes.micro_batch, log)
    for _ in range(warmup):
        step(compute_batch)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step(compute_batch)
        times.append(time.perf_counter() - start)
    peak, source = _peak_memory_gb(device)
    median = statistics.median(times)
    # the objective as a run's records state it: every key, by its identity name (`margin`: the G source)
    return {"mode": mode, "method": method, "framework": framework,
            "objective": objective_keys.record({**objective, "framework": framework}),
            "img_per_s": shapes.pairs / median, "step_s_median": median, "step_s": times,
            "peak_mem_gb": peak, "peak_mem_source": source,
            "pairs_per_forward": compute_batch if mode == "compute_batch" else shapes.micro_batch,
            "first_step_losses": first_losses,
            **_execution_fields(model, options, optimizer, settings, device, autocast_on),
            "shapes": {**asdict(shapes), "compute_batch": compute_batch if mode == "compute_batch" else None,
                       "requested_compute_batch": shapes.compute_batch if mode == "compute_batch" else None,
                       "context_length": CONTEXT},
            "steps": steps, "warmup": warmup}


def measure_evaluation(shapes: Shapes, device: torch.device, images: int, batch_size: int, repeats: int,
                       options: Options = Options()) -> dict:
    """Images per second of encoding a test set as evaluation does (`evaluation.retrieval`): eval mode, no
    gradients, fp32 (TF32 as the profile says), images then captions (sorted by length) in batches."""
    settings = paper_settings("plain")
    configure_tf32(device, settings["tf32"])
    model = build_model("plain", shapes, device, options).eval()
    group = Shapes(shapes.model, shapes.image_size, shapes.caption_tokens, images, 1, images)
    (pixels, tokens), = random_inputs(group, device, seed=2)
    tokens = tokens[torch.argsort(tokens.argmax(dim=-1), stable=True)]

    @torch.no_grad()
    def encode() -> None:
        with _text_attention(options):
            for start in range(0, images, batch_size):
                towers.encode_image(model, pixels[start:start + batch_size]).float().cpu()
                towers.encode_text(model, tokens[start:start + batch_size]).float().cpu()
        _synchronize(device)

    encode()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        encode()
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    return {"mode": EVALUATE, "method": EVALUATE, "framework": "none", "img_per_s": images / median,
            "step_s_median": median, "step_s": times, "pairs_per_forward": batch_size, "precision": "fp32",
            "tf32": bool(device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32),
            "text_attention": "float mask" if options.text_attention == "mask" else "causal flag",
            "compile": options.compile, "eval_images": images, "eval_batch": batch_size,
            "shapes": {"model": shapes.model, "image_size": shapes.image_size, "caption_tokens": shapes.caption_tokens,
                       "context_length": CONTEXT},
            "repeats": repeats}


def _cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    models = [line.split(":", 1)[1].strip() for line in (cpuinfo.read_text().splitlines() if cpuinfo.exists() else [])
              if line.startswith("model name")]
    return models[0] if models else platform.processor() or platform.machine()


def environment(device: torch.device) -> dict:
    """Where and with what a measurement ran."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name()
    libraries = {**library_versions(), "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()}
    return {"device": str(device), "device_name": name, "cpus": os.cpu_count(), "threads": torch.get_num_threads(),
            "load_average_1min": os.getloadavg()[0],  # other work on the machine slows CPU figures
            "libraries": libraries, "git": git_state(ROOT),
            "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}


def append_jsonl(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.write(json.dumps(record) + "\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", action="store_true", help=f"CPU-feasible shapes {SMALL} instead of {PAPER}")
    parser.add_argument("--steps", type=int, default=10, help="timed optimizer steps (the median is reported)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    methods = (*METHODS, EVALUATE)
    parser.add_argument("--methods", default=",".join(methods), help=f"comma-separated, of {', '.join(methods)}")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--adamw", choices=ADAMW, default="fused",
                        help="fused: fused AdamW where every parameter is on CUDA; default: torch's default")
    parser.add_argument("--text-attention", choices=TEXT_ATTENTION, default="causal",
                        help="causal: SDPA's causal flag; mask: open_clip's float mask (the earlier path)")
    parser.add_argument("--compile", action="store_true", help="torch.compile both towers (execution.compile)")
    parser.add_argument("--eval-images", type=int, default=None, help="test-set size of the evaluate row "
                        "(default 1024; --small 64)")
    parser.add_argument("--eval-batch", type=int, default=None, help="evaluation batch (default 256, the paper "
                        "profile's eval_batch_size; --small 32)")
    parser.add_argument("--note", default=None, help="a free-text note stored in every row")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON lines are appended here")
    args = parser.parse_args(argv)
    for value, known in ((args.methods, methods), (args.modes, MODES)):
        unknown = set(value.split(",")) - set(known)
        if unknown:
            parser.error(f"unknown {sorted(unknown)}; expected some of {list(known)}")
    return args


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    shapes, device = SMALL if args.small else PAPER, torch.device(args.device)
    options = Options(args.adamw, args.text_attention, args.compile)
    note = {"note": args.note} if args.note else {}
    records = []
    for method in args.methods.split(","):
        if method == EVALUATE:
            images = args.eval_images or (64 if args.small else 1024)
            fields = measure_evaluation(shapes, device, images, args.eval_batch or (32 if args.small else 256),
                                        max(1, min(args.steps, 3)), options)
            records.append(_write(args.out, {"benchmark": "throughput", **fields, **note, **environment(device)}))
            continue
        for mode in args.modes.split(","):
            if method in BASELINES and mode != "accumulate":
                print(f"{method:10s} {mode:13s} skipped: the baselines run one micro-batch per forward", flush=True)
                continue
            fields = measure(method, mode, shapes, device, args.steps, args.warmup, options=options)
            records.append(_write(args.out, {"benchmark": "throughput", **fields, **note, **environment(device)}))
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return records


def _write(out: Path, record: dict) -> dict:
    append_jsonl(out, record)
    print(f"{record['method']:10s} {record['mode']:13s} {record['img_per_s']:9.1f} img/s  "
          f"{record['pairs_per_forward']:4d} pairs/forward  {record['precision']:13s}"
          + (f"  peak {record['peak_mem_gb']:.2f} GB" if "peak_mem_gb" in record else ""), flush=True)
    return record


if __name__ == "__main__":
    main(sys.argv[1:])
