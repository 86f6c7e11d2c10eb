"""`hnclip` command line: thin verbs over the library, called by the Snakemake rules."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from . import paths, provenance
from .config import ParamsError, load_params
from .io import write_json
from .registry import Registry


def _registry(args) -> Registry:
    overrides = {"profile": args.profile} if args.profile else {}
    reg = Registry(load_params(args.params, overrides), validate=False)
    if args.threads:  # Snakemake passes the threads it granted the job; never part of a run's identity
        reg.profile["execution"]["threads"] = args.threads
    return reg


# ---- verbs -------------------------------------------------------------------------------------
def cmd_validate(args) -> int:
    reg = _registry(args)
    print(json.dumps(reg.summary(), indent=2))
    return 0


def cmd_runs(args) -> int:
    reg = _registry(args)
    run_ids = sorted({c.run_id for c in reg.cells(args.table)}) if args.table else sorted(reg.runs())
    for run_id in run_ids:
        print(run_id if not args.spec else json.dumps({"run_id": run_id, **reg.run(run_id).spec}, sort_keys=True))
    return 0


def cmd_data(args) -> int:
    """Materialise a dataset role as manifests: generated (embedded profile) or downloaded + converted."""
    from .jobs import dataset_generation
    reg = _registry(args)
    spec = dataset_generation(reg, args.dataset)
    data_root = Path(reg.profile["data_root"])
    out_dir = paths.dataset_dir(data_root, args.dataset)
    started = time.time()
    if spec["kind"] == "synthetic":
        from .data.synthetic import dataset_fingerprint, write_dataset
        manifests = write_dataset(out_dir, spec["variant"], spec["sizes"], spec["seed"])
        extra = {"generator": dataset_fingerprint(spec["variant"], spec["sizes"], spec["seed"])}
    else:
        from .data.download import download_dataset
        from .data.real import BUILDERS
        download_dataset(spec["source"], data_root)  # verifies; a no-op when already verified
        report = BUILDERS[args.dataset](data_root / spec["source"], out_dir, **spec.get("protocol", {}))
        manifests = report.manifests
        extra = {"counts": report.counts, "paper_count_mismatches": report.mismatches(),
                 "fraction_over_248_tokens": report.over_context, "notes": report.notes}
        for line in report.mismatches():
            print(f"count differs from paper Table A1: {line}")
    record = provenance.record("dataset", spec=spec, wall_time_s=time.time() - started,
                               inputs={f"manifest:{k}": v for k, v in manifests.items()}, extra=extra)
    write_json(out_dir / "dataset.json", record)
    print(f"wrote {', '.join(str(p) for p in manifests.values())}")
    return 0


def cmd_download(args) -> int:
    """Download and verify one source of the source table (resumable, checksummed)."""
    from .data.download import download_dataset
    reg = _registry(args)
    started = time.time()
    files = download_dataset(args.source, Path(reg.profile["data_root"]), mirror=args.mirror)
    record = provenance.record("download", inputs={f"raw:{name}": path for name, path in files.raw.items()},
                               wall_time_s=time.time() - started, extra={"source": args.source})
    write_json(paths.download_record(reg.profile["data_root"], args.source), record)
    print(f"{args.source}: verified files in {files.raw_dir}")
    return 0


def cmd_subsets(args) -> int:
    """The nested training subsets of the data-fraction study, written out for audit and reuse."""
    from .data.loader import subset_indices
    from .data.manifest import read_manifest
    reg = _registry(args)
    manifest = reg.train_manifest(args.dataset)
    rows = read_manifest(manifest, check_images=False)
    fractions = sorted({float(dict(c.settings).get("fraction", 1.0)) for t in reg.tables for c in reg.cells(t)
                        if c.train_set == args.dataset} | {1.0})
    chosen = {f"{f:g}": [rows[i].id for i in subset_indices(len(rows), f)] for f in fractions}
    for small, large in zip(fractions, fractions[1:]):  # nested by construction; checked anyway
        assert set(chosen[f"{small:g}"]) <= set(chosen[f"{large:g}"])
    record = provenance.record("subsets", inputs={"train_manifest": manifest},
                               extra={"dataset": args.dataset, "subset_seed": 0, "subsets": chosen})
    write_json(paths.subsets(reg.profile["data_root"], args.dataset), record)
    print(", ".join(f"{f}: {len(ids)}" for f, ids in chosen.items()))
    return 0


def cmd_pretrain(args) -> int:
    from .gpu_slots import acquire_slot
    from .jobs import pretrain_job
    from .train import train
    reg = _registry(args)
    job = pretrain_job(reg, args.backbone or reg.backbone_name())
    with acquire_slot():  # this job's own GPU when Snakemake runs several at once; no-op on CPU/SLURM
        record = train(job)
    print(f"pretrained {job.out_dir}/model.pt (final epoch: {record['history'][-1]['eval']})")
    return 0


def cmd_train(args) -> int:
    from .gpu_slots import acquire_slot
    from .jobs import finetune_job
    from .train import train
    reg = _registry(args)
    with acquire_slot():
        record = train(finetune_job(reg, args.run, stop_after_steps=args.stop_after_steps))
    print(f"trained {args.run}: {record['optimizer_steps']} steps in {record['wall_time_s']:.1f}s")
    return 0


def cmd_evaluate(args) -> int:
    from .run_evaluation import evaluate_run  # takes a GPU slot only when it has to encode
    reg = _registry(args)
    out = evaluate_run(reg, args.run, args.benchmark)
    print(f"wrote {out}")
    return 0


def cmd_stats(args) -> int:
    from .stats import caption_statistics
    reg = _registry(args)
    out = caption_statistics(reg, args.benchmark)
    print(f"wrote {out}")
    return 0


def cmd_table(args) -> int:
    from .report import build
    reg = _registry(args)
    if args.table == "tableA1":
        written = build.build_caption_geometry_table(reg)
    elif args.table == build.TIMING_TABLE:
        written = build.build_timing_table(reg)
    elif args.table in reg.params["tables"]:
        written = build.build_table(reg, args.table)
    else:
        print(f"error: unknown table {args.table!r}; allowed values: {['tableA1', 'tableA3', *reg.params['tables']]}",
              file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    return 0


def cmd_figure(args) -> int:
    from .report.figures import draw
    reg = _registry(args)
    if args.figure not in reg.params["figures"]:
        print(f"error: unknown figure {args.figure!r}; allowed values: {sorted(reg.params['figures'])}", file=sys.stderr)
        return 2
    for path in draw(reg, args.figure):
        print(f"wrote {path}")
    return 0


def cmd_overlap(args) -> int:
    """Perceptual-hash overlap between a training set and a test set (VG paragraphs vs Urban-1K)."""
    from .data.overlap import check_overlap
    reg = _registry(args)
    test_split = "test"
    out_manifest = None
    if args.drop:
        out_manifest = paths.manifest(reg.profile["data_root"], args.train, "train.dedup")
    report = check_overlap(reg.train_manifest(args.train),
                           paths.manifest(reg.profile["data_root"], args.test, test_split),
                           paths.overlap_report(args.train, args.test), max_distance=args.max_distance,
                           out_manifest=out_manifest, workers=args.threads)
    print(f"{report['n_pairs']} near-duplicate pair(s) between {args.train} train and {args.test} test; "
          f"report: {paths.overlap_report(args.train, args.test)}" + (f"; filtered: {out_manifest}" if out_manifest else ""))
    return 0


def cmd_lineage(args) -> int:
    from .lineage import format_lineage, lineage, lineage_json
    try:
        chain = lineage(Path(args.table_file), args.cell, root=Path("."))
    except (KeyError, ValueError) as exc:  # unknown cell, or a table not built from evaluations
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return 2
    print(lineage_json(chain) if args.json else format_lineage(chain))
    return 0


def cmd_audit(args) -> int:
    from .audit import main_audit
    # Without --profile the audit loads ./params.yaml itself and reports a params file that won't load.
    return main_audit(Path("."), reg=_registry(args) if args.profile else None)


def cmd_cell(args) -> int:
    from . import cell
    reg = _registry(args)
    settings = dict(item.split("=", 1) for item in args.set)
    try:
        cells = cell.resolve(reg, args.table, args.dataset, settings)
    except (cell.CellError, KeyError) as exc:
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return 2
    return cell.run(reg, cells, dry_run=args.dry_run)


# ---- parser ------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hnclip", description=__doc__)
    parser.add_argument("--params", default="params.yaml", help="experiment registry (default: params.yaml)")
    parser.add_argument("--profile", default=None, help="override params.yaml's profile (tiny, paper)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: the profile's execution.threads)")
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("validate", help="validate params.yaml and print the run/evaluation counts")
    p = sub.add_parser("runs", help="list the unique training runs (optionally of one table)")
    p.add_argument("--table")
    p.add_argument("--spec", action="store_true", help="print each run's full spec as JSON")
    p = sub.add_parser("data", help="generate a synthetic dataset role (embedded profile)")
    p.add_argument("dataset", help="dataset role (docci, dci, vg, urban1k) or 'pretrain'")
    p = sub.add_parser("download", help="download and verify a source (docci, dci, urban1k, vg_paragraphs, longclip_l)")
    p.add_argument("source")
    p.add_argument("--mirror", default=None, help="base URL of a mirror (default: $HNCLIP_MIRROR or the source's URL)")
    p = sub.add_parser("subsets", help="write the nested training subsets (5/20/50/100 %%) of a dataset role")
    p.add_argument("dataset")
    p = sub.add_parser("pretrain", help="pretrain the embedded backbone on its synthetic corpus")
    p.add_argument("--backbone")
    p = sub.add_parser("train", help="train one run (resumes from its last checkpoint; torchrun for several GPUs)")
    # --run-id: torchrun's own parser takes `--run` for an abbreviation of its `--run-path`
    p.add_argument("--run", "--run-id", dest="run", required=True)
    p.add_argument("--stop-after-steps", type=int, default=None, help=argparse.SUPPRESS)
    p = sub.add_parser("evaluate", help="evaluate one run on one benchmark (best and last epoch)")
    p.add_argument("--run", required=True)
    p.add_argument("--benchmark", required=True)
    p = sub.add_parser("stats", help="caption geometry of a benchmark's test captions under the backbone")
    p.add_argument("--benchmark", required=True)
    p = sub.add_parser("table", help="build a paper table (md, tex, csv) and its figure")
    p.add_argument("table")
    p = sub.add_parser("overlap", help="perceptual-hash overlap between a training and a test set")
    p.add_argument("--train", default="vg")
    p.add_argument("--test", default="urban1k")
    p.add_argument("--max-distance", type=int, default=32, help="Hamming distance of 256-bit pHashes")
    p.add_argument("--drop", action="store_true", help="also write <train>/train.dedup.jsonl without the overlaps")
    p = sub.add_parser("lineage", help="trace one table cell back to raw data, initial weights and commits")
    p.add_argument("table_file", help="results/tables/<table>.csv (or .md, .tex, .provenance.json)")
    p.add_argument("--cell", required=True,
                   help='"<row>/<column>", e.g. "gamma=0.5/docci/t2i/R@1" or "gamma=0.5/DOCCI T→I R@1"')
    p.add_argument("--json", action="store_true", help="print the chain as JSON")
    sub.add_parser("audit", help="re-hash every recorded input and output; compare params and dvc.lock")
    p = sub.add_parser("cell", help="build just one table cell (its run and evaluation) and print where it is")
    p.add_argument("table")
    p.add_argument("--dataset", help="benchmark of the cell (docci, dci, long_dci, urban1k)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="select by row, seed or a method setting, e.g. --set gamma=0.25 --set seed=43")
    p.add_argument("-n", "--dry-run", action="store_true", help="show what would run")
    p = sub.add_parser("figure", help="draw a figure of params.yaml's figures (png, pdf)")
    p.add_argument("figure")
    return parser


COMMANDS = {"validate": cmd_validate, "runs": cmd_runs, "data": cmd_data, "download": cmd_download, "pretrain": cmd_pretrain,
            "train": cmd_train, "evaluate": cmd_evaluate, "stats": cmd_stats, "table": cmd_table,
            "figure": cmd_figure, "cell": cmd_cell, "overlap": cmd_overlap,
            "lineage": cmd_lineage, "audit": cmd_audit,
            "subsets": cmd_subsets}


def _user_errors() -> tuple[type[Exception], ...]:
    """Failures whose message already says what went wrong and what to do: no traceback."""
    from .data.download import DownloadError
    from .data.manifest import ManifestError
    from .models.longclip import CheckpointMismatchError
    from .train import NonFiniteLossError
    return DownloadError, ManifestError, CheckpointMismatchError, NonFiniteLossError


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except ParamsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        if isinstance(exc, _user_errors()):
            print(f"error: {exc}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
