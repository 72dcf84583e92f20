# The one image, from containers/Dockerfile, and what each runtime runs made from it.
# Only the artifacts some selected runtime needs are built (SWEEP.artifacts). Each
# step is `python -m containerbench image <step>`, which builds every command as an
# argv list and stops at images.step_timeout_s; the rules only name files.
import itertools

from containerbench import images as cb_images
from containerbench import baseimage, imagebuild, imagestep
from containerbench.cli.image import step_argv

BUILD = config["images"]["build"]
ENGINE = BUILD["engine"]
TAG = BUILD["tag"]
# The image belongs to the repository (its build context, its build/ cache), not to
# the working directory of a run: every path here is anchored at the repository.
IMAGES_DIR = REPO / cb_images.IMAGES
IMAGE_LOGS = REPO / "build" / "logs" / "images"
GPU_RUNS = config["slurm"]["gpus_per_node"] > 0
# Each image step has a time limit. It is a resource, not a param: raising it must not rebuild
# an image that was built in time. On this machine (profiles/local) an image step takes one of
# its two shares: two steps run at once, and no measurement beside either.
IMAGE_STEP = {"step_timeout_s": config["images"]["step_timeout_s"], "machine_shares": 1}
# The archives runs load on their nodes where a node's own store lacks the image (plans.node_archive).
NODE_ARCHIVES = {needs["archive"] for needs in SWEEP.inputs.values() if "archive" in needs}
# A conversion step runs where the workflow runs, unless its runtime exists only on the compute
# nodes (images.<runtime>.available): then it is a job there (ON_A_NODE), like a measurement.


rule image_base:
    """A minimal Debian with Python and Open MPI, made here: no registry is needed."""
    output:
        IMAGES_DIR / f"base.{ENGINE}.done",
    log:
        IMAGE_LOGS / "base.txt",
    params:
        images=shlex.join(
            step_argv(PYTHON, ENGINE, TAG, BENCH_PYTHON, REPO, cb_config.BENCH_ENVS[config["benchmark_env"]])
        ),
        # Not read by the step (it labels the base with it itself): a new recipe runs the rule again.
        recipe=baseimage.recipe(),
    localrule: True
    priority: BEFORE_ANY_MEASUREMENT
    resources:
        **IMAGE_STEP,
    shell:
        "{params.images} --step-timeout {resources.step_timeout_s} base --marker {output:q} > {log:q} 2>&1"


# Everything below is made once per flavour of the image that the sweep's runs need: per framework
# (config.bench_env: benchmark_env's TensorFlow environment; PyTorch's, tag and files ending in -torch,
# rules in _torch) and per MPI model (config.MODEL_FLAVOUR: the base's Open MPI for hybrid, the MPICH
# flavour, -mpich and _mpich, for native). Only what some run needs is built.
for BENCH_ENV, FLAVOUR in itertools.product(
    [cb_config.bench_env(config, framework) for framework in config["benchmark"]["frameworks"]],
    cb_config.MPI_FLAVOURS.values(),
):
    SUFFIX = BENCH_ENV.suffix + FLAVOUR.suffix
    RULE_SUFFIX = SUFFIX.replace("-", "_")  # the rules' names: image_build, image_build_mpich, image_build_torch, ...
    OPEN_MPI_RULE_SUFFIX = BENCH_ENV.suffix.replace("-", "_")  # the rules of the framework's Open MPI flavour
    FILES = cb_images.image_files(cb_images.flavour_tag(TAG, BENCH_ENV, FLAVOUR), IMAGES_DIR, gpus=GPU_RUNS)
    STEPS = shlex.join(step_argv(PYTHON, ENGINE, TAG, FRAMEWORK_PYTHON[BENCH_ENV.framework], REPO, BENCH_ENV, FLAVOUR))
    LOGS = IMAGE_LOGS / SUFFIX.lstrip("-") if SUFFIX else IMAGE_LOGS

    # The pinned benchmark packages as wheels, so the image builds with its network off. The
    # wheelhouse (build/wheelhouse) is a cache that `make setup` fills too, with the Horovod wheel
    # it builds: the rule declares the list of its files, not the directory, which Snakemake would
    # delete before a rerun, and with it a Horovod build of several minutes. The MPICH flavour's
    # links the first's wheels and adds its MPI wheel and a Horovod wheel built against it.
    rule:
        name:
            f"image_wheelhouse{RULE_SUFFIX}"
        input:
            REPO / BENCH_ENV.lock,
            REPO / BENCH_ENV.pins,
            getattr(rules, f"image_wheelhouse{OPEN_MPI_RULE_SUFFIX}").output if FLAVOUR.wheels else [],
        output:
            IMAGES_DIR / f"wheelhouse.{BENCH_ENV.name}{FLAVOUR.suffix}.done",
        log:
            LOGS / "wheelhouse.txt",
        params:
            images=STEPS,
        localrule: True
        priority: BEFORE_ANY_MEASUREMENT
        resources:
            **IMAGE_STEP,
        shell:
            "{params.images} --step-timeout {resources.step_timeout_s} wheelhouse --marker {output:q} > {log:q} 2>&1"

    # Build with the configured engine; the stamp records the image id and the provenance hash
    # measured inside the image next to the bare-metal one (refused when they differ).
    rule:
        name:
            f"image_build{RULE_SUFFIX}"
        input:
            base=[] if BUILD["base_image"] else rules.image_base.output,
            wheelhouse=getattr(rules, f"image_wheelhouse{RULE_SUFFIX}").output,
            definition=REPO / "containers" / "Dockerfile",
            context=imagebuild.build_context_files(REPO, BENCH_ENV, FLAVOUR),
        output:
            FILES[ENGINE],
        log:
            LOGS / f"build.{ENGINE}.txt",
        params:
            images=STEPS,
            base=BUILD["base_image"] or imagestep.BASE_IMAGE,
            apt=BUILD["apt_packages"],
        localrule: True
        priority: BEFORE_ANY_MEASUREMENT
        resources:
            **IMAGE_STEP,
        shell:
            "{params.images} --step-timeout {resources.step_timeout_s} "
            "build --base-image={params.base:q} --apt-packages={params.apt:q} --stamp {output:q} > {log:q} 2>&1"

    rule:
        name:
            f"image_archive{RULE_SUFFIX}"
        input:
            getattr(rules, f"image_build{RULE_SUFFIX}").output,
        output:
            # temp(): 2 GB that only the loads and conversions below read; deleted once they are done
            # (a later run that needs it again makes it again from the engine's image). Kept where the
            # runs load it on their nodes (NODE_ARCHIVES): made again, it would be newer than every
            # run measured from it, and Snakemake would measure them all again.
            FILES["archive"] if FILES["archive"] in NODE_ARCHIVES else temp(FILES["archive"]),
        log:
            LOGS / "archive.txt",
        params:
            images=STEPS,
        localrule: True
        # Before the conversions that need only the build: the loads and conversions after it then run
        # beside them, not after both (2026-11-26, the container test: the archive waited 33 s for them).
        priority: BEFORE_ANY_MEASUREMENT + 1
        resources:
            **IMAGE_STEP,
        shell:
            "{params.images} --step-timeout {resources.step_timeout_s} export --archive {output:q} > {log:q} 2>&1"

    for other in set(runtimes.ENGINES) - {ENGINE}:

        rule:
            name:
                f"image_into_{other}{RULE_SUFFIX}"
            input:
                getattr(rules, f"image_archive{RULE_SUFFIX}").output,
            output:
                FILES[other],
            log:
                LOGS / f"into.{other}.txt",
            params:
                images=STEPS,
                engine=other,
            localrule: True
            priority: BEFORE_ANY_MEASUREMENT
            resources:
                **IMAGE_STEP,
            shell:
                "{params.images} --step-timeout {resources.step_timeout_s} "
                "load --into {params.engine} --archive {input:q} --stamp {output:q} > {log:q} 2>&1"

    rule:
        name:
            f"image_charliecloud{RULE_SUFFIX}"
        input:
            getattr(rules, f"image_build{RULE_SUFFIX}").output,
        output:
            image=directory(FILES["charliecloud-dir"]),
            image_id=runtimes.Charliecloud.image_id_file(FILES["charliecloud-dir"]),  # the id it was converted from
        log:
            LOGS / "charliecloud.txt",
        params:
            images=STEPS,
        localrule: not ON_COMPUTE_NODES & {runtimes.Charliecloud.name}
        priority: BEFORE_ANY_MEASUREMENT
        resources:
            **IMAGE_STEP,
            **(ON_A_NODE if ON_COMPUTE_NODES & {runtimes.Charliecloud.name} else {}),
        shell:
            "{params.images} --step-timeout {resources.step_timeout_s} "
            "charliecloud --out {output.image:q} --force > {log:q} 2>&1"

    if GPU_RUNS:

        # GPU runs: the host's NVIDIA libraries, injected into the converted directory on a node
        # that has them (ch-fromhost --nvidia asks nvidia-container-cli there).
        rule:
            name:
                f"image_charliecloud_nvidia{RULE_SUFFIX}"
            input:
                getattr(rules, f"image_charliecloud{RULE_SUFFIX}").output.image,
            output:
                FILES[runtimes.Charliecloud.name],
            log:
                LOGS / "charliecloud-nvidia.txt",
            params:
                images=STEPS,
            localrule: not ON_A_NODE
            priority: BEFORE_ANY_MEASUREMENT
            resources:
                **IMAGE_STEP,
                **ON_A_NODE,
            shell:
                "{params.images} --step-timeout {resources.step_timeout_s} "
                "charliecloud-nvidia --out {input:q} --marker {output:q} > {log:q} 2>&1"

    # containers/Dockerfile as a Singularity definition (spython, corrected), from the same base:
    # a site without Docker builds the same image with Apptainer (the .sif below is made from the
    # built image's archive instead).
    rule:
        name:
            f"singularity_definition{RULE_SUFFIX}"
        input:
            REPO / "containers" / "Dockerfile",
        output:
            FILES["definition"],
        log:
            LOGS / "singularity-definition.txt",
        params:
            repo=REPO,
            python=PYTHON,
            bench_python=FRAMEWORK_PYTHON[BENCH_ENV.framework],
            base=BUILD["base_image"] or imagestep.BASE_IMAGE,
            flavour=shlex.join(
                word
                for name, value in imagebuild.image_build_args(BENCH_ENV, FLAVOUR).items()
                for word in ("--build-arg", f"{name}={value}")
            ),
        localrule: True
        priority: BEFORE_ANY_MEASUREMENT
        resources:
            **IMAGE_STEP,
        shell:
            "{params.python:q} -m containerbench singularity-definition --dockerfile {input:q} --context {params.repo:q} "
            "--build-arg BASE_IMAGE={params.base:q} {params.flavour} "
            "--bench-python {params.bench_python:q} --out {output:q} > {log:q} 2>&1"

    # Runtimes that make their artifact from the archive or the engine's store with their own
    # commands (their classes' prepare_commands): one rule each, made here from the class list.
    # (Runtimes that run the same artifact, apptainer's and singularity's .sif: one rule, the one the
    # sweep names, else the artifact's owner's.)
    PREFERRED = sorted(
        cb_images.CONVERTED,
        key=lambda name: (name in PLANNED["runtimes"], runtimes.CONTAINER_RUNTIMES[name].artifact_owner),
    )
    PREPARED = {FILES[name]: name for name in PREFERRED}
    for runtime in sorted(PREPARED.values()):
        FROM = runtimes.CONTAINER_RUNTIMES[runtime].prepare_from  # the files its prepare step starts from

        rule:
            name:
                f"image_{runtime.replace('-', '_')}{RULE_SUFFIX}"
            input:
                # the build engine's store (enroot) or the archive, and the definition made beside the .sif
                image=(
                    getattr(rules, f"image_build{RULE_SUFFIX}").output
                    if "store" in FROM
                    else getattr(rules, f"image_archive{RULE_SUFFIX}").output
                ),
                definition=getattr(rules, f"singularity_definition{RULE_SUFFIX}").output if "definition" in FROM else [],
            output:
                FILES[runtime],
            log:
                LOGS / f"{runtime}.txt",
            params:
                images=STEPS,
                runtime=runtime,
                build_dir=IMAGES_DIR,
                without=(
                    "--without-runtime" if runtime in ON_COMPUTE_NODES and runtime not in CONVERTED_ON_NODES else ""
                ),
            localrule: runtime not in CONVERTED_ON_NODES
            priority: BEFORE_ANY_MEASUREMENT
            resources:
                **IMAGE_STEP,
                **(ON_A_NODE if runtime in CONVERTED_ON_NODES else {}),
            shell:
                "{params.images} --step-timeout {resources.step_timeout_s} "
                "prepare --runtime {params.runtime} {params.without} --build-dir {params.build_dir:q} > {log:q} 2>&1"
