"""HN loss (paper Eq. 2) against an independent computation; gamma=0 is InfoNCE; G carries no gradient;
each loss is the cross-entropy of its logits."""
import math

import open_clip.loss
import pytest
import torch
import torch.nn.functional as F

from hnclip.losses import (
    ContrastiveLoss,
    hn_logits,
    hn_loss,
    infonce_logits,
    infonce_loss,
    margin_matrix,
)
from hnclip.losses.contrastive import symmetric_cross_entropy


def _features(b=6, d=8, seed=0, requires_grad=True):
    g = torch.Generator().manual_seed(seed)
    img = F.normalize(torch.randn(b, d, generator=g, dtype=torch.float64), dim=-1).requires_grad_(requires_grad)
    txt = F.normalize(torch.randn(b, d, generator=g, dtype=torch.float64), dim=-1).requires_grad_(requires_grad)
    return img, txt


def eq2_by_hand(img, txt, s, gamma, margin_txt=None):
    """Paper Eq. 2 written out with explicit loops over rows (no shared code with hnclip.losses)."""
    m = (txt if margin_txt is None else margin_txt).detach()
    m = m / m.norm(dim=-1, keepdim=True)
    b = img.shape[0]
    total_i2t, total_t2i = 0.0, 0.0
    for i in range(b):
        row = [s * (img[i] @ txt[j] + (0.0 if i == j else gamma * (m[i] @ m[j]))) for j in range(b)]
        total_i2t = total_i2t - (row[i] - torch.logsumexp(torch.stack(row), 0))
        col = [s * (img[j] @ txt[i] + (0.0 if i == j else gamma * (m[j] @ m[i]))) for j in range(b)]
        total_t2i = total_t2i - (col[i] - torch.logsumexp(torch.stack(col), 0))
    return (total_i2t / b + total_t2i / b) / 2


@pytest.mark.parametrize("gamma", [0.0, 0.25, 0.5, 1.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_hn_loss_matches_eq2_values_and_gradients(gamma, seed):
    img, txt = _features(seed=seed)
    s = 100.0 if seed == 0 else 14.3
    ours = hn_loss(img, txt, s, gamma)
    ref = eq2_by_hand(img, txt, s, gamma)
    assert torch.allclose(ours, ref, atol=1e-10)
    g_ours = torch.autograd.grad(ours, (img, txt))
    g_ref = torch.autograd.grad(eq2_by_hand(img, txt, s, gamma), (img, txt))
    for a, b in zip(g_ours, g_ref):
        assert torch.allclose(a, b, atol=1e-10)


def test_paper_reference_implementation_agrees():
    """Appendix B.1's listing (fill_diagonal_ on the margins) gives the same numbers."""
    img, txt = _features(b=5, seed=3)
    sim = img @ txt.t()
    margins = 0.5 * (txt @ txt.t()).detach()
    margins.fill_diagonal_(0.0)
    logits = 100.0 * (sim + margins)
    targets = torch.arange(5)
    listing = (F.cross_entropy(logits, targets) + F.cross_entropy(logits.t(), targets)) / 2
    assert torch.allclose(hn_loss(img, txt, 100.0, 0.5), listing, atol=1e-12)


def test_gamma_zero_equals_infonce_and_open_clip():
    img, txt = _features(seed=4)
    scale = torch.tensor(100.0, dtype=torch.float64)
    ours = hn_loss(img, txt, scale, 0.0)
    # Equal up to rounding, not bit for bit: InfoNCE computes (s * I) @ T^T, L_HN s * (I @ T^T + 0), and
    # which of the two rounds lower depends on the machine's BLAS kernel.
    assert torch.allclose(ours, infonce_loss(img, txt, scale), rtol=1e-14, atol=0)
    assert torch.allclose(ours, open_clip.loss.ClipLoss()(img, txt, scale), atol=1e-12)
    assert torch.allclose(ContrastiveLoss()(img, txt, scale), ours)


def test_no_gradient_flows_into_g_features():
    img, txt = _features(seed=5)
    margin = F.normalize(torch.randn(6, 8, dtype=torch.float64), dim=-1).requires_grad_(True)
    loss = hn_loss(img, txt, 100.0, 0.5, g_features=margin)
    grad_margin, = torch.autograd.grad(loss, margin, allow_unused=True)
    assert grad_margin is None
    # With the live text features as margin source, the text gradient equals the gradient with G
    # supplied as a constant: the G path contributes nothing.
    live = torch.autograd.grad(hn_loss(img, txt, 100.0, 0.5), txt)[0]
    constant = torch.autograd.grad(hn_loss(img, txt, 100.0, 0.5, g_features=txt.detach().clone()), txt)[0]
    assert torch.allclose(live, constant, atol=1e-14)


def test_g_features_are_used_when_given():
    img, txt = _features(seed=6)
    other = F.normalize(torch.randn(6, 8, dtype=torch.float64), dim=-1)
    assert not torch.allclose(hn_loss(img, txt, 50.0, 0.5), hn_loss(img, txt, 50.0, 0.5, other))
    assert torch.allclose(hn_loss(img, txt, 50.0, 0.5, other), eq2_by_hand(img, txt, 50.0, 0.5, other), atol=1e-10)


def test_margin_matrix_is_detached_masked_cosine():
    _, txt = _features(seed=7)
    m = margin_matrix(txt * 3.0, 0.5)  # unnormalized input: G is a cosine
    assert not m.requires_grad
    assert torch.all(m.diagonal() == 0)
    expected = 0.5 * (txt @ txt.t())
    off = ~torch.eye(6, dtype=torch.bool)
    assert torch.allclose(m[off], expected.detach()[off].to(m.dtype), atol=1e-6)


def test_each_loss_is_the_symmetric_cross_entropy_of_its_logits_and_the_module_keeps_the_contract():
    """The gradient probe differentiates through the logits: they are exactly the losses' own."""
    img, txt = _features(seed=8)
    other = F.normalize(torch.randn(6, 8, dtype=torch.float64), dim=-1)
    assert torch.equal(hn_loss(img, txt, 100.0, 0.5, other, "constant"),
                       symmetric_cross_entropy(hn_logits(img, txt, 100.0, 0.5, other, "constant")))
    assert torch.equal(infonce_loss(img, txt, 100.0), symmetric_cross_entropy(infonce_logits(img, txt, 100.0)))
    out = ContrastiveLoss()(img, txt, 100.0, output_dict=True)
    assert set(out) == {"contrastive_loss"} and math.isfinite(float(out["contrastive_loss"].detach()))


def test_margins_keep_the_loss_alive_where_infonce_saturates():
    """The mechanism of Sec. 2.2: perfectly aligned pairs whose captions are near-duplicates
    (cosine 0.85): InfoNCE is saturated (< 1e-3) while L_HN is not."""
    b, d = 8, 16
    eye = torch.eye(d, dtype=torch.float64)
    shared, private = eye[0], eye[1:b + 1]
    txt = F.normalize(shared + (0.15 / 0.85) ** 0.5 * private, dim=-1)
    assert abs(float(txt[0] @ txt[1]) - 0.85) < 1e-9
    img = txt.clone()
    assert float(infonce_loss(img, txt, 100.0)) < 1e-3
    assert float(hn_loss(img, txt, 100.0, 0.5)) > 1.0
