# The one image, from containers/Dockerfile, and what each runtime runs made from it.
# Only the artifacts some selected runtime needs are built (IMAGE_ARTIFACTS).
# Every command is an argv list from containerbench.images, never a glued shell string.
from containerbench import images as cb_images

BUILD = config["images"]["build"]
ENGINE = BUILD["engine"]
TAG = BUILD["tag"]
# The image belongs to the repository (its build context, its build/ cache), not to
# the working directory of a run: every path here is anchored at the repository.
REPO = Path(workflow.basedir)
IMAGES_DIR = REPO / cb_config.BUILD_DIR
WHEELHOUSE = REPO / cb_images.WHEELHOUSE
BENCH_PYTHON = Path(config["bare_metal"]["python"])
if not BENCH_PYTHON.is_absolute() and (REPO / BENCH_PYTHON).exists():
    BENCH_PYTHON = REPO / BENCH_PYTHON
PACKAGE_SOURCES = sorted(str(p) for p in (REPO / "src" / "containerbench").rglob("*.py"))
FILES = cb_config.image_files(TAG, str(IMAGES_DIR))
cb_images.STEP_TIMEOUT_S = config["images"]["step_timeout_s"]


rule image_base:
    """A minimal Debian with Python and Open MPI, made here: no registry is needed."""
    output:
        IMAGES_DIR / f"base.{ENGINE}.done",
    localrule: True
    resources:
        exclusive_machine=1,  # never beside a benchmark: it would be measured too
    run:
        cb_images.make_base(ENGINE, rootfs=REPO / "build" / "base" / "rootfs")
        Path(output[0]).write_text(cb_images.BASE_IMAGE + "\n")


rule image_wheelhouse:
    """The pinned benchmark packages as wheels, so the image builds with its network off."""
    input:
        REPO / "envs" / "bench.lock.txt",
        REPO / "envs" / "bench.txt",
    output:
        IMAGES_DIR / "wheelhouse.done",
    localrule: True
    resources:
        exclusive_machine=1,  # never beside a benchmark: it would be measured too
    run:
        names = cb_images.make_wheelhouse(BENCH_PYTHON, WHEELHOUSE, REPO)
        Path(output[0]).write_text("\n".join(names) + "\n")


rule image_build:
    """Build with the configured engine; the stamp records the image id and the provenance
    hash measured inside the image next to the bare-metal one."""
    input:
        base=[] if BUILD["base_image"] else rules.image_base.output,
        wheelhouse=rules.image_wheelhouse.output,
        definition=REPO / "containers" / "Dockerfile",
        lock=REPO / "envs" / "bench.lock.txt",
        sources=PACKAGE_SOURCES,
    output:
        FILES[ENGINE],
    localrule: True
    resources:
        exclusive_machine=1,  # never beside a benchmark: it would be measured too
    run:
        # apt packages at build time need the network; the default base needs nothing from outside.
        build_args = {"APT_PACKAGES": BUILD["apt_packages"]} if BUILD["apt_packages"] else {}
        spec = cb_images.ImageSpec(ENGINE, TAG, BUILD["base_image"] or cb_images.BASE_IMAGE, build_args,
                                   dockerfile=Path(input.definition), context=REPO,
                                   network="host" if BUILD["apt_packages"] else "none")
        # Refused inside when the provenance measured in the image is not bare metal's.
        cb_images.build_image(spec, BENCH_PYTHON, Path(output[0]))


rule image_archive:
    input:
        rules.image_build.output,
    output:
        FILES["archive"],
    localrule: True
    resources:
        exclusive_machine=1,  # never beside a benchmark: it would be measured too
    run:
        cb_images.export_image(ENGINE, TAG, Path(output[0]))


for other in set(cb_images.ENGINES) - {ENGINE}:

    rule:
        name:
            f"image_into_{other}"
        input:
            rules.image_archive.output,
        output:
            FILES[other],
        localrule: True
        resources:
            exclusive_machine=1,  # never beside a benchmark: it would be measured too
        run:
            cb_images.run_step(f"load into {other}", cb_images.load_argv(other, Path(input[0])),
                               env=cb_images.engine_env(other))
            Path(output[0]).write_text(json.dumps(cb_images.build_stamp(other, TAG), indent=2) + "\n")


rule image_charliecloud:
    input:
        rules.image_build.output,
    output:
        directory(FILES["charliecloud"]),
    localrule: True
    resources:
        exclusive_machine=1,  # never beside a benchmark: it would be measured too
    run:
        cb_images.charliecloud_image(ENGINE, TAG, Path(output[0]), force=True)


rule singularity_definition:
    """containers/Dockerfile as a Singularity definition (spython, corrected)."""
    input:
        REPO / "containers" / "Dockerfile",
    output:
        FILES["definition"],
    localrule: True
    resources:
        exclusive_machine=1,  # never beside a benchmark: it would be measured too
    run:
        # From the base, like the Dockerfile: a site without Docker builds the same image with Apptainer.
        # (The .sif below is made from the built image's archive instead.)
        base = BUILD["base_image"] or cb_images.BASE_IMAGE
        cb_images.write_singularity_definition(Path(output[0]), dockerfile=Path(input[0]),
                                               build_args={"BASE_IMAGE": base})


rule image_apptainer:
    input:
        archive=rules.image_archive.output,
        definition=rules.singularity_definition.output,
    output:
        FILES["apptainer"],
    localrule: True
    resources:
        exclusive_machine=1,  # never beside a benchmark: it would be measured too
    run:
        program = "singularity" if "singularity" in config["runtimes"] else "apptainer"
        cb_images.run_step("apptainer build", cb_images.apptainer_build_argv(Path(output[0]), Path(input.archive), program))


rule image_enroot:
    input:
        rules.image_build.output,
    output:
        FILES["enroot"],
    localrule: True
    resources:
        exclusive_machine=1,  # never beside a benchmark: it would be measured too
    run:
        cb_images.run_step("enroot import", cb_images.enroot_import_argv(ENGINE, TAG, Path(output[0])))


rule image_sarus:
    input:
        rules.image_archive.output,
    output:
        FILES["sarus"],
    localrule: True
    resources:
        exclusive_machine=1,  # never beside a benchmark: it would be measured too
    run:
        cb_images.run_step("sarus load", cb_images.sarus_load_argv(TAG, Path(input[0])))
        Path(output[0]).write_text(json.dumps({"image": cb_images.sarus_name(TAG)}) + "\n")


rule image_podman_hpc:
    input:
        rules.image_archive.output,
    output:
        FILES["podman-hpc"],
    localrule: True
    resources:
        exclusive_machine=1,  # never beside a benchmark: it would be measured too
    run:
        for argv in cb_images.podman_hpc_argvs(TAG, Path(input[0])):
            cb_images.run_step("podman-hpc", argv)
        Path(output[0]).write_text(json.dumps({"image": TAG}) + "\n")
