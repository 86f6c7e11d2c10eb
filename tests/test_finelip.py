"""FineLIP objective: token score, hinge, aggregator masking, set construction and the loss terms."""
import math

import pytest
import torch
import torch.nn.functional as F

from hnclip.losses.finelip import (
    FineLIPModule,
    TokenAggregator,
    build_finelip_module,
    check_cls_pooling,
    eot_positions,
    fine_warmup_factor,
    finelip_hinge,
    finelip_loss_terms,
    finelip_settings,
    finelip_similarity,
    n_selected,
)
from hnclip.models.factory import create
from hnclip.models.towers import encode_batch

SOT, EOT = 49406, 49407


def _leaky(x: float) -> float:
    return x if x >= 0 else 0.1 * x


def _loop_score(image_set: list, text_set: list) -> float:
    """s = mean_t max_v M + mean_v max_t M with M = LeakyReLU_0.1(t . v), by explicit loops."""
    m = [[_leaky(sum(a * b for a, b in zip(t, v))) for v in image_set] for t in text_set]
    t2i = sum(max(row) for row in m) / len(text_set)
    i2t = sum(max(m[t][v] for t in range(len(text_set))) for v in range(len(image_set))) / len(image_set)
    return t2i + i2t


def _loop_hinge(s: list, margin: float) -> float:
    n = len(s)
    return sum(max(0.0, margin + s[i][j] - s[i][i]) + max(0.0, margin + s[i][j] - s[j][j])
               for i in range(n) for j in range(n) if i != j)


# ---- token score -----------------------------------------------------------------------------------
IMAGE_SETS = torch.tensor([[[1.0, 0.0], [0.0, 1.0]],
                           [[0.0, 1.0], [-1.0, 0.0]]])
TEXT_SETS = torch.tensor([[[1.0, 0.0], [0.6, 0.8], [-1.0, 0.0]],
                          [[0.0, 1.0], [0.0, -1.0], [-0.8, 0.6]]])
# By hand (rows t, columns v of M; negatives scaled by 0.1):
# s(0,0): M = [[1, 0], [.6, .8], [-.1, 0]]       -> mean(1, .8, 0) + mean(1, .8)   = 0.6 + 0.9
# s(1,0): M = [[0, -.1], [.8, -.06], [0, 1]]     -> mean(0, .8, 1) + mean(.8, 1)   = 0.6 + 0.9
# s(0,1): M = [[0, 1], [0, -.1], [-.08, .6]]     -> mean(1, 0, .6) + mean(0, 1)    = 1.6/3 + 0.5
# s(1,1): M = [[1, 0], [-.1, 0], [.6, .8]]       -> mean(1, 0, .8) + mean(1, .8)   = 0.6 + 0.9
HAND_SCORES = torch.tensor([[1.5, 1.6 / 3 + 0.5],
                            [1.5, 1.5]])


def test_token_score_matches_hand_computation():
    torch.testing.assert_close(finelip_similarity(IMAGE_SETS, TEXT_SETS), HAND_SCORES, rtol=0, atol=1e-6)


def test_padded_text_rows_are_ignored():
    # A 4th row (0, 1) would raise s(0,0) to mean(1, .8, 0, 1) + mean(1, 1) = 1.7 if it counted.
    extra = torch.tensor([[[0.0, 1.0]], [[0.0, 1.0]]])
    text_sets = torch.cat([TEXT_SETS, extra], dim=1)
    mask = torch.tensor([[False, False, False, True], [False, False, False, True]])
    torch.testing.assert_close(finelip_similarity(IMAGE_SETS, text_sets, mask), HAND_SCORES, rtol=0, atol=1e-6)
    assert finelip_similarity(IMAGE_SETS, text_sets)[0, 0].item() == pytest.approx(1.7, abs=1e-6)


@pytest.mark.parametrize("chunk_size", [None, 1, 2, 5])
def test_similarity_matches_loops_for_any_chunk(chunk_size):
    gen = torch.Generator().manual_seed(0)
    image_sets = F.normalize(torch.randn(4, 5, 6, generator=gen), dim=-1)
    text_sets = F.normalize(torch.randn(5, 3, 6, generator=gen), dim=-1)
    expected = torch.tensor([[_loop_score(i.tolist(), t.tolist()) for t in text_sets] for i in image_sets])
    got = finelip_similarity(image_sets, text_sets, chunk_size=chunk_size)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


# ---- hinge -----------------------------------------------------------------------------------------
S3 = torch.tensor([[0.9, 0.8, 0.1],
                   [0.5, 0.6, 0.7],
                   [0.3, 0.2, 1.0]])
# m = 0.2. c_s[i,j] = [m + S_ij - S_ii]_+ off the diagonal: row 0: (.1, 0), row 1: (.1, .3), row 2: (0, 0).
# c_im[i,j] = [m + S_ij - S_jj]_+: column 0: (0, 0), column 1: (.4, 0), column 2: (0, 0).
# sum: (.1 + .1 + .3) + .4 = 0.9. max-violation: rows (.1 + .3 + 0) + columns (0 + .4 + 0) = 0.8.
# (The diagonal would add 6 * m = 1.2 if it were not zeroed.)


def test_hinge_sum_matches_hand_computation():
    assert finelip_hinge(S3, margin=0.2).item() == pytest.approx(0.9, abs=1e-6)


def test_hinge_max_violation_matches_hand_computation():
    assert finelip_hinge(S3, margin=0.2, max_violation=True).item() == pytest.approx(0.8, abs=1e-6)


# ---- aggregator ------------------------------------------------------------------------------------
def test_aggregator_with_zero_gamma_averages_the_unpadded_tokens():
    # gamma = 0 makes every softmax row uniform over the valid tokens: each output is their mean.
    agg = TokenAggregator(dim=5, n_out=3)
    with torch.no_grad():
        agg.gamma.zero_()
    tokens = torch.tensor([[[1.0, 2.0, 3.0, 4.0, 5.0], [3.0, 4.0, 5.0, 6.0, 7.0], [math.nan, math.inf, 0, 0, 0]]],
                          requires_grad=True)
    out = agg(tokens, torch.tensor([[False, False, True]]))
    torch.testing.assert_close(out, torch.tensor([[[2.0, 3.0, 4.0, 5.0, 6.0]] * 3]))
    out.sum().backward()
    assert torch.isfinite(tokens.grad).all() and (tokens.grad[0, 2] == 0).all()
    assert all(torch.isfinite(p.grad).all() for p in agg.parameters() if p.grad is not None)


def test_masked_batch_equals_per_caption_slicing():
    """The released code aggregates each caption alone, sliced to X[0:L-1], then appends X[L-1]."""
    torch.manual_seed(0)
    module = FineLIPModule(embed_dim=8, num_patches=20)           # N_s = 4
    lengths = [9, 2, 5, 7]                                         # non-pad tokens incl. SOT and EOT
    text_tokens = torch.randn(4, 9, 8) * 3
    text_tokens[1, 2:] = 1e4                                       # padding: must not matter
    eot = torch.tensor(lengths) - 1
    batched = module.text_sets(text_tokens, eot)
    for j, length in enumerate(lengths):
        caption = text_tokens[j:j + 1, :length]
        sliced = torch.cat([module.text_aggregator(caption[:, :length - 1]), caption[:, length - 1:]], dim=1)
        torch.testing.assert_close(batched[j], F.normalize(sliced, dim=-1)[0], rtol=0, atol=1e-6)
    assert batched.shape == (4, module.n_selected + 1, 8)


def test_image_set_is_cls_then_aggregated_patches():
    torch.manual_seed(0)
    module = FineLIPModule(embed_dim=8, num_patches=20)
    cls, patches = torch.randn(2, 8) * 5, torch.randn(2, 6, 8)
    sets = module.image_sets(cls, patches)
    torch.testing.assert_close(sets[:, 0], cls / cls.norm(dim=-1, keepdim=True))
    aggregated = module.image_aggregator(patches)
    torch.testing.assert_close(sets[:, 1:], aggregated / aggregated.norm(dim=-1, keepdim=True))


# ---- sizes, settings, warmup ------------------------------------------------------------------------
def test_n_selected_floors_like_the_release():
    assert n_selected(196) == 39        # the released default
    assert n_selected(256) == 51        # ViT-L/14@224's own grid
    assert n_selected(64) == 12         # hnclip-tiny (8 x 8 patches)
    with pytest.raises(ValueError):
        n_selected(4)


@pytest.fixture(scope="module")
def tiny():
    return create("hnclip-tiny")


def test_module_sizes_from_settings(tiny):
    assert build_finelip_module(tiny.model).n_selected == 39
    module = build_finelip_module(tiny.model, {"num_patches": None})
    assert module.n_selected == 12
    assert module.image_aggregator.mlp[1].weight.shape == (12, 64)   # hidden floor(0.2 * 64) = 12
    with pytest.raises(ValueError, match="unknown FineLIP settings"):
        finelip_settings({"margn": 0.1})


def test_fine_warmup_ramps_over_epoch_zero_only():
    assert fine_warmup_factor(0, 0, 10) == 0.0
    assert fine_warmup_factor(0, 5, 10) == 0.5
    assert fine_warmup_factor(1, 0, 10) == 1.0


# ---- encoder glue -----------------------------------------------------------------------------------
def _batch(tiny, seed=0):
    gen = torch.Generator().manual_seed(seed)
    images = torch.randn(4, 3, 64, 64, generator=gen)
    tokens = tiny.tokenizer(["a dog runs on the beach", "red car", "two cats sleep on a sofa in the sun", "tree"])
    return images, tokens


def test_open_clip_tokens_exclude_cls_and_pooled_is_projected_cls(tiny):
    model = tiny.model
    images, tokens = _batch(tiny)
    check_cls_pooling(model.visual)
    encoded = encode_batch(model, images, tokens, with_tokens=True)
    visual = model.visual
    with torch.no_grad():
        all_tokens = visual.ln_post(visual.transformer(visual._embeds(images))) @ visual.proj   # [B, 65, E]
    torch.testing.assert_close(encoded.image_tokens, all_tokens[:, 1:], rtol=0, atol=1e-5)
    torch.testing.assert_close(encoded.image_features, F.normalize(all_tokens[:, 0], dim=-1), rtol=0, atol=1e-5)


def test_check_cls_pooling_rejects_average_pooling(tiny):
    visual = tiny.model.visual
    visual.pool_type = "avg"
    try:
        with pytest.raises(ValueError, match="CLS-pooled"):
            check_cls_pooling(visual)
    finally:
        visual.pool_type = "tok"


def test_eot_row_is_the_global_text_token_even_after_an_interior_zero_id(tiny):
    # Id 0 is both open_clip's padding and the BPE token "!": the EOT is found by its id, not by
    # counting non-zero ids.
    tokens = torch.zeros(2, 248, dtype=torch.long)
    tokens[0, :5] = torch.tensor([SOT, 320, 0, 321, EOT])
    tokens[1, :7] = torch.tensor([SOT, 1929, 320, 321, 343, 344, EOT])
    assert eot_positions(tokens).tolist() == [4, 6]
    encoded = encode_batch(tiny.model, torch.zeros(2, 3, 64, 64), tokens, with_tokens=True)
    module = build_finelip_module(tiny.model, {"num_patches": None})
    sets = module.text_sets(encoded.text_tokens, eot_positions(tokens[:, :7]))
    torch.testing.assert_close(sets[:, -1], encoded.text_features, rtol=0, atol=1e-6)


# ---- loss terms -------------------------------------------------------------------------------------
OBJECTIVE = {"framework": "full", "gamma": 0.0, "lambda_tok": 0.0, "g_source": "live"}
SETTINGS = {"num_patches": None}


def _terms(tiny, module, gamma, **kwargs):
    tiny.model.zero_grad(set_to_none=True)
    module.zero_grad(set_to_none=True)
    images, tokens = _batch(tiny)
    return finelip_loss_terms(tiny.model, module, images, tokens, {**OBJECTIVE, "gamma": gamma}, SETTINGS, **kwargs)


def test_fine_term_matches_a_per_caption_reference(tiny):
    torch.manual_seed(0)
    module = build_finelip_module(tiny.model, SETTINGS)
    fine = _terms(tiny, module, 0.0)["fine"].item()
    images, tokens = _batch(tiny)
    with torch.no_grad():
        encoded = encode_batch(tiny.model, images, tokens, with_tokens=True)
        lengths = (tokens != 0).sum(dim=1).tolist()                  # the release's L_j (no "!" here)
        image_sets, text_sets = [], []
        for i in range(4):
            cls = encoded.image_features[i:i + 1]
            image_sets.append(F.normalize(torch.cat([cls, module.image_aggregator(encoded.image_tokens[i:i + 1])[0]]),
                                          dim=-1).tolist())
            words = encoded.text_tokens[i:i + 1, :lengths[i] - 1]
            eot = encoded.text_tokens[i, lengths[i] - 1:lengths[i]]
            text_sets.append(F.normalize(torch.cat([module.text_aggregator(words)[0], eot]), dim=-1).tolist())
    scores = [[_loop_score(image_sets[i], text_sets[j]) for j in range(4)] for i in range(4)]
    assert fine == pytest.approx(_loop_hinge(scores, 0.2), abs=1e-4)
    assert fine > 0


def test_gamma_zero_trains_the_fine_term_alone(tiny):
    torch.manual_seed(0)
    module = build_finelip_module(tiny.model, SETTINGS)
    terms = _terms(tiny, module, 0.0)
    assert set(terms) == {"infonce", "fine", "total"}
    assert torch.equal(terms["total"], terms["fine"])
    assert not terms["infonce"].requires_grad and terms["infonce"].item() > 0
    terms["total"].backward()
    for agg in (module.image_aggregator, module.text_aggregator):
        assert agg.mlp[1].weight.grad.abs().sum() > 0 and agg.gamma.grad.abs().sum() > 0
    assert tiny.model.visual.conv1.weight.grad.abs().sum() > 0
    assert tiny.model.token_embedding.weight.grad.abs().sum() > 0
    assert tiny.model.logit_scale.grad is None          # FineLIP mode: no global term, s is untouched


def test_gamma_adds_hn_and_leaves_the_fine_term_bit_identical(tiny):
    torch.manual_seed(0)
    module = build_finelip_module(tiny.model, SETTINGS)
    fine_alone = _terms(tiny, module, 0.0)["fine"].detach()
    terms = _terms(tiny, module, 0.5)
    assert set(terms) == {"hn", "infonce", "fine", "total"}
    assert torch.equal(terms["fine"].detach(), fine_alone)
    assert torch.equal(terms["total"], terms["fine"] + terms["hn"])
    assert terms["hn"].requires_grad and not terms["infonce"].requires_grad
    terms["total"].backward()
    assert tiny.model.logit_scale.grad is not None and tiny.model.logit_scale.grad.abs() > 0
    assert module.text_aggregator.mlp[1].weight.grad.abs().sum() > 0


def test_warmup_factor_scales_only_the_fine_term(tiny):
    torch.manual_seed(0)
    module = build_finelip_module(tiny.model, SETTINGS)
    full = _terms(tiny, module, 0.5)
    ramped = _terms(tiny, module, 0.5, warmup_factor=0.25)
    torch.testing.assert_close(ramped["fine"], 0.25 * full["fine"], rtol=1e-6, atol=0)
    assert torch.equal(ramped["hn"], full["hn"])


def test_token_term_is_rejected(tiny):
    module = build_finelip_module(tiny.model, SETTINGS)
    images, tokens = _batch(tiny)
    with pytest.raises(ValueError, match="lambda_tok"):
        finelip_loss_terms(tiny.model, module, images, tokens, {**OBJECTIVE, "lambda_tok": 1.0}, SETTINGS)


# ---- the trainer's FineLIP: released schedule and epoch-0 ramp ----------------------------------------
def test_released_lr_schedule_at_quarters_of_a_run():
    """FL @9389127 (scheduler.py:10-27, train.py:204-207, :285) at its own 4x accumulation: step 0 at the base
    rate, then f(k) of the previous micro-batch k; the cosine's period counts optimizer steps while k counts
    micro-batches, so the rate is ~0 at 1/4 and 3/4 of the run and ~base at 1/2 and at the end."""
    from hnclip.training.methods import finelip_released_lr
    steps, accum = 20000, 4                                # optimizer steps; micro-batches = 80000, W = 200
    def lr(step: int) -> float:
        return finelip_released_lr(step * accum, steps * accum, accum, 200)
    assert lr(0) == 1.0                                    # the optimizer's initial rate: no warm-up yet
    assert lr(1) == pytest.approx(4 / 200) and lr(50) == pytest.approx(200 / 200)   # k = 4n - 1 < 200
    assert lr(steps // 4) < 1e-6                           # k = 19999: cos(pi 19799/19800)
    assert lr(steps // 2) > 0.999                          # k = 39999: cos(pi 39799/19800)
    assert lr(3 * steps // 4) < 2e-3                       # k = 59999: cos(pi 59799/19800)
    assert lr(steps - 1) > 0.99
    for step in (51, 4321, 12345):                         # the formula itself
        k = step * accum - 1
        assert lr(step) == pytest.approx(0.5 * (1 + math.cos(math.pi * (k - 200) / (steps - 200))), abs=1e-12)
    # the protocol's 8x accumulation: 0 at 1/8 of the run, base again near 1/4
    assert finelip_released_lr(8 * steps // 8, 8 * steps, 8, 200) < 1e-6
    assert finelip_released_lr(8 * steps // 4, 8 * steps, 8, 200) > 0.999


class _Pairs:
    def batch(self, indices):
        raise AssertionError("not loaded here")


@pytest.mark.parametrize("epoch0_warmup", [True, False])
def test_trainer_applies_the_epoch0_ramp_only_when_set(tiny, epoch0_warmup):
    """The trainer's FineLIP method (training.methods) scales L_fine by i/N in epoch 0 exactly when
    `epoch0_warmup` is on, and never after epoch 0."""
    from hnclip.training.methods import Position, build_method
    torch.manual_seed(0)
    settings = {"margin": 0.2, "max_violation": False, "num_patches": None, "aggr_ratio": 0.4, "sparse_ratio": 0.5,
                "epoch0_warmup": epoch0_warmup, "lr_schedule": "released", "warmup_micro_steps": 200}
    method = build_method("finelip", {**OBJECTIVE, "gamma": 0.0}, settings, tiny.model, _Pairs(), {}, None)
    batch = _batch(tiny)
    with torch.no_grad():
        later = method.terms(tiny.model, batch, Position(1, 3, 8))["fine"].item()
        first = method.terms(tiny.model, batch, Position(0, 3, 8))["fine"].item()
    assert later > 0.1
    assert first == pytest.approx(3 / 8 * later if epoch0_warmup else later, rel=1e-6)


def test_trainer_schedule_setting():
    from hnclip.training.methods import build_method, finelip_released_lr
    model = create("hnclip-tiny").model
    settings = {"margin": 0.2, "max_violation": False, "num_patches": None, "aggr_ratio": 0.4, "sparse_ratio": 0.5,
                "epoch0_warmup": True, "lr_schedule": "released", "warmup_micro_steps": 3}
    released = build_method("finelip", OBJECTIVE, settings, model, _Pairs(), {}, None)
    assert released.lr_factor(7, 100, 4) == finelip_released_lr(7, 100, 4, 3)
    cosine = build_method("finelip", OBJECTIVE, {**settings, "lr_schedule": "cosine"}, model, _Pairs(), {}, None)
    assert cosine.lr_factor is None                        # the profile's schedule
    with pytest.raises(ValueError, match="lr_schedule"):
        build_method("finelip", OBJECTIVE, {**settings, "lr_schedule": "step"}, model, _Pairs(), {}, None)
