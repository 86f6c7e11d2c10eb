"""Figures (PNG and PDF) drawn from a table's tidy frame."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402


def gamma_sweep(frame: pd.DataFrame, benchmark_labels: dict[str, str], out_stem: Path, profile: str) -> list[Path]:
    """R@1 (mean of both directions) against gamma per benchmark: reproduced (seed range as error
    bars) beside the paper's values, on separate axes because the scales differ."""
    r1 = frame[(frame["metric"] == "R@1") & (frame["benchmark"] != "all")].copy()
    r1["gamma"] = r1["row"].str.split("=").str[1].astype(float)
    fig, (ax_ours, ax_paper) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    for bench, group in r1.groupby("benchmark", sort=False):
        by_gamma = group.groupby("gamma").agg(mean=("ours_mean", "mean"), lo=("ours_min", "mean"),
                                              hi=("ours_max", "mean"), paper=("paper", "mean")).reset_index()
        label = benchmark_labels.get(bench, bench)
        ax_ours.errorbar(by_gamma["gamma"], by_gamma["mean"], marker="o", capsize=3, label=label,
                         yerr=[by_gamma["mean"] - by_gamma["lo"], by_gamma["hi"] - by_gamma["mean"]])
        if by_gamma["paper"].notna().any():
            ax_paper.plot(by_gamma["gamma"], by_gamma["paper"], marker="s", linestyle="--", label=label)
    ax_ours.set_title(f"Reproduced ({profile} profile; bars: seed range)")
    ax_paper.set_title("Paper (Long-CLIP-L, real benchmarks)")
    for ax in (ax_ours, ax_paper):
        ax.set_xlabel("boost strength γ")
        ax.set_ylabel("R@1, mean of T→I and I→T (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    outputs = [out_stem.with_suffix(".png"), out_stem.with_suffix(".pdf")]
    out_stem.parent.mkdir(parents=True, exist_ok=True)
    for path in outputs:
        tmp = path.with_name(f".{path.stem}.part{path.suffix}")
        fig.savefig(tmp, dpi=150, metadata={"Creator": "hnclip"} if path.suffix == ".png" else None)
        tmp.replace(path)
    plt.close(fig)
    return outputs


FIGURES = {"gamma_sweep": gamma_sweep}
