"""Caption-geometry report: paper Table A1 and Figs. 1, A5, A6 from the per-benchmark stats records.

Input everywhere is ``stats``: {benchmark: the JSON written by ``hnclip.commands.stats.caption_statistics``
(``results/stats/<benchmark>.json``)} and ``labels``: {benchmark: printed name}. Benchmarks are drawn in
``labels`` order, then any others in ``stats`` order. The records only see the test split, so Table A1's
#train comes in separately (``train_counts``).

Outside the ``paper`` profile the similarities come from the embedded backbone on synthetic captions,
not from the pre-trained Long-CLIP-L text encoder on the real benchmarks; every output says so.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Iterable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from hnclip.config import paths  # noqa: E402
from hnclip.io import atomic_path, read_json, write_text  # noqa: E402
from hnclip.report.render import Band, Block, Cell, Column, latex_tabular, markdown_blocks  # noqa: E402

TABLE = "tableA1"
PAPER_ENCODER = "Long-CLIP-L"
# (metric key as in paper_tables.yaml, column header)
A1_METRICS = (("n_train", "#train"), ("n_test", "#test"), ("words", "words"),
              ("pairwise_sim", "pairwise sim"), ("hardest_sim", "hardest sim"))
A1_COLUMNS = ["table", "benchmark", "label", "metric", "ours", "paper", "delta", "train_set", "encoder"]
# Decimals per metric: ours is measured, so it gets one more than the paper prints.
OURS_DECIMALS = {"n_train": 0, "n_test": 0, "words": 1, "pairwise_sim": 3, "hardest_sim": 3}
PAPER_DECIMALS = {"n_train": 0, "n_test": 0, "words": 0, "pairwise_sim": 2, "hardest_sim": 2}
REQUIRED_KEYS = ("n_captions", "mean_pairwise_cosine", "mean_hardest_negative_cosine", "lengths",
                 "pairwise_histogram", "hardest_histogram", "example_batch", "in_batch_buckets")


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------

def load_stats(benchmarks: Iterable[str]) -> dict[str, dict]:
    """{benchmark: results/stats/<benchmark>.json} for the given benchmarks."""
    return {bench: read_json(paths.stats(bench)) for bench in benchmarks}


def check_stats(stats: dict[str, dict]) -> None:
    """Fail early, naming the benchmark, on records written before a field existed."""
    if not stats:
        raise ValueError("no caption statistics given")
    for bench, record in stats.items():
        missing = [key for key in REQUIRED_KEYS if key not in record]
        if missing:
            raise ValueError(f"stats for {bench!r} lack {missing}; rerun `hnclip stats` for it")


def benchmark_order(stats: dict[str, dict], labels: dict[str, str]) -> list[str]:
    return [b for b in labels if b in stats] + [b for b in stats if b not in labels]


def _encoder(stats: dict[str, dict]) -> str:
    names = sorted({str(record.get("backbone", "unknown")) for record in stats.values()})
    return ", ".join(names)


def _paper_a1() -> pd.DataFrame:
    from hnclip.report.paper_reference import paper_table
    return paper_table(TABLE)[["benchmark", "metric", "value"]].rename(columns={"value": "paper"})


# ---------------------------------------------------------------------------------------------
# Table A1
# ---------------------------------------------------------------------------------------------

def _measured(record: dict, n_train: float) -> dict[str, float]:
    return {"n_train": n_train, "n_test": float(record["n_captions"]),
            "words": float(record["lengths"]["mean_words"]),
            "pairwise_sim": float(record["mean_pairwise_cosine"]),
            "hardest_sim": float(record["mean_hardest_negative_cosine"])}


def table_a1(stats: dict[str, dict], train_counts: dict[str, int], labels: dict[str, str], profile: str,
             train_sets: dict[str, str] | None = None) -> pd.DataFrame:
    """Tidy Table A1: one row per (benchmark, metric) with our value, the paper's and the delta.

    ``train_counts``: {benchmark: rows of the training manifest its models are fine-tuned on}; a
    benchmark without one gets NaN. ``train_sets`` (optional): {benchmark: training dataset name}, shown
    where a benchmark trains on another set (Long-DCI on DCI, Urban-1K on VG). ``profile`` is recorded so
    the CSV says which encoder the similarities come from.
    """
    check_stats(stats)
    train_sets = train_sets or {}
    rows = []
    for bench in benchmark_order(stats, labels):
        values = _measured(stats[bench], float(train_counts.get(bench, math.nan)))
        rows += [{"table": TABLE, "benchmark": bench, "label": labels.get(bench, bench), "metric": metric,
                  "ours": values[metric], "train_set": train_sets.get(bench, bench),
                  "encoder": str(stats[bench].get("backbone", "unknown"))}
                 for metric, _ in A1_METRICS]
    frame = pd.DataFrame(rows).merge(_paper_a1(), on=["benchmark", "metric"], how="left")
    frame["delta"] = frame["ours"] - frame["paper"]
    frame["profile"] = profile
    return frame[A1_COLUMNS + ["profile"]]


def _cell(frame: pd.DataFrame, bench: str, metric: str) -> pd.Series:
    return frame[(frame["benchmark"] == bench) & (frame["metric"] == metric)].iloc[0]


def _number(value: float, decimals: int, signed: bool = False) -> str:
    if value is None or math.isnan(value):
        return "–"
    return f"{value:+.{decimals}f}" if signed else f"{value:.{decimals}f}"


def _a1_text(cell: pd.Series, block: str) -> str:
    metric = cell["metric"]
    if block == "delta":
        return _number(cell["delta"], OURS_DECIMALS[metric], signed=True)
    if block == "paper":
        text = _number(cell["paper"], PAPER_DECIMALS[metric])
    else:
        text = _number(cell["ours"], OURS_DECIMALS[metric])
    if metric == "n_train" and cell["train_set"] != cell["benchmark"] and text != "–":
        text += f" ({cell['train_set']})"  # the set its models train on, as the paper's "(VG)"
    return text


def _a1_blocks(frame: pd.DataFrame) -> Iterable[tuple[str, list[tuple[str, list[str]]]]]:
    """(block, [(row label, cells)]) for the reproduced, paper and delta blocks."""
    benchmarks = list(dict.fromkeys(frame["benchmark"]))
    for block in ("ours", "paper", "delta"):
        lines = []
        for bench in benchmarks:
            label = _cell(frame, bench, A1_METRICS[0][0])["label"]
            lines.append((label, [_a1_text(_cell(frame, bench, metric), block) for metric, _ in A1_METRICS]))
        yield block, lines


def _a1_block_titles(frame: pd.DataFrame, profile: str) -> dict[str, str]:
    encoder = ", ".join(dict.fromkeys(frame["encoder"]))
    return {"ours": f"Reproduced ({profile} profile; text encoder {encoder})",
            "paper": f"Paper (pre-trained {PAPER_ENCODER} text encoder, real benchmarks)",
            "delta": "Δ = reproduced − paper"}


def _a1_caveat(frame: pd.DataFrame, profile: str) -> list[str]:
    if profile == "paper":
        return []
    encoder = ", ".join(dict.fromkeys(frame["encoder"]))
    return [f"The reproduced similarities use the embedded backbone (`{encoder}`) on the synthetic "
            f"benchmarks, NOT the pre-trained {PAPER_ENCODER} text encoder on the real ones; counts and "
            "lengths are the miniature's. Compare the pattern (hardest negatives far above the mean "
            "pairwise similarity on every benchmark), not the values."]


def _a1_band(frame: pd.DataFrame, titles: dict[str, str]) -> Band:
    columns = [Column(header) for _, header in A1_METRICS]
    return Band(columns, [Block(titles[block], [(label, [Cell(text) for text in cells]) for label, cells in lines])
                          for block, lines in _a1_blocks(frame)])


def table_a1_markdown(frame: pd.DataFrame, profile: str) -> str:
    out = ["# Table A1: Benchmark statistics", "",
           "Mean caption length in words and caption–caption cosine similarities on each benchmark's "
           "evaluation split; #train counts the training manifest its models are fine-tuned on.", ""]
    out += [f"> {line}" for line in _a1_caveat(frame, profile)] + ([""] if profile != "paper" else [])
    return "\n".join(out + markdown_blocks("Benchmark", _a1_band(frame, _a1_block_titles(frame, profile))))


def table_a1_latex(frame: pd.DataFrame, profile: str) -> str:
    out = [f"% Table A1 (benchmark statistics) -- generated by hnclip; profile {profile}"]
    out += [f"% {line}" for line in _a1_caveat(frame, profile)]
    out += latex_tabular("Benchmark", [_a1_band(frame, _a1_block_titles(frame, profile))], size="small")
    return "\n".join(out) + "\n"


def write_table_a1(frame: pd.DataFrame, profile: str, out_stem: Path | None = None) -> list[Path]:
    """tableA1.csv / .md / .tex, each written atomically; default location results/tables/."""
    stem = Path(out_stem) if out_stem is not None else paths.table(TABLE, "csv").with_suffix("")
    outputs = {ext: stem.with_name(f"{stem.name}.{ext}") for ext in ("csv", "md", "tex")}
    write_text(outputs["csv"], frame.to_csv(index=False))
    write_text(outputs["md"], table_a1_markdown(frame, profile))
    write_text(outputs["tex"], table_a1_latex(frame, profile))
    return list(outputs.values())


# ---------------------------------------------------------------------------------------------
# Figure helpers
# ---------------------------------------------------------------------------------------------

def save_figure(fig: Figure, out_stem: Path) -> list[Path]:
    """PNG and PDF next to each other, each written whole or not at all; closes the figure."""
    outputs = [Path(out_stem).with_suffix(".png"), Path(out_stem).with_suffix(".pdf")]
    try:
        for path in outputs:
            with atomic_path(path) as tmp:
                # No creation date in the PDF: the same stats give the same bytes.
                metadata = {"Creator": "hnclip"} if path.suffix == ".png" else {"Creator": "hnclip",
                                                                                 "CreationDate": None}
                fig.savefig(tmp, format=path.suffix[1:], dpi=150, metadata=metadata)
    finally:
        plt.close(fig)
    return outputs


def benchmark_colours(benchmarks: list[str]) -> dict[str, tuple]:
    """One colour per benchmark, the same in every figure."""
    palette = plt.get_cmap("tab10").colors
    return {bench: palette[i % len(palette)] for i, bench in enumerate(benchmarks)}


def _encoder_note(stats: dict[str, dict]) -> str:
    return f"text encoder: {_encoder(stats)}; test captions"


# ---------------------------------------------------------------------------------------------
# Fig. 1: distributions of pairwise and hardest-negative similarities
# ---------------------------------------------------------------------------------------------

FIG1_PANELS = (("pairwise_histogram", "mean_pairwise_cosine", "(a) all pairwise caption similarities"),
               ("hardest_histogram", "mean_hardest_negative_cosine", "(b) each caption's hardest negative"))


def histogram_density(histogram: dict) -> tuple[np.ndarray, np.ndarray]:
    """(density, edges): counts rescaled so every benchmark integrates to 1 whatever its size."""
    counts = np.asarray(histogram["counts"], dtype=float)
    edges = np.asarray(histogram["edges"], dtype=float)
    total = counts.sum()
    return (counts / (total * np.diff(edges)) if total else counts), edges


def occupied_range(histograms: list[dict]) -> tuple[float, float]:
    """x-range covering every non-empty bin, one bin of margin each side (the bins span [-1, 1])."""
    lows, highs = [], []
    for histogram in histograms:
        edges = np.asarray(histogram["edges"], dtype=float)
        filled = np.nonzero(np.asarray(histogram["counts"]))[0]
        if filled.size:
            lows.append(edges[max(filled[0] - 1, 0)])
            highs.append(edges[min(filled[-1] + 2, len(edges) - 1)])
    return (min(lows), max(highs)) if lows else (-1.0, 1.0)


def draw_figure_1(stats: dict[str, dict], labels: dict[str, str]) -> Figure:
    check_stats(stats)
    order = benchmark_order(stats, labels)
    colours = benchmark_colours(order)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), constrained_layout=True)
    for ax, (hist_key, mean_key, title) in zip(axes, FIG1_PANELS):
        for bench in order:
            density, edges = histogram_density(stats[bench][hist_key])
            mean = stats[bench][mean_key]
            ax.stairs(density, edges, color=colours[bench], linewidth=1.6,
                      label=f"{labels.get(bench, bench)} (mean {mean:.2f})")
            ax.axvline(mean, color=colours[bench], linestyle=":", linewidth=1.4)
        ax.set_xlim(*occupied_range([stats[b][hist_key] for b in order]))
        ax.set_title(title)
        ax.set_xlabel("caption–caption cosine similarity")
        ax.set_ylabel("density")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Caption–caption similarity distributions ({_encoder_note(stats)}; dotted lines: means)",
                 fontsize=9)
    return fig


def figure_1(stats: dict[str, dict], labels: dict[str, str], out_stem: Path) -> list[Path]:
    return save_figure(draw_figure_1(stats, labels), out_stem)


# ---------------------------------------------------------------------------------------------
# Fig. A5: one B=8 caption-similarity matrix per benchmark
# ---------------------------------------------------------------------------------------------

def masked_g(record: dict) -> np.ma.MaskedArray:
    """The example batch's G with its diagonal (the positives, which the loss never boosts) masked."""
    matrix = np.asarray(record["example_batch"]["G"], dtype=float)
    return np.ma.masked_array(matrix, mask=np.eye(len(matrix), dtype=bool))


def max_off_diagonal(record: dict) -> tuple[int, int, float]:
    """(row, column, value) of the largest off-diagonal entry of the example batch's G."""
    g = masked_g(record)
    row, col = np.unravel_index(np.ma.argmax(g), g.shape)
    return int(row), int(col), float(g[row, col])


def _offdiag_mean(record: dict) -> float:
    return float(record["example_batch"].get("offdiag_mean", masked_g(record).mean()))


def _annotate_max(ax, record: dict, dark_from: float) -> None:
    row, col, value = max_off_diagonal(record)
    ax.add_patch(Rectangle((col - 0.5, row - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2))
    ax.text(col, row, f"{value:.2f}", ha="center", va="center", fontsize=7, fontweight="bold",
            color="white" if value >= dark_from else "black", gid="max_off_diagonal")


def draw_figure_a5(stats: dict[str, dict], labels: dict[str, str]) -> Figure:
    check_stats(stats)
    order = benchmark_order(stats, labels)
    matrices = {bench: masked_g(stats[bench]) for bench in order}
    # One colour scale for all panels, so equal shades mean equal similarity across benchmarks.
    vmin = min(float(g.min()) for g in matrices.values())
    vmax = max(float(g.max()) for g in matrices.values())
    cmap = plt.get_cmap("Blues").with_extremes(bad="lightgray")  # bad = the masked diagonal
    fig, axes = plt.subplots(1, len(order), figsize=(3.0 * len(order) + 1.2, 3.5), constrained_layout=True,
                             squeeze=False)
    for ax, bench in zip(axes[0], order):
        image = ax.imshow(matrices[bench], cmap=cmap, vmin=vmin, vmax=vmax)
        _annotate_max(ax, stats[bench], dark_from=(vmin + vmax) / 2)
        ax.set_title(f"{labels.get(bench, bench)}\noff-diagonal mean {_offdiag_mean(stats[bench]):.2f}",
                     fontsize=9)
        ax.set_xticks(range(matrices[bench].shape[0]))
        ax.set_yticks(range(matrices[bench].shape[0]))
        ax.tick_params(labelsize=7)
    fig.colorbar(image, ax=axes[0].tolist(), shrink=0.85, label="caption cosine  $\\bar G_{ij}$")
    fig.suptitle(f"One batch (B={matrices[order[0]].shape[0]}) per benchmark: caption-similarity matrix "
                 f"(diagonal masked, max annotated; {_encoder_note(stats)})", fontsize=9)
    return fig


def figure_a5(stats: dict[str, dict], labels: dict[str, str], out_stem: Path) -> list[Path]:
    return save_figure(draw_figure_a5(stats, labels), out_stem)


# ---------------------------------------------------------------------------------------------
# Fig. A6: mean similarities and in-batch hardness composition
# ---------------------------------------------------------------------------------------------

def bucket_labels(edges: list[float]) -> list[str]:
    """'< 0.5', '0.5–0.7', ..., '≥ 0.9' for the in-batch hardness buckets."""
    labels = []
    for i, (low, high) in enumerate(zip(edges[:-1], edges[1:])):
        if i == 0 and low <= -1.0:
            labels.append(f"< {high:g}")
        elif i == len(edges) - 2 and high >= 1.0:
            labels.append(f"≥ {low:g}")
        else:
            labels.append(f"{low:g}–{high:g}")
    return labels


def _paper_sims() -> dict[tuple[str, str], float]:
    paper = _paper_a1()
    return {(b, m): v for b, m, v in zip(paper["benchmark"], paper["metric"], paper["paper"])}


def _mean_bars(ax, stats: dict[str, dict], labels: dict[str, str], order: list[str], key: str, metric: str,
               title: str, paper: dict | None) -> None:
    colours = benchmark_colours(order)
    values = [stats[b][key] for b in order]
    bars = ax.bar(range(len(order)), values, color=[colours[b] for b in order])
    ax.bar_label(bars, labels=[f"{v:.2f}" for v in values], fontsize=8)
    if paper:
        xs = [i for i, b in enumerate(order) if (b, metric) in paper]
        ax.scatter(xs, [paper[(order[i], metric)] for i in xs], marker="D", color="black", zorder=3,
                   label=f"paper ({PAPER_ENCODER})")
        if xs:
            ax.legend(fontsize=8, loc="upper left")
    ax.set_xticks(range(len(order)), [labels.get(b, b) for b in order])
    ax.set_ylim(min(0.0, min(values)), 1.15)  # headroom for the bar labels and the legend
    ax.set_ylabel("cosine similarity")
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)


def _bucket_stack(ax, stats: dict[str, dict], labels: dict[str, str], order: list[str]) -> None:
    edges = stats[order[0]]["in_batch_buckets"]["edges"]
    names = bucket_labels(edges)
    shares = np.array([stats[b]["in_batch_buckets"]["shares"] for b in order]) * 100.0
    shades = plt.get_cmap("Purples")(np.linspace(0.2, 0.95, len(names)))  # darker = harder
    bottom = np.zeros(len(order))
    for k, name in enumerate(names):
        ax.bar(range(len(order)), shares[:, k], bottom=bottom, color=shades[k], label=name)
        bottom += shares[:, k]
    for i, bench in enumerate(order):
        hard = 100.0 * stats[bench].get("in_batch_share_ge_0.8", math.nan)
        ax.text(i, 101, f"≥0.8: {hard:.0f}%", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(order)), [labels.get(b, b) for b in order])
    ax.set_ylim(0, 110)
    ax.set_ylabel("share of in-batch negatives (%)")
    batch = stats[order[0]].get("batch_size", "?")
    ax.set_title(f"(C) in-batch negatives by caption similarity (B={batch})")
    ax.legend(title="$\\bar G_{ij}$", fontsize=7, title_fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))


def draw_figure_a6(stats: dict[str, dict], labels: dict[str, str], show_paper: bool = True) -> Figure:
    check_stats(stats)
    order = benchmark_order(stats, labels)
    buckets = {tuple(stats[b]["in_batch_buckets"]["edges"]) for b in order}
    if len(buckets) > 1:
        raise ValueError(f"benchmarks use different hardness buckets {sorted(buckets)}; rerun `hnclip stats`")
    paper = _paper_sims() if show_paper else None
    fig, (ax_a, ax_b, ax_c) = plt.subplots(1, 3, figsize=(14, 4), constrained_layout=True)
    _mean_bars(ax_a, stats, labels, order, "mean_pairwise_cosine", "pairwise_sim",
               "(A) mean pairwise caption similarity", paper)
    _mean_bars(ax_b, stats, labels, order, "mean_hardest_negative_cosine", "hardest_sim",
               "(B) mean hardest-negative similarity", paper)
    _bucket_stack(ax_c, stats, labels, order)
    fig.suptitle(f"Caption geometry across benchmarks ({_encoder_note(stats)})", fontsize=9)
    return fig


def figure_a6(stats: dict[str, dict], labels: dict[str, str], out_stem: Path,
              show_paper: bool = True) -> list[Path]:
    return save_figure(draw_figure_a6(stats, labels, show_paper), out_stem)


FIGURES = {"fig1": figure_1, "figA5": figure_a5, "figA6": figure_a6}
