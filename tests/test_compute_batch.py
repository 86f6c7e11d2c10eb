"""`recipe.compute_batch`: encoding a whole accumulation group per forward, with the contrastive terms
computed per micro-batch, gives the gradients and loss records of sequential micro-batch
accumulation (InfoNCE, L_HN with live and frozen G, L_HN + L_tok, LoRA, two processes); and the
halve-until-it-fits memory fallback."""
from __future__ import annotations

import contextlib
import copy
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from helpers.batches import accumulation_group as random_group
from helpers.batches import tiny_model

from hnclip.losses.objective import loss_terms, token_term
from hnclip.losses.token import token_alignment_loss
from hnclip.models.towers import Encoded, encode_batch
from hnclip.training.compute_batch import compute_batch_backward
from hnclip.training.distributed import Distributed
from hnclip.training.frameworks import TrainedModel
from hnclip.training.memory import fit_compute_batch, micro_batches_per_forward

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny shapes, one thread

MICRO, ACCUM = 4, 8
COMPUTE = MICRO * ACCUM  # the whole accumulation group in one forward
RELATIVE = 1e-5
OBJECTIVES = {
    "infonce": {"gamma": 0.0, "lambda_tok": 0.0, "g_source": "live"},
    "hn_live": {"gamma": 0.5, "lambda_tok": 0.0, "g_source": "live"},
    "hn_frozen": {"gamma": 0.5, "lambda_tok": 0.0, "g_source": "frozen"},
    "hn_tok": {"gamma": 0.5, "lambda_tok": 1.0, "g_source": "live"},
}


def no_check(record: dict) -> None:
    """The loop's non-finite guard, switched off."""



# ---- inputs -------------------------------------------------------------------------------------
def accumulation_group(seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """ACCUM micro-batches of MICRO random 64 px images and captions; micro-batch m has captions of
    3 to 5 + 5m tokens, so the concatenated forward pads the early micro-batches' captions far
    beyond their own longest caption."""
    return random_group(MICRO, ACCUM, seed, lambda row: (3, 6 + 5 * (row // MICRO)))


def perturbed_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A frozen text tower that differs from the live one, so frozen G is not live G."""
    frozen = copy.deepcopy(model).requires_grad_(False).eval()
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for param in frozen.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    return frozen


# ---- the two ways of accumulating a group's gradient --------------------------------------------
def sequential(model, batches, objective, frozen=None) -> tuple[list[dict], dict]:
    """The reference: one forward and backward per micro-batch, each total divided by the group size."""
    model.zero_grad(set_to_none=True)
    records = []
    for images, tokens in batches:
        terms = loss_terms(model, images, tokens, objective, frozen)
        (terms["total"] / len(batches)).backward()
        records.append({name: float(value.detach()) for name, value in terms.items()})
    return records, gradients(model)


def in_compute_batches(model, batches, objective, frozen=None, compute=COMPUTE) -> tuple[list[dict], dict]:
    model.zero_grad(set_to_none=True)
    records = compute_batch_backward(model, batches, objective, frozen, contextlib.nullcontext, no_check,
                                     compute, MICRO)
    return records, gradients(model)


def gradients(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def assert_same_gradients(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys()
    for name, grad in expected.items():
        assert grad.norm() > 0, name
        assert float((actual[name] - grad).norm() / grad.norm()) <= RELATIVE, name


def assert_same_records(actual: list[dict], expected: list[dict]) -> None:
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected):
        assert got.keys() == want.keys()
        for term, value in want.items():
            assert got[term] == pytest.approx(value, rel=RELATIVE, abs=1e-7), term


# ---- equivalence --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", OBJECTIVES)
def test_whole_group_forward_equals_sequential_accumulation(tiny_state, name):
    model, objective, batches = tiny_model(tiny_state), OBJECTIVES[name], accumulation_group()
    frozen = perturbed_copy(model) if objective["g_source"] == "frozen" else None
    expected_records, expected = sequential(model, batches, objective, frozen)
    records, actual = in_compute_batches(model, batches, objective, frozen)
    assert_same_gradients(actual, expected)
    assert_same_records(records, expected_records)
    assert set(records[0]) == {"infonce", "total"} | ({"hn"} if objective["gamma"] > 0 else set()) \
        | ({"tok"} if objective["lambda_tok"] > 0 else set())


def test_frozen_margin_changes_the_gradient(tiny_state):
    """The frozen-G comparison above is not vacuous: its G comes from the other tower."""
    model, batches = tiny_model(tiny_state), accumulation_group()
    _, live = in_compute_batches(model, batches, OBJECTIVES["hn_live"])
    _, frozen = in_compute_batches(model, batches, OBJECTIVES["hn_frozen"], perturbed_copy(model))
    name = "text_projection"
    assert float((live[name] - frozen[name]).norm() / live[name].norm()) > 1e-3


def test_forwards_of_three_micro_batches_and_a_short_last_one(tiny_state):
    """compute_batch 12 with 8 micro-batches: forwards of 3, 3 and 2 micro-batches."""
    model, batches = tiny_model(tiny_state), accumulation_group(seed=2)
    expected_records, expected = sequential(model, batches, OBJECTIVES["hn_tok"])
    records, actual = in_compute_batches(model, batches, OBJECTIVES["hn_tok"], compute=3 * MICRO)
    assert_same_gradients(actual, expected)
    assert_same_records(records, expected_records)


def test_lora_adapters(tiny_state):
    module = TrainedModel.build(tiny_model(tiny_state), "lora",
                                {"r": 4, "alpha": 8, "dropout": 0.0, "target": "both"}).module
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():  # lora_B starts at zero, which would leave every lora_A gradient zero
        for name, param in module.named_parameters():
            if "lora_B" in name:
                param.copy_(0.1 * torch.randn(param.shape, generator=generator))
    batches = accumulation_group(seed=4)
    expected_records, expected = sequential(module, batches, OBJECTIVES["hn_tok"])
    records, actual = in_compute_batches(module, batches, OBJECTIVES["hn_tok"])
    assert expected and all("lora_" in name for name in expected)
    assert_same_gradients(actual, expected)
    assert_same_records(records, expected_records)


def test_each_group_gets_its_own_micro_batch_rows(tiny_state):
    """Block-diagonal: the terms function is called once per micro-batch, on exactly the features a
    forward of that micro-batch alone gives, and the group totals are averaged over the group."""
    model, batches = tiny_model(tiny_state), accumulation_group()
    seen = []

    def terms(encoded: Encoded, scale, objective, margin):
        seen.append((encoded, margin))
        return {"total": encoded.image_features[:, 0].sum()}

    model.zero_grad(set_to_none=True)
    records = compute_batch_backward(model, batches, OBJECTIVES["hn_live"], None, contextlib.nullcontext,
                                     no_check, COMPUTE, MICRO, terms=terms)
    assert len(seen) == ACCUM and all(margin is None for _, margin in seen)
    with torch.no_grad():
        alone = [encode_batch(model, images, tokens, with_tokens=False) for images, tokens in batches]
    for (encoded, _), own in zip(seen, alone):
        torch.testing.assert_close(encoded.image_features, own.image_features, rtol=0, atol=1e-6)
        torch.testing.assert_close(encoded.text_features, own.text_features, rtol=0, atol=1e-6)
    assert [r["total"] for r in records] == pytest.approx([float(o.image_features[:, 0].sum()) for o in alone],
                                                          abs=1e-5)
    # the back-propagated loss is mean over groups of the group totals = sum over all images / ACCUM
    model2 = tiny_model(tiny_state)
    images = torch.cat([b[0] for b in batches])
    (model2.encode_image(images, normalize=True)[:, 0].sum() / ACCUM).backward()
    torch.testing.assert_close(model.visual.proj.grad, model2.visual.proj.grad, rtol=1e-5, atol=1e-7)


def test_check_sees_every_record_of_a_forward_before_backward(tiny_state):
    model, batches = tiny_model(tiny_state), accumulation_group()
    checked = []

    def check(record):
        checked.append(record)
        if len(checked) == ACCUM:
            raise FloatingPointError("stop")

    model.zero_grad(set_to_none=True)
    with pytest.raises(FloatingPointError):
        compute_batch_backward(model, batches, OBJECTIVES["hn_live"], None, contextlib.nullcontext, check,
                               COMPUTE, MICRO)
    assert len(checked) == ACCUM
    assert all(p.grad is None for p in model.parameters())


def test_token_term_ignores_padding():
    """Extra padded text positions, holding any values, change neither L_tok nor its gradients."""
    generator = torch.Generator().manual_seed(6)
    image_tokens = torch.randn(3, 5, 8, generator=generator, requires_grad=True)
    text_tokens = torch.randn(3, 4, 8, generator=generator, requires_grad=True)
    mask = torch.tensor([[False, False, True, True], [False, False, False, False], [False, True, True, True]])
    garbage = 100 * torch.randn(3, 6, 8, generator=generator)
    padded_text = torch.cat([text_tokens, garbage], dim=1)
    padded_mask = torch.cat([mask, torch.ones(3, 6, dtype=torch.bool)], dim=1)
    scale = torch.tensor(10.0)
    short = token_term(Encoded(image_tokens=image_tokens, text_tokens=text_tokens, text_padding_mask=mask), scale)
    long = token_term(Encoded(image_tokens=image_tokens, text_tokens=padded_text, text_padding_mask=padded_mask),
                      scale)
    assert float(long.detach()) == pytest.approx(float(short.detach()), rel=1e-6)
    grads_short = torch.autograd.grad(short, [image_tokens, text_tokens])
    grads_long = torch.autograd.grad(long, [image_tokens, text_tokens])
    for got, want in zip(grads_long, grads_short):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    # and the value is the hand-written FILIP loss on the unpadded tokens
    image = torch.nn.functional.normalize(image_tokens.detach(), dim=-1)
    text = torch.nn.functional.normalize(text_tokens.detach(), dim=-1)
    i2t, t2i = torch.zeros(3, 3), torch.zeros(3, 3)
    for i in range(3):
        for j in range(3):
            words = text[j][~mask[j]]
            cos = image[i] @ words.t()                       # [patches, words]
            i2t[i, j] = cos.max(dim=1).values.mean()
            t2i[i, j] = cos.max(dim=0).values.mean()
    ce = torch.nn.functional.cross_entropy
    expected = (ce(scale * i2t, torch.arange(3)) + ce(scale * t2i.t(), torch.arange(3))) / 2
    assert float(long.detach()) == pytest.approx(float(expected), rel=1e-5)
    assert float(token_alignment_loss(image_tokens, text_tokens, mask, scale).detach()) == \
        pytest.approx(float(short.detach()))


# ---- validation and the memory fallback ---------------------------------------------------------
def test_micro_batches_per_forward():
    assert micro_batches_per_forward(128, 16) == 8
    assert micro_batches_per_forward(16, 16) == 1
    for compute, micro in ((120, 16), (8, 16), (0, 16), (16, 0)):
        with pytest.raises(ValueError):
            micro_batches_per_forward(compute, micro)


class Steps:
    """A try_step that runs out of memory above `fits`, or raises `error` at every size."""

    def __init__(self, fits: int = 0, error: BaseException | None = None):
        self.fits, self.error, self.tried = fits, error, []

    def __call__(self, size: int) -> None:
        self.tried.append(size)
        if self.error is not None:
            raise self.error
        if size > self.fits:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def test_fallback_halves_until_it_fits_and_logs_the_value():
    steps, log = Steps(fits=40), []
    assert fit_compute_batch(steps, 128, 16, log.append) == 32
    assert steps.tried == [128, 64, 32]
    assert "using 32" in log[-1]


def test_fallback_rounds_down_to_a_multiple_of_the_micro_batch():
    steps = Steps(fits=16)
    assert fit_compute_batch(steps, 48, 16, lambda _: None) == 16
    assert steps.tried == [48, 16]  # 48 / 2 = 24 -> 16


def test_fallback_takes_a_backend_out_of_memory_runtime_error():
    class NpuLike:
        def __init__(self):
            self.tried = []

        def __call__(self, size):
            self.tried.append(size)
            if size > 16:
                raise RuntimeError("NPU out of memory. Tried to allocate ...")
    steps = NpuLike()
    assert fit_compute_batch(steps, 64, 16, lambda _: None) == 16 and steps.tried == [64, 32, 16]


class FakeBackend:
    """Stands in for torch.npu / torch.cuda / torch.mps: counts empty_cache calls."""

    def __init__(self):
        self.emptied = 0

    def empty_cache(self):
        self.emptied += 1


@pytest.mark.parametrize("device", ["npu:0", "cuda", "mps"])
def test_fallback_empties_the_cache_of_the_device_that_ran_out(monkeypatch, device):
    from hnclip.runtime import device as device_module
    backends = {kind: FakeBackend() for kind in ("npu", "cuda", "mps")}
    for kind, backend in backends.items():
        monkeypatch.setattr(torch, kind, backend, raising=False)
    monkeypatch.setattr(device_module, "import_torch_npu", lambda: object())  # torch_npu "installed"
    steps = Steps(fits=16)
    assert fit_compute_batch(steps, 64, 16, lambda _: None, device=device) == 16
    kind = device.split(":")[0]
    assert backends[kind].emptied == 2  # once after each size that ran out (64, 32)
    assert all(backend.emptied == 0 for other, backend in backends.items() if other != kind)


def test_fallback_on_the_cpu_empties_no_accelerator_cache(monkeypatch):
    backends = {kind: FakeBackend() for kind in ("npu", "cuda", "mps")}
    for kind, backend in backends.items():
        monkeypatch.setattr(torch, kind, backend, raising=False)
    assert fit_compute_batch(Steps(fits=16), 32, 16, lambda _: None) == 16
    assert all(backend.emptied == 0 for backend in backends.values())


def test_fallback_never_goes_below_the_micro_batch():
    steps = Steps(fits=0)
    with pytest.raises(torch.OutOfMemoryError):
        fit_compute_batch(steps, 128, 16, lambda _: None)
    assert steps.tried == [128, 64, 32, 16]


def test_fallback_raises_other_errors_at_once():
    steps = Steps(error=RuntimeError("shape mismatch"))
    with pytest.raises(RuntimeError, match="shape mismatch"):
        fit_compute_batch(steps, 128, 16, lambda _: None)
    assert steps.tried == [128]


# ---- two processes ------------------------------------------------------------------------------
WORLD = 2


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_share(batches, distributed: Distributed):
    rows = distributed.local_slice(list(range(MICRO)))
    return [(images[rows], tokens[rows]) for images, tokens in batches]


def ddp_worker(rank: int, port: int, state: dict, out_path) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        torch.set_num_threads(1)
        distributed = Distributed(rank, WORLD, rank)
        model = tiny_model(state)
        records, _ = in_compute_batches(model, rank_share(accumulation_group(), distributed), OBJECTIVES["hn_tok"])
        distributed.average_gradients(model.parameters())
        if rank == 0:
            torch.save({"records": records, "grads": gradients(model)}, out_path)
    finally:
        dist.destroy_process_group()


def test_two_processes_equal_one_process_sequential_accumulation(tiny_state, tmp_path):
    """Each rank holds half of every micro-batch; each group's terms gather that group's features."""
    out_path = tmp_path / "rank0.pt"
    mp.spawn(ddp_worker, args=(free_port(), tiny_state, out_path), nprocs=WORLD)
    multi = torch.load(out_path, weights_only=True)
    expected_records, expected = sequential(tiny_model(tiny_state), accumulation_group(), OBJECTIVES["hn_tok"])
    assert_same_gradients(multi["grads"], expected)
    assert_same_records(multi["records"], expected_records)
