"""The report's one Markdown table renderer and one LaTeX writer (escaping, and a booktabs tabular with
grouped headers and bands, in the paper's layout). Every table under results/tables/ goes through them.

A table is a list of bands (the paper splits wide tables into an upper and a lower band); a band has leaf
columns and blocks of rows (e.g. reproduced, paper, Δ), each block with an optional title. Cells are plain
Unicode text: each writer escapes for its own format.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import groupby

# Characters LaTeX treats specially, and the Unicode the tables print, as pdflatex text.
_LATEX = {
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
    "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
    "|": r"$|$", "<": r"$<$", ">": r"$>$",  # the default OT1 font prints other glyphs for these
    "±": r"$\pm$", "→": r"$\to$", "Δ": r"$\Delta$", "γ": r"$\gamma$", "λ": r"$\lambda$",
    "≈": r"$\approx$", "≥": r"$\geq$", "≤": r"$\leq$", "×": r"$\times$", "−": "-", "–": "--", "—": "---",
    "∇": r"$\nabla$", "‖": r"$\|$", "≡": r"$\equiv$",
}
_LATEX_TABLE = str.maketrans(_LATEX)
# Choosing a table's page: A4 with 2 cm margins sets 481 pt of text (portrait). A tabular's width is
# estimated from its characters at Computer Modern 8 pt widths (em per character, fitted to pdflatex's
# widths of this report's tables within about 11 pt); an estimate within SAFETY_PT of the page's width
# goes landscape.
PORTRAIT_WIDTH_PT, SAFETY_PT = 481.0, 10.0
FONT_EM_PT = {"small": 9.0, "footnotesize": 8.0, "scriptsize": 7.0}
_DIGITS, _WIDE = set("0123456789"), set("+→±Δ≈")


@dataclass(frozen=True)
class Cell:
    """One printed cell; `span` > 1 for a value printed once over several columns (A2's best epochs)."""
    text: str
    bold: bool = False
    span: int = 1


@dataclass(frozen=True)
class Column:
    """A leaf column: its own header (the metric) under its group headers, outermost first."""
    label: str
    groups: tuple[str, ...] = ()
    align: str = "r"


@dataclass
class Block:
    title: str | None
    rows: list[tuple[str, list[Cell]]] = field(default_factory=list)


@dataclass
class Band:
    columns: list[Column]
    blocks: list[Block]


def latex_escape(text: str) -> str:
    """Plain Unicode text -> LaTeX text that pdflatex prints as written."""
    return text.translate(_LATEX_TABLE)


# ---- Markdown ------------------------------------------------------------------------------------

def _md(text: str) -> str:
    return text.replace("|", r"\|")


def markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A pipe table, one line per row; `|` inside a cell is escaped."""
    lines = ["| " + " | ".join(_md(h) for h in header) + " |", "|---|" + "---|" * (len(header) - 1)]
    return lines + ["| " + " | ".join(_md(c) for c in row) + " |" for row in rows]


def _md_cells(cells: list[Cell]) -> list[str]:
    out = []
    for cell in cells:
        out += [f"**{cell.text}**" if cell.bold else cell.text] + [""] * (cell.span - 1)
    return out


def markdown_blocks(stub: str, band: Band) -> list[str]:
    """Each block of a band as its own pipe table under its bold title; group headers are joined
    into each column's header ("DOCCI T→I R@1"), as Markdown has one header line."""
    header = [stub] + [" ".join((*column.groups, column.label)) for column in band.columns]
    out = []
    for block in band.blocks:
        if block.title:
            out += [f"**{block.title}**", ""]
        out += markdown_table(header, [[label, *_md_cells(cells)] for label, cells in block.rows]) + [""]
    return out


# ---- LaTeX ---------------------------------------------------------------------------------------

def _group_runs(columns: list[Column], level: int) -> list[tuple[str | None, int, int]]:
    """(label or None, first, last) runs of adjacent columns sharing their groups down to `level`;
    positions count from 2 (column 1 is the row labels), as \\cmidrule does."""
    def key(column: Column):
        return column.groups[:level + 1] if len(column.groups) > level else None
    runs, position = [], 2
    for group, members in groupby(columns, key=key):
        count = len(list(members))
        runs.append((group[-1] if group else None, position, position + count - 1))
        position += count
    return runs


def _latex_header(stub: str, columns: list[Column]) -> list[str]:
    lines = []
    for level in range(max((len(c.groups) for c in columns), default=0)):
        runs = _group_runs(columns, level)
        cells = [rf"\multicolumn{{{last - first + 1}}}{{c}}{{{latex_escape(label)}}}" if label else
                 " & ".join([""] * (last - first + 1)) for label, first, last in runs]
        lines.append(" & " + " & ".join(cells) + r" \\")
        # A rule under each group wider than one column, as the paper's benchmark and direction groups.
        lines.append(" ".join(rf"\cmidrule(lr){{{first}-{last}}}" for label, first, last in runs
                              if label and last > first))
    lines.append(latex_escape(stub) + " & " + " & ".join(latex_escape(c.label) for c in columns) + r" \\")
    return lines


def _latex_cell(cell: Cell) -> str:
    text = latex_escape(cell.text)
    text = rf"\textbf{{{text}}}" if cell.bold and text else text
    return rf"\multicolumn{{{cell.span}}}{{c}}{{{text}}}" if cell.span > 1 else text


def _latex_row(label: str, cells: list[Cell], width: int) -> str:
    texts = [_latex_cell(c) for c in cells] + [""] * (width - sum(c.span for c in cells))
    return " & ".join([latex_escape(label), *texts]) + r" \\"


def _ems(text: str) -> float:
    return sum(0.56 if c in _DIGITS else 0.7 if c.isupper() or c in _WIDE else 0.55 if c.isalpha() or c in "_%#"
               else 0.35 for c in text)


def natural_width_pt(stub: str, bands: list[Band], em_pt: float, colsep_pt: float) -> float:
    """Roughly how wide latex_tabular's output sets: its widest entry per column, or a block title."""
    ems = [_ems(stub)] + [0.0] * max(len(band.columns) for band in bands)
    titles = [0.0]
    for band in bands:
        for i, column in enumerate(band.columns, start=1):
            ems[i] = max(ems[i], _ems(column.label))
        for block in band.blocks:
            titles.append(_ems(block.title or ""))
            for label, cells in block.rows:
                ems[0], position = max(ems[0], _ems(label)), 1
                for cell in cells:
                    if cell.span == 1:
                        ems[position] = max(ems[position], _ems(cell.text))
                    position += cell.span
    return max(sum(ems) * em_pt + 2 * colsep_pt * len(ems), max(titles) * em_pt + 2 * colsep_pt)


def latex_tabular(stub: str, bands: list[Band], size: str = "footnotesize", colsep_pt: float = 3.0) -> list[str]:
    """One booktabs tabular holding every band: each band repeats its grouped header (benchmark /
    direction / metric, with \\multicolumn and \\cmidrule) as the paper's lower bands do; a block
    opens with a rule and its title. `size` is a LaTeX font-size command name. The first line, a
    comment, names the A4 page the table fits: portrait, else landscape."""
    width = max(len(band.columns) for band in bands)
    aligns = [c.align for c in max(bands, key=lambda b: len(b.columns)).columns]
    fits = natural_width_pt(stub, bands, FONT_EM_PT[size], colsep_pt) + SAFETY_PT <= PORTRAIT_WIDTH_PT
    out = [f"% page: {'portrait' if fits else 'landscape'}",
           rf"{{\{size}\setlength{{\tabcolsep}}{{{colsep_pt:g}pt}}%",
           r"\begin{tabular}{l" + "".join(aligns) + "}", r"\toprule"]
    for index, band in enumerate(bands):
        if index:
            out.append(r"\midrule")
        out += [line for line in _latex_header(stub, band.columns) if line]
        for block in band.blocks:
            out.append(r"\midrule")
            if block.title:
                out.append(rf"\multicolumn{{{width + 1}}}{{l}}{{\emph{{{latex_escape(block.title)}}}}} \\")
            out += [_latex_row(label, cells, width) for label, cells in block.rows]
    return out + [r"\bottomrule", r"\end{tabular}}"]
