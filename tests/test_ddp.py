"""Multi-process training (gloo, 2 CPU processes) equals the single-process computation on the same
global batch: losses and averaged parameter gradients (InfoNCE, L_HN, token term, frozen G, the
exact-batch group and the gradient probe), and a short training run's final weights."""
from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from helpers.training import EVALUATION, EXECUTION, SPEC

from hnclip.data.loader import PairDataset
from hnclip.io import read_json
from hnclip.losses.objective import loss_terms
from hnclip.models.factory import create, load_weights
from hnclip.training.distributed import Distributed
from hnclip.training.exact_batch import exact_batch_backward
from hnclip.training.loop import TrainJob, train
from hnclip.training.model_setup import frozen_text_encoder
from hnclip.training.probe import GradientProbe

WORLD = 2
GLOBAL_BATCH = 8
TOLERANCE = 1e-5
OBJECTIVES = {
    "infonce": {"framework": "full", "gamma": 0.0, "lambda_tok": 0.0, "g_source": "live"},
    "hn": {"framework": "full", "gamma": 0.5, "lambda_tok": 0.0, "g_source": "live"},
    "hn_tok": {"framework": "full", "gamma": 0.5, "lambda_tok": 1.0, "g_source": "live"},
    "hn_frozen": {"framework": "full", "gamma": 0.5, "lambda_tok": 0.0, "g_source": "frozen"},
}


def free_ports(count: int) -> tuple[int, ...]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:  # all bound at once: distinct ports
            sock.bind(("127.0.0.1", 0))
        return tuple(sock.getsockname()[1] for sock in sockets)
    finally:
        for sock in sockets:
            sock.close()


def set_rank_environment(rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(WORLD))


# ---- one step: losses and gradients ------------------------------------------------------------
def model_and_batch(inputs_path: Path):
    inputs = torch.load(inputs_path, weights_only=True)
    model = create("hnclip-tiny").model.train()
    model.load_state_dict(inputs["state_dict"])
    return model, inputs["images"], inputs["tokens"]


def share(tensor: torch.Tensor, distributed: Distributed) -> torch.Tensor:
    return tensor[distributed.local_slice(list(range(tensor.shape[0])))]


def gradients(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def one_step_results(inputs_path: Path, distributed: Distributed) -> dict:
    """Loss, averaged gradients and probe record for every objective, on this process's share."""
    torch.set_num_threads(1)
    model, images, tokens = model_and_batch(inputs_path)
    frozen = frozen_text_encoder(model)
    local_images, local_tokens = share(images, distributed), share(tokens, distributed)
    results = {}
    for name, objective in OBJECTIVES.items():
        model.zero_grad(set_to_none=True)
        terms = loss_terms(model, local_images, local_tokens, objective, frozen)
        terms["total"].backward()
        distributed.average_gradients(model.parameters())
        results[name] = {"loss": {k: float(v.detach()) for k, v in terms.items()}, "grads": gradients(model)}
    # exact batch: the global batch as two micro-batches of 4 pairs, one contrastive batch
    objective = OBJECTIVES["hn_tok"]
    model.zero_grad(set_to_none=True)
    halves = [(share(images[i:i + 4], distributed), share(tokens[i:i + 4], distributed)) for i in (0, 4)]
    record = exact_batch_backward(model, halves, objective, frozen)
    distributed.average_gradients(model.parameters())
    results["exact"] = {"loss": record, "grads": gradients(model)}
    probe = GradientProbe.from_settings({"grad_probe_every": 1}, OBJECTIVES["hn"])
    results["probe"] = probe.measure(model, list(model.parameters()), local_images, local_tokens, frozen,
                                     distributed=distributed)
    return results


def assert_same_results(single: dict, multi: dict) -> None:
    for name in single:
        if name == "probe":
            for key, value in single[name].items():
                # bf16 matmuls round differently at another batch shape: equal to bf16's precision only
                rel = 1e-2 if key.startswith("clip_bf16_") else 1e-5
                expected = pytest.approx(value, rel=rel, abs=TOLERANCE) if isinstance(value, float) else value
                assert multi[name][key] == expected, key
            continue
        for term, value in single[name]["loss"].items():
            assert multi[name]["loss"][term] == pytest.approx(value, abs=TOLERANCE), (name, term)
        assert single[name]["grads"].keys() == multi[name]["grads"].keys()
        for param, grad in single[name]["grads"].items():
            torch.testing.assert_close(multi[name]["grads"][param], grad, atol=TOLERANCE, rtol=1e-4,
                                       msg=lambda m: f"{name} {param}: {m}")


def training_job(tiny_data, out: Path) -> TrainJob:
    spec = {**SPEC, "recipe": {**SPEC["recipe"], "lr": 1e-4}}
    return TrainJob(run_id="ddp-run", spec=spec, spec_hash="d" * 64, init_kind="scratch", init_path=None,
                    model_config="hnclip-tiny", train_manifest=tiny_data["train"],
                    eval_manifests={"docci": tiny_data["test"]}, out_dir=out / "run", checkpoint_dir=out / "ckpt",
                    execution=EXECUTION, evaluation=EVALUATION)


def worker(rank: int, ports: tuple[int, int], inputs_path: Path, out_path: Path, job: TrainJob) -> None:
    """One rank: the one-step comparison on a process group of its own, then a training run that
    joins the group from the environment, as under torchrun."""
    set_rank_environment(rank, ports[0])
    dist.init_process_group("gloo")
    try:
        results = one_step_results(inputs_path, Distributed(rank, WORLD, rank))
        if rank == 0:
            torch.save(results, out_path)
    finally:
        dist.destroy_process_group()
    os.environ["MASTER_PORT"] = str(ports[1])
    train(job)
    assert not dist.is_initialized()  # train() leaves no process group behind


def global_batch(tiny_data):
    """The 4 shortest and 4 longest captions: the two ranks' shares differ in padded length."""
    torch.manual_seed(0)
    backbone = create("hnclip-tiny")
    data = PairDataset.from_manifest(tiny_data["train"], backbone.preprocess, backbone.tokenizer)
    order = (data.tokens != 0).sum(dim=1).argsort().tolist()
    images, tokens = data.batch(order[:GLOBAL_BATCH // 2] + order[-GLOBAL_BATCH // 2:])
    return backbone.model, images, tokens


@pytest.fixture(scope="module")
def two_processes(tiny_data, tmp_path_factory):
    """Both comparisons' 2-process results from one spawn (starting processes costs seconds each)."""
    root = tmp_path_factory.mktemp("ddp")
    model, images, tokens = global_batch(tiny_data)
    inputs_path = root / "inputs.pt"
    torch.save({"state_dict": model.state_dict(), "images": images, "tokens": tokens}, inputs_path)
    job = training_job(tiny_data, root / "multi")
    mp.spawn(worker, args=(free_ports(2), inputs_path, root / "one_step.pt", job), nprocs=WORLD)
    return {"inputs": inputs_path, "one_step": torch.load(root / "one_step.pt", weights_only=False), "job": job,
            "tokens": tokens}


def test_two_processes_give_single_process_losses_and_gradients(two_processes):
    single = one_step_results(two_processes["inputs"], Distributed())
    assert_same_results(single, two_processes["one_step"])
    lengths = [int((t != 0).sum(dim=1).max()) for t in two_processes["tokens"].chunk(WORLD)]
    assert lengths[0] < lengths[1]  # each rank trimmed to its own length: the padding path ran


def test_two_process_training_matches_one_process(two_processes, tiny_data, tmp_path):
    single = train(training_job(tiny_data, tmp_path))
    job = two_processes["job"]
    assert sorted(p.name for p in job.out_dir.iterdir()) == ["model.pt", "steps.jsonl", "train.json"]
    multi = read_json(job.out_dir / "train.json")
    assert multi["training"]["processes"] == WORLD and multi["optimizer_steps"] == single["optimizer_steps"] == 6
    # Not bitwise: the loss sums run in another order and each rank trims its captions to its own
    # longest one, so matmul shapes differ; those rounding differences stay below 1e-5. One
    # exception: the attention key bias, whose gradient is mathematically zero (softmax ignores a
    # per-query constant), so its gradient is pure rounding noise that AdamW normalises into
    # lr-sized steps in either run. It has no effect on the outputs, so it is compared by them. AdamW
    # divides every gradient by its running RMS, so an entry whose gradient is small carries its
    # rounding difference into the update too: the weights are compared at twice the tolerance
    # (a CI machine once gave 1.006e-5 on one entry of 12,288).
    single_model = load_weights(tmp_path / "run" / "model.pt").model
    multi_model = load_weights(job.out_dir / "model.pt").model
    multi_weights = without_key_bias(multi_model.state_dict())
    for key, value in without_key_bias(single_model.state_dict()).items():
        torch.testing.assert_close(multi_weights[key], value, atol=2 * TOLERANCE, rtol=0,
                                   msg=lambda m: f"{key}: {m}")
    assert multi["history"][-1]["eval"] == single["history"][-1]["eval"]
    _, images, tokens = global_batch(tiny_data)
    with torch.no_grad():
        torch.testing.assert_close(multi_model.encode_image(images), single_model.encode_image(images),
                                   atol=TOLERANCE, rtol=0)
        torch.testing.assert_close(multi_model.encode_text(tokens), single_model.encode_text(tokens),
                                   atol=TOLERANCE, rtol=0)


def without_key_bias(state_dict: dict) -> dict:
    """The state dict with each attention's key bias (middle third of in_proj_bias) cut out."""
    def cut(key, value):
        if not key.endswith("attn.in_proj_bias"):
            return value
        query, _, values = value.chunk(3)
        return torch.cat([query, values])
    return {key: cut(key, value) for key, value in state_dict.items()}
