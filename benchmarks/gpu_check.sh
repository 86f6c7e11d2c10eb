#!/usr/bin/env bash
# The optimizer-step changes measured on one GPU, today's path and the new one in the same call, at Long-CLIP-L
# shapes. The stages' time limits add up to 480 s (8 min on one H100 / H200, model builds included). Run
# from the repository root (with .venv if present, else python3 with torch, open_clip, peft and PyYAML):
#
#     bash benchmarks/gpu_check.sh            # JSON lines go to $OUT (a device run) or benchmarks/results/
#
# Stages, most important first, each under its own time limit (a stage that runs out is recorded as such
# in gpu_check.jsonl and the next one starts):
#   1. throughput.py, plain and hnclip, accumulate and compute_batch: today's path (--adamw default
#      --text-attention mask) and the new one (defaults: fused AdamW, causal text attention)
#   2. token_term_profile.py on cuda: the token term and an HN-CLIP micro-batch, previous vs current L_tok
#   3. fused vs default AdamW: the largest parameter difference after 5 steps on the GPU (its tolerance)
#   4. throughput.py, finelip, goal, structxlip, lora, dora (accumulate) and evaluate, new path
#   5. loop_throughput.py --shapes paper: the whole training loop (8 loader threads from the image cache,
#      per-epoch evaluation, epoch-end checkpoints) against its steps alone, HN-CLIP, 16 x 8 pairs, bf16
#   6. throughput.py --compile, hnclip compute_batch (torch.compile; compare its first_step_losses with
#      stage 1's new-path hnclip compute_batch row), in the time the others leave of the 480 s
# Without CUDA it runs the same stages on the CPU at --small shapes (a check of the script, not a measurement
# of the GPU path).
set -uo pipefail
cd "$(dirname "$0")/.."
# the project's venv where it was carried; else the machine's own python with torch, open_clip and peft
PY=${PY:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
RESULTS=${GPU_CHECK_OUT:-${OUT:-benchmarks/results}}
mkdir -p "$RESULTS"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
if "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    SIZE=(); STEPS=(--steps 3 --warmup 1); LIMIT=${GPU_CHECK_STAGE_S:-80}
    LOOP=(--shapes paper --device cuda --train 1024 --test 256 --workers 8)
else
    SIZE=(--small); STEPS=(--steps 2 --warmup 1); LIMIT=${GPU_CHECK_STAGE_S:-300}
    LOOP=(--train 64 --test 32 --workers 2)
fi
NOTE="benchmarks/gpu_check.sh at $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
THROUGHPUT=(benchmarks/throughput.py "${SIZE[@]}" "${STEPS[@]}" --out "$RESULTS/throughput.jsonl")

stage() {  # stage NAME LIMIT_S COMMAND...: run it; record its name, exit status and wall time
    local name=$1 limit=$2; shift 2
    local started=$SECONDS
    echo "== $name (limit ${limit}s)"
    timeout "$limit" "$@"
    local rc=$?
    printf '{"benchmark": "gpu_check", "stage": "%s", "rc": %d, "timed_out": %s, "wall_s": %d, "note": "%s"}\n' \
        "$name" "$rc" "$([ $rc -eq 124 ] && echo true || echo false)" "$((SECONDS - started))" "$NOTE" \
        >> "$RESULTS/gpu_check.jsonl"
}

stage today_path "$LIMIT" "$PY" "${THROUGHPUT[@]}" --methods plain,hnclip --adamw default --text-attention mask \
    --note "$NOTE: today's path (default AdamW, float-mask text attention)"
stage new_path "$LIMIT" "$PY" "${THROUGHPUT[@]}" --methods plain,hnclip --note "$NOTE: new path"
stage token_term $((LIMIT * 2 / 3)) "$PY" benchmarks/token_term_profile.py "${SIZE[@]}" --device "$("$PY" -c \
    'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')" --repeats 10 --step-repeats 5 \
    --out "$RESULTS/token_term_profile.jsonl"
stage fused_adamw_tolerance $((LIMIT / 3)) "$PY" - "$RESULTS/gpu_check.jsonl" <<'EOF'
import json, sys, torch
from hnclip.models.factory import create
from hnclip.training.schedule import adamw_implementation
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
results = {}
for implementation in ("fused", "default"):
    torch.manual_seed(0)
    model = create("hnclip-tiny").model.to(device)
    groups = [{"params": [p for p in model.parameters() if p.requires_grad]}]
    options = adamw_implementation(groups) if implementation == "fused" else {}
    optimizer = torch.optim.AdamW(groups, lr=1e-3, weight_decay=0.01, **options)
    generator = torch.Generator().manual_seed(1)
    for _ in range(5):
        for p in groups[0]["params"]:
            p.grad = torch.randn(p.shape, generator=generator).to(device) * 1e-2
        optimizer.step()
    results[implementation] = ([p.detach().clone() for p in groups[0]["params"]], bool(optimizer.defaults["fused"]))
difference = max(float((a - b).abs().max()) for a, b in zip(results["fused"][0], results["default"][0]))
scale = max(float(p.abs().max()) for p in results["default"][0])
record = {"benchmark": "gpu_check", "stage": "fused_adamw_tolerance", "device": str(device),
          "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
          "fused_used": results["fused"][1], "steps": 5, "lr": 1e-3,
          "max_abs_param_difference": difference, "max_abs_param": scale, "torch": torch.__version__}
with open(sys.argv[1], "a") as out:
    out.write(json.dumps(record) + "\n")
print(record)
EOF
stage all_frameworks $((LIMIT + 20)) "$PY" "${THROUGHPUT[@]}" --methods finelip,goal,structxlip,lora,dora,evaluate \
    --modes accumulate --note "$NOTE: new path"
stage loop $((LIMIT + 10)) "$PY" benchmarks/loop_throughput.py "${LOOP[@]}" --no-decode --checkpoint-every 1000 \
    --out "$RESULTS/loop_throughput.jsonl"
# the limits add up to 6 x LIMIT (480 s on a GPU): compile, the option least needed, gets what the others leave
# (50 s on a GPU: compiling Long-CLIP-L's towers may take longer, recorded as timed_out)
stage compile $((LIMIT - 30)) "$PY" "${THROUGHPUT[@]}" --methods hnclip \
    --modes compute_batch --compile \
    --note "$NOTE: new path with torch.compile"
echo "records in $RESULTS"
