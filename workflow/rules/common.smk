# Registry, schema validation and input functions shared by all rules.
import shlex
import sys

from hnclip.config import paths
from hnclip.config.params import validate_params
from hnclip.provenance.hashing import canonical_json
from hnclip.config.constants import PRETRAIN_ROLE
from hnclip.steps.data import dataset_generation
from hnclip.training.jobs import pretrain_spec
from hnclip.config.registry import Registry, with_generator_digest

validate_params(config)  # fails before any job starts, naming the bad key and the allowed values
REG = Registry(config, validate=False)
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
HNCLIP = f"{shlex.quote(sys.executable)} -m hnclip --profile {PROFILE}"
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


def backbone_weights():
    return paths.backbone_weights(BACKBONE, BACKBONE_SPEC["kind"], DATA_ROOT)


def train_inputs(wildcards):
    run = REG.run(wildcards.run)
    tests = {REG.params["benchmarks"][b]["test"]["dataset"] for b in REG.eval_benchmarks(run.train_set)}
    return {"init": backbone_weights(), "train_data": dataset_marker(run.train_set),
            "test_data": sorted(str(dataset_marker(role)) for role in tests)}


def evaluate_inputs(wildcards):
    data = {"data": test_data(wildcards.benchmark)}
    if REG.is_zeroshot(wildcards.run):
        return {**data, "init": backbone_weights()}
    return {**data, "model": paths.run_model(wildcards.run), "record": paths.run_record(wildcards.run)}


def test_data(benchmark):
    return dataset_marker(REG.params["benchmarks"][benchmark]["test"]["dataset"])


def table_inputs(wildcards):
    return [str(paths.evaluation(run, bench)) for run, bench in REG.evaluations([wildcards.table])]


def figure_inputs(wildcards):
    """A figure reads the evaluation records (and tables) of the tables it draws from."""
    tables = REG.figure_tables(wildcards.figure)
    if not tables:  # caption-geometry figures
        return [str(paths.stats(bench)) for bench in config["benchmarks"]]
    return [str(paths.evaluation(run, bench)) for run, bench in REG.evaluations(tables)] + \
        [str(paths.table(t, "csv")) for t in tables]


def timing_inputs(wildcards):
    from hnclip.report.build import timing_runs
    return [str(paths.run_record(run)) for run in timing_runs(REG, TIMING_TABLE).values() if run]


def all_targets():
    targets = []
    for table in REG.tables:
        targets += [str(paths.table(table, ext)) for ext in ("md", "tex", "csv")]
    targets += [str(paths.figure(name, ext)) for name in config["figures"] for ext in ("png", "pdf")]
    targets += [str(paths.stats(bench)) for bench in config["benchmarks"]]
    targets += [str(paths.table(CAPTION_GEOMETRY_TABLE, ext)) for ext in ("md", "tex", "csv")]
    targets.append(str(paths.overlap_report("vg", "urban1k")))
    targets += [str(paths.table(TIMING_TABLE, ext)) for ext in ("md", "csv")]
    # The data-fraction subsets as records (training derives the same ids from the same seed).
    targets += [str(paths.subsets(DATA_ROOT, b["train"])) for b in config["benchmarks"].values()]
    return targets
