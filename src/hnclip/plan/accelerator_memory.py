"""Accelerator memory of one training step, per framework: fixed memory plus activations per pair.

Fixed: the fp32 weights (4 bytes a parameter), the trainable parameters' gradients (4) and AdamW's two
moments (8), autocast's bf16 copies of the weights it casts for a forward (2 a parameter, bf16 runs
only) and, for frozen-G runs, the frozen copy of the initial text tower.

Activations: what autograd saves for the backward, per pair, per block of each tower. Counted from the
tensors open_clip's pre-LN block with QuickGELU saves (checked with `torch.autograd.graph.saved_tensors_hooks`
at Long-CLIP-L's widths, tests/test_plan_memory.py), in values of tokens x width per block:
  * 2 LayerNorm inputs, held in fp32 under autocast (the residual stream stays fp32);
  * 6 at the compute dtype: the in-projection's input, q, k and v, the attention output (the
    projection's input), the MLP's input;
  * 3 x mlp_ratio at the compute dtype: QuickGELU's input and sigmoid, and the second linear's input.
Flash / memory-efficient attention keeps no tokens x tokens score matrix. So a block holds 80 bytes per
token-width value in fp32 and 44 in bf16 (the fp32 -> bf16 conversion: 2 x 4 + 18 x 2 against 20 x 4).
DoRA keeps two more values per output feature of each adapted linear (9 x width a token: q, k, v, out,
4 x width of the MLP's first linear, the second's width) for the magnitude rescale, one in fp32 and one at
the compute dtype (fp32: 72 bytes more per token-width value, bf16: 54); LoRA (rank 16) adds 2 values at
the compute dtype under autocast (its path's own cast of the input) and nothing measurable in fp32.
Outside the blocks: the pixels (3 values a pixel) and 4 residual values a token (embedding, pre/post
LayerNorms, with the token term also the projected tokens). The token term L_tok keeps each
16-pair group's [m, m, patches, tokens] score tensor: m x patches x tokens fp32 values a pair.

How many tower passes a pair costs, by framework (the trainer's code):
  full, lora, dora   one image, one caption, at the run's precision, `compute_batch` pairs per forward
  finelip            one image, one caption, in fp32 as released, one micro-batch per forward
  goal               image + segment crop, caption + matched sentence, under autocast, and again in
                     fp32 (the release's second forward of both towers; both graphs back-propagated)
  structxlip         photo, edge map and top-k edge crops; caption and its filtered copy; under autocast

Activation checkpointing keeps each block's input (one fp32 residual value a token-width) and, during
the backward, one block's activations recomputed.

A step fits a card when the modelled peak is at most `USABLE_FRACTION` of it (the CUDA context, cuBLAS
workspaces and the caching allocator's fragmentation take the rest). The ladder of plans a run tries
is the trainer's out-of-memory fallback (`hnclip.training.memory_plan`): compute batch 128, 64, 32, 16, then
16 with activation checkpointing.
"""
from __future__ import annotations

from dataclasses import dataclass

from hnclip.config.constants import ADAPTER_FRAMEWORKS, CONTEXT_LENGTH, TRAINED_FRAMEWORKS
from hnclip.config.objective_keys import g_source
from hnclip.config.registry import Registry
from hnclip.plan.model_size import adapter_parameters, clip_parameters, model_config, text_tower_parameters
from hnclip.training.memory_plan import MemoryPlan

GB = 1e9
BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
RESIDUAL_BYTES = 4              # LayerNorm inputs: the residual stream is fp32 under autocast
CARDS_GB = (24, 40, 48, 64, 80)  # 24: RTX 4090 / L4 class; 40 / 80: A100; 48: A6000 / L40S; 64: Ascend 910B
USABLE_FRACTION = 0.9


@dataclass(frozen=True)
class Tower:
    tokens: int
    width: int
    layers: int
    mlp_ratio: float
    pixels: int = 0             # an image tower's input pixels

    def block_values(self, compute_bytes: int, adapter: str | None = None) -> float:
        """Bytes one block saves per sample (`adapter`: lora, dora or None)."""
        per_token = 2 * RESIDUAL_BYTES + (6 + 3 * self.mlp_ratio) * compute_bytes
        extra = 5 + self.mlp_ratio  # values a token of the adapted linears' outputs: q, k, v, out, fc1, fc2
        if adapter == "dora":       # the magnitude rescale: one copy in fp32, one at the compute dtype
            per_token += extra * 4 + extra * compute_bytes
        elif adapter == "lora" and compute_bytes < 4:
            per_token += 2 * compute_bytes  # the adapter path's own cast of its input under autocast
        return self.tokens * self.width * per_token

    def pass_bytes(self, compute_bytes: int, adapter: str | None = None, checkpointing: bool = False) -> float:
        """Bytes one sample's pass through the tower keeps for the backward."""
        outside = 3 * self.pixels * compute_bytes + 4 * self.tokens * self.width * RESIDUAL_BYTES
        if checkpointing:
            return outside + self.layers * self.tokens * self.width * RESIDUAL_BYTES
        return outside + self.layers * self.block_values(compute_bytes, adapter)


def towers(cfg: dict, context_length: int) -> tuple[Tower, Tower]:
    vision, text = cfg["vision_cfg"], cfg["text_cfg"]
    grid = vision["image_size"] // vision["patch_size"]
    image = Tower(grid * grid + 1, vision["width"], vision["layers"], vision.get("mlp_ratio", 4.0),
                  vision["image_size"] ** 2)
    return image, Tower(context_length, text["width"], text["layers"], text.get("mlp_ratio", 4.0))


@dataclass(frozen=True)
class Passes:
    """Tower passes per pair: (images, captions) at the run's precision, and again in fp32."""
    images: int
    captions: int
    fp32_images: int = 0
    fp32_captions: int = 0


def passes(framework: str, top_k: int) -> Passes:
    if framework == "goal":
        return Passes(2, 2, 2, 2)
    if framework == "structxlip":
        return Passes(2 + top_k, 2)
    return Passes(1, 1)


@dataclass(frozen=True)
class FrameworkMemory:
    """The memory model of one kind of run of a profile."""
    name: str
    framework: str
    runs: int
    precision: str
    fixed_bytes: float
    per_pair_bytes: float
    per_pair_checkpointed_bytes: float
    micro_batch: int
    compute_batch: int          # pairs per forward the run starts with
    blocks: int                 # blocks of both towers: checkpointing recomputes one at a time

    def peak_gb(self, pairs: int, checkpointing: bool = False) -> float:
        per_pair = self.per_pair_checkpointed_bytes if checkpointing else self.per_pair_bytes
        recomputed = (self.per_pair_bytes - self.per_pair_checkpointed_bytes) * pairs / self.blocks if checkpointing \
            else 0.0
        return (self.fixed_bytes + per_pair * pairs + recomputed) / GB

    def ladder(self) -> list[tuple[int, bool]]:
        """The plans the trainer tries, in order (its own MemoryPlan): halved compute batches, then
        checkpointing."""
        plan = MemoryPlan(self.compute_batch, self.micro_batch)
        plans = [(plan.compute_batch, plan.activation_checkpointing)]
        while plan.shrink(None, lambda message: None):
            plans.append((plan.compute_batch, plan.activation_checkpointing))
        return plans

    def first_fit(self, card_gb: float) -> tuple[int, bool] | None:
        """The first plan of the ladder that fits a card, or None."""
        return next((plan for plan in self.ladder() if self.peak_gb(*plan) <= USABLE_FRACTION * card_gb), None)


def memory_model(reg: Registry, precision: str | None = None) -> list[FrameworkMemory]:
    """One entry per kind of training run of the profile (framework; frozen-G full runs apart).
    `precision` overrides every run's (fp32: what a CPU step at the paper's settings holds)."""
    cfg = model_config(reg.backbone_spec()["model_config"])
    context = CONTEXT_LENGTH  # Long-CLIP's text tower, whatever the open_clip config says
    image, text = towers(cfg, context)
    parameters = clip_parameters(cfg, context)
    text_parameters = text_tower_parameters(cfg, context)
    top_k = reg.profile.get("auxiliary", {}).get("edges", {}).get("top_k", 2)
    kinds: dict[str, dict] = {}
    for run in reg.runs().values():
        spec = run.spec
        objective, recipe = spec["objective"], spec["recipe"]
        framework = objective["framework"]
        frozen = framework in TRAINED_FRAMEWORKS and g_source(objective) == "frozen"
        name = "frozen_g" if frozen else framework
        kind = kinds.setdefault(name, {"framework": framework, "runs": 0, "recipe": recipe, "objective": objective})
        kind["runs"] += 1
        kind["tokens"] = kind.get("tokens", False) or objective.get("lambda_tok", 0) > 0
    entries = []
    for name, kind in kinds.items():
        framework, recipe = kind["framework"], kind["recipe"]
        run_precision = precision or recipe["precision"]
        compute = BYTES[run_precision]
        trainable = adapter_parameters(cfg, framework) if framework in ADAPTER_FRAMEWORKS else parameters
        fixed = 4 * parameters + 12 * trainable + (2 * parameters if compute == 2 else 0)
        if name == "frozen_g":
            fixed += 4 * text_parameters
        counts = passes(framework, top_k)
        adapter = framework if framework in ADAPTER_FRAMEWORKS else None

        def per_pair(checkpointing: bool) -> float:
            total = (counts.images * image.pass_bytes(compute, adapter, checkpointing)
                     + counts.captions * text.pass_bytes(compute, adapter, checkpointing)
                     + counts.fp32_images * image.pass_bytes(4, adapter, checkpointing)
                     + counts.fp32_captions * text.pass_bytes(4, adapter, checkpointing))
            if kind["tokens"] or framework == "finelip":
                total += recipe["micro_batch"] * image.tokens * text.tokens * 4
            return total
        # compute_batch is an execution choice kept out of run ids: the profile's recipe holds it
        grouped = framework in TRAINED_FRAMEWORKS
        start = reg.profile["recipe"].get("compute_batch", recipe["micro_batch"]) if grouped else recipe["micro_batch"]
        entries.append(FrameworkMemory(name, framework, kind["runs"], run_precision, fixed, per_pair(False),
                                       per_pair(True), recipe["micro_batch"], start, image.layers + text.layers))
    return entries


def plan_label(plan: tuple[int, bool] | None) -> str:
    if plan is None:
        return "does not fit"
    pairs, checkpointing = plan
    return f"{pairs}{' + ckpt' if checkpointing else ''}"


def format_memory(entries: list[FrameworkMemory], cards: tuple[int, ...] = CARDS_GB) -> list[str]:
    """The memory section of `hnclip plan` (and the table of docs/paper-run.md)."""
    lines = [f"Accelerator memory per training step (GB; fits when the model's peak is at most "
             f"{USABLE_FRACTION:.0%} of the card; hnclip.plan.accelerator_memory):",
             f"  {'kind':<11} {'runs':>4} {'prec':>5} {'fixed':>6} {'per pair':>8} {'start':>6} {'peak':>6}  "
             + " ".join(f"{f'{gb} GB':>12}" for gb in cards)]
    for entry in entries:
        fits = [plan_label(entry.first_fit(gb)) for gb in cards]
        lines.append(f"  {entry.name:<11} {entry.runs:>4} {entry.precision:>5} {entry.fixed_bytes / GB:>6.1f} "
                     f"{entry.per_pair_bytes / GB:>8.3f} {entry.compute_batch:>6} "
                     f"{entry.peak_gb(entry.compute_batch):>6.1f}  " + " ".join(f"{f:>12}" for f in fits))
    lines.append("  (start: pairs per forward the run starts with; each card column: the first plan of the "
                 "out-of-memory ladder that fits, pairs per forward, + ckpt = activation checkpointing)")
    return lines
