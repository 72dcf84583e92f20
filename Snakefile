# containerbench: what containers and interconnects cost deep-learning training.
#
#   snakemake --profile profiles/local                  # the embedded default (make run)
#   snakemake --profile profiles/slurm --configfile config/site.yaml
#
# The rules are thin: the package src/containerbench does the work.
#
# `snakemake --lint` asks each rule for a `conda:` or `container:` directive. None has
# one, on purpose: what runs the benchmark is the variable being measured. Bare-metal
# ranks run in the venv built from envs/bench.lock.txt and container ranks in the image
# built from containers/Dockerfile with the same lock (every record's provenance hash
# proves it). Snakemake's `container:` would put the bare-metal runs in a container too,
# and a conda environment would resolve other versions. The other rules run in the
# workflow venv (envs/workflow.lock.txt). That is the one lint left, and the only one
# tests/test_workflow.py allows.

from snakemake.utils import min_version

min_version("9.0")


# The embedded default is read only when no --configfile is given: a site's config file
# is the whole config (its fabrics and runtimes exactly its own), in this process and in
# every job it spawns, which get the same --configfile. An overlay names both files:
#   --configfile config/config.yaml config/full.yaml
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/images.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/benchmark.smk"
include: "workflow/rules/calibrate.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/fleet.smk"


rule all:
    default_target: True
    input:
        rules.report.output,
        rules.export.output,
