"""What a fine-tuning run of the embedded default spends besides its optimizer steps, per setting.

    python benchmarks/run_overheads.py [--repeats 3] [--test-size 300]

The embedded model (--model-config, default hnclip-tiny-w128; randomly initialised: these costs do not
depend on the weights) on the embedded benchmarks' caption kinds, one thread, as a training job runs:

* evaluation: encoding a test split's images and captions at each `execution.eval_batch_size`
  candidate (captions length-sorted, each batch trimmed to its longest: smaller batches waste less
  padding on long captions), for a DOCCI-like split and Long-DCI's full-length captions;
* the gradient probe (`hnclip.training.probe`) on a 16-pair micro-batch, with and without its bf16
  L_CLIP measurement (`execution.grad_probe_bf16_every`);
* one resume checkpoint (model + AdamW state) written atomically.

Median seconds over --repeats; one JSON line appended to benchmarks/results/run_overheads.jsonl.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "run_overheads.jsonl"
MODEL_CONFIG = "hnclip-tiny-w128"
SPLITS = {"docci_test": ("docci", "test"), "long_dci_test": ("dci", "test_long")}


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up: allocator and first-call costs
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return round(statistics.median(times), 3)


def measure(repeats: int, test_size: int, batch_sizes: list[int], model_config: str = MODEL_CONFIG) -> dict:
    from hnclip.data.loader import PairDataset
    from hnclip.data.synthetic import write_dataset
    from hnclip.evaluation.retrieval import encode_images, encode_texts
    from hnclip.models.factory import create
    from hnclip.training.checkpoint import save_checkpoint
    from hnclip.training.frameworks import TrainedModel
    from hnclip.training.probe import GradientProbe
    from hnclip.training.state import LoopState

    torch.set_num_threads(1)
    torch.manual_seed(0)
    backbone = create(model_config)
    model = backbone.model
    out: dict = {"eval_s": {}, "probe_s": {}}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        generator = {"style": "simple", "family_size": 2}  # the embedded default's captions
        manifests = {name: write_dataset(root / variant, variant, {"test": test_size}, seed=0,
                                         generator=generator)[split]
                     for name, (variant, split) in SPLITS.items()}
        model.eval()
        for name, manifest in manifests.items():
            data = PairDataset.from_manifest(manifest, backbone.preprocess, backbone.tokenizer)
            out["eval_s"][name] = {
                str(size): {"images": median_seconds(lambda: encode_images(model, data, size, "cpu"), repeats),
                            "captions": median_seconds(lambda: encode_texts(model, data, size, "cpu"), repeats)}
                for size in batch_sizes}
        model.train()
        data = PairDataset.from_manifest(manifests["docci_test"], backbone.preprocess, backbone.tokenizer)
        images, tokens = data.batch(range(min(16, len(data))))  # the embedded micro-batch
        parameters = list(model.parameters())
        probe = GradientProbe.from_settings({"grad_probe_every": 1}, {"framework": "full", "gamma": 0.5,
                                                                "lambda_tok": 0.0, "g_source": "live"})
        for with_bf16 in (True, False):
            out["probe_s"]["with_bf16" if with_bf16 else "without_bf16"] = median_seconds(
                lambda: probe.measure(model, parameters, images, tokens, with_bf16=with_bf16), repeats)
        trained = TrainedModel.build(model, "full", None)
        optimizer = torch.optim.AdamW(parameters, lr=1e-5)
        sum(p.sum() for p in parameters).backward()
        optimizer.step()  # AdamW's moments exist, as in a checkpoint written after a step
        out["resume_checkpoint_s"] = median_seconds(
            lambda: save_checkpoint(root / "ckpt", "0" * 64, trained, optimizer, LoopState(step=1)), repeats)
        out["resume_checkpoint_mb"] = round((root / "ckpt" / "last.pt").stat().st_size / 1e6, 1)
    return out


def main(argv: list[str] | None = None) -> dict:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from command1_costs import _commit, append_record, gemm_gflops, utc_now
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--test-size", type=int, default=300, help="pairs per test split (the embedded default: 300)")
    parser.add_argument("--batch-sizes", default="200,64,32,16", help="eval batch sizes to time, comma-separated")
    parser.add_argument("--model-config", default=MODEL_CONFIG, help="an hnclip model config")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    with contextlib.redirect_stderr(sys.stdout):  # open_clip's "no pretrained weights" warning
        gflops = gemm_gflops()
    return append_record(args.out, {
        "benchmark": "run_overheads", "timestamp": utc_now(), "commit": _commit(ROOT),
        "model_config": args.model_config, "threads": 1, "repeats": args.repeats, "test_size": args.test_size,
        "gemm_gflops_1thread": gflops,
        **measure(args.repeats, args.test_size, [int(b) for b in args.batch_sizes.split(",")], args.model_config)})

if __name__ == "__main__":
    main()
