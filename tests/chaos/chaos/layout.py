"""Which namespaces a scenario needs, decided by its name alone (stdlib only: main.py's child
builds the network before it imports anything that opens a socket).

Coordinator scenarios (`coord-*`) add a namespace for the etcd server (198.18.0.20) and one per
standalone controller (198.18.0.30, .31) to the nodes' and the clients'.
"""

COORD_PREFIX = "coord-"
COORD_EXTRAS = {"etcd": 20, "c1": 30, "c2": 31}
# scenarios with more than three nodes
NODE_COUNT = {"coord-master-and-voter-isolated": 5}


def is_coord(name):
    return name.startswith(COORD_PREFIX)


def nodes_of(name):
    return [f"n{i + 1}" for i in range(NODE_COUNT.get(name, 3))]


def extras_of(name):
    return dict(COORD_EXTRAS) if is_coord(name) else {}
