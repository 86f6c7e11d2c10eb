# The baselines' auxiliary inputs of each training set: GOAL's LISM segment pairs, and StructXLIP's edge
# maps (of the images and of their top matched segments). Each build is scattered over its shards (256
# images each, hnclip.auxiliary.shards): one job per shard, which the local GPU slots
# (hnclip.runtime.gpu_slots) and a cluster executor both spread over the GPUs, then a gather job that
# assembles the index and its record from them. How many shards a build has is known only from the
# training manifest, so the gathers ask the `dataset` checkpoint (workflow/rules/data.smk) for it
# (`auxiliary_shard_files`, workflow/rules/common.smk). A shard file is temporary: deleted once gathered.


rule auxiliary_segments_shard:
    input:
        unpack(auxiliary_segment_inputs),
    output:
        shard=temp(auxiliary_shard_pattern("segments")),
    params:
        settings=canonical_json({k: REG.profile.get("auxiliary", {}).get(k) for k in ("segmenter", "matcher", "lism")}),
    wildcard_constraints:
        shard=r"\d{5}",
    log:
        f"logs/{PROFILE}/auxiliary/{{dataset}}.segments.{{shard}}.log",
    benchmark:
        f"logs/{PROFILE}/auxiliary/{{dataset}}.segments.{{shard}}.benchmark.tsv"
    threads: EXECUTION["threads"]
    resources:
        gpu=USES_GPU,
        runtime=planned_runtime("auxiliary_segments_shard", "{dataset}/{shard}"),
    shell:
        f"{HNCLIP} --threads {{threads}} auxiliary segments --dataset {{wildcards.dataset}} --shard {{wildcards.shard}} > {{log}} 2>&1"


rule auxiliary_segments:
    input:
        unpack(auxiliary_segment_inputs),
        shards=auxiliary_shard_files("segments"),
    output:
        index=f"{DATA_ROOT}/{{dataset}}/auxiliary/segments/segments.jsonl",
        record=f"{DATA_ROOT}/{{dataset}}/auxiliary/segments/record.json",
    params:
        settings=canonical_json({k: REG.profile.get("auxiliary", {}).get(k) for k in ("segmenter", "matcher", "lism")}),
    log:
        f"logs/{PROFILE}/auxiliary/{{dataset}}.segments.log",
    benchmark:
        f"logs/{PROFILE}/auxiliary/{{dataset}}.segments.benchmark.tsv"
    resources:
        runtime=planned_runtime("auxiliary_segments", "{dataset}"),
    shell:
        f"{HNCLIP} auxiliary segments --dataset {{wildcards.dataset}} --gather > {{log}} 2>&1"


rule auxiliary_edges_shard:
    input:
        train_data=lambda w: dataset_marker(w.dataset),
        segments=f"{DATA_ROOT}/{{dataset}}/auxiliary/segments/segments.jsonl",
    output:
        shard=temp(auxiliary_shard_pattern("edges")),
    params:
        settings=canonical_json(REG.profile.get("auxiliary", {}).get("edges")),
    wildcard_constraints:
        shard=r"\d{5}",
    log:
        f"logs/{PROFILE}/auxiliary/{{dataset}}.edges.{{shard}}.log",
    benchmark:
        f"logs/{PROFILE}/auxiliary/{{dataset}}.edges.{{shard}}.benchmark.tsv"
    resources:
        runtime=planned_runtime("auxiliary_edges_shard", "{dataset}/{shard}"),
    shell:
        f"{HNCLIP} auxiliary edges --dataset {{wildcards.dataset}} --shard {{wildcards.shard}} > {{log}} 2>&1"


rule auxiliary_edges:
    input:
        train_data=lambda w: dataset_marker(w.dataset),
        segments=f"{DATA_ROOT}/{{dataset}}/auxiliary/segments/segments.jsonl",
        shards=auxiliary_shard_files("edges"),
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
        f"{HNCLIP} auxiliary edges --dataset {{wildcards.dataset}} --gather > {{log}} 2>&1"
