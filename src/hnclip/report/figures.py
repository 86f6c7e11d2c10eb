"""Figures (PNG and PDF): from a table's tidy frame or from the per-epoch evaluation records."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from hnclip.config.cells import DIRECTION_LABELS  # noqa: E402
from hnclip.config.constants import STRONGEST_BASELINE_TABLE  # noqa: E402
from hnclip.report.geometry import benchmark_colours, save_figure  # noqa: E402


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


# Appendix E.5: Fig. 6's dotted line is the strongest machinery baseline (FineLIP, GOAL, StructXLIP)
# trained on all the data, read from Table 1 (the paper's: StructXLIP on DOCCI, GOAL on DCI).


def _mean_r1(frame: pd.DataFrame, value: str) -> pd.Series:
    """Row -> mean of the T→I and I→T R@1 cells of one benchmark's tidy table frame."""
    r1 = frame[(frame["metric"] == "R@1") & frame["direction"].isin(["t2i", "i2t"])]
    return r1.groupby("row", sort=False)[value].mean().dropna()


def strongest_baseline(reg, benchmark: str, table: str) -> dict:
    """The strongest of a table's machinery-baseline rows on one benchmark (highest mean R@1 of both
    directions, at the table's own epoch selection), reproduced and in the paper: {ours: (row,
    value) | None, paper: (row, value) | None, missing: [rows not implemented yet], labels: {row:
    method label}, table}. Reproduced values come from the table's CSV: the line is its cells."""
    from hnclip.config import paths
    from hnclip.config.constants import BASELINE_FRAMEWORKS
    from hnclip.report.paper_reference import paper_table
    cells = [c for c in reg.cells(table) if c.benchmark == benchmark
             and reg.params["methods"][c.method]["framework"] in BASELINE_FRAMEWORKS]
    rows = list(dict.fromkeys(c.row for c in cells))
    labels = {c.row: reg.params["methods"][c.method]["label"] for c in cells}
    implemented = {c.row for c in cells if c.run_id}
    ours = None
    if implemented:
        csv = paths.table(table, "csv")
        if not csv.exists():
            from hnclip.errors import UserError
            raise UserError(f"{csv} is missing: the strongest-baseline line reads its cells; build {table} first")
        frame = pd.read_csv(csv)
        means = _mean_r1(frame[(frame["benchmark"] == benchmark) & frame["row"].isin(implemented)], "ours_mean")
        ours = (means.idxmax(), float(means.max())) if len(means) else None
    paper = paper_table(table)
    paper_means = _mean_r1(paper[(paper["benchmark"] == benchmark) & paper["row"].isin(rows)], "value")
    return {"ours": ours, "paper": (paper_means.idxmax(), float(paper_means.max())) if len(paper_means) else None,
            "missing": [r for r in rows if r not in implemented], "labels": labels,
            "table": table}


def _reference_line(ax, bench_label: str, reference: dict, side: str, colour) -> None:
    """The dotted strongest-baseline line, or (nothing implemented) only a legend entry saying so."""
    chosen, table = reference[side], reference["table"]
    missing = ", ".join(reference["labels"][r] for r in reference["missing"])
    if chosen is None:
        ax.plot([], [], ":", color=colour, label=f"{bench_label}: strongest baseline at 100% — not implemented yet "
                                                 f"({missing})")
        return
    row, value = chosen
    note = f"; not implemented yet: {missing}" if side == "ours" and missing else ""
    ax.axhline(value, linestyle=":", linewidth=1.5, color=colour, gid="strongest_baseline",
               label=f"{bench_label}: strongest baseline at 100% ({reference['labels'].get(row, row)}, {table}{note})")


def sample_efficiency(reg, spec: dict, out_stem: Path) -> list[Path]:
    """Paper Fig. 6: mean R@1 against the training fraction (identical nested subsets), reproduced
    beside the paper's Table A9 values, each with the dotted line of the strongest baseline
    trained on all the data (Table 1)."""
    from hnclip.report.paper_reference import paper_table
    table = spec["table"]
    cells = [c for c in reg.cells(table) if c.run_id]
    paper = paper_table(table)
    labels = {name: b["label"] for name, b in reg.params["benchmarks"].items()}
    methods = list(dict.fromkeys(c.method for c in reg.cells(table)))
    styles = {m: ("o-", "s--", "^-.", "d:")[i % 4] for i, m in enumerate(methods)}
    benchmarks = list(dict.fromkeys(c.benchmark for c in reg.cells(table)))
    colours = benchmark_colours(benchmarks)
    fig, (ax_ours, ax_paper) = plt.subplots(1, 2, figsize=(10.5, 4.6), constrained_layout=True)
    for bench in benchmarks:
        by_method: dict[str, dict[float, list[float]]] = {}
        for cell in (c for c in cells if c.benchmark == bench):
            fraction = dict(cell.settings).get("fraction", 1.0)
            final = _per_epoch(cell, None)
            by_method.setdefault(cell.method, {}).setdefault(fraction, []).append(max(
                v for e, v in final.items() if e > 0) if spec.get("selection", "best") == "best" else final[max(final)])
        name = labels.get(bench, bench)
        for method, points in by_method.items():
            xs = sorted(points)
            ax_ours.plot([100 * x for x in xs], [sum(points[x]) / len(points[x]) for x in xs], styles[method],
                         color=colours[bench], label=f"{name}: {reg.params['methods'][method]['label']}")
        ref = paper[(paper["benchmark"] == bench) & (paper["metric"] == "R@1")]
        for method in dict.fromkeys(row.split("/")[-1] for row in ref["row"]):
            rows = ref[ref["row"].str.endswith(f"/{method}")]
            means = rows.groupby("row", sort=False)["value"].mean()
            xs = [float(r.split("/")[1].rstrip("%")) for r in means.index]
            ax_paper.plot(xs, means.values, styles.get(method, "x-"), color=colours[bench],
                          label=f"{name}: {reg.params['methods'].get(method, {}).get('label', method)}")
        reference = strongest_baseline(reg, bench, STRONGEST_BASELINE_TABLE)
        _reference_line(ax_ours, name, reference, "ours", colours[bench])
        _reference_line(ax_paper, name, reference, "paper", colours[bench])
    for ax, title in ((ax_ours, f"Reproduced ({reg.profile_name} profile; best epoch, seed mean)"),
                      (ax_paper, "Paper (Table A9)")):
        ax.set_xscale("log")
        ax.set_xticks([5, 20, 50, 100], labels=["5%", "20%", "50%", "100%"])
        ax.set_xlabel("training data")
        ax.set_ylabel("mean R@1 (%)")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    return save_figure(fig, out_stem)


# ---- gradient dynamics (paper Fig. 4, A8): probe logs + results/stats/<figure>.json ---------------
CLAMP = 1e-10  # exact zeros are plotted clamped, as in the paper
CLIP_COLOUR, HN_COLOUR = "dimgray", "deeppink"  # the paper's gray (L_CLIP) and pink (L_HN)
RUNNING_MEDIAN_WINDOW = 5  # measurements per running median (Fig. A8's thick traces)
CAPTION_FONT = 7.5  # points


def _clamped(values) -> list[float]:
    return [max(CLAMP, v) for v in values]


def _gradient_inputs(reg, spec: dict) -> tuple[dict, dict[str, list[dict]]]:
    """A gradient figure's statistics file and the probe rows of each run it names."""
    from hnclip.io import read_json, read_jsonl
    from hnclip.report import gradient_stats as gs
    figure = next(name for name, other in reg.params["figures"].items() if other == spec)
    path = gs.stats_path(figure)
    if not path.exists():
        from hnclip.errors import UserError
        raise UserError(f"{path} is missing; run `hnclip gradient-stats {figure}` first")
    stats = read_json(path)
    return stats, {run["run_id"]: read_jsonl(gs.probe_log(run["run_id"])) for run in stats["runs"]}


def _caption_axes(fig, slot, text: str) -> None:
    """The statistics caption as a text block in its own (axis-less) grid slot under the panels."""
    import textwrap
    ax = fig.add_subplot(slot)
    ax.axis("off")
    width = int(fig.get_figwidth() * 72 / (CAPTION_FONT * 0.6))  # characters per line (about 0.6 em each)
    ax.text(0.0, 1.0, textwrap.fill(text, width), va="top", ha="left", fontsize=CAPTION_FONT, gid="caption",
            transform=ax.transAxes)


def _band(ax, epochs, quartile_rows: list[dict], colour: str, label: str, clamp: bool = True) -> None:
    """Per-epoch median (line) with its interquartile band (shaded); epochs without data skipped."""
    points = [(e, q) for e, q in zip(epochs, quartile_rows) if q["n"]]
    if not points:
        return
    xs = [e for e, _ in points]
    fix = _clamped if clamp else list
    ax.fill_between(xs, fix(q["q25"] for _, q in points), fix(q["q75"] for _, q in points), color=colour,
                    alpha=0.25, linewidth=0)
    ax.plot(xs, fix(q["median"] for _, q in points), "o-", ms=3, color=colour, label=label)


def _run_tag(run: dict, several: bool) -> str:
    return f" s{run['seed']}" if several else ""


def draw_gradient_dynamics(stats: dict, traces: dict[str, list[dict]], title: str) -> plt.Figure:
    """Paper Fig. 4 for each run of the statistics file: (a) both losses per measurement and the
    per-epoch share of measured batches each leaves saturated / active, (b) per-epoch median
    gradient norms and their ratio with interquartile bands, (c) held-out retrieval error per
    epoch, and the gradient cosine; the statistics caption underneath."""
    fig = plt.figure(figsize=(15, 8.6), constrained_layout=True)
    grid = fig.add_gridspec(3, 3, height_ratios=[1, 1, 0.28])
    axes = [fig.add_subplot(grid[i, j]) for i in range(2) for j in range(3)]
    loss_ax, share_ax, norm_ax, ratio_ax, error_ax, cos_ax = axes
    threshold = stats["saturation_threshold"]
    several = len(stats["runs"]) > 1
    for k, run in enumerate(stats["runs"]):
        records, tag, style = traces[run["run_id"]], _run_tag(run, several), ["-", "--", ":", "-."][k % 4]
        steps = [r["step"] for r in records]
        loss_ax.semilogy(steps, _clamped(r["clip_loss"] for r in records), style, lw=0.9, color=CLIP_COLOUR,
                         label=f"L_CLIP{tag}")
        loss_ax.semilogy(steps, _clamped(r["hn_loss"] for r in records), style, lw=0.9, color=HN_COLOUR,
                         label=f"L_HN{tag}")
        epochs = [e["epoch"] for e in run["per_epoch"]]
        share_ax.plot(epochs, [e["clip_saturated_share"] for e in run["per_epoch"]], "o" + style, color=CLIP_COLOUR,
                      label=f"L_CLIP < {threshold:g}{tag}")
        share_ax.plot(epochs, [e["hn_active_share"] for e in run["per_epoch"]], "s" + style, color=HN_COLOUR,
                      label=f"L_HN ≥ {threshold:g}{tag}")
        every = [e for e in run["all_batches"] if e["clip_saturated_share"] is not None]
        share_ax.plot([e["epoch"] for e in every], [e["clip_saturated_share"] for e in every], ":", lw=1,
                      color=CLIP_COLOUR, label=f"L_CLIP, all micro-batches{tag}")
        every = [e for e in run["all_batches"] if e["hn_active_share"] is not None]
        share_ax.plot([e["epoch"] for e in every], [e["hn_active_share"] for e in every], ":", lw=1,
                      color=HN_COLOUR, label=f"L_HN, all micro-batches{tag}")
        _band(norm_ax, epochs, [e["clip_grad_norm"] for e in run["per_epoch"]], CLIP_COLOUR, f"‖∇L_CLIP‖{tag}")
        _band(norm_ax, epochs, [e["hn_grad_norm"] for e in run["per_epoch"]], HN_COLOUR, f"‖∇L_HN‖{tag}")
        _band(ratio_ax, epochs, [e["ratio_nonzero"] for e in run["per_epoch"]], "tab:purple", f"median, IQR{tag}")
        rows = run["retrieval"]["per_epoch"]
        for direction, marker in (("t2i", "o"), ("i2t", "s")):
            error_ax.plot([r["epoch"] for r in rows], [r[direction] for r in rows], marker + style, ms=3,
                          label=f"{DIRECTION_LABELS[direction]}{tag}")
        cosine = [(r["step"], r["grad_cosine"]) for r in records if r.get("grad_cosine") is not None]
        cos_ax.plot([x for x, _ in cosine], [c for _, c in cosine], style, lw=0.9, color="tab:blue",
                    label=f"cos{tag}")
        summary = run["summary"]["cosine"]
        if summary["mean"] is not None:
            cos_ax.axhline(summary["mean"], color="tab:blue", linestyle=":", linewidth=1,
                           label=f"mean {summary['mean']:.2f}{tag}")
    loss_ax.axhline(threshold, color="gray", linestyle=":", linewidth=1)
    share_ax.set_ylim(-0.05, 1.05)
    norm_ax.set_yscale("log")
    ratio_ax.set_yscale("log")
    cos_ax.axhline(0, color="black", linewidth=0.5)
    benchmark = stats["runs"][0]["benchmark_label"] if stats["runs"] else "?"
    labels = [("(a) loss on the probed batch", "optimizer step"),
              ("(a) share of measured batches", "epoch"),
              (f"(b) gradient norm, per-epoch median + IQR (0 → {CLAMP:g})", "epoch"),
              ("(b) ‖∇L_HN‖ / ‖∇L_CLIP‖ where ∇L_CLIP ≠ 0", "epoch"),
              (f"(c) held-out retrieval error on {benchmark} (100 − R@1, %)", "epoch (0 = initial)"),
              ("cosine(∇L_CLIP, ∇L_HN)", "optimizer step")]
    for ax, (panel, xlabel) in zip(axes, labels):
        ax.set_title(panel, fontsize=9)
        ax.set_xlabel(xlabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6)
    _caption_axes(fig, grid[2, :], stats["caption"])
    fig.suptitle(title, fontsize=10)
    return fig


def gradient_dynamics(reg, spec: dict, out_stem: Path) -> list[Path]:
    stats, traces = _gradient_inputs(reg, spec)
    return save_figure(draw_gradient_dynamics(stats, traces, f"{spec['title']} — {reg.profile_name} profile"),
                       out_stem)


def _grid_layout(runs: list[dict]) -> tuple[list[float], list[tuple[str, str]]]:
    """Fig. A8's rows (training fractions, ascending) and columns ((benchmark, method) in run order)."""
    fractions = sorted({run["fraction"] for run in runs})
    columns = list(dict.fromkeys((run["benchmark"], run["method"]) for run in runs))
    return fractions, columns


def _grid_cell(fig, slot, run: dict, records: list[dict], label: str, first_column: bool) -> None:
    """One run of Fig. A8: (a) losses, raw (thin) and running median (thick); (b) both gradient
    norms and their ratio (dashed); (c) the gradient cosine."""
    from hnclip.report.gradient_stats import running_median
    inner = slot.subgridspec(3, 1, hspace=0.05)
    loss_ax, norm_ax, cos_ax = (fig.add_subplot(inner[i]) for i in range(3))
    steps = [r["step"] for r in records]
    for key, colour, name in (("clip_loss", CLIP_COLOUR, "L_CLIP"), ("hn_loss", HN_COLOUR, "L_HN")):
        values = _clamped(r[key] for r in records)
        loss_ax.semilogy(steps, values, lw=0.5, alpha=0.6, color=colour)
        loss_ax.semilogy(steps, running_median(values, RUNNING_MEDIAN_WINDOW), lw=2, color=colour, label=name)
    norm_ax.semilogy(steps, _clamped(r["clip_grad_norm"] for r in records), lw=0.8, color=CLIP_COLOUR,
                     label="‖∇L_CLIP‖")
    norm_ax.semilogy(steps, _clamped(r["hn_grad_norm"] for r in records), lw=0.8, color=HN_COLOUR, label="‖∇L_HN‖")
    ratios = [(r["step"], r["hn_grad_norm"] / r["clip_grad_norm"]) for r in records if r["clip_grad_norm"] > 0]
    norm_ax.semilogy([x for x, _ in ratios], [v for _, v in ratios], "--", lw=0.8, color="tab:purple", label="ratio")
    cosine = [(r["step"], r["grad_cosine"]) for r in records if r.get("grad_cosine") is not None]
    cos_ax.plot([x for x, _ in cosine], [c for _, c in cosine], lw=0.8, color="tab:blue")
    cos_ax.axhline(0, color="black", linewidth=0.5)
    cos_ax.set_ylim(-1.05, 1.05)
    summary = run["summary"]
    loss_ax.set_title(f"{label}: {summary['measurements']} measurements; cos median "
                      f"{_fmt(summary['cosine']['median'])}", fontsize=7.5)
    for ax, name in ((loss_ax, "(a) loss"), (norm_ax, "(b) ‖∇‖, ratio"), (cos_ax, "(c) cos")):
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=6)
        if first_column:
            ax.set_ylabel(name, fontsize=7)
        if ax is not cos_ax:
            ax.tick_params(labelbottom=False)
    cos_ax.set_xlabel("optimizer step", fontsize=7)
    cos_ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if first_column:
        loss_ax.legend(fontsize=5.5)
        norm_ax.legend(fontsize=5.5)


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def draw_gradient_dynamics_grid(stats: dict, traces: dict[str, list[dict]], title: str) -> plt.Figure:
    """Paper Fig. A8: rows = training fraction, columns = (dataset, method); three panels per run;
    the pooled statistics caption underneath."""
    fractions, columns = _grid_layout(stats["runs"])
    fig = plt.figure(figsize=(5.0 * max(1, len(columns)), 3.6 * max(1, len(fractions)) + 1.0),
                     constrained_layout=True)
    grid = fig.add_gridspec(len(fractions) + 1, max(1, len(columns)), height_ratios=[1] * len(fractions) + [0.15])
    for run in stats["runs"]:
        i, j = fractions.index(run["fraction"]), columns.index((run["benchmark"], run["method"]))
        label = f"{run['benchmark_label']} · {run['method_label']} · {100 * run['fraction']:g}%"
        _grid_cell(fig, grid[i, j], run, traces[run["run_id"]], label, first_column=j == 0)
    _caption_axes(fig, grid[len(fractions), :], stats["caption"])
    fig.suptitle(f"{title} (log axes in (a, b); exact zeros clamped to {CLAMP:g})", fontsize=10)
    return fig


def gradient_dynamics_grid(reg, spec: dict, out_stem: Path) -> list[Path]:
    stats, traces = _gradient_inputs(reg, spec)
    return save_figure(draw_gradient_dynamics_grid(stats, traces, f"{spec['title']} — {reg.profile_name} profile"),
                       out_stem)


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
