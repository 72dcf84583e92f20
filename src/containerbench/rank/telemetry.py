"""What each node did while a run measured: one light sampler per node, and each rank's own view.

The node's local rank 0 starts the sampler (`start_sampler`) before anything heavy is
imported; it runs beside the ranks in the same runtime (bare metal or inside the
container), so it works wherever the ranks work, under mpirun or srun. Every `interval`
seconds it appends raw cumulative counters to DIR/<host>.csv (time_unix, metric, device,
value), flushed per sample so a crash keeps what was sampled:

    cpu_busy_s / cpu_idle_s / cpu_steal_s   per core, from /proc/stat (host-wide: not namespaced)
    run_cpu_s, run_rss_bytes                the run's registered rank processes (/proc/<pid>/stat, statm)
    sampler_cpu_s                           the sampler itself, so its cost is known
    service_cpu_s, service_cpu_by_name_s    the runtime's and launcher's processes (dockerd, conmon, orted),
                                            per core their threads ran on and per name, accumulated
    smt_core                                per core, once: its hardware core, named by the lowest CPU on
                                            it (sysfs core_cpus_list), so what runs on an SMT sibling of
                                            the run's cores is seen (usage.summarise_node)
    load1, mem_used_bytes                   /proc/loadavg, /proc/meminfo
    net_{rx,tx}_{bytes,packets}             per interface, /proc/net/dev
    ib_{rx,tx}_{bytes,packets}              per InfiniBand port, /sys/class/infiniband/*/ports/*/counters
    gpu_util_percent, gpu_mem_used_bytes, gpu_power_w, gpu_sm_clock_mhz   NVML, else nvidia-smi's loop

Counters stay raw (rates are differences), so a measured window is integrated exactly.
Every rank registers its PID in DIR/kernel-<boot id>.pids (with its PID namespace: a PID from
another namespace is not followed). The file is per kernel, not per host name, because /proc/stat
is: where several Slurm nodes share one kernel (a test cluster's slurmd per UTS namespace), every
rank on it is the run's own CPU, not a stranger's. Each rank also records its own CPU time over
the measured window, its CPU affinity, its cgroup and evidence of the container it runs in
(`rank_context`).

    python -m containerbench.rank.telemetry --out F.csv --pids F.pids --interval 0.5 --parent PID \
        --services dockerd,conmon
"""

from __future__ import annotations

import argparse
import csv
import glob
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
# /proc/stat per-CPU fields: user nice system idle iowait irq softirq steal (guest time is inside user).
BUSY_FIELDS, IDLE_FIELDS, STEAL_FIELD = (0, 1, 2, 5, 6), (3, 4), 7
IB_COUNTERS = {"port_xmit_data": ("ib_tx_bytes", 4), "port_rcv_data": ("ib_rx_bytes", 4),  # in 4-octet units
               "port_xmit_packets": ("ib_tx_packets", 1), "port_rcv_packets": ("ib_rx_packets", 1)}
GPU_QUERY = "index,utilization.gpu,memory.used,power.draw,clocks.sm"
# What each runtime leaves inside its containers, by its own documentation.
CONTAINER_MARKERS = {
    "/.dockerenv": "docker",
    "/run/.containerenv": "podman",  # podman-run(1): "a file ... /run/.containerenv"
    "/.singularity.d": "apptainer",
    "/ch/environment": "charliecloud",  # written by ch-convert / ch-image
}
CONTAINER_VARIABLES = ("CH_RUNNING", "APPTAINER_CONTAINER", "SINGULARITY_CONTAINER", "SHIFTER_RUNTIME",
                       "ENROOT_ROOTFS", "SARUS_VERSION", "PODMAN_HPC")


def _namespace(kind: str, pid: str = "self") -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:  # another user's process, or no such namespace
        return None


UNLIMITED_V1 = 2**62  # cgroup v1 reports "no limit" as a page-rounded LONG_MAX


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cgroup_limits(proc_cgroup: str | None = None, root: str = "/sys/fs/cgroup") -> dict:
    """The memory (bytes) and CPU (CPUs' worth of quota) limits that bind this process: the smallest
    of its cgroup's and its ancestors' (Slurm limits the job and the step, and a rank sits below them,
    e.g. .../job_N/step_0/user/task_0), None where nothing limits it or nothing is readable. cgroup v2
    (memory.max, cpu.max) and v1 (memory.limit_in_bytes, cpu.cfs_quota_us). Inside a container the
    path /proc/self/cgroup names may not exist under its own mount: then the mount's root is its cgroup."""
    if proc_cgroup is None:
        proc_cgroup = _read(Path("/proc/self/cgroup")) or ""
    paths = {}  # controller ("" for v2) -> path
    for line in proc_cgroup.splitlines():
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path.strip().lstrip("/")

    def chain(mount: str, path: str) -> list[Path]:
        """The cgroup's directory and its ancestors up to the mount's root, deepest first."""
        top = Path(root, mount)
        here = top / path if (top / path).is_dir() else top
        return [here, *[parent for parent in here.parents if parent.is_relative_to(top)]]

    def smallest(values) -> float | None:
        values = [v for v in values if v is not None]
        return min(values) if values else None

    def v1_memory(directory: Path) -> int | None:
        value = _read(directory / "memory.limit_in_bytes")
        return int(value) if value and int(value) < UNLIMITED_V1 else None

    def v1_cpu(directory: Path) -> float | None:
        quota, period = _read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us")
        return round(int(quota) / int(period), 3) if quota and period and int(quota) > 0 else None

    def v2_memory(directory: Path) -> int | None:
        value = _read(directory / "memory.max")
        return int(value) if value and value != "max" else None

    def v2_cpu(directory: Path) -> float | None:
        quota, _, period = (_read(directory / "cpu.max") or "max").partition(" ")
        return None if quota == "max" else round(int(quota) / int(period or 100000), 3)

    limits = {"memory_max": None, "cpu_max": None}
    if "memory" in paths:
        limits["memory_max"] = smallest(map(v1_memory, chain("memory", paths["memory"])))
    elif "" in paths:
        limits["memory_max"] = smallest(map(v2_memory, chain("", paths[""])))
    if "cpu" in paths:
        limits["cpu_max"] = smallest(map(v1_cpu, chain("cpu", paths["cpu"])))
    elif "" in paths:
        limits["cpu_max"] = smallest(map(v2_cpu, chain("", paths[""])))
    return limits


# Names, colon-separated, of the host MPI's libraries this rank reports (containerbench.hostmpi.NAMES_VARIABLE, set
# at launch from every node's closure): the rank side imports nothing of the workflow's.
HOST_MPI_NAMES = "CONTAINERBENCH_HOST_MPI_LIBS"


def loaded_mpi(maps: str | None = None, names: str | None = None) -> dict | None:
    """The MPI library this process has loaded: the mapped files named libmpi*/libmpich* (path and inode,
    from /proc/self/maps) and, once mpi4py is imported, MPI_Get_library_version's first line,
    which tells two builds apart even under the same file name (a native run binds the host's
    library over the image's). In a native run (HOST_MPI_NAMES set), also each file's device, and where
    each library of the host MPI's closure was mapped from: a bound host file keeps its device and inode
    in the container."""
    if maps is None:
        maps = _read(Path("/proc/self/maps")) or ""
    wanted = set(filter(None, (os.environ.get(HOST_MPI_NAMES, "") if names is None else names).split(":")))
    files, closure = {}, {}
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) != 6:
            continue
        path, name = fields[5].strip(), os.path.basename(fields[5].strip())
        if name.startswith(("libmpi.so", "libmpich.so")):
            files[path] = {"inode": int(fields[4]), **({"device": fields[3]} if wanted else {})}
        # By its name, or as the versioned file a link of that name leads to (libucp.so.0 -> libucp.so.0.0.0):
        # maps names the file itself, and an image's copy is often such a link where the host's is a plain file.
        for each in wanted:
            if name == each or name.startswith(each + "."):
                closure.setdefault(each, {"path": path, "device": fields[3], "inode": int(fields[4])})
    module = sys.modules.get("mpi4py.MPI")
    version = module.Get_library_version().replace("\0", "").splitlines()[0].strip() if module else None
    if not files and version is None:
        return None
    found = {"files": [{"path": path, **where} for path, where in sorted(files.items())], "version": version}
    return {**found, "closure": dict(sorted(closure.items()))} if wanted else found


def library_mpi_version(library: str) -> str | None:
    """MPI_Get_library_version's first line from the library file itself, without initialising MPI
    (the MPI standard allows the call before MPI_Init): what the host's MPI says it is."""
    import ctypes

    try:
        lib = ctypes.CDLL(library, mode=ctypes.RTLD_LOCAL)
        text, length = ctypes.create_string_buffer(8192), ctypes.c_int(0)  # MPI_MAX_LIBRARY_VERSION_STRING
        if lib.MPI_Get_library_version(text, ctypes.byref(length)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return text.value.decode(errors="replace").replace("\0", "").splitlines()[0].strip()


def rank_context() -> dict:
    """Where this process runs: CPU affinity, cgroup, mount namespace, and the markers container
    runtimes leave. The parser compares a rank's with the launching host's (records.judge_container):
    inside a container the mount namespace differs, or the runtime left a marker the host lacks."""
    try:
        cgroup = Path("/proc/self/cgroup").read_text().strip().splitlines()
    except OSError:
        cgroup = []
    markers = [name for path, name in CONTAINER_MARKERS.items() if os.path.exists(path)]
    markers += [f"${name}" for name in CONTAINER_VARIABLES if name in os.environ]
    mount, init_mount = _namespace("mnt"), _namespace("mnt", "1")  # init's: unreadable without privileges
    return {"affinity": sorted(os.sched_getaffinity(0)), "cgroup": cgroup[-1] if cgroup else None,
            "limits": cgroup_limits("\n".join(cgroup)), "mpi": loaded_mpi(), "mnt_ns": mount, "init_mnt_ns": init_mount,
            "pid_ns": _namespace("pid"), "markers": markers}


def cpu_seconds() -> float:
    """This process's CPU time, every thread."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def pids_file(directory: str) -> Path:
    """Where the ranks on this kernel register (boot_id is the kernel's, in every namespace)."""
    try:
        kernel = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        kernel = socket.gethostname()
    return Path(directory) / f"kernel-{kernel}.pids"


def register_rank(directory: str) -> None:
    """Tell this kernel's samplers which process is a rank of the run (one short O_APPEND write)."""
    line = f"{os.getpid()} {_namespace('pid') or '-'}\n".encode()
    Path(directory).mkdir(parents=True, exist_ok=True)
    fd = os.open(pids_file(directory), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def cpu_list(text: str) -> list[int]:
    """The CPUs of a kernel decimal list, "like 0-3, 8-11, 14,17" (the ABI file below)."""
    cpus = []
    for part in filter(None, (part.strip() for part in text.split(","))):
        first, _, last = part.partition("-")
        cpus += range(int(first), int(last or first) + 1)
    return cpus


def smt_cores(root: str = "/sys/devices/system/cpu") -> dict[str, int]:
    """Each CPU's hardware core, named by the lowest CPU that shares it: CPUs with one number share a core's
    execution units. Linux's Documentation/ABI/stable/sysfs-devices-system-cpu: topology/core_cpus_list is the
    "human-readable list of CPUs within the same core" (deprecated name: "thread_siblings_list", the one
    older kernels have). Empty where sysfs does not say."""
    cores = {}
    for directory in glob.glob(f"{root}/cpu[0-9]*/topology"):
        for name in ("core_cpus_list", "thread_siblings_list"):
            try:
                siblings = cpu_list(Path(directory, name).read_text())
            except (OSError, ValueError):
                continue
            if siblings:
                cores[Path(directory).parent.name] = min(siblings)
                break
    return cores


def thread_cpu_seconds(thread_path: str, stat_fields: list[str]) -> float:
    """A thread's CPU time, to the nanosecond where the kernel keeps schedstat (proc(5) /proc/pid/schedstat:
    "time spent on the cpu", in ns), else from utime and stime. Those are in clock ticks (10 ms): the few
    milliseconds a daemon spends relaying a run's output would often read as 0."""
    try:
        return int(Path(thread_path, "schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return (int(stat_fields[11]) + int(stat_fields[12])) / CLOCK_TICKS  # utime, stime (proc(5))


def start_sampler(directory: str, interval: float, services: str = "") -> subprocess.Popen:
    """The node's sampler, a child of this rank that ends with it. `services`: comma-separated names
    of the runtime's and launcher's processes, whose CPU it counts apart (service_cpu_s)."""
    host = socket.gethostname()
    Path(directory).mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "containerbench.rank.telemetry", "--out",
                             str(Path(directory) / f"{host}.csv"), "--pids", str(pids_file(directory)),
                             "--interval", str(interval), "--parent", str(os.getpid()), "--services", services],
                            stdin=subprocess.DEVNULL)


def stop_sampler(sampler: subprocess.Popen | None) -> None:
    if sampler is None:
        return
    sampler.send_signal(signal.SIGTERM)  # it writes one last sample, so the window's end is covered
    try:
        sampler.wait(timeout=10)
    except subprocess.TimeoutExpired:
        sampler.kill()


class Sampler:
    def __init__(self, pids_file: str, services: frozenset[str] = frozenset()):
        self.pids_file = Path(pids_file)
        self.services = services
        self.service_seen: dict[tuple[str, str], float] = {}  # (thread id, start) -> CPU s at the last sample
        self.service_sampled = False
        self.service_by_core: dict[str, float] = {}
        self.service_by_name: dict[str, float] = dict.fromkeys(services, 0.0)
        self.own_pid_ns = _namespace("pid")
        self.gpus = GpuReader()
        self.topology = [("smt_core", cpu, core) for cpu, core in sorted(smt_cores().items())]  # the first sample only

    def run_processes(self) -> list[str]:
        try:
            lines = self.pids_file.read_text().split("\n")
        except OSError:
            return []
        pids = []
        for line in lines:
            pid, _, namespace = line.partition(" ")
            if pid and namespace in ("-", self.own_pid_ns):
                pids.append(pid)
        return pids

    def service_cpu(self, cores: list[str]) -> list[tuple[str, str, float]]:
        """CPU seconds of the node's processes named in `services`, accumulated since the first sample, by
        the core each of their threads last ran on (they are not bound, and a daemon's threads spread: it
        matters which of the run's cores they took) and by name. Each sample adds a thread's CPU time since
        the last one; a thread is known by its id and start time, so one that ends loses nothing already
        counted and a reused id starts afresh. Every core starts at 0, so a core first used mid-window is
        counted whole. Visible where the sampler shares the host's PID namespace (bare metal, and
        containers run with --pid host or without a PID namespace of their own)."""
        if not self.services:
            return []
        first, self.service_sampled = not self.service_sampled, True
        if first:
            self.service_by_core = dict.fromkeys(cores, 0.0)
        seen = {}
        for process in os.scandir("/proc"):
            if not process.name.isdigit():
                continue
            try:
                name = Path(process.path, "comm").read_text().rstrip("\n")
                threads = list(os.scandir(Path(process.path, "task"))) if name in self.services else []
            except OSError:  # ended meanwhile
                continue
            for thread in threads:
                try:
                    fields = Path(thread.path, "stat").read_text().rpartition(")")[2].split()
                    seconds = thread_cpu_seconds(thread.path, fields)
                except OSError:
                    continue
                key = (thread.name, fields[19])  # thread id, start time (proc(5))
                # A thread already running at the first sample counts from there; a later one, whole.
                added = max(0.0, seconds - self.service_seen.get(key, seconds if first else 0.0))
                seen[key] = seconds
                core = f"cpu{fields[36]}"  # "processor": the CPU it last ran on
                self.service_by_core[core] = self.service_by_core.get(core, 0.0) + added
                self.service_by_name[name] = self.service_by_name.get(name, 0.0) + added
        self.service_seen = seen
        return ([("service_cpu_s", core, value) for core, value in sorted(self.service_by_core.items())]
                + [("service_cpu_by_name_s", name, value) for name, value in sorted(self.service_by_name.items())])

    def sample(self) -> list[tuple[str, str, float]]:
        rows = []
        with open("/proc/stat") as stat:
            for line in stat:
                if line.startswith("cpu") and line[3].isdigit():
                    name, *values = line.split()
                    ticks = [int(v) for v in values]
                    rows += [("cpu_busy_s", name, sum(ticks[i] for i in BUSY_FIELDS) / CLOCK_TICKS),
                             ("cpu_idle_s", name, sum(ticks[i] for i in IDLE_FIELDS) / CLOCK_TICKS),
                             ("cpu_steal_s", name, ticks[STEAL_FIELD] / CLOCK_TICKS)]
        run_cpu = run_rss = 0.0
        pids = self.run_processes()
        for pid in pids:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
                run_cpu += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime
                run_rss += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_SIZE
            except (OSError, IndexError, ValueError):  # the rank has ended
                continue
        own = os.times()
        rows, self.topology = rows + self.topology, []
        rows += self.service_cpu([device for metric, device, _ in rows if metric == "cpu_busy_s"])
        rows += [("run_cpu_s", "node", run_cpu), ("run_rss_bytes", "node", run_rss),
                 ("run_processes", "node", len(pids)), ("sampler_cpu_s", "node", own.user + own.system),
                 ("load1", "node", float(Path("/proc/loadavg").read_text().split()[0]))]
        memory = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        kib = {key: int(memory[key].split()[0]) for key in ("MemTotal", "MemAvailable") if key in memory}
        if len(kib) == 2:
            rows.append(("mem_used_bytes", "node", (kib["MemTotal"] - kib["MemAvailable"]) * 1024))
        with open("/proc/net/dev") as net:
            for line in list(net)[2:]:
                interface, _, counters = line.partition(":")
                values = counters.split()
                rows += [("net_rx_bytes", interface.strip(), int(values[0])),
                         ("net_rx_packets", interface.strip(), int(values[1])),
                         ("net_tx_bytes", interface.strip(), int(values[8])),
                         ("net_tx_packets", interface.strip(), int(values[9]))]
        for path in glob.glob("/sys/class/infiniband/*/ports/*/counters/port_*"):
            if Path(path).name in IB_COUNTERS:
                metric, unit = IB_COUNTERS[Path(path).name]
                device = "{}/{}".format(*Path(path).parts[4:7:2])  # mlx5_0/1
                try:
                    rows.append((metric, device, int(Path(path).read_text()) * unit))
                except (OSError, ValueError):
                    continue
        return rows + self.gpus.sample()


class GpuReader:
    """Per-GPU utilisation, memory, power and SM clock: NVML (nvidia-ml-py), else `nvidia-smi -lms`."""

    def __init__(self):
        self.nvml, self.latest, self.loop = None, {}, None
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception:  # no nvidia-ml-py, or no driver: try the command-line tool
            self.nvml = None
            if shutil.which("nvidia-smi"):
                self.loop = subprocess.Popen(["nvidia-smi", f"--query-gpu={GPU_QUERY}", "--format=csv,noheader,nounits",
                                              "-lms", "500"],
                                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                threading.Thread(target=self._follow, daemon=True).start()

    def _follow(self):
        for line in self.loop.stdout:
            fields = [f.strip() for f in line.split(",")]
            if len(fields) == 5:
                self.latest[fields[0]] = fields[1:]

    def sample(self) -> list[tuple[str, str, float]]:
        rows = []
        if self.nvml:
            nvml = self.nvml
            for index, handle in enumerate(self.handles):
                rows += [("gpu_util_percent", f"gpu{index}", nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
                         ("gpu_mem_used_bytes", f"gpu{index}", nvml.nvmlDeviceGetMemoryInfo(handle).used),
                         ("gpu_power_w", f"gpu{index}", nvml.nvmlDeviceGetPowerUsage(handle) / 1000),
                         ("gpu_sm_clock_mhz", f"gpu{index}", nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))]
        for index, (util, memory, power, clock) in sorted(self.latest.items()):
            for metric, value, scale in (("gpu_util_percent", util, 1), ("gpu_mem_used_bytes", memory, 2**20),
                                         ("gpu_power_w", power, 1), ("gpu_sm_clock_mhz", clock, 1)):
                try:
                    rows.append((metric, f"gpu{index}", float(value) * scale))
                except ValueError:  # "[N/A]"
                    continue
        return rows

    def close(self):
        if self.loop:
            self.loop.terminate()


def sample_until_stopped(out: str, pids: str, interval: float, parent: int, services: frozenset[str]) -> None:
    # Off the rank's own core (its binding is inherited): the sampler is the node's, and wherever
    # it runs its CPU time is counted apart. The kernel keeps the mask inside the job's cpuset.
    try:
        os.sched_setaffinity(0, range(os.cpu_count() or 1))
    except OSError:
        pass
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    sampler = Sampler(pids, services)
    with open(out, "a", newline="") as handle:
        writer = csv.writer(handle)
        if handle.tell() == 0:
            writer.writerow(["time_unix", "metric", "device", "value"])
        while True:
            now = time.time()
            writer.writerows((f"{now:.3f}", metric, device, value) for metric, device, value in sampler.sample())
            handle.flush()
            # The rank that started us is gone (killed): stop, leave nothing running.
            if stopping.wait(interval) or os.getppid() != parent:
                break
        now = time.time()  # one last sample: the end of the measured window is inside the series
        writer.writerows((f"{now:.3f}", metric, device, value) for metric, device, value in sampler.sample())
    sampler.gpus.close()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m containerbench.rank.telemetry",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--pids", required=True)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--parent", type=int, default=os.getppid())
    parser.add_argument("--services", default="", help="comma-separated process names counted apart")
    args = parser.parse_args(argv)
    if args.interval <= 0:
        parser.error(f"--interval must be positive, got {args.interval}")
    sample_until_stopped(args.out, args.pids, args.interval, args.parent,
                         frozenset(filter(None, args.services.split(","))))


if __name__ == "__main__":
    main()
