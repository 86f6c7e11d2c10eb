"""StructXLIP baseline: caption filter, structure chunks, weight schedule and loss terms, against
hand-computed values."""
import math

import pytest
import torch
import torch.nn.functional as F
from open_clip.tokenizer import SimpleTokenizer

from hnclip.auxiliary.caption_filter import (
    caption_chunks,
    chunk_token_spans,
    filter_caption,
    structure_chunk_spans,
)
from hnclip.losses.structxlip import (
    DEFAULT_SETTINGS,
    StructXBatch,
    clamp_logit_scale_,
    encode_text_states,
    local_structure_loss,
    pool_chunks,
    structxlip_loss_terms,
    structxlip_weights,
)
from hnclip.models.factory import create


@pytest.fixture(scope="module")
def tokenizer():
    return SimpleTokenizer(context_length=248)


# ---------------------------------------------------------------------------------------------
# Caption filter
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("caption, expected", [
    ("A red ball sits on a wooden table.", "A ball sits on a wooden table."),
    # multi-word phrases win over their parts ("sky"/"light" alone are no colours), any whitespace run
    ("A sky blue kite flies over the NAVY\n  BLUE boat near the Light Grey dock.",
     "A kite flies over the boat near the dock."),
    ("A RED square and a Green circle lie flat.", "A square and a circle lie flat."),
    ("A reddish bluebird eats seeds.", "A reddish bluebird eats seeds."),     # word boundaries
    ("A red, blue and green kite flies.", "A, and kite flies."),             # punctuation tidied
    ("A  white   star,\nbeside a black ring .", "A star, beside a ring."),
])
def test_filter_removes_colour_phrases(caption, expected):
    assert filter_caption(caption) == expected


@pytest.mark.parametrize("caption, expected", [
    ("A red car.", "A red car."),                                  # only "car" would remain
    ("Red, blue,  and green.", "Red, blue, and green."),           # nothing left: tidied original
    ("The blue sky and sea.", "The sky and sea."),                 # "sky", "sea": two content words
])
def test_filter_keeps_original_below_two_content_words(caption, expected):
    assert filter_caption(caption) == expected


def test_filter_covers_synthetic_vocabulary():
    for colour in ("red", "orange", "yellow", "green", "blue", "purple", "white", "black"):
        assert filter_caption(f"A {colour} square sits left of the circle.") == "A square sits left of the circle."
    caption = "A striped square, a dotted ring, a checkered star and a solid circle."
    # "solid" is not in the released texture list
    assert filter_caption(caption, categories=("textures",)) == "A square, a ring, a star and a solid circle."
    assert filter_caption(caption) == caption                      # colours only by default
    assert filter_caption("A red wood box on the blue glass shelf.", ("colors", "materials")) == \
        "A box on the shelf."                                      # "wooden" is not a released material


def test_filter_uses_the_released_word_lists():
    """StructXLIP's DEFAULT_VOCAB (structxlip/text_filters.py @bd63274): its sizes, colours only it lists
    ("mint", "hot pink", "wine red") removed, colours it does not list ("coral", "golden") kept, and its
    insect lexicon applied before the colours."""
    from hnclip.auxiliary import structxlip_lexicon as lexicon
    assert [len(v) for v in (lexicon.COLORS, lexicon.MATERIALS, lexicon.TEXTURES, lexicon.INSECT_TERMS)] == \
        [56, 46, 47, 114]
    assert lexicon.SOURCE["commit"].startswith("bd63274") and len(lexicon.STOPWORDS) == 20
    assert filter_caption("A mint cup and a hot pink wine red vase stand here.") == "A cup and a vase stand here."
    assert filter_caption("A coral cup and a golden vase stand here.") == "A coral cup and a golden vase stand here."
    assert filter_caption("A felt hat on a mesh chair.", ("materials",)) == "A hat on a chair."
    assert filter_caption("A rufous beetle with dark brown wings.", ("insect",)) == "A beetle with wings."
    # "dark brown" is an insect phrase: removed whole before the colours could take "brown" alone
    assert filter_caption("A dark brown beetle sits there.", ("insect", "colors")) == "A beetle sits there."


def test_word_lists_match_the_content_of_the_released_file():
    """Each list's sha256 is that of the release's text_filters.py @bd63274 (pins in the lexicon module)."""
    from hnclip.auxiliary import structxlip_lexicon as lexicon
    lexicon.check_release()
    assert {name: lexicon.list_sha256(words) for name, words in lexicon.lists().items()} == lexicon.RELEASE_SHA256


def _release_format(lists: dict) -> str:
    """A text_filters.py laid out as the release's (STOPWORDS a set, DEFAULT_VOCAB keyword tuples)."""
    vocab = ",\n".join(f"    {name}={tuple(words)!r}" for name, words in lists.items() if name != "stopwords")
    return (f"import re\n\nSTOPWORDS = {set(lists['stopwords'])!r}\n\n\ndef f():\n    pass\n\n\n"
            f"DEFAULT_VOCAB = VisualVocabulary(\n{vocab},\n)\n")


def test_pins_are_recomputed_from_a_file_in_the_releases_layout():
    from hnclip.auxiliary import structxlip_lexicon as lexicon
    parsed = lexicon.lists_from_release(_release_format(lexicon.lists()))
    assert {name: lexicon.list_sha256(words) for name, words in parsed.items()} == lexicon.RELEASE_SHA256


@pytest.mark.parametrize("name", ["colors", "materials", "textures", "insect_terms", "stopwords"])
@pytest.mark.parametrize("change", ["misspell", "swap", "drop"])
def test_one_changed_word_fails_the_release_check(monkeypatch, name, change):
    """Same length and the same samples, one word different: the content pin catches it."""
    from hnclip.auxiliary import structxlip_lexicon as lexicon
    words = list(lexicon.lists()[name])
    k = len(words) // 2
    if change == "misspell":
        words[k] = words[k][:-1] + ("x" if words[k][-1] != "x" else "y")
    elif change == "swap":
        words[k], words[k + 1] = words[k + 1], words[k]
    else:
        words[k:k + 1] = []
    attribute = {"insect_terms": "INSECT_TERMS"}.get(name, name.upper())
    monkeypatch.setattr(lexicon, attribute, tuple(words))
    with pytest.raises(ValueError, match=rf"\['{name}'\] differ from the release's \(intelligolabs/StructXLIP@bd63274"):
        lexicon.check_release()
    with pytest.raises(ValueError, match=name):
        lexicon.check_release({**lexicon.lists(), name: words})


def test_filter_rejects_unknown_category():
    with pytest.raises(ValueError, match="insects"):
        filter_caption("A red ball.", categories=("insects",))


# ---------------------------------------------------------------------------------------------
# Chunks and token spans
# ---------------------------------------------------------------------------------------------

def test_chunk_windows_inside_clauses():
    text = "The circle sits left of the big square, and a small star shines... Done!"
    chunks = [text[a:b] for a, b in caption_chunks(text)]
    # clause 1: 8 words -> window 3 (6 chunks); clause 2: 5 words -> window 3; "Done": 1 word < 2
    assert chunks == ["The circle sits", "circle sits left", "sits left of", "left of the", "of the big",
                      "the big square", "and a small", "a small star", "small star shines"]


@pytest.mark.parametrize("n_words, window", [(2, 2), (4, 2), (5, 3), (10, 3), (11, 4), (20, 4), (21, 5),
                                             (40, 5), (41, 6)])
def test_chunk_window_by_clause_length(n_words, window):
    text = " ".join(f"w{i}" for i in range(n_words)) + "."
    chunks = caption_chunks(text)
    assert len(chunks) == n_words - window + 1
    assert text[slice(*chunks[0])] == " ".join(f"w{i}" for i in range(window))


def test_chunks_capped_at_64():
    text = " ".join(f"w{i}" for i in range(100))                   # window 6 -> 95 chunks
    chunks = caption_chunks(text)
    assert len(chunks) == 64 and text[slice(*chunks[-1])] == "w63 w64 w65 w66 w67 w68"


def test_token_spans_of_multi_token_words(tokenizer):
    # tokens: BOS the chec ker board tile , it 's shiny . -> positions 0..10
    text = "The checkerboard tile, it's shiny."
    chunks = caption_chunks(text)
    assert [text[a:b] for a, b in chunks] == ["The checkerboard", "checkerboard tile", "it's", "s shiny"]
    assert chunk_token_spans(chunks, text, tokenizer) == [(1, 5), (2, 6), (7, 9), (8, 10)]
    # non-ASCII: BOS na Ã¯ ve art -> "naïve art" covers positions 1..4
    assert chunk_token_spans([(0, 9)], "naïve art", tokenizer) == [(1, 5)]


def test_token_spans_past_context_dropped(tokenizer):
    text = "A ball sits on a wooden table."
    spans = chunk_token_spans(caption_chunks(text), text, tokenizer, context_length=6)
    assert spans == [(1, 4), (2, 5), (3, 6)]                       # (4, 7) and (5, 8) end past 6


def test_unfiltered_token_quirk(tokenizer):
    caption = "A red ball sits on a wooden table."
    filtered = filter_caption(caption)
    spans = structure_chunk_spans(filtered, tokenizer)
    # filtered tokens: BOS a ball sits on a wooden table . EOT
    assert spans == [(1, 4), (2, 5), (3, 6), (4, 7), (5, 8)]
    filtered_ids, caption_ids = tokenizer([filtered, caption])
    words = [tokenizer.decode(filtered_ids[a:b].tolist()).split() for a, b in spans]
    shifted = [tokenizer.decode(caption_ids[a:b].tolist()).split() for a, b in spans]
    assert words == [["a", "ball", "sits"], ["ball", "sits", "on"], ["sits", "on", "a"], ["on", "a", "wooden"],
                     ["a", "wooden", "table"]]
    # the released setting reads the same positions in the unfiltered caption: shifted by "red"
    assert shifted == [["a", "red", "ball"], ["red", "ball", "sits"], ["ball", "sits", "on"],
                       ["sits", "on", "a"], ["on", "a", "wooden"]]


# ---------------------------------------------------------------------------------------------
# Weights and logit scale
# ---------------------------------------------------------------------------------------------

SPEC_FACTORS = {  # baselines.md §2.2, "Values e=0..9"
    "sc": (1, 1, .985, .944, .883, .817, .757, .715, .7, .7),
    "rs": (1, 1, .975, .906, .806, .694, .594, .525, .5, .5),
    "lsc": (1, 1, .970, .887, .767, .633, .513, .430, .4, .4),
}
BASE = {"sc": 0.25, "rs": 0.001, "lsc": 0.001}


@pytest.mark.parametrize("epoch", range(10))
def test_weight_schedule_matches_spec_table(epoch):
    weights = structxlip_weights(epoch)
    for name, factors in SPEC_FACTORS.items():
        # the table's last digit is rounded from 4 places (e=6: .75648 printed as .757)
        assert weights[name] / BASE[name] == pytest.approx(factors[epoch], abs=1e-3)


def test_weight_schedule_stays_at_floor():
    assert structxlip_weights(25) == pytest.approx({"sc": 0.25 * 0.7, "rs": 0.001 * 0.5, "lsc": 0.001 * 0.4})


def test_clamp_logit_scale():
    model = torch.nn.Module()
    for value, expected in ((4.2, 3.5), (-0.3, 0.0), (2.0, 2.0)):
        model.logit_scale = torch.nn.Parameter(torch.tensor(value))
        clamp_logit_scale_(model)
        assert model.logit_scale.item() == pytest.approx(expected)


# ---------------------------------------------------------------------------------------------
# L_LSC pieces
# ---------------------------------------------------------------------------------------------

def test_pool_chunks_softmax_of_token_norms():
    hidden = torch.tensor([[[0.0, 0.0], [3.0, 4.0], [0.0, 1.0], [6.0, 8.0]]])
    pooled, mask = pool_chunks(hidden, [[(1, 3), (3, 4)]])
    a0, a1 = math.exp(5) / (math.exp(5) + math.exp(1)), math.exp(1) / (math.exp(5) + math.exp(1))
    assert torch.allclose(pooled[0, 0], torch.tensor([3 * a0, 4 * a0 + a1]))
    assert torch.allclose(pooled[0, 1], torch.tensor([6.0, 8.0]))
    assert mask.tolist() == [[True, True]]
    pooled, mask = pool_chunks(hidden.repeat(2, 1, 1), [[(1, 2)], []])   # second sample: no chunk
    assert mask.tolist() == [[True], [False]] and pooled[1].abs().sum() == 0


def test_local_structure_loss_by_hand():
    z = torch.tensor([[[1.0, 0.0]], [[0.6, 0.8]]], dtype=torch.float64)       # one chunk per image
    crops = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]], dtype=torch.float64)   # one crop per image
    valid = torch.tensor([[True], [True]])
    # image 0: log(e^10 + e^0) - 10; image 1: log(e^6 + e^8) - 8
    expected = (math.log(1 + math.exp(-10)) + math.log(1 + math.exp(-2))) / 2
    loss = local_structure_loss(z, torch.ones(2, 1, dtype=torch.bool), crops, valid, 10.0)
    assert loss.item() == pytest.approx(expected, rel=1e-6)


def test_local_structure_loss_masks():
    # image 0: two chunks, crops (valid, invalid); image 1: one chunk, two valid crops; image 2: no chunk
    z = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[0.6, 0.8], [0.0, 0.0]], [[1.0, 0.0], [0.0, 0.0]]],
                     dtype=torch.float64)
    chunk_mask = torch.tensor([[True, True], [True, False], [False, False]])
    crops = torch.tensor([[[1.0, 0.0], [5.0, 5.0]], [[0.0, 1.0], [0.8, 0.6]], [[-1.0, 0.0], [0.0, -1.0]]],
                         dtype=torch.float64)
    valid = torch.tensor([[True, False], [True, True], [True, False]])
    s = 2.0
    # valid crops: (1,0), (0,1), (.8,.6), (-1,0); positives: image 0 -> first, image 1 -> second and third
    def lse(*xs):
        return math.log(sum(math.exp(s * x) for x in xs))
    chunk00 = lse(1, 0, .8, -1) - lse(1)
    chunk01 = lse(0, 1, .6, 0) - lse(0)
    chunk10 = lse(.6, .8, .96, -.6) - lse(.8, .96)
    expected = ((chunk00 + chunk01) / 2 + chunk10) / 2
    assert local_structure_loss(z, chunk_mask, crops, valid, s).item() == pytest.approx(expected, rel=1e-6)
    no_crops = torch.zeros(3, 2, dtype=torch.bool)
    assert local_structure_loss(z, chunk_mask, crops, no_crops, s).item() == 0.0


# ---------------------------------------------------------------------------------------------
# Loss terms on the tiny open_clip model
# ---------------------------------------------------------------------------------------------

CAPTIONS = ["A red circle sits left of the large blue square.",
            "The green star is above a small dotted ring, near the white cross.",
            "A striped triangle and a diamond share the bottom row."]


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    backbone = create("hnclip-tiny")
    backbone.model.eval()
    with torch.no_grad():   # a non-identity final LN, so applying it twice (L_LSC) is observable
        backbone.model.ln_final.weight.normal_(1.0, 0.3)
        backbone.model.ln_final.bias.normal_(0.0, 0.3)
    return backbone


def make_batch(tokenizer, has_edge=(True, True, False), crop_valid=((True, False), (True, True), (False, False))):
    generator = torch.Generator().manual_seed(1)
    filtered = [filter_caption(c) for c in CAPTIONS]
    n, k = len(CAPTIONS), len(crop_valid[0])
    return StructXBatch(
        images=torch.randn(n, 3, 64, 64, generator=generator), tokens=tokenizer(CAPTIONS),
        filtered_tokens=tokenizer(filtered), edge_images=torch.randn(n, 3, 64, 64, generator=generator),
        has_edge=torch.tensor(has_edge), edge_crops=torch.randn(n, k, 3, 64, 64, generator=generator),
        crop_valid=torch.tensor(crop_valid), chunk_spans=[structure_chunk_spans(f, tokenizer) for f in filtered])


def objective(gamma):
    return {"framework": "structxlip", "gamma": gamma, "lambda_tok": 0.0, "g_source": "live"}


def test_text_states_match_open_clip(tiny, tokenizer):
    tokens = tokenizer(CAPTIONS)
    pooled, hidden = encode_text_states(tiny.model, tokens, min_length=40)
    assert hidden.shape[1] == 40
    expected = tiny.model.encode_text(tokens, normalize=True)
    assert torch.allclose(F.normalize(pooled, dim=-1), expected, atol=1e-5)


def test_text_states_keep_the_eot_of_a_caption_holding_id_0(tiny, tokenizer):
    """Id 0 is both the padding id and BPE '!': the batch's longest caption holds it, and its global feature
    must still be read at its EOT (trimming by the count of non-zero ids cut the EOT off)."""
    captions = ["The shop sign above the old wooden door reads 'OPEN!'. A cat naps on the step.", CAPTIONS[2]]
    tokens = tokenizer(captions)
    assert 0 in tokens[0, 1:int(tokens[0].argmax())].tolist() and int(tokens[0].argmax()) > int(tokens[1].argmax())
    with torch.no_grad():
        pooled, hidden = encode_text_states(tiny.model, tokens)
        expected = tiny.model.encode_text(tokens, normalize=True)
    assert hidden.shape[1] == int(tokens[0].argmax()) + 1
    assert torch.allclose(F.normalize(pooled, dim=-1), expected, atol=1e-5)


def test_gamma_changes_only_the_global_term(tiny, tokenizer):
    batch = make_batch(tokenizer)
    with torch.no_grad():
        plain = structxlip_loss_terms(tiny.model, batch, objective(0.0), DEFAULT_SETTINGS, epoch=3)
        boosted = structxlip_loss_terms(tiny.model, batch, objective(0.5), DEFAULT_SETTINGS, epoch=3)
    for name in ("sc", "rs", "lsc", "infonce"):
        assert torch.equal(plain[name], boosted[name])
    assert torch.equal(plain["g"], plain["infonce"]) and torch.equal(boosted["g"], boosted["hn"])
    assert not torch.allclose(plain["g"], boosted["g"])
    # epoch 3 factors from the spec formula: .94352, .90587, .88705 (table: .944, .906, .887)
    expected = boosted["g"] + 0.25 * 0.94352 * boosted["sc"] + 0.001 * 0.90587 * boosted["rs"] \
        + 0.001 * 0.88704 * boosted["lsc"]
    assert boosted["total"].item() == pytest.approx(expected.item(), rel=1e-5)


def test_edge_terms_by_hand(tiny, tokenizer):
    batch = make_batch(tokenizer)
    model = tiny.model
    terms = structxlip_loss_terms(model, batch, objective(0.0), DEFAULT_SETTINGS, epoch=0)
    with torch.no_grad():
        v = model.encode_image(batch.images[:2], normalize=True)
        ve = model.encode_image(batch.edge_images[:2], normalize=True)
        tf = model.encode_text(batch.filtered_tokens[:2], normalize=True)
        logits = model.logit_scale.exp() * ve @ tf.t()
    ce = sum(-torch.log_softmax(logits, 1)[i, i] - torch.log_softmax(logits, 0)[i, i] for i in range(2)) / 4
    rs = sum(1 - F.cosine_similarity(v[i], ve[i], dim=0) for i in range(2)) / 2
    assert terms["sc"].item() == pytest.approx(ce.item(), rel=1e-5)
    assert terms["rs"].item() == pytest.approx(rs.item(), rel=1e-4, abs=1e-6)
    terms["sc"].backward()
    assert model.logit_scale.grad is None or model.logit_scale.grad.item() == 0.0   # scale detached in L_SC
    model.zero_grad(set_to_none=True)


@pytest.mark.parametrize("chunk_tokens", ["unfiltered", "filtered"])
def test_lsc_term_matches_loop_reference(tiny, tokenizer, chunk_tokens):
    batch = make_batch(tokenizer)
    model = tiny.model
    settings = {**DEFAULT_SETTINGS, "chunk_tokens": chunk_tokens}
    with torch.no_grad():
        lsc = structxlip_loss_terms(model, batch, objective(0.0), settings, epoch=0)["lsc"]
        captured = []
        hook = model.ln_final.register_forward_hook(lambda module, args, out: captured.append(out))
        model.encode_text(batch.tokens if chunk_tokens == "unfiltered" else batch.filtered_tokens)
        hook.remove()
        hidden = captured[0]                                        # full 248 positions, post final LN
        crops = model.encode_image(batch.edge_crops.flatten(0, 1))
        crops = (crops + 1e-8) / (crops + 1e-8).norm(dim=-1, keepdim=True)
        sigma = min(model.logit_scale.exp().item() / 0.07, 100.0)
        per_sample = []
        for b in range(2):                                          # image 2 has no valid crop
            valid = [m for m in range(6) if batch.crop_valid.view(-1)[m]]
            own = [m for m in valid if m // 2 == b]
            losses = []
            for start, end in batch.chunk_spans[b]:
                h = hidden[b, start:end]
                alpha = torch.softmax(h.norm(dim=-1), dim=0)
                z = model.ln_final((alpha[:, None] * h).sum(0)) @ model.text_projection
                z = (z + 1e-8) / (z + 1e-8).norm()
                sims = [sigma * float(z @ crops[m]) for m in range(6)]
                losses.append(math.log(sum(math.exp(sims[m]) for m in valid))
                              - math.log(sum(math.exp(sims[m]) for m in own)))
            per_sample.append(sum(losses) / len(losses))
    assert batch.chunk_spans[0] and batch.chunk_spans[1]
    assert lsc.item() == pytest.approx(sum(per_sample) / 2, rel=1e-4)


def test_bf16_runs_pool_and_project_chunks_in_fp32(tiny, tokenizer):
    """As released (losses.py:171-187, called outside Fabric's autocast): under bf16 autocast the forward runs
    in bf16, the chunk pooling, its final LN and projection in fp32."""
    from hnclip.losses.structxlip import _unit
    batch, model, n = make_batch(tokenizer), tiny.model, len(CAPTIONS)

    def bf16():
        return torch.autocast("cpu", dtype=torch.bfloat16)
    span_end = max(end for sample in batch.chunk_spans for _, end in sample)
    with torch.no_grad():
        lsc = structxlip_loss_terms(model, batch, objective(0.0), DEFAULT_SETTINGS, 0, autocast=bf16)["lsc"]
        with bf16():
            crops = model.visual(batch.edge_crops.flatten(0, 1))
            _, hidden = encode_text_states(model, torch.cat([batch.tokens, batch.filtered_tokens]), span_end)
            pooled_bf16, _ = pool_chunks(hidden[:n], batch.chunk_spans)
            chunks_bf16 = model.ln_final(pooled_bf16) @ model.text_projection
        pooled, mask = pool_chunks(hidden[:n].float(), batch.chunk_spans)
        chunks = model.ln_final(pooled) @ model.text_projection
        sigma = min(model.logit_scale.exp().item() / 0.07, 100.0)
        crops = _unit(crops.float()).view(n, 2, -1)
        want = local_structure_loss(_unit(chunks), mask, crops, batch.crop_valid, sigma)
        all_bf16 = local_structure_loss(_unit(chunks_bf16.float()), mask, crops, batch.crop_valid, sigma)
    assert chunks.dtype == torch.float32
    assert lsc.item() == pytest.approx(want.item(), rel=1e-6)
    assert abs(all_bf16.item() - want.item()) > 1e-5 * want.item()   # bf16 chunk heads: another value


def test_chunk_token_setting_changes_lsc(tiny, tokenizer):
    batch = make_batch(tokenizer)
    with torch.no_grad():
        values = [structxlip_loss_terms(tiny.model, batch, objective(0.0), {**DEFAULT_SETTINGS, "chunk_tokens": s},
                                        epoch=0)["lsc"] for s in ("unfiltered", "filtered")]
    assert not torch.allclose(*values)
    with pytest.raises(ValueError, match="chunk_tokens"):
        structxlip_loss_terms(tiny.model, batch, objective(0.0), {**DEFAULT_SETTINGS, "chunk_tokens": "both"}, 0)


def test_terms_without_edges_are_zero(tiny, tokenizer):
    batch = make_batch(tokenizer, has_edge=(False,) * 3, crop_valid=((False, False),) * 3)
    with torch.no_grad():
        terms = structxlip_loss_terms(tiny.model, batch, objective(0.5), DEFAULT_SETTINGS, epoch=0)
    assert terms["sc"].item() == terms["rs"].item() == terms["lsc"].item() == 0.0
    assert torch.equal(terms["total"], terms["g"])


def test_gradients_reach_both_towers(tiny, tokenizer):
    model = tiny.model
    model.zero_grad(set_to_none=True)
    with torch.no_grad():   # below 1.95 so sigma = e^s / 0.07 < 100 and L_LSC also reaches s
        model.logit_scale.fill_(1.5)
    try:
        batch = make_batch(tokenizer)
        structxlip_loss_terms(model, batch, objective(0.5), DEFAULT_SETTINGS, epoch=0)["lsc"].backward()
        for name in ("visual.conv1.weight", "token_embedding.weight", "ln_final.weight", "text_projection",
                     "logit_scale"):
            grad = dict(model.named_parameters())[name].grad
            assert grad is not None and grad.abs().sum() > 0, name
        model.zero_grad(set_to_none=True)
        structxlip_loss_terms(model, batch, objective(0.5), DEFAULT_SETTINGS, epoch=0)["total"].backward()
        for name, param in (("visual.conv1.weight", model.visual.conv1.weight),
                            ("token_embedding.weight", model.token_embedding.weight)):
            assert param.grad is not None and param.grad.abs().sum() > 0, name
    finally:
        model.zero_grad(set_to_none=True)
        with torch.no_grad():
            model.logit_scale.fill_(math.log(1 / 0.07))


def test_batch_to_moves_every_tensor(tokenizer):
    batch = make_batch(tokenizer)
    moved = batch.to("meta")
    assert all(getattr(moved, name).device.type == "meta" for name in
               ("images", "tokens", "filtered_tokens", "edge_images", "has_edge", "edge_crops", "crop_valid"))
    assert moved.chunk_spans == batch.chunk_spans and batch.images.device.type == "cpu"
