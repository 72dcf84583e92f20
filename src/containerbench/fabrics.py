"""Which interconnect a run really used, read from its raw log.

A fabric in the config is a set of environment variables for every layer that
picks a network: NCCL, UCX, Open MPI and Horovod's Gloo. Asking is not getting:
an image without libibverbs or a wrong interface name makes NCCL and Open MPI
fall back to TCP sockets without an error, and the run only gets slower. So:

- `debug_environment` adds the few variables that make each layer log its choice;
- `expected_transport` reads what a fabric asks for (its `expect` block, or its env);
- `observe_transport` reads what each layer logged, per process;
- `verify` compares the two: "ok", "mismatch" (with the evidence lines) or
  "unverified" (the layer that carries the data said nothing decisive).

Transports are named "ib" (verbs RDMA, RoCE included), "tcp" (kernel sockets;
NCCL calls it "Socket") and "shm" (shared memory inside one node). Pure Python.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import asdict, dataclass, field

from containerbench.status import Check

LAYERS = ("nccl", "mpi", "ucx", "gloo")
# The layer a caller asks about may be served by another that logs for it: with
# `pml ucx`, Open MPI's traffic shows up in UCX's lines, not in the BTL lines.
SERVED_BY = {"nccl": ("nccl",), "mpi": ("mpi", "ucx"), "ucx": ("ucx",), "gloo": ("gloo",)}
SHM_NAMES = {"self", "vader", "sm", "smcuda", "sysv", "posix", "cma", "knem", "xpmem", "mm", "shm"}

# The smallest logging that names each layer's choice, and why that much:
DEBUG_ENV = {
    # INIT prints "Using network IB|Socket"; INIT|NET the device list ("NET/IB : Using
    # [0]mlx5_0:1/IB ; OOB ib0:..") and "Channel .. via NET/<net>/<dev>[/GDRDMA]" per channel
    # and peer; ENV echoes the NCCL_* it got. The default set is INIT,BOOTSTRAP,ENV.
    "NCCL_DEBUG": "INFO",
    "NCCL_DEBUG_SUBSYS": "INIT,NET,ENV",
    # A handful of lines per process, among them "ep_cfg[N]: tag(rc_mlx5/mlx5_0:1 ...)":
    # the transport/device pairs of each endpoint configuration.
    "UCX_LOG_LEVEL": "info",
    # About ten lines per rank (measured, Horovod 0.28.1), among them "Using MPI|Gloo to
    # perform CPU operations."; Gloo itself never logs its interface.
    "HOROVOD_LOG_LEVEL": "debug",
}
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
class Expectation:
    transport: str | None
    interface: tuple[str, ...]
    layers: dict[str, LayerExpectation]
    declared: bool                                 # from the fabric's `expect` block


@dataclass
class Observation:
    layer: str
    transport: str
    interfaces: tuple[str, ...] = ()
    addresses: tuple[str, ...] = ()
    detail: str = ""                               # GDRDMA, RoCE, fell back, CPU operations...
    evidence: tuple[str, ...] = ()                 # the log lines that decided
    count: int = 1                                 # processes that logged the same


@dataclass
class TransportCheck:
    status: str                                    # "ok" | "mismatch" | "unverified"
    reason: str
    expected: Expectation
    observed: dict[str, list[Observation]]
    evidence: list[str]

    @property
    def ok(self) -> bool:
        return self.status == Check.OK

    def as_dict(self) -> dict:
        return {"status": self.status, "reason": self.reason, "evidence": self.evidence,
                "expected": asdict(self.expected),
                "observed": {layer: [asdict(o) for o in obs] for layer, obs in self.observed.items()}}


def debug_environment(fabric_env: dict) -> dict:
    """The variables to add to a run with this fabric; never one the fabric sets itself."""
    env = {k: str(v) for k, v in (fabric_env or {}).items()}
    btl = env.get("OMPI_MCA_btl", "").lower()
    tcp_btl = env.get("OMPI_MCA_pml", "").lower() != "ucx" and (
        "OMPI_MCA_btl_tcp_if_include" in env or ("tcp" in btl.split(",") and not btl.startswith("^")))
    wanted = {**DEBUG_ENV, "OMPI_MCA_btl_base_verbose": OMPI_BTL_VERBOSE_TCP if tcp_btl else OMPI_BTL_VERBOSE,
              "OMPI_MCA_mpi_show_mca_params": OMPI_SHOW_PARAMS}
    return {k: v for k, v in wanted.items() if k not in env}


# --- what a fabric asks for ----------------------------------------------------------------------

def _canonical(transport) -> str | None:
    name = str(transport).strip().lower() if transport not in (None, "") else None
    return {"socket": "tcp", "roce": "ib", "infiniband": "ib", "ibext": "ib"}.get(name, name)


def _patterns(value: str, exact: bool) -> tuple[str, ...]:
    """A comma list as NCCL reads one: a leading "^" (exclude) and "=" (exact names, not
    prefixes) apply to the whole list; CIDR items (Open MPI's subnet form) stay as they are."""
    value = str(value).strip()
    exclude = value.startswith("^")
    value = value.lstrip("^")
    exact = exact or value.startswith("=")  # Open MPI, UCX and Gloo take exact names
    marks = ("^" if exclude else "") + ("=" if exact else "")
    items = [item.strip() for item in value.lstrip("=").split(",") if item.strip()]
    return tuple(item if "/" in item else marks + item for item in items)


def _ucx_transport(tls: str) -> str | None:
    names = [t.strip().lower() for t in tls.split(",") if t.strip()]
    if not names or names[0].startswith("^") or "all" in names:
        return None
    if any(n.startswith(("rc", "dc", "ud", "ib")) for n in names):
        return "ib"
    return "tcp" if "tcp" in names else "shm" if all(n in SHM_NAMES for n in names) else None


def expected_transport(fabric: dict) -> Expectation:
    """From `expect: {transport: ib|tcp|socket|shm, interface: NAME | [NAMES] | null}`,
    or, without one, from the variables in the fabric's env."""
    env = {k: str(v) for k, v in (fabric.get("env") or {}).items()}
    declared = fabric.get("expect")
    if declared:
        transport = _canonical(declared.get("transport"))
        names = declared.get("interface") or ()
        names = (names,) if isinstance(names, str) else tuple(names)
        patterns = {transport or "*": _patterns(",".join(names), exact=True)} if names else {}
        return Expectation(transport, names, {layer: LayerExpectation(transport, patterns, "expect")
                                              for layer in LAYERS}, declared=True)
    layers: dict[str, LayerExpectation] = {}
    net, ib_disable = env.get("NCCL_NET", "").strip(), env.get("NCCL_IB_DISABLE", "").strip()
    nccl = (_canonical(net) if net else "tcp" if ib_disable == "1" else "ib" if ib_disable == "0" else None)
    nccl_if = {t: _patterns(env[var], exact=False) for t, var in (("ib", "NCCL_IB_HCA"), ("tcp", "NCCL_SOCKET_IFNAME"))
               if var in env}
    if nccl or nccl_if:
        layers["nccl"] = LayerExpectation(nccl, nccl_if, _source(env, "NCCL_NET", "NCCL_IB_DISABLE", "NCCL_IB_HCA",
                                                                   "NCCL_SOCKET_IFNAME"))
    ucx = _ucx_transport(env.get("UCX_TLS", ""))
    devices = env.get("UCX_NET_DEVICES", "all")
    ucx_if = {ucx or "*": _patterns(devices, exact=True)} if devices.lower() != "all" else {}
    if ucx or ucx_if:
        layers["ucx"] = LayerExpectation(ucx, ucx_if, _source(env, "UCX_TLS", "UCX_NET_DEVICES"))
    if env.get("OMPI_MCA_pml", "").lower() == "ucx":  # then any BTL traffic must agree with UCX's
        layers["mpi"] = LayerExpectation(ucx, {}, "OMPI_MCA_pml=ucx")
    else:
        btl = [b.strip().lower() for b in env.get("OMPI_MCA_btl", "").split(",") if b.strip()]
        mpi = (None if not btl or btl[0].startswith("^") else "ib" if {"openib", "uct"} & set(btl)
               else "tcp" if "tcp" in btl else "shm" if set(btl) <= SHM_NAMES else None)
        include = env.get("OMPI_MCA_btl_tcp_if_include")
        mpi_if = {"tcp": _patterns(include, exact=True)} if include else {}
        if mpi or mpi_if:
            layers["mpi"] = LayerExpectation(mpi, mpi_if, _source(env, "OMPI_MCA_pml", "OMPI_MCA_btl",
                                                                  "OMPI_MCA_btl_tcp_if_include"))
    if "HOROVOD_GLOO_IFACE" in env:  # Horovod's Gloo only speaks TCP
        layers["gloo"] = LayerExpectation("tcp", {"tcp": _patterns(env["HOROVOD_GLOO_IFACE"], exact=True)},
                                          _source(env, "HOROVOD_GLOO_IFACE"))
    transports = {e.transport for e in layers.values() if e.transport and e.transport != "shm"}
    interfaces = tuple(dict.fromkeys(p for e in layers.values() for ps in e.interfaces.values() for p in ps))
    return Expectation(transports.pop() if len(transports) == 1 else None, interfaces, layers, declared=False)


def _source(env: dict, *names: str) -> str:
    return " ".join(f"{name}={env[name]}" for name in names if name in env)


# --- what each layer logged ----------------------------------------------------------------------

NCCL_RE = re.compile(r"(?P<proc>[^\s:]+:\d+):\d+ \[\d+\] (?:NCCL )?INFO (?P<msg>.*)")
NCCL_NETWORK = re.compile(r"^Using (?:internal )?[Nn]etwork (?P<net>.+?)\s*$")
NCCL_DEVICES = re.compile(r"^NET/(?P<net>\w+) : Using (?P<list>\[\d+\].*)")
NCCL_IB_DEV = re.compile(r"\[(?P<idx>\d+)\](?P<name>[^\s:\[]+:\d+)/(?P<kind>\w+)")
NCCL_SOCK_DEV = re.compile(r"\[(?P<idx>\d+)\](?P<name>[^\s:\[]+):(?P<addr>[^\s<]+)<\d+>")
NCCL_CHANNEL = re.compile(r"via NET/(?P<net>[A-Za-z][\w ]*?)/(?P<dev>\d+)(?:\(\d+\))?(?P<gdr>/GDRDMA)?")
NCCL_FALLBACK = re.compile(r"NET/IB : No device found|Failed to open libibverbs")
OMPI_RE = re.compile(r"\[(?P<proc>[^\s:\]]+:\d+)\] (?P<msg>(?:mca: bml|btl: ?tcp|select: init of component tcp).*)")
OMPI_PARAM = re.compile(r"\[[^\s:\]]+:\d+\] (?P<name>btl_tcp_if_(?:include|exclude))=(?P<value>\S*) \(")
OMPI_BML = re.compile(r"mca: bml: Using (?P<btl>\w+) btl for send to \[\[\d+,\d+\],\d+\] on node")
OMPI_IFACE = re.compile(r"btl: tcp: (?:Using interface: (?P<name>\S+)|Found match: (?P<addr>\S+) \((?P<mname>[^)]+)\))")
UCX_RE = re.compile(r"\[(?P<proc>[^\s:\]]+:\d+)\s*:\d+\].*UCX\s+INFO\s.*?\btag\((?P<tls>[^)]*)\)")
HOROVOD_RE = re.compile(r"Using (?P<lib>\w+) to perform CPU operations")


def _nccl_transport(net: str) -> str:
    return "ib" if net.lower().startswith("ib") else "tcp" if net.lower() == "socket" else net.lower()


def _ucx_kind(tl: str) -> str:
    return ("ib" if tl.startswith(("rc", "dc", "ud")) else "tcp" if tl == "tcp"
            else "shm" if tl in SHM_NAMES else "gpu" if tl.startswith(("cuda", "rocm", "gdr")) else tl)


def observe_transport(lines) -> list[Observation]:
    """One observation per layer and distinct outcome, counting the processes that share it."""
    lines = lines.splitlines() if isinstance(lines, str) else list(lines)
    procs: dict[tuple[str, str], dict] = {}
    found: list[Observation] = []
    params = {m["name"]: m["value"] for line in lines if "btl_tcp_if_" in line and (m := OMPI_PARAM.search(line))}
    named_exclude = bool(params.get("btl_tcp_if_exclude")) and not params.get("btl_tcp_if_include")
    for line in lines:
        if "INFO" in line and (m := NCCL_RE.search(line)):
            state = procs.setdefault(("nccl", m["proc"]), {"markers": [], "devices": {}})
            msg = m["msg"]
            if (c := NCCL_CHANNEL.search(msg)):
                state.setdefault("channel", (c["net"], line))
                state.setdefault("used", set()).add(int(c["dev"]))
                state["gdr"] = state.get("gdr", False) or bool(c["gdr"])
            elif (n := NCCL_NETWORK.match(msg)):
                state["network"] = (n["net"], line)
            elif (d := NCCL_DEVICES.match(msg)):
                pattern = NCCL_IB_DEV if d["net"].lower().startswith("ib") else NCCL_SOCK_DEV
                listed = [x.groupdict() for x in pattern.finditer(d["list"])]
                state["devices"][_nccl_transport(d["net"])] = (listed, line)
            elif NCCL_FALLBACK.search(msg):
                state["markers"].append(line)
        elif ("bml" in line or "tcp" in line) and (m := OMPI_RE.search(line)):
            state = procs.setdefault(("mpi", m["proc"]), {"btls": {}, "names": [], "exclude": named_exclude,
                                                          "failed": False})
            msg = m["msg"]
            if (b := OMPI_BML.search(msg)):
                state["btls"].setdefault(b["btl"], line)
            elif (i := OMPI_IFACE.search(msg)):
                state["names"].append((i["name"] or i["mname"], i["addr"], line))
            state["exclude"] |= "Searching for exclude" in msg  # then the names are excluded ones
            state["failed"] |= "component tcp returned failure" in msg
        elif "UCX" in line and (m := UCX_RE.search(line)):
            state = procs.setdefault(("ucx", m["proc"]), {"tls": {}})
            for token in m["tls"].split():
                tl, _, device = token.partition("/")
                state["tls"].setdefault(_ucx_kind(tl), {}).setdefault(device, line)
        elif "to perform CPU operations" in line and (m := HOROVOD_RE.search(line)):
            if m["lib"].lower() == "gloo":  # MPI's own lines speak for the MPI case
                found.append(Observation("gloo", "tcp", detail="Horovod CPU operations over Gloo, which does "
                                                               "not log its interface", evidence=(line,)))
    for (layer, _), state in procs.items():
        observation = {"nccl": _nccl_observation, "mpi": _mpi_observation, "ucx": _ucx_observation}[layer](state)
        if observation:
            found.append(observation)
    merged: dict[tuple, Observation] = {}
    for o in found:
        key = (o.layer, o.transport, o.interfaces, o.detail)
        if key in merged:
            merged[key].count += 1
        else:
            merged[key] = o
    return list(merged.values())


def _nccl_observation(state: dict) -> Observation | None:
    # The channel lines are the data path itself; "Using network" is the choice; a device list
    # alone is weak (NCCL 2.4 printed "NET/Socket : Using" for its bootstrap even over IB).
    decided = state.get("channel") or state.get("network")
    if decided is None and state["devices"]:
        transport = "ib" if "ib" in state["devices"] else next(iter(state["devices"]))
        decided = (transport, state["devices"][transport][1])
    if decided is None:
        return None
    transport = _nccl_transport(decided[0])
    devices, device_line = state["devices"].get(transport, ([], None))
    used = state.get("used")
    devices = [d for d in devices if not used or int(d["idx"]) in used] or devices
    detail = [k for k in ("RoCE",) if any(d.get("kind") == k for d in devices)]
    detail += ["GDRDMA"] * bool(state.get("gdr"))
    detail += ["fell back: " + ("no IB device" if "No device" in m else "no libibverbs") for m in state["markers"][:1]]
    evidence = tuple(dict.fromkeys([*state["markers"][:1], decided[1], *([device_line] if device_line else [])]))
    return Observation("nccl", transport, tuple(d["name"] for d in devices),
                       tuple(d["addr"] for d in devices if d.get("addr")), ", ".join(detail), evidence)


def _mpi_observation(state: dict) -> Observation | None:
    btls = {name: line for name, line in state["btls"].items() if name != "self"}
    if not btls:
        return None
    network = [b for b in btls if b not in SHM_NAMES]
    btl = network[0] if network else next(iter(btls))
    transport = {"tcp": "tcp", "openib": "ib", "uct": "ib"}.get(btl, "shm" if btl in SHM_NAMES else btl)
    names = [] if state["exclude"] or state["failed"] or btl != "tcp" else state["names"]
    return Observation("mpi", transport, tuple(dict.fromkeys(n for n, _, _ in names)),
                       tuple(a for _, a, _ in names if a), f"Open MPI BTL {btl}",
                       tuple(dict.fromkeys([btls[btl], *(line for _, _, line in names)])))


def _ucx_observation(state: dict) -> Observation | None:
    tls = state["tls"]
    transport = next((t for t in ("ib", "tcp", "shm") if t in tls), None)
    if transport is None:
        return None
    devices = tls[transport]
    return Observation("ucx", transport, tuple(d for d in devices if transport != "shm"), (), "UCX",
                       tuple(dict.fromkeys(devices.values())))


# --- the comparison --------------------------------------------------------------------------------

def interface_ok(name: str, address: str | None, patterns: tuple[str, ...]) -> bool | None:
    """Does an observed interface satisfy the patterns? None: cannot tell from the log."""
    exclude = patterns[0].startswith("^")
    results = []
    for pattern in (p.lstrip("^") for p in patterns):
        if "/" in pattern and pattern[:1].isdigit():  # Open MPI's subnet form: needs the address
            results.append(None if address is None else
                           ipaddress.ip_address(address) in ipaddress.ip_network(pattern, strict=False))
            continue
        exact, pattern = pattern.startswith("="), pattern.lstrip("=")
        want, _, want_port = pattern.partition(":")
        have, _, have_port = name.partition(":")
        same_port = not (want_port and have_port) or want_port == have_port
        results.append(same_port and (have == want if exact else have.startswith(want)))
    if True in results:
        return not exclude
    return None if None in results else exclude


def check_grpc(check: dict, interface: str | None, address: str | None, evidence: str = "",
               layer: str = "grpc") -> dict:
    """Add TensorFlow's gRPC traffic (collective, parameter_server modes), or PyTorch's Gloo sockets
    (`layer` gloo), to a transport check.

    MPI only exchanged the addresses; the gradients went over sockets on the address the
    benchmark bound, which it records with the interface it took it from (Gloo itself logs none).
    """
    patterns = tuple(check.get("expected", {}).get("interface") or ())
    seen = f"{layer}: tcp over {interface or 'the hostname'}" + (f" ({address})" if address else "")
    if interface and patterns and interface_ok(interface, address, patterns) is False:
        return {**check, "status": Check.MISMATCH, "evidence": [evidence, *check.get("evidence", [])],
                "reason": f"{layer}: the fabric asks for interface {_describe(patterns)}, the benchmark bound "
                          f"{interface} ({address})"}
    if patterns and not interface and check["status"] == Check.OK:
        return {**check, "status": Check.UNVERIFIED, "reason": f"{check['reason']}; {seen}: not an interface of the fabric"}
    return {**check, "reason": f"{check['reason']}; {seen}"}


def _describe(patterns: tuple[str, ...]) -> str:
    names = ",".join(p.lstrip("^=") for p in patterns)
    return f"not {names}" if patterns[0].startswith("^") else names


def verify(lines, fabric: dict, layers=None) -> TransportCheck:
    """Compare what the log shows with what the fabric asks for.

    `layers` are the layers that carry this run's data and must be confirmed: ("mpi",) for
    netbench and CPU Horovod with MPI operations (the default), ("nccl",) when GPUs use NCCL.
    Any layer that contradicts the fabric makes a mismatch, required or not.
    """
    expected = expected_transport(fabric)
    observations = observe_transport(lines)
    observed = {layer: [o for o in observations if o.layer == layer] for layer in LAYERS}
    observed = {layer: obs for layer, obs in observed.items() if obs}
    gloo_cpu = any(o.layer == "gloo" for o in observations)
    required = tuple(layers) if layers else ("gloo",) if gloo_cpu else ("mpi",)

    def check(status: str, reason: str, evidence) -> TransportCheck:
        return TransportCheck(status, reason, expected, observed, list(dict.fromkeys(evidence)))

    decisive = [line for o in observations for line in o.evidence[:2]]
    for o in observations:
        want = expected.layers.get(o.layer)
        if want is None:
            continue
        seen = o.transport + (" over " + ",".join(o.interfaces) if o.interfaces else "")
        fell_back = f" ({o.detail})" if "fell back" in o.detail else ""
        if want.transport and o.transport not in (want.transport, "shm", "gpu"):
            return check(Check.MISMATCH, f"{o.layer}: the fabric asks for {want.transport} ({want.source}), "
                                     f"the log shows {seen}{fell_back}", o.evidence)
        patterns = want.interfaces.get(o.transport) or want.interfaces.get("*")
        addresses = dict(zip(o.interfaces, o.addresses)) if len(o.addresses) == len(o.interfaces) else {}
        wrong = [i for i in o.interfaces if patterns and interface_ok(i, addresses.get(i), patterns) is False]
        if wrong:
            return check(Check.MISMATCH, f"{o.layer}: the fabric asks for interface {_describe(patterns)} "
                                     f"({want.source}), the log shows {seen}", o.evidence)
    if not any(e.transport or e.interfaces for e in expected.layers.values()):
        return check(Check.UNVERIFIED, "the fabric names no transport or interface: nothing to check against "
                                   "(add an expect block)", decisive)
    for layer in required:
        mine = [o for o in observations if o.layer in SERVED_BY.get(layer, (layer,))]
        if not mine:
            return check(Check.UNVERIFIED, f"{layer}: no line in the log says which transport it used "
                                       "(debug variables missing, or the layer never connected)", decisive)
        network = [o for o in mine if o.transport not in ("shm", "gpu")]
        if not network:
            return check(Check.UNVERIFIED, f"{layer}: all traffic stayed in shared memory on one node; "
                                       "the fabric was not exercised", decisive)
        for o in network:
            want = expected.layers.get(o.layer) or LayerExpectation(None)
            if (want.interfaces.get(o.transport) or want.interfaces.get("*")) and not o.interfaces:
                return check(Check.UNVERIFIED, f"{o.layer}: {o.transport} confirmed, but the log does not name "
                                           "the interface", decisive)
    summary = "; ".join(f"{o.layer}: {o.transport}" + (" over " + ",".join(o.interfaces) if o.interfaces else "")
                        for o in observations if o.transport not in ("shm", "gpu"))
    return check(Check.OK, f"as asked: {summary}", decisive)
