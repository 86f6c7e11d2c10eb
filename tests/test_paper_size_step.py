"""benchmarks/paper_size_step.py at the paper's real widths with one block per tower: every framework the
paper profile trains takes one optimizer step through the trainer's code, with finite losses and a gradient
for every trainable parameter, and SAM ViT-H / CLIP ViT-L/14-336 run through the project's segmenter and
matcher; each record has the fields the results file is read for."""
from __future__ import annotations

import importlib
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the scripts import each other by module name
paper_size_step = importlib.import_module("paper_size_step")

ADAPTERS = ("lora", "dora")
HN_CLIP_FAMILY = ("longclip_ft", "hn_clip", "frozen_g", *ADAPTERS)


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> list[dict]:
    """One run of the script at one block per tower (SAM on a 4x4 point grid: its per-point mask upsampling,
    not its encoder, is most of its CPU time)."""
    out = tmp_path_factory.mktemp("paper_size_step") / "paper_size_step.jsonl"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "paper_size_step.py"), "--layers", "1",
                           "--sam-points-per-side", "4", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_every_framework_steps_at_real_width_with_a_gradient_for_every_trainable_parameter(records):
    steps = {r["framework"]: r for r in records if r["part"] == "train_step"}
    assert list(steps) == list(paper_size_step.FRAMEWORKS)
    full = steps["longclip_ft"]["trainable_parameters"]
    for name, record in steps.items():
        assert record["status"] == "ok", (name, record.get("error"))
        assert record["losses"] and record["losses_finite"] and all(math.isfinite(v) for v in record["losses"].values())
        assert record["params_without_grad_unexpected"] == [] and record["params_with_non_finite_grad"] == []
        assert record["params_non_finite_after_step"] == [] and math.isfinite(record["grad_norm"])
        assert record["trainable_parameters"] > 0 and record["wall_s"] > 0 and record["peak_rss_gb"] > 0
        assert record["method"] == paper_size_step.FRAMEWORKS[name] and record["run_id"].startswith("dci-")
        shapes = record["shapes"]
        assert (shapes["vision_width"], shapes["vision_heads"], shapes["vision_layers"]) == (1024, 16, 1)
        assert (shapes["text_width"], shapes["text_heads"], shapes["text_layers"]) == (768, 12, 1)
        assert (shapes["image_size"], shapes["patch_size"], shapes["embed_dim"]) == ([224, 224], [14, 14], 768)
        assert (shapes["context_length"], shapes["vocab_size"]) == (248, 49408)
        assert shapes["image_tensor"] == [2, 3, 224, 224] and shapes["token_tensor"] == [2, 248]
        assert shapes["caption_tokens"] == [248, 248] and min(shapes["caption_tokens_untruncated"]) > 248
        assert record["batch_mode"] == ("compute" if name in HN_CLIP_FAMILY else "micro")
        assert record["real_size"] is False and record["layers_cap"] == 1 and record["commit"]
        assert {"device_name", "cpus", "memory_total_gb", "libraries", "git"} <= record["machine"].keys()
    assert all(steps[name]["trainable_parameters"] < full / 50 for name in ADAPTERS)
    assert steps["finelip"]["trainable_parameters"] == full + steps["finelip"]["extra_module_parameters"] > full
    assert steps["finelip"]["params_without_grad"] == ["logit_scale"]  # by design: L_fine has no temperature
    assert steps["frozen_g"]["frozen_text_parameters"] > 0
    assert set(steps["hn_clip"]["losses"]) == {"infonce", "hn", "tok", "total"}
    assert steps["goal"]["cost_only_settings"] == {"double_forward": True, "anomaly_detection": True}
    assert {"org", "seg", "patch", "text"} <= steps["goal"]["losses"].keys()
    assert {"g", "sc", "rs", "lsc"} <= steps["structxlip"]["losses"].keys()


def test_sam_and_the_matcher_run_at_real_width(records):
    auxiliary = {r["framework"]: r for r in records if r["part"] == "auxiliary_model"}
    assert list(auxiliary) == list(paper_size_step.AUXILIARY_MODELS)
    sam, clip = auxiliary["sam_vit_h"], auxiliary["clip_vit_l14_336"]
    for record in (sam, clip):
        assert record["status"] == "ok", record.get("error")
        assert record["wall_s"] > 0 and record["peak_rss_gb"] > 0 and record["image_size"] == [1024, 768]
    assert {k: sam["vision"][k] for k in ("hidden_size", "num_attention_heads", "num_hidden_layers", "image_size")} \
        == {"hidden_size": 1280, "num_attention_heads": 16, "num_hidden_layers": 1, "image_size": 1024}
    assert sam["vision"]["global_attn_indexes"] == [0] and sam["settings"]["pred_iou_thresh"] == 0.88
    assert clip["features"] == [[1, 768], [clip["sentences"], 768]] and clip["features_finite"]
    assert clip["context"] == 77 and clip["config"]["vision"]["image_size"] == 336


def test_layers_keeps_the_real_widths_and_caps_the_depth():
    assert paper_size_step.longclip_architecture(None)["layers"] == 24
    capped = paper_size_step.longclip_architecture(3)
    assert (capped["layers"], capped["text_layers"], capped["width"], capped["text_width"]) == (3, 3, 1024, 768)
    assert paper_size_step.sam_vision_config(None)["global_attn_indexes"] == [7, 15, 23, 31]
    assert paper_size_step.sam_vision_config(10)["global_attn_indexes"] == [7]
    assert paper_size_step.sam_vision_config(2)["global_attn_indexes"] == [1]   # the last block global
    clip = paper_size_step.clip_configs(13)
    assert (clip["vision"]["num_hidden_layers"], clip["text"]["num_hidden_layers"]) == (13, 12)
