"""Gradient probe (paper §2.4, Fig. 4, Appendix C): L_CLIP vs L_HN on the batch being trained.

Every `execution.grad_probe_every` optimizer steps (before that step's update, on the first
micro-batch of its accumulation group) one forward pass gives both losses, and two
`torch.autograd.grad` calls give their gradients w.r.t. every trainable parameter (all of the
model for full fine-tuning, the adapters for LoRA/DoRA). We log the two losses, the two gradient
L2 norms, their cosine, whether each gradient is exactly zero in fp32 (every entry == 0: softmax
residuals underflowed), the fraction of parameter entries whose gradient is exactly zero, and the
largest |dL/dlogit| of each loss.

Where an "exact zero in fp32" can come from (Table X1): the same batch's L_CLIP is also measured
with its forward and loss under bf16 autocast, as open_clip's training step computes them (matmuls in
bf16, softmax and cross-entropy autocast to fp32; `clip_bf16_*`) on every `execution.grad_probe_bf16_every`-th
probe (a CPU without bf16 units spends about 4x the rest of a probe on it; rows that skip it hold None, and
the reports count only the rows that measured it), and the fp32 gradient's norm is also
computed the way an fp32 trainer computes it (`clip_grad_norm_fp32`: squares in fp32, which
underflow below ~1e-22 per entry), beside the float64 norm.

Both losses are the run's own: the probe hands the run's objective to the function the trainer computes
the global terms with (`hnclip.losses.objective.global_logits`), so L_HN has the run's gamma, G source
and margin control (constant / shuffled G, with the micro-batch's shuffle key), and every
objective key added later; a run with gamma 0 (InfoNCE) is probed with gamma 0.5, the paper's default,
and its margin settings at their defaults (`gamma_source` says which). Every record states the objective
it measured: each key of `hnclip.config.objective_keys`, by its identity name as the run's spec names it
(`margin` for the G source), an option at its default included. Only the global terms are probed
(no token term).
The probe cannot change training: it never touches .grad, it runs under a forked RNG, and the
model has no batch statistics. Norms and dot products accumulate in float64, so tiny fp32
gradients are not flushed to zero by squaring.

Out of memory (an fp32 forward of the whole micro-batch, kept for two full gradients): the pairs per
forward are halved and the probe retried (`hnclip.runtime.out_of_memory.HalvingBatch`), the smaller size
kept for the run's later probes. The losses still span the whole micro-batch: its features are encoded
piece by piece without a graph, the losses' gradients w.r.t. the features computed once, and each piece
encoded again with its graph and back-propagated with its share of them (`pieced_gradients`). The
gradients are the same sums in another order (equal up to float rounding); the record names the size used
(`memory_fallback`). In a multi-process run an error cannot be retried on one rank alone: it is raised.
"""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from hnclip.config import objective_keys
from hnclip.config.objective_keys import g_source, margin_defaults
from hnclip.losses.contrastive import infonce_logits, symmetric_cross_entropy
from hnclip.losses.distributed import gather_features
from hnclip.losses.objective import Autocast, ShuffleKey, frozen_g_features, global_logits, margin_control
from hnclip.models.towers import encode_batch
from hnclip.runtime.out_of_memory import HalvingBatch
from hnclip.training.distributed import Distributed, average_tensors

DEFAULT_PROBE_GAMMA = 0.5  # paper default, for probing runs trained with plain InfoNCE
BF16_AUTOCAST_DEVICE_TYPES = ("cpu", "cuda", "npu")  # where torch.autocast runs bf16 (else: not measured)
INFONCE_GRADIENT_FIELDS = ("loss", "grad_norm", "grad_exactly_zero", "max_abs_dlogit")  # bf16 record fields


@dataclass(frozen=True)
class GradientProbe:
    every: int
    objective: dict = field(hash=False)   # the objective L_HN is measured with (see `from_settings`)
    gamma_source: str = "objective"       # "objective" or "default" (the run's gamma is 0)
    bf16_every: int = 1                   # the bf16 L_CLIP measurement on every k-th probe (0: never)
    # pairs per forward the probe fell back to after running out of memory (empty: the whole batch)
    forward_pairs: dict = field(default_factory=dict, hash=False, compare=False, repr=False)

    @classmethod
    def from_settings(cls, execution: dict, objective: dict) -> "GradientProbe | None":
        """The probe of a run whose objective (with its run seed, `with_run_seed`) is `objective`: L_HN is
        the run's own, or at a gamma-0 run the paper's default gamma with the margin settings' defaults."""
        every = int(execution.get("grad_probe_every", 0) or 0)
        if every <= 0:
            return None
        bf16_every = int(execution.get("grad_probe_bf16_every", 1))
        if objective["gamma"] > 0:
            return cls(every, dict(objective), "objective", bf16_every)
        return cls(every, {**objective, **margin_defaults(), "gamma": DEFAULT_PROBE_GAMMA}, "default", bf16_every)

    @property
    def gamma(self) -> float:
        return float(self.objective["gamma"])

    @property
    def g_source(self) -> str:
        """live | frozen, as the run."""
        return g_source(self.objective)

    @property
    def margin_control(self) -> str:
        """none | constant | shuffled, as the run."""
        return margin_control(self.objective)

    def due(self, step: int) -> bool:
        """Probe before optimizer steps 0, k, 2k, ... (step = updates done so far)."""
        return step % self.every == 0

    def bf16_due(self, step: int) -> bool:
        """Whether the probe before `step` also measures L_CLIP under bf16 autocast: probes 0, k, 2k, ...
        for k = bf16_every."""
        return self.bf16_every > 0 and step % (self.every * self.bf16_every) == 0

    def measure(self, model, parameters: list[torch.nn.Parameter], images, tokens, frozen_text=None,
                autocast: Autocast = contextlib.nullcontext, distributed: Distributed = Distributed(),
                shuffle_key: ShuffleKey | None = None, with_bf16: bool = True) -> dict:
        """`shuffle_key`: the probed micro-batch's key (a shuffled-G run draws its training shuffle);
        `with_bf16`: also measure L_CLIP under bf16 autocast (else its fields are None). Out of memory: the
        pairs per forward are halved (see the module's docstring)."""
        pairs = len(images)
        halving = HalvingBatch(pairs, what="probe pairs per forward",
                               size=min(pairs, self.forward_pairs.get("size", pairs)))

        def attempt(size: int) -> dict:
            return self._measure(model, parameters, images, tokens, frozen_text, autocast, distributed, shuffle_key,
                                 with_bf16, size)
        record = halving.run(attempt, images.device, lambda line: print(f"gradient probe: {line}", file=sys.stderr),
                             retry=not distributed.enabled)
        if halving.size < pairs:
            self.forward_pairs["size"] = halving.size
            record["memory_fallback"] = {"what": halving.what, "requested": pairs, "used": halving.size,
                                         "halvings": halving.fallbacks}
        return record

    def _measure(self, model, parameters, images, tokens, frozen_text, autocast, distributed, shuffle_key,
                 with_bf16: bool, size: int) -> dict:
        """`measure` with `size` pairs per forward (the whole batch: one forward, as always)."""
        with _preserved_rng(images.device):
            if size >= len(images):
                logits = self._logits(model, images, tokens, frozen_text, autocast, shuffle_key)
                losses = {name: symmetric_cross_entropy(value) for name, value in logits.items()}
                clip_grads = torch.autograd.grad(losses["clip"], [*parameters, logits["clip"]], retain_graph=True,
                                                 allow_unused=True)
                hn_grads = torch.autograd.grad(losses["hn"], [*parameters, logits["hn"]], allow_unused=True)
            else:
                logits, losses, clip_grads, hn_grads = self._pieced(model, parameters, images, tokens, frozen_text,
                                                                    autocast, shuffle_key, size)
            bf16 = bf16_infonce_gradient(model, parameters, images, tokens, distributed, size) if with_bf16 \
                else not_measured_bf16()
        clip_params = _dense(clip_grads[:-1], parameters)
        hn_params = _dense(hn_grads[:-1], parameters)
        if distributed.enabled:  # each rank holds its share of the global gradient (see losses.distributed)
            average_tensors(clip_params + hn_params, distributed.world_size)
        clip, hn = _statistics(clip_params), _statistics(hn_params)
        record = {**objective_keys.record(self.objective), "gamma_source": self.gamma_source,
                  "batch": int(logits["clip"].shape[0]), "parameters": clip["entries"],
                  "clip_loss": float(losses["clip"].detach()), "hn_loss": float(losses["hn"].detach()),
                  "clip_grad_norm": clip["norm"], "hn_grad_norm": hn["norm"],
                  "grad_cosine": _cosine(clip_params, hn_params, clip["norm"], hn["norm"]),
                  "clip_grad_exactly_zero": clip["zero_entries"] == clip["entries"],
                  "hn_grad_exactly_zero": hn["zero_entries"] == hn["entries"],
                  "clip_zero_grad_fraction": clip["zero_entries"] / max(1, clip["entries"]),
                  "hn_zero_grad_fraction": hn["zero_entries"] / max(1, hn["entries"]),
                  "clip_max_abs_dlogit": float(clip_grads[-1].abs().max()),
                  "hn_max_abs_dlogit": float(hn_grads[-1].abs().max()),
                  "clip_grad_norm_fp32": fp32_norm(clip_params), **bf16}
        record["exactly_zero_norms"] = int(record["clip_grad_exactly_zero"]) + int(record["hn_grad_exactly_zero"])
        return record

    def _logits(self, model, images, tokens, frozen_text, autocast, shuffle_key: ShuffleKey | None = None):
        """The logits of L_CLIP (`clip`) and L_HN (`hn`) from one forward, kept as graph nodes for dL/dlogit:
        the trainer's own (`global_logits`), on the probe's objective."""
        with autocast():
            encoded = encode_batch(model, images, tokens, with_tokens=False)
            g_features = frozen_g_features(frozen_text, tokens, self.objective)
        logits = global_logits(encoded.image_features, encoded.text_features, model.logit_scale.exp(), self.objective,
                               g_features, shuffle_key)
        return {"clip": logits["infonce"], "hn": logits["hn"]}

    def _pieced(self, model, parameters, images, tokens, frozen_text, autocast, shuffle_key, size: int):
        """The logits, losses and gradients of `_logits` with `size` pairs per forward (`pieced_gradients`)."""
        encode = _piece_encoder(model, images, tokens, autocast)

        def head(image_features, text_features):
            with autocast():
                g_features = frozen_g_features(frozen_text, tokens, self.objective)
            logits = global_logits(image_features, text_features, model.logit_scale.exp(), self.objective,
                                   g_features, shuffle_key)
            logits = {"clip": logits["infonce"], "hn": logits["hn"]}
            return {name: symmetric_cross_entropy(value) for name, value in logits.items()}, logits
        losses, logits, grads = pieced_gradients(encode, head, len(images), size, parameters)
        return logits, losses, grads["clip"], grads["hn"]


def _piece_encoder(model, images, tokens, autocast):
    """encode(start, stop): the features of pairs [start, stop) under `autocast()` (for `pieced_gradients`)."""
    def encode(start: int, stop: int):
        with autocast():
            encoded = encode_batch(model, images[start:stop], tokens[start:stop], with_tokens=False)
        return encoded.image_features, encoded.text_features
    return encode


def probe_summary(probe: GradientProbe | None, records: list[dict]) -> dict | None:
    """What train.json says about the probe; the records themselves go to grad_probe.jsonl."""
    if probe is None:
        return None
    return {"every": probe.every, "bf16_every": probe.bf16_every, **objective_keys.record(probe.objective),
            "gamma_source": probe.gamma_source, "measurements": len(records),
            "clip_grad_exactly_zero": sum(r["clip_grad_exactly_zero"] for r in records),
            "hn_grad_exactly_zero": sum(r["hn_grad_exactly_zero"] for r in records),
            "clip_bf16_grad_exactly_zero": sum(bool(r.get("clip_bf16_grad_exactly_zero")) for r in records)}


def bf16_infonce_gradient(model, parameters: list[torch.nn.Parameter], images, tokens,
                          distributed: Distributed = Distributed(), pairs_per_forward: int | None = None) -> dict:
    """L_CLIP of the batch with its forward and loss under bf16 autocast (open_clip's training step),
    as `clip_bf16_*` fields of a probe record (`infonce_gradient`); None values where the device has
    no bf16 autocast. `pairs_per_forward` below the batch: encoded piece by piece (`pieced_gradients`)."""
    device_type = images.device.type
    if device_type not in BF16_AUTOCAST_DEVICE_TYPES:
        return not_measured_bf16()
    if pairs_per_forward is not None and pairs_per_forward < len(images):
        measured = _pieced_bf16_infonce(model, parameters, images, tokens, device_type, pairs_per_forward)
        return {f"clip_bf16_{key}": measured[key] for key in INFONCE_GRADIENT_FIELDS}

    def forward():
        encoded = encode_batch(model, images, tokens, with_tokens=False)
        return encoded.image_features, encoded.text_features, model.logit_scale.exp()
    measured = infonce_gradient(forward, parameters, "bf16", device_type, distributed)
    return {f"clip_bf16_{key}": measured[key] for key in INFONCE_GRADIENT_FIELDS}


def _pieced_bf16_infonce(model, parameters, images, tokens, device_type: str, size: int) -> dict:
    """`infonce_gradient` under bf16 autocast with `size` pairs per forward (one process)."""
    def autocast():
        return torch.autocast(device_type=device_type, dtype=torch.bfloat16)

    encode = _piece_encoder(model, images, tokens, autocast)

    def head(image_features, text_features):
        with autocast():
            logits = infonce_logits(image_features, text_features, model.logit_scale.exp())
            loss = symmetric_cross_entropy(logits)
        return {"clip": loss}, {"clip": logits}
    losses, logits, grads = pieced_gradients(encode, head, len(images), size, parameters)
    params = _dense(grads["clip"][:-1], parameters)
    stats = _statistics(params)
    return {"loss": float(losses["clip"].detach()), "grad_norm": stats["norm"], "grad_norm_fp32": fp32_norm(params),
            "grad_exactly_zero": stats["zero_entries"] == stats["entries"],
            "max_abs_dlogit": float(grads["clip"][-1].float().abs().max())}


def pieced_gradients(encode: Callable[[int, int], tuple], head: Callable, pairs: int, size: int,
                     parameters: list[torch.nn.Parameter]):
    """Gradients of losses over a whole batch whose forward runs `size` pairs at a time (gradient caching).
    `encode(start, stop)` gives a piece's (image, text) features; `head(image, text)` gives ({name: loss},
    {name: logits}) of the whole batch's features. Returns (losses, logits, {name: [gradient w.r.t. each
    parameter (None: not reached)..., w.r.t. the logits]}): the features are encoded without a graph, the
    losses' gradients w.r.t. them taken once, then each piece is encoded again with its graph and
    back-propagated with its rows of those gradients."""
    spans = [(start, min(start + size, pairs)) for start in range(0, pairs, size)]
    with torch.no_grad():
        pieces = [encode(start, stop) for start, stop in spans]
    image = torch.cat([piece[0] for piece in pieces]).requires_grad_()
    text = torch.cat([piece[1] for piece in pieces]).requires_grad_()
    losses, logits = head(image, text)
    names = list(losses)
    grads, feature_grads = {}, {}
    for index, name in enumerate(names):
        top = torch.autograd.grad(losses[name], [*parameters, logits[name], image, text],
                                  retain_graph=index < len(names) - 1, allow_unused=True)
        # what the loss reaches past the features (the logit scale) has its whole gradient here already
        grads[name] = list(top[:len(parameters) + 1])
        feature_grads[name] = [torch.zeros_like(f) if g is None else g for g, f in zip(top[-2:], (image, text))]
    for start, stop in spans:
        outputs = encode(start, stop)
        for index, name in enumerate(names):
            piece = torch.autograd.grad(outputs, parameters, [g[start:stop] for g in feature_grads[name]],
                                        retain_graph=index < len(names) - 1, allow_unused=True)
            for position, g in enumerate(piece):
                if g is not None:
                    total = grads[name][position]
                    grads[name][position] = g if total is None else total + g
    return losses, logits, grads


def not_measured_bf16() -> dict:
    """The `clip_bf16_*` fields of a probe record that did not measure them."""
    return {f"clip_bf16_{key}": None for key in INFONCE_GRADIENT_FIELDS}


def infonce_gradient(forward, parameters: list[torch.nn.Parameter], precision: str, device_type: str = "cpu",
                     distributed: Distributed = Distributed()) -> dict:
    """L_CLIP on the features `forward()` returns (image features, text features, exponentiated scale),
    with the forward and the loss in fp32 or under bf16 autocast: its value, its gradient's float64 norm
    and fp32 norm (`fp32_norm`), whether every gradient entry w.r.t. `parameters` is exactly 0, and
    the largest |dL/dlogit|."""
    context = torch.autocast(device_type=device_type, dtype=torch.bfloat16) if precision == "bf16" \
        else contextlib.nullcontext()
    with context:
        image_features, text_features, scale = forward()
        image_features, text_features, _ = gather_features(image_features, text_features)
        logits = infonce_logits(image_features, text_features, scale)
        loss = symmetric_cross_entropy(logits)
    grads = torch.autograd.grad(loss, [*parameters, logits], allow_unused=True)
    params = _dense(grads[:-1], parameters)
    if distributed.enabled:
        average_tensors(params, distributed.world_size)
    stats = _statistics(params)
    return {"loss": float(loss.detach()), "grad_norm": stats["norm"], "grad_norm_fp32": fp32_norm(params),
            "grad_exactly_zero": stats["zero_entries"] == stats["entries"],
            "max_abs_dlogit": float(grads[-1].float().abs().max())}


def fp32_norm(grads: list[torch.Tensor]) -> float:
    """The gradient norm as an fp32 trainer computes it (torch's norm of the per-tensor norms, in the
    gradients' own dtype): 0 once every entry is below ~1e-22, while the gradient itself is not."""
    if not grads:
        return 0.0
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])))


@contextlib.contextmanager
def _preserved_rng(device: torch.device):
    """The probe's forward leaves the CPU and accelerator generators as it found them."""
    accelerator = device.type in ("cuda", "npu")
    with torch.random.fork_rng(devices=[device.index or 0] if accelerator else [],
                               device_type=device.type if accelerator else "cuda"):
        yield


def _dense(grads, parameters) -> list[torch.Tensor]:
    # A parameter the loss does not reach has an exactly-zero gradient.
    return [torch.zeros_like(p) if g is None else g for g, p in zip(grads, parameters)]


def _statistics(grads: list[torch.Tensor]) -> dict:
    squares = sum(float(g.double().pow(2).sum()) for g in grads)
    return {"norm": squares ** 0.5, "entries": sum(g.numel() for g in grads),
            "zero_entries": sum(int((g == 0).sum()) for g in grads)}


def _cosine(a: list[torch.Tensor], b: list[torch.Tensor], norm_a: float, norm_b: float) -> float | None:
    """Cosine of two gradients; None (JSON null) when either is exactly zero."""
    if norm_a == 0 or norm_b == 0:
        return None
    dot = sum(float((x.double() * y.double()).sum()) for x, y in zip(a, b))
    return max(-1.0, min(1.0, dot / (norm_a * norm_b)))
