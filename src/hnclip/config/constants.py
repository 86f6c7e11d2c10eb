"""Constants shared by the registry, the data layer, the models and the trainer (one home each)."""
from __future__ import annotations

CONTEXT_LENGTH = 248   # Long-CLIP's text context, start and end tokens included
PAD_ID = 0             # open_clip's SimpleTokenizer pads with 0
PRETRAIN_ROLE = "pretrain"   # the dataset role of the embedded backbone's own pretraining corpus

ADAPTER_FRAMEWORKS = ("lora", "dora")
TRAINED_FRAMEWORKS = ("full", *ADAPTER_FRAMEWORKS)   # the HN-CLIP objective; `none` = evaluated as released
BASELINE_FRAMEWORKS = ("finelip", "goal", "structxlip")   # machinery baselines with their own objectives
RUNNABLE_FRAMEWORKS = (*TRAINED_FRAMEWORKS, *BASELINE_FRAMEWORKS)   # everything the trainer runs
# Baselines whose training reads auxiliary inputs, and which (built by their own rules, in this order).
AUXILIARY_INPUTS = {"goal": ("segments",), "structxlip": ("segments", "edges")}
# r=16 as the paper; alpha = 2r, the common convention (the paper gives none); every attention
# and MLP projection of both towers.
DEFAULT_ADAPTER = {"r": 16, "alpha": 32, "dropout": 0.0, "target": "both"}

# Fig. 6 draws the strongest machinery baseline at 100 % data from this table's cells.
STRONGEST_BASELINE_TABLE = "table1"

# Protocol settings of a baseline that cost time and change no weight (tested bit-for-bit in
# tests/test_goal_loss.py): not part of a run's identity; paid where a timing table measures the run.
COST_ONLY_SETTINGS = {"goal": ("double_forward", "anomaly_detection")}
