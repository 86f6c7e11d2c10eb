"""The training objective of one batch: L_HN (or InfoNCE) + lambda * L_tok, on the global batch, and
L_HN itself (paper Eq. 2): `margin_matrix` gives the margins gamma * G_bar, `hn_logits` adds them to the
similarities, s * (S + gamma * G_bar), and `hn_loss` is the symmetric cross-entropy of those logits. A
run's train.json names the function of this file that computed its loss terms (`loss_terms`; in the
compute batch mode `group_terms`), and `hnclip lineage` prints that name.

Features are encoded under the run's precision context (bf16 autocast on accelerators) and every
loss is computed in fp32 on them. In a multi-process run the features are gathered first
(`hnclip.losses.distributed`), so each term sees the whole global micro-batch; in one process the
gather is the identity and the computation is exactly the single-batch one.

An objective is a run's `objective` (its keys: `hnclip.config.objective_keys`). `global_logits` is the one
place its keys become the global terms' logits: the trainer's terms (`contrastive_terms`, on every path:
micro-batch, compute_batch, exact batch, the baselines' + L_HN) and the gradient probe read them there.
`margin_control` (absent = none; Table X1's controls, `constant_margins` and `shuffled_margins`) replaces
G_bar by a constant or a shuffled margin matrix. The shuffle of a contrastive group is drawn from its
*shuffle key* (epoch, micro-batch index within the epoch; in exact-batch mode the group's first) and the
run seed (`with_run_seed`), so it is the same on every path, on every rank and after a resume.

Names (the glossary of docs/pipeline.md): the *G features* are the text features G is the cosine matrix
of (the live text features, or those of a frozen initial text tower: the *G source*); a *margin* is the
gap a positive's logit must clear over a negative's, and `margin_matrix` gives the margins gamma * G_bar
or a *margin control* of them (beyond the paper, Table X1): `constant` gives every negative the same margin,
gamma * mean(G_bar off-diagonal) of its batch (an AM-softmax-style fixed margin); `shuffled` permutes
the caption pairs' margins within the batch (the same margins, no longer on the pairs whose captions
are similar). Both keep the diagonal at 0.
"""
from __future__ import annotations

import contextlib
import hashlib
from typing import Callable, ContextManager

import torch
import torch.nn.functional as F

from hnclip.config.objective_keys import MARGIN_CONTROLS, g_source, margin_control, margin_settings
from hnclip.losses.contrastive import infonce_logits, symmetric_cross_entropy
from hnclip.losses.distributed import gather_features, gather_token_features, global_token_alignment_loss
from hnclip.losses.token import late_interaction_similarities, token_loss_of_similarities
from hnclip.models.towers import Encoded, encode_batch, encode_text

TOKEN_LOSS_CHUNK = 16  # captions per chunk of the token-level term: bounds its memory at paper scale
Autocast = Callable[[], ContextManager]  # a fresh precision context per forward
ShuffleKey = tuple[int, int]  # (epoch, micro-batch index within the epoch) of a contrastive group


# ---- L_HN (paper Eq. 2): the margins gamma * G_bar, added to the similarities -------------------------
def margin_matrix(g_features: torch.Tensor, gamma: float, margin_control: str = "none",
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """gamma * G_bar: detached text-text cosine with a zero diagonal (paper Eq. 2), or one of its
    controls (`constant_margins`, `shuffled_margins`; `generator` draws the shuffle)."""
    # At least fp32 (bf16 features under autocast), never lower than the input's precision.
    feats = g_features.detach()
    feats = F.normalize(feats.to(torch.promote_types(feats.dtype, torch.float32)), dim=-1)
    margins = gamma * (feats @ feats.t())
    margins.fill_diagonal_(0.0)
    if margin_control == "none":
        return margins
    if margin_control == "constant":
        return constant_margins(margins)
    if margin_control == "shuffled":
        if generator is None:
            raise ValueError("shuffled margins need a generator (the run seed and the micro-batch's position)")
        return shuffled_margins(margins, generator)
    raise ValueError(f"unknown margin control {margin_control!r}; allowed values: {list(MARGIN_CONTROLS)}")


def constant_margins(margins: torch.Tensor) -> torch.Tensor:
    """Every off-diagonal entry replaced by the mean of the off-diagonal entries; the diagonal 0."""
    n = margins.shape[0]
    off_diagonal = ~torch.eye(n, dtype=torch.bool, device=margins.device)
    mean = margins[off_diagonal].mean() if n > 1 else margins.new_zeros(())
    return torch.where(off_diagonal, mean, torch.zeros_like(margins))


def shuffled_margins(margins: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """The caption pairs' margins permuted among the pairs: the upper triangle's values are shuffled
    (a permutation drawn from the CPU `generator`) and mirrored, so the result stays symmetric like
    G, keeps the multiset of off-diagonal values and a zero diagonal, and no longer ties a margin to
    the pair whose captions are similar."""
    n = margins.shape[0]
    rows, cols = torch.triu_indices(n, n, offset=1, device=margins.device)
    values = margins[rows, cols]
    order = torch.randperm(values.numel(), generator=generator).to(margins.device)
    shuffled = torch.zeros_like(margins)
    shuffled[rows, cols] = values[order]
    shuffled[cols, rows] = values[order]
    return shuffled


def hn_logits(image_features: torch.Tensor, text_features: torch.Tensor, logit_scale: torch.Tensor | float,
              gamma: float, g_features: torch.Tensor | None = None, margin_control: str = "none",
              generator: torch.Generator | None = None, **margin_settings) -> torch.Tensor:
    """s * (S + gamma * G_bar) (or a margin control of G_bar); G is that of the `text_features` themselves
    (the live encoder's) unless other `g_features` are given (e.g. a frozen initial text tower's). The
    objective's other margin settings (`margin_settings`, by their keys' names in
    hnclip.config.objective_keys) go to `margin_matrix` as they are."""
    sims = image_features @ text_features.t()
    margins = margin_matrix(text_features if g_features is None else g_features, gamma,
                            margin_control, generator, **margin_settings)
    return logit_scale * (sims + margins.to(sims.dtype))


def hn_loss(image_features: torch.Tensor, text_features: torch.Tensor, logit_scale: torch.Tensor | float,
            gamma: float, g_features: torch.Tensor | None = None, margin_control: str = "none",
            generator: torch.Generator | None = None) -> torch.Tensor:
    """L_HN (paper Eq. 2): InfoNCE on the logits s * (S + gamma * G_bar) (`hn_logits`); the positive must
    beat each negative j by gamma * G_ij. gamma = 0 is exactly InfoNCE."""
    return symmetric_cross_entropy(hn_logits(image_features, text_features, logit_scale, gamma, g_features,
                                             margin_control, generator))


# ---- the objective of a run: its keys -> the terms of one batch ------------------------------------------
def as_float32(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """Upcast bf16/fp16 activations for the losses; fp32 tensors are returned as they are."""
    return tensor if tensor is None or not tensor.is_floating_point() else tensor.float()


def trained_term(objective: dict) -> str:
    """The global term that is back-propagated: L_HN when gamma > 0, else plain InfoNCE."""
    return "hn" if objective["gamma"] > 0 else "infonce"


def with_run_seed(objective: dict, seed: int) -> dict:
    """The objective as a run's losses see it: a shuffled-G run also carries its seed (the first part
    of every group's shuffle); any other objective is returned as it is."""
    return {**objective, "run_seed": int(seed)} if margin_control(objective) == "shuffled" else objective


def shuffle_generator(objective: dict, shuffle_key: ShuffleKey | None) -> torch.Generator | None:
    """The CPU generator of one contrastive group's shuffled margins (None unless G is shuffled):
    seeded from (run seed, epoch, micro-batch index), so a resumed run draws the same permutations."""
    if objective["gamma"] <= 0 or margin_control(objective) != "shuffled":
        return None
    if shuffle_key is None or "run_seed" not in objective:
        raise ValueError("shuffled margins need the run seed (with_run_seed) and the group's shuffle key")
    epoch, index = shuffle_key
    digest = hashlib.blake2b(f"{objective['run_seed']}/{epoch}/{index}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)  # within int64


def frozen_g_features(frozen_text, tokens: torch.Tensor, objective: dict) -> torch.Tensor | None:
    """The G features of a frozen G source (Table 3c): the text features of the frozen initial text tower;
    None when G comes from the live text features."""
    if objective["gamma"] <= 0 or g_source(objective) != "frozen":
        return None
    with torch.no_grad():
        return encode_text(frozen_text, tokens)


def global_logits(image_features, text_features, logit_scale, objective: dict, g_features=None,
                  shuffle_key: ShuffleKey | None = None) -> dict[str, torch.Tensor]:
    """The logits of the objective's global terms on the global batch (features in fp32, gathered across
    processes): `infonce` (s * S) and, when gamma > 0, `hn` (s * (S + gamma * G_bar), or a margin control
    of G_bar, shuffled by the group's `shuffle_key`). Every objective key the global terms depend on is
    read here and nowhere else: the margin settings (`margin_settings`) go to `margin_matrix` by name."""
    image_features, text_features, g_features = gather_features(
        as_float32(image_features), as_float32(text_features), g_features)
    logits = {"infonce": infonce_logits(image_features, text_features, logit_scale)}
    if objective["gamma"] > 0:
        logits["hn"] = hn_logits(image_features, text_features, logit_scale, objective["gamma"], g_features,
                                 generator=shuffle_generator(objective, shuffle_key), **margin_settings(objective))
    return logits


def contrastive_terms(image_features, text_features, logit_scale, objective: dict,
                      g_features=None, shuffle_key: ShuffleKey | None = None) -> dict[str, torch.Tensor]:
    """The global terms (`global_logits`' symmetric cross-entropies): `hn` and `infonce` (no gradient: the
    saturation diagnostic of paper Fig. 4, logged even when L_HN is trained), or `infonce` alone (gamma 0)."""
    logits = global_logits(image_features, text_features, logit_scale, objective, g_features, shuffle_key)
    trained = trained_term(objective)
    terms = {trained: symmetric_cross_entropy(logits[trained])}
    with torch.no_grad():
        terms.update({name: symmetric_cross_entropy(value) for name, value in logits.items() if name != trained})
    return terms


def token_term(encoded: Encoded, logit_scale) -> torch.Tensor:
    """L_tok (FILIP) over the gathered batch."""
    return global_token_alignment_loss(as_float32(encoded.image_tokens), as_float32(encoded.text_tokens),
                                       encoded.text_padding_mask, logit_scale, chunk_size=TOKEN_LOSS_CHUNK)


def grouped_token_similarities(encoded: Encoded, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The FILIP scores (sim_i2t, sim_t2i), [groups, m, m] each, of `groups` equal contrastive groups whose
    rows are concatenated in `encoded` (a compute-batch forward), in one call: block-diagonal, group g's
    scores those of its own rows (gathered across processes) alone, as `token_term` computes them."""
    local_rows = encoded.image_tokens.shape[0]
    if local_rows % groups:
        raise ValueError(f"{local_rows} rows are not {groups} equal groups")
    gathered = gather_token_features(as_float32(encoded.image_tokens), as_float32(encoded.text_tokens),
                                     encoded.text_padding_mask)
    # gathered rank-major (rank, group, row): a group's gathered rows are its rows of every rank, in rank order
    by_group = [tensor.reshape(-1, groups, local_rows // groups, *tensor.shape[1:]).transpose(0, 1)
                .reshape(groups, -1, *tensor.shape[1:]) for tensor in gathered]
    return late_interaction_similarities(*by_group, chunk_size=TOKEN_LOSS_CHUNK)


def group_terms(encoded: Encoded, scale: torch.Tensor, objective: dict,
                g_features: torch.Tensor | None = None,
                shuffle_key: ShuffleKey | None = None,
                token_similarities: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The objective's named terms on one contrastive group (the features of one micro-batch);
    `total` is what is back-propagated. `token_similarities`: the group's FILIP scores computed already (a
    compute-batch forward scores all its groups at once, `grouped_token_similarities`); None: scored here."""
    terms = contrastive_terms(encoded.image_features, encoded.text_features, scale, objective, g_features,
                              shuffle_key)
    total = terms[trained_term(objective)]
    if objective["lambda_tok"] > 0:
        terms["tok"] = token_term(encoded, scale) if token_similarities is None else \
            token_loss_of_similarities(*token_similarities, scale)
        total = total + objective["lambda_tok"] * terms["tok"]
    terms["total"] = total
    return terms


def loss_terms(model, images, tokens, objective: dict, frozen_text=None,
               autocast: Autocast = contextlib.nullcontext,
               shuffle_key: ShuffleKey | None = None) -> dict[str, torch.Tensor]:
    """The objective's named terms for one micro-batch (its forward, then `group_terms`)."""
    with autocast():
        encoded = encode_batch(model, images, tokens, with_tokens=objective["lambda_tok"] > 0)
        g_features = frozen_g_features(frozen_text, tokens, objective)
    return group_terms(encoded, model.logit_scale.exp(), objective, g_features, shuffle_key)
