"""GradCache: micro-batched backward of the full-batch contrastive loss equals the full-batch backward."""
import functools

import open_clip
import pytest
import torch

from hnclip.losses import ContrastiveLoss, hn_loss
from hnclip.losses.gradcache import GradCache, gradcache_backward, split_micro_batches
from hnclip.models.towers import encode_image, encode_text

BATCH, MICRO = 16, 4
SOT, EOT = 49406, 49407
LOSSES = {"infonce": ContrastiveLoss(), "hn": functools.partial(hn_loss, gamma=0.5)}


def _tiny_clip(patch_dropout=0.0, dtype=torch.float32):
    torch.manual_seed(0)
    model = open_clip.model.CLIP(
        embed_dim=32,
        vision_cfg={"image_size": 32, "layers": 1, "width": 32, "patch_size": 8, "head_width": 16,
                    "patch_dropout": patch_dropout},
        text_cfg={"context_length": 248, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
    )
    return model.to(dtype)


def _random_batch(seed=1, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    images = torch.randn(BATCH, 3, 32, 32, generator=gen, dtype=dtype)
    texts = torch.zeros(BATCH, 248, dtype=torch.long)  # 0 = padding
    lengths = torch.randint(3, 40, (BATCH,), generator=gen)
    for row, length in enumerate(lengths.tolist()):
        texts[row, 0] = SOT
        texts[row, 1:length - 1] = torch.randint(1, SOT, (length - 2,), generator=gen)
        texts[row, length - 1] = EOT
    return images, texts


def _encoder(model):
    return lambda images, texts: (encode_image(model, images), encode_text(model, texts))


def _grads(model):
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def _full_batch_backward(model, loss_fn, images, texts):
    model.zero_grad(set_to_none=True)
    image_features, text_features = _encoder(model)(images, texts)
    loss = loss_fn(image_features, text_features, model.logit_scale.exp())
    loss.backward()
    return loss.detach(), _grads(model)


def _gradcache_backward(model, loss_fn, images, texts, micro=MICRO):
    model.zero_grad(set_to_none=True)
    loss = gradcache_backward(_encoder(model), split_micro_batches(images, texts, micro),
                              model.logit_scale.exp(), loss_fn)
    return loss, _grads(model)


# float32 gradients reach |g| ~ 20 here, where one ulp is ~2e-6 and the two computations sum in a
# different order, so float32 is held to 1e-5 absolute *and* relative; float64 shows the two are
# identical up to rounding.
TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float64: dict(rtol=0, atol=1e-10)}
LOSS_TOLERANCE = {torch.float32: dict(rtol=1e-6, atol=1e-6), torch.float64: dict(rtol=0, atol=1e-12)}


def _assert_same_grads(actual, expected, dtype=torch.float32):
    assert actual.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], **TOLERANCE[dtype], msg=name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("seed", [1, 3])
@pytest.mark.parametrize("loss_name", ["infonce", "hn"])
def test_gradcache_equals_full_batch(loss_name, seed, dtype):
    model, loss_fn = _tiny_clip(dtype=dtype).eval(), LOSSES[loss_name]
    images, texts = _random_batch(seed, dtype)
    full_loss, full_grads = _full_batch_backward(model, loss_fn, images, texts)
    cached_loss, cached_grads = _gradcache_backward(model, loss_fn, images, texts)

    torch.testing.assert_close(cached_loss, full_loss, **LOSS_TOLERANCE[dtype])
    assert not cached_loss.requires_grad
    assert "logit_scale" in cached_grads and full_grads["logit_scale"].abs() > 0
    torch.testing.assert_close(cached_grads["logit_scale"], full_grads["logit_scale"],
                               rtol=0, atol=1e-5 if dtype == torch.float32 else 1e-10)
    _assert_same_grads(cached_grads, full_grads, dtype)


@pytest.mark.parametrize("loss_name", ["infonce", "hn"])
def test_gradient_accumulation_differs_from_full_batch(loss_name):
    """Accumulating 4 micro-batch losses is a 4-way softmax, not the 16-way one GradCache gives."""
    model, loss_fn = _tiny_clip().eval(), LOSSES[loss_name]
    images, texts = _random_batch()
    full_loss, full_grads = _full_batch_backward(model, loss_fn, images, texts)

    model.zero_grad(set_to_none=True)
    accumulated_loss = 0.0
    for micro_images, micro_texts in split_micro_batches(images, texts, MICRO):
        image_features, text_features = _encoder(model)(micro_images, micro_texts)
        loss = loss_fn(image_features, text_features, model.logit_scale.exp()) / (BATCH // MICRO)
        loss.backward()
        accumulated_loss += loss.item()
    accumulated_grads = _grads(model)

    # Fewer negatives per softmax: a smaller loss and a clearly different gradient.
    assert accumulated_loss < full_loss.item() - 0.1
    difference = max((accumulated_grads[n] - full_grads[n]).abs().max().item() for n in full_grads)
    assert difference > 1e-3  # two orders of magnitude above the GradCache tolerance
    with pytest.raises(AssertionError):
        _assert_same_grads(accumulated_grads, full_grads)


def test_dropout_masks_are_replayed_in_the_re_forward():
    """With patch dropout on, GradCache equals one graph built from the same micro-batch forwards."""
    model, loss_fn = _tiny_clip(patch_dropout=0.5).train(), LOSSES["hn"]
    images, texts = _random_batch()
    micro_batches = split_micro_batches(images, texts, MICRO)
    encode = _encoder(model)

    torch.manual_seed(123)
    first, second = encode(images[:2], texts[:2])[0], encode(images[:2], texts[:2])[0]
    assert not torch.allclose(first, second)  # the dropout is really random

    torch.manual_seed(123)
    model.zero_grad(set_to_none=True)
    features = [encode(*micro) for micro in micro_batches]
    reference_loss = loss_fn(torch.cat([f[0] for f in features]), torch.cat([f[1] for f in features]),
                             model.logit_scale.exp())
    reference_loss.backward()
    reference_grads, reference_rng = _grads(model), torch.get_rng_state()

    torch.manual_seed(123)
    model.zero_grad(set_to_none=True)
    cached_loss = gradcache_backward(encode, micro_batches, model.logit_scale.exp(), loss_fn)

    torch.testing.assert_close(cached_loss, reference_loss.detach(), **LOSS_TOLERANCE[torch.float32])
    _assert_same_grads(_grads(model), reference_grads)
    # The global RNG advanced exactly as if each micro-batch had been encoded once.
    assert torch.equal(torch.get_rng_state(), reference_rng)


def test_gradcache_class_with_uneven_micro_batches_and_dict_loss():
    model = _tiny_clip().eval()
    images, texts = _random_batch(seed=2)
    loss_fn = LOSSES["hn"]
    full_loss, full_grads = _full_batch_backward(model, loss_fn, images, texts)

    model.zero_grad(set_to_none=True)
    def dict_loss(*args):  # a loss with named terms (ClipLoss's output_dict form): they are summed
        return {"contrastive_loss": loss_fn(*args)}
    cached_loss = GradCache(_encoder(model), dict_loss, micro_batch_size=5).step(
        images, texts, model.logit_scale.exp())  # micro-batches of 5, 5, 5, 1

    torch.testing.assert_close(cached_loss, full_loss, **LOSS_TOLERANCE[torch.float32])
    _assert_same_grads(_grads(model), full_grads)


def test_frozen_logit_scale_and_plain_float_scale():
    model = _tiny_clip().eval()
    model.logit_scale.requires_grad_(False)
    images, texts = _random_batch(seed=3)
    full_loss, full_grads = _full_batch_backward(model, LOSSES["infonce"], images, texts)
    model.zero_grad(set_to_none=True)
    cached_loss = gradcache_backward(_encoder(model), split_micro_batches(images, texts, MICRO),
                                     float(model.logit_scale.exp()), LOSSES["infonce"])
    torch.testing.assert_close(cached_loss, full_loss, **LOSS_TOLERANCE[torch.float32])
    _assert_same_grads(_grads(model), full_grads)
    assert "logit_scale" not in full_grads
