"""`containerbench image <step>`, `singularity-definition` and `freeze-image`: the image steps the
workflow's rules run (containerbench.images lists them), the Dockerfile as a Singularity
definition, and what a runtime's image carries written as a lock.

The options every step shares come before the step, as the rules give them (step_argv)."""

from __future__ import annotations

import json
import os
import shlex
import socket
import sys
from pathlib import Path

from containerbench import config as cb_config
from containerbench import nodeimages
from containerbench.config import BENCH_ENVS, MPI_FLAVOURS, BenchEnv, MpiFlavour
from containerbench.images import CONVERTED
from containerbench.imagestep import (
    ARCHIVE,
    BASE_IMAGE,
    BENCH_PYTHON,
    CHARLIECLOUD_DIR,
    DEFAULT_STEP_TIMEOUT_S,
    IMAGE_REPO,
    IMAGES,
    ImageStepError,
    write_file,
)
from containerbench.rank import markers
from containerbench.runtimes import CONTAINER_RUNTIMES, ENGINES, BareMetal, Charliecloud, Podman


def step_argv(python, engine: str, tag: str, bench_python, repo, env: BenchEnv,
              flavour: MpiFlavour = MPI_FLAVOURS["openmpi"]) -> list[str]:
    """The command line of one flavour's image steps, less the step (the workflow's rules)."""
    argv = [str(python), "-m", "containerbench", "image", "--engine", engine, "--tag", tag,
            "--bench-python", str(bench_python), "--repo", str(repo), "--env", env.name]
    return argv + (["--mpi", flavour.name] if flavour.wheels else [])


def parse_build_args(pairs: list[str]) -> dict[str, str]:
    """NAME=VALUE words (--build-arg) as a dict."""
    return dict(pair.split("=", 1) for pair in pairs)


def cmd_image(args) -> int:
    try:
        print(run_image_step(args))
    except ImageStepError as error:
        print(f"containerbench image: {error}", file=sys.stderr)
        return 1
    return 0


def run_image_step(args) -> str:
    """Do one step; return what it made, for the log."""
    from containerbench.baseimage import make_base
    from containerbench.imagebuild import (
        DOCKERFILE,
        WITHOUT_THE_RUNTIME,
        ImageSpec,
        build_image,
        charliecloud_image,
        default_tag,
        export_image,
        image_build_args,
        load_image,
        remove_image,
    )
    from containerbench.images import (
        build_outputs,
        flavour_tag,
        prepare_runtime,
        runtime_commands,
    )
    from containerbench.imagestep import run_step
    from containerbench.runtimes import engine_env
    from containerbench.wheelhouse import make_flavour_wheelhouse, make_wheelhouse

    timeout, repo, env, flavour = args.step_timeout, args.repo, BENCH_ENVS[args.env], MPI_FLAVOURS[args.mpi]
    needs_tag = args.step not in ("base", "wheelhouse", "charliecloud-nvidia")
    tag = flavour_tag(args.tag or default_tag(args.bench_python), env, flavour) if needs_tag else None
    if args.step == "base":
        done = make_base(args.engine, args.base_image, repo / "build" / "base" / "rootfs", args.mirror, args.force,
                         timeout)
        write_file(args.marker, args.base_image + "\n")
        return done
    if args.step == "wheelhouse" and flavour.wheels:
        names = make_flavour_wheelhouse(flavour, args.bench_python, repo, timeout, env)
        write_file(args.marker, "\n".join(names) + "\n")
        return "\n".join(names)
    if args.step == "wheelhouse":
        names = make_wheelhouse(args.bench_python, args.dest or repo / env.wheelhouse, repo, args.python_version,
                                timeout, env)
        write_file(args.marker, "\n".join(names) + "\n")
        return "\n".join(names)
    if args.step == "build":
        build_args = {**image_build_args(env, flavour),
                      **({"APT_PACKAGES": args.apt_packages} if args.apt_packages else {}),
                      **parse_build_args(args.build_arg)}
        # apt packages at build time need the network; the default base needs nothing from outside.
        network = args.network or ("host" if args.apt_packages else "none")
        spec = ImageSpec(args.engine, tag, args.base_image, build_args, repo / DOCKERFILE, repo, network)
        return json.dumps(build_image(spec, args.bench_python, args.stamp, timeout), indent=2)
    if args.step == "export":
        return str(export_image(args.engine, tag, args.archive, timeout))
    if args.step == "load":
        return json.dumps(load_image(args.into, tag, args.archive, args.stamp, timeout), indent=2)
    if args.step == Charliecloud.name:
        return str(charliecloud_image(args.engine, tag, args.out, args.force, timeout))
    if args.step == "charliecloud-nvidia":
        run_step("charliecloud (ch-fromhost --nvidia)", Charliecloud.nvidia_argv(str(args.out)),
                 env=engine_env(Charliecloud.name), timeout=timeout)
        write_file(args.marker, f"{args.out}: ch-fromhost --nvidia done\n")
        return str(args.out)
    if args.step == "prepare":
        built = build_outputs(tag, args.build_dir, args.engine)
        if args.without_runtime:
            if args.runtime not in WITHOUT_THE_RUNTIME:
                raise ImageStepError(f"prepare --without-runtime: runtime {args.runtime!r} has no conversion of "
                                     f"ours; allowed: {', '.join(sorted(WITHOUT_THE_RUNTIME))}")
            made = Path(CONTAINER_RUNTIMES[args.runtime].artifact(built))
            return str(WITHOUT_THE_RUNTIME[args.runtime](built, made, timeout))
        return prepare_runtime(args.runtime, built, timeout)
    if args.step == "remove":
        base = args.tag or default_tag(args.bench_python)
        tags = sorted({flavour_tag(base, each_env, each_flavour) for each_env in BENCH_ENVS.values()
                       for each_flavour in MPI_FLAVOURS.values()}) if args.every_flavour else [tag]
        removals = [remove_image(each, args.build_dir, args.only, timeout) for each in tags]
        said = "\n".join(f"removed {what}" for done in removals for what in done.removed)
        kept = [f"kept {stamp}: {why}, and may still hold what it names" for done in removals
                for stamp, why in done.kept.items()]
        if kept:  # what was removed is said first; the command fails, naming each stamp kept
            print(said or f"nothing of {', '.join(tags)} removed")
            raise ImageStepError(f"remove: {'; '.join(kept)}; allowed: run it again where each answers, or delete "
                                 "the stamp once its copy is gone")
        return said or f"nothing of {', '.join(tags)} to remove"
    commands = runtime_commands(args.engine, tag, args.registry, args.build_dir, args.gpus)
    return json.dumps(commands, indent=2) if args.json else \
        "\n".join(f"{name}: {shlex.join(argv)}" for name, argvs in commands.items() for argv in argvs)



def cmd_singularity_definition(args) -> int:
    from containerbench.singularity import (
        host_provenance_hash,
        write_singularity_definition,
    )

    build_args = parse_build_args(args.build_arg)
    if args.bench_python and "PROVENANCE" not in build_args:
        build_args["PROVENANCE"] = host_provenance_hash(args.bench_python)
    try:
        print(write_singularity_definition(args.out, dockerfile=args.dockerfile, build_args=build_args,
                                           bootstrap=args.bootstrap, source=args.source, context=args.context))
    except ValueError as error:
        print(f"containerbench singularity-definition: {error}", file=sys.stderr)
        return 2
    return 0


def cmd_freeze_image(args) -> int:
    from containerbench.images import image_lock
    from containerbench.runtimes import runtime_for

    config = cb_config.load(args.config)
    try:
        runtime = runtime_for(args.runtime, config)
        if runtime.name == BareMetal.name:
            raise ValueError(f"runtime {runtime.name!r} has no image; allowed: a container runtime of the config")
        lock = image_lock(runtime)
    except (ValueError, ImageStepError) as error:
        raise cb_config.ConfigError(f"freeze-image: {error}") from None
    Path(args.out).write_text(lock)
    print(f"containerbench: {lock.count(chr(10)) - 2} pins of {runtime.image} written to {args.out}")
    return 0



def cmd_node_image(args) -> int:
    try:
        if args.orphans_only and args.engine not in nodeimages.LEAVES_ORPHANS:
            print(f"containerbench: node-image: --orphans-only is for {', '.join(nodeimages.LEAVES_ORPHANS)}, whose "
                  f"containers of ours are found once their starter has ended; not {args.engine}", file=sys.stderr)
            return 2
        if args.orphans_only:
            removed = nodeimages.remove_orphans(args.engine)
            markers.emit(nodeimages.LINE, {"host": socket.gethostname(), "engine": args.engine,
                                           "removed_orphans": removed})
            return 0
        if not args.image:
            print("containerbench: node-image: --image is required, unless --orphans-only", file=sys.stderr)
            return 2
        answer = (nodeimages.shared_copy(args.engine, args.image, args.stamp) if args.engine in nodeimages.SHARED_COPIES
                  else nodeimages.ensure(args.engine, args.image, args.stamp, args.archive, args.timeout))
        markers.emit(nodeimages.LINE, answer)
    except nodeimages.NodeImageError as error:
        print(f"containerbench: node-image: {error}", file=sys.stderr)
        return 1
    return 0


def cmd_node_mpi(args) -> int:
    from containerbench import hostmpi

    try:
        # In parts where it is long: srun forwards a task's output in pieces of 1 kB, between other tasks'
        # (rank/markers.py, SLURM_IO_MAX_MSG_LEN), and a closure of a few libraries is longer.
        markers.emit(hostmpi.LINE, hostmpi.closure(args.library, args.library_dir))
    except hostmpi.HostMpiError as error:
        print(f"containerbench: node-mpi: {error}", file=sys.stderr)
        return 1
    return 0


def add_commands(sub) -> None:
    image = sub.add_parser("image", help="one step of building the benchmark image and what each runtime runs from it",
                           description="Container images: build the one benchmark image and hand it to every runtime.")
    image.add_argument("--engine", default=os.environ.get("CONTAINERBENCH_ENGINE", Podman.name), choices=ENGINES,
                     help="the engine that builds (and holds) the image")
    image.add_argument("--tag", help=f"default {IMAGE_REPO}:<provenance hash of the bench venv>")
    image.add_argument("--bench-python", type=Path, default=BENCH_PYTHON)
    image.add_argument("--env", choices=sorted(BENCH_ENVS), default="cpu",
                     help="the benchmark environment: its lock and wheelhouse (config key benchmark_env)")
    image.add_argument("--mpi", choices=sorted(MPI_FLAVOURS), default="openmpi",
                     help="the image's MPI flavour: openmpi (hybrid model) or mpich (native model); "
                          "the mpich image's tag and wheelhouse end in -mpich")
    image.add_argument("--repo", type=Path, default=Path("."),
                     help="the repository: build context, containers/Dockerfile, envs/, build/ (default: .)")
    image.add_argument("--step-timeout", type=float, default=DEFAULT_STEP_TIMEOUT_S, metavar="SECONDS",
                     help=f"each step fails after this long (default {DEFAULT_STEP_TIMEOUT_S})")
    steps = image.add_subparsers(dest="step", required=True)
    step = steps.add_parser("base", help="debootstrap a Debian base and import it into the engine")
    step.add_argument("--base-image", default=BASE_IMAGE)
    step.add_argument("--mirror")
    step.add_argument("--force", action="store_true")
    step.add_argument("--marker", type=Path, help="write the base's name here when done")
    step = steps.add_parser("wheelhouse", help="the lock as wheels, and the Horovod wheel, for an offline build")
    step.add_argument("--dest", type=Path, help="default: the environment's, e.g. REPO/build/wheelhouse")
    step.add_argument("--python-version", help="the image's Python, e.g. 3.10 for another base")
    step.add_argument("--marker", type=Path, help="write the wheelhouse's file names here when done")
    step = steps.add_parser("build", help="build containers/Dockerfile; refuse an image whose provenance differs")
    step.add_argument("--base-image", default=BASE_IMAGE)
    step.add_argument("--build-arg", action="append", default=[], metavar="NAME=VALUE")
    step.add_argument("--apt-packages", default="", help="installed at build time (then the build has network)")
    step.add_argument("--network", help="default: none, or host with --apt-packages")
    step.add_argument("--stamp", type=Path)
    step = steps.add_parser("export", help="save the image as a docker archive")
    step.add_argument("--archive", type=Path, default=ARCHIVE)
    step = steps.add_parser("load", help="load the archive into the other engine and stamp it there")
    step.add_argument("--into", choices=ENGINES, required=True)
    step.add_argument("--archive", type=Path, default=ARCHIVE)
    step.add_argument("--stamp", type=Path)
    step = steps.add_parser(Charliecloud.name, help="ch-convert the image into a Charliecloud directory")
    step.add_argument("--out", type=Path, default=CHARLIECLOUD_DIR)
    step.add_argument("--force", action="store_true")
    step = steps.add_parser("charliecloud-nvidia", help="inject this node's NVIDIA libraries (ch-fromhost --nvidia)")
    step.add_argument("--out", type=Path, default=CHARLIECLOUD_DIR)
    step.add_argument("--marker", type=Path, required=True, help="written when done")
    step = steps.add_parser("prepare", help="run a converting runtime's prepare commands (its class's)")
    step.add_argument("--runtime", required=True, choices=sorted(set(CONVERTED)))
    step.add_argument("--without-runtime", action="store_true",
                      help="make its image here without the runtime, as its own import does (enroot: where only "
                           "the compute nodes have it)")
    step.add_argument("--build-dir", type=Path, default=IMAGES)
    step = steps.add_parser("remove", help="remove the image's tag from each engine and every file made from it")
    step.add_argument("--build-dir", type=Path, default=IMAGES)
    step.add_argument("--every-flavour", action="store_true",
                      help="every environment's and MPI flavour's image of the tag, not only --env's and --mpi's")
    step.add_argument("--only", action="append", metavar="PART",
                      help="only this part (an engine, a runtime's artifact, archive, definition); repeatable")
    step = steps.add_parser("print-commands", help="print every runtime's image commands")
    step.add_argument("--registry", default="REGISTRY")
    step.add_argument("--build-dir", type=Path, default=IMAGES)
    step.add_argument("--gpus", action="store_true")
    step.add_argument("--json", action="store_true")
    image.set_defaults(func=cmd_image)


    p = sub.add_parser("singularity-definition",
                       help="containers/Dockerfile as a Singularity/Apptainer definition file")
    p.add_argument("--dockerfile", type=Path, required=True)
    p.add_argument("--bootstrap", choices=("docker", "docker-daemon", "docker-archive"))
    p.add_argument("--from", dest="source", help="image or archive to bootstrap from (default: the base)")
    p.add_argument("--context", default=".", help="the build context COPY sources are relative to")
    p.add_argument("--build-arg", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--bench-python", type=Path,
                   help="label the image with this benchmark venv's provenance hash (ARG PROVENANCE)")
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=cmd_singularity_definition)

    p = sub.add_parser("node-image", help="put a docker or podman image in this node's store, from its archive "
                                          "where the node lacks it, or find podman-hpc's squashed copy or "
                                          "Charliecloud's directory as this node sees it; print the id (one line)")
    p.add_argument("--engine", required=True, choices=[*ENGINES, *nodeimages.SHARED_COPIES])
    p.add_argument("--image", help="the tag the ranks run")
    p.add_argument("--stamp", help="the workflow's stamp of the image: the id every node must hold")
    p.add_argument("--archive", help="the docker archive to load where the node lacks the image")
    p.add_argument("--timeout", type=float, default=1800, metavar="SECONDS", help="for the load (default 1800)")
    p.add_argument("--orphans-only", action="store_true",
                   help="only remove this node's containers of ours whose starter has ended, docker's, "
                        "podman's and podman-hpc's (what every node-image does first; a line for a Slurm epilog)")
    p.set_defaults(func=cmd_node_image)

    p = sub.add_parser("node-mpi", help="the host MPI a native run's ranks load on this node: the library and every "
                                        "library it maps, with device and inode (a line, or its parts); refuse one "
                                        "from outside --library-dir")
    p.add_argument("--library", required=True, help="the host's MPICH-ABI libmpi (native_mpi.library)")
    p.add_argument("--library-dir", action="append", default=[], help="a directory bound into the containers "
                   "(native_mpi.library_dirs; repeat for each)")
    p.set_defaults(func=cmd_node_mpi)

    p = sub.add_parser("freeze-image", help="write what a runtime's image carries as a lock for a bare-metal venv")
    p.add_argument("--config", action="append", default=None, help="YAML file(s) (default config/config.yaml)")
    p.add_argument("--runtime", required=True, help="the container runtime whose image (images.<runtime>.image)")
    p.add_argument("--out", required=True, help="the lock file to write")
    p.set_defaults(func=cmd_freeze_image)
