"""R@1 by edit kind: where a model's retrieval errors on a synthetic benchmark are.

The synthetic test sets are families of near-duplicates: a base scene and siblings that each differ from it
in one edit (one object's colour, size, shape or texture, or two objects swapping places). R@5 is close to
100 there, so R@1 is decided between siblings, and splitting it by the edit that separates a query from its
sibling shows which details a model perceives: a pair the model cannot tell apart scores about 50 %.

Pure functions over rows already read: each test row's kind from the generator's own record of which edit
made each sibling (`hnclip.data.synthetic.split_edits`), then Recall@1 per kind from the per-query ranks
of an evaluation record (0-based, manifest order, as `hnclip.evaluation.retrieval.recall_at_k` keeps them).
"""
from __future__ import annotations

from collections import defaultdict

from hnclip.data.synthetic import EDIT_KINDS, family_of

SEVERAL = "several"  # a base scene whose family holds siblings of more than one edit kind
DIRECTIONS = ("t2i", "i2t")
# Printed order and names: colour first (what the miniature's backbone perceives), the swap last.
KIND_ORDER = ("color", "size", "shape", "texture", "position", SEVERAL)
KIND_LABELS = {"color": "colour", "size": "size", "shape": "shape", "texture": "texture", "position": "position (swap)",
               SEVERAL: "several edits"}


def row_kinds(ids: list[str], edits: dict[str, str | None]) -> list[str | None]:
    """Per row of a test split (manifest order), the edit kind that tells it from its sibling(s) in that split:
    a sibling's own edit; for a family's base scene, its siblings' edit (SEVERAL when they differ in kind);
    None for a row with no sibling in the split (e.g. a truncated last family), which no kind counts.

    `edits`: {row id: the edit that made that row from its family's base, None for the base}."""
    missing = [row_id for row_id in ids if row_id not in edits]
    if missing:
        raise ValueError(f"{len(missing)} test row(s) have no recorded edit (first: {missing[0]!r}): "
                         "the manifest is not this generator's output")
    members: dict[str | None, list[str]] = defaultdict(list)
    for row_id in ids:
        members[family_of(row_id)].append(row_id)
    if None in members:
        raise ValueError(f"row {members[None][0]!r} carries no family id: not a synthetic benchmark's row")
    kinds = []
    for row_id in ids:
        siblings = [other for other in members[family_of(row_id)] if other != row_id]
        if not siblings:
            kinds.append(None)
        elif edits[row_id] is not None:
            kinds.append(edits[row_id])
        else:
            sibling_kinds = {edits[other] for other in siblings} - {None}
            kinds.append(sibling_kinds.pop() if len(sibling_kinds) == 1 else SEVERAL)
    unknown = {k for k in kinds if k is not None} - set(EDIT_KINDS) - {SEVERAL}
    if unknown:
        raise ValueError(f"unknown edit kind(s) {sorted(unknown)}; known: {', '.join(EDIT_KINDS)}")
    return kinds


def r1_by_kind(ranks: dict[str, list[int]], kinds: list[str | None]) -> dict[str, dict]:
    """{kind: {"n": queries, "t2i": R@1 %, "i2t": R@1 %}} in KIND_ORDER (kinds with no query left out), plus
    "all": every query with a sibling. `ranks[direction][q]` is query q's 0-based rank of its ground truth."""
    for direction in DIRECTIONS:
        if len(ranks[direction]) != len(kinds):
            raise ValueError(f"{len(ranks[direction])} {direction} ranks for {len(kinds)} test rows: the evaluation "
                             "record is not of this test split")
    groups: dict[str, list[int]] = defaultdict(list)
    for query, kind in enumerate(kinds):
        if kind is not None:
            groups[kind].append(query)
            groups["all"].append(query)
    return {kind: {"n": len(groups[kind]),
                   **{d: 100.0 * sum(ranks[d][q] == 0 for q in groups[kind]) / len(groups[kind]) for d in DIRECTIONS}}
            for kind in (*KIND_ORDER, "all") if groups.get(kind)}


def markdown_rows(entries: list[dict]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the report's table: one row per evaluated model, one column per edit kind present,
    cells "T→I / I→T" R@1; a first row gives each kind's number of queries."""
    present = [k for k in (*KIND_ORDER, "all") if any(k in (e["r1"] or {}) for e in entries)]
    header = ["model", "epoch", *(KIND_LABELS.get(k, k) for k in present)]
    counts = next((e["r1"] for e in entries if e["r1"]), {})
    rows = [["queries", "", *(str(counts[k]["n"]) if k in counts else "" for k in present)]]
    for entry in entries:
        r1 = entry["r1"]
        if r1 is None:
            rows.append([entry["label"], "", *("n/a" for _ in present)])
            continue
        rows.append([entry["label"], str(entry["epoch"]),
                     *(f"{r1[k]['t2i']:.0f} / {r1[k]['i2t']:.0f}" if k in r1 else "" for k in present)])
    return header, rows


def benchmark_row_kinds(reg, benchmark: str) -> tuple[list[str | None] | None, str]:
    """(each test row's kind in manifest order, a note) for one of params.yaml's benchmarks; kinds None (the note
    says why) where its test set is not synthetic. The edits are regenerated from the dataset's generator settings
    (no images rendered), and the manifest's ids and captions must be exactly what they generate."""
    from hnclip.data.manifest import read_manifest
    from hnclip.data.synthetic import split_edits
    from hnclip.errors import StaleArtifactError
    test = reg.params["benchmarks"][benchmark]["test"]
    spec = reg.profile["datasets"][test["dataset"]]
    if spec["kind"] != "synthetic":
        return None, f"{test['dataset']} is {spec['kind']} data: its test pairs have no recorded edits"
    manifest = reg.test_manifest(benchmark)
    rows = read_manifest(manifest, check_images=False)
    sizes = spec["sizes"]
    n_images = sizes.get(test["split"], sizes.get("test"))  # a long-caption split re-describes the test images
    edits = split_edits(spec["variant"], test["split"], n_images, spec["seed"], spec.get("generator"))
    if sorted(edits) != sorted(row.id for row in rows) or any(edits[row.id][1] != row.caption for row in rows):
        raise StaleArtifactError(f"{manifest} is not what the generator makes for params.yaml's settings of "
                                 f"{test['dataset']!r}: rebuild it (snakemake {manifest})")
    return row_kinds([row.id for row in rows], {row_id: edit for row_id, (edit, _) in edits.items()}), \
        f"{len(rows)} test rows of {test['dataset']} ({test['split']})"


def render_section(diagnostic: dict) -> list[str]:
    """The regime report's Markdown section for `hnclip.commands.regime`'s diagnostic record."""
    from hnclip.report.render import markdown_table
    lines = [f"## Diagnostic: R@1 by edit kind ({diagnostic.get('label', diagnostic['benchmark'])} test pairs)", "",
             "Each test image has a near-duplicate sibling that differs in one edit; R@5 is close to 100, so R@1 is "
             "decided between the two, and a kind of edit the model cannot perceive scores about 50 %. Cells: "
             "R@1 (%) T→I / I→T at each model's best epoch, over the queries whose sibling differs by that edit.", ""]
    if diagnostic.get("kinds") is None:
        return lines + [f"Not computed: {diagnostic['note']}.", ""]
    header, rows = markdown_rows(diagnostic["models"])
    lines += markdown_table(header, rows)
    notes = [f"{m['label']}: {m['note']}" for m in diagnostic["models"] if m["note"]]
    return lines + ([""] + [f"- {n}" for n in notes] if notes else []) + [""]
