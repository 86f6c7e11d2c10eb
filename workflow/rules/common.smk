# Registry, schema validation and input functions shared by all rules.
import shlex
import sys
from pathlib import Path
from types import SimpleNamespace

from hnclip.config import paths
from hnclip.hashing import canonical_json
from hnclip.config.constants import PRETRAIN_ROLE, STRONGEST_BASELINE_TABLE
from hnclip.commands.data import dataset_generation
from hnclip.commands.image_cache import marker_path as image_cache_marker
from hnclip.config.registry import Registry, pretrain_spec, with_generator_digest

# fails before any job starts, naming every bad key and broken reference with the allowed values
REG = Registry(config)
PROFILE = REG.profile_name
DATA_ROOT = REG.profile["data_root"]
EXECUTION = REG.profile["execution"]
BACKBONE = REG.backbone_name()
BACKBONE_SPEC = REG.backbone_spec()
# The interpreter running Snakemake (the project's .venv) runs the jobs too: no PATH assumptions.
CAPTION_GEOMETRY_TABLE = REG.derived_table("caption_geometry")
TIMING_TABLE = REG.derived_table("timing")
# The HTML report (`snakemake --report`) groups tables and figures by the paper section they belong to.
GEOMETRY_SECTION = config["derived_tables"][CAPTION_GEOMETRY_TABLE]["section"]
TIMING_SECTION = config["derived_tables"][TIMING_TABLE]["section"]
# Short jobs fork from a warm server that imported torch once (execution.process_reuse; any failure
# runs the job in its own process); one long job (pretraining) gains nothing and starts plainly.
HNCLIP_PLAIN = f"{shlex.quote(sys.executable)} -m hnclip --profile {PROFILE}"
HNCLIP = (f"{shlex.quote(sys.executable)} -m hnclip.runtime.warm --profile {PROFILE}"
          if EXECUTION.get("process_reuse") else HNCLIP_PLAIN)
USES_GPU = 0 if EXECUTION["device"] == "cpu" else 1
# Several GPUs per run: torchrun starts one process per GPU; losses gather features across them.
GPUS_PER_RUN = EXECUTION.get("gpus_per_run", 1)
TRAIN_LAUNCHER = HNCLIP if GPUS_PER_RUN == 1 else (
    f"{shlex.quote(sys.executable)} -m torch.distributed.run --standalone --nproc_per_node {GPUS_PER_RUN} "
    f"-m hnclip --profile {PROFILE}")

wildcard_constraints:
    run=r"[A-Za-z0-9_.\-]+",
    benchmark="|".join(config["benchmarks"]),
    source=r"[a-z0-9_]+",
    table="|".join(config["tables"]),
    figure="|".join(config["figures"]),


def report_section(kind, name):
    """A table's or figure's paper section (report category); tables without one go under "Tables"."""
    return config[kind][name].get("section", "Tables")


def dataset_marker(role):
    return paths.dataset_dir(DATA_ROOT, role) / "dataset.json"


def dataset_inputs(wildcards):
    """A real dataset's manifests are built from its verified download (never re-built on mtimes)."""
    spec = dataset_generation(REG, wildcards.dataset)
    if spec["kind"] != "real":
        return []
    return [str(paths.download_record(DATA_ROOT, spec["source"]))]


def source_pins(source):
    """The checksums the profile's source table pins a source's files to (params of its download)."""
    from hnclip.data.source_tables import pins
    return canonical_json(pins(REG.profile, source))


def backbone_weights():
    return paths.backbone_weights(BACKBONE, BACKBONE_SPEC["kind"], DATA_ROOT)


def train_inputs(wildcards):
    run = REG.run(wildcards.run)
    tests = {REG.params["benchmarks"][b]["test"]["dataset"] for b in REG.eval_benchmarks(run.train_set)}
    return {"init": backbone_weights(), "train_data": dataset_marker(run.train_set),
            "test_data": sorted(str(dataset_marker(role)) for role in tests),
            "auxiliary": [str(path) for path in REG.auxiliary_inputs(wildcards.run).values()],
            "image_cache": image_cache_inputs([run.train_set, *tests])}


def train_part_marker(run, epoch):
    """What a run's allocation through `epoch` leaves (workflow/rules/train.smk: temporary)."""
    return f".cache/train-parts/{run}/until-{epoch}.done"


def previous_train_part(wildcards):
    """The marker of the allocation a train_part or a run's last allocation resumes from (none: the first)."""
    epoch = int(wildcards.epoch) if hasattr(wildcards, "epoch") else None
    before = [until for until in PLAN.train_parts(wildcards.run) if epoch is None or until < epoch]
    return [train_part_marker(wildcards.run, before[-1])] if before else []


def evaluate_inputs(wildcards):
    data = {"data": test_data(wildcards.benchmark),
            "image_cache": image_cache_inputs([REG.params["benchmarks"][wildcards.benchmark]["test"]["dataset"]])}
    if REG.is_zeroshot(wildcards.run):
        return {**data, "init": backbone_weights()}
    inputs = {**data, "model": paths.run_model(wildcards.run), "record": paths.run_record(wildcards.run)}
    if evaluation_encodes(wildcards):  # a transfer cell: the checkpoint selected on the run's own benchmark
        inputs["model_selected"] = paths.run_selected_model(wildcards.run)
    return inputs


def test_data(benchmark):
    return dataset_marker(REG.params["benchmarks"][benchmark]["test"]["dataset"])


def table_inputs(wildcards):
    from hnclip.report.tables import probe_inputs  # the probed runs' records (Table X1's gradient section)
    return [str(paths.evaluation(run, bench)) for run, bench in REG.evaluations([wildcards.table])] + \
        [str(path) for path in probe_inputs(REG, wildcards.table)]


def figure_inputs(wildcards):
    """A figure reads the evaluation records (and tables) of the tables it draws from."""
    tables = REG.figure_tables(wildcards.figure)
    if not tables:  # caption-geometry figures
        return [str(paths.stats(bench)) for bench in config["benchmarks"]]
    inputs = [str(paths.evaluation(run, bench)) for run, bench in REG.evaluations(tables)] + \
        [str(paths.table(t, "csv")) for t in tables]
    if wildcards.figure in GRADIENT_FIGURES:  # its statistics (computed from the runs' probe logs)
        inputs.append(str(stats_path(wildcards.figure)))
    if config["figures"][wildcards.figure]["kind"] == "sample_efficiency":  # the strongest-baseline line
        inputs.append(str(paths.table(STRONGEST_BASELINE_TABLE, "csv")))
    return inputs


def timing_inputs(wildcards):
    return [str(paths.run_record(run)) for run in REG.timed_runs(TIMING_TABLE).values() if run]


def all_targets():
    targets = []
    targets += gradient_stats_targets()
    targets += claims_targets()
    targets += regime_targets()
    for table in REG.tables:
        targets += [str(paths.table(table, ext)) for ext in ("md", "tex", "csv")]
    targets += [str(paths.figure(name, ext)) for name in config["figures"] for ext in ("png", "pdf")]
    targets += [str(paths.stats(bench)) for bench in config["benchmarks"]]
    targets += [str(paths.table(CAPTION_GEOMETRY_TABLE, ext)) for ext in ("md", "tex", "csv")]
    targets.append(str(paths.overlap_report("vg", "urban1k")))
    targets += [str(paths.table(TIMING_TABLE, ext)) for ext in ("md", "csv")]
    # The data-fraction subsets as records (training derives the same ids from the same seed).
    targets += [str(paths.subsets(DATA_ROOT, b["train"])) for b in config["benchmarks"].values()]
    targets += [str(dvc_metrics.METRICS), str(dvc_metrics.CONVERGENCE)]  # for dvc metrics / dvc plots
    return targets


# ---- DVC metrics and plots; threads, memory and GPU slots -----------------------------------------
from hnclip.commands import metrics as dvc_metrics  # where `hnclip metrics` writes (rule metrics)
from hnclip.plan.cost_plan import build_plan
from hnclip.plan.estimates import evaluation_encodes as encodes

# Pretraining (the embedded backbone's) runs alone at the head of the DAG, on a fixed number of
# threads rather than all cores: its float reductions depend on the thread count, so the initial
# weights must not change with the machine (Snakemake lowers it where --cores is lower). The SLURM
# profile books as many CPUs.
PRETRAIN_THREADS = 8
PRETRAIN_MEM_MB = 4000
# The cost plan (`hnclip plan` prints it): each computing job's images at stated rates. Its estimate
# gives the SLURM time limit of the rules that run models (`runtime=planned_runtime(...)`) and the host
# memory of the model-bound ones (from the parameter count). A job over params.yaml's
# planning.partition_limit is reported here, before anything is submitted, and booked at that limit.
PLAN = build_plan(REG)
if workflow.is_main_process:
    for line in PLAN.partition_warnings():
        print(line, file=sys.stderr)


def planned_runtime(rule, key):
    """A rule's `runtime` (minutes) from the plan, for job `<rule>:<key>` (key: a wildcards pattern)."""
    return lambda wildcards, attempt: PLAN.time_limit_min(f"{rule}:{key.format(**dict(wildcards.items()))}", attempt)


# Host memory (MB) a job may use: what `--resources mem_mb=<RAM>` budgets on one machine and what a
# cluster executor books (the SLURM profile's set-resources carry the paper profile's values again, and
# tests keep them equal). Model-bound jobs: the plan's estimate; `dataset` scales with the data kind.
MEM_MB = PLAN.host_mem_mb()
DATASET_MEM_MB = {"real": 16000, "synthetic": 2000}  # unpacking and converting a download vs generating
LIGHT_MEM_MB = 1000  # a job that reads JSON records


def dataset_mem_mb(wildcards):
    return DATASET_MEM_MB[dataset_generation(REG, wildcards.dataset)["kind"]]


def evaluation_encodes(wildcards):
    """Does `hnclip evaluate` load and run a model here? Only for the zero-shot backbone and for
    benchmarks outside the run's training-time evaluation; otherwise it selects from the training record."""
    return encodes(REG, wildcards.run, wildcards.benchmark)


def evaluation_gpu(wildcards):
    return USES_GPU if evaluation_encodes(wildcards) else 0


def evaluation_mem_mb(wildcards):
    return MEM_MB["evaluate"] if evaluation_encodes(wildcards) else LIGHT_MEM_MB


# ---- Baselines' auxiliary inputs (workflow/rules/auxiliary.smk) -----------------------------------
def auxiliary_segment_inputs(wildcards):
    """A training set's manifests and the segmenter's and matcher's weights (GOAL's LISM pairs)."""
    from hnclip.commands.auxiliary import model_inputs
    return {"train_data": dataset_marker(wildcards.dataset), **{k: str(v) for k, v in model_inputs(REG).items()}}


def auxiliary_shard_pattern(kind):
    """Where shard {shard} of a training set's build is written: `hnclip auxiliary <kind> --shard K` writes
    shard_dir(<index>)/shard-KKKKK.jsonl (hnclip.auxiliary.shards)."""
    return str(paths.shard_dir(paths.auxiliary_index(DATA_ROOT, "{dataset}", kind)) / "shard-{shard}.jsonl")


def auxiliary_shard_files(kind):
    """A gather's input function: every shard of the build. Their number is the training manifest's, known
    once the `dataset` checkpoint has built it; until then Snakemake waits and re-evaluates."""
    from hnclip.commands.auxiliary import auxiliary_shard_count  # what `hnclip auxiliary shard-count` prints

    def shard_files(wildcards):
        checkpoints.dataset.get(dataset=wildcards.dataset)
        shards = [f"{k:05d}" for k in range(auxiliary_shard_count(REG, wildcards.dataset, kind))]
        return expand(auxiliary_shard_pattern(kind), dataset=wildcards.dataset, shard=shards)
    return shard_files


# ---- Gradient-dynamics statistics (workflow/rules/gradient_stats.smk; figure_inputs above) --------
from hnclip.config.registry import GRADIENT_FIGURE_KINDS
from hnclip.report.gradient_stats import report_caption, stats_path
from hnclip.commands.gradient_stats import figure_runs

GRADIENT_FIGURES = [name for name, spec in config["figures"].items() if spec["kind"] in GRADIENT_FIGURE_KINDS]


def gradient_stats_inputs(wildcards):
    """The training records of the figure's runs (each probed run writes grad_probe.jsonl beside it)."""
    runs = figure_runs(REG, config["figures"][wildcards.figure])
    return sorted({str(paths.run_record(run["run_id"])) for run in runs})


def gradient_stats_targets():
    return [str(stats_path(name)) for name in GRADIENT_FIGURES]


def figure_caption(wildcards, input):
    """A gradient figure's statistics sentence for the HTML report (empty for other figures). It
    takes `input`, so Snakemake counts it as derived from the inputs: never a reason to rerun."""
    return report_caption(wildcards.figure) if wildcards.figure in GRADIENT_FIGURES else ""


# ---- Effects, step timing and the claims scorecard (workflow/rules/claims.smk) --------------------
def step_timing_inputs(wildcards):
    """Every input of the timing table's runs (train_inputs of each): they take steps in turn."""
    return sorted({str(p) for run in (REG.paired_timing() or {}).get("runs", {}).values()
                   for group in train_inputs(SimpleNamespace(run=run)).values()
                   for p in ([group] if isinstance(group, (str, Path)) else group)})


def claims_targets():
    """The targets of claims.smk (for all_targets): every table's effects and the scorecard."""
    effects = [f"results/effects/{table}.{ext}" for table in REG.tables for ext in ("csv", "md")]
    return effects + ["results/claims.csv", "results/claims.md"]


# ---- Regime preconditions (workflow/rules/regime.smk) ---------------------------------------------
def regime_targets():
    """The targets of regime.smk (for all_targets; none when params.yaml declares no targets)."""
    if not config.get("regime_targets"):
        return []
    return [str(paths.regime_report("json")), str(paths.regime_report("md"))]


def image_cache_inputs(roles):
    """The image-cache markers of these dataset roles (workflow/rules/image_cache.smk), where the profile
    reads images from the cache."""
    if not EXECUTION.get("image_cache"):
        return []
    return sorted({str(image_cache_marker(DATA_ROOT, role)) for role in roles})
