"""Where every artifact lives, relative to the project root. The Snakefile and the CLI both ask here."""
from __future__ import annotations

from pathlib import Path

RESULTS = Path("results")
FIGURES = Path("figures")
CHECKPOINTS = Path(".cache/checkpoints")  # outside Snakemake's outputs: survives a failed job
EVAL_CACHE = Path(".cache/initial_eval")  # evaluations of initial weights, shared by the runs that start from them
LOGS = Path("logs")


def curves_dir(profile: str, run_id: str) -> Path:
    """A run's TensorBoard curves: `tensorboard --logdir logs/<profile>` shows the profile's runs side by side."""
    return LOGS / profile / run_id


def manifest(data_root: str, dataset: str, split: str) -> Path:
    return Path(data_root) / dataset / f"{split}.jsonl"


def dataset_dir(data_root: str, dataset: str) -> Path:
    return Path(data_root) / dataset


def auxiliary_dir(data_root: str, dataset: str, kind: str) -> Path:
    """A training set's auxiliary inputs of one kind (segments: GOAL's LISM pairs; edges)."""
    return Path(data_root) / dataset / "auxiliary" / kind


def auxiliary_index(data_root: str, dataset: str, kind: str) -> Path:
    """The JSONL index of an auxiliary input (one row per training image)."""
    return auxiliary_dir(data_root, dataset, kind) / f"{kind}.jsonl"


def shard_dir(output: str | Path) -> Path:
    """The resume area of a sharded build of `output` (`<output>.shards/`, beside it): not a Snakemake
    output, so it survives a failed job; removed once `output` is written (hnclip.auxiliary.shards)."""
    output = Path(output)
    return output.with_name(output.name + ".shards")


def backbone_dir(name: str) -> Path:
    """A backbone pretrained here is a run of its own: model.pt, train.json, steps.jsonl."""
    return RESULTS / "backbones" / name


def backbone_weights(name: str, kind: str, data_root: str) -> Path:
    if kind == "longclip":
        return Path(data_root) / "longclip_l" / "raw" / "longclip-L.pt"  # where `hnclip download` puts it
    return backbone_dir(name) / "model.pt"


def run_dir(run_id: str) -> Path:
    return RESULTS / "runs" / run_id


def run_model(run_id: str) -> Path:
    return run_dir(run_id) / "model.pt"


def run_selected_model(run_id: str) -> Path:
    """The weights of the epoch selected on the run's own training benchmark (its transfer cells)."""
    return run_dir(run_id) / "model_selected.pt"


def run_record(run_id: str) -> Path:
    return run_dir(run_id) / "train.json"


def run_steps(run_id: str) -> Path:
    """The run's step log: one line per optimizer step (loss terms, saturation shares, lr)."""
    return run_dir(run_id) / "steps.jsonl"


def checkpoint_dir(run_id: str) -> Path:
    return CHECKPOINTS / run_id


def evaluation(run_id: str, benchmark: str) -> Path:
    return RESULTS / "evals" / run_id / f"{benchmark}.json"


def stats(benchmark: str) -> Path:
    return RESULTS / "stats" / f"{benchmark}.json"


def step_timing() -> Path:
    """The timing table's paired, repeated step timings (hnclip.commands.step_timing)."""
    return RESULTS / "stats" / "step_timing.json"


def regime_report(ext: str) -> Path:
    """The regime preconditions report (json: values, verdicts, provenance; md: the same as a table)."""
    return RESULTS / "stats" / f"regime.{ext}"


def table(name: str, ext: str) -> Path:
    return RESULTS / "tables" / f"{name}.{ext}"


def figure(name: str, ext: str) -> Path:
    return FIGURES / f"{name}.{ext}"


def overlap_report(train: str, test: str) -> Path:
    return RESULTS / "overlap" / f"{train}__{test}.json"


def download_record(data_root: str, source: str) -> Path:
    """Written by `hnclip download` once every file of a source is verified."""
    return Path(data_root) / source / "download.json"


def subsets(data_root: str, dataset: str) -> Path:
    return Path(data_root) / dataset / "subsets.json"
