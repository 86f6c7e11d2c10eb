"""`hnclip plan` for a cluster: the wall time on N GPUs (list scheduling), shard jobs under any partition
limit, no GPU type booked unless set, the disk every keep_* setting, GOAL's crops and DVC's cache leave,
and each framework priced from its own measured row."""
import copy
import json
import math
import re

import pytest
import yaml
from helpers.micro_project import ROOT

from hnclip.cli import main
from hnclip.config.registry import Registry
from hnclip.errors import UserError
from hnclip.plan.cost_plan import build_plan
from hnclip.plan.estimates import KEPT_AFTER_TRAINING, dvc_cache_type
from hnclip.plan.gpu_schedule import list_schedule, span_hours, wall_hours
from hnclip.plan.rates import CLASS_FRAMEWORK, read_rates

VG_SHARDS, SHARD_HOURS = 57, 256 * 8.6 / 3600   # VG's 14,579 training images in shards of 256, at 8.6 s each
PAPER_RUNS, WEIGHTS_GB = 69, 4 * 427_747_841 / 1e9


def paper_plan(params, **execution):
    params = copy.deepcopy(params)
    params["profiles"]["paper"]["execution"].update(execution)
    return build_plan(Registry(params, profile="paper", validate=False))


def test_on_8_gpus_vgs_segments_take_an_eighth_plus_one_shard(empty_project, params, capsys):
    plan = paper_plan(params)
    shards = list(plan.jobs["auxiliary_segments:vg"].after)
    one_gpu = sum(plan.jobs[name].hours for name in shards)
    assert len(shards) == VG_SHARDS and one_gpu == pytest.approx(14_579 * 8.6 / 3600)
    slots = plan.schedule(8)
    assert span_hours(slots, shards) <= one_gpu / 8 + SHARD_HOURS
    assert wall_hours(slots) < wall_hours(plan.schedule(1)) / 4
    # every job ran once, none before the jobs it waits for
    assert set(slots) == set(plan.jobs)
    assert all(slots[dep].end <= slot.start for slot in slots.values() for dep in slot.job.after)
    assert main(["plan", "--profile", "paper", "--gpus", "8"]) == 0
    out = capsys.readouterr().out
    line = re.search(r"^  segments of vg: 57 shards, ([\d.]+) h on one GPU at segments \(0.116 img/s, assumed\); "
                     r"([\d.]+) h here \(one-GPU time / 8 \+ one shard: ([\d.]+) h\)$", out, re.M)
    assert line and float(line.group(2)) <= float(line.group(3)) == pytest.approx(one_gpu / 8 + SHARD_HOURS, abs=0.01)
    assert re.search(r"^On 8 GPU\(s\): [\d.]+ h wall clock", out, re.M)


def test_list_scheduling_respects_gpus_and_order():
    from hnclip.plan.estimates import Job
    jobs = {j.name: j for j in [Job("a", "1", 0, 2.0, 1), Job("a", "2", 0, 2.0, 1), Job("a", "3", 0, 1.0, 1),
                                Job("b", "x", 0, 2.0, 2, ("a:1",)), Job("c", "cpu", 0, 5.0, 0)]}
    slots = list_schedule(jobs, 2)
    # a:1 and a:2 first (the longest chains ahead), then b:x waits for a:1 and both GPUs; a:3 fills in
    assert (slots["a:1"].start, slots["a:2"].start, slots["a:3"].start) == (0.0, 0.0, 2.0)
    assert (slots["b:x"].start, slots["b:x"].end, slots["c:cpu"].start) == (3.0, 4.0, 0.0)
    assert wall_hours(slots) == 5.0


@pytest.mark.parametrize("limit", ["4:00:00", "1-00:00:00"])
def test_no_shard_or_gather_books_more_than_the_partition_limit(params, limit):
    plan = build_plan(Registry(params, profile="paper"), partition_limit=limit)
    cap = plan.settings.partition_limit_min
    auxiliary = [job for job in plan.jobs.values() if job.rule.startswith("auxiliary_")]
    assert len(auxiliary) == 2 * (22 + 37 + 57 + 3)   # segments and edges: shards of DCI, DOCCI, VG + gathers
    assert all(plan.limit_min(job) <= cap for job in auxiliary)
    assert all(plan.time_limit_min(job.name, attempt) <= cap for job in plan.jobs.values() for attempt in (1, 2, 3))
    assert plan.over_limit() == []
    # 4 h: StructXLIP on VG (4.1 h, 385 min booked) and on DOCCI (2.9 h, 275 min) train in two allocations
    assert {tuple(job.key.split("-")[:2]) for job in plan.jobs.values() if job.rule == "train_part"} == (
        {("vg", "structxlip"), ("docci", "structxlip")} if cap == 240 else set())


def test_no_rule_books_a_gpu_type_unless_set():
    profile = yaml.safe_load((ROOT / "workflow" / "profiles" / "slurm" / "config.yaml").read_text())
    assert [rule for rule, res in profile["set-resources"].items() if "gpu_model" in res] == []
    rules = "".join(path.read_text() for path in (ROOT / "workflow" / "rules").glob("*.smk"))
    assert "gpu_model" not in rules and "a100" not in rules.lower()


@pytest.mark.parametrize("execution, kept_gb", [
    ({}, 0.0),
    ({"keep_epoch_weights": True}, PAPER_RUNS * 10 * WEIGHTS_GB),                         # 1,180.6 GB
    ({"keep_resume_checkpoints": True}, 2 * 412.06),             # last.pt + previous.pt, each with its selected
    ({"keep_epoch_weights": True, "keep_resume_checkpoints": True}, 2 * 412.06 + PAPER_RUNS * 10 * WEIGHTS_GB)])
def test_disk_left_after_training_follows_each_keep_setting(params, execution, kept_gb):
    disk = paper_plan(params, **execution).disk
    assert disk[KEPT_AFTER_TRAINING] == pytest.approx(kept_gb, abs=0.01)
    if execution == {"keep_epoch_weights": True}:
        assert round(disk[KEPT_AFTER_TRAINING], 1) == 1180.6


def test_crop_files_and_dvc_copies_are_counted(params, tmp_path, monkeypatch):
    disk = paper_plan(params).disk
    assert disk["GOAL's crops (lism.crop_files false: boxes, no files)"] == 0.0
    assert disk["DVC cache: none more (cache.type symlink,hardlink: links)"] == 0.0   # this repository's
    with_crops = copy.deepcopy(params)
    with_crops["profiles"]["paper"]["auxiliary"]["lism"]["crop_files"] = True
    plan = build_plan(Registry(with_crops, profile="paper", validate=False))
    assert plan.disk["GOAL's crop PNGs (29,474 images x 2 MB, assumed)"] == pytest.approx(29_474 * 2 / 1000)
    (tmp_path / ".dvc").mkdir()
    (tmp_path / ".dvc" / "config").write_text("[cache]\n    type = reflink,copy\n")
    assert dvc_cache_type(tmp_path) == ("reflink,copy", False)
    monkeypatch.chdir(tmp_path)   # a project whose DVC copies: the run outputs twice
    disk = paper_plan(params).disk
    outputs = disk[f"run outputs ({PAPER_RUNS} x model.pt + model_selected.pt)"]
    assert disk["DVC cache: the run outputs again (cache.type reflink,copy)"] == outputs == pytest.approx(
        PAPER_RUNS * 2 * WEIGHTS_GB)


def test_each_framework_is_priced_from_its_own_row(tmp_path):
    rows = [{"method": "plain", "framework": "full", "mode": "compute_batch", "img_per_s": 400.0},
            {"method": "plain", "framework": "full", "mode": "accumulate", "img_per_s": 190.0},
            {"method": "goal", "framework": "goal", "mode": "accumulate", "img_per_s": 80.0},
            {"method": "finelip", "framework": "finelip", "mode": "accumulate", "precision": "fp32", "img_per_s": 60.0},
            {"method": "structxlip", "framework": "full", "mode": "accumulate", "img_per_s": 999.0},  # mislabelled
            {"method": "evaluate", "mode": "evaluate", "img_per_s": 900.0}]
    path = tmp_path / "throughput.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    rates = read_rates(path, "compute_batch")
    assert (rates["plain"].per_s, rates["goal"].per_s, rates["finelip"].per_s, rates["evaluate"].per_s) == (
        400.0, 80.0, 60.0, 900.0)
    assert {cls: rates[cls].kind for cls in ("plain", "goal", "finelip", "evaluate")} == dict.fromkeys(
        ("plain", "goal", "finelip", "evaluate"), "measured")
    assert rates["structxlip"].per_s == 10.0 and rates["structxlip"].kind == "paper"   # never another row's
    assert rates["hnclip"].kind == "scaled" and "plain's compute_batch row" in rates["hnclip"].source
    for cls, framework in CLASS_FRAMEWORK.items():   # no baseline's rate comes from another framework's row
        if rates[cls].kind in ("measured", "scaled") and cls in ("goal", "structxlip", "finelip"):
            assert rates[cls].kind == "measured" and f": {cls} (" in rates[cls].source


def test_rows_measured_on_another_model_price_nothing(tmp_path):
    vit_l, tiny = {"model": "ViT-L-14-quickgelu"}, {"model": "hnclip-tiny"}
    rows = [{"method": "plain", "framework": "full", "mode": "compute_batch", "img_per_s": 439.0, "shapes": vit_l},
            {"method": "plain", "framework": "full", "mode": "compute_batch", "img_per_s": 4.6, "shapes": tiny},
            {"method": "goal", "framework": "goal", "mode": "accumulate", "img_per_s": 3.1, "shapes": tiny}]
    path = tmp_path / "throughput.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    rates = read_rates(path, "compute_batch", "ViT-L-14-quickgelu")
    assert rates["plain"].per_s == 439.0                                  # the later tiny row is left out
    assert (rates["goal"].per_s, rates["goal"].kind) == (22.0, "paper")   # its only row is at other shapes
    assert read_rates(path, "compute_batch", "hnclip-tiny")["goal"].per_s == 3.1
    with pytest.raises(UserError, match="another model"):
        read_rates(path, "compute_batch", "ViT-B-16")


def test_measured_auxiliary_rates_per_dataset_size(params, tmp_path):
    rows = [{"benchmark": "auxiliary_throughput", "path": "today", "dataset_size": "vg", "s_per_image": 9.0},
            {"benchmark": "auxiliary_throughput", "path": "new", "dataset_size": "vg", "s_per_image": 2.0,
             "device_name": "NVIDIA H100"},
            {"benchmark": "auxiliary_throughput", "path": "new", "dataset_size": "docci", "s_per_image": 4.0}]
    path = tmp_path / "auxiliary_throughput.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    plan = build_plan(Registry(params, profile="paper"), auxiliary_rates=str(path))
    assert plan.rates["segments/vg"].per_s == 0.5 and plan.rates["segments/vg"].kind == "measured"
    assert plan.rates["segments"].per_s == 0.25   # DCI, not measured: the slowest size measured
    vg = [plan.jobs[name] for name in plan.jobs["auxiliary_segments:vg"].after]
    assert sum(job.hours for job in vg) == pytest.approx(14_579 * 2.0 / 3600)
    assert vg[0].note == "256 images at segments/vg"


def test_host_memory_counts_the_loader_workers_and_their_caches(params):
    from hnclip.data.loader import DEFAULT_IMAGE_CACHE_MB
    from hnclip.plan import estimates
    assert estimates.DEFAULT_IMAGE_CACHE_MB == DEFAULT_IMAGE_CACHE_MB
    cap, image = DEFAULT_IMAGE_CACHE_MB * 2**20, 3 * 224**2 * 4   # a decoded 224 px image, fp32
    # DOCCI's 5,100 test images fill a cache (DCI's and VG's runs read less): the evaluate job's main
    # process and each of its 8 workers (500 MB each) hold one
    loading = cap + 8 * (500e6 + cap)
    encode = 2 * 4 * 427_747_841 + 256 * image
    decoding = {"loader_workers": 8, "image_cache": False}
    assert 5_100 * image > cap and paper_plan(params, **decoding).host_mem["evaluate"] == 1000 * math.ceil(
        (6000 + 1.5 * (encode + loading) / 1e6) / 1000) == 32_000
    # no workers: the main process's caches only; the image cache (memory-mapped pixels): none, and its
    # workers are threads of the job (evaluation, and the training of every framework whose micro-batches
    # decode nothing more), so they hold nothing of their own
    assert paper_plan(params, loader_workers=0, image_cache=False).host_mem["evaluate"] == 1000 * math.ceil(
        (6000 + 1.5 * (encode + cap) / 1e6) / 1000) == 13_000
    cached, cached_inline = paper_plan(params, loader_workers=8, image_cache=True), paper_plan(
        params, loader_workers=0, image_cache=True)
    assert cached.host_mem["evaluate"] == cached_inline.host_mem["evaluate"] == 12_000
    # GOAL's and StructXLIP's micro-batches still decode crops and edge maps: their 8 processes, 500 MB each
    assert cached.host_mem["train"] - cached_inline.host_mem["train"] == 1.5 * 8 * 500 == 6_000
    assert paper_plan(params, **decoding).host_mem["train"] == 51_000 > paper_plan(
        params, loader_workers=0, image_cache=False).host_mem["train"]


def test_a_run_over_the_partition_limit_trains_in_allocations_of_whole_epochs(params):
    whole = build_plan(Registry(params, profile="paper"))
    plan = build_plan(Registry(params, profile="paper"), partition_limit="2:00:00")
    (run,) = [job for job in whole.jobs.values() if job.rule == "train" and job.key.startswith("vg-structxlip-g0-")
              and "-s42-" in job.key]
    # 4.10 h in all, 0.41 h an epoch: 1.5 x 2 epochs x 24.6 min + 15 = 89 min fits 120, three would not
    assert plan.train_parts(run.key) == [2, 4, 6, 8]
    chain = [plan.jobs[f"train_part:{run.key}/{epoch}"] for epoch in (2, 4, 6, 8)] + [plan.jobs[run.name]]
    assert [job.after for job in chain] == [run.after] + [(job.name,) for job in chain[:-1]]
    assert sum(job.gpu_hours for job in chain) == pytest.approx(run.gpu_hours)
    assert [plan.time_limit_min(job.name) for job in chain] == [90] * 5
    assert plan.over_limit() == [] and all(plan.limit_min(job) <= 120 for job in plan.jobs.values())
    assert whole.train_parts(run.key) == []   # no limit: one allocation


def test_a_shard_of_a_dataset_the_plan_could_not_size_books_a_full_shard(params):
    """The rehearsal's miniatures have no Table A1 count and no manifest when the Snakefile plans: their
    shards, known from the `dataset` checkpoint later, book a full shard's limit."""
    plan = build_plan(Registry(params, profile="paper_rehearsal", validate=False))
    assert plan.jobs["auxiliary_segments:docci"].after == ()   # no shard planned
    assert plan.time_limit_min("auxiliary_segments_shard:docci/00000") == math.ceil(
        (1.5 * 256 * 8.6 / 60 + 15) / 5) * 5 == 75
    assert plan.time_limit_min("auxiliary_edges_shard:vg/00000", attempt=2) == 2 * 20
