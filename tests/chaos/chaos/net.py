"""Network namespaces for the fault harness: one per node, one for the clients, one switch.

Every node lives in its own network namespace with one veth to a bridge in a switch namespace;
addresses come from the benchmarking range 198.18.0.0/15 (RFC 2544) only, on one /24, so no
namespace has or needs a default route, and nothing is forwarded or NATed to the host: the
namespaces can reach each other and nothing else. The harness's own gRPC clients run in a
client namespace on the same bridge (the harness thread enters it with setns before it opens
any socket).

In coordinator mode (`extras`) the etcd server and each standalone controller get a namespace
of their own on the same bridge, so cutting a node off from etcd, or a controller off from the
voters, is a blackhole route like any other partition.

Faults: `partition(a, b)` adds blackhole routes both ways, `partition_oneway(src, dst)` only in
src (src's packets to dst are dropped; dst's still arrive), `heal()` removes every blackhole.

Every name carries the prefix `hx<pid>`; `sweep_stale()` removes the namespaces of harness runs
whose process is gone (a run killed with -9), and `Net.close()` removes this run's, also on
failure (main.py calls it from a finally block and an atexit hook).
"""

import ctypes
import os
import re
import subprocess
import time

BASE = "hx"
SUBNET = "198.18.0"
CLONE_NEWNET = 0x40000000


def sh(*args, check=True):
    """Runs one command (no shell), bounded to 20 s; raises naming it on failure."""
    res = subprocess.run(args, capture_output=True, text=True, timeout=20)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: exit {res.returncode}: {res.stderr.strip()}")
    return res


def list_netns():
    out = sh("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def kill_in(ns):
    """SIGKILLs every process inside namespace `ns` (nodes and proxies a dead run left)."""
    pids = sh("ip", "netns", "pids", ns, check=False).stdout.split()
    for pid in pids:
        if pid == str(os.getpid()):
            continue  # the harness's own child lives in its client namespace
        try:
            os.kill(int(pid), 9)
        except (ProcessLookupError, ValueError):
            pass
    return len(pids)


def sweep_stale():
    """Deletes namespaces (and kills the processes in them) left by harness runs whose
    process no longer exists."""
    removed = []
    for ns in list_netns():
        m = re.fullmatch(rf"{BASE}(\d+)-\w+", ns)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            kill_in(ns)
            sh("ip", "netns", "del", ns, check=False)
            removed.append(ns)
    return removed


def enter(ns):
    """Moves the calling thread into namespace `ns` (threads it starts afterwards inherit it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into {ns}: {os.strerror(err)}")
    finally:
        os.close(fd)


class Net:
    """The namespaces of one harness run: `sw` (bridge), `cl` (clients) and one per node."""

    def __init__(self, nodes, extras=None):
        """`extras`: more namespaces on the bridge by name and last address byte (coordinator
        mode: the etcd server and the controllers)."""
        if os.geteuid() != 0:
            raise SystemExit("the chaos harness needs root (ip netns, mount): run it as root")
        self.prefix = f"{BASE}{os.getpid()}"
        self.nodes = list(nodes)
        self.extras = dict(extras or {})
        self.ips = {name: f"{SUBNET}.{11 + i}" for i, name in enumerate(self.nodes)}
        self.ips["cl"] = f"{SUBNET}.100"
        for name, last in self.extras.items():
            self.ips[name] = f"{SUBNET}.{last}"
        self.created = []
        self.blackholes = set()  # (node, dst ip)

    def ns(self, name):
        return f"{self.prefix}-{name}"

    def nsenter(self, name):
        """The argv prefix that runs a command inside `name`'s namespace."""
        return ["nsenter", f"--net=/run/netns/{self.ns(name)}", "--"]

    def create(self):
        sw = self.ns("sw")
        sh("ip", "netns", "add", sw)
        self.created.append(sw)
        sh("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", sw, "link", "set", "br0", "up")
        for i, name in enumerate(self.nodes + ["cl"] + list(self.extras)):
            ns = self.ns(name)
            sh("ip", "netns", "add", ns)
            self.created.append(ns)
            port = f"p{i}"
            sh("ip", "-n", sw, "link", "add", port, "type", "veth", "peer", "name", "eth0",
               "netns", ns)
            sh("ip", "-n", sw, "link", "set", port, "master", "br0")
            sh("ip", "-n", sw, "link", "set", port, "up")
            sh("ip", "-n", ns, "addr", "add", f"{self.ips[name]}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        self.check_isolated()

    def check_isolated(self):
        """Every namespace routes only its /24 (and loopback): no default route, no way out."""
        for ns in self.created:
            routes = sh("ip", "-n", ns, "route", "show").stdout
            for line in routes.splitlines():
                if line.startswith("default") or not (
                    line.startswith(f"{SUBNET}.") or line.startswith("blackhole")
                ):
                    raise RuntimeError(f"namespace {ns} has an unexpected route: {line}")

    def _blackhole(self, src, dst):
        ip = self.ips[dst]
        if (src, ip) not in self.blackholes:
            sh("ip", "-n", self.ns(src), "route", "add", "blackhole", f"{ip}/32")
            self.blackholes.add((src, ip))

    def partition(self, a, b):
        """Cuts a and b off from each other, both ways."""
        self._blackhole(a, b)
        self._blackhole(b, a)

    def partition_oneway(self, src, dst):
        """Drops what src sends to dst; what dst sends still reaches src."""
        self._blackhole(src, dst)

    def heal(self):
        for src, ip in sorted(self.blackholes):
            sh("ip", "-n", self.ns(src), "route", "del", "blackhole", f"{ip}/32", check=False)
        self.blackholes.clear()

    def close(self):
        for ns in reversed(self.created):
            kill_in(ns)
            sh("ip", "netns", "del", ns, check=False)
        self.created = []
        # Deleting a namespace is asynchronous in the kernel; wait (bounded) until it is gone.
        for _ in range(50):
            if not any(n.startswith(self.prefix + "-") for n in list_netns()):
                break
            time.sleep(0.1)
