"""`hnclip plan` (hnclip.plan.cost_plan): the paper profile's jobs, images, GPU-hours, disk and critical path
before anything runs, at the paper's Table A3 rates or a measured throughput file, and the SLURM time
limits the rules book from the same estimate (a Snakemake dry run reads them)."""
import json
import math
import re
import shutil

import pytest
from helpers.micro_project import ROOT, VENV_BIN, run

from hnclip.cli import main
from hnclip.config.registry import Registry
from hnclip.errors import UserError
from hnclip.plan.cost_plan import build_plan
from hnclip.plan.model_size import clip_parameters, model_config
from hnclip.plan.rates import PAPER_RATES
from hnclip.plan.settings import parse_minutes

# The paper's Table A1 and Table A3 (the plan's defaults for the paper profile).
VG_TRAIN, URBAN1K_TEST, EPOCHS = 14_579, 1_000, 10
STRUCTXLIP_RATE, PLAIN_RATE = 10.0, 55.5
STRUCTXLIP_VG = re.compile(r"vg-structxlip-g0-tok0-live-f1-s42-[0-9a-f]{8}")
# StructXLIP on VG: 10 epochs of VG paragraphs, and Urban-1K evaluated before training and after each epoch.
TRAIN_IMAGES, EVAL_IMAGES = VG_TRAIN * EPOCHS, URBAN1K_TEST * (EPOCHS + 1)
STRUCTXLIP_VG_HOURS = (TRAIN_IMAGES / STRUCTXLIP_RATE + EVAL_IMAGES / PLAIN_RATE) / 3600   # 4.10 h
STRUCTXLIP_VG_LIMIT = 385   # 1.5 x 246.3 min + 15, up to a multiple of 5


def structxlip_vg(plan):
    (job,) = [job for job in plan.jobs.values() if job.rule == "train" and STRUCTXLIP_VG.fullmatch(job.key)]
    return job


def test_structxlip_on_vg_is_planned_from_its_images_and_the_paper_rate(params):
    plan = build_plan(Registry(params, profile="paper"))
    job = structxlip_vg(plan)
    assert job.images == TRAIN_IMAGES + EVAL_IMAGES == 156_790
    assert job.hours == pytest.approx(STRUCTXLIP_VG_HOURS) and 4.0 < job.hours < 4.2
    assert job.after == ("auxiliary_segments:vg", "auxiliary_edges:vg")
    assert plan.rates["structxlip"] == PAPER_RATES["structxlip"] and "Table A3" in plan.rates["structxlip"].source
    # the SLURM time limit: above the estimate, by the stated safety factor and start-up allowance
    assert plan.time_limit_min(job.name) == STRUCTXLIP_VG_LIMIT > job.hours * 60
    assert plan.time_limit_min(job.name, attempt=2) == 2 * STRUCTXLIP_VG_LIMIT
    # a shard of SAM on VG, the gather, a shard of its edge maps, the gather, then StructXLIP on VG: the longest chain
    assert [j.name for j in plan.critical_path()] == ["auxiliary_segments_shard:vg/00000", "auxiliary_segments:vg",
                                                      "auxiliary_edges_shard:vg/00000", "auxiliary_edges:vg", job.name]
    shards = [plan.jobs[name] for name in plan.jobs["auxiliary_segments:vg"].after]
    assert [j.images for j in shards] == [256] * 56 + [VG_TRAIN - 56 * 256]  # 57 shards, the last one 243 images
    assert sum(j.hours for j in shards) == pytest.approx(VG_TRAIN * 8.6 / 3600)
    # one training job per unique run; peak disk holds every run's outputs and resume area
    runs = len(Registry(params, profile="paper").runs())
    assert sum(j.rule == "train" for j in plan.jobs.values()) == runs
    weights_gb = 4 * plan.parameters / 1e9
    assert plan.disk[f"run outputs ({runs} x model.pt + model_selected.pt)"] == pytest.approx(runs * 2 * weights_gb)


def test_hnclip_plan_prints_jobs_gpu_hours_and_the_critical_path(empty_project, capsys, params):
    assert main(["plan", "--profile", "paper"]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if STRUCTXLIP_VG.search(line) and line.startswith("  train:"))
    assert line.split()[1:4] == ["156,790", f"{STRUCTXLIP_VG_HOURS:.2f}", str(STRUCTXLIP_VG_LIMIT)]
    assert "427,747,841 parameters" in out and "vg       train       14,579  paper Table A1" in out
    gpu_hours = re.search(r"^  total +206 GPU jobs +([\d,.]+) GPU-h", out, re.M)  # 116 segment shards
    plan = build_plan(Registry(params, profile="paper"))
    segments = sum(job.gpu_hours for job in plan.jobs.values() if job.rule == "auxiliary_segments_shard")
    assert segments == pytest.approx(29_474 * 8.6 / 3600)  # the three training sets at 8.6 s per image
    total = sum(job.gpu_hours for job in plan.jobs.values() if job.gpus)
    assert float(gpu_hours.group(1).replace(",", "")) == pytest.approx(total, abs=0.005) and total > 140
    critical = out.split("Critical path (")[1].splitlines()
    assert critical[1].startswith("  auxiliary_segments_shard:vg/00000 (0.61") and STRUCTXLIP_VG.search(critical[5])
    assert re.search(r"^Peak disk .*\n(.*\n)*  total +[\d,.]+$", out, re.M)
    assert "partition limit: none set" in out


def test_a_job_over_the_partition_limit_is_flagged(empty_project, capsys, params):
    # a day: SAM's 35 h on VG are 57 shard jobs of under an hour, so nothing is over
    assert main(["plan", "--profile", "paper", "--partition-limit", "1-00:00:00"]) == 0
    assert "need more than the partition limit" not in capsys.readouterr().out
    # 45 minutes: not one epoch of StructXLIP on VG fits (1.5 x 24.6 min + 15), nor a shard of SAM (75 min)
    assert main(["plan", "--profile", "paper", "--partition-limit", "45"]) == 1
    out = capsys.readouterr().out
    flagged = re.findall(r"^  (\S+): estimate", out, re.M)
    assert STRUCTXLIP_VG.search(" ".join(flagged)) and "auxiliary_segments_shard:vg/00056" in flagged
    assert re.search(rf"^  train:{STRUCTXLIP_VG.pattern}: estimate 4.1 h, limit 385 min; not one epoch fits an "
                     r"allocation: it resumes on each retry, 9 allocations", out, re.M)
    assert "  auxiliary_segments_shard:vg/00000: estimate 0.6 h, limit 75 min; does not resume" in out
    plan = build_plan(Registry(params, profile="paper"), partition_limit=45)
    assert structxlip_vg(plan) in plan.over_limit()
    assert plan.time_limit_min(structxlip_vg(plan).name) == 45  # booked at the partition's limit
    assert all(plan.limit_min(job) <= 45 for job in plan.jobs.values() if job not in plan.over_limit())


def test_a_rates_file_overrides_the_paper_rates(empty_project, capsys, tmp_path):
    rows = [{"benchmark": "throughput", "method": "plain", "mode": "compute_batch", "img_per_s": 111.0,
             "shapes": {"model": "ViT-L-14-quickgelu"}, "device_name": "NVIDIA H100"},
            {"benchmark": "throughput", "method": "plain", "mode": "accumulate", "img_per_s": 50.0},
            {"benchmark": "throughput", "method": "structxlip", "img_per_s": 20.0}]
    rates = tmp_path / "throughput.jsonl"
    rates.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert main(["plan", "--profile", "paper", "--rates", str(rates)]) == 0
    out = capsys.readouterr().out
    # the paper profile encodes 128 pairs per forward: the compute_batch line counts, not the later one
    hours = (TRAIN_IMAGES / 20.0 + EVAL_IMAGES / 111.0) / 3600
    line = next(line for line in out.splitlines() if STRUCTXLIP_VG.search(line) and line.startswith("  train:"))
    assert line.split()[2] == f"{hours:.2f}"
    assert re.search(r"^  plain +111 +.*throughput.jsonl: plain \(compute_batch, ViT-L-14-quickgelu, NVIDIA H100",
                     out, re.M)
    assert re.search(r"^  goal +22 +paper +not in .*throughput.jsonl \(no accumulate row of its own\)", out, re.M)
    assert re.search(r"^  hnclip +106 +scaled +.*scaled from plain.s compute_batch row x 0.955", out, re.M)
    assert re.search(r"^  segments +0.116 +assumed +assumed 8.6 s", out, re.M)  # another model: kept
    rates.write_text('{"method": "unknown", "img_per_s": 3}\n')
    assert main(["plan", "--profile", "paper", "--rates", str(rates)]) == 2
    assert "no line has a `method`" in capsys.readouterr().err


def test_a_built_manifest_gives_the_dataset_size(empty_project, params):
    manifest = empty_project / "data" / "real" / "vg" / "train.jsonl"
    manifest.parent.mkdir(parents=True)
    manifest.write_text("".join(json.dumps({"id": str(i)}) + "\n" for i in range(3)))
    plan = build_plan(Registry(params, profile="paper"))
    assert plan.sizes["vg", "train"] == (3, str(manifest.relative_to(empty_project)))
    assert structxlip_vg(plan).images == 3 * EPOCHS + EVAL_IMAGES


@pytest.mark.parametrize("text, minutes", [("2880", 2880), (90, 90), ("90:30", 91), ("48:00:00", 2880),
                                           ("2-00:00:00", 2880), ("2-12", 3600), ("1-12:30", 2190)])
def test_partition_limits_in_slurm_notation(text, minutes):
    assert parse_minutes(text) == minutes  # SLURM's --time forms


def test_a_malformed_partition_limit_is_a_user_error(empty_project, capsys):
    assert main(["plan", "--profile", "paper", "--partition-limit", "two days"]) == 2
    assert "partition limit 'two days'" in capsys.readouterr().err


def test_parameter_count_from_the_model_config():
    # measured with open_clip 3.3.0 (create_model at context 248, sum of numel)
    assert clip_parameters(model_config("ViT-L-14-quickgelu")) == 427_747_841
    assert clip_parameters(model_config("hnclip-tiny-w128")) == 7_992_321
    assert clip_parameters(model_config("longclip-rehearsal")) == 3_328_385


def test_the_rules_book_the_plans_time_limits_and_scatter_the_segments(tmp_path, params):
    """A Snakemake dry run of StructXLIP on VG (paper profile, with a 4-hour partition) once VG's manifest is
    built (the `dataset` checkpoint: it gives the shard count): one job per shard of 256 images for the
    segments and for the edge maps, each booking the plan's limit; the training run, over the partition's,
    in two allocations of whole epochs under it."""
    for name in ("Snakefile", "params.yaml"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "workflow", tmp_path / "workflow")
    vg = tmp_path / "data" / "real" / "vg"
    vg.mkdir(parents=True)
    (tmp_path / "data" / "real" / "vg_paragraphs").mkdir()
    (tmp_path / "data" / "real" / "vg_paragraphs" / "download.json").write_text("{}")
    (vg / "x.jpg").write_bytes(b"")   # the manifest's rows name an image that exists
    row = {"image": "x.jpg", "caption": "c", "short_caption": "c", "split": "train", "source_sha256": "0"}
    (vg / "train.jsonl").write_text("".join(json.dumps({"id": str(i), **row}) + "\n" for i in range(VG_TRAIN)))
    (vg / "dataset.json").write_text("{}")  # written after its input: the checkpoint is up to date
    job = structxlip_vg(build_plan(Registry(params, profile="paper")))
    proc = run([str(VENV_BIN / "snakemake"), "-n", "--cores", "8", "--config", "profile=paper",
                "planning={partition_limit: '4:00:00'}", "--", f"results/runs/{job.key}/model.pt"], tmp_path)
    booked: dict[str, set] = {}
    for m in re.finditer(r"^rule (\w+):\n(?:    .*\n)*?    resources: .*runtime=(\d+)", proc.stdout, re.M):
        booked.setdefault(m.group(1), set()).add(int(m.group(2)))
    shard_limit = math.ceil((1.5 * 256 * 8.6 / 60 + 15) / 5) * 5
    # StructXLIP on VG (385 min in one) trains epochs 1-6 in one allocation, 7-10 in the run's own job
    assert booked == {"train_part": {240}, "train": {165}, "auxiliary_segments_shard": {shard_limit, 70},
                      "auxiliary_segments": {20}, "auxiliary_edges_shard": {20}, "auxiliary_edges": {20}}
    assert f"output: .cache/train-parts/{job.key}/until-6.done" in proc.stdout  # `hnclip train --until-epoch 6`
    assert shard_limit == 75  # the last shard (243 images) books 70
    stats = dict(re.findall(r"^(auxiliary_\w+)\s+(\d+)$", proc.stdout.split("Job stats:")[1], re.M))
    assert stats == {"auxiliary_segments_shard": "57", "auxiliary_segments": "1", "auxiliary_edges_shard": "57",
                     "auxiliary_edges": "1"}
    assert "need more than the partition limit" not in proc.stderr


def test_a_job_no_table_asks_for_gets_its_rules_longest_limit(params):
    plan = build_plan(Registry(params, profile="paper"))
    longest = max(plan.limit_min(job) for job in plan.jobs.values() if job.rule == "evaluate")
    assert plan.time_limit_min(f"evaluate:{structxlip_vg(plan).key}/docci") == longest  # not a planned cell
    with pytest.raises(UserError, match="no planned job 'unknown:x'"):
        plan.time_limit_min("unknown:x")
