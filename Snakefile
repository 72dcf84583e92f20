# containerbench: what containers and interconnects cost deep-learning training.
#
#   snakemake --profile profiles/local                  # the embedded default (make run)
#   snakemake --profile profiles/slurm --configfile config/site.yaml
#
# The rules are thin: the package src/containerbench does the work.

from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/images.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/benchmark.smk"
include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        rules.report.output,
