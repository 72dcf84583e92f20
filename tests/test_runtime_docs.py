"""Each runtime's commands held against that runtime's own documentation (issue 10's findings).

Shifter, Sarus, Enroot/Pyxis and Apptainer cannot be installed here: their argv and
environment are asserted word for word, and every test names the source it follows
(repository@commit:path, then the section or the code). podman-hpc is held against its
source here too; test_containers runs it for real. Charliecloud is
installed: its feature query runs for real. The rankexec shim runs for real with a
harmless program standing in for the runtime.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from containerbench import images
from containerbench.config import ConfigError, RunSpec
from containerbench.launchers import Srun
from containerbench.runtimes import (
    Apptainer,
    BuiltImage,
    Charliecloud,
    Docker,
    Enroot,
    Podman,
    PodmanHPC,
    RunRequest,
    Sarus,
    Shifter,
    Singularity,
    runtime_for,
)

SHIFTER = "NERSC/shifter@84b7d34911bb416ffe74e717b09969396523ff6e"
SARUS = "eth-cscs/sarus@4a8fdc438f0684a8966ec71d6f798949e17374c0"
CHARLIECLOUD = "hpc/charliecloud@23de6eee5f6c7df6d88ea9efe89e605404afea0e"
PODMAN_HPC = "NERSC/podman-hpc@01b02d6e552fc6f42478c1ee257f4a7404e8f4b7"
UCX = "openucx/ucx@9466d104a317c8ffddd9734e72055d8bbda021b3"
APPTAINER_DOCS = "apptainer/apptainer-userdocs@94391c5b60ebfa8f0567fc5fd62cbe5ded9cc5ef"
APPTAINER = "apptainer/apptainer@917d66577963ca297352a22e13c86f1748ddc645"
ENROOT = "NVIDIA/enroot@8ea147d337da60cb1c557140f3a85cdf0d620968"
PYXIS = "NVIDIA/pyxis@107519944221822ea1dace4db8e7234b2eaa4cd5"

TAG = "localhost/containerbench:0123456789abcdef"
BUILT = BuiltImage(TAG, "podman", "/clone/build/images", gpus=True)
HOST_PY = "/venv/bin/python"
DATA = RunRequest(module="containerbench.rank.bench", args=("--data-dir", "/datasets/imagenet"),
                  env={"UCX_TLS": "rc,sm,self"}, workdir="/scratch/cb", gpus=True, binds=("/datasets/imagenet",),
                  infiniband=True)
CMD = ["python3", "-m", "containerbench.rank.bench", "--data-dir"]


def configured(name: str, launcher: str, **options):
    return runtime_for(name, {"images": {name: {"image": "id:0123abcd", **options}},
                              "launcher": {"kind": launcher}, "bare_metal": {"python": "py"}})


# --- 1. Shifter ----------------------------------------------------------------------------

def test_shifter_under_srun_takes_the_image_once_per_step_not_per_rank():
    # SHIFTER doc/wlm/slurm.rst, "Basic Job Submission and Usage": "The shifter_slurm.so plugin will
    # add --image, --volume [...] options to sbatch, salloc, and srun", then `srun shifter CMD`; and "If
    # these options are supplied to the shifter command it will cause new shifter instances to be
    # generated at runtime". The plugin registers --module too (wlm_integration/slurm/wrapper.c), and
    # shifter reads the step's image from SHIFTER_IMAGETYPE/SHIFTER_IMAGE (src/shifter.c parse_environment).
    shifter = configured("shifter", "srun", host_python=HOST_PY)
    step = shifter.launcher_options(DATA)
    assert step == ["--image=id:0123abcd", "--module=gpu", "--volume=/datasets/imagenet:/mnt"]
    rank = shifter.rank_argv(DATA)
    assert rank[rank.index("--") + 1:] == ["shifter", "--clearenv", "--workdir=/", "--", *CMD, "/mnt"]
    spec = RunSpec(kind="train", runtime="shifter", fabric="f", nodes=2, ranks_per_node=4, repetition=1)
    srun = Srun("pmix").wrap(rank, spec, [], step)
    assert srun.index("--image=id:0123abcd") < srun.index(HOST_PY)  # an srun option, before the rank's argv
    # Under mpirun there is no step to carry them: each rank names them (and pays the new instance).
    assert configured("shifter", "mpirun", host_python=HOST_PY).launcher_options(DATA) == []
    own = configured("shifter", "mpirun", host_python=HOST_PY).rank_argv(DATA)
    assert own[own.index("--") + 1:own.index("--workdir=/")] == ["shifter", "--clearenv", *step]


def test_shifter_binds_onto_mount_points_the_image_has_and_starts_in_root():
    # SHIFTER src/shifter.c _usage, "Volume Mapping": "The mount-point (e.g., /data) must already exist in
    # the provided image. You can not bind a path into any path including or under /dev, /etc,
    # /opt/udiImage, /proc, or /var". Binding the work directory or /datasets/imagenet at its own path
    # fails in an image without it, so binds go to /mnt, /media, /srv and the arguments follow them.
    shifter = configured("shifter", "mpirun", host_python=HOST_PY)
    two = RunRequest(module="m", args=("/datasets/imagenet", "/scratch/src"), workdir="/scratch/cb",
                     binds=("/datasets/imagenet", "/scratch/src"), env={"PYTHONPATH": "/scratch/src"})
    argv = shifter.rank_argv(two)
    assert "--volume=/datasets/imagenet:/mnt;/scratch/src:/media" in argv  # usage: "[;...]" separates maps
    assert argv[-2:] == ["/mnt", "/media"] and shifter.environment(two)["PYTHONPATH"] == "/media"
    assert not any(word.startswith("--volume") and ":/scratch/cb" in word for word in argv)
    with pytest.raises(ValueError, match=r"^runtime 'shifter': 4 binds need fewer binds; allowed: at most 3"):
        shifter.rank_argv(RunRequest(module="m", binds=("/a", "/b", "/c", "/d")))


def test_shifter_clears_the_host_environment_and_the_shim_passes_name_value_pairs(tmp_path):
    # SHIFTER src/shifter.c _usage: "If "--clearenv" is specified the external environment will be
    # ignored." ... "Multiple "--env=<name>=<value>" or "-e <name>=<value>" arguments can be specified";
    # `-e NAME` without a value fails ("Improperly formatted environment variable").
    shifter = configured("shifter", "srun", host_python=sys.executable)
    request = RunRequest(module="m", env={"UCX_TLS": "tcp,self"}, workdir=str(tmp_path))
    argv = shifter.rank_argv(request)
    stand_in = tmp_path / "shifter"  # found on PATH under shifter's name: prints the words it was given
    stand_in.write_text("#!/bin/sh\nprintf '%s\\n' \"$@\"\n")
    stand_in.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", **shifter.environment(request), "SLURM_PROCID": "3", "OTHER": "x"}
    shown = subprocess.run(argv, env=env, capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    words = shown.stdout.split()
    assert words[:6] == ["--env=CONTAINERBENCH_RUNTIME=shifter", "--env=PMIX_MCA_gds=hash",
                         "--env=PYTHONNOUSERSITE=1", "--env=SLURM_PROCID=3", "--env=UCX_TLS=tcp,self", "--clearenv"]
    assert not any("OTHER" in word for word in words)


def test_shifter_names_its_modules_and_none_turns_the_sites_defaults_off():
    # SHIFTER src/shifter.c _usage: "Specifying --module=none will turn off any default modules that may
    # have been configured"; doc/config/udiRoot.conf.rst: "By specifying a custom set of modules, the user
    # will disable whatever modules were specified by the administrator in the defaultModules".
    cpu = RunRequest(module="m", workdir="/w")
    assert configured("shifter", "srun").launcher_options(cpu) == ["--image=id:0123abcd", "--module=none"]


def test_shifter_prepare_pins_the_image_by_the_id_shifterimg_lookup_prints():
    # SHIFTER src/shifterimg.c: modes "images, login, lookup, or pull"; in MODE_LOOKUP it prints
    # image->identifier; src/ImageData.c: with imageType "id" "no lookup will occur".
    remote = "registry.example.org/containerbench:0123456789abcdef"
    assert Shifter.prepare_commands(BUILT, "registry.example.org")[-2:] == [
        ["shifterimg", "pull", f"docker:{remote}"], ["shifterimg", "lookup", f"docker:{remote}"]]
    assert Shifter("id:0123abcd").site_image_problem() is None
    assert "is not pinned" in Shifter("docker:containerbench:latest").site_image_problem()


# --- 1 and 2. the MPICH swap on an Open MPI image -------------------------------------------

def test_the_native_model_runs_the_mpich_flavour_of_the_built_image_beside_the_hybrid_one():
    # SARUS doc/user/user_guide.rst, "Native MPI support (MPICH-based)": "the MPI installed in the container
    # [...] needs to be ABI-compatible with the MPI on the host system"; so does every swap of the native
    # model. The built image has Open MPI: native runs take its MPICH flavour (tag ending in -mpich, the
    # `mpich` wheel in the venv), hybrid runs the image itself, side by side.
    config = {"runtimes": ["bare-metal", "sarus", "charliecloud"], "slurm": {"gpus_per_node": 0},
              "benchmark": {"frameworks": ["tensorflow"]}, "benchmark_env": "cpu",
              "images": {"build": {"tag": TAG}, "sarus": {"mpi_model": ["hybrid", "native"]},
                         "charliecloud": {"mpi_model": "native"}}}
    artifacts = images.resolve_images(config, "/clone/build/images")
    assert config["images"]["sarus"]["image"] == "load/library/containerbench:0123456789abcdef"
    assert config["images"]["sarus"]["native_image"] == "load/library/containerbench:0123456789abcdef-mpich"
    assert (config["images"]["charliecloud"]["native_image"]
            == "/clone/build/images/containerbench-0123456789abcdef-mpich.ch")
    assert sorted(artifacts) == [("charliecloud", "native", "tensorflow"), ("sarus", "hybrid", "tensorflow"),
                                 ("sarus", "native", "tensorflow")]
    assert runtime_for("sarus", config, "native").image.endswith("-mpich")
    assert runtime_for("sarus", config, "hybrid").image.endswith("abcdef")


def test_a_native_model_that_cannot_use_the_built_image_names_the_key_to_set():
    # Shifter's gateway serves images from a registry (the hybrid model needs images.shifter.image too).
    config = {"runtimes": ["bare-metal", "shifter"], "slurm": {"gpus_per_node": 0},
              "benchmark": {"frameworks": ["tensorflow"]}, "benchmark_env": "cpu",
              "images": {"build": {"tag": TAG}, "shifter": {"image": "id:0123abcd", "mpi_model": ["hybrid", "native"]}}}
    with pytest.raises(ConfigError, match=r"^config: 'images.shifter.native_image' is missing; allowed: the image "):
        images.resolve_images(config, "/clone/build/images")
    config["images"]["shifter"]["native_image"] = "id:4567cdef"
    assert images.resolve_images(config, "/clone/build/images") == {}
    assert runtime_for("shifter", config, "native").image == "id:4567cdef"


# --- 2. Sarus --------------------------------------------------------------------------------

def test_sarus_runs_the_loaded_image_by_the_name_sarus_load_gives_it():
    # SARUS doc/user/user_guide.rst, "Loading images from tar archives": `sarus load ./debian.tar my_debian`
    # lists as "load/library/my_debian latest", and "to use or remove loaded images you need to enter the
    # image reference as displayed by the sarus images command"; src/cli/CommandLoad.hpp: usage
    # "sarus load [OPTIONS] FILE NAME[:TAG]", server "load".
    assert Sarus.prepare_commands(BUILT) == [
        ["sarus", "load", "/clone/build/images/containerbench-0123456789abcdef.tar", "containerbench:0123456789abcdef"]]
    reference = Sarus.reference(BUILT)
    assert reference == "load/library/containerbench:0123456789abcdef"
    argv = Sarus(reference).rank_argv(RunRequest(module="m", workdir="/w"))
    assert argv[argv.index(reference) - 1] == "PYTHONNOUSERSITE" and argv[argv.index(reference) + 1:] == [
        "python3", "-m", "m"]



# SARUS doc/user/user_guide.rst, "Loading images from tar archives": the listing after `sarus load ./debian.tar
# my_debian`, as printed there (src/cli/CommandImages.hpp prints these columns, IMAGE ID cut to 12 characters).
SARUS_IMAGES = ("REPOSITORY               TAG          IMAGE ID       CREATED               SIZE         SERVER\n"
                "load/library/my_debian   latest       2fe79f06fa6d   2018-01-31T15:08:56   47.04MB      load\n")


def test_sarus_reads_the_loaded_copy_back_and_removes_it_by_the_reference_sarus_images_lists():
    # SARUS doc/user/user_guide.rst, "Removing images": "to remove [...] images loaded from local tar archives you
    # need to enter the image reference as displayed by the sarus images command": `sarus rmi
    # load/library/my_debian`, answered "removed load/library/my_debian/latest"; src/cli/CommandRmi.hpp: usage
    # "sarus rmi REPOSITORY[:TAG]". IMAGE ID: OCIImage.cpp's imageID is the config digest's hash.
    untagged = BuiltImage("localhost/my_debian", "podman", "/clone/build/images")
    assert Sarus.remove_prepared_commands(untagged) == [["sarus", "rmi", "load/library/my_debian:latest"]]
    assert Sarus.remove_prepared_commands(BUILT) == [["sarus", "rmi", "load/library/containerbench:0123456789abcdef"]]
    asked = []

    def listing(text: str):
        return lambda argv: asked.append(argv) or text

    assert Sarus.read_prepared(untagged, listing(SARUS_IMAGES)) == {"sarus_image_id": "2fe79f06fa6d"}
    assert asked == [["sarus", "images"]]
    # Gone (the guide's listing before the load: its header alone), or another tag of it only: none read back,
    # so a removal knows the copy went and a prepare refuses a load that left none.
    for listed in (SARUS_IMAGES.splitlines()[0] + "\n", SARUS_IMAGES.replace(" latest ", " v1     ")):
        with pytest.raises(ValueError) as none:
            Sarus.read_prepared(untagged, listing(listed))
        assert str(none.value).startswith("`sarus images` lists no load/library/my_debian:latest (")
    with pytest.raises(ValueError):
        Sarus.read_prepared(BUILT, listing(SARUS_IMAGES))
    # Where Sarus stored no id, CommandImages.hpp prints "<none>": the copy is there, with no id to keep.
    assert Sarus.read_prepared(untagged, listing(SARUS_IMAGES.replace("2fe79f06fa6d", "<none>      "))) == {}


# --- 3. Charliecloud --------------------------------------------------------------------------

def test_charliecloud_injects_the_hosts_nvidia_libraries_for_gpu_runs():
    # CHARLIECLOUD doc/ch-fromhost.rst: "--nvidia Use nvidia-container-cli list [...] to find executables
    # and libraries to inject"; "It should be run after ch-convert and before ch-run"; the image must be
    # a directory (bin/ch-fromhost: "image not a directory").
    out = "/clone/build/images/containerbench-0123456789abcdef.ch"
    assert Charliecloud.prepare_commands(BUILT)[-2:] == [["ch-convert", "-i", "tar", "-o", "dir", f"{out}.tar", out],
                                                         ["ch-fromhost", "--nvidia", out]]
    cpu_only = BuiltImage(TAG, "podman", "/clone/build/images", gpus=False)
    assert Charliecloud.prepare_commands(cpu_only)[-1] == ["ch-convert", "-i", "tar", "-o", "dir", f"{out}.tar", out]


def test_charliecloud_converts_the_engines_flat_export_as_ch_convert_does_without_gzip():
    # CHARLIECLOUD bin/ch-convert, dockman_to_tar: `cid=$("$1" create --read-only "$2" /bin/true)`, then
    # `"$1" export "$cid"`, `"$1" rm "$cid"`, the image's Config.Env appended as ch/environment, then
    # `gzip_ -6`; dockman_to_dir unpacks that again ("FIXME: needlessly compresses"). doc/ch-convert.rst,
    # FMT tar: "the output of docker export works". doc/ch-run.rst, --set-env: "If there is no argument,
    # the file /ch/environment within the image is used" (the file images.charliecloud_image writes).
    out = "/clone/build/images/containerbench-0123456789abcdef.ch"
    container, flat_tar = "containerbench-0123456789abcdef.ch-export", f"{out}.tar"
    assert Charliecloud.export_paths(out) == (container, flat_tar)
    for engine in ("podman", "docker"):  # docker export and podman export both take --output
        built = BuiltImage(TAG, engine, "/clone/build/images", gpus=False)
        assert Charliecloud.prepare_commands(built) == [
            [engine, "create", "--read-only", "--name", container, TAG, "/bin/true"],
            [engine, "export", "--output", flat_tar, container],
            [engine, "rm", container],
            ["ch-convert", "-i", "tar", "-o", "dir", flat_tar, out]]
    assert Charliecloud.environment_file(out) == f"{out}/ch/environment"


@pytest.mark.skipif(shutil.which("ch-run") is None, reason="needs ch-run (scripts/container-engines.sh install)")
def test_charliecloud_asks_ch_run_for_extended_globs(monkeypatch):
    # CHARLIECLOUD doc/ch-run.rst, "--feature=FEAT": "If feature FEAT is enabled, exit successfully (zero);
    # otherwise, exit unsuccessfully"; "extglob: extended globs in --unset-env" (since v0.28). Run for real
    # against this machine's ch-run.
    monkeypatch.setenv("USER", "containerbench")
    found = subprocess.run(["ch-run", "--feature=extglob"], capture_output=True)
    assert Charliecloud("/img.ch").usable()[0] == (found.returncode == 0)


def test_charliecloud_writes_fake_only_where_the_site_says_and_then_asks_every_node():
    """Issue 32, finding 5: --write-fake was chosen from the planning host's ch-run version, and a node whose
    kernel lacks unprivileged overlayfs then failed every rank at start ("operation not permitted"; ch-run(1),
    "Writeable overlay with --write-fake", 1: kernel 5.11 or later). No ch-run here answers for a node, and
    `--feature=overlayfs` reports only how the node's own ch-run was built (ch-run(1), "--feature": "just
    communicates the results of configure"). So it is never guessed from this host: without the setting the
    binds go to mount points every image has; with it each node is asked."""
    assert Charliecloud("/img.ch").write_fake is False
    argv = Charliecloud("/img.ch").rank_argv(RunRequest(module="m", binds=("/data/imagenet",)))
    assert "--write-fake" not in argv and "--bind=/data/imagenet:/mnt" in argv and "--cd=/" in argv
    asked = Charliecloud("/img.ch", write_fake=True).node_requirements()
    assert [(need.argv, need.at_least) for need in asked] == [
        (("ch-run", "--feature=extglob"), None), (("ch-run", "--version"), "0.38"),
        (("ch-run", "--feature=overlayfs"), None)]
    assert asked[2].source == 'ch-run(1), --feature and "Writeable overlay with --write-fake"'


def test_charliecloud_without_extended_globs_is_unusable(tmp_path, monkeypatch):
    # CHARLIECLOUD doc/ch-run.rst, "--feature": exit status 87, "Feature queried by --feature is not
    # available". A ch-run that answers so cannot clean the environment with --unset-env='!(...)'.
    fake = tmp_path / "ch-run"
    fake.write_text("#!/bin/sh\n[ \"$1\" = --feature=extglob ] && exit 87\necho 0.38\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    ok, reason = Charliecloud("/img.ch", write_fake=True).usable()
    assert not ok and reason.startswith("`ch-run --feature=extglob` failed: this ch-run has no extended globs")


# --- 4. Docker under srun ------------------------------------------------------------------------

@pytest.mark.parametrize("version, files, expected", [
    # Slurm's cgroup/v2 layout: the limits on the job and the step, the rank in user/task_0 below them.
    ("v2", {"0::/system.slice/slurmstepd.scope/job_7/step_0/user/task_0": {
        "system.slice/slurmstepd.scope/job_7/memory.max": "8589934592",
        "system.slice/slurmstepd.scope/job_7/step_0/memory.max": "4294967296",
        "system.slice/slurmstepd.scope/job_7/step_0/user/task_0/memory.max": "max",
        "system.slice/slurmstepd.scope/job_7/cpu.max": "200000 100000",
        "system.slice/slurmstepd.scope/job_7/step_0/user/task_0/cpu.max": "max 100000"}}, (4294967296, 2.0)),
    ("v2", {"0::/": {"memory.max": "max", "cpu.max": "max 100000"}}, (None, None)),
    # Slurm's cgroup/v1 layout: /slurm/uid_U/job_J/step_S/task_T, the limit on the job.
    ("v1", {"4:memory:/slurm/uid_0/job_7/step_0/task_1\n1:cpu,cpuacct:/slurm/uid_0/job_7/step_0/task_1\n0::/": {
        "memory/slurm/uid_0/job_7/memory.limit_in_bytes": "1073741824",
        "memory/slurm/uid_0/job_7/step_0/task_1/memory.limit_in_bytes": "9223372036854771712",
        "cpu/slurm/uid_0/job_7/cpu.cfs_quota_us": "-1", "cpu/slurm/uid_0/job_7/cpu.cfs_period_us": "100000",
        "cpu/slurm/uid_0/job_7/step_0/task_1/cpu.cfs_quota_us": "-1"}},
     (1073741824, None)),
    ("v1 in a container", {"4:memory:/docker/abc\n": {"memory/memory.limit_in_bytes": "9223372036854771712"}},
     (None, None)),
])
def test_a_ranks_cgroup_limits_are_read_from_v1_and_v2(tmp_path, version, files, expected):
    # Linux Documentation/admin-guide/cgroup-v2.rst: memory.max "max" or bytes, cpu.max "$MAX $PERIOD";
    # cgroup-v1/memory.rst memory.limit_in_bytes, scheduler/sched-bwc.rst cpu.cfs_quota_us (-1: none).
    from containerbench.rank.telemetry import cgroup_limits

    [(proc_cgroup, tree)] = files.items()
    for path, text in tree.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text + "\n")
    limits = cgroup_limits(proc_cgroup, str(tmp_path))
    assert (limits["memory_max"], limits["cpu_max"]) == expected


@pytest.mark.root
def test_the_shim_gives_docker_the_memory_limit_of_the_ranks_cgroup(tmp_path):
    # docker run reference, "--memory": the container's limit. dockerd creates the container outside the
    # rank's cgroup (nebius/soperator#563), so the shim passes the step's limit on. Real: a memory cgroup
    # made here (v1 or v2, whichever this kernel mounts), the shim started inside it.
    from pathlib import Path

    v1, v2 = Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup")
    if v1.is_dir() and os.access(v1, os.W_OK):
        group, limit_file = v1 / f"containerbench-test-{os.getpid()}", "memory.limit_in_bytes"
    elif (v2 / "cgroup.controllers").exists() and "memory" in (v2 / "cgroup.subtree_control").read_text():
        group, limit_file = v2 / f"containerbench-test-{os.getpid()}", "memory.max"
    else:
        pytest.skip("no writable memory cgroup here")
    group.mkdir()
    try:
        (group / limit_file).write_text(str(2**30))
        def shim(*share: str) -> list[str]:
            shown = subprocess.run([sys.executable, "-m", "containerbench.rank.rankexec", "--memory-from-cgroup",
                                    *share, "--", "/bin/sh", "-c", 'echo "$@"', "sh", "run", "img"],
                                   capture_output=True, text=True,
                                   preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())))
            assert shown.returncode == 0, shown.stderr
            return shown.stdout.split()

        assert shim() == ["run", f"--memory={2**30}", "img"]
        # Issue 32, finding 8: four ranks of a node share the step's limit, as bare-metal ranks do.
        assert shim("--memory-share=4") == ["run", f"--memory={2**28}", "img"]
        request = RunRequest(module="containerbench.rank.bench", workdir="/work/x", ranks_per_node=4)
        assert "--memory-share=4" in Docker("img").rank_argv(request)
    finally:
        group.rmdir()


def test_the_shim_labels_a_docker_container_with_the_client_it_becomes():
    """Issue 32, finding 8: the label names the process the shim execs into, the engine's client (execve(2)
    keeps the process id; proc(5): /proc/PID/stat field 22, its start time, is the process's, not the
    program's), so `node-image` can tell a container whose client has ended (Docker.orphans, remove_orphans). It
    removes one only where it can see the client: on its host, in its pid namespace, its own user's or, as
    root, anyone's (proc(5), hidepid: another user's process may be hidden, not ended)."""
    from containerbench.processes import identity
    from containerbench.rank.rankexec import CLIENT_LABEL, CLIENT_UID_LABEL, own_identity

    assert own_identity() == identity(os.getpid())  # the shim's, written apart, names a process as the house does

    shown = subprocess.run([sys.executable, "-m", "containerbench.rank.rankexec", "--label-client", "--", "/bin/sh",
                            "-c", 'echo "$@"; echo "$$"', "sh", "run", "img"], capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    words, pid = shown.stdout.splitlines()
    run, client, owner, image = words.split()
    assert (run, image, owner) == ("run", "img", f"--label={CLIENT_UID_LABEL}={os.getuid()}")
    host, namespace, me, ticks = identity(os.getpid()).split(":")
    assert client.startswith(f"--label={CLIENT_LABEL}={host}:{namespace}:{pid}:")
    uid = str(os.getuid())
    assert Docker.client_ended(client.partition("=")[2].partition("=")[2], uid)  # the client has exited
    assert not Docker.client_ended(identity(os.getpid()), uid)  # this one has not
    assert not Docker.client_ended(f"elsewhere:{namespace}:{pid}:1", uid)
    assert not Docker.client_ended(f"{host}:another-namespace:{pid}:1", uid)
    if os.getuid() != 0:
        assert not Docker.client_ended(f"{host}:{namespace}:{pid}:1", str(os.getuid() + 1))  # maybe hidden: not mine
    assert "--label-client" in Docker("img").rank_argv(RunRequest(module="m", workdir="/w"))


# --- 5. podman, podman-hpc ---------------------------------------------------------------------

def test_podman_keep_id_shares_posix_shm_by_file_name():
    # UCX src/uct/sm/mm/posix/mm_posix.c, USE_PROC_LINK: "n - Use original file path to share posix file";
    # openucx/ucx#4224 (each rank in its own user namespace: "Permission denied. File name is:
    # /proc/24149/fd/16"), where the maintainers' answer is "setting UCX_POSIX_USE_PROC_LINK=n".
    rootless = Podman("img", uid=1000, gid=1000)
    assert rootless.environment(DATA)["UCX_POSIX_USE_PROC_LINK"] == "n"
    argv = rootless.rank_argv(DATA)
    assert argv[argv.index("--userns") + 1] == "keep-id" and "UCX_POSIX_USE_PROC_LINK" in argv
    assert "UCX_POSIX_USE_PROC_LINK" not in Podman("img", uid=0, gid=0).environment(DATA)  # no user namespace


def test_podman_hpc_adds_what_its_openmpi_pmix_module_adds_except_privileged():
    # PODMAN_HPC etc/modules.d/openmpi-pmix.yaml: --userns=keep-id; -e SLURM_*, SLURMD_*, PMI_*, PMIX_*;
    # binds /var/spool/slurmd, /run/munge, /etc/libibverbs.d, /dev/shm; --ipc/--network/--pid host;
    # and --privileged, which a benchmark run does not need.
    hpc = PodmanHPC("img", uid=1000, gid=1000)
    assert "/run/munge:/run/munge" not in hpc.rank_argv(DATA)  # not under srun: no Slurm to bind
    hpc.launcher = "srun"
    argv = hpc.rank_argv(DATA)
    volumes = [argv[i + 1] for i, word in enumerate(argv) if word == "--volume"]
    assert volumes[:5] == ["/tmp:/tmp", "/dev/shm:/dev/shm", "/var/spool/slurmd:/var/spool/slurmd",
                           "/run/munge:/run/munge", "/etc/libibverbs.d:/etc/libibverbs.d"]
    assert {"SLURM_*", "SLURMD_*", "PMI_*", "PMIX_*"} <= {argv[i + 1] for i, w in enumerate(argv) if w == "--env"}
    assert "--privileged" not in argv and argv[argv.index("--userns") + 1] == "keep-id"
    assert PodmanHPC.prepare_commands(BUILT)[-1] == ["podman-hpc", "migrate", TAG]


def test_podman_hpc_shares_a_container_per_node_and_names_the_launchers_local_rank():
    """podman-hpc 1.2.2 (PyPI; the same code as PODMAN_HPC): etc/modules.d/mpich.yaml sets shared_run, and
    podman_hpc.py's _shared_run starts one container per node, named `uid-UID-pid-PPID`, from the rank whose
    local id (os.environ[conf.localid_var]) is 0 or unset; the others wait for it and `podman exec` into it.
    siteconfig.py: localid_var = "SLURM_LOCALID", tasks_per_node_var = "SLURM_STEP_TASKS_PER_NODE", each
    overridden by PODMANHPC_<NAME> in the environment (_check_and_set). Hydra sets MPI_LOCALRANKID and
    MPI_LOCALNRANKS for each rank (mpiexec.mpich here: `MPI_LOCALNRANKS=2 MPI_LOCALRANKID=1`)."""
    hydra = runtime_for("podman-hpc", native_config("podman-hpc", launcher="mpirun"))
    assert hydra.launcher == "mpirun" and "--mpi" in hydra.rank_argv(CPU_RANK)
    # The module's additional_args say --ipc=host --network=host --pid=host; podman 4.3 refuses a second
    # --network ("cannot set multiple networks without bridge network mode", podman-hpc 1.2.2 run here).
    assert not {"--network", "--ipc", "--pid"} & set(hydra.rank_argv(CPU_RANK))
    assert hydra.environment(CPU_RANK).items() >= {"PODMANHPC_LOCALID_VAR": "MPI_LOCALRANKID",
                                                   "PODMANHPC_TASKS_PER_NODE_VAR": "MPI_LOCALNRANKS"}.items()
    hydra.launcher = "srun"  # Slurm's own variables, podman-hpc's defaults
    assert not any(name.startswith("PODMANHPC_") for name in hydra.environment(CPU_RANK))
    # Hybrid ranks too go through shared-run ("the recommended way to launch a container from a parallel launcher
    # such as Slurm srun or mpirun", shared_run's help); under mpirun Open MPI numbers a node's ranks
    # (OMPI_COMM_WORLD_LOCAL_RANK, _LOCAL_SIZE: Open MPI's mpirun(1), "Exported environment variables").
    hybrid = runtime_for("podman-hpc", {"images": {"podman-hpc": {"image": "img"}}, "launcher": {"kind": "mpirun"}})
    assert hybrid.rank_argv(CPU_RANK)[:2] == ["podman-hpc", "shared-run"] and "--mpi" not in hybrid.rank_argv(CPU_RANK)
    open_mpi = {"PODMANHPC_LOCALID_VAR": "OMPI_COMM_WORLD_LOCAL_RANK",
                "PODMANHPC_TASKS_PER_NODE_VAR": "OMPI_COMM_WORLD_LOCAL_SIZE"}
    assert hybrid.environment(CPU_RANK).items() >= open_mpi.items()


# --- 6. Apptainer ---------------------------------------------------------------------------------

def test_apptainer_builds_from_the_archive_in_the_documented_form_without_fakeroot():
    # APPTAINER_DOCS build_a_container.rst, "Reusing existing containers from Docker or Podman":
    # `apptainer build alpine.sif docker-archive:alpine.tar`; docker_and_oci.rst: "it uses :<filename>,
    # not ://<location>" (APPTAINER internal/pkg/ociimage/transport.go strips "//" only for docker://).
    # fakeroot.rst: "--fakeroot option is automatically implied when an unprivileged user uses the
    # build command" (cmd/internal/cli/build.go: for a definition file), and an archive needs none.
    sif, tar = (f"/clone/build/images/containerbench-0123456789abcdef{suffix}" for suffix in (".sif", ".tar"))
    assert Apptainer.prepare_commands(BUILT) == [["apptainer", "build", sif, f"docker-archive:{tar}"]]
    assert Singularity.prepare_commands(BUILT)[0][0] == "singularity"


@pytest.mark.parametrize("fabric, inside", [("rc,sm,self", "rc,sysv,self"), ("tcp,posix,cma,self", "tcp,sysv,self"),
                                            ("tcp,self", "tcp,self")])
def test_apptainer_ranks_use_sysv_shared_memory_in_their_user_namespaces(fabric, inside):
    # APPTAINER_DOCS mpi.rst (label mpi-issue): "The MPI UCX library has a problem with unprivileged user
    # namespaces. See apptainer issue 769 [...] use the UCX_TLS=sysv,ib transport as a workaround".
    env = Apptainer("/i.sif").environment(RunRequest(module="m", env={"UCX_TLS": fabric}))
    assert env["APPTAINERENV_UCX_TLS"] == inside
    assert "APPTAINERENV_UCX_TLS" not in Apptainer("/i.sif").environment(RunRequest(module="m"))


# --- 7. Enroot / Pyxis ---------------------------------------------------------------------------

def test_enroot_is_usable_only_with_its_pmi_hook_enabled(tmp_path, monkeypatch):
    # ENROOT conf/hooks/extra/50-slurm-pmi.sh (no 50-slurm-pmix.sh since d36c1fe) binds PMIX_SERVER_TMPDIR
    # and copies SLURM_*/PMIX_*/PMI_*; the Makefile installs extra hooks into $(DATADIR)/hooks.d while
    # src/runtime.sh reads ${ENROOT_SYSCONF_PATH}/hooks.d: a site must enable it.
    fake = tmp_path / "bin" / "enroot"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 3.5.0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin")
    monkeypatch.setenv("ENROOT_SYSCONF_PATH", str(tmp_path / "etc"))
    ok, reason = Enroot("/i.sqsh").usable()
    assert not ok and reason.startswith(f"enroot's PMI hook {tmp_path}/etc/hooks.d/50-slurm-pmi.sh is not enabled")
    (tmp_path / "etc" / "hooks.d").mkdir(parents=True)
    (tmp_path / "etc" / "hooks.d" / "50-slurm-pmi.sh").write_text("")
    assert Enroot("/i.sqsh").usable() == (True, "")


def test_pyxis_reads_only_paths_starting_with_slash_or_dot_as_files(tmp_path, monkeypatch):
    # PYXIS pyxis_slurmstepd.c: `if (strspn(context.args->image, "./") > 0)` "Assume `image` is a path to a
    # squashfs file"; otherwise "Assume `image` is an enroot URI for a docker image". A plan made from a
    # relative build directory names the built squashfs by its absolute path, and a bare file name the site
    # gives is refused.
    monkeypatch.chdir(tmp_path)
    assert Enroot.reference(BuiltImage(TAG, "podman", "build/images")) == str(
        tmp_path / "build/images/containerbench-0123456789abcdef.sqsh")
    problem = Enroot("images/tf.sqsh").site_image_problem()
    assert problem.startswith("'images.enroot.image' = 'images/tf.sqsh' would be pulled from a registry")
    assert Enroot("./images/tf.sqsh").image_is_file("./images/tf.sqsh")


def test_the_schema_lists_exactly_the_runtime_classes():
    # Adding a runtime is one class (and its tests): the schema, which Snakemake's validate reads as a
    # file too, must name it, and names no runtime without a class.
    from containerbench.config import load_schema
    from containerbench.runtimes import CONTAINER_RUNTIMES, RUNTIME_NAMES

    schema = load_schema()
    assert sorted(schema["properties"]["runtimes"]["items"]["enum"]) == sorted(RUNTIME_NAMES)
    assert set(schema["properties"]["images"]["properties"]) - {"build", "step_timeout_s", "binds"} == set(
        CONTAINER_RUNTIMES)


# --- the native MPI model: the host's MPICH-ABI libmpi swapped into the image ----------------------

def native_config(name: str, launcher: str = "srun") -> dict:
    return {"images": {name: {"image": "/images/mpich.sif" if name != "shifter" else "id:0123abcd",
                              "mpi_model": "native"}},
            "launcher": {"kind": launcher}, "bare_metal": {"python": "py"},
            "native_mpi": {"library": "/usr/lib/x86_64-linux-gnu/libmpich.so.12",
                           "image_library": "/opt/containerbench/venv/lib/libmpi.so.12"}}


BIND = "/usr/lib/x86_64-linux-gnu/libmpich.so.12:/opt/containerbench/venv/lib/libmpi.so.12"
CPU_RANK = RunRequest(module="m", workdir="/w")


@pytest.mark.parametrize("name, words, env", [
    # APPTAINER_DOCS mpi.rst, "Bind model": "{Project} needs to mount/bind the MPI available on the host
    # into the container", found through LD_LIBRARY_PATH.
    ("apptainer", ["--bind", BIND], {"APPTAINERENV_LD_LIBRARY_PATH": "/opt/containerbench/venv/lib"}),
    # The same bind model through the engines' file binds (podman-run(1), docker run reference: --volume
    # SRC:DST[:OPTIONS]), read-only.
    ("podman", ["--volume", f"{BIND}:ro"], {"LD_LIBRARY_PATH": "/opt/containerbench/venv/lib"}),
    ("docker", ["--volume", f"{BIND}:ro"], {"LD_LIBRARY_PATH": "/opt/containerbench/venv/lib"}),
    # CHARLIECLOUD doc/ch-run.rst "-b, --bind=SRC[:DST]"; a file onto an existing file binds on ch-run 0.31
    # (measured here). ch-fromhost --path would copy it under the host's own name instead.
    ("charliecloud", [f"--bind={BIND}"], {"LD_LIBRARY_PATH": "/opt/containerbench/venv/lib"}),
    # PODMAN_HPC etc/modules.d/mpich.yaml: cli_arg mpi, binds the site MPICH into /opt/udiImage/modules/mpich
    # and sets LD_LIBRARY_PATH itself.
    ("podman-hpc", ["--mpi"], {}),
    # SARUS doc/user/user_guide.rst, "Native MPI support (MPICH-based)": `sarus run --mpi`.
    ("sarus", ["--mpi"], {}),
    # SHIFTER doc/modules.rst: a site module (udiRoot.conf module_mpich_*) selected with --module=mpich.
    ("shifter", ["--module=mpich"], {}),
])
def test_each_runtime_swaps_the_host_mpi_in_by_its_own_documented_means(name, words, env):
    runtime = runtime_for(name, native_config(name))
    argv = runtime.rank_argv(CPU_RANK) + runtime.launcher_options(CPU_RANK)
    at = next(i for i in range(len(argv)) if argv[i:i + len(words)] == words)
    assert at > 0
    assert runtime.environment(CPU_RANK).items() >= env.items()
    assert runtime.srun_mpi == "pmi2"  # an MPICH libmpi: Slurm's mpi_guide, "MPICH" uses --mpi=pmi2
    hybrid = runtime_for(name, {**native_config(name), "images": {name: {
        **native_config(name)["images"][name], "mpi_model": "hybrid"}}})
    assert hybrid.rank_argv(CPU_RANK) + hybrid.launcher_options(CPU_RANK) != argv


def test_enroot_has_no_documented_mpi_swap_and_refuses_the_native_model():
    # ENROOT conf/hooks: no hook swaps an MPI library (50-slurm-pmi.sh only wires PMI up); Pyxis args.c
    # has no such option either.
    with pytest.raises(ValueError, match="^runtime 'enroot' has no documented way to swap the host's MPI in"):
        runtime_for("enroot", native_config("enroot"))


def test_enroot_on_the_compute_nodes_only_needs_tar_and_mksquashfs_where_the_workflow_plans(tmp_path, monkeypatch):
    """Issue 32, finding 7: with available: compute-nodes Enroot's image is made where the workflow builds it, by
    tar and mksquashfs, as NVIDIA/enroot src/docker.sh docker::daemon::import makes it (its checkcmd: jq, the
    engine, mksquashfs, tar); a login node without mksquashfs is told when planning, not at the image step.
    Real: this machine's tar, on a PATH without mksquashfs. And a site's ENROOT_SQUASH_OPTIONS is taken, as
    enroot takes it (enroot.in: config::export ENROOT_SQUASH_OPTIONS "-comp lzo -noD -exit-on-error")."""
    from helpers import tiny_config

    from containerbench.plans import plan_sweep
    from containerbench.runtimes import Enroot, select_runtimes

    config = tiny_config(tmp_path, runtimes=["bare-metal", "enroot"], launcher={"kind": "srun"},
                         runtime_policy="require", images={"enroot": {"available": "compute-nodes"}})
    sweep = plan_sweep(config, tmp_path, probe=False)
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "tar").symlink_to(shutil.which("tar"))
    monkeypatch.setenv("PATH", str(tools))
    with pytest.raises(ConfigError) as refused:
        select_runtimes(sweep.config, sweep.artifacts)
    assert str(refused.value).startswith(
        "config: runtime 'enroot' cannot run here: its image is made here without it (available: compute-nodes), "
        "with tar and mksquashfs, and mksquashfs is not installed here; allowed: ")
    assert Enroot.squash_argv("r", "o.sqsh", {}) == ["mksquashfs", "r", "o.sqsh", "-all-root", "-noappend",
                                                      "-comp", "lzo", "-noD", "-exit-on-error"]
    assert Enroot.squash_argv("r", "o.sqsh", {"ENROOT_SQUASH_OPTIONS": "-comp zstd -Xcompression-level 3"})[5:] == [
        "-comp", "zstd", "-Xcompression-level", "3"]


def test_native_runs_under_mpirun_are_launched_by_the_host_mpichs_hydra(tmp_path):
    # MPICH's mpiexec (Hydra) wires up MPICH ranks; Open MPI's mpirun cannot. Hydra passes the whole
    # environment by default (MPICH's Hydra usage: -genvall is the default). Its usage text (mpiexec -h,
    # MPICH 4.0.2): "-pmi-port  use the PMI_PORT model": the rank finds its PMI server by host:port
    # instead of the inherited PMI_FD socket, which podman run does not pass into the container
    # (test_native_mpi.py runs both).
    from containerbench.config import RunSpec
    from containerbench.launchers import Hydra, launcher_for

    config = {**native_config("podman", "mpirun"), "launcher": {"kind": "mpirun", "bind": "core"},
              "native_mpi": {"mpiexec": "mpiexec.mpich"}}
    runtime = runtime_for("podman", {**config, "images": {"podman": {"image": "img", "mpi_model": "native"}}})
    launcher = launcher_for(config, runtime)
    assert isinstance(launcher, Hydra)
    spec = RunSpec(kind="train", runtime="podman", fabric="f", nodes=1, ranks_per_node=2, repetition=1)
    assert launcher.wrap(["x"], spec, []) == ["mpiexec.mpich", "-pmi-port", "-n", "2", "-ppn", "2", "-bind-to",
                                               "core", "x"]


def test_charliecloud_under_hydra_is_told_its_peer_count():
    # CHARLIECLOUD ch-run usage (ch-run --help, 0.31): "--join-ct=N  number of join peers (implies
    # --join)"; doc/ch-run.rst, "Multiple processes in the same container with --join": without it the
    # count comes from OMPI_COMM_WORLD_LOCAL_SIZE, SLURM_STEP_TASKS_PER_NODE or SLURM_CPUS_ON_NODE (the
    # strings in the 0.31 binary), none of which MPICH's Hydra sets; measured: "join: no valid peer group
    # size found". Open MPI's mpirun and srun set theirs, so hybrid runs keep the plain --join.
    request = RunRequest(module="m", workdir="/w", ranks_per_node=2)
    native = runtime_for("charliecloud", native_config("charliecloud", "mpirun"))
    assert native.rank_argv(request)[:3] == ["ch-run", "--join", "--join-ct=2"]
    hybrid = runtime_for("charliecloud", {**native_config("charliecloud", "mpirun"), "images": {
        "charliecloud": {"image": "/images/c.ch"}}})
    assert hybrid.rank_argv(request)[:2] == ["ch-run", "--join"] and "--join-ct=2" not in hybrid.rank_argv(request)
    on_srun = runtime_for("charliecloud", native_config("charliecloud", "srun"))
    assert "--join-ct=2" not in on_srun.rank_argv(request)  # srun sets SLURM_STEP_TASKS_PER_NODE


def test_the_native_example_runs_both_models_side_by_side_with_the_mpich_flavour(monkeypatch):
    # config/native.yaml, the README's: podman and Charliecloud in both models, native under MPICH's
    # mpiexec with -pmi-port, on the -mpich flavour, each native run with an id of its own.
    from pathlib import Path

    from containerbench import config as cb_config
    from containerbench.plans import plan_sweep

    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)  # the host MPI's paths are the clone's, as the workflow plans them there
    config = cb_config.load([root / "config" / "config.yaml", root / "config" / "native.yaml"])
    sweep = plan_sweep(config, root, probe=False)
    assert sorted(sweep.artifacts) == [(name, model, "tensorflow") for name in ("charliecloud", "podman")
                                         for model in ("hybrid", "native")]
    assert sweep.artifacts[("podman", "native", "tensorflow")].endswith(
        "/build/images/podman-containerbench-latest-mpich.json")
    native = sweep.plans["train_podman_tcp-loopback_1x2_b8_native_rep1"]
    assert native.argv[:7] == ["mpiexec.mpich", "-pmi-port", "-n", "2", "-ppn", "2", "-bind-to"]
    assert "localhost/containerbench:latest-mpich" in native.argv and native.spec["mpi_model"] == "native"
    # The host MPI's own directory (scripts/host-mpi-tree.sh) bound whole at its path, first on LD_LIBRARY_PATH,
    # and read on the node before the ranks (hostmpi.py).
    tree = str(root / "build" / "host-mpi" / "lib")
    assert native.native_mpi == {"library": f"{tree}/libmpich.so.12", "library_dirs": [tree]}
    assert f"{tree}:{tree}:ro" in native.argv
    assert native.env["LD_LIBRARY_PATH"] == f"{tree}:/opt/containerbench/venv/lib"
    assert native.node_mpi[-5:] == ["node-mpi", "--library", f"{tree}/libmpich.so.12", "--library-dir", tree]
    hybrid = sweep.plans["train_podman_tcp-loopback_1x2_b8_rep1"]
    assert hybrid.argv[0] == "mpirun" and "localhost/containerbench:latest" in hybrid.argv
    charliecloud = sweep.plans["netbench_charliecloud_tcp-loopback_1x2_native_rep1"].argv
    assert "--join-ct=2" in charliecloud and charliecloud[charliecloud.index("--") - 1].endswith("latest-mpich.ch")
    # Without --write-fake, onto a mount point the image has (ch-run(1), -b: the destination must exist).
    [moved] = [word for word in charliecloud if word.startswith(f"--bind={tree}:")]
    assert moved.split(":")[1] in ("/mnt", "/media", "/srv")
    assert len(sweep.runs) == 5 * (2 * 3 + 1)  # 5 runtime/model pairs x (2 rank counts x 3 repetitions + netbench)


def test_plan_shows_every_runtime_in_each_mpi_model_it_supports(capsys, monkeypatch):
    # What a site admin reads before choosing runtimes: nine runtimes (and bare metal), both models,
    # each with its prepare commands, environment and argv, from the example site's config.
    from pathlib import Path

    from containerbench import cli

    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)
    assert cli.main(["plan", "--config", "config/site.example.yaml", "--every-runtime"]) == 0
    blocks = {block.splitlines()[0]: block for block in capsys.readouterr().out.split("\n\n")}
    from containerbench.runtimes import CONTAINER_RUNTIMES

    assert set(blocks) == {"bare-metal (host)",
                           *(f"{n} ({m})" for n in CONTAINER_RUNTIMES for m in ("hybrid", "native"))}
    assert blocks["enroot (native)"].endswith("not supported: runtime 'enroot' has no documented way to swap the "
                                              "host's MPI in; allowed: mpi_model hybrid")
    assert "argv: srun --mpi=pmi2 " in blocks["sarus (native)"] and " sarus run --mpi " in blocks["sarus (native)"]
    assert "prepare: sarus load " in blocks["sarus (hybrid)"]
    assert "load/library/containerbench:gpu" in blocks["sarus (hybrid)"]
    assert "--module=gpu,mpich" in blocks["shifter (native)"]
    assert "prepare: shifterimg lookup" in blocks["shifter (hybrid)"]
    assert "--bind=/usr/lib/x86_64-linux-gnu/libmpich.so.12:/opt/containerbench/venv/lib/libmpi.so.12" in blocks[
        "charliecloud (native)"]


def test_under_srun_pmi2_podman_keeps_the_tasks_pmi_socket_and_docker_is_refused():
    """Issue 32, finding 2. srun's pmi2 plugin hands each task an inherited socket, PMI_FD
    (SchedMD/slurm@284c3b95: src/plugins/mpi/pmi2/mpi_pmi2.c, mpi_p_slurmstepd_task: `PMI_FD`; the client
    reads it in contribs/pmi2/pmi2_api.c). podman closes every fd past 2 unless told
    (containers/podman@c6580b4a: docs/source/markdown/options/preserve-fds.md, "--preserve-fds=N"; `podman
    run` has it since 2.1.0, RELEASE_NOTES.md): its ranks go through the shim, which moves the socket to
    fd 3 and adds --preserve-fds=1. podman-hpc does that itself (podman-hpc 1.2.2, podman_hpc/podman_hpc.py:
    pmi_fd, called from call_podman for every podman command). docker's container is started by dockerd,
    which holds none of the rank's fds, and `docker run` has no such option: refused in one line."""
    pmi2 = RunRequest(module="containerbench.rank.bench", workdir="/work/x", inherited_pmi_fd=True)
    podman = Podman("img", host_python="/venv/bin/python", uid=0, gid=0)
    assert podman.rank_argv(pmi2)[:8] == ["/venv/bin/python", "-m", "containerbench.rank.rankexec", "--pmi-fd",
                                          "--label-client", "--insert-after", "run", "--"]
    without = podman.rank_argv(RunRequest(module="containerbench.rank.bench", workdir="/work/x"))
    assert podman.rank_argv(pmi2)[8:] == without[without.index("--") + 1:]
    hpc = PodmanHPC("img", uid=0, gid=0)
    assert hpc.rank_argv(pmi2)[0] == "podman-hpc" and "--preserve-fds" not in " ".join(hpc.rank_argv(pmi2))
    with pytest.raises(ValueError) as refused:
        Docker("img").rank_argv(pmi2)
    assert str(refused.value) == ("runtime 'docker' cannot pass srun's pmi2 socket (PMI_FD, an fd the rank "
                                  "inherits) into its containers, which dockerd starts; allowed: srun_mpi pmix, "
                                  "launcher mpirun, or podman (--preserve-fds)")


def test_a_sweep_of_docker_under_srun_pmi2_is_refused_before_any_job(tmp_path):
    from helpers import tiny_config

    from containerbench.plans import plan_sweep

    config = tiny_config(tmp_path, runtimes=["bare-metal", "docker"], launcher={"kind": "srun", "srun_mpi": "pmi2"},
                         scaling={"nodes": [1], "ranks_per_node": [1]})
    with pytest.raises(ConfigError) as refused:
        plan_sweep(config, tmp_path, probe=False)
    assert str(refused.value).startswith("config: runtime 'docker' cannot pass srun's pmi2 socket (PMI_FD")


def test_what_each_runtime_needs_on_a_node_is_asked_there_with_its_source():
    """Issue 32, findings 5, 7 and 10: version floors and node-side setup, asked by the pre-flight check on
    every node it runs on (preflight.check_requirements), each from the runtime's own record:
    - Sarus 1.4.0: `sarus run --env` and `--device` (which the shim adds per RDMA device) are in
      eth-cscs/sarus CHANGELOG.md "## [1.4.0]" ("Added"), absent from 1.3.x;
    - podman 4.1.0 and a CDI spec for GPU runs: NVIDIA/cloud-native-docs@52dcb7b
      container-toolkit/cdi-support.md, "Running a Workload with CDI" ("releases as of v4.1.0 include
      support for specifying CDI devices in the --device argument") and "Generating a CDI Specification"
      (`nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`; newer toolkits write /var/run/cdi);
    - Charliecloud: `--feature=extglob` (ch-run(1), "--feature"); --write-fake since 0.36
      (hpc/charliecloud commit 63f77b1, "PR #1793: add --write-fake via unprivileged overlayfs", first in v0.36),
      asked of a node with --feature=overlayfs since 0.38 (PR #1892; bin/ch-run.c at v0.37 has no such feature);
    - Enroot: the PMI hook is an extra hook, installed where enroot does not read it (NVIDIA/enroot Makefile:
      HOOKS_EXTRA to $(DATADIR)/hooks.d; src/runtime.sh reads ${ENROOT_SYSCONF_PATH}/hooks.d), and Pyxis has
      --container-env from v0.15.0 (NVIDIA/pyxis commit 5164d82; v0.14.0's args.c lacks it)."""
    assert [(n.argv, n.at_least) for n in Sarus("img").node_requirements()] == [(("sarus", "--version"), "1.4.0")]
    assert Podman("img").node_requirements(gpus=False) == []
    cdi = Podman("img").node_requirements(gpus=True)
    assert [(n.argv, n.at_least, n.paths) for n in cdi] == [
        (("podman", "--version"), "4.1.0", ()),
        ((), None, ("/etc/cdi/*.yaml", "/etc/cdi/*.json", "/var/run/cdi/*.yaml", "/var/run/cdi/*.json"))]
    assert PodmanHPC("img").node_requirements(gpus=True) == []  # its --gpu module, no CDI
    assert [(n.argv, n.at_least) for n in Charliecloud("/img", write_fake=True).node_requirements()] == [
        (("ch-run", "--feature=extglob"), None), (("ch-run", "--version"), "0.38"),
        (("ch-run", "--feature=overlayfs"), None)]
    assert len(Charliecloud("/img", write_fake=False).node_requirements()) == 1
    hook, pyxis = Enroot("/img.sqsh", launcher="srun").node_requirements()
    assert hook.paths == ("/etc/enroot/hooks.d/50-slurm-pmi.sh",) and not hook.argv
    assert (pyxis.argv, pyxis.holds) == (("srun", "--help"), "--container-env")


def test_shifter_puts_its_image_on_the_allocation_a_run_asks_for(tmp_path, monkeypatch):
    """Issue 32, finding 6. NERSC/shifter@84b7d349 doc/wlm/slurm.rst: "Integration with Slurm causes the
    setupRoot executable to be run in a per-node prolog at job allocation time", "ideal performance is
    realized if the --image and ALL --volume options are supplied in the batch submission script", and
    "Configuring Slurm Integration" step 5 (PrologFlags=alloc: the image "configured on all nodes at job start
    (allocation) time"). shifterSpank.c passes --module to setupRoot with them (-m). So a run that asks salloc
    for its own allocation gives them to salloc; its srun step and ranks name no image (each rank's `shifter`
    enters the prolog's instance). In an allocation not the run's own they stay the step's (the test above)."""
    from helpers import tiny_config

    from containerbench.plans import plan_sweep

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    shifter = configured("shifter", "srun", host_python=HOST_PY)
    own = RunRequest(**{**DATA.__dict__, "own_allocation": True})
    assert shifter.allocation_options(own) == ["--image=id:0123abcd", "--module=gpu",
                                               "--volume=/datasets/imagenet:/mnt"]
    assert shifter.launcher_options(own) == [] and shifter.allocation_options(DATA) == []

    config = tiny_config(tmp_path, runtimes=["bare-metal", "shifter"], launcher={"kind": "srun"},
                         scaling={"nodes": [2], "ranks_per_node": [1]}, images={"shifter": {"image": "id:0123abcd"}})
    sweep = plan_sweep(config, tmp_path, probe=False)
    run_plan = next(sweep.plans[spec.run_id] for spec in sweep.runs if spec.runtime == "shifter")
    given = [word for word in run_plan.allocation if word.startswith(("--image", "--module", "--volume"))]
    assert run_plan.allocation[0] == "salloc" and given[:2] == ["--image=id:0123abcd", "--module=none"]
    assert given[2].startswith("--volume=") and given[2].endswith(":/mnt")  # the telemetry directory, bound
    assert not any(word.startswith(("--image=", "--module=", "--volume=")) for word in run_plan.argv)
