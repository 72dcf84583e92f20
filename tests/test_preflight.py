"""The pre-flight job, run for real: what a compute node must see before any benchmark job.

A site's runtime that exists only on the compute nodes (Apptainer, say) is stood in for by
a stub on PATH (Apptainer cannot be installed here); its probe is Apptainer's documented
`apptainer --version` (apptainer.org/docs/user/main/cli/apptainer.html, "Options: --version")."""

import json
import os
import socket
import subprocess
import sys
from dataclasses import asdict

import pytest
from helpers import BENCH_PYTHON, ROOT, snakemake, tiny_config

from containerbench import cli, fabrics, images, preflight, runtimes
from containerbench import config as cb_config
from containerbench.plans import plan_sweep, site_image_files


def run_preflight(tmp_path, *args, path=None):
    env = {**os.environ, "PATH": path or os.environ["PATH"]}
    return subprocess.run([sys.executable, "-m", "containerbench", "preflight", "--out", str(tmp_path / "pre.json"),
                           *args], capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture
def apptainer_on_path(tmp_path):
    """A compute node's PATH with an `apptainer` that answers its version, as the real one does."""
    bin_dir = tmp_path / "node-bin"
    bin_dir.mkdir()
    stub = bin_dir / "apptainer"
    stub.write_text('#!/bin/sh\n[ "$1" = --version ] && echo "apptainer version 1.4.5" && exit 0\nexit 64\n')
    stub.chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


def test_a_node_that_sees_the_clone_and_has_the_runtime_passes(tmp_path, apptainer_on_path):
    probes = json.dumps({"apptainer": ["apptainer", "--version"]})
    done = run_preflight(tmp_path, "--repo", str(ROOT), "--sources-digest", preflight.sources_digest(ROOT),
                         "--probes", probes, path=apptainer_on_path)
    assert done.returncode == 0, done.stderr
    stamp = json.loads((tmp_path / "pre.json").read_text())
    assert stamp["problems"] == [] and stamp["probes"]["apptainer"]["detail"] == "apptainer version 1.4.5"


def test_each_problem_is_one_line_and_nothing_is_stamped(tmp_path):
    elsewhere = tmp_path / "not-shared"
    done = run_preflight(tmp_path, "--repo", str(elsewhere), "--sources-digest", "0" * 16,
                         "--bench-python", str(tmp_path / "no-venv" / "bin" / "python"),
                         "--probes", json.dumps({"apptainer": ["apptainer", "--version"]}),
                         path="/usr/bin:/bin")
    assert done.returncode == 1 and not (tmp_path / "pre.json").exists()
    host = os.uname().nodename
    assert done.stderr.splitlines() == [
        f"containerbench: preflight on {host}: the clone is not at {elsewhere} on this node; allowed: a clone on "
        "a filesystem the compute nodes mount at the same path as the login node",
        f"containerbench: preflight on {host}: 'bare_metal.python' = '{tmp_path}/no-venv/bin/python' does not "
        "exist on this node; allowed: a venv on a shared filesystem (scripts/setup-venv.sh bench) or an "
        "interpreter every node has",
        f"containerbench: preflight on {host}: runtime 'apptainer' cannot run on this node: apptainer is not "
        "installed (not on PATH)",
    ]


def test_a_stale_copy_of_the_clone_is_not_the_clone(tmp_path):
    copy = tmp_path / "copy"
    (copy / "src" / "containerbench" / "rank").mkdir(parents=True)
    (copy / "src" / "containerbench" / "rank" / "bench.py").write_text("# an older checkout\n")
    done = run_preflight(tmp_path, "--repo", str(copy), "--sources-digest", preflight.sources_digest(ROOT))
    assert done.returncode == 1
    assert f"the clone at {copy} differs from the one the workflow planned with" in done.stderr


@pytest.mark.bench
def test_the_bare_metal_python_must_import_the_benchmark(tmp_path):
    done = run_preflight(tmp_path, "--repo", str(ROOT), "--sources-digest", preflight.sources_digest(ROOT),
                         "--bench-python", str(BENCH_PYTHON))
    assert done.returncode == 0, done.stderr
    done = run_preflight(tmp_path, "--repo", str(ROOT), "--sources-digest", preflight.sources_digest(ROOT),
                         "--bench-python", sys.executable)  # the workflow venv: no TensorFlow
    assert done.returncode == 1 and "cannot import the benchmark's packages on this node" in done.stderr


def test_a_pytorch_sweep_refuses_a_torch_python_without_torch_before_any_run(tmp_path, torch_python):
    digest = preflight.sources_digest(ROOT)
    done = run_preflight(tmp_path, "--repo", str(ROOT), "--sources-digest", digest, "--torch-python", str(torch_python))
    assert done.returncode == 0, done.stderr
    # The TensorFlow venv given for PyTorch's: it has mpi4py and no torch.
    done = run_preflight(tmp_path, "--repo", str(ROOT), "--sources-digest", digest, "--torch-python", str(BENCH_PYTHON))
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"containerbench: preflight on {os.uname().nodename}: 'bare_metal.torch_python' = '{BENCH_PYTHON}' cannot "
        "import the benchmark's packages on this node: ModuleNotFoundError: No module named 'torch'"]


def test_the_workflow_checks_each_frameworks_bare_metal_python(tmp_path):
    config = tiny_config(tmp_path, benchmark={"frameworks": ["pytorch"]})
    argv = preflight.check_argv(config, ROOT, sys.executable, {"pytorch": config["bare_metal"]["torch_python"]}, {})
    assert argv[argv.index("--torch-python") + 1] == config["bare_metal"]["torch_python"]
    assert "--bench-python" not in argv


COMPUTE_ONLY = {"runtimes": ["bare-metal", "apptainer"], "runtime_policy": "require",
                "images": {"apptainer": {"image": "/sw/images/containerbench.sif", "available": "compute-nodes"}}}


def test_a_runtime_only_on_compute_nodes_is_not_probed_where_the_workflow_plans(tmp_path):
    assert subprocess.run(["sh", "-c", "command -v apptainer"]).returncode != 0  # as on a login node
    config = tiny_config(tmp_path, **COMPUTE_ONLY)
    sweep = plan_sweep(config, ROOT, probe=True)  # require: a runtime that cannot run here would be refused
    assert {run.runtime for run in sweep.runs} == {"bare-metal", "apptainer"} and sweep.skipped == {}
    everywhere = cb_config.merge(tiny_config(tmp_path, **COMPUTE_ONLY),
                                 {"images": {"apptainer": {"available": "everywhere"}}})
    with pytest.raises(cb_config.ConfigError, match="runtime 'apptainer' cannot run here: apptainer is not installed"):
        plan_sweep(everywhere, ROOT, probe=True)


def test_under_slurm_the_check_runs_on_one_compute_node_through_srun(tmp_path):
    config = tiny_config(tmp_path, **COMPUTE_ONLY, launcher={"kind": "srun"},
                         slurm={"partition": "gpu", "account": "proj", "qos": None, "constraint": "a100"})
    pythons = {"tensorflow": "/sw/cb/.venv-bench/bin/python"}
    argv = preflight.check_argv(config, ROOT, "/sw/cb/.venv/bin/python", pythons,
                                {"apptainer": ["apptainer", "--version"]}, ["/sw/images/tf.sif"])
    assert argv == ["srun", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1", "--time=10",
                    "--job-name=containerbench-preflight", "--partition=gpu", "--account=proj", "--constraint=a100",
                    "/sw/cb/.venv/bin/python", "-m", "containerbench", "preflight", "--repo", str(ROOT),
                    "--sources-digest", preflight.sources_digest(ROOT),
                    "--bench-python", "/sw/cb/.venv-bench/bin/python",
                    "--probes", '{"apptainer": ["apptainer", "--version"]}', "--image-file=/sw/images/tf.sif"]
    assert cli.build_parser().parse_args(argv[9 + 3:]).command == "preflight"  # what follows `python -m containerbench`
    local = preflight.check_argv(tiny_config(tmp_path), ROOT, sys.executable, {}, {})
    assert local[:4] == [sys.executable, "-m", "containerbench", "preflight"]  # mpirun or none: here


def test_the_workflow_stops_before_any_job_when_a_node_cannot_run_it(tmp_path):
    # A real run, not a dry run (the check is Snakemake's onstart hook): nothing is started.
    bad = tmp_path / "bad.yaml"
    bad.write_text(json.dumps({"runtimes": ["bare-metal"], "bare_metal": {"python": str(tmp_path / "no-venv")}}))
    done = snakemake(tmp_path, "--configfile", str(ROOT / "config" / "config.yaml"), str(bad))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert [line for line in done.stderr.splitlines() if line.startswith("containerbench:")] == [
        f"containerbench: preflight on {os.uname().nodename}: 'bare_metal.python' = '{tmp_path}/no-venv' does not "
        "exist on this node; allowed: a venv on a shared filesystem (scripts/setup-venv.sh bench) or an "
        "interpreter every node has"]
    assert not (tmp_path / "results").exists()


DIGEST = "@sha256:" + "0123456789abcdef" * 4


@pytest.mark.parametrize("runtime,image,available,problem", [
    # A SIF (Apptainer: "apptainer exec image.sif") or squashfs (Pyxis: a path starts with / or .) must exist.
    ("apptainer", "/sw/images/missing.sif", "everywhere",
     "'images.apptainer.image' = '/sw/images/missing.sif' does not exist; allowed: an existing file or directory"),
    ("apptainer", "/sw/images/missing.sif", "compute-nodes", None),  # the pre-flight job looks on the node
    ("enroot", "./images/missing.sqsh", "everywhere", "does not exist"),
    # A registry reference is pinned by digest (OCI image spec, "Digests"), else two runs may measure two images.
    ("enroot", "docker://nvcr.io#nvidia/tensorflow:24.01-tf2-py3", "everywhere",
     "'images.enroot.image' = 'docker://nvcr.io#nvidia/tensorflow:24.01-tf2-py3' is neither a file nor pinned"),
    ("enroot", f"docker://nvcr.io#nvidia/tensorflow{DIGEST}", "everywhere", None),
    ("apptainer", f"docker://nvcr.io/nvidia/tensorflow{DIGEST}", "everywhere", None),
    ("sarus", "nvcr.io/nvidia/tensorflow:24.01-tf2-py3", "everywhere", "is neither a file nor pinned by digest"),
    ("podman-hpc", "nvcr.io/nvidia/tensorflow:24.01-tf2-py3", "everywhere", "is neither a file nor pinned"),
    # Shifter names an image by the id `shifterimg lookup` prints (shifter(1): --image=id:<id>).
    ("shifter", "id:" + "ab" * 32, "everywhere", None),
    ("shifter", "docker:nvcr.io/nvidia/tensorflow:24.01-tf2-py3", "everywhere",
     "'images.shifter.image' = 'docker:nvcr.io/nvidia/tensorflow:24.01-tf2-py3' is not pinned; allowed: id:<id>"),
])
def test_an_image_the_site_supplies_exists_or_is_pinned(tmp_path, runtime, image, available, problem):
    config = tiny_config(tmp_path, runtimes=["bare-metal", runtime],
                         images={runtime: {"image": image, "available": available}})
    found = runtimes.runtime_for(runtime, config).site_image_problem()
    assert found == problem if problem is None else problem in found


@pytest.mark.containers
def test_a_local_engine_accepts_an_image_of_its_own_store(tmp_path, container_engines):
    built = images.built_image("podman", "localhost/containerbench:latest", ROOT / "build" / "images")
    assert built is not None
    for image, problem in (("localhost/containerbench:latest", None),
                           ("localhost/containerbench:never-built", "is neither a file nor pinned by digest")):
        config = tiny_config(tmp_path, runtimes=["bare-metal", "podman"], images={"podman": {"image": image}})
        found = runtimes.runtime_for("podman", config).site_image_problem()
        assert found == problem if problem is None else problem in found
    # Before any job, in one line.
    with pytest.raises(cb_config.ConfigError, match=r"^config: 'images.podman.image' = "
                                                    r"'localhost/containerbench:never-built' is neither"):
        plan_sweep(config, ROOT, probe=True)


def test_a_site_image_only_the_nodes_see_is_looked_for_there(tmp_path):
    config = tiny_config(tmp_path, runtimes=["bare-metal", "apptainer"], runtime_policy="require",
                         images={"apptainer": {"image": str(tmp_path / "gone.sif"), "available": "compute-nodes"}})
    sweep = plan_sweep(config, ROOT, probe=True)  # not refused here: only the nodes see it
    assert site_image_files(config, sweep.artifacts) == [f"{tmp_path}/gone.sif"]
    done = run_preflight(tmp_path, "--repo", str(ROOT), "--sources-digest", preflight.sources_digest(ROOT),
                         "--image-file", str(tmp_path / "gone.sif"))
    assert done.returncode == 1
    assert done.stderr.splitlines() == [f"containerbench: preflight on {os.uname().nodename}: the image "
                                        f"{tmp_path}/gone.sif does not exist on this node; allowed: an image on a "
                                        "filesystem the compute nodes mount"]


# --- the nodes' own devices and room for the ranks (issue 36, item 4) -------------------------------

SITE = cb_config.load([str(ROOT / "config" / "site.example.yaml")])


def test_the_devices_each_fabric_names_are_read_as_each_layer_reads_its_list():
    requests = {(each.key.split(".", 1)[1], each.name, each.port, each.exact)
                for each in fabrics.named_devices(SITE["fabrics"])}
    # NCCL reads NCCL_IB_HCA and NCCL_SOCKET_IFNAME as prefixes, exact names after "=" and ports after ":"
    # (NCCL's "Environment Variables", System configuration: NCCL_SOCKET_IFNAME, NCCL_IB_HCA); UCX_NET_DEVICES
    # takes device:port or an interface (UCX's FAQ, "Which network devices does UCX use?").
    assert requests == {
        *(("infiniband.env.NCCL_IB_HCA", f"mlx5_{rail}", "", True) for rail in range(4)),
        *(("infiniband.env.UCX_NET_DEVICES", f"mlx5_{rail}", "1", True) for rail in range(4)),
        ("ethernet.env.NCCL_SOCKET_IFNAME", "eth0", "", False),
        ("ethernet.env.UCX_NET_DEVICES", "eth0", "", True),
        ("ethernet.env.OMPI_MCA_btl_tcp_if_include", "eth0", "", True),
        ("ethernet.env.HOROVOD_GLOO_IFACE", "eth0", "", True),
    }
    # An exclusion, a subnet or "all" names no device the node must have.
    assert fabrics.named_devices({"x": {"env": {"NCCL_SOCKET_IFNAME": "^docker,lo", "UCX_NET_DEVICES": "all",
                                               "OMPI_MCA_btl_tcp_if_include": "10.0.0.0/8"}}}) == []


def infiniband_tree(root, ports: dict[str, str]):
    """/sys/class/infiniband as the kernel writes it: a port's state is "4: ACTIVE" (drivers/infiniband/
    core/sysfs.c, state_show: "%d: %s" of the port state and its name)."""
    for device_port, state in ports.items():
        device, port = device_port.split(":")
        (root / "class" / "infiniband" / device / "ports" / port).mkdir(parents=True)
        (root / "class" / "infiniband" / device / "ports" / port / "state").write_text(state + "\n")
    return root


def test_an_hca_missing_or_not_active_is_named_with_the_key_that_asks_for_it(tmp_path):
    sys_root = infiniband_tree(tmp_path, {"mlx5_0:1": "4: ACTIVE", "mlx5_1:1": "4: ACTIVE",
                                          "mlx5_2:1": "1: DOWN"})  # mlx5_3 missing: a rail not cabled, say
    requests = [each for each in fabrics.named_devices(SITE["fabrics"]) if ".infiniband." in each.key]
    problems = preflight.check_devices(requests, sys_root, interfaces={"lo": "up", "eth0": "up"})
    hca, ucx = "'fabrics.infiniband.env.NCCL_IB_HCA' = '=mlx5_0,mlx5_1,mlx5_2,mlx5_3'", \
        "'fabrics.infiniband.env.UCX_NET_DEVICES' = 'mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1'"
    assert problems == [
        f"{hca}: no port is ACTIVE on this node (mlx5_2 port 1: 1: DOWN); allowed: a port the subnet manager made "
        "ACTIVE (`ibstat`)",
        f"{hca} names the InfiniBand device mlx5_3, which this node does not have (InfiniBand devices here: "
        "mlx5_0, mlx5_1, mlx5_2); allowed: a device `ibv_devinfo -l` lists on the nodes",
        f"{ucx}: no port is ACTIVE on this node (mlx5_2 port 1: 1: DOWN); allowed: a port the subnet manager made "
        "ACTIVE (`ibstat`)",
        f"{ucx} names mlx5_3:1, which this node has neither as an InfiniBand device nor as an "
        "interface (InfiniBand devices here: mlx5_0, mlx5_1, mlx5_2; interfaces here: eth0, lo); allowed: "
        "`ibv_devinfo -l` or `ip -br link` on the nodes",
    ]
    healthy = infiniband_tree(tmp_path / "healthy", {f"mlx5_{rail}:1": "4: ACTIVE" for rail in range(4)})
    assert preflight.check_devices(requests, healthy, interfaces={}) == []


def test_this_nodes_interfaces_are_read_from_its_own_network_namespace():
    # lo is in every namespace; the check asks the kernel (if_nameindex, SIOCGIFFLAGS), not sysfs.
    states = preflight.interface_states()
    assert states["lo"] == "up" and set(states) == {name for _, name in socket.if_nameindex()}
    lo = fabrics.named_devices({"tcp-loopback": {"env": {"OMPI_MCA_btl_tcp_if_include": "lo",
                                                        "NCCL_SOCKET_IFNAME": "l"}}})  # a prefix of lo
    assert preflight.check_devices(lo) == []
    missing = fabrics.named_devices({"tcp": {"env": {"HOROVOD_GLOO_IFACE": "cb-no-such0"}}})
    assert preflight.check_devices(missing) == [
        "'fabrics.tcp.env.HOROVOD_GLOO_IFACE' = 'cb-no-such0' names the interface cb-no-such0, which this node does "
        f"not have (interfaces here: {', '.join(sorted(states))}); allowed: an interface `ip -br link` lists on "
        "the nodes"]


@pytest.mark.netns
def test_an_interface_that_is_down_on_the_node_stops_the_sweep_before_any_run(tmp_path):
    # A fresh network namespace has one interface, lo, and it is down (network_namespaces(7)): a node
    # whose fabric interface is down, for real. The check runs in it as it would on that node.
    devices = json.dumps([asdict(each) for each in fabrics.named_devices(
        {"tcp-loopback": {"env": {"OMPI_MCA_btl_tcp_if_include": "lo", "UCX_NET_DEVICES": "eth0"}}})])
    done = subprocess.run(["unshare", "--net", sys.executable, "-m", "containerbench", "preflight", "--repo", str(ROOT),
                           "--sources-digest", preflight.sources_digest(ROOT), "--devices", devices],
                          capture_output=True, text=True, timeout=120)
    host = os.uname().nodename
    assert done.returncode == 1 and done.stderr.splitlines() == [
        f"containerbench: preflight on {host}: 'fabrics.tcp-loopback.env.UCX_NET_DEVICES' = 'eth0' names eth0, which "
        "this node has neither as an InfiniBand device nor as an interface (no InfiniBand devices here; interfaces "
        "here: lo); allowed: `ibv_devinfo -l` or `ip -br link` on the nodes",
        f"containerbench: preflight on {host}: 'fabrics.tcp-loopback.env.OMPI_MCA_btl_tcp_if_include' = 'lo': the "
        "interface is not up on this node (lo down); allowed: an interface that is up with a carrier (`ip -br link`)"]


def test_more_ranks_than_the_node_has_cpus_or_gpus_is_refused_with_what_the_node_has(tmp_path):
    cpus = os.cpu_count()
    done = run_preflight(tmp_path, "--repo", str(ROOT), "--sources-digest", preflight.sources_digest(ROOT),
                         f"--ranks-per-node={cpus}", "--cpus-per-rank=2", "--gpus-per-node=4")
    host = os.uname().nodename
    gpus_here = preflight.count_gpus()  # a CPU node here; a GPU host gives its own count
    assert done.returncode == 1 and done.stderr.splitlines()[0] == (
        f"containerbench: preflight on {host}: 'scaling.ranks_per_node' = {cpus} ranks x 'slurm.cpus_per_rank' = 2 "
        f"CPUs is {2 * cpus} CPUs, and this node has {cpus}; allowed: at most {cpus} CPUs per node")
    if gpus_here is None:
        assert done.stderr.splitlines()[1:] == [
            f"containerbench: preflight on {host}: 'slurm.gpus_per_node' = 4, but this node has no NVIDIA driver "
            "(no /proc/driver/nvidia/gpus); allowed: GPU nodes, or slurm.gpus_per_node: 0"]
    # The driver's /proc interface has a directory per GPU, named by its PCI address (the NVIDIA driver's
    # README, "Using the /proc File System Interface": /proc/driver/nvidia/gpus/domain:bus:device.function).
    for bus in ("0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0"):
        (tmp_path / "proc" / "driver" / "nvidia" / "gpus" / bus).mkdir(parents=True)
    gpus = preflight.count_gpus(tmp_path / "proc")
    assert gpus == 4 and preflight.check_layout(4, 8, 4, cpus=112, gpus=gpus) == []
    assert preflight.check_layout(4, 8, 8, cpus=112, gpus=4) == [
        "'slurm.gpus_per_node' = 8, and this node has 4 GPUs (/proc/driver/nvidia/gpus); allowed: at most 4"]


def test_the_workflow_asks_the_node_for_the_sweeps_devices_and_its_busiest_node(tmp_path):
    sweep = plan_sweep(SITE, ROOT, probe=False)
    argv = preflight.check_argv(SITE, ROOT, sys.executable, {}, {}, (), sweep.runs)
    sent = [fabrics.DeviceRequest(**each) for each in json.loads(argv[argv.index("--devices") + 1])]
    assert sent == fabrics.named_devices(SITE["fabrics"])
    assert argv[-3:] == ["--ranks-per-node=4", "--cpus-per-rank=8", "--gpus-per-node=4"]


def test_the_check_runs_on_as_many_nodes_as_the_largest_run_and_asks_each_for_the_runtimes_needs(tmp_path):
    """Issue 32, finding 10: what a runtime needs on a node (a version, a hook, a CDI spec) is asked on the
    nodes, one task each, as many as the sweep's largest run takes; not where the workflow plans."""
    config = tiny_config(tmp_path, runtimes=["bare-metal", "charliecloud"], launcher={"kind": "srun"},
                         scaling={"nodes": [1, 4], "ranks_per_node": [1]},
                         images={"charliecloud": {"write_fake": True}})
    sweep = plan_sweep(config, tmp_path, probe=False)
    needs = runtimes.node_requirements(sweep.config)
    assert [need.what for need in needs] == [
        "a ch-run with extended globs (--unset-env keeps the rank's variables)",
        "ch-run 0.38 or later (--write-fake, and --feature=overlayfs to ask for it; or set "
        "images.charliecloud.write_fake: false)",
        "unprivileged overlayfs for --write-fake (or set images.charliecloud.write_fake: false)"]
    argv = preflight.check_argv(sweep.config, ROOT, sys.executable, {}, {}, runs=sweep.runs, requirements=needs)
    assert argv[:4] == ["srun", "--nodes=4", "--ntasks=4", "--ntasks-per-node=1"]
    given = json.loads(argv[argv.index("--requirements") + 1])
    assert [runtimes.NodeRequirement.from_json(each) for each in given] == needs
    parsed = cli.build_parser().parse_args(argv[argv.index("-m") + 2:])
    assert json.loads(parsed.requirements) == given


def test_podman_hpc_under_srun_needs_each_slurm_path_it_binds_on_every_node(tmp_path):
    """Under srun each podman-hpc rank binds images.podman-hpc.slurm_paths (what its openmpi-pmix module binds:
    podman-hpc 1.2.2 etc/modules.d/openmpi-pmix.yaml), and `podman run` fails on a bind whose source is missing
    (podman-run(1), --volume; seen on the test cluster: "statfs /var/spool/slurmd: no such file or directory").
    The pre-flight asks every node for each, and names the key; under mpirun nothing is bound, nothing asked."""
    spool = tmp_path / "no-spool"
    config = tiny_config(tmp_path, runtimes=["podman-hpc"], launcher={"kind": "srun"},
                         images={"podman-hpc": {"slurm_paths": [str(spool), "/tmp"]}})
    needs = runtimes.node_requirements(plan_sweep(config, tmp_path, probe=False).config)
    assert [(need.runtime, need.paths) for need in needs] == [("podman-hpc", (str(spool),)), ("podman-hpc", ("/tmp",))]
    assert preflight.check_requirements(needs) == [
        f"runtime 'podman-hpc' needs {spool}, which each rank binds under srun (images.podman-hpc.slurm_paths: the "
        f"site's SlurmdSpoolDir and munge socket directory): none of {spool} is on this node (podman-hpc 1.2.2 "
        "etc/modules.d/openmpi-pmix.yaml, its binds; podman-run(1), --volume)"]
    config = tiny_config(tmp_path, runtimes=["podman-hpc"], images={"podman-hpc": {"slurm_paths": [str(spool)]}})
    assert runtimes.node_requirements(plan_sweep(config, tmp_path, probe=False).config) == []


def test_a_runtime_need_the_node_lacks_is_one_line_naming_the_runtime_what_the_node_has_and_the_source():
    """Real commands of this node stand in for a runtime's (python3's version, ls's --help)."""
    need = runtimes.NodeRequirement
    assert preflight.check_requirements([need("x", "Python 3.0 or later", ("python3", "--version"), at_least="3.0"),
                                         need("x", "ls with --all", ("ls", "--help"), holds="--all"),
                                         need("x", "a root directory", paths=("/nonexistent", "/")),
                                         need("x", "a config directory", paths=("/e?c",))]) == []
    found = subprocess.run(["python3", "--version"], capture_output=True, text=True).stdout.split()[1]
    assert preflight.check_requirements([
        need("sarus", "Sarus 99.1 or later", ("python3", "--version"), at_least="99.1", source="its CHANGELOG"),
        need("enroot", "Pyxis 0.15 or later (srun --container-env)", ("ls", "--help"), holds="--container-env"),
        need("podman", "a CDI spec", paths=("/nonexistent/nvidia.yaml", "/nonexistent/nvidia.json")),
        need("sarus", "Sarus 1.4.0 or later", ("no-such-sarus", "--version")),
    ]) == [
        f"runtime 'sarus' needs Sarus 99.1 or later: this node has {found} (`python3 --version`) (its CHANGELOG)",
        "runtime 'enroot' needs Pyxis 0.15 or later (srun --container-env): `ls --help` does not list "
        "--container-env on this node",
        "runtime 'podman' needs a CDI spec: none of /nonexistent/nvidia.yaml, /nonexistent/nvidia.json is on this node",
        "runtime 'sarus' needs Sarus 1.4.0 or later: no-such-sarus is not installed (not on PATH)",
    ]


def test_the_workflow_stops_on_a_nodes_missing_runtime_need_in_one_line(tmp_path):
    """The whole path: the command the workflow runs, given a requirement this node cannot meet."""
    need = runtimes.NodeRequirement("charliecloud", "ch-run 99.0 or later (--write-fake)", ("python3", "--version"),
                                    at_least="99.0")
    argv = preflight.check_argv(tiny_config(tmp_path), ROOT, sys.executable, {}, {}, requirements=[need])
    with pytest.raises(SystemExit) as stopped:
        preflight.run_before_jobs(argv)
    assert str(stopped.value).startswith(f"containerbench: preflight on {socket.gethostname()}: runtime "
                                         "'charliecloud' needs ch-run 99.0 or later (--write-fake): this node has 3.")
