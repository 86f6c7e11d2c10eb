"""A small training job's spec and settings, shared by the training-loop tests (single-process,
extensions, multi-process)."""
import json
import os
import subprocess
import sys
import textwrap

SPEC = {
    "train_set": "docci", "fraction": 1.0, "seed": 7,
    # a run spec names the G source by its identity name, `margin` (hnclip.config.objective_keys)
    "objective": {"framework": "full", "gamma": 0.5, "lambda_tok": 1.0, "margin": "live"},
    "recipe": {"epochs": 2, "micro_batch": 8, "grad_accum": 2, "lr": 1e-3, "weight_decay": 0.01,
               "warmup_steps": 0, "reset_logit_scale": 100.0, "precision": "fp32"},
}
EXECUTION = {"device": "cpu", "threads": 1, "eval_batch_size": 64, "checkpoint_every_steps": 2,
             "keep_epoch_weights": False}
EVALUATION = {"recall_ks": [1, 5], "tie_rule": "pessimistic", "selection_metric": "mean_r1"}

# Trains the TrainJob given as JSON in argv[1] in a fresh process (which a test can SIGKILL).
KILL_SCRIPT = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from hnclip.training.loop import TrainJob, train
    args = json.loads(sys.argv[1])
    train(TrainJob(**{**args, "train_manifest": Path(args["train_manifest"]), "out_dir": Path(args["out_dir"]),
                      "checkpoint_dir": Path(args["checkpoint_dir"]),
                      "eval_manifests": {k: Path(v) for k, v in args["eval_manifests"].items()}}))
""")


def run_with_faults(job, faults: dict) -> subprocess.CompletedProcess:
    """Train `job` in a fresh process with HNCLIP_FAULTS set (e.g. {"kill_after_step": 5})."""
    payload = {k: (str(v) if hasattr(v, "parts") else v) for k, v in job.__dict__.items()}
    payload["eval_manifests"] = {k: str(v) for k, v in job.eval_manifests.items()}
    env = {**os.environ, "HNCLIP_FAULTS": json.dumps(faults)}
    return subprocess.run([sys.executable, "-c", KILL_SCRIPT, json.dumps(payload)], capture_output=True, text=True,
                          env=env)
