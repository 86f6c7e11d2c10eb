"""GOAL objective: bbox -> patch tokens, sentence -> token span (with and without the released quirks),
hidden-state encoders vs open_clip, and the loss terms vs an independent open_clip-hook computation."""
import math

import pytest
import torch
import torch.nn.functional as F
from open_clip.tokenizer import SimpleTokenizer

from hnclip.losses.goal import (
    GoalBatch,
    GoalSettings,
    box_to_patch_indices,
    encode_image_hidden,
    encode_text_hidden,
    goal_loss_terms,
    patch_mask,
    sentence_index,
    sentence_token_span,
    span_mask,
)
from hnclip.models.factory import create

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny shapes, one thread

def _grid(rows, cols, width):
    """Token indices (CLS = 0) of rows x cols on a grid `width` patches wide, row-major."""
    return [r * width + c + 1 for r in rows for c in cols]


def _indices(*args, **kwargs):
    return box_to_patch_indices(*args, **kwargs).tolist()


# ---- box -> patch tokens ------------------------------------------------------------------------------
# Tiny model: S = 64, p = 8 (8 x 8 grid); the released p = 16 gives a 4-wide grid.
# Image 200 x 100, crop of 100 x 50 at (50, 25).
#   image scale: x' = 50*64/200 = 16, 150*64/200 = 48; y' = 25*64/100 = 16, 75*64/100 = 48
#   crop scale:  x' = 50*64/100 = 32, 150*64/100 = 96 -> 64; y' = 25*64/50 = 32, 75*64/50 = 96 -> 64
TINY_BOX = {"x1": 50, "y1": 25, "x2": 150, "y2": 75, "width": 100, "height": 50}


@pytest.mark.parametrize("box_scale, bug, expected", [
    ("image", False, _grid(range(2, 6), range(2, 6), 8)),  # px 16..48: patches 16//8=2 .. ceil(48/8)-1=5
    ("image", True, [6, 7, 10, 11]),                        # 16//16=1 .. ceil(48/16)-1=2 on a 4-wide grid
    ("crop", False, _grid(range(4, 8), range(4, 8), 8)),   # px 32..64: 4 .. 7
    ("crop", True, [11, 12, 15, 16]),                       # 2 .. 3 on a 4-wide grid
])
def test_tiny_box_to_patch_indices(box_scale, bug, expected):
    got = _indices(TINY_BOX, (200, 100), 64, 8, patch_size_bug=bug, box_scale=box_scale)
    assert got == expected


# ViT-L/14 at 224 (16 x 16 grid; the released p = 16 gives a 14-wide grid). Image 1000 x 800, crop 284 x 300
# at (689, 0), the crop touching the top border but not the left one.
#   crop scale:  x1' = round(689*224/284 = 543.44) -> clipped to 223, x2' = round(767.44) -> 224;
#                y' = 0 .. 224  => the last column only
#   image scale: x1' = round(154.336) = 154, x2' = round(217.952) = 218; y' = 0 .. round(84.0) = 84
L14_BOX = {"x1": 689, "y1": 0, "x2": 973, "y2": 300, "width": 284, "height": 300}


@pytest.mark.parametrize("box_scale, bug, expected", [
    ("crop", False, [16 * r + 16 for r in range(16)]),      # col 223//14 = 15 = ceil(224/14)-1, rows 0..15
    ("crop", True, [14 * r + 14 for r in range(14)]),       # col 223//16 = 13, rows 0..13, 14-wide grid
    ("image", False, _grid(range(6), range(11, 16), 16)),  # cols 154//14=11 .. ceil(218/14)-1=15, rows 0..5
    ("image", True, _grid(range(6), range(9, 14), 14)),    # cols 154//16=9 .. ceil(218/16)-1=13, rows 0..5
])
def test_vit_l14_box_to_patch_indices(box_scale, bug, expected):
    got = _indices(L14_BOX, (1000, 800), 224, 14, patch_size_bug=bug, box_scale=box_scale)
    assert got == expected


# Non-square images (DOCCI is 4:3, SA-1B 2:3) as the tiny tower sees them: shortest side resized to 64, centre crop.
#   120 x 90 -> 85 x 64, 10 px cut on the left; 60 x 90 -> 64 x 96, 16 px cut on top.
@pytest.mark.parametrize("image_size, box", [
    ((120, 90), {"x1": 30, "y1": 20, "x2": 75, "y2": 50}),   # x' 11.25..43.1: cols 1..5 (image scale: 2..4)
    ((60, 90), {"x1": 10, "y1": 40, "x2": 40, "y2": 70}),    # y' 26.7..58.7: rows 3..7 (image scale: 3..6)
    ((120, 90), {"x1": 2, "y1": 50, "x2": 25, "y2": 88}),    # partly cut off by the crop: what remains
])
def test_center_crop_boxes_select_the_patches_the_tower_sees(backbone, image_size, box):
    """The corrected geometry selects exactly the patches that show the box after the tower's own preprocessing."""
    from PIL import Image, ImageDraw
    blank = Image.new("RGB", image_size, (128, 128, 128))
    painted = blank.copy()
    ImageDraw.Draw(painted).rectangle([box["x1"], box["y1"], box["x2"] - 1, box["y2"] - 1], fill=(255, 0, 0))
    changed = (backbone.preprocess(painted) - backbone.preprocess(blank)).abs().amax(dim=0)   # [64, 64]
    shown = (changed > 0.5 * changed.max()).reshape(8, 8, 8, 8).any(dim=3).any(dim=1)      # [row, col]
    expected = [r * 8 + c + 1 for r, c in shown.nonzero().tolist()]
    box = {**box, "width": box["x2"] - box["x1"], "height": box["y2"] - box["y1"]}
    assert _indices(box, image_size, 64, 8, patch_size_bug=False, box_scale="center_crop") == expected
    assert _indices(box, image_size, 64, 8, patch_size_bug=False, box_scale="image") != expected


def test_center_crop_box_cut_off_entirely_keeps_its_border_patch():
    # 120 x 90: x 0..12 maps to 0..8.5 - 10 < 0, all inside the 10 px the crop removes; y 0..20 -> rows 0..1
    box = {"x1": 0, "y1": 0, "x2": 12, "y2": 20, "width": 12, "height": 20}
    assert _indices(box, (120, 90), 64, 8, patch_size_bug=False, box_scale="center_crop") == [1, 9]


def test_patch_size_bug_reads_other_tokens_on_the_real_grid():
    """On the real 16-wide L/14 grid the buggy 14-wide indices of one column fan out over columns."""
    got = _indices(L14_BOX, (1000, 800), 224, 14, patch_size_bug=True, box_scale="crop")
    real_cols = {(i - 1) % 16 for i in got}
    assert got[:3] == [14, 28, 42] and real_cols == {13, 11, 9, 7, 5, 3, 1, 15}


def test_coordinates_round_half_to_even_like_python():
    # 17 * 64 / 128 = 8.5 -> 8 (half-to-even): ceil(8/8) - 1 = 0, one patch; half-up (9) would give 2 x 2
    box = {"x1": 0, "y1": 0, "x2": 17, "y2": 17, "width": 17, "height": 17}
    assert _indices(box, (128, 128), 64, 8, patch_size_bug=False, box_scale="image") == [1]
    # 19 * 64 / 128 = 9.5 -> 10: ceil(10/8) - 1 = 1
    box = {**box, "x2": 19, "y2": 19}
    assert _indices(box, (128, 128), 64, 8, patch_size_bug=False, box_scale="image") == [1, 2, 9, 10]


def test_degenerate_box_keeps_its_patch():
    # x' = y' = 16 .. 16: columns 2 .. 1 are empty; widened to the one patch at (2, 2)
    box = {"x1": 16, "y1": 16, "x2": 16, "y2": 16, "width": 1, "height": 1}
    assert _indices(box, (64, 64), 64, 8, patch_size_bug=False, box_scale="image") == [2 * 8 + 2 + 1]


def test_bug_indices_past_the_real_sequence_raise():
    # real p = 32 at S = 64: 4 patch tokens; the 16-px grid gives indices up to 16
    with pytest.raises(ValueError, match="exceed"):
        box_to_patch_indices(TINY_BOX, (200, 100), 64, 32, patch_size_bug=True, box_scale="crop")


def test_box_input_errors():
    with pytest.raises(ValueError):
        box_to_patch_indices(TINY_BOX, (200, 100), 64, 8, patch_size_bug=False, box_scale="other")
    with pytest.raises(ValueError):
        box_to_patch_indices({**TINY_BOX, "width": 0}, (200, 100), 64, 8, patch_size_bug=False, box_scale="crop")


def test_patch_mask_and_span_mask():
    assert patch_mask([[1, 3], torch.tensor([0])], 4).tolist() == [[False, True, False, True],
                                                                    [True, False, False, False]]
    assert span_mask(torch.tensor([[1, 2], [3, 1]]), 5).tolist() == [[False, True, True, False, False],
                                                                     [False, False, False, True, False]]


# ---- sentence -> token span ---------------------------------------------------------------------------
CAPTION = "A red dog sits.  It is big. The sky is blue."
SENTENCES = ["A red dog sits", "It is big", "The sky is blue"]


@pytest.fixture(scope="module")
def bpe():
    return SimpleTokenizer().encode


def test_tokenizer_lengths_behind_the_hand_computed_spans(bpe):
    # [BOS] a red dog sits . it is big . the sky is blue . [EOT]
    #   0   1  2   3   4   5  6  7  8  9  10  11 12  13  14  15
    assert [len(bpe(s)) for s in SENTENCES] == [4, 3, 4]
    assert [len(bpe(p)) for p in ["", "A red dog sits. ", "A red dog sits. It is big. "]] == [0, 5, 9]


@pytest.mark.parametrize("late_by_one, expected", [
    (False, [(1, 4), (6, 3), (10, 4)]),  # start = 1 (BOS) + prefix tokens
    (True, [(2, 4), (7, 3), (11, 4)]),   # start = 2 (BOS + EOS) + prefix tokens: one late
])
def test_sentence_spans(bpe, late_by_one, expected):
    assert [sentence_token_span(CAPTION, k, bpe, late_by_one=late_by_one) for k in range(3)] == expected


def test_corrected_span_holds_the_sentence_and_the_released_one_is_shifted(bpe):
    ids = [49406, *bpe(CAPTION), 49407]
    period = bpe(".")
    for k, sentence in enumerate(SENTENCES):
        start, length = sentence_token_span(CAPTION, k, bpe, late_by_one=False)
        assert ids[start:start + length] == bpe(sentence)
        start, length = sentence_token_span(CAPTION, k, bpe, late_by_one=True)
        assert ids[start:start + length] == bpe(sentence)[1:] + period


@pytest.mark.parametrize("context_length, late_by_one, expected", [
    (12, False, (10, 1)),  # end = min(10 + 4, 11) = 11
    (12, True, (1, 4)),    # end = min(11 + 4, 11) = 11 = start: empty -> tokens 1 .. 1 + 4
    (10, False, (5, 4)),   # start 10 >= 10: end = 9, start = 9 - 4
    (10, True, (5, 4)),    # start 11 >= 10: same
])
def test_truncated_spans(bpe, context_length, late_by_one, expected):
    assert sentence_token_span(CAPTION, 2, bpe, context_length, late_by_one=late_by_one) == expected


def test_sentence_index():
    assert sentence_index(CAPTION, " It   is big ") == 1
    with pytest.raises(ValueError):
        sentence_index(CAPTION, "It is small")


# ---- encoders and loss terms --------------------------------------------------------------------------
CAPTIONS = [CAPTION, "Two cats sleep on a sofa. The sofa is green.", "A man rides a bike. He wears a hat. Rain."]
PICKED = [1, 0, 2]
BOXES = [TINY_BOX, {"x1": 0, "y1": 0, "x2": 30, "y2": 40, "width": 30, "height": 40},
         {"x1": 10, "y1": 60, "x2": 180, "y2": 100, "width": 170, "height": 40}]


@pytest.fixture(scope="module")
def backbone():
    torch.manual_seed(0)
    return create("hnclip-tiny")


@pytest.fixture(scope="module")
def batch(backbone, bpe):
    gen = torch.Generator().manual_seed(1)
    sentences = [[s.strip() for s in c.split(".") if s.strip()][k] for c, k in zip(CAPTIONS, PICKED)]
    indices = [box_to_patch_indices(b, (200, 100), 64, 8, patch_size_bug=False, box_scale="image") for b in BOXES]
    spans = [sentence_token_span(c, k, bpe, late_by_one=True) for c, k in zip(CAPTIONS, PICKED)]
    return GoalBatch(images=torch.randn(3, 3, 64, 64, generator=gen), tokens=backbone.tokenizer(CAPTIONS),
                     segment_images=torch.randn(3, 3, 64, 64, generator=gen),
                     segment_tokens=backbone.tokenizer(sentences), patch_mask=patch_mask(indices, 65),
                     text_spans=torch.tensor(spans))


def _objective(gamma):
    return {"framework": "goal", "gamma": gamma, "lambda_tok": 0.0, "g_source": "live"}


def _captured(module, fn):
    """fn()'s result and the output of `module` during it (open_clip's own forward)."""
    seen = []
    handle = module.register_forward_hook(lambda _m, _i, out: seen.append(out))
    try:
        result = fn()
    finally:
        handle.remove()
    return result, seen[0]


def test_encoders_match_open_clip(backbone, batch):
    model = backbone.model
    with torch.no_grad():
        features, hidden = encode_image_hidden(model, batch.images)
        want, want_hidden = _captured(model.visual.transformer, lambda: model.encode_image(batch.images))
        assert (features - F.normalize(want, dim=-1)).abs().max() < 1e-5
        assert hidden.shape == (3, 65, 64) and torch.allclose(hidden, want_hidden, atol=1e-6)
        want, want_hidden = _captured(model.transformer, lambda: model.encode_text(batch.tokens))
        longest = int((batch.tokens != 0).sum(dim=1).max())
        for length in (248, longest):  # the full context, and cut to the longest caption
            features, hidden = encode_text_hidden(model, batch.tokens[:, :length])
            assert (features - F.normalize(want, dim=-1)).abs().max() < 1e-5
            assert torch.allclose(hidden, want_hidden[:, :length], atol=1e-5)


def _symmetric_ce(logits):
    rows = [-torch.log_softmax(logits[i], 0)[i] for i in range(len(logits))]
    cols = [-torch.log_softmax(logits[:, j], 0)[j] for j in range(len(logits))]
    return (sum(rows) + sum(cols)) / (2 * len(logits))


def _reference_terms(model, batch, gamma):
    """The four terms from open_clip's encode_* (full 248 context) and per-sample loops."""
    with torch.no_grad():
        v, h_img = _captured(model.visual.transformer, lambda: model.encode_image(batch.images))
        t, h_txt = _captured(model.transformer, lambda: model.encode_text(batch.tokens))
        v, t = F.normalize(v, dim=-1), F.normalize(t, dim=-1)
        vs = F.normalize(model.encode_image(batch.segment_images), dim=-1)
        ts = F.normalize(model.encode_text(batch.segment_tokens), dim=-1)
        scale = model.logit_scale.exp()
        margins = gamma * (t @ t.t()) * (1 - torch.eye(3))
        patch, text = 0.0, 0.0
        for b in range(3):
            idx = batch.patch_mask[b].nonzero().flatten()
            u = F.normalize(model.visual.ln_post(h_img[b, idx].mean(0)) @ model.visual.proj, dim=-1)
            patch += (u @ vs[b] - 1) ** 2 / 3
            start, length = batch.text_spans[b].tolist()
            w = F.normalize(model.ln_final(h_txt[b, start:start + length].mean(0)) @ model.text_projection, dim=-1)
            text += (w @ ts[b] - 1) ** 2 / 3
        return {"org": _symmetric_ce(scale * (v @ t.t() + margins)), "seg": _symmetric_ce(scale * vs @ ts.t()),
                "patch": patch, "text": text}


@pytest.mark.parametrize("gamma", [0.0, 0.5])
def test_terms_match_an_independent_computation(backbone, batch, gamma):
    with torch.no_grad():
        terms = goal_loss_terms(backbone.model, batch, _objective(gamma), GoalSettings())
    for name, want in _reference_terms(backbone.model, batch, gamma).items():
        assert abs(float(terms[name]) - float(want)) < 1e-5 * max(1.0, abs(float(want))), name
    assert float(terms["patch"]) > 1e-4 and float(terms["text"]) > 1e-4  # the zero-case test below can fail


def test_total_is_the_weighted_sum(backbone, batch):
    settings = GoalSettings(seg_weight=0.25, patch_weight=2.0, text_weight=3.0)
    with torch.no_grad():
        t = goal_loss_terms(backbone.model, batch, _objective(0.5), settings)
    want = float(t["org"]) + 0.25 * float(t["seg"]) + 2.0 * float(t["patch"]) + 3.0 * float(t["text"])
    assert math.isclose(float(t["total"]), want, rel_tol=1e-6)
    assert math.isclose(float(t["org"]), float(t["hn"]), rel_tol=0)  # gamma > 0: the trained term is L_HN


def test_gamma_swaps_only_the_global_term(backbone, batch):
    with torch.no_grad():
        plain = goal_loss_terms(backbone.model, batch, _objective(0.0), GoalSettings())
        boosted = goal_loss_terms(backbone.model, batch, _objective(0.5), GoalSettings())
    for name in ("seg", "patch", "text", "infonce"):
        assert torch.equal(plain[name], boosted[name]), name
    assert torch.equal(plain["org"], plain["infonce"]) and "hn" not in plain
    assert float(boosted["org"]) > float(plain["org"]) + 1e-3  # the margins only add to negatives


def test_alignment_terms_vanish_when_pooled_equals_segment(backbone, batch):
    """Segment = original and the pooled selection = its own CLS / EOT token: u == v_s and w == t_s."""
    eot = batch.tokens.argmax(dim=-1)
    same = GoalBatch(batch.images, batch.tokens, batch.images.clone(), batch.tokens.clone(),
                     patch_mask=patch_mask([[0]] * 3, 65), text_spans=torch.stack([eot, torch.ones(3).long()], 1))
    with torch.no_grad():
        terms = goal_loss_terms(backbone.model, same, _objective(0.5), GoalSettings())
    assert float(terms["patch"]) < 1e-10 and float(terms["text"]) < 1e-10


def test_gradients_reach_both_towers_and_the_scale(backbone, batch):
    model = backbone.model
    model.zero_grad(set_to_none=True)
    goal_loss_terms(model, batch, _objective(0.5), GoalSettings())["total"].backward()
    for param in (model.visual.conv1.weight, model.visual.proj, model.visual.ln_post.weight,
                  model.token_embedding.weight, model.text_projection, model.ln_final.weight, model.logit_scale):
        assert param.grad is not None and param.grad.abs().sum() > 0
    model.zero_grad(set_to_none=True)
    goal_loss_terms(model, batch, _objective(0.5), GoalSettings())["patch"].backward()
    assert model.visual.conv1.weight.grad.abs().sum() > 0  # u and v_s are both image-tower outputs
    assert model.token_embedding.weight.grad is None        # ... so the text tower gets nothing from it
    model.zero_grad(set_to_none=True)


def test_double_forward_gives_identical_terms(backbone, batch):
    with torch.no_grad():
        once = goal_loss_terms(backbone.model, batch, _objective(0.5), GoalSettings(double_forward=False))
        twice = goal_loss_terms(backbone.model, batch, _objective(0.5), GoalSettings(double_forward=True))
    assert once.keys() == twice.keys() and all(torch.equal(once[k], twice[k]) for k in once)


def test_released_costs_change_no_gradient(backbone, batch):
    """double_forward and anomaly detection are cost only: the same gradient on every parameter, which is
    why they are not part of a run's identity and only the timed run pays them (Registry.released_costs)."""
    model = backbone.model

    def gradients(double_forward: bool, anomaly: bool) -> dict[str, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        with torch.autograd.set_detect_anomaly(anomaly):
            terms = goal_loss_terms(model, batch, _objective(0.5), GoalSettings(double_forward=double_forward))
            terms["total"].backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        return grads

    plain, released = gradients(False, False), gradients(True, True)
    assert plain.keys() == released.keys() and len(plain) > 10
    for name in plain:  # equal up to the float summation order of the second graph's contributions
        error = float((released[name] - plain[name]).norm() / plain[name].norm().clamp_min(1e-12))
        assert error < 1e-5, (name, error)


def test_bf16_autocast_gives_fp32_terms_close_to_fp32(backbone, batch):
    with torch.no_grad():
        ref = goal_loss_terms(backbone.model, batch, _objective(0.5), GoalSettings())
        low = goal_loss_terms(backbone.model, batch, _objective(0.5), GoalSettings(),
                              autocast=lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    for name in ("org", "seg", "patch", "text"):
        assert low[name].dtype == torch.float32 and abs(float(low[name]) - float(ref[name])) < 0.05 * (
            1 + abs(float(ref[name]))), name


def test_rejected_inputs(backbone, batch):
    model = backbone.model
    with pytest.raises(ValueError, match="lambda_tok"):
        goal_loss_terms(model, batch, {**_objective(0.5), "lambda_tok": 1.0}, GoalSettings())
    empty = GoalBatch(batch.images, batch.tokens, batch.segment_images, batch.segment_tokens,
                      torch.zeros(3, 65, dtype=torch.bool), batch.text_spans)
    with pytest.raises(ValueError, match="selected"):
        goal_loss_terms(model, empty, _objective(0.5), GoalSettings())
    outside = GoalBatch(batch.images, batch.tokens, batch.segment_images, batch.segment_tokens,
                        batch.patch_mask, torch.tensor([[247, 2], [1, 1], [1, 1]]))
    with pytest.raises(ValueError, match="spans"):
        goal_loss_terms(model, outside, _objective(0.5), GoalSettings())


def test_settings_from_dict():
    assert GoalSettings.from_dict({"box_scale": "image", "late_by_one": False}) == GoalSettings(
        box_scale="image", late_by_one=False)
    with pytest.raises(ValueError, match="unknown"):
        GoalSettings.from_dict({"box_scal": "image"})
    with pytest.raises(ValueError):
        GoalSettings(box_scale="pixels")


BANG_CAPTIONS = ["The shop sign above the old wooden door reads 'OPEN!'. A cat naps on the step.",
                 "Two cats sleep on a sofa. The sofa is green.", "A man rides a bike. Rain."]


def test_a_caption_holding_id_0_keeps_its_eot(backbone, bpe):
    """Id 0 is both the padding id and BPE '!': a caption holding it, the batch's longest, must keep its EOT
    (trimming by the count of non-zero ids cut it off), so every term equals the full-context computation."""
    tokens = backbone.tokenizer(BANG_CAPTIONS)
    assert 0 in tokens[0, 1:int(tokens[0].argmax())].tolist()
    assert int(tokens[0].argmax()) == int(tokens.argmax(dim=-1).max())  # the longest of the batch
    gen = torch.Generator().manual_seed(2)
    sentences = [caption.split(".")[0].strip() for caption in BANG_CAPTIONS[1:]] + ["Rain"]
    bang = GoalBatch(images=torch.randn(3, 3, 64, 64, generator=gen), tokens=tokens,
                     segment_images=torch.randn(3, 3, 64, 64, generator=gen),
                     segment_tokens=backbone.tokenizer(sentences), patch_mask=patch_mask([[1, 2], [5], [9]], 65),
                     text_spans=torch.tensor([[1, 3], [1, 2], [2, 2]]))
    with torch.no_grad():
        terms = goal_loss_terms(backbone.model, bang, _objective(0.5), GoalSettings())
    for name, want in _reference_terms(backbone.model, bang, 0.5).items():
        assert abs(float(terms[name]) - float(want)) < 1e-5 * max(1.0, abs(float(want))), name


def test_goal_settings_defaults_are_the_release():
    """The defaults reproduce goal_loss_finetuning.py @2db3d4a: L = L_org + 0.5 L_seg + L_patch + L_text
    (:351) and every released quirk on; params.yaml's `frameworks.goal` states the same values."""
    assert GoalSettings() == GoalSettings(patch_size_bug=True, box_scale="crop", late_by_one=True,
                                          double_forward=True, seg_weight=0.5, patch_weight=1.0, text_weight=1.0)
    assert (GoalSettings().seg_weight, GoalSettings().patch_weight, GoalSettings().text_weight) == (0.5, 1.0, 1.0)


def test_bf16_runs_take_the_hidden_states_from_an_fp32_forward(backbone, batch):
    """As released (goal_loss_finetuning.py:250-256, :292-300, :339-348): under bf16 autocast the globals come
    from the autocast forward, the hidden states from a second forward outside it, pooled and put through
    LN + projection in fp32."""
    from hnclip.losses.goal import _text_length, pool_patches, pool_span
    model, size = backbone.model, 3

    def bf16():
        return torch.autocast("cpu", dtype=torch.bfloat16)
    images = torch.cat([batch.images, batch.segment_images])
    tokens = torch.cat([batch.tokens, batch.segment_tokens])[:, :_text_length(batch)]
    with torch.no_grad():
        terms = goal_loss_terms(model, batch, _objective(0.5), GoalSettings(double_forward=False), autocast=bf16)
        with bf16():
            v, image_hidden_bf16 = encode_image_hidden(model, images)
            t, text_hidden_bf16 = encode_text_hidden(model, tokens)
            u_bf16 = pool_patches(model, image_hidden_bf16[:size], batch.patch_mask)
            w_bf16 = pool_span(model, text_hidden_bf16[:size], batch.text_spans)
        _, image_hidden = encode_image_hidden(model, images)
        _, text_hidden = encode_text_hidden(model, tokens)
        u = pool_patches(model, image_hidden[:size], batch.patch_mask)
        w = pool_span(model, text_hidden[:size], batch.text_spans)
    assert u.dtype == w.dtype == torch.float32

    def mse(pooled, target):
        return float(((pooled.float() * target.float()).sum(-1) - 1).pow(2).mean())
    for name, pooled, pooled_bf16, target in (("patch", u, u_bf16, v[size:]), ("text", w, w_bf16, t[size:])):
        want, all_bf16 = mse(pooled, target), mse(pooled_bf16, target)
        assert abs(float(terms[name]) - want) <= 1e-6 * max(1.0, want), name
        assert abs(all_bf16 - want) > 1e-5 * max(1.0, want), name  # bf16 hidden states: another value
