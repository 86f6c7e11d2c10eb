"""`hnclip.models.towers.encode_text` re-implements open_clip's `CLIP.encode_text` (it trims the batch to
its longest caption and also returns token features): its pooled, normalised features must equal
open_clip's on the full 248-token input, on the tiny model and on a small random model of Long-CLIP-L's
layout (QuickGELU, OpenAI head width, 248-row context), for captions of every length up to truncation."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from open_clip.tokenizer import SimpleTokenizer

from hnclip.config.constants import CONTEXT_LENGTH, PAD_ID
from hnclip.models.factory import create
from hnclip.models.longclip import OpenAIArchitecture, build_clip
from hnclip.models.towers import encode_text

TOL = 1e-5
WORDS = ("red", "square", "left", "of", "a", "blue", "striped", "circle", "above", "small", "green", "triangle")
EXCLAMATION_ID = 0  # BPE "!" (as in "!(") has id 0, the padding id: a caption may contain it before its end token


def caption(n_words: int) -> str:
    return " ".join(WORDS[i % len(WORDS)] for i in range(n_words))


CAPTIONS = ["a", "a red square !(left) and a blue circle", caption(12), caption(60), caption(200), caption(400)]


def salient_positions(model: torch.nn.Module) -> torch.nn.Module:
    """Random initialisation keeps position embeddings (std 0.01) and attention nearly inert; larger
    ones make every position, and what each may attend to, change the features."""
    torch.manual_seed(1)
    with torch.no_grad():
        model.positional_embedding.normal_(std=0.5)
    return model.eval()


def vit_l_like() -> torch.nn.Module:
    """Long-CLIP-L's layout (ViT-L/14 with QuickGELU and head width 64, 248-token text), scaled down in
    width and depth, with random weights."""
    architecture = OpenAIArchitecture(
        embed_dim=96, image_size=28, patch_size=14, vision_width=128, vision_layers=2, vision_heads=2,
        vision_mlp_ratio=4.0, context_length=CONTEXT_LENGTH, vocab_size=49408, text_width=128, text_layers=3,
        text_heads=2, text_mlp_ratio=4.0)
    torch.manual_seed(0)
    return build_clip(architecture, quick_gelu=True)


MODELS = {"hnclip-tiny": lambda: create("hnclip-tiny").model, "vit-l-like": vit_l_like}


@pytest.fixture(scope="module", params=list(MODELS))
def model(request):
    return salient_positions(MODELS[request.param]())


@pytest.fixture(scope="module")
def tokens() -> torch.Tensor:
    return SimpleTokenizer(context_length=CONTEXT_LENGTH)(CAPTIONS)


def test_the_captions_cover_every_length_case(tokens):
    lengths = (tokens != PAD_ID).sum(-1)
    assert lengths.min() == 3 and lengths.max() == CONTEXT_LENGTH  # one word ... truncated at 248
    assert tokens[1, 4] == EXCLAMATION_ID and tokens[1].argmax() > 4


@torch.no_grad()
def test_pooled_features_equal_open_clip_encode_text(model, tokens):
    reference = F.normalize(model.encode_text(tokens), dim=-1)
    torch.testing.assert_close(encode_text(model, tokens), reference, atol=TOL, rtol=0)
    pooled, token_features, padding = encode_text(model, tokens, with_tokens=True)
    torch.testing.assert_close(pooled, reference, atol=TOL, rtol=0)
    assert token_features.shape == (len(CAPTIONS), CONTEXT_LENGTH, model.text_projection.shape[1])
    assert torch.equal(padding, tokens == PAD_ID)


@torch.no_grad()
def test_short_batches_are_trimmed_and_still_match(model, tokens):
    short = tokens[:3]  # the longest caption here has 14 tokens: the transformer runs on 14 positions
    _, token_features, padding = encode_text(model, short, with_tokens=True)
    assert token_features.shape[1] == padding.shape[1] == int(short.argmax(-1).max()) + 1 < 20
    torch.testing.assert_close(encode_text(model, short), F.normalize(model.encode_text(short), dim=-1),
                               atol=TOL, rtol=0)
    alone = torch.cat([encode_text(model, short[i:i + 1]) for i in range(3)])  # each trimmed to its own length
    torch.testing.assert_close(alone, encode_text(model, short), atol=TOL, rtol=0)


def test_training_forward_uses_the_causal_flag_and_equals_the_masked_one(model, tokens, monkeypatch):
    """With gradients on (where nn.MultiheadAttention takes no fast path), the text tower hands SDPA
    is_causal=True and no mask; features and every parameter's gradient equal those of open_clip's own
    float-mask forward (`model.encode_text`) within fp32 tolerance, for captions of every length."""
    model.train()
    try:
        calls = []
        sdpa = F.scaled_dot_product_attention

        def spy(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):
            calls.append((attn_mask, is_causal))
            return sdpa(query, key, value, attn_mask, dropout_p, is_causal, **kwargs)

        monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
        pooled, token_features, _ = encode_text(model, tokens, with_tokens=True)
        causal_calls = list(calls)
        weights = torch.linspace(-1, 1, token_features.shape[-1])
        grads = torch.autograd.grad(pooled.sum() + (token_features * weights).mean(),
                                    list(model.transformer.parameters()))
        calls.clear()
        reference = F.normalize(model.encode_text(tokens), dim=-1)
        assert calls and all(mask is not None and not causal for mask, causal in calls)  # today's path: a float mask
        assert len(causal_calls) == len(model.transformer.resblocks)
        assert all(mask is None and causal for mask, causal in causal_calls)
        torch.testing.assert_close(pooled, reference, atol=TOL, rtol=0)
        # today's token features: the transformer with the float mask on the trimmed input
        length = token_features.shape[1]
        x = model.token_embedding(tokens[:, :length]) + model.positional_embedding[:length]
        hidden = model.transformer(x, attn_mask=model.attn_mask[:length, :length])
        masked = model.ln_final(hidden) @ model.text_projection
        torch.testing.assert_close(token_features, masked, atol=TOL, rtol=0)
        reference_pooled = F.normalize(masked[torch.arange(len(tokens)), tokens.argmax(-1)], dim=-1)
        reference_grads = torch.autograd.grad(reference_pooled.sum() + (masked * weights).mean(),
                                              list(model.transformer.parameters()))
        for grad, reference_grad in zip(grads, reference_grads, strict=True):
            torch.testing.assert_close(grad, reference_grad, atol=1e-4, rtol=1e-4)
    finally:
        model.eval()


def test_custom_blocks_keep_the_float_mask():
    """Adapter runs rebuild the towers with open_clip's custom blocks, whose attention takes no causal
    flag: they run with the float mask, and `uses_causal_flag` says so."""
    from hnclip.models.towers import uses_causal_flag
    custom = build_clip(OpenAIArchitecture(
        embed_dim=16, image_size=28, patch_size=14, vision_width=32, vision_layers=1, vision_heads=2,
        vision_mlp_ratio=4.0, context_length=CONTEXT_LENGTH, vocab_size=49408, text_width=32, text_layers=1,
        text_heads=2, text_mlp_ratio=4.0), quick_gelu=True, block_type="custom")
    assert not uses_causal_flag(custom.transformer)
    assert uses_causal_flag(vit_l_like().transformer)


def test_compiled_towers_keep_their_state_dict_and_outputs(tokens):
    """`compile_towers` (execution.compile) compiles in place: the same state-dict keys, the same text
    features (traced here with torch.compile's eager backend, text only to keep the test short; the inductor
    backend on both towers is measured by benchmarks/gpu_check.sh)."""
    from hnclip.models.towers import COMPILED_BLOCK, compile_towers
    model = salient_positions(create("hnclip-tiny").model).train()
    keys = list(model.state_dict())
    expected = encode_text(model, tokens[:3])
    compile_towers(model, backend="eager")
    assert list(model.state_dict()) == keys and hasattr(model, COMPILED_BLOCK)
    assert hasattr(model.visual, "_compiled_call_impl")  # nn.Module.compile's in-place wrapper
    torch.testing.assert_close(encode_text(model, tokens[:3]), expected, atol=TOL, rtol=0)
