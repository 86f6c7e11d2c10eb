"""FILIP token-level loss L_tok: chunked == naive reference, padding inertness, hand-worked example."""
import math

import pytest
import torch

from hnclip.losses.token import (
    TokenAlignmentLoss,
    _token_alignment_loss_naive,
    late_interaction_similarities,
    token_alignment_loss,
)

B, P, T, D = 7, 5, 9, 8
CAPTION_LENGTHS = [9, 1, 3, 9, 2, 6, 1]  # several captions much shorter than T


def _padding_mask(lengths, max_len):
    return torch.arange(max_len)[None, :] >= torch.tensor(lengths)[:, None]


def _batch(dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    image_tokens = torch.randn(B, P, D, generator=gen, dtype=dtype) * 3
    text_tokens = torch.randn(B, T, D, generator=gen, dtype=dtype) * 3
    return image_tokens, text_tokens, _padding_mask(CAPTION_LENGTHS, T)


def _loss_and_grads(loss_fn, image_tokens, text_tokens, *args, **kwargs):
    image_tokens = image_tokens.clone().requires_grad_(True)
    text_tokens = text_tokens.clone().requires_grad_(True)
    loss = loss_fn(image_tokens, text_tokens, *args, **kwargs)
    loss.backward()
    return loss.detach(), image_tokens.grad, text_tokens.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("chunk_size", [None, 1, 2, 3, 4, 7, 100])
def test_chunked_matches_naive_in_value_and_gradients(dtype, chunk_size):
    image_tokens, text_tokens, padding = _batch(dtype)
    scale = 20.0
    ref_loss, ref_img_grad, ref_txt_grad = _loss_and_grads(
        _token_alignment_loss_naive, image_tokens, text_tokens, padding, scale)
    loss, img_grad, txt_grad = _loss_and_grads(
        token_alignment_loss, image_tokens, text_tokens, padding, scale, chunk_size=chunk_size)
    tol = dict(rtol=0, atol=1e-6) if dtype == torch.float32 else dict(rtol=0, atol=1e-12)
    torch.testing.assert_close(loss, ref_loss, **tol)
    torch.testing.assert_close(img_grad, ref_img_grad, **tol)
    torch.testing.assert_close(txt_grad, ref_txt_grad, **tol)
    assert loss.dtype == dtype


def test_logit_scale_gradient_matches_naive():
    image_tokens, text_tokens, padding = _batch()
    grads = []
    for fn, kwargs in [(_token_alignment_loss_naive, {}), (token_alignment_loss, {"chunk_size": 3})]:
        log_scale = torch.tensor(math.log(10.0), requires_grad=True)
        fn(image_tokens, text_tokens, padding, log_scale.exp(), **kwargs).backward()
        grads.append(log_scale.grad)
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=1e-6)


@pytest.mark.parametrize("chunk_size", [None, 3])
@pytest.mark.parametrize("garbage", [1e4, float("inf"), float("nan")])
def test_padding_positions_never_affect_the_loss(chunk_size, garbage):
    image_tokens, text_tokens, padding = _batch()
    loss, img_grad, txt_grad = _loss_and_grads(
        token_alignment_loss, image_tokens, text_tokens, padding, 10.0, chunk_size=chunk_size)

    scrambled = text_tokens.clone()
    scrambled[padding] = garbage
    loss2, img_grad2, txt_grad2 = _loss_and_grads(
        token_alignment_loss, image_tokens, scrambled, padding, 10.0, chunk_size=chunk_size)

    assert torch.equal(loss2, loss)
    assert torch.equal(img_grad2, img_grad)
    assert torch.equal(txt_grad2, txt_grad)
    assert torch.count_nonzero(txt_grad2[padding]) == 0
    assert torch.count_nonzero(txt_grad2[~padding]) > 0


def _hand_example():
    """B=2 pairs, P=2 patches, T=2 tokens, D=2; caption 1 has one real token plus padding."""
    image_tokens = torch.tensor([
        [[1.0, 0.0], [0.0, 1.0]],   # image 0: patches e1, e2
        [[2.0, 0.0], [5.0, 0.0]],   # image 1: both patches along e1 (unnormalized on purpose)
    ])
    text_tokens = torch.tensor([
        [[3.0, 0.0], [1.0, 0.0]],   # caption 0: both words along e1
        [[1.0, 1.0], [7.0, 0.0]],   # caption 1: one word at 45 deg; the padded slot would match e1
    ])
    padding = torch.tensor([[False, False], [False, True]])
    return image_tokens, text_tokens, padding


def test_hand_computed_similarities():
    c = 1 / math.sqrt(2)
    # sim_i2t = mean over patches of best word; sim_t2i = mean over words of best patch.
    # (0,0): patch e1 -> 1, patch e2 -> 0         => 0.5 ; words e1,e1 each best 1 => 1
    # (0,1): both patches see the 45-deg word: c  => c   ; single word best c      => c
    # (1,0): everything along e1                  => 1   ;                         => 1
    # (1,1): both patches along e1 vs 45 deg      => c   ;                         => c
    expected_i2t = torch.tensor([[0.5, c], [1.0, c]])
    expected_t2i = torch.tensor([[1.0, c], [1.0, c]])
    for chunk_size in (None, 1):
        sim_i2t, sim_t2i = late_interaction_similarities(*_hand_example(), chunk_size=chunk_size)
        torch.testing.assert_close(sim_i2t, expected_i2t)
        torch.testing.assert_close(sim_t2i, expected_t2i)


def test_hand_computed_loss():
    s, c = 2.0, 1 / math.sqrt(2)
    # Image->text rows of s*sim_i2t: [0.5s, cs] (target 0), [s, cs] (target 1).
    i2t = (math.log(1 + math.exp(s * (c - 0.5))) + math.log(1 + math.exp(s * (1 - c)))) / 2
    # Text->image rows of s*sim_t2i^T: [s, s] (target 0), [cs, cs] (target 1): both log 2.
    t2i = math.log(2)
    expected = (i2t + t2i) / 2
    for chunk_size in (None, 1):
        loss = token_alignment_loss(*_hand_example(), logit_scale=s, chunk_size=chunk_size)
        assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert _token_alignment_loss_naive(*_hand_example(), s).item() == pytest.approx(expected, abs=1e-6)


def test_module_follows_cliploss_contract():
    image_tokens, text_tokens, padding = _batch()
    module = TokenAlignmentLoss(chunk_size=2)
    loss = module(image_tokens, text_tokens, padding, 5.0)
    out = module(image_tokens, text_tokens, padding, 5.0, output_dict=True)
    assert set(out) == {"token_loss"}
    assert torch.equal(out["token_loss"], loss)
    torch.testing.assert_close(loss, token_alignment_loss(image_tokens, text_tokens, padding, 5.0))


def test_no_grad_path_and_half_precision_logits():
    image_tokens, text_tokens, padding = _batch()
    with torch.no_grad():
        loss = token_alignment_loss(image_tokens, text_tokens, padding, 5.0, chunk_size=2)
    torch.testing.assert_close(loss, _token_alignment_loss_naive(image_tokens, text_tokens, padding, 5.0))
    bf16 = token_alignment_loss(image_tokens.bfloat16(), text_tokens.bfloat16(), padding, 5.0)
    assert bf16.dtype == torch.float32
    torch.testing.assert_close(bf16, loss, rtol=0, atol=5e-2)


def test_caption_made_only_of_padding_is_rejected():
    image_tokens, text_tokens, padding = _batch()
    padding[2] = True
    with pytest.raises(ValueError, match="non-padding"):
        token_alignment_loss(image_tokens, text_tokens, padding, 5.0)


def _largest_saved_tensor(loss_fn, *args, **kwargs):
    """Numel of the biggest tensor autograd keeps for backward outside any checkpointed region."""
    sizes = []

    def pack(tensor):
        sizes.append(tensor.numel())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss_fn(*args, **kwargs)
    return max(sizes)


def test_chunked_loss_keeps_no_full_similarity_tensor_for_backward():
    """Only the argmax indices of each chunk and the token features are kept: nothing of B x C x P x T."""
    b, p, t, d, chunk = 8, 16, 16, 4, 2
    image_tokens = torch.randn(b, p, d, requires_grad=True)
    text_tokens = torch.randn(b, t, d, requires_grad=True)
    padding = _padding_mask([16, 3, 8, 1, 16, 5, 2, 9], t)
    for chunk_size in (chunk, None):  # not even when all captions form one chunk
        assert _largest_saved_tensor(token_alignment_loss, image_tokens, text_tokens, padding, 5.0,
                                     chunk_size=chunk_size) < b * chunk * p * t


def test_autocast_forward_gives_gradients_in_the_inputs_dtype():
    """Under bf16 autocast the scores are bf16; backward still returns fp32 gradients of fp32 tokens,
    close to those of the fp32 computation."""
    image_tokens, text_tokens, padding = _batch()
    _, ref_img_grad, ref_txt_grad = _loss_and_grads(token_alignment_loss, image_tokens, text_tokens, padding, 5.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, img_grad, txt_grad = _loss_and_grads(token_alignment_loss, image_tokens, text_tokens, padding, 5.0)
    assert img_grad.dtype == txt_grad.dtype == torch.float32
    torch.testing.assert_close(img_grad, ref_img_grad, rtol=0, atol=0.02)
    torch.testing.assert_close(txt_grad, ref_txt_grad, rtol=0, atol=0.02)
