#!/usr/bin/env python3
"""Draw the README's figure: the Table 1 excerpt of the embedded default, as a shaded table.

    .venv/bin/python scripts/docs_figure.py [--csv docs/table1_excerpt.csv] [--out docs/table1_excerpt.png]

The numbers are read from the CSV (its leading `#` lines say where they come from, and become the
figure's footnote), never computed here: to update the figure, update the CSV from a new run's
results/tables/table1.csv and rerun this script.
"""
from __future__ import annotations

import argparse
import csv
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

from hnclip.io import atomic_path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def read_excerpt(path: Path) -> tuple[list[str], list[str], list[list[float]], list[str]]:
    """(column names, row names, values, source lines) of an excerpt CSV with `#` source lines on top."""
    lines = path.read_text(encoding="utf-8").splitlines()
    source = [line.lstrip("# ").rstrip() for line in lines if line.startswith("#")]
    rows = list(csv.reader(line for line in lines if line and not line.startswith("#")))
    header, body = rows[0], rows[1:]
    if not body:
        raise SystemExit(f"{path}: no rows under the header")
    values = [[float(cell) for cell in row[1:]] for row in body]
    if any(len(row) != len(header) - 1 for row in values):
        raise SystemExit(f"{path}: every row needs one value per column of the header")
    return header[1:], [row[0] for row in body], values, source


def draw(columns: list[str], methods: list[str], values: list[list[float]], source: list[str], out: Path) -> None:
    """A table with each column shaded from its lowest to its highest value; the best of a column in bold."""
    columns = [*columns, "mean"]
    values = [[*row, sum(row) / len(row)] for row in values]
    n_rows, n_cols = len(values), len(columns)
    fig, ax = plt.subplots(figsize=(1.05 * n_cols + 1.6, 0.42 * n_rows + 1.9))
    ax.set_xlim(-1.6, n_cols)
    ax.set_ylim(n_rows, -1.2)
    ax.axis("off")
    cmap = plt.get_cmap("Blues")
    for j, name in enumerate(columns):
        ax.text(j + 0.5, -0.35, name.replace(" ", "\n", 1), ha="center", va="center", fontsize=9, weight="bold")
        column = [row[j] for row in values]
        low, high = min(column), max(column)
        for i, value in enumerate(column):
            share = (value - low) / (high - low) if high > low else 0.0
            ax.add_patch(plt.Rectangle((j, i), 1, 1, color=cmap(0.08 + 0.5 * share), ec="white"))
            ax.text(j + 0.5, i + 0.5, f"{value:.1f}", ha="center", va="center", fontsize=9,
                    weight="bold" if value == high else "normal")
    for i, method in enumerate(methods):
        ax.text(-0.1, i + 0.5, method, ha="right", va="center", fontsize=9)
    ax.set_title("Recall@1 (%) on the four benchmarks (Table 1 excerpt)", fontsize=11, pad=4)
    legend = "Shading runs from each column's lowest to its highest value; a column's best is in bold."
    fig.text(0.01, 0.01, "\n".join([*source, legend]), fontsize=7, color="0.3", ha="left", va="bottom")
    fig.subplots_adjust(left=0.01, right=0.99, top=0.93, bottom=0.2)
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=150)
        tmp.chmod(0o644)  # a committed document, readable by all (the temporary file starts private)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=ROOT / "docs" / "table1_excerpt.csv")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "table1_excerpt.png")
    args = parser.parse_args(argv)
    draw(*read_excerpt(args.csv), out=args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
