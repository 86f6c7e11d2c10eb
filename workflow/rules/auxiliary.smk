# The baselines' auxiliary inputs of each training set, each its own job: GOAL's LISM segment
# pairs, and StructXLIP's edge maps (of the images and of their top matched segments).
# Both are built in resumable shards kept in <index>.shards/ beside the index: not an output, so a
# failed or killed job's retry skips the finished shards; the shards are removed once the index is written.
# Input functions: workflow/rules/common.smk.


rule auxiliary_segments:
    input:
        unpack(auxiliary_segment_inputs),
    output:
        index=f"{DATA_ROOT}/{{dataset}}/auxiliary/segments/segments.jsonl",
        record=f"{DATA_ROOT}/{{dataset}}/auxiliary/segments/record.json",
    params:
        settings=canonical_json({k: REG.profile.get("auxiliary", {}).get(k) for k in ("segmenter", "matcher", "lism")}),
    log:
        f"logs/{PROFILE}/auxiliary/{{dataset}}.segments.log",
    benchmark:
        f"logs/{PROFILE}/auxiliary/{{dataset}}.segments.benchmark.tsv"
    threads: EXECUTION["threads"]
    resources:
        gpu=USES_GPU,
        runtime=planned_runtime("auxiliary_segments", "{dataset}"),
    shell:
        f"{HNCLIP} --threads {{threads}} auxiliary segments --dataset {{wildcards.dataset}} > {{log}} 2>&1"


rule auxiliary_edges:
    input:
        train_data=lambda w: dataset_marker(w.dataset),
        segments=f"{DATA_ROOT}/{{dataset}}/auxiliary/segments/segments.jsonl",
    output:
        index=f"{DATA_ROOT}/{{dataset}}/auxiliary/edges/edges.jsonl",
        record=f"{DATA_ROOT}/{{dataset}}/auxiliary/edges/record.json",
    params:
        settings=canonical_json(REG.profile.get("auxiliary", {}).get("edges")),
    log:
        f"logs/{PROFILE}/auxiliary/{{dataset}}.edges.log",
    benchmark:
        f"logs/{PROFILE}/auxiliary/{{dataset}}.edges.benchmark.tsv"
    resources:
        runtime=planned_runtime("auxiliary_edges", "{dataset}"),
    shell:
        f"{HNCLIP} auxiliary edges --dataset {{wildcards.dataset}} > {{log}} 2>&1"
