"""`hnclip regime`: the regime preconditions of params.yaml's `regime_targets`, measured from the
pipeline's own outputs (the zero-shot evaluation, the runs' step logs, the training loader's
micro-batches, the caption-geometry statistics) into results/stats/regime.json (with provenance)
and results/stats/regime.md. The maths is in `hnclip.report.regime`; this module resolves which
files answer each question (`regime_plan`, also the rule's inputs) and reads them."""
from __future__ import annotations

import time
from pathlib import Path

from hnclip import provenance
from hnclip.config import paths
from hnclip.config.constants import RUNNABLE_FRAMEWORKS
from hnclip.config.registry import Registry
from hnclip.errors import UnknownNameError, UserError
from hnclip.io import read_json, read_jsonl, write_json, write_text
from hnclip.report import regime


def _targets(reg: Registry) -> dict:
    targets = reg.params.get("regime_targets")
    if not targets:
        raise UserError("params.yaml declares no `regime_targets`: nothing to measure (see params.yaml in the "
                        "repository for the preconditions and their targets)")
    return targets


def _known(name: str, allowed, key: str) -> str:
    if name not in allowed:
        raise UnknownNameError(f"params.yaml: regime_targets.{key}: unknown name {name!r}; "
                               f"allowed values: {sorted(allowed)}")
    return name


def _training_set(reg: Registry, role: str, key: str) -> str:
    _known(role, reg.profile["datasets"], key)
    if "train" not in reg.dataset_splits(role):
        raise UserError(f"params.yaml: regime_targets.{key}: {role!r} is not a training set of profile "
                        f"{reg.profile_name!r} (no benchmark trains on it)")
    return role


def planned_run(reg: Registry, method: str, train_set: str) -> str | None:
    """The run id of `method` on the full `train_set` with the profile's first seed, if one of the
    profile's tables trains it (only those runs exist); else None."""
    settings = reg.params["methods"][method]
    if settings["framework"] not in RUNNABLE_FRAMEWORKS:
        return None
    run_id = reg.run_spec(train_set, settings, reg.profile["seeds"][0], 1.0, register=False).run_id
    return run_id if run_id in reg.runs() else None


def regime_plan(reg: Registry) -> dict:
    """Which outputs answer each precondition: validated targets, the zero-shot evaluation, the
    plain fine-tuning run and the L_HN run (None where no table trains them), the training sets'
    manifests and the caption statistics."""
    targets = _targets(reg)
    methods, benchmarks = reg.params["methods"], reg.params["benchmarks"]
    zeroshot = _known(targets["zeroshot_r1"]["benchmark"], benchmarks, "zeroshot_r1.benchmark")
    plain = targets["infonce_saturation"]
    plain_method = _known(plain["method"], methods, "infonce_saturation.method")
    plain_train = _training_set(reg, plain["train"], "infonce_saturation.train")
    hn = targets["hn_unsaturated"]
    hn_train = _training_set(reg, hn["train"], "hn_unsaturated.train")
    for method in hn["methods"]:
        _known(method, methods, "hn_unsaturated.methods")
        if methods[method]["gamma"] <= 0:
            raise UserError(f"params.yaml: regime_targets.hn_unsaturated.methods: {method!r} does not train L_HN "
                            f"(gamma {methods[method]['gamma']}); name a method with gamma > 0")
    hn_runs = [(method, planned_run(reg, method, hn_train)) for method in hn["methods"]]
    hn_method, hn_run = next(((m, r) for m, r in hn_runs if r), (hn["methods"][0], None))
    sibling_sets = [_training_set(reg, role, "sibling_share.train") for role in targets["sibling_share"]["train"]]
    geometry = [_known(b, benchmarks, "caption_geometry.benchmarks") for b in targets["caption_geometry"]["benchmarks"]]
    headroom = _headroom_plan(reg, targets["headroom"])
    return {"targets": targets, "seed": reg.profile["seeds"][0], "micro_batch": reg.profile["recipe"]["micro_batch"],
            "zeroshot": {"benchmark": zeroshot, "path": paths.evaluation(reg.zeroshot_id(), zeroshot)},
            "plain": {"method": plain_method, "train": plain_train, "run": planned_run(reg, plain_method, plain_train)},
            "hn": {"method": hn_method, "train": hn_train, "run": hn_run},
            "train_manifests": {role: reg.train_manifest(role) for role in sibling_sets},
            "stats": {bench: paths.stats(bench) for bench in geometry}, "headroom": headroom}


def _headroom_plan(reg: Registry, target: dict) -> dict:
    """The plain fine-tuning run on the benchmark's own training set and the two evaluations compared."""
    method = _known(target["method"], reg.params["methods"], "headroom.method")
    bench = _known(target["benchmark"], reg.params["benchmarks"], "headroom.benchmark")
    run = planned_run(reg, method, reg.params["benchmarks"][bench]["train"])
    return {"method": method, "benchmark": bench, "run": run,
            "finetuned": paths.evaluation(run, bench) if run else None,
            "zeroshot": paths.evaluation(reg.zeroshot_id(), bench)}


def regime_inputs(reg: Registry) -> list[str]:
    """Every file `build_regime` reads (the Snakemake rule's inputs): no torch import."""
    plan = regime_plan(reg)
    runs = [plan[key]["run"] for key in ("plain", "hn") if plan[key]["run"]]
    files = [plan["zeroshot"]["path"], *(p for run in runs for p in (paths.run_steps(run), paths.run_record(run)))]
    files += [paths.dataset_dir(reg.profile["data_root"], role) / "dataset.json" for role in plan["train_manifests"]]
    files += list(plan["stats"].values())
    files += [plan["headroom"][key] for key in ("finetuned", "zeroshot") if plan["headroom"][key]]
    diagnostic = _edit_kinds_plan(reg, plan)
    files += [diagnostic["dataset"], *(path for _, path in diagnostic["models"])]
    return sorted(dict.fromkeys(str(f) for f in files))


def _read(path: Path, reads: dict[str, Path], name: str, loader=read_json):
    if not Path(path).is_file():
        raise UserError(f"{path} is missing: build it first (snakemake {path}), or run the regime rule, "
                        f"which builds what it reads")
    reads[name] = path
    return loader(path)


# ---- one precondition each ---------------------------------------------------------------------
def _zeroshot(reg: Registry, plan: dict, reads: dict) -> dict:
    from hnclip.config.cells import DIRECTION_LABELS
    target, bench, path = plan["targets"]["zeroshot_r1"], plan["zeroshot"]["benchmark"], plan["zeroshot"]["path"]
    record = _read(path, reads, f"zeroshot:{bench}")
    label = reg.params["benchmarks"][bench]["label"]
    checks = [regime.check(f"{label} {DIRECTION_LABELS[d]} R@1", float(record["best"]["metrics"][d]["R@1"]), ">=",
                           target["min"], str(path)) for d in target["directions"]]
    return regime.precondition("zeroshot_r1", "Zero-shot R@1 (%) before fine-tuning", checks)


def _run_share(reg: Registry, plan: dict, reads: dict, key: str, epoch: int, step_field: str,
               summary_key: str, complement: bool) -> tuple[float | None, str | None, str]:
    """(share, source file, note) of one run's epoch: from its steps log, else from its training
    record's epoch summary (a log written before the step field existed)."""
    run = plan[key]["run"]
    if run is None:
        return None, None, (f"no table of profile {reg.profile_name!r} trains {plan[key]['method']} on "
                            f"{plan[key]['train']}")
    steps = _read(paths.run_steps(run), reads, f"steps:{run}", read_jsonl)
    share = regime.epoch_share(steps, epoch, step_field)
    if share is not None:
        return share, str(paths.run_steps(run)), f"`{step_field}` over the epoch's optimizer steps"
    record = _read(paths.run_record(run), reads, f"train_record:{run}")
    summary = regime.epoch_summary_share(record.get("history", []), epoch, summary_key)
    if summary is None:
        return None, str(paths.run_record(run)), f"epoch {epoch} is not recorded"
    return (1.0 - summary if complement else summary), str(paths.run_record(run)), \
        f"from the epoch summary's `{summary_key}` (the steps log predates `{step_field}`)"


def _saturation(reg: Registry, plan: dict, reads: dict, threshold: float) -> list[dict]:
    methods = reg.params["methods"]
    plain, hn = plan["targets"]["infonce_saturation"], plan["targets"]["hn_unsaturated"]
    share, source, note = _run_share(reg, plan, reads, "plain", plain["epoch"], "saturated_frac",
                                     "infonce_saturated_frac", complement=False)
    item = f"{methods[plan['plain']['method']]['label']} on {plan['plain']['train']}, epoch {plain['epoch']}"
    infonce = regime.precondition("infonce_saturation", f"Plain fine-tuning: share of micro-batches with InfoNCE "
                                  f"< {threshold:g}", [regime.check(item, share, ">=", plain["min"], source, note)])
    share, source, note = _run_share(reg, plan, reads, "hn", hn["epoch"], "hn_unsaturated_frac",
                                     "hn_saturated_frac", complement=True)
    item = f"{methods[plan['hn']['method']]['label']} on {plan['hn']['train']}, epoch {hn['epoch']}"
    alive = regime.precondition("hn_unsaturated", f"L_HN run: share of micro-batches with L_HN ≥ {threshold:g}",
                                [regime.check(item, share, ">=", hn["min"], source, note)])
    return [infonce, alive]


def _siblings(plan: dict, reads: dict) -> dict:
    from hnclip.data.loader import subset_indices
    from hnclip.data.manifest import read_manifest
    from hnclip.data.synthetic import family_of
    from hnclip.training.batching import epoch_micro_batches
    target, seed, micro = plan["targets"]["sibling_share"], plan["seed"], plan["micro_batch"]
    checks = []
    for role, manifest in plan["train_manifests"].items():
        rows = _read(manifest, reads, f"train_manifest:{role}", lambda p: read_manifest(p, check_images=False))
        # exactly the training loop's micro-batches of this epoch (full training set)
        batches = epoch_micro_batches(subset_indices(len(rows), 1.0), micro, seed, target["epoch"] - 1)
        share = regime.sibling_batch_share(batches, [family_of(row.id) for row in rows])
        note = f"{len(batches)} micro-batches" if share is not None else "the manifest's rows carry no family ids"
        checks.append(regime.check(f"{role} train, epoch {target['epoch']} (seed {seed}, {micro}-pair micro-batches)",
                                   share, "<=", target["max"], str(manifest), note))
    return regime.precondition("sibling_share", "Micro-batches holding two captions of one family", checks)


def _geometry(reg: Registry, plan: dict, reads: dict) -> dict:
    target = plan["targets"]["caption_geometry"]
    checks = []
    for bench, path in plan["stats"].items():
        stats = _read(path, reads, f"stats:{bench}")
        hardest = stats["mean_hardest_negative_cosine"]
        checks.append(regime.check(f"{reg.params['benchmarks'][bench]['label']} test captions",
                                   float(stats["mean_pairwise_cosine"]), ">=", target["min_mean_pairwise"], str(path),
                                   f"mean hardest-negative cosine {hardest:.3f}") | {"hardest_negative": hardest})
    return regime.precondition("caption_geometry", "Mean pairwise caption cosine (initial backbone)", checks)


def _headroom(reg: Registry, plan: dict, reads: dict) -> dict:
    """Plain fine-tuning's best epoch (by mean R@1) minus the zero-shot backbone, R@1 per direction: where
    it is near zero no objective can show a fine-tuning gain, and comparative claims are not testable."""
    from hnclip.report.tables import DIRECTION_LABELS
    target, spec = plan["targets"]["headroom"], plan["headroom"]
    label = reg.params["benchmarks"][spec["benchmark"]]["label"]
    title = "Fine-tuning headroom: plain fine-tuning − zero-shot R@1 (points)"
    if spec["run"] is None:
        note = f"no table of profile {reg.profile_name!r} trains {spec['method']} on its training set"
        return regime.precondition("headroom", title, [regime.check(f"{label} {DIRECTION_LABELS[d]} R@1", None, ">=",
                                                                    target["min"], None, note)
                                                       for d in target["directions"]])
    tuned = _read(spec["finetuned"], reads, f"finetuned:{spec['benchmark']}")
    zero = _read(spec["zeroshot"], reads, f"zeroshot:{spec['benchmark']}")
    checks = []
    for d in target["directions"]:
        ft, zs = float(tuned["best"]["metrics"][d]["R@1"]), float(zero["best"]["metrics"][d]["R@1"])
        checks.append(regime.check(f"{label} {DIRECTION_LABELS[d]} R@1", ft - zs, ">=", target["min"],
                                   str(spec["finetuned"]), f"{reg.params['methods'][spec['method']]['label']} "
                                   f"{ft:.2f} (epoch {tuned['best'].get('epoch')}) − zero-shot {zs:.2f}"))
    return regime.precondition("headroom", title, checks)


# ---- diagnostic: R@1 by edit kind ------------------------------------------------------------------
def _edit_kinds_plan(reg: Registry, plan: dict) -> dict:
    """The zero-shot benchmark's test set (its dataset marker) and the evaluation records split by edit kind:
    the zero-shot backbone, then the plain and L_HN runs the report names (where a table trains them)."""
    bench = plan["zeroshot"]["benchmark"]
    test_role = reg.params["benchmarks"][bench]["test"]["dataset"]
    methods = reg.params["methods"]
    models = [("zero-shot", plan["zeroshot"]["path"])]
    models += [(f"{methods[plan[key]['method']]['label']} ({plan[key]['method']})",
                paths.evaluation(plan[key]["run"], bench)) for key in ("plain", "hn") if plan[key]["run"]]
    return {"benchmark": bench, "dataset": paths.dataset_dir(reg.profile["data_root"], test_role) / "dataset.json",
            "models": models}


def _edit_kinds(reg: Registry, plan: dict, reads: dict) -> dict:
    """R@1 by the edit that separates each test query from its sibling, per evaluated model at its best epoch
    (`hnclip.report.edit_kinds`). A diagnostic, not a precondition: what it cannot compute (real data, a record
    without per-query ranks, a file not built) it reports as a note."""
    from hnclip.report import edit_kinds
    diagnostic = _edit_kinds_plan(reg, plan)
    bench = diagnostic["benchmark"]
    manifest = reg.test_manifest(bench)
    if not Path(manifest).is_file():
        return {"benchmark": bench, "kinds": None, "note": f"{manifest} is missing", "models": []}
    kinds, note = edit_kinds.benchmark_row_kinds(reg, bench)
    if kinds is not None:
        reads[f"test_manifest:{bench}"] = manifest
    models = []
    for label, path in diagnostic["models"]:
        entry = {"label": label, "eval_file": str(path), "epoch": None, "r1": None, "note": ""}
        if kinds is None:
            entry["note"] = note
        elif not Path(path).is_file():
            entry["note"] = f"{path} is missing"
        else:
            best = _read(path, reads, f"edit_kinds:{path}")["best"]
            ranks = best["metrics"].get("ranks")
            entry["epoch"] = best.get("epoch")
            if ranks is None:
                entry["note"] = "no per-query ranks recorded (evaluated before ranks were kept): rerun its evaluation"
            else:
                entry["r1"] = edit_kinds.r1_by_kind(ranks, kinds)
        models.append(entry)
    return {"benchmark": bench, "label": reg.params["benchmarks"][bench]["label"], "note": note,
            "kinds": None if kinds is None else {k: kinds.count(k) for k in edit_kinds.KIND_ORDER if k in kinds},
            "models": models}


def _saturation_by_epoch(reg: Registry, plan: dict, reads: dict) -> list[dict]:
    """Per epoch of the plain fine-tuning run and of the L_HN run: the share of micro-batches with InfoNCE
    below the threshold and with L_HN at or above it (a diagnostic beside the epoch-1 preconditions: does
    saturation set in, and does L_HN stay alive, later in training?)."""
    rows = []
    for key, field, label in (("plain", "saturated_frac", "InfoNCE saturated"),
                              ("hn", "hn_unsaturated_frac", "L_HN active")):
        run = plan[key]["run"]
        if run is None or not Path(paths.run_steps(run)).is_file():
            continue
        steps = _read(paths.run_steps(run), reads, f"steps:{run}", read_jsonl)
        epochs = sorted({step["epoch"] for step in steps})
        rows.append({"run": run, "method": plan[key]["method"], "measure": label,
                     "by_epoch": {int(e): regime.epoch_share(steps, e, field) for e in epochs}})
    return rows


def build_regime(reg: Registry) -> list[Path]:
    """Write and return results/stats/regime.json and results/stats/regime.md."""
    from hnclip.training.step import SATURATION_THRESHOLD
    started = time.time()
    plan = regime_plan(reg)
    reads: dict[str, Path] = {}
    preconditions = [_zeroshot(reg, plan, reads), *_saturation(reg, plan, reads, SATURATION_THRESHOLD),
                     _siblings(plan, reads), _geometry(reg, plan, reads), _headroom(reg, plan, reads)]
    report = {"profile": reg.profile_name, "saturation_threshold": SATURATION_THRESHOLD, "seed": plan["seed"],
              "micro_batch": plan["micro_batch"], "runs": {key: plan[key]["run"] for key in ("plain", "hn")},
              "all_met": regime.all_met(p["met"] for p in preconditions), "preconditions": preconditions}
    report["saturation_by_epoch"] = _saturation_by_epoch(reg, plan, reads)
    report["edit_kinds"] = _edit_kinds(reg, plan, reads)
    report["provenance"] = provenance.record("stats", inputs=reads, params={"regime_targets": plan["targets"]},
                                             wall_time_s=time.time() - started)
    json_path, md_path = paths.regime_report("json"), paths.regime_report("md")
    write_json(json_path, report)
    write_text(md_path, regime.render_markdown(report))
    return [json_path, md_path]
