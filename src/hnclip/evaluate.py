"""Retrieval evaluation: encode a test split, fp32 cosine, Recall@K in both directions.

Protocol: one caption per image, the gallery is the whole test split, features are
L2-normalized and compared in fp32. Tie rule (explicit, because bf16 features and duplicated
captions do produce exact ties): with `pessimistic`, every other candidate whose score equals the
ground truth's is ranked above it; with `optimistic`, below it. The number of queries whose
ground-truth score is tied with another candidate is recorded either way.
"""
from __future__ import annotations

import torch

from .models.towers import encode_image, encode_text

DIRECTIONS = ("t2i", "i2t")


@torch.no_grad()
def encode_dataset(model, dataset, batch_size: int = 256, device: str | torch.device = "cpu"):
    """Return (image_features, text_features), fp32, L2-normalized, in manifest order."""
    was_training = model.training
    model.eval()
    images, texts = [], []
    for start in range(0, len(dataset), batch_size):
        idx = range(start, min(start + batch_size, len(dataset)))
        img, tok = dataset.batch(idx)
        images.append(encode_image(model, img.to(device)).float().cpu())
        texts.append(encode_text(model, tok.to(device)).float().cpu())
    model.train(was_training)
    return torch.cat(images), torch.cat(texts)


def ranks_of_positives(scores: torch.Tensor, tie_rule: str = "pessimistic") -> tuple[torch.Tensor, torch.Tensor]:
    """scores[q, c]: query q against candidate c, ground truth on the diagonal.
    Returns (0-based rank of each query's ground truth, whether that query had a tie)."""
    if tie_rule not in ("pessimistic", "optimistic"):
        raise ValueError(f"tie_rule must be 'pessimistic' or 'optimistic', got {tie_rule!r}")
    positive = scores.diagonal().unsqueeze(1)
    higher = (scores > positive).sum(dim=1)
    tied = (scores == positive).sum(dim=1) - 1  # the ground truth equals itself
    ranks = higher + tied if tie_rule == "pessimistic" else higher
    return ranks, tied > 0


def recall_at_k(image_features: torch.Tensor, text_features: torch.Tensor, ks=(1, 5, 10),
                tie_rule: str = "pessimistic") -> dict:
    """Recall@K (percent) for text->image and image->text retrieval of paired features."""
    if image_features.shape != text_features.shape:
        raise ValueError("one caption per image is required: feature shapes differ "
                         f"({tuple(image_features.shape)} vs {tuple(text_features.shape)})")
    sims = image_features.float() @ text_features.float().t()  # [image, text]
    result = {"n": int(sims.shape[0]), "tie_rule": tie_rule, "ties": {}}
    for direction, scores in (("t2i", sims.t()), ("i2t", sims)):
        ranks, tied = ranks_of_positives(scores, tie_rule)
        result[direction] = {f"R@{k}": float((ranks < k).float().mean() * 100) for k in ks}
        result["ties"][direction] = int(tied.sum())
    return result


def mean_r1(metrics: dict) -> float:
    return (metrics["t2i"]["R@1"] + metrics["i2t"]["R@1"]) / 2


def evaluate_model(model, dataset, ks, tie_rule, batch_size=256, device="cpu") -> dict:
    img, txt = encode_dataset(model, dataset, batch_size, device)
    return recall_at_k(img, txt, ks, tie_rule)


def select_epochs(history: list[dict], benchmark: str) -> dict:
    """Best (highest mean R@1, earliest on ties) and last epoch of one benchmark's per-epoch metrics."""
    scored = [(h["epoch"], h["eval"][benchmark]) for h in history if benchmark in h.get("eval", {})]
    if not scored:
        raise KeyError(f"no per-epoch evaluation of {benchmark!r} recorded in this run")
    best_epoch, best = max(scored, key=lambda item: (mean_r1(item[1]), -item[0]))
    last_epoch, last = scored[-1]
    return {"best": {"epoch": best_epoch, "metrics": best}, "last": {"epoch": last_epoch, "metrics": last},
            "per_epoch": [{"epoch": e, "metrics": m} for e, m in scored]}


# ---- run-level evaluation (what `hnclip evaluate` writes) ----------------------------------------
def _same_metrics(a: dict, b: dict, tol: float = 1e-6) -> bool:
    return all(abs(a[d][k] - b[d][k]) <= tol for d in DIRECTIONS for k in a[d])


def evaluate_run(reg, run_id: str, benchmark: str):
    """Write results/evals/<run>/<benchmark>.json: best and last epoch with provenance.

    For a trained run, the last epoch is re-encoded from the final weights (and must equal the
    training record's own evaluation of that epoch); the best epoch comes from the per-epoch record.
    The zero-shot pseudo-run evaluates the initial backbone as released (epoch 0)."""
    import time

    from . import paths, provenance
    from .data.loader import PairDataset
    from .io import read_json, write_json
    from .models.factory import load_backbone, load_weights

    started = time.time()
    execution, evaluation = reg.profile["execution"], reg.params["evaluation"]
    torch.set_num_threads(execution["threads"])
    manifest = reg.test_manifest(benchmark)
    if reg.is_zeroshot(run_id):
        spec = reg.backbone_spec()
        weights = paths.backbone_weights(reg.backbone_name(), spec["kind"], reg.profile["data_root"])
        backbone = load_backbone(spec["kind"], weights, spec["model_config"])
        inputs, train_record = {"init_weights": weights, "test_manifest": manifest}, {}
    else:
        train_record = read_json(paths.run_record(run_id))
        weights = paths.run_model(run_id)
        if provenance.file_sha256(weights) != train_record["outputs"]["model"]["sha256"]:
            raise RuntimeError(f"{weights} does not match the sha256 its training record "
                               f"({paths.run_record(run_id)}) gives: the checkpoint was replaced; retrain {run_id}")
        backbone = load_weights(weights)
        inputs = {"model": weights, "test_manifest": manifest, "train_record": paths.run_record(run_id)}
    dataset = PairDataset.from_manifest(manifest, backbone.preprocess, backbone.tokenizer)
    metrics = evaluate_model(backbone.model, dataset, evaluation["recall_ks"], evaluation["tie_rule"],
                             execution["eval_batch_size"])
    result = {"run_id": run_id, "benchmark": benchmark, **_select(train_record, benchmark, metrics)}
    result["provenance"] = provenance.record("evaluate", inputs=inputs, spec_hash=train_record.get("spec_hash"),
                                             params={"evaluation": evaluation}, wall_time_s=time.time() - started)
    out = paths.evaluation(run_id, benchmark)
    write_json(out, result)
    return out


def _select(train_record: dict, benchmark: str, last_metrics: dict) -> dict:
    """Best / last / initial entries of an evaluation record from a run's training history."""
    history = train_record.get("history")
    if not history:  # zero-shot: the weights as released are both the best and the last
        entry = {"epoch": 0, "metrics": last_metrics}
        return {"best": entry, "last": entry, "initial": last_metrics, "per_epoch": [entry],
                "consistent_with_training": None}
    last = {"epoch": history[-1]["epoch"], "metrics": last_metrics, "weights_sha256": history[-1]["weights_sha256"]}
    result = {"last": last, "initial": train_record.get("initial_eval", {}).get(benchmark)}
    try:
        chosen = select_epochs(history, benchmark)
    except KeyError:  # a transfer benchmark: not evaluated every epoch
        return {**result, "best": {**last, "note": "not evaluated every epoch; best = last"}, "per_epoch": [last],
                "consistent_with_training": None}
    weights = {h["epoch"]: h["weights_sha256"] for h in history}
    if not _same_metrics(chosen["last"]["metrics"], last_metrics):
        raise RuntimeError(f"{train_record['run_id']}/{benchmark}: re-encoding the final weights gives "
                           f"{last_metrics} but training recorded {chosen['last']['metrics']} for the same epoch")
    return {**result, "best": {**chosen["best"], "weights_sha256": weights[chosen["best"]["epoch"]]},
            "per_epoch": chosen["per_epoch"], "consistent_with_training": True}
