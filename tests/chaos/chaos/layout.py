"""Which namespaces a scenario needs, decided by its name alone (stdlib only: main.py's child
builds the network before it imports anything that opens a socket).

Coordinator scenarios (`coord-*`) add a namespace for the etcd server (198.18.0.20) and one per
standalone controller (198.18.0.30, .31) to the nodes' and the clients'. The scenarios in
ETCD_MEMBERS run a three-member etcd cluster instead: `etcd`, `etcd2`, `etcd3` (198.18.0.20,
.21, .22), each member in a namespace of its own, so an etcd partition is a blackhole route like
any other.
"""

COORD_PREFIX = "coord-"
COORD_EXTRAS = {"etcd": 20, "c1": 30, "c2": 31}
# scenarios with a multi-member etcd cluster: the member count
ETCD_MEMBERS = {"coord-etcd-minority-with-master": 3}
# scenarios with more than three nodes
NODE_COUNT = {"coord-master-and-voter-isolated": 5}


def is_coord(name):
    return name.startswith(COORD_PREFIX)


def nodes_of(name):
    return [f"n{i + 1}" for i in range(NODE_COUNT.get(name, 3))]


def etcd_names(name):
    """The etcd members' namespace names: `etcd`, then `etcd2`, `etcd3`, ..."""
    return ["etcd"] + [f"etcd{i}" for i in range(2, ETCD_MEMBERS.get(name, 1) + 1)]


def extras_of(name):
    if not is_coord(name):
        return {}
    extras = dict(COORD_EXTRAS)
    for i, e in enumerate(etcd_names(name)):
        extras[e] = COORD_EXTRAS["etcd"] + i
    return extras
