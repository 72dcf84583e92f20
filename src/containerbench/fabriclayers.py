"""The layers that pick a network for a run: NCCL, UCX, Open MPI and Horovod's Gloo.

One class per layer, behind `Layer`: the variables that make it log its choice,
what a fabric's variables ask of it, and what its log lines say it used, per
process. `fabrics` puts them together to verify a run's fabric. Pure Python.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

SHM_NAMES = {"self", "vader", "sm", "smcuda", "sysv", "posix", "cma", "knem", "xpmem", "mm", "shm"}
# Open MPI 4.1.4, measured: btl_base_verbose=1 prints "mca: bml: Using tcp btl for send
# to [[job,1],peer] on node N" once per peer; 20 is the lowest level that also prints
# "btl: tcp: Using interface: eth0", at about 25 lines per rank. So 20 only when the
# fabric routes MPI over the TCP BTL, where the interface is worth checking.
OMPI_BTL_VERBOSE, OMPI_BTL_VERBOSE_TCP = "1", "20"
# Rank 0 then lists the MCA settings it got from the environment and from files (about 15
# lines): "Using interface: X" also echoes a named btl_tcp_if_exclude list, and only these
# lines tell the two apart; they also show site files such as Debian's "pml=^ucx".
OMPI_SHOW_PARAMS = "enviro,file"


@dataclass
class LayerExpectation:
    transport: str | None                          # None: the layer may choose
    interfaces: dict[str, tuple[str, ...]] = field(default_factory=dict)  # transport ("*": any) -> patterns
    source: str = ""                               # the settings that said so


@dataclass
class Observation:
    layer: str
    transport: str
    interfaces: tuple[str, ...] = ()
    addresses: tuple[str, ...] = ()
    detail: str = ""                               # GDRDMA, RoCE, fell back, CPU operations...
    evidence: tuple[str, ...] = ()                 # the log lines that decided
    count: int = 1                                 # processes that logged the same


def canonical_transport(transport) -> str | None:
    name = str(transport).strip().lower() if transport not in (None, "") else None
    return {"socket": "tcp", "roce": "ib", "infiniband": "ib", "ibext": "ib"}.get(name, name)


def interface_patterns(value: str, exact: bool) -> tuple[str, ...]:
    """A comma list as NCCL reads one: a leading "^" (exclude) and "=" (exact names, not
    prefixes) apply to the whole list; CIDR items (Open MPI's subnet form) stay as they are."""
    value = str(value).strip()
    exclude = value.startswith("^")
    value = value.lstrip("^")
    exact = exact or value.startswith("=")  # Open MPI, UCX and Gloo take exact names
    marks = ("^" if exclude else "") + ("=" if exact else "")
    items = [item.strip() for item in value.lstrip("=").split(",") if item.strip()]
    return tuple(item if "/" in item else marks + item for item in items)


def _source(env: dict, *names: str) -> str:
    return " ".join(f"{name}={env[name]}" for name in names if name in env)


class Layer:
    """One layer that picks a network: the variables that make it log its choice, what a fabric's
    variables ask of it, and what its log lines say it used. Its lines are read per process (`match`,
    `read`), and each process's state becomes one observation (`observation`)."""

    name = ""
    served_by: tuple[str, ...] = ()  # the layers whose lines say what carried its traffic
    debug: dict[str, str] = {}  # the smallest logging that names its choice
    per_process = True  # False: each of its lines is an observation of its own (`line_observation`)

    def debug_env(self, env: dict[str, str]) -> dict[str, str]:
        return dict(self.debug)

    def expectation(self, env: dict[str, str]) -> LayerExpectation | None:
        """What the fabric's variables ask of this layer; None: nothing."""
        raise NotImplementedError

    def match(self, line: str) -> re.Match | None:
        """One of this layer's log lines, with the process that wrote it ("proc"); None: not its."""
        raise NotImplementedError

    def logged_settings(self, lines: list[str]) -> dict:
        """What the whole log says of this layer's settings, for every process's state."""
        return {}

    def new_state(self, settings: dict) -> dict:
        raise NotImplementedError

    def read(self, state: dict, match: re.Match, line: str) -> None:
        raise NotImplementedError

    def observation(self, state: dict) -> Observation | None:
        """What a process's lines decide; None: nothing decisive."""
        raise NotImplementedError

    def line_observation(self, match: re.Match, line: str) -> Observation | None:
        raise NotImplementedError

    @staticmethod
    def asked(transport: str | None, interfaces: dict, env: dict[str, str],
              *names: str) -> LayerExpectation | None:
        """The expectation where the variables `names` ask for a transport or an interface, else None."""
        return LayerExpectation(transport, interfaces, _source(env, *names)) if transport or interfaces else None


class Nccl(Layer):
    """NCCL: its choice of network, the devices it listed, and the channels' data path."""

    name, served_by = "nccl", ("nccl",)
    LINE = re.compile(r"(?P<proc>[^\s:]+:\d+):\d+ \[\d+\] (?:NCCL )?INFO (?P<msg>.*)")
    NETWORK = re.compile(r"^Using (?:internal )?[Nn]etwork (?P<net>.+?)\s*$")
    DEVICES = re.compile(r"^NET/(?P<net>\w+) : Using (?P<list>\[\d+\].*)")
    IB_DEVICE = re.compile(r"\[(?P<idx>\d+)\](?P<name>[^\s:\[]+:\d+)/(?P<kind>\w+)")
    SOCKET_DEVICE = re.compile(r"\[(?P<idx>\d+)\](?P<name>[^\s:\[]+):(?P<addr>[^\s<]+)<\d+>")
    CHANNEL = re.compile(r"via NET/(?P<net>[A-Za-z][\w ]*?)/(?P<dev>\d+)(?:\(\d+\))?(?P<gdr>/GDRDMA)?")
    FALLBACK = re.compile(r"NET/IB : No device found|Failed to open libibverbs")
    debug = {
        # INIT prints "Using network IB|Socket"; INIT|NET the device list ("NET/IB : Using
        # [0]mlx5_0:1/IB ; OOB ib0:..") and "Channel .. via NET/<net>/<dev>[/GDRDMA]" per channel
        # and peer; ENV echoes the NCCL_* it got. The default set is INIT,BOOTSTRAP,ENV.
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,NET,ENV",
    }

    def expectation(self, env):
        net, ib_disable = env.get("NCCL_NET", "").strip(), env.get("NCCL_IB_DISABLE", "").strip()
        transport = (canonical_transport(net) if net else "tcp" if ib_disable == "1" else "ib" if ib_disable == "0"
                     else None)
        interfaces = {t: interface_patterns(env[var], exact=False)
                      for t, var in (("ib", "NCCL_IB_HCA"), ("tcp", "NCCL_SOCKET_IFNAME")) if var in env}
        return self.asked(transport, interfaces, env, "NCCL_NET", "NCCL_IB_DISABLE", "NCCL_IB_HCA",
                          "NCCL_SOCKET_IFNAME")

    @staticmethod
    def transport_of(net: str) -> str:
        return "ib" if net.lower().startswith("ib") else "tcp" if net.lower() == "socket" else net.lower()

    def match(self, line):
        return self.LINE.search(line) if "INFO" in line else None

    def new_state(self, settings):
        return {"markers": [], "devices": {}}

    def read(self, state, match, line):
        msg = match["msg"]
        if (c := self.CHANNEL.search(msg)):
            state.setdefault("channel", (c["net"], line))
            state.setdefault("used", set()).add(int(c["dev"]))
            state["gdr"] = state.get("gdr", False) or bool(c["gdr"])
        elif (n := self.NETWORK.match(msg)):
            state["network"] = (n["net"], line)
        elif (d := self.DEVICES.match(msg)):
            pattern = self.IB_DEVICE if d["net"].lower().startswith("ib") else self.SOCKET_DEVICE
            listed = [x.groupdict() for x in pattern.finditer(d["list"])]
            state["devices"][self.transport_of(d["net"])] = (listed, line)
        elif self.FALLBACK.search(msg):
            state["markers"].append(line)

    def observation(self, state):
        # The channel lines are the data path itself; "Using network" is the choice; a device list
        # alone is weak (NCCL 2.4 printed "NET/Socket : Using" for its bootstrap even over IB).
        decided = state.get("channel") or state.get("network")
        if decided is None and state["devices"]:
            transport = "ib" if "ib" in state["devices"] else next(iter(state["devices"]))
            decided = (transport, state["devices"][transport][1])
        if decided is None:
            return None
        transport = self.transport_of(decided[0])
        devices, device_line = state["devices"].get(transport, ([], None))
        used = state.get("used")
        devices = [d for d in devices if not used or int(d["idx"]) in used] or devices
        detail = [k for k in ("RoCE",) if any(d.get("kind") == k for d in devices)]
        detail += ["GDRDMA"] * bool(state.get("gdr"))
        detail += ["fell back: " + ("no IB device" if "No device" in m else "no libibverbs")
                   for m in state["markers"][:1]]
        evidence = tuple(dict.fromkeys([*state["markers"][:1], decided[1], *([device_line] if device_line else [])]))
        return Observation(self.name, transport, tuple(d["name"] for d in devices),
                           tuple(d["addr"] for d in devices if d.get("addr")), ", ".join(detail), evidence)


class Ucx(Layer):
    """UCX: the transport/device pairs of each endpoint configuration."""

    name, served_by = "ucx", ("ucx",)
    LINE = re.compile(r"\[(?P<proc>[^\s:\]]+:\d+)\s*:\d+\].*UCX\s+INFO\s.*?\btag\((?P<tls>[^)]*)\)")
    # A handful of lines per process, among them "ep_cfg[N]: tag(rc_mlx5/mlx5_0:1 ...)".
    debug = {"UCX_LOG_LEVEL": "info"}

    def transport(self, env: dict[str, str]) -> str | None:
        """What UCX_TLS asks for: None where UCX may choose."""
        names = [t.strip().lower() for t in env.get("UCX_TLS", "").split(",") if t.strip()]
        if not names or names[0].startswith("^") or "all" in names:
            return None
        if any(n.startswith(("rc", "dc", "ud", "ib")) for n in names):
            return "ib"
        return "tcp" if "tcp" in names else "shm" if all(n in SHM_NAMES for n in names) else None

    @staticmethod
    def kind_of(tl: str) -> str:
        """A UCX transport's kind: "ib", "tcp", "shm", "gpu" (copies between GPUs), else its name."""
        return ("ib" if tl.startswith(("rc", "dc", "ud")) else "tcp" if tl == "tcp"
                else "shm" if tl in SHM_NAMES else "gpu" if tl.startswith(("cuda", "rocm", "gdr")) else tl)

    def expectation(self, env):
        transport, devices = self.transport(env), env.get("UCX_NET_DEVICES", "all")
        interfaces = {transport or "*": interface_patterns(devices, exact=True)} if devices.lower() != "all" else {}
        return self.asked(transport, interfaces, env, "UCX_TLS", "UCX_NET_DEVICES")

    def match(self, line):
        return self.LINE.search(line) if "UCX" in line else None

    def new_state(self, settings):
        return {"tls": {}}

    def read(self, state, match, line):
        for token in match["tls"].split():
            tl, _, device = token.partition("/")
            state["tls"].setdefault(self.kind_of(tl), {}).setdefault(device, line)

    def observation(self, state):
        tls = state["tls"]
        transport = next((t for t in ("ib", "tcp", "shm") if t in tls), None)
        if transport is None:
            return None
        devices = tls[transport]
        return Observation(self.name, transport, tuple(d for d in devices if transport != "shm"), (), "UCX",
                           tuple(dict.fromkeys(devices.values())))


class OpenMpi(Layer):
    """Open MPI: the BTL each peer was reached by, and the TCP BTL's interfaces. With `pml ucx` its
    traffic shows up in UCX's lines, not in the BTL lines."""

    name, served_by = "mpi", ("mpi", "ucx")
    LINE = re.compile(r"\[(?P<proc>[^\s:\]]+:\d+)\] (?P<msg>(?:mca: bml|btl: ?tcp|select: init of component tcp).*)")
    PARAMETER = re.compile(r"\[[^\s:\]]+:\d+\] (?P<name>btl_tcp_if_(?:include|exclude))=(?P<value>\S*) \(")
    BML = re.compile(r"mca: bml: Using (?P<btl>\w+) btl for send to \[\[\d+,\d+\],\d+\] on node")
    INTERFACE = re.compile(r"btl: tcp: (?:Using interface: (?P<name>\S+)"
                           r"|Found match: (?P<addr>\S+) \((?P<mname>[^)]+)\))")

    def debug_env(self, env):
        btl = env.get("OMPI_MCA_btl", "").lower()
        tcp_btl = env.get("OMPI_MCA_pml", "").lower() != "ucx" and (
            "OMPI_MCA_btl_tcp_if_include" in env or ("tcp" in btl.split(",") and not btl.startswith("^")))
        return {"OMPI_MCA_btl_base_verbose": OMPI_BTL_VERBOSE_TCP if tcp_btl else OMPI_BTL_VERBOSE,
                "OMPI_MCA_mpi_show_mca_params": OMPI_SHOW_PARAMS}

    def expectation(self, env):
        if env.get("OMPI_MCA_pml", "").lower() == "ucx":  # then any BTL traffic must agree with UCX's
            return LayerExpectation(UCX.transport(env), {}, "OMPI_MCA_pml=ucx")
        btl = [b.strip().lower() for b in env.get("OMPI_MCA_btl", "").split(",") if b.strip()]
        transport = (None if not btl or btl[0].startswith("^") else "ib" if {"openib", "uct"} & set(btl)
                     else "tcp" if "tcp" in btl else "shm" if set(btl) <= SHM_NAMES else None)
        include = env.get("OMPI_MCA_btl_tcp_if_include")
        interfaces = {"tcp": interface_patterns(include, exact=True)} if include else {}
        return self.asked(transport, interfaces, env, "OMPI_MCA_pml", "OMPI_MCA_btl", "OMPI_MCA_btl_tcp_if_include")

    def match(self, line):
        return self.LINE.search(line) if "bml" in line or "tcp" in line else None

    def logged_settings(self, lines):
        params = {m["name"]: m["value"] for line in lines
                  if "btl_tcp_if_" in line and (m := self.PARAMETER.search(line))}
        return {"named_exclude": bool(params.get("btl_tcp_if_exclude")) and not params.get("btl_tcp_if_include")}

    def new_state(self, settings):
        return {"btls": {}, "names": [], "exclude": settings["named_exclude"], "failed": False}

    def read(self, state, match, line):
        msg = match["msg"]
        if (b := self.BML.search(msg)):
            state["btls"].setdefault(b["btl"], line)
        elif (i := self.INTERFACE.search(msg)):
            state["names"].append((i["name"] or i["mname"], i["addr"], line))
        state["exclude"] |= "Searching for exclude" in msg  # then the names are excluded ones
        state["failed"] |= "component tcp returned failure" in msg

    def observation(self, state):
        btls = {name: line for name, line in state["btls"].items() if name != "self"}
        if not btls:
            return None
        network = [b for b in btls if b not in SHM_NAMES]
        btl = network[0] if network else next(iter(btls))
        transport = {"tcp": "tcp", "openib": "ib", "uct": "ib"}.get(btl, "shm" if btl in SHM_NAMES else btl)
        names = [] if state["exclude"] or state["failed"] or btl != "tcp" else state["names"]
        return Observation(self.name, transport, tuple(dict.fromkeys(n for n, _, _ in names)),
                           tuple(a for _, a, _ in names if a), f"Open MPI BTL {btl}",
                           tuple(dict.fromkeys([btls[btl], *(line for _, _, line in names)])))


class Gloo(Layer):
    """Horovod's Gloo: only speaks TCP, and never logs its interface; Horovod says when it is used."""

    name, served_by = "gloo", ("gloo",)
    LINE = re.compile(r"Using (?P<lib>\w+) to perform CPU operations")
    # About ten lines per rank (measured, Horovod 0.28.1), among them "Using MPI|Gloo to
    # perform CPU operations.".
    debug = {"HOROVOD_LOG_LEVEL": "debug"}
    per_process = False  # Horovod's line names no process

    def expectation(self, env):
        if "HOROVOD_GLOO_IFACE" not in env:
            return None
        interfaces = {"tcp": interface_patterns(env["HOROVOD_GLOO_IFACE"], exact=True)}
        return self.asked("tcp", interfaces, env, "HOROVOD_GLOO_IFACE")  # Horovod's Gloo only speaks TCP

    def match(self, line):
        return self.LINE.search(line) if "to perform CPU operations" in line else None

    def line_observation(self, match, line):
        if match["lib"].lower() != "gloo":  # MPI's own lines speak for the MPI case
            return None
        return Observation(self.name, "tcp", detail="Horovod CPU operations over Gloo, which does not log its "
                                                 "interface", evidence=(line,))


NCCL, UCX, MPI, GLOO = Nccl(), Ucx(), OpenMpi(), Gloo()
# The order a line is offered to them in (a line is the first's that matches it), and a check's
# observations are listed in.
READERS = (NCCL, MPI, UCX, GLOO)
LAYERS = tuple(layer.name for layer in READERS)
BY_NAME = {layer.name: layer for layer in READERS}
