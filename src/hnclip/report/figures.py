"""Figures (PNG and PDF): from a table's tidy frame or from the per-epoch evaluation records."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from hnclip.report.geometry import save_figure  # noqa: E402


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
    return save_figure(fig, out_stem)


# ---- figures from per-epoch evaluation records ---------------------------------------------------
def _per_epoch(cell, direction: str | None) -> dict[int, float]:
    """Epoch -> R@1 (one direction, or the mean of both) of one cell, epoch 0 = before fine-tuning."""
    from hnclip.config import paths
    from hnclip.io import read_json
    record = read_json(paths.evaluation(cell.run_id, cell.benchmark))

    def r1(metrics):
        return metrics[direction]["R@1"] if direction else (metrics["t2i"]["R@1"] + metrics["i2t"]["R@1"]) / 2
    curve = {entry["epoch"]: r1(entry["metrics"]) for entry in record["per_epoch"]}
    if record.get("initial"):
        curve[0] = r1(record["initial"])
    return curve


def _mean_curve(cells, benchmark: str, direction: str | None) -> tuple[list[int], list[float]]:
    curves = [_per_epoch(c, direction) for c in cells if c.benchmark == benchmark]
    epochs = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
    return epochs, [sum(c[e] for c in curves) / len(curves) for e in epochs]


def convergence(reg, spec: dict, out_stem: Path, by_direction: bool = False) -> list[Path]:
    """Paper Fig. 5 (mean R@1 per epoch) or Fig. A9 (one panel row per direction); epoch 0 is the
    initial backbone; curves average the cell's seeds."""
    series = reg.figure_series(spec)
    benchmarks = list(dict.fromkeys(c.benchmark for cells in series.values() for c in cells))
    directions = ["t2i", "i2t"] if by_direction else [None]
    fig, axes = plt.subplots(len(directions), len(benchmarks), squeeze=False, constrained_layout=True,
                             figsize=(3.2 * len(benchmarks), 3.0 * len(directions)))
    labels = {name: b["label"] for name, b in reg.params["benchmarks"].items()}
    for i, direction in enumerate(directions):
        for j, bench in enumerate(benchmarks):
            ax = axes[i][j]
            for label, cells in series.items():
                epochs, values = _mean_curve(cells, bench, direction)
                if epochs:
                    ax.plot(epochs, values, marker="o", markersize=3, label=label)
            name = {"t2i": "T→I ", "i2t": "I→T "}.get(direction, "")
            ax.set_title(f"{labels.get(bench, bench)} {name}".strip(), fontsize=9)
            ax.set_xlabel("epoch (0 = initial)")
            ax.set_ylabel("R@1 (%)" if direction else "mean R@1 (%)")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{spec.get('title', 'Convergence')} — {reg.profile_name} profile", fontsize=10)
    return save_figure(fig, out_stem)


def sample_efficiency(reg, spec: dict, out_stem: Path) -> list[Path]:
    """Paper Fig. 6: mean R@1 against the training fraction (identical nested subsets), reproduced
    beside the paper's Table A9 values."""
    from hnclip.report.paper_reference import paper_table
    table = spec["table"]
    cells = [c for c in reg.cells(table) if c.run_id]
    paper = paper_table(table)
    fig, (ax_ours, ax_paper) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    for bench in dict.fromkeys(c.benchmark for c in reg.cells(table)):
        by_method: dict[str, dict[float, list[float]]] = {}
        for cell in (c for c in cells if c.benchmark == bench):
            fraction = dict(cell.settings).get("fraction", 1.0)
            final = _per_epoch(cell, None)
            by_method.setdefault(cell.method, {}).setdefault(fraction, []).append(max(
                v for e, v in final.items() if e > 0) if spec.get("selection", "best") == "best" else final[max(final)])
        for method, points in by_method.items():
            xs = sorted(points)
            ax_ours.plot([100 * x for x in xs], [sum(points[x]) / len(points[x]) for x in xs], marker="o",
                         label=f"{bench}: {method}")
        ref = paper[(paper["benchmark"] == bench) & (paper["metric"] == "R@1")]
        for method in sorted({row.split("/")[-1] for row in ref["row"]}):
            rows = ref[ref["row"].str.endswith(f"/{method}")]
            means = rows.groupby("row", sort=False)["value"].mean()
            xs = [float(r.split("/")[1].rstrip("%")) for r in means.index]
            ax_paper.plot(xs, means.values, marker="s", linestyle="--", label=f"{bench}: {method}")
    for ax, title in ((ax_ours, f"Reproduced ({reg.profile_name} profile; best epoch, seed mean)"),
                      (ax_paper, "Paper (Table A9)")):
        ax.set_xscale("log")
        ax.set_xticks([5, 20, 50, 100], labels=["5%", "20%", "50%", "100%"])
        ax.set_xlabel("training data")
        ax.set_ylabel("mean R@1 (%)")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return save_figure(fig, out_stem)


# ---- gradient dynamics (paper Fig. 4, A8) from the runs' grad_probe.jsonl ----------------------
CLAMP = 1e-10  # exact zeros are plotted clamped, as in the paper


def _probe_records(run_id: str) -> list[dict]:
    from hnclip.config import paths
    from hnclip.io import read_jsonl
    path = paths.run_dir(run_id) / "grad_probe.jsonl"
    return read_jsonl(path) if path.exists() else []


def _clamped(values) -> list[float]:
    return [max(CLAMP, v) for v in values]


def gradient_dynamics(reg, spec: dict, out_stem: Path) -> list[Path]:
    """Both losses, both full-parameter gradient norms and their cosine at every probe, and the
    per-epoch share of batches each loss leaves below 1e-3 (saturated)."""
    runs = sorted({c.run_id for c in reg.figure_cells(spec)})
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6), constrained_layout=True)
    for run_id in runs:
        records = _probe_records(run_id)
        if not records:
            continue
        steps = [r["step"] for r in records]
        seed = run_id.split("-s")[-1].split("-")[0]
        axes[0].semilogy(steps, _clamped(r["clip_loss"] for r in records), "o-", ms=3, label=f"L_CLIP s{seed}")
        axes[0].semilogy(steps, _clamped(r["hn_loss"] for r in records), "s--", ms=3, label=f"L_HN s{seed}")
        axes[1].semilogy(steps, _clamped(r["clip_grad_norm"] for r in records), "o-", ms=3, label=f"‖∇L_CLIP‖ s{seed}")
        axes[1].semilogy(steps, _clamped(r["hn_grad_norm"] for r in records), "s--", ms=3, label=f"‖∇L_HN‖ s{seed}")
        axes[2].plot(steps, [r["grad_cosine"] if r["grad_cosine"] is not None else float("nan") for r in records],
                     "o-", ms=3, label=f"s{seed}")
        epochs = sorted({r["epoch"] for r in records})
        for key, marker in (("clip_loss", "o-"), ("hn_loss", "s--")):
            share = [sum(r[key] < 1e-3 for r in records if r["epoch"] == e) /
                     sum(1 for r in records if r["epoch"] == e) for e in epochs]
            axes[3].plot(epochs, share, marker, label=f"{key.split('_')[0].upper()} s{seed}")
    axes[0].axhline(1e-3, color="gray", linestyle=":", linewidth=1)
    titles = ("(a) loss on the probed batch", f"(b) gradient norm (exact 0 → {CLAMP:g})",
              "(c) cosine(∇L_CLIP, ∇L_HN)", "(d) share of probes with loss < 1e-3")
    for ax, title in zip(axes, titles):
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("optimizer step" if ax is not axes[3] else "epoch")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    axes[3].set_ylim(-0.05, 1.05)
    fig.suptitle(f"{spec['title']} — {reg.profile_name} profile", fontsize=10)
    return save_figure(fig, out_stem)


def gradient_dynamics_grid(reg, spec: dict, out_stem: Path) -> list[Path]:
    """Fig. A8: the gradient-norm panel of Fig. 4 for every run of a table (e.g. the data fractions)."""
    cells = sorted({(c.row, c.run_id) for c in reg.figure_cells(spec)})
    fig, axes = plt.subplots(1, max(1, len(cells)), figsize=(3.2 * max(1, len(cells)), 3), squeeze=False,
                             constrained_layout=True)
    for ax, (row, run_id) in zip(axes[0], cells):
        records = _probe_records(run_id)
        steps = [r["step"] for r in records]
        ax.semilogy(steps, _clamped(r["clip_grad_norm"] for r in records), "o-", ms=3, label="‖∇L_CLIP‖")
        ax.semilogy(steps, _clamped(r["hn_grad_norm"] for r in records), "s--", ms=3, label="‖∇L_HN‖")
        ax.set_title(row, fontsize=8)
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{spec['title']} — {reg.profile_name} profile", fontsize=10)
    return save_figure(fig, out_stem)


def gamma_sweep_figure(reg, spec: dict, out_stem: Path) -> list[Path]:
    import pandas as pd

    from hnclip.config import paths
    frame = pd.read_csv(paths.table(spec["table"], "csv"))
    labels = {name: b["label"] for name, b in reg.params["benchmarks"].items()}
    return gamma_sweep(frame, labels, out_stem, reg.profile_name)


def _geometry(name: str):
    """Caption-geometry figures (Figs. 1, A5, A6) from the benchmarks' results/stats records."""
    def draw_geometry(reg, spec: dict, out_stem: Path) -> list[Path]:
        from hnclip.report import geometry
        labels = {b: s["label"] for b, s in reg.params["benchmarks"].items()}
        return geometry.FIGURES[name](geometry.load_stats(reg.params["benchmarks"]), labels, out_stem)
    return draw_geometry


FIGURE_KINDS = {
    "caption_geometry": _geometry("fig1"),
    "batch_margin_matrix": _geometry("figA5"),
    "caption_geometry_stats": _geometry("figA6"),
    "gamma_sweep": gamma_sweep_figure,
    "convergence": convergence,
    "convergence_by_direction": lambda reg, spec, out: convergence(reg, spec, out, by_direction=True),
    "sample_efficiency": sample_efficiency,
    "gradient_dynamics": gradient_dynamics,
    "gradient_dynamics_grid": gradient_dynamics_grid,
}


def draw(reg, name: str) -> list[Path]:
    from hnclip.config import paths
    spec = reg.params["figures"][name]
    return FIGURE_KINDS[spec["kind"]](reg, spec, paths.figure(name, "png").with_suffix(""))
