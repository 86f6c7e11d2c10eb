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
    """Re-encode the benchmark's test split with the run's final weights (the last epoch), take the
    best epoch from the per-epoch record, and write both with provenance."""
    import time

    from . import paths, provenance
    from .data.loader import PairDataset
    from .io import read_json, write_json
    from .models.factory import load_weights

    started = time.time()
    train_record = read_json(paths.run_record(run_id))
    model_path = paths.run_model(run_id)
    expected = train_record["outputs"]["model"]["sha256"]
    if provenance.file_sha256(model_path) != expected:
        raise RuntimeError(f"{model_path} does not match the sha256 its training record "
                           f"({paths.run_record(run_id)}) gives: the checkpoint was replaced; retrain {run_id}")
    backbone = load_weights(model_path)
    manifest = reg.test_manifest(benchmark)
    dataset = PairDataset.from_manifest(manifest, backbone.preprocess, backbone.tokenizer)
    execution, evaluation = reg.profile["execution"], reg.params["evaluation"]
    torch.set_num_threads(execution["threads"])
    last_metrics = evaluate_model(backbone.model, dataset, evaluation["recall_ks"], evaluation["tie_rule"],
                                  execution["eval_batch_size"])
    history = train_record["history"]
    last = {"epoch": history[-1]["epoch"], "metrics": last_metrics, "weights_sha256": history[-1]["weights_sha256"]}
    result = {"run_id": run_id, "benchmark": benchmark, "last": last}
    try:
        chosen = select_epochs(history, benchmark)
    except KeyError:
        result.update(best={**last, "note": "not evaluated every epoch; best = last"}, per_epoch=[last],
                      consistent_with_training=None)
    else:
        weights = {h["epoch"]: h["weights_sha256"] for h in history}
        result.update(best={**chosen["best"], "weights_sha256": weights[chosen["best"]["epoch"]]},
                      per_epoch=chosen["per_epoch"],
                      consistent_with_training=_same_metrics(chosen["last"]["metrics"], last_metrics))
        if not result["consistent_with_training"]:
            raise RuntimeError(f"{run_id}/{benchmark}: re-encoding the final weights gives {last_metrics} but "
                               f"training recorded {chosen['last']['metrics']} for the same epoch")
    result["provenance"] = provenance.record(
        "evaluate", inputs={"model": model_path, "test_manifest": manifest, "train_record": paths.run_record(run_id)},
        spec_hash=train_record.get("spec_hash"), params={"evaluation": evaluation},
        wall_time_s=time.time() - started)
    out = paths.evaluation(run_id, benchmark)
    write_json(out, result)
    return out
