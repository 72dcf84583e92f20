# Real-data input. A site points dataset.path at its ImageNet TFRecords; without
# one, the workflow writes a small sample of the same format (random JPEGs), so the
# decode/crop/flip pipeline costs what it costs on ImageNet. Anchored at the
# repository, like the images: one sample serves every results directory.


rule dataset_sample:
    """ImageNet-shaped TFRecords of random JPEGs, and their manifest.json."""
    output:
        directory(f"{REPO}/{cb_config.SAMPLE_DIR}"),  # what SWEEP.inputs names for real-data runs
    log:
        f"{REPO}/build/logs/dataset_sample.txt",
    params:
        python=BENCH_PYTHON,
        sample=PLANNED["dataset"],
    localrule: True
    priority: BEFORE_ANY_MEASUREMENT
    shell:
        "{params.python:q} -m containerbench.rank.datasets generate {output:q} "
        "--images {params.sample[sample_images]} --shards {params.sample[sample_shards]} "
        "--size {params.sample[sample_jpeg_size]} > {log:q} 2>&1"
