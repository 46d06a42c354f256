"""Coordinator mode of the harness (issue 17): the controller, not the harness, is the
orchestrator.

A coordinator run adds to the usual namespaces an etcd server (its own namespace, 198.18.0.20,
data dir on /dev/shm, `--heartbeat-interval 200 --election-timeout 2000`, auto-compaction on)
and one or two standalone `hasync controller` processes (198.18.0.30, .31). The nodes run with
`[coordinator]` (`coordinator.controller = false`: the controllers are the standalone ones),
a short TTL by default (3 s, renewals every 500 ms; `--ttl` or a scenario parameter changes
it). The harness only injects faults (kill -9, SIGSTOP, blackhole routes to etcd or between
namespaces, etcd stopped) and watches:

- a router (the clients' name server): every 50 ms the producers' target becomes the node
  that reports MASTER, unfenced, at the highest epoch in the monitors' fresh samples (a client
  following its refusals would find it the same way); changes go to `routes.jsonl`;
- an observer: `hasync cluster status --json` every 500 ms through any node that answers,
  condensed into `coord.jsonl` (active controller, epoch, master, phase, blocked reason, live
  members);
- at the end, `hasync cluster history --group g1 --json` and `cluster status --json` go to
  `final/cluster-history.json` and `final/cluster-status.json`.

Each scenario states what it expects (`expectations.json`: name, ok, evidence); main.py fails a
run whose expectation failed, beside the checker's verdict. The checker itself knows nothing of
the coordinator: it reads the nodes' epoch histories as always; an ASYNC failover's loss bound
is written as the usual `async_bound` record, from the history record's chosen candidate.
Figures (`figures.json`): the failover time (first PUT_OK on the new master minus the kill),
switchover write pauses (as reported and as the clients saw them).
"""

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.request

from . import layout
from . import net as netmod

ETCD_CLIENT_PORT, ETCD_PEER_PORT = 2379, 2380
ETCD_BIN = os.environ.get("ETCD_BIN", "/usr/bin/etcd")
CLUSTER, GROUP = "chaos", "g1"
CONTROLLERS = {"c1": "ctl1", "c2": "ctl2"}  # namespace -> controller name (node.name)
CLI_TIMEOUT = 15

COORD_PARAMS = {
    "ttl": "3s",
    "controllers": 2,
    "hold_down": "1s",
    "max_failovers_per_minute": 10,
    "async_failover": False,
}


def parse_seconds(text):
    """'3s', '500ms', '1.5s', '10' -> seconds."""
    t = str(text).strip()
    if t.endswith("ms"):
        return float(t[:-2]) / 1000
    if t.endswith("s"):
        return float(t[:-1])
    return float(t)


def fmt_ms(seconds):
    return f"{int(round(seconds * 1000))}ms"


def renew_of(ttl_s):
    """The renewal interval for a TTL: 500 ms for short ones, else the defaults' ratio (1/5)."""
    return 0.5 if ttl_s <= 3.0 else ttl_s / 5


def wait_for(pred, timeout, step=0.1):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return None


# ---- processes: etcd and the standalone controllers


class Proc:
    """A process in a namespace: start, kill -9, SIGSTOP/SIGCONT, SIGTERM."""

    def __init__(self, name, nsenter, argv, log_path):
        self.name, self.nsenter, self.argv, self.log_path = name, nsenter, argv, log_path
        self.proc = None
        self.paused = False
        self.starts = 0

    def start(self):
        os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
        log = open(self.log_path, "ab")
        log.write(f"==== start {self.starts} at {time.time():.3f}\n".encode())
        log.flush()
        env = {**os.environ, "RUST_LOG": "info", "NO_COLOR": "1"}
        self.proc = subprocess.Popen(self.nsenter + self.argv, stdout=log, stderr=log, env=env,
                                     start_new_session=True)
        log.close()
        self.starts += 1
        self.paused = False

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill9(self):
        if self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.paused = False

    def pause(self):
        os.kill(self.proc.pid, signal.SIGSTOP)
        self.paused = True

    def resume(self):
        if self.alive():
            os.kill(self.proc.pid, signal.SIGCONT)
        self.paused = False

    def stop(self):
        if not self.alive():
            return self.proc.returncode if self.proc else None
        if self.paused:
            self.resume()
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            return -9

    def tail(self, n=15):
        try:
            with open(self.log_path, "rb") as f:
                return b"".join(f.readlines()[-n:]).decode(errors="replace")
        except OSError:
            return ""


def etcd_data_dir(pid, member="etcd"):
    return f"/dev/shm/{netmod.BASE}{pid}-{member}"


def sweep_etcd_dirs():
    """Removes the etcd data dirs of harness runs whose process is gone."""
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return
    for n in names:
        m = re.fullmatch(rf"{netmod.BASE}(\d+)-etcd\d*", n)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            shutil.rmtree(os.path.join("/dev/shm", n), ignore_errors=True)


class Etcd(Proc):
    """One etcd member in its namespace (`etcd`, or `etcd2`, `etcd3` of a three-member
    cluster: `members` names them all, in order; member i is called e<i+1>)."""

    def __init__(self, run, ns="etcd", members=("etcd",)):
        self.ns = ns
        self.ip = run.net.ips[ns]
        self.data = etcd_data_dir(os.getpid(), ns)
        client = f"http://{self.ip}:{ETCD_CLIENT_PORT}"
        peer = f"http://{self.ip}:{ETCD_PEER_PORT}"
        cluster = ",".join(f"e{i + 1}=http://{run.net.ips[m]}:{ETCD_PEER_PORT}"
                           for i, m in enumerate(members))
        argv = [
            ETCD_BIN, "--name", f"e{list(members).index(ns) + 1}", "--data-dir", self.data,
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", cluster, "--initial-cluster-state", "new",
            "--initial-cluster-token", f"hx{os.getpid()}",
            "--heartbeat-interval", "200", "--election-timeout", "2000",
            "--auto-compaction-mode", "revision", "--auto-compaction-retention", "1000",
            "--quota-backend-bytes", str(64 << 20),
            "--logger", "zap", "--log-outputs", "stderr",
        ]
        super().__init__(ns, run.net.nsenter(ns), argv,
                         os.path.join(run.dir, "logs", f"{ns}.log"))
        self.endpoint = f"{self.ip}:{ETCD_CLIENT_PORT}"

    def healthy(self):
        try:
            with urllib.request.urlopen(f"http://{self.endpoint}/health", timeout=1) as r:
                return json.loads(r.read()).get("health") == "true"
        except (OSError, ValueError):
            return False

    def is_leader(self):
        """True when this member's /metrics says it leads the etcd cluster (None: no answer)."""
        try:
            with urllib.request.urlopen(f"http://{self.endpoint}/metrics", timeout=1) as r:
                text = r.read().decode(errors="replace")
        except OSError:
            return None
        m = re.search(r"^etcd_server_is_leader (\S+)$", text, re.M)
        return None if not m else float(m.group(1)) == 1.0

    def wait_healthy(self, timeout=20):
        if not wait_for(lambda: not self.alive() or self.healthy(), timeout, 0.1) or not self.alive():
            raise RuntimeError(f"{self.ns} did not become healthy within {timeout}s: {self.tail()}")

    def start_healthy(self, timeout=20):
        self.start()
        self.wait_healthy(timeout)

    def remove_data(self):
        shutil.rmtree(self.data, ignore_errors=True)


def coordinator_lines(run, controller):
    """The `[coordinator]` section of a node's (controller=False) or a controller's config."""
    p = run.coord_params
    ttl = parse_seconds(p["ttl"])
    lines = [
        "[coordinator]",
        "endpoints = [" + ", ".join(f'"{e.endpoint}"' for e in run.etcds) + "]",
        f'cluster = "{CLUSTER}"',
        f'ttl = "{fmt_ms(ttl)}"',
        f'renew-interval = "{fmt_ms(renew_of(ttl))}"',
        'timeout = "1s"',
        'retry = "200ms"',
        f'hold-down = "{p["hold_down"]}"',
        f'max-failovers-per-minute = {p["max_failovers_per_minute"]}',
        f'async-failover = {"true" if p["async_failover"] else "false"}',
    ]
    if not controller:
        lines += [f'group = "{GROUP}"', "controller = false"]
    return lines


class ControllerProc(Proc):
    def __init__(self, run, ns):
        self.ns, self.ctl_name = ns, CONTROLLERS[ns]
        self.cfg = os.path.join(run.dir, "config", f"{ns}.toml")
        super().__init__(ns, run.net.nsenter(ns), [run.binary, "controller", "--config", self.cfg],
                         os.path.join(run.dir, "logs", f"{ns}.log"))
        os.makedirs(os.path.dirname(self.cfg), exist_ok=True)
        lines = [
            "[node]",
            f'name = "{self.ctl_name}"',
            "[replication]",
            f'mode = "{run.mode.lower()}"',
            f"sync-ack-replicas = {run.k}",
            f'slave-timeout = "{run.params["slave_timeout"]}"',
            "[ha]",
            'heartbeat-interval = "1s"',  # the nodes': the pre-vote's frame-age bound
        ] + coordinator_lines(run, controller=True)
        with open(self.cfg, "w") as f:
            f.write("\n".join(lines) + "\n")


# ---- the CLI: cluster status and history, switchover


def split(run, minority, majority, **detail):
    """Cuts every link between `minority` and `majority` and records the fault; its time."""
    t0 = time.time()
    run.fault_t = t0
    for a in minority:
        for b in majority:
            run.net.partition(a, b)
    run.fault("partition", minority, **detail)
    return t0


def cli(run, args, timeout=CLI_TIMEOUT):
    """Runs `hasync ARGS` in the clients' namespace; (exit code, stdout, stderr)."""
    try:
        res = subprocess.run(run.net.nsenter("cl") + [run.binary] + args, capture_output=True,
                             text=True, timeout=timeout)
        return res.returncode, res.stdout, res.stderr
    except subprocess.TimeoutExpired:
        return None, "", f"timed out after {timeout}s"


def cluster_json(run, what, order=None):
    """`hasync cluster status|history --json` through the first node that answers."""
    extra = ["--group", GROUP] if what == "history" else []
    for n in order or list(run.nodes):
        node = run.nodes[n]
        if not node.alive() or node.paused:
            continue
        code, out, _ = cli(run, ["cluster", what, *extra, "--json", "--grpc", node.grpc_addr,
                                 "--connect-timeout", "1s", "--timeout", "3s"], timeout=8)
        if code == 0:
            try:
                return json.loads(out)
            except ValueError:
                continue
    return None


def group_of(status):
    for g in (status or {}).get("groups", []):
        if g.get("group") == GROUP:
            return g
    return None


def promotions(history, since_epoch=0):
    """The history entries that made a new master (failover, switchover, manual failover),
    oldest first."""
    out = [e for e in (history or {}).get("entries", [])
           if e.get("kind") != "bootstrap" and e.get("new_master") and e["epoch"] > since_epoch]
    return sorted(out, key=lambda e: e["epoch"])


# ---- watching: the router and the observer


class Router(threading.Thread):
    """The producers' name server: the node that reports MASTER, unfenced, at the highest
    epoch in a fresh sample becomes their target."""

    def __init__(self, run, wl):
        super().__init__(daemon=True, name="router")
        self.run_, self.wl = run, wl
        self.stop_event = threading.Event()
        self.changes = []

    def pick(self):
        now = time.time()
        best = None
        for n, m in self.wl.monitors.items():
            s = m.last
            if not s or now - s["t"] > 1.0 or s.get("role") != "MASTER" or s.get("fenced"):
                continue
            if best is None or s["epoch"] > best[1]:
                best = (n, s["epoch"])
        return best

    def run(self):
        deadline = time.time() + 300
        while not self.stop_event.is_set() and time.time() < deadline:
            best = self.pick()
            if best and best[0] != self.run_.master:
                self.run_.master = best[0]
                rec = {"t": time.time(), "master": best[0], "epoch": best[1]}
                self.changes.append(rec)
                self.run_.routes.write(rec)
            self.stop_event.wait(0.05)


class Observer(threading.Thread):
    """`hasync cluster status --json` every 500 ms, condensed into coord.jsonl."""

    def __init__(self, run):
        super().__init__(daemon=True, name="observer")
        self.run_ = run
        self.stop_event = threading.Event()
        self.samples = []
        self.lock = threading.Lock()

    def run(self):
        deadline = time.time() + 300
        while not self.stop_event.is_set() and time.time() < deadline:
            st = cluster_json(self.run_, "status", order=self.order())
            g = group_of(st)
            rec = {"t": time.time(), "ok": st is not None}
            if st is not None:
                rec["controller"] = st.get("controller")
            if g is not None:
                rec.update({
                    "epoch": g.get("epoch"), "master": g.get("master"), "phase": g.get("phase"),
                    "blocked_reason": g.get("blocked_reason"),
                    "leader": g.get("leader"),
                    "live": sorted(m["name"] for m in g.get("members", []) if m.get("live")),
                    "pending_request": g.get("pending_request") is not None,
                })
            with self.lock:
                self.samples.append(rec)
            self.run_.coord_log.write(rec)
            self.stop_event.wait(0.5)

    def order(self):
        """Ask a non-master first (the master may be the one cut off)."""
        names = list(self.run_.nodes)
        return [n for n in names if n != self.run_.master] + [self.run_.master]

    def since(self, t):
        with self.lock:
            return [s for s in self.samples if s["t"] >= t]


# ---- the run's coordinator side


class Coord:
    """What a coordinator run adds: etcd, the controllers, router, observer, expectations."""

    def __init__(self, run, wl):
        self.run, self.wl = run, wl
        members = layout.etcd_names(run.name)
        run.etcds = [Etcd(run, ns, members) for ns in members]
        run.etcd = run.etcds[0]
        self.controllers = {ns: ControllerProc(run, ns)
                            for ns in list(CONTROLLERS)[: run.coord_params["controllers"]]}
        self.router = Router(run, wl)
        self.observer = Observer(run)
        self.expectations = []
        self.figures = {}

    @property
    def etcd(self):
        return self.run.etcd

    def start(self):
        """etcd, the controllers (the first one becomes active), then the nodes: the first
        the initial master (fenced until the controller bootstraps the group's state), the
        others its slaves; waits until the master serves with every slave connected."""
        run = self.run
        for e in run.etcds:  # the members of a cluster find each other: start them all first
            e.start()
        for e in run.etcds:
            e.wait_healthy()
        run.fault("start", [e.ns for e in run.etcds], endpoints=[e.endpoint for e in run.etcds])
        for i, c in enumerate(self.controllers.values()):
            c.start()
            if i == 0:
                time.sleep(0.5)  # the first to campaign is the active one (usually)
        master = run.nodes[run.master]
        master.write_config("master")
        master.start()
        for s in run.slaves():
            run.nodes[s].write_config("slave", master)
            run.nodes[s].start()
        ok = wait_for(lambda: (st := master.status()) and not st["fenced"]
                      and len(st["slaves"]) >= len(run.slaves()), 60, 0.2)
        if not ok:
            raise RuntimeError(f"the group did not start serving: {master.status()}; "
                               f"controller: {self.controllers and list(self.controllers.values())[0].tail()}")

    def start_watching(self):
        self.router.start()
        self.observer.start()

    def stop_watching(self):
        for t in (self.router, self.observer):
            t.stop_event.set()
        for t in (self.router, self.observer):
            if t.ident is not None:
                t.join(10)

    def stop(self):
        """Controllers, then etcd (after the nodes stopped: their agents revoke leases)."""
        codes = {}
        for ns, c in self.controllers.items():
            codes[ns] = c.stop()
        for e in self.run.etcds:
            codes[e.ns] = e.stop()
            e.remove_data()
        return codes

    # ---- state queries

    def epoch_of(self, name):
        st = self.run.nodes[name].status(timeout=1)
        return st["epoch"] if st else None

    def active_controller(self, timeout=10):
        """The namespace of the active controller (cluster status's `controller`)."""
        names = {v: k for k, v in CONTROLLERS.items()}

        def got():
            s = self.observer.samples[-1:] if self.observer.samples else []
            c = s[0].get("controller") if s else None
            return names.get(c)
        return wait_for(got, timeout, 0.2)

    def wait_master(self, not_name=None, above_epoch=None, timeout=30):
        """Waits (bounded) until the router's master is another node than `not_name` (at an
        epoch above `above_epoch`); returns (name, epoch) or None."""
        def got():
            best = self.router.pick()
            if not best:
                return None
            n, e = best
            if not_name is not None and n == not_name:
                return None
            if above_epoch is not None and e <= above_epoch:
                return None
            return best
        return wait_for(got, timeout, 0.05)

    def wait_role(self, name, role, epoch_at_least, timeout=40):
        def got():
            st = self.run.nodes[name].status(timeout=1)
            return st if st and st["role"] == role and st["epoch"] >= epoch_at_least \
                and not st["fenced"] else None
        return wait_for(got, timeout, 0.2)

    # ---- expectations and figures

    def expect(self, name, ok, **evidence):
        self.expectations.append({"name": name, "ok": bool(ok), "evidence": evidence})
        self.write()

    def write(self):
        with open(os.path.join(self.run.dir, "expectations.json"), "w") as f:
            json.dump(self.expectations, f, indent=1)
        with open(os.path.join(self.run.dir, "figures.json"), "w") as f:
            json.dump(self.figures, f, indent=1)

    def final(self):
        """The cluster's history and status at the end (in final/)."""
        hist = cluster_json(self.run, "history")
        st = cluster_json(self.run, "status")
        for what, v in (("history", hist), ("status", st)):
            with open(os.path.join(self.run.dir, "final", f"cluster-{what}.json"), "w") as f:
                json.dump(v, f, indent=1)
        return hist, st


def completions(run):
    """Every put completion logged so far (history.jsonl is flushed line by line), each with
    its invoke time as `invoke_t`."""
    out, invoked = [], {}
    with open(os.path.join(run.dir, "history.jsonl")) as f:
        for line in f:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if r.get("type") == "invoke":
                invoked[r["tag"]] = r["t"]
            elif r.get("type") == "complete":
                r["invoke_t"] = invoked.get(r["tag"])
                out.append(r)
    return out


def first_put_ok(run, node, after, min_epoch=None):
    ts = [r["t"] for r in completions(run)
          if r.get("outcome") == "ok" and r.get("node") == node and r["t"] > after
          and (min_epoch is None or (r.get("epoch") or 0) >= min_epoch)]
    return min(ts, default=None)


def put_oks(run, node=None, since=None, until=None, invoked_after=None):
    return [r for r in completions(run) if r.get("outcome") == "ok"
            and (node is None or r.get("node") == node)
            and (since is None or r["t"] >= since) and (until is None or r["t"] <= until)
            and (invoked_after is None or (r["invoke_t"] or 0) > invoked_after)]


def longest_gap(run, since, until):
    """The longest time without a PUT_OK completion in [since, until] (from since, to until)."""
    ts = sorted(r["t"] for r in put_oks(run, since=since, until=until))
    pts = [since] + ts + [until]
    return max(b - a for a, b in zip(pts, pts[1:]))


def settle(rng, lo=2, hi=4):
    """The load before a fault (scenarios.LOAD_SCALE: shorter in --smoke)."""
    from .scenarios import LOAD_SCALE

    time.sleep(rng.uniform(lo, hi) * LOAD_SCALE)


def ttl_of(run):
    return parse_seconds(run.coord_params["ttl"])


# ---- scenarios (each: fn(run, wl, rng, co))


def kill_and_replace(run, co, rng, why=None):
    """kill -9 the master; wait for the controller's new master; restart the old one (it
    rejoins as a slave). Returns (old, new, new epoch, kill t)."""
    old = run.master
    e0 = co.epoch_of(old) or 0
    t = time.time()
    run.fault_t = t
    run.nodes[old].kill9()
    run.fault("kill9", [old], **({"why": why} if why else {}))
    got = co.wait_master(not_name=old, above_epoch=e0, timeout=ttl_of(run) + 30)
    if not got:
        co.expect("a new master after the kill", False, old=old, waited_s=round(time.time() - t, 1))
        run.nodes[old].start(wait=False)
        run.fault("restart", [old])
        return old, None, None, t
    new, epoch = got
    run.fault("promoted", [new], epoch=epoch, after_s=round(time.time() - t, 2))
    return old, new, epoch, t


def failover_figure(run, co, old, new, epoch, t):
    """Time from the kill to the first PUT_OK on the new master (its epoch)."""
    first = wait_for(lambda: first_put_ok(run, new, t, min_epoch=epoch), 20, 0.2)
    ttl = ttl_of(run)
    fig = {"ttl_s": ttl, "kill_t": t, "first_put_ok_t": first,
           "failover_s": None if first is None else round(first - t, 3),
           "goal_s": ttl + 2}
    co.figures.setdefault("failovers", []).append(fig)
    co.write()
    co.expect("a PUT_OK on the new master after the failover", first is not None, new=new,
              epoch=epoch, failover_s=fig["failover_s"])
    return fig


def restart_and_rejoin(run, co, old, epoch):
    if not run.nodes[old].alive():
        run.nodes[old].start(wait=False)
        run.fault("restart", [old])
    st = co.wait_role(old, "SLAVE", epoch, timeout=40)
    co.expect(f"{old} rejoins as a slave at epoch >= {epoch}", st is not None,
              status=st and {k: st[k] for k in ("role", "epoch", "max_offset", "master_link")})


def expect_promotions(co, hist, e0, count, why, **extra):
    p = promotions(hist, e0)
    co.expect(why, len(p) == count, promotions=[
        {k: e.get(k) for k in ("epoch", "kind", "old_master", "new_master", "controller",
                               "loss_bound_bytes")} for e in p], expected=count, **extra)
    return p


def sc_kill_master(run, wl, rng, co):
    """kill -9 the master under load; the controller fails over after the TTL; the old master
    restarts and rejoins as a slave. Exactly one failover, to another node."""
    settle(rng)
    e0 = co.epoch_of(run.master)
    old, new, epoch, t = kill_and_replace(run, co, rng)
    if new:
        failover_figure(run, co, old, new, epoch, t)
    time.sleep(rng.uniform(0.5, 1.5))
    restart_and_rejoin(run, co, old, epoch or e0 + 1)
    run.post = lambda hist: expect_failover_record(co, hist, e0, old, new)


def expect_failover_record(co, hist, e0, old, new, kind="failover"):
    p = expect_promotions(co, hist, e0, 1, f"exactly one {kind} in the history")
    if p:
        e = p[0]
        co.expect(f"the history's {kind} names the old and the new master",
                  e.get("kind") == kind and e.get("old_master") == old and e.get("new_master") == new,
                  entry={k: e.get(k) for k in ("kind", "old_master", "new_master", "epoch")},
                  observed={"old": old, "new": new})
    return p


def sc_pause_master(run, wl, rng, co):
    """SIGSTOP the master longer than the TTL: the controller fails over (the slaves get no
    frame: the pre-vote passes); SIGCONT: the old master must take no PUT_OK from then on (its
    slaves are fenced at the new epoch); it is demoted and truncates what only it held."""
    settle(rng)
    old = run.master
    e0 = co.epoch_of(old)
    run.fault_t = time.time()
    run.nodes[old].pause()
    run.fault("sigstop", [old])
    got = co.wait_master(not_name=old, above_epoch=e0, timeout=ttl_of(run) + 30)
    run.fault("bite", [old], fault="sigstop past the TTL", ok=got is not None,
              evidence=f"promoted {got}" if got else "no promotion while the master was stopped")
    # from the promotion on, a put sent to the stopped master must never be PUT_OK
    run.fault("expect_no_put_ok", [old], start=time.time(), end=None)
    time.sleep(rng.uniform(0.5, 2.0))
    before = None
    resume_t = time.time()
    run.nodes[old].resume()
    run.fault("sigcont", [old])
    before = wait_for(lambda: run.nodes[old].status(timeout=1), 5)
    epoch = got[1] if got else e0 + 1
    st = co.wait_role(old, "SLAVE", epoch, timeout=40)
    run.fault("expect_no_put_ok_end", [old], end=time.time())
    co.expect(f"{old} is demoted to a slave of epoch >= {epoch} after it resumed", st is not None,
              before={k: before[k] for k in ("role", "epoch", "max_offset")} if before else None,
              after={k: st[k] for k in ("role", "epoch", "max_offset")} if st else None)
    # a put sent while it was stopped reached it only after the fence: no slave may ack it
    late = [r for r in put_oks(run, node=old, invoked_after=run.fault_t) if (r.get("epoch") or 0) <= e0]
    co.expect("no PUT_OK from the old master at its old epoch for a put sent after the stop", not late,
              examples=[{k: r.get(k) for k in ("tag", "t", "epoch", "offset")} for r in late[:5]],
              resume_t=resume_t)
    new = got[0] if got else None
    run.post = lambda hist: expect_failover_record(co, hist, e0, old, new)


def cut_from_etcd(run, name):
    run.net.partition(name, "etcd")


def sc_master_cut_from_etcd(run, wl, rng, co):
    """The master cut off from etcd only (blackhole routes both ways) past the TTL: its lease
    expires, but its slaves still get its frames, so the pre-vote blocks the failover
    (`master_alive`); the master keeps serving SYNC on its slaves' acks. No promotion."""
    settle(rng)
    m = run.master
    e0 = co.epoch_of(m)
    t0 = time.time()
    run.fault_t = t0
    cut_from_etcd(run, m)
    run.fault("partition", [m, "etcd"], how="the master from etcd only, both ways")
    hold = ttl_of(run) + rng.uniform(3, 5)
    time.sleep(hold)
    seen = co.observer.since(t0)
    bit = [s for s in seen if s.get("blocked_reason") == "master_alive" or
           (s.get("live") is not None and m not in s.get("live"))]
    run.fault("bite", [m], fault="master cut off from etcd", ok=bool(bit),
              evidence=bit[0] if bit else f"{len(seen)} samples: the master's record stayed live")
    t1 = time.time()
    run.net.heal()
    run.fault("heal", list(run.nodes) + ["etcd"])
    served = put_oks(run, node=m, since=t0 + 0.5, until=t1)
    co.expect("the master keeps serving SYNC while cut off from etcd", len(served) > 0,
              put_ok=len(served), window=[t0, t1])
    co.figures["blocked"] = sorted({s.get("blocked_reason") for s in seen if s.get("blocked_reason")})
    run.post = lambda hist: (
        expect_promotions(co, hist, e0, 0, "no promotion (the pre-vote holds)"),
        expect_no_epoch_change(run, co, e0))


def expect_no_epoch_change(run, co, e0):
    top = max_epoch_sampled(run)
    co.expect("no node's epoch moved past the initial one", top <= e0, initial=e0, max_sampled=top)


def max_epoch_sampled(run):
    top = 0
    with open(os.path.join(run.dir, "status.jsonl")) as f:
        for line in f:
            try:
                top = max(top, json.loads(line).get("epoch") or 0)
            except ValueError:
                pass
    return top


def master_changes(co, since=None):
    return [c for c in co.router.changes if since is None or c["t"] >= since]


def sc_master_and_voter_isolated(run, wl, rng, co):
    """Five nodes, SYNC k = 2: the master and one voter cut off from the three others, etcd and
    the controllers (the clients still reach everyone). The minority master cannot reach k = 2
    acks: no PUT_OK from it (checked by the usual cut-off window); its lease expires, the
    pre-vote passes (only one of the four other voters hears it), three voters are fenced
    (|V| - k = 3) and the majority side promotes. Healed, both minority nodes rejoin as
    slaves. (With three nodes and k = 1 the majority side would be one node: |F| >= 2 is not
    reachable, and nothing may be promoted.)"""
    settle(rng)
    m = run.master
    e0 = co.epoch_of(m)
    v = rng.choice(run.slaves())
    minority = [m, v]
    majority = [n for n in run.nodes if n not in minority] + ["etcd"] + list(co.controllers)
    t0 = split(run, minority, majority, how="master and one voter from the rest, etcd and the controllers",
               rest=majority)
    run.fault("expect_no_put_ok", [m], start=t0 + 0.2, end=None)
    got = co.wait_master(not_name=m, above_epoch=e0, timeout=ttl_of(run) + 30)
    co.expect("the majority side promotes one of its nodes", got is not None and got[0] not in minority,
              promoted=got)
    time.sleep(rng.uniform(1.5, 3))
    minority_oks = put_oks(run, node=m, since=t0 + 0.2, until=time.time())
    co.figures["minority_put_ok_after_cut"] = len(minority_oks)
    run.net.heal()
    t_heal = time.time()
    run.fault("heal", list(run.nodes) + ["etcd"] + list(co.controllers))
    epoch = got[1] if got else e0 + 1
    for n in minority:
        st = co.wait_role(n, "SLAVE", epoch, timeout=40)
        co.expect(f"{n} rejoins as a slave after the heal", st is not None,
                  status=st and {k: st[k] for k in ("role", "epoch", "max_offset")})
    run.fault("expect_no_put_ok_end", [m], end=time.time())
    co.figures["heal_t"] = t_heal
    new = got[0] if got else None
    run.post = lambda hist: expect_failover_record(co, hist, e0, m, new)


def sc_controller_cut_off(run, wl, rng, co):
    """Phase 1: the active controller cut off from every node (it still reaches etcd, so it
    stays active) for two TTLs: nothing happens (no promotion, PUT_OKs go on). Phase 2: it is
    cut off from etcd too: its campaign lease expires and the standby takes over; then the
    master is killed: the standby fails it over, and the history names the standby."""
    settle(rng)
    m = run.master
    e0 = co.epoch_of(m)
    active = co.active_controller()
    if active is None:
        co.expect("an active controller is known", False)
        return
    standby = [c for c in co.controllers if c != active][0]
    t0 = time.time()
    run.fault_t = t0
    for n in run.nodes:
        run.net.partition(active, n)
    run.fault("partition", [active] + list(run.nodes), how="the active controller from every node")
    time.sleep(2 * ttl_of(run) + rng.uniform(0, 1))
    t1 = time.time()
    co.expect("no master change while the active controller cannot reach the nodes",
              not master_changes(co, t0), changes=master_changes(co, t0))
    co.expect("PUT_OKs go on while the controller is cut off", len(put_oks(run, since=t0, until=t1)) > 0,
              put_ok=len(put_oks(run, since=t0, until=t1)))
    run.net.partition(active, "etcd")
    run.net.partition(active, standby)
    run.fault("partition", [active, "etcd", standby], how="the active controller from etcd too")
    names = {v: k for k, v in CONTROLLERS.items()}
    took = wait_for(lambda: (s := co.observer.samples[-1]) and names.get(s.get("controller")) == standby,
                    ttl_of(run) + 15, 0.2)
    run.fault("bite", [standby], fault="the active controller cut off", ok=bool(took),
              evidence=co.observer.samples[-1] if co.observer.samples else None)
    old, new, epoch, t = kill_and_replace(run, co, rng, why="the standby controller must fail it over")
    if new:
        failover_figure(run, co, old, new, epoch, t)
    run.net.heal()
    run.fault("heal", list(run.nodes) + [active, "etcd", standby])
    restart_and_rejoin(run, co, old, epoch or e0 + 1)

    def post(hist):
        p = expect_failover_record(co, hist, e0, old, new)
        if p:
            co.expect("the standby controller made the failover",
                      p[0].get("controller") == CONTROLLERS[standby],
                      controller=p[0].get("controller"), standby=CONTROLLERS[standby])
    run.post = post


def sc_etcd_down(run, wl, rng, co):
    """etcd stopped for a while (SIGSTOP, or kill -9 and a restart on its data dir: the seed
    picks), longer than two TTLs, then back: no promotion when it returns (the leases it finds
    expired belong to members that still serve, and the pre-vote holds), no flapping (the
    master never changes), and the master keeps serving SYNC meanwhile."""
    settle(rng)
    m = run.master
    e0 = co.epoch_of(m)
    how = rng.choice(["sigstop", "kill9"])
    t0 = time.time()
    run.fault_t = t0
    if how == "sigstop":
        co.etcd.pause()
    else:
        co.etcd.kill9()
    run.fault(f"etcd_{how}", ["etcd"])
    time.sleep(2 * ttl_of(run) + rng.uniform(1, 3))
    t1 = time.time()
    if how == "sigstop":
        co.etcd.resume()
        run.fault("etcd_sigcont", ["etcd"])
    else:
        co.etcd.start_healthy()
        run.fault("etcd_restart", ["etcd"])
    down = put_oks(run, node=m, since=t0 + 0.5, until=t1)
    co.expect("the master keeps serving SYNC while etcd is down", len(down) > 0, put_ok=len(down))
    time.sleep(2 * ttl_of(run) + rng.uniform(0, 1))  # flapping would show here
    co.expect("no master change (no flapping)", not master_changes(co, t0),
              changes=master_changes(co, t0), how=how)
    run.post = lambda hist: (
        expect_promotions(co, hist, e0, 0, "no promotion after etcd came back", how=how),
        expect_no_epoch_change(run, co, e0))


PAUSE_RE = re.compile(r"writes paused ([0-9.]+)(ms|s)")


def switchover(run, co, rng):
    """`hasync switchover --group g1` through a node; returns the figure."""
    old = run.master
    e0 = co.epoch_of(old)
    via = rng.choice(list(run.nodes))
    t0 = time.time()
    code, out, err = cli(run, ["switchover", "--group", GROUP, "--grpc", run.nodes[via].grpc_addr,
                               "--timeout", "30s"], timeout=40)
    t1 = time.time()
    m = PAUSE_RE.search(out)
    pause_ms = None if not m else float(m.group(1)) * (1000 if m.group(2) == "s" else 1)
    run.fault("switchover", [old], via=via, exit=code, output=(out + err).strip()[:300],
              pause_ms=pause_ms)
    got = co.wait_master(not_name=old, above_epoch=e0, timeout=15)
    co.expect(f"switchover from {old} done (exit 0) and a new master serves", code == 0 and got is not None,
              exit=code, output=(out + err).strip()[:300], new=got)
    first = wait_for(lambda: first_put_ok(run, got[0], t0, min_epoch=got[1]), 10, 0.2) if got else None
    time.sleep(1.0)
    fig = {"t0": t0, "t1": t1, "reported_pause_ms": pause_ms,
           "client_gap_s": round(longest_gap(run, t0 - 0.5, t1 + 0.5), 3),
           "first_put_ok_new_s": None if first is None else round(first - t0, 3),
           "old": old, "new": got and got[0]}
    co.figures.setdefault("switchovers", []).append(fig)
    co.write()
    return fig, old, got


def sc_switchover_under_load(run, wl, rng, co):
    """`hasync switchover --group g1` (the controller's pick) while the producers run, twice:
    each drains the master, promotes a caught-up voter and demotes the old one with no PUT_OK
    lost; the write pause it reports is recorded (figures.json), with the longest gap between
    PUT_OKs the clients saw. Two switchovers in the history, no failover."""
    settle(rng)
    e0 = co.epoch_of(run.master)
    run.fault_t = time.time()
    rounds = []
    for _ in range(2):
        fig, old, got = switchover(run, co, rng)
        rounds.append((old, got))
        settle(rng, 1.5, 3)

    def post(hist):
        p = expect_promotions(co, hist, e0, len(rounds), "one switchover per request, nothing else")
        co.expect("every promotion is a switchover", all(e.get("kind") == "switchover" for e in p),
                  kinds=[e.get("kind") for e in p])
    run.post = post


def sc_flapping(run, wl, rng, co):
    """kill -9 the master again and again (three times); each time the seed picks whether it is
    restarted at once (before its lease expires) or after the controller replaced it. At most
    one promotion per kill, and the group serves at the end."""
    e0 = co.epoch_of(run.master)
    kills = 0
    run.fault_t = None
    for r in range(3):
        settle(rng, 1.5, 3)
        old = run.master
        ebefore = co.epoch_of(old) or 0
        fast = rng.random() < 0.5
        t = time.time()
        run.fault_t = run.fault_t or t
        run.nodes[old].kill9()
        kills += 1
        run.fault("kill9", [old], round=r, restart="at once" if fast else "after the failover")
        if fast:
            time.sleep(rng.uniform(0.1, 1.0))
            run.nodes[old].start(wait=False)
            run.fault("restart", [old], why="before its lease expired")
            got = wait_for(lambda: (b := co.router.pick()) and time.time() - t > 1 and b, ttl_of(run) + 30, 0.1)
            co.expect(f"round {r}: a master serves again", bool(got), master=got)
        else:
            got = co.wait_master(not_name=old, above_epoch=ebefore, timeout=ttl_of(run) + 30)
            co.expect(f"round {r}: a new master", bool(got), master=got)
            if got:
                failover_figure(run, co, old, got[0], got[1], t)
            time.sleep(rng.uniform(0.2, 1.0))
            run.nodes[old].start(wait=False)
            run.fault("restart", [old])
    # every node runs and follows the current master before the heal
    top = co.router.pick()
    for n in run.nodes:
        if top and n != top[0]:
            st = co.wait_role(n, "SLAVE", top[1], timeout=40)
            co.expect(f"{n} follows the final master", st is not None)

    def post(hist):
        p = promotions(hist, e0)
        co.expect("at most one promotion per kill", len(p) <= kills, promotions=len(p), kills=kills)
    run.post = post


def sc_async_failover(run, wl, rng, co):
    """ASYNC with coordinator.async-failover = true: kill -9 the master; the controller
    promotes the best caught-up slave within max-lag-on-failover; the history records the
    loss bound. The checker allows a lost PUT_OK only at or beyond the chosen candidate's end
    offset (the history record's), answered by the old master within its lag before the kill."""
    settle(rng)
    e0 = co.epoch_of(run.master)
    old, new, epoch, t = kill_and_replace(run, co, rng)
    if new:
        failover_figure(run, co, old, new, epoch, t)
    hist = wait_for(lambda: (h := cluster_json(run, "history")) and promotions(h, e0) and h, 15, 0.5)
    p = promotions(hist, e0) if hist else []
    chosen = next((c for c in (p[0].get("candidates") or []) if c.get("chosen")), None) if p else None
    lags = [x["lag_millis"] for s in wl.monitors[old].samples
            if s.get("up") and t - 2.0 <= s["t"] <= t
            for x in s.get("slaves", []) if x["node_name"] == new]
    run.faults.write({
        "t": t, "kind": "async_bound", "nodes": [new],
        "detail": {
            "old_master": old, "promoted": new, "fault_t": t,
            # the history record's statement: what the chosen candidate held when fenced
            "ack_offset": chosen.get("end_offset") if chosen else None,
            "lag_millis": max(lags) if lags else 0,
            "loss_bound_bytes": p[0].get("loss_bound_bytes") if p else None,
            "source": "cluster history (chosen candidate's end offset)",
        },
    })
    co.expect("the history records the failover's loss bound", bool(p) and p[0].get("loss_bound_bytes") is not None,
              entry=p[0] if p else None)
    time.sleep(rng.uniform(0.5, 1.5))
    restart_and_rejoin(run, co, old, epoch or e0 + 1)
    run.post = lambda hist: expect_failover_record(co, hist, e0, old, new)


def sc_master_and_voter_isolated_k1(run, wl, rng, co):
    """Three nodes, SYNC k = 1: the master and one voter cut off from the third node, etcd and
    the controllers. The master's lease expires and the pre-vote passes (one of the two other
    voters hears it), but only the third node can be fenced and |V| - k = 2 are needed: the
    controller must not promote (`too_few_fenced`); the minority master may go on serving on
    its voter's acks (nobody else can be promoted). Healed, the group serves at its epoch and
    the third node follows the master again."""
    settle(rng)
    m = run.master
    e0 = co.epoch_of(m)
    v = rng.choice(run.slaves())
    minority = [m, v]
    rest = [n for n in run.nodes if n not in minority]
    majority = rest + ["etcd"] + list(co.controllers)
    t0 = split(run, minority, majority, how="master and one voter from the rest, etcd and the controllers",
               rest=majority)
    time.sleep(ttl_of(run) + rng.uniform(5, 7))
    seen = co.observer.since(t0)
    reasons = sorted({s.get("blocked_reason") for s in seen if s.get("blocked_reason")})
    run.fault("bite", [m], fault="master's lease expired, the failover blocked",
              ok="too_few_fenced" in reasons, evidence={"blocked_reasons": reasons})
    t1 = time.time()
    co.figures["minority_put_ok_during_cut"] = len(put_oks(run, node=m, since=t0 + 0.5, until=t1))
    co.expect("no master change during the cut", not master_changes(co, t0),
              changes=master_changes(co, t0))
    run.net.heal()
    run.fault("heal", list(run.nodes) + ["etcd"] + list(co.controllers))
    for n in rest:
        st = co.wait_role(n, "SLAVE", e0, timeout=40)
        co.expect(f"{n} follows the master again after the heal", st is not None and st["epoch"] >= e0,
                  status=st and {k: st[k] for k in ("role", "epoch", "max_offset", "master_link")})

    def post(hist):
        p = promotions(hist, e0)
        # after the heal the controller may move the group on at a new epoch (a failover whose
        # fence outlived the cut); during the cut nothing may be promoted
        during = [e for e in p if e.get("time_unix_ms", 0) / 1000 < t1]
        co.expect("no promotion while too few voters could be fenced", not during,
                  promotions=[{k: e.get(k) for k in ("epoch", "kind", "new_master", "time_unix_ms")} for e in p])
    run.post = post


FENCE_BLOCKED = ("no_voters_reachable", "too_few_fenced")


def sc_kill_master_controller_cut(run, wl, rng, co):
    """The active controller cut off from every node (blackhole routes; it still reaches etcd,
    so it stays active), the standby too or not (the seed picks), then kill -9 the master. The
    master's lease expires and the pre-vote passes (no slave gets a frame), but no Fence
    reaches a voter: the failover is blocked (`no_voters_reachable` or `too_few_fenced` in
    `cluster status --json`: bite), no master change and no promotion during the cut. Healed,
    the controller fences the voters and promotes: exactly one failover, after the heal, by the
    controller that was cut off (the standby must not have acted); the old master restarts and
    rejoins as a slave. The checker finds no PUT_OK lost."""
    settle(rng)
    m = run.master
    e0 = co.epoch_of(m)
    active = co.active_controller()
    if active is None:
        co.expect("an active controller is known", False)
        return
    standby = [c for c in co.controllers if c != active]
    cut = [active] + (standby if standby and rng.random() < 0.5 else [])
    t0 = time.time()
    run.fault_t = t0
    for c in cut:
        for n in run.nodes:
            run.net.partition(c, n)
    run.fault("partition", cut + list(run.nodes),
              how="the controller(s) from every node (etcd still reachable)", cut=cut)
    time.sleep(rng.uniform(0.5, 1.5))
    t_kill = time.time()
    run.nodes[m].kill9()
    run.fault("kill9", [m], why="the controller cannot reach the voters")
    # the lease expires within a TTL, the pre-vote bound passes within ~4 s more; then hold
    hold = ttl_of(run) + rng.uniform(6, 8)
    time.sleep(hold)
    seen = co.observer.since(t_kill)
    reasons = sorted({s.get("blocked_reason") for s in seen if s.get("blocked_reason")})
    blocked = [r for r in reasons if r in FENCE_BLOCKED]
    run.fault("bite", [m], fault="the master dead, its lease expired, no voter reachable",
              ok=bool(blocked), evidence={"blocked_reasons": reasons,
                                          "samples": len(seen)})
    co.figures["blocked_reasons"] = reasons
    t_heal = time.time()
    co.expect("no master change while the controller cannot reach the voters",
              not master_changes(co, t0), changes=master_changes(co, t0))
    co.expect("the failover is blocked for want of fenced voters while cut",
              bool(blocked), blocked_reasons=reasons)
    run.net.heal()
    run.fault("heal", cut + list(run.nodes))
    got = co.wait_master(not_name=m, above_epoch=e0, timeout=ttl_of(run) + 30)
    co.expect("a new master once the controller reaches the voters again", got is not None,
              promoted=got, after_heal_s=round(time.time() - t_heal, 2))
    new, epoch = got if got else (None, None)
    if new:
        first = wait_for(lambda: first_put_ok(run, new, t_heal, min_epoch=epoch), 20, 0.2)
        co.figures["heal_to_first_put_ok_s"] = None if first is None else round(first - t_heal, 3)
        co.expect("a PUT_OK on the new master after the heal", first is not None, new=new)
    restart_and_rejoin(run, co, m, epoch or e0 + 1)

    def post(hist):
        p = expect_failover_record(co, hist, e0, m, new)
        early = promoted_before(run, e0, t_heal)
        co.expect("no node served as master above the initial epoch before the heal", not early,
                  samples=early[:3], heal_t=t_heal)
        if p:
            co.expect("the active controller made it (the standby did not act)",
                      p[0].get("controller") == CONTROLLERS[active],
                      controller=p[0].get("controller"), active=CONTROLLERS[active])
    run.post = post


def promoted_before(run, e0, t):
    """The nodes' status samples before t that show a master above epoch e0."""
    out = []
    with open(os.path.join(run.dir, "status.jsonl")) as f:
        for line in f:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if r.get("t", t) < t and r.get("role") == "MASTER" and (r.get("epoch") or 0) > e0:
                out.append({k: r.get(k) for k in ("t", "node", "epoch", "fenced")})
    return out


def etcd_leader(run):
    """The namespace of the etcd member that leads (its /metrics), or None."""
    for e in run.etcds:
        if e.is_leader():
            return e.ns
    return None


def sc_etcd_minority_with_master(run, wl, rng, co):
    """Three etcd members. The master and one etcd member (the seed picks: the etcd leader, or
    a follower) are cut off from the two other etcd members, the other nodes and the
    controllers (the clients still reach everyone). The minority etcd member has no quorum, so
    the master cannot renew its lease; its slaves get no frames from it and cannot ack, so it
    takes no PUT_OK (the checker's cut-off window). The majority side (a new etcd leader if the
    old one was cut) expires the master's lease, fences both slaves (|V| - k = 2) and promotes
    one. Healed, the old master rejoins as a slave, the etcd member rejoins its cluster, and
    the checker finds no PUT_OK lost (SYNC). Exactly one failover."""
    settle(rng)
    m = run.master
    e0 = co.epoch_of(m)
    leader = wait_for(lambda: etcd_leader(run), 10, 0.2)
    which = rng.choice(["leader", "follower"])
    names = [e.ns for e in run.etcds]
    if which == "leader" and leader:
        e_cut = leader
    else:
        e_cut = rng.choice([n for n in names if n != leader])
    minority = [m, e_cut]
    majority = ([n for n in run.nodes if n != m] + [n for n in names if n != e_cut]
                + list(co.controllers))
    t0 = split(run, minority, majority, how=f"the master and the etcd {which} from the rest",
               etcd_leader=leader, rest=majority)
    run.fault("expect_no_put_ok", [m], start=t0 + 0.2, end=None)
    got = co.wait_master(not_name=m, above_epoch=e0, timeout=ttl_of(run) + 30)
    co.expect("the majority side promotes one of its nodes", got is not None and got[0] != m,
              promoted=got, etcd_cut=e_cut, which=which)
    if got:
        run.fault("promoted", [got[0]], epoch=got[1], after_s=round(time.time() - t0, 2))
        co.figures["cut_to_promotion_s"] = round(time.time() - t0, 3)
        first = wait_for(lambda: first_put_ok(run, got[0], t0, min_epoch=got[1]), 20, 0.2)
        co.expect("a PUT_OK on the new master during the cut", first is not None, new=got[0])
    co.figures["etcd_majority_leader"] = wait_for(lambda: etcd_leader_among(run, e_cut), 10, 0.2)
    time.sleep(rng.uniform(1.5, 3))
    minority_oks = put_oks(run, node=m, since=t0 + 0.2, until=time.time())
    co.figures["minority_put_ok_after_cut"] = len(minority_oks)
    co.expect("no PUT_OK from the minority master after the cut", not minority_oks,
              examples=[{k: r.get(k) for k in ("tag", "t", "epoch", "offset")} for r in minority_oks[:5]])
    run.net.heal()
    run.fault("heal", minority + majority)
    epoch = got[1] if got else e0 + 1
    st = co.wait_role(m, "SLAVE", epoch, timeout=40)
    co.expect(f"{m} rejoins as a slave after the heal", st is not None,
              status=st and {k: st[k] for k in ("role", "epoch", "max_offset")})
    run.fault("expect_no_put_ok_end", [m], end=time.time())
    healthy = wait_for(lambda: all(e.healthy() for e in run.etcds), 20, 0.2)
    co.expect("every etcd member is healthy again after the heal", healthy,
              members=[e.ns for e in run.etcds])
    new = got[0] if got else None
    run.post = lambda hist: expect_failover_record(co, hist, e0, m, new)


def etcd_leader_among(run, excluded):
    """The leader as the members other than `excluded` see it."""
    for e in run.etcds:
        if e.ns != excluded and e.is_leader():
            return e.ns
    return None
