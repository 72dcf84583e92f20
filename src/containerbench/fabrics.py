"""Which interconnect a run really used, read from its raw log.

A fabric in the config is a set of environment variables for every layer that
picks a network: NCCL, UCX, Open MPI and Horovod's Gloo. Asking is not getting:
an image without libibverbs or a wrong interface name makes NCCL and Open MPI
fall back to TCP sockets without an error, and the run only gets slower. Each
layer (fabriclayers: `Nccl`, `Ucx`, `OpenMpi`, `Gloo`) knows the variables that
make it log its choice, what a fabric's variables ask of it, and what its log
lines say it used; the functions here put the layers together:

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
from dataclasses import asdict, dataclass

from containerbench.fabriclayers import (
    BY_NAME,
    GLOO,
    LAYERS,
    MPI,
    NCCL,
    READERS,
    UCX,
    LayerExpectation,
    Observation,
    canonical_transport,
    interface_patterns,
)
from containerbench.status import Check

# What the transport check says of a run whose ranks never used a network (comparisons.fabric_table reads it).
SHARED_MEMORY_ONLY = "all traffic stayed in shared memory on one node"
# Open MPI's shared-memory BTLs, UCX's shared-memory transports (`ucx_info -d`, UCX_TLS aliases).
SHM_BTLS, SHM_TLS = {"vader", "sm", "smcuda"}, {"sm", "shm", "posix", "sysv", "cma", "xpmem", "knem", "all"}


def keeps_shared_memory(env: dict) -> bool:
    """Does a fabric leave the ranks of one node their shared-memory path, so that one node measures no
    network? False when its MPI BTLs, its UCX transports or NCCL's SHM and P2P are all without it."""
    def listed(name):
        value = str(env.get(name, "")).strip().lower()
        return (value.startswith("^"), {item.strip() for item in value.lstrip("^").split(",") if item.strip()})

    for name, shared in (("OMPI_MCA_btl", SHM_BTLS), ("UCX_TLS", SHM_TLS)):
        excluding, items = listed(name)
        if items and (bool(items & shared) == excluding):
            return False
    return not (str(env.get("NCCL_SHM_DISABLE")) == "1" and str(env.get("NCCL_P2P_DISABLE")) == "1")


@dataclass
class Expectation:
    transport: str | None
    interface: tuple[str, ...]
    layers: dict[str, LayerExpectation]
    declared: bool                                 # from the fabric's `expect` block


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
    wanted = {name: value for layer in (NCCL, UCX, GLOO, MPI) for name, value in layer.debug_env(env).items()}
    return {k: v for k, v in wanted.items() if k not in env}


def expected_transport(fabric: dict) -> Expectation:
    """From `expect: {transport: ib|tcp|socket|shm, interface: NAME | [NAMES] | null}`,
    or, without one, from the variables in the fabric's env."""
    env = {k: str(v) for k, v in (fabric.get("env") or {}).items()}
    declared = fabric.get("expect")
    if declared:
        transport = canonical_transport(declared.get("transport"))
        names = declared.get("interface") or ()
        names = (names,) if isinstance(names, str) else tuple(names)
        patterns = {transport or "*": interface_patterns(",".join(names), exact=True)} if names else {}
        return Expectation(transport, names, {layer: LayerExpectation(transport, patterns, "expect")
                                              for layer in LAYERS}, declared=True)
    # UCX before Open MPI, which may hand its traffic to UCX.
    layers = {layer.name: asked for layer in (NCCL, UCX, MPI, GLOO) if (asked := layer.expectation(env))}
    transports = {e.transport for e in layers.values() if e.transport and e.transport != "shm"}
    interfaces = tuple(dict.fromkeys(p for e in layers.values() for ps in e.interfaces.values() for p in ps))
    return Expectation(transports.pop() if len(transports) == 1 else None, interfaces, layers, declared=False)


def observe_transport(lines) -> list[Observation]:
    """One observation per layer and distinct outcome, counting the processes that share it."""
    lines = lines.splitlines() if isinstance(lines, str) else list(lines)
    settings = {layer.name: layer.logged_settings(lines) for layer in READERS}
    procs: dict[tuple[str, str], dict] = {}
    found: list[Observation] = []  # a line's own observations first, then each process's
    for line in lines:
        layer, match = next(((layer, m) for layer in READERS if (m := layer.match(line))), (None, None))
        if layer is None:
            continue
        if layer.per_process:
            state = procs.setdefault((layer.name, match["proc"]), layer.new_state(settings[layer.name]))
            layer.read(state, match, line)
        elif (observation := layer.line_observation(match, line)):
            found.append(observation)
    found += [o for (name, _), state in procs.items() if (o := BY_NAME[name].observation(state))]
    merged: dict[tuple, Observation] = {}
    for o in found:
        key = (o.layer, o.transport, o.interfaces, o.detail)
        if key in merged:
            merged[key].count += 1
        else:
            merged[key] = o
    return list(merged.values())


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
        return {**check, "status": Check.UNVERIFIED,
                "reason": f"{check['reason']}; {seen}: not an interface of the fabric"}
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
    if (contradiction := _contradiction(expected, observations)):
        return check(Check.MISMATCH, *contradiction)
    if not any(e.transport or e.interfaces for e in expected.layers.values()):
        return check(Check.UNVERIFIED, "the fabric names no transport or interface: nothing to check against "
                                     "(add an expect block)", decisive)
    if (gap := _unconfirmed(expected, observations, required)):
        return check(Check.UNVERIFIED, gap, decisive)
    summary = "; ".join(f"{o.layer}: {_seen(o)}" for o in observations if o.transport not in ("shm", "gpu"))
    return check(Check.OK, f"as asked: {summary}", decisive)


def _seen(o: Observation) -> str:
    return o.transport + (" over " + ",".join(o.interfaces) if o.interfaces else "")


def _contradiction(expected: Expectation, observations: list[Observation]) -> tuple[str, tuple[str, ...]] | None:
    """The first layer whose log contradicts what the fabric asks of it: why, and its lines."""
    for o in observations:
        want = expected.layers.get(o.layer)
        if want is None:
            continue
        fell_back = f" ({o.detail})" if "fell back" in o.detail else ""
        if want.transport and o.transport not in (want.transport, "shm", "gpu"):
            return (f"{o.layer}: the fabric asks for {want.transport} ({want.source}), "
                    f"the log shows {_seen(o)}{fell_back}", o.evidence)
        patterns = want.interfaces.get(o.transport) or want.interfaces.get("*")
        addresses = dict(zip(o.interfaces, o.addresses)) if len(o.addresses) == len(o.interfaces) else {}
        wrong = [i for i in o.interfaces if patterns and interface_ok(i, addresses.get(i), patterns) is False]
        if wrong:
            return (f"{o.layer}: the fabric asks for interface {_describe(patterns)} "
                    f"({want.source}), the log shows {_seen(o)}", o.evidence)
    return None


def _unconfirmed(expected: Expectation, observations: list[Observation], required: tuple[str, ...]) -> str | None:
    """Why a layer that carries the data is not confirmed by the log; None: each is."""
    for layer in required:
        mine = [o for o in observations if o.layer in _served_by(layer)]
        if not mine:
            return (f"{layer}: no line in the log says which transport it used "
                    "(debug variables missing, or the layer never connected)")
        network = [o for o in mine if o.transport not in ("shm", "gpu")]
        if not network:
            return f"{layer}: {SHARED_MEMORY_ONLY}; the fabric was not exercised"
        for o in network:
            want = expected.layers.get(o.layer) or LayerExpectation(None)
            if (want.interfaces.get(o.transport) or want.interfaces.get("*")) and not o.interfaces:
                return f"{o.layer}: {o.transport} confirmed, but the log does not name the interface"
    return None


def _served_by(layer: str) -> tuple[str, ...]:
    """The layers whose lines speak for `layer` (a name no Layer has: itself)."""
    return BY_NAME[layer].served_by if layer in BY_NAME else (layer,)


# --- the devices a fabric names, which every node must have ----------------------------------------

# The variables that name a node's device, each read as its own layer reads it: NCCL's lists are
# prefixes unless "=" (NCCL's environment variables, NCCL_SOCKET_IFNAME and NCCL_IB_HCA), the others
# exact names. UCX_NET_DEVICES names an HCA port (mlx5_0:1) or an interface (eth0), "all" by default.
DEVICE_VARIABLES = {
    "NCCL_IB_HCA": ("hca", False),
    "NCCL_SOCKET_IFNAME": ("netdev", False),
    "UCX_NET_DEVICES": ("any", True),
    "OMPI_MCA_btl_tcp_if_include": ("netdev", True),
    "HOROVOD_GLOO_IFACE": ("netdev", True),
    "GLOO_SOCKET_IFNAME": ("netdev", True),
}


@dataclass(frozen=True)
class DeviceRequest:
    key: str          # the config key that names it, e.g. fabrics.infiniband.env.NCCL_IB_HCA
    value: str        # as written
    kind: str         # "hca" (an InfiniBand/RoCE device), "netdev" (a network interface) or "any"
    name: str         # the device, without port
    port: str         # "" : any port
    exact: bool       # False: a prefix, as NCCL reads its lists


def named_devices(fabrics: dict[str, dict]) -> list[DeviceRequest]:
    """Every device the fabrics' variables name; lists that exclude ("^"), subnets and "all" name none."""
    requests = []
    for fabric_name, fabric in sorted(fabrics.items()):
        for variable, (kind, exact) in DEVICE_VARIABLES.items():
            value = str((fabric.get("env") or {}).get(variable, "")).strip()
            if not value or value.lower() == "all" or value.startswith("^"):
                continue
            for pattern in interface_patterns(value, exact=exact):
                if "/" in pattern:  # Open MPI's subnet form names no device
                    continue
                name, _, port = pattern.lstrip("=").partition(":")
                key = fabric.get("key", f"fabrics.{fabric_name}")  # fabric_settings' place of a rail
                requests.append(DeviceRequest(f"{key}.env.{variable}", value, kind, name, port,
                                              pattern.startswith("=")))
    return requests


# A rail's runs name it after its fabric: FABRIC.RAIL ("." is in no fabric's or rail's name).
RAIL_SEPARATOR = "."


def measured_fabrics(config: dict) -> list[str]:
    """Every fabric of the config, each followed by its rails (FABRIC.RAIL): what a fleet's link jobs measure."""
    return [name for fabric in config["fabrics"] for name in (fabric, *rail_names(config, fabric))]


def rail_names(config: dict, fabric: str) -> list[str]:
    """The names a fleet's link jobs measure a fabric's rails under, one each (fabrics.NAME.rails)."""
    return [f"{fabric}{RAIL_SEPARATOR}{rail}" for rail in config["fabrics"][fabric].get("rails") or {}]


def rail_fabric(name: str) -> str:
    """The configured fabric a run's fabric name is, or is a rail of."""
    return name.partition(RAIL_SEPARATOR)[0]


def fabric_settings(config: dict, name: str) -> dict:
    """What a run over `name` sets and expects: a configured fabric, or one rail of it (FABRIC.RAIL), whose env
    goes over its fabric's. A rail is checked against its own `expect`, else against what its merged variables
    ask (NCCL_IB_HCA, UCX_NET_DEVICES, btl_tcp_if_include), never against the fabric's: that one names the
    rails together. `key`: where the settings are in the config, for a message."""
    fabric_name, _, rail = name.partition(RAIL_SEPARATOR)
    fabric = config["fabrics"][fabric_name]
    if not rail:
        return {**fabric, "key": f"fabrics.{fabric_name}"}
    settings = fabric["rails"][rail]
    return {"description": f"{fabric.get('description') or fabric_name}: rail {rail} alone",
            "env": {**fabric["env"], **settings["env"]}, "key": f"fabrics.{fabric_name}.rails.{rail}",
            **({"expect": settings["expect"]} if settings.get("expect") else {})}


def named_hcas(config: dict) -> list[str] | None:
    """The HCAs (HCA or HCA:PORT) the fabrics and their rails name exactly (NCCL_IB_HCA=mlx5_0:1,...): the node's
    rails, as a fleet's hardware step reads them; None where none is named so (every InfiniBand port counts)."""
    hcas = [f"{each.name}:{each.port}" if each.port else each.name
            for each in named_devices({name: fabric_settings(config, name) for name in measured_fabrics(config)})
            if each.kind == "hca" and each.exact]
    return list(dict.fromkeys(hcas)) or None
