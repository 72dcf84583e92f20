# Real-data input. A site points dataset.path at its ImageNet TFRecords; without
# one, the workflow writes a small sample of the same format (random JPEGs), so the
# decode/crop/flip pipeline costs what it costs on ImageNet. Anchored at the
# repository, like the images: one sample serves every results directory.
import subprocess


rule dataset_sample:
    """ImageNet-shaped TFRecords of random JPEGs; manifest.json is written last, when whole."""
    output:
        f"{SAMPLE_DIR}/manifest.json",
    params:
        sample=config["dataset"],
    localrule: True
    resources:
        exclusive_machine=1,  # never beside a benchmark: it would be measured too
    run:
        sample = params.sample
        subprocess.run([str(BENCH_PYTHON), "-m", "containerbench.datasets", "generate", str(Path(output[0]).parent),
                        "--images", str(sample["sample_images"]), "--shards", str(sample["sample_shards"]),
                        "--size", str(sample["sample_jpeg_size"])], check=True)
