"""One scenario run: the cluster, the workload, the fault schedule, the harness as orchestrator.

The coordinator scenarios (`coord-*`, coord.py) leave the orchestration to the controller; in
the others the harness plays the orchestrator and runs docs/failover.md:
fence the old master (it is dead, or the harness cuts it off from every other node), wait until
at least (slaves - k + 1) slaves answer (restarting a killed one if it must), promote the one
with the highest offset with the next epoch, repoint the other slaves, then demote the old
master with the same epoch once it runs again. Every step is logged to faults.jsonl.

`run_scenario(name, seed, out_dir, binary)` runs one scenario in this process, which must
already be inside the run's client namespace (main.py's child does that) and returns the run
directory; the checker runs afterwards on what it left there.
"""

import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time

import grpc

from . import coord as coordmod
from . import net as netmod
from . import proxy as proxymod
from .cluster import Node
from .jsonl import Writer
from .workload import Workload

PROXY_PORT = 10999
# The length of the load phases (the load before a scenario's first fault, after the heal)
# relative to the full run's: `--smoke` runs them at half length (main.py, `--load-scale`);
# the faults' own timings never scale. run.json records it; `--replay` uses it again.
LOAD_SCALE = 1.0

DEFAULT_PARAMS = {
    "segment_size": "1MiB",
    "flush": "async",
    "slave_timeout": "1s",
    "put_timeout": 4.0,
    "producers": 3,
    "max_pad": 512,
    "max_message_size": "64KiB",
}


class Run:
    """What one scenario run shares: nodes, the current master, the logs."""

    def __init__(self, name, seed, out_dir, binary, net, spec, overrides=None):
        self.name, self.seed, self.spec = name, seed, spec
        self.binary = binary
        self.coord = None  # coordinator mode: the Coord of coord.py
        self.coord_params = (
            {**coordmod.COORD_PARAMS, **spec.get("coord_params", {}), **(overrides or {})}
            if spec.get("coord") else None
        )
        self.dir = os.path.join(out_dir, f"{name}-s{seed}")
        if os.path.exists(self.dir):
            shutil.rmtree(self.dir)
        os.makedirs(os.path.join(self.dir, "final"))
        self.mode, self.k = spec["mode"], spec["k"]
        self.params = {**DEFAULT_PARAMS, **spec.get("params", {})}
        self.net = net
        self.nodes = {
            n: Node(self, n, net.ips[n], net.nsenter(n), binary) for n in net.nodes
        }
        self.master = net.nodes[0]
        self.history = Writer(os.path.join(self.dir, "history.jsonl"))
        self.reads = Writer(os.path.join(self.dir, "reads.jsonl"))
        self.status_log = Writer(os.path.join(self.dir, "status.jsonl"))
        self.faults = Writer(os.path.join(self.dir, "faults.jsonl"))
        self.proxies = {}
        self.faults_seen = []
        self.max_issued = 0  # the highest epoch the orchestrator issued
        self.info = {
            "scenario": name, "seed": seed, "mode": self.mode, "k": self.k,
            "nodes": {
                n: {"grpc": x.grpc_addr, "ha": x.ha_addr, "data_dir": x.data_dir}
                for n, x in self.nodes.items()
            },
            "initial_master": self.master, "final_master": None,
            "expect": spec.get("expect", []), "heal_t": None, "converged_t": None,
            "params": self.params, "description": spec["doc"], "load_scale": LOAD_SCALE,
        }
        if self.coord_params:
            self.info["coordinator"] = dict(self.coord_params)
            self.routes = Writer(os.path.join(self.dir, "routes.jsonl"))
            self.coord_log = Writer(os.path.join(self.dir, "coord.jsonl"))
        self.write_info()

    def write_info(self):
        with open(os.path.join(self.dir, "run.json"), "w") as f:
            json.dump(self.info, f, indent=1)

    def fault(self, kind, nodes, **detail):
        rec = {"t": time.time(), "kind": kind, "nodes": list(nodes), "detail": detail}
        self.faults_seen.append(rec)
        self.faults.write(rec)

    def slaves(self):
        return [n for n in self.nodes if n != self.master]

    # ---- proxies (a userspace proxy in a slave's namespace on its HA link)

    def start_proxy(self, slave, master):
        sock = os.path.join(self.dir, f"proxy-{slave}.sock")
        log = open(os.path.join(self.dir, "logs", f"proxy-{slave}.log"), "ab")
        pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        proc = subprocess.Popen(
            self.net.nsenter(slave) + [sys.executable, "-m", "chaos.proxy",
                                       "--listen", f"127.0.0.1:{PROXY_PORT}",
                                       "--target", self.nodes[master].ha_addr,
                                       "--control", sock],
            cwd=pkg, stdout=log, stderr=log, start_new_session=True,
        )
        log.close()
        for _ in range(100):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
        self.proxies[slave] = (proc, sock)
        return f"127.0.0.1:{PROXY_PORT}"

    def set_proxy(self, slave, **settings):
        now = proxymod.set_link(self.proxies[slave][1], **settings)
        self.fault("proxy", [slave], **now)
        return now

    def stop_proxies(self):
        for proc, _ in self.proxies.values():
            proc.kill()
            proc.wait(5)
        self.proxies.clear()

    # ---- a full disk: the node's data dir on a small tmpfs

    def mount_tmpfs(self, name, size):
        node = self.nodes[name]
        mnt = os.path.join(self.dir, "mnt", name)
        os.makedirs(mnt, exist_ok=True)
        netmod.sh("mount", "-t", "tmpfs", "-o", f"size={size}", f"{netmod.BASE}{os.getpid()}-{name}", mnt)
        node.mount = mnt
        node.data_dir = os.path.join(mnt, "data")
        self.info["nodes"][name]["data_dir"] = node.data_dir

    def fill_disk(self, name, leave_bytes):
        node = self.nodes[name]
        st = os.statvfs(node.mount)
        free = st.f_bavail * st.f_frsize
        size = max(0, free - leave_bytes)
        with open(os.path.join(node.mount, "filler"), "wb") as f:
            chunk = b"\0" * (1 << 20)
            while size > 0:
                n = min(size, len(chunk))
                try:
                    f.write(chunk[:n])
                    f.flush()
                except OSError:
                    break
                size -= n
        self.fault("fill_disk", [name], free_before=free, left=leave_bytes)

    def free_disk(self, name):
        os.unlink(os.path.join(self.nodes[name].mount, "filler"))
        self.fault("free_disk", [name])

    def unmount_all(self):
        """Copies a tmpfs data dir out (the checker and a replay need it), then unmounts."""
        for name, node in self.nodes.items():
            if node.mount:
                dest = os.path.join(self.dir, "data", name)
                if os.path.exists(node.data_dir):
                    shutil.rmtree(dest, ignore_errors=True)
                    shutil.copytree(node.data_dir, dest)
                netmod.sh("umount", "-l", node.mount, check=False)
                node.mount = None
                node.data_dir = dest
                self.info["nodes"][name]["data_dir"] = dest


# ---- the orchestrator (docs/failover.md, played by the harness)


def wait_for(pred, timeout, step=0.1):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return None


def retry(fn, attempts=10, delay=0.5):
    last = None
    for _ in range(attempts):
        try:
            return fn()
        except grpc.RpcError as e:
            last = e
            time.sleep(delay)
    raise RuntimeError(f"gave up after {attempts} attempts: {last.code().name}: {last.details()}")


def start_cluster(run, proxied=()):
    """The initial group: the first node master, the others its slaves (some through a proxy)."""
    master = run.nodes[run.master]
    master.write_config("master")
    master.start()
    for s in run.slaves():
        ha = run.start_proxy(s, run.master) if s in proxied else None
        run.nodes[s].write_config("slave", master, master_ha=ha)
        run.nodes[s].start()
    # wait until every slave is connected (bounded)
    ok = wait_for(lambda: (st := master.status()) and len(st["slaves"]) >= len(run.slaves()), 30)
    if not ok:
        raise RuntimeError(f"slaves did not connect: {master.status()}")


def fence(run, old, cut_off):
    """Step 1: the old master cannot acknowledge anything any more: dead, or cut off."""
    node = run.nodes[old]
    if node.alive() and cut_off:
        for other in run.nodes:
            if other != old:
                run.net.partition(old, other)
        run.fault("fence", [old], how="cut off from every other node (blackhole both ways)")
    else:
        run.fault("fence", [old], how="dead" if not node.alive() else "not fenced")


def failover(run, wl, old, pick=None, fenced=None, restart_old=True, force_repoint=False,
             promote_only=False):
    """Runs the runbook: fence, promote the best slave, repoint the others, demote the old
    (`promote_only`: stops after the promotion; the scenario repoints).

    `fenced` names how the scenario already fenced the old master (then the harness neither
    cuts it off nor lifts the cut: the scenario heals); otherwise the harness cuts a live old
    master off and lifts the cut once every slave follows the new master."""
    if fenced:
        run.fault("fence", [old], how=fenced)
    else:
        fence(run, old, cut_off=True)
    slaves = [n for n in run.nodes if n != old]
    need = len(slaves) - run.k + 1

    def answered():
        got = {}
        for n in slaves:
            st = run.nodes[n].status(timeout=1)
            if st is not None:
                got[n] = st
        return got if len(got) >= need else None

    got = answered()
    if got is None:
        for n in slaves:  # restart a killed slave: the rule needs its answer
            if not run.nodes[n].alive():
                run.nodes[n].start()
                run.fault("restart", [n], why=f"the promotion needs {need} slaves' answers")
        got = wait_for(answered, 30)
        if got is None:
            raise RuntimeError(f"fewer than {need} slaves answered")
    # above every epoch any node reported and every epoch this orchestrator ever issued (a node
    # promoted and killed at once may never have shown its epoch to anyone: an orchestrator
    # keeps what it issued, as a coordinator's store would)
    epoch = 1 + max([st["epoch"] for st in got.values()] + [max_epoch_seen(run), run.max_issued])
    run.max_issued = epoch
    best = max(sorted(got), key=lambda n: got[n]["max_offset"])
    chosen = pick or best
    if run.mode == "ASYNC":
        record_async_bound(run, wl, old, chosen)
    run.fault("promote", [chosen], epoch=epoch, answered={n: got[n]["max_offset"] for n in got},
              rule_pick=best, deliberate_wrong_pick=chosen != best)
    retry(lambda: run.nodes[chosen].change_role("master", epoch))
    run.master = chosen
    if promote_only:  # the scenario repoints (or does not) itself
        return chosen, epoch
    new = run.nodes[chosen]
    for n in slaves:
        if n != chosen:
            repoint(run, n, new, epoch, force_repoint)
    if run.net.blackholes and not fenced:
        run.net.heal()
        run.fault("heal", list(run.nodes), why="fence lifted: every slave follows the new master")
    if restart_old:
        if not run.nodes[old].alive():
            run.nodes[old].start()
            run.fault("restart", [old])
        repoint(run, old, new, epoch, force_repoint)
    return chosen, epoch


def repoint(run, n, new, epoch, force):
    node = run.nodes[n]
    if node.paused:
        node.resume()
        run.fault("sigcont", [n])
    if not node.alive():
        node.start()
        run.fault("restart", [n])

    def go():
        try:
            return node.change_role("slave", epoch, master=new)
        except grpc.RpcError as e:
            if force and e.code() == grpc.StatusCode.FAILED_PRECONDITION:
                run.fault("force_resync", [n], refusal=e.details())
                return node.change_role("slave", epoch, master=new, force_resync=True)
            raise

    retry(go)
    run.fault("demote", [n], epoch=epoch, master=new.name)


def max_epoch_seen(run):
    seen = [0]
    for m in run.workload.monitors.values():
        for s in m.samples:
            seen.append(s.get("epoch") or 0)
    return max(seen)


def record_async_bound(run, wl, old, promoted):
    """ASYNC: what the old master last reported, before the fault, of the slave now promoted
    (the loss the checker allows): its last ack offset and the largest lag in the 2 s before
    the fault. ack_offset null when the master never reported it (nothing is allowed then)."""
    ip = run.nodes[promoted].ip

    def entry_of(sample):
        # the master names a registered slave; one counted by its IP (its HA link through a
        # proxy cannot match its registration) shows only its address
        return next((x for x in sample.get("slaves", [])
                     if x["node_name"] == promoted or x["address"].rsplit(":", 1)[0] == ip), None)

    before = [x for x in wl.monitors[old].samples if x.get("up") and x["t"] <= run.fault_t]
    found = [(x, entry_of(x)) for x in before]
    found = [(x, e) for x, e in found if e is not None]
    last = found[-1] if found else None
    lags = [e["lag_millis"] for x, e in found if x["t"] >= run.fault_t - 2.0]
    run.faults.write({
        "t": run.fault_t, "kind": "async_bound", "nodes": [promoted],
        "detail": {
            "old_master": old, "promoted": promoted, "fault_t": run.fault_t,
            "ack_offset": last[1]["ack_offset"] if last else None,
            "lag_millis": max(lags) if lags else (last[1]["lag_millis"] if last else 0),
            "sample_t": last[0]["t"] if last else None,
        },
    })


def converge(run, timeout=60):
    """Waits until every node holds the master's max offset (3 checks in a row); returns the
    time of the first of them."""
    streak, first = 0, None
    deadline = time.time() + timeout
    while time.time() < deadline:
        now = time.time()
        sts = {n: x.status(timeout=1) for n, x in run.nodes.items()}
        m = sts.get(run.master)
        if m and all(s is not None for s in sts.values()) and all(
            s["max_offset"] == m["max_offset"] for s in sts.values()
        ) and all(s["role"] == "SLAVE" for n, s in sts.items() if n != run.master):
            streak += 1
            first = first or now
            if streak >= 3:
                return first
        else:
            streak, first = 0, None
        time.sleep(0.3)
    return None


# ---- scenarios


def sleep(rng, lo, hi):
    time.sleep(rng.uniform(lo, hi))


def load(rng, lo, hi):
    """A load phase: producers run, no fault; LOAD_SCALE times a uniform draw in [lo, hi]
    (one draw whatever the scale, so a seed's schedule keeps its shape)."""
    time.sleep(rng.uniform(lo, hi) * LOAD_SCALE)


def sc_kill_master(run, wl, rng, and_a_slave=False):
    """kill -9 the master (and, with and_a_slave, one slave at the same moment) under load;
    the orchestrator notices a little later and fails over."""
    sleep(rng, 2, 4)
    old = run.master
    victims = [old] + ([rng.choice(run.slaves())] if and_a_slave else [])
    run.fault_t = time.time()
    for v in victims:
        run.nodes[v].kill9()
    run.fault("kill9", victims)
    time.sleep(rng.uniform(0.2, 1.0))  # detection
    failover(run, wl, old)


def sc_kill_master_and_slave(run, wl, rng):
    sc_kill_master(run, wl, rng, and_a_slave=True)


def sc_pause_master(run, wl, rng):
    sleep(rng, 2, 3)
    m = run.master
    run.nodes[m].pause()
    run.fault("sigstop", [m])
    time.sleep(rng.uniform(2.5, 4))  # past the slave timeout (1 s) and the put deadline
    run.nodes[m].resume()
    run.fault("sigcont", [m])


def sc_pause_failover(run, wl, rng):
    load(rng, 2, 3)
    old = run.master
    run.fault_t = time.time()
    run.nodes[old].pause()
    run.fault("sigstop", [old])
    time.sleep(rng.uniform(1.5, 2.5))  # the orchestrator gives up on it
    # cut it off, promote and repoint while it is paused; then it resumes as a zombie
    fence(run, old, cut_off=True)
    run.fault("expect_no_put_ok", [old], start=time.time(), end=None)
    chosen, epoch = failover(run, wl, old, restart_old=False, fenced="cut off while paused (above)")
    run.nodes[old].resume()
    run.fault("sigcont", [old], why="a zombie master resumes, still cut off")
    time.sleep(rng.uniform(1, 2))  # the stray producer may reach it: no PUT_OK possible
    heal_and_demote(run, old, chosen, epoch)


def heal_and_demote(run, old, chosen, epoch):
    """Lifts the cut around a fenced old master and demotes it. Healed, it still has no slave
    (every slave follows the new master), so the no-PUT_OK window closes only at the demotion."""
    run.net.heal()
    run.fault("heal", list(run.nodes))
    repoint(run, old, run.nodes[chosen], epoch, False)
    run.fault("expect_no_put_ok_end", [old], end=time.time())


def sc_partition_master(run, wl, rng):
    sleep(rng, 2, 4)
    old = run.master
    for s in run.slaves():
        run.net.partition(old, s)
    run.fault_t = time.time()
    run.fault("partition", [old] + run.slaves(), how="master from every slave, both ways")
    hold = rng.uniform(2, 3)
    time.sleep(hold)
    # SYNC puts on the cut-off master must not be PUT_OK from here on
    run.fault("expect_no_put_ok", [old], start=run.fault_t, end=None)
    chosen, epoch = failover(run, wl, old, fenced="the partition", restart_old=False)
    heal_and_demote(run, old, chosen, epoch)


def sc_oneway_partition(run, wl, rng):
    sleep(rng, 2, 4)
    m = run.master
    out = rng.random() < 0.5
    for s in run.slaves():
        if out:
            run.net.partition_oneway(m, s)
        else:
            run.net.partition_oneway(s, m)
    run.fault_t = time.time()
    run.fault("partition_oneway", [m] + run.slaves(),
              how="master's packets to the slaves dropped" if out else "slaves' packets to the master dropped")
    run.fault("expect_no_put_ok", [m], start=run.fault_t + 0.2, end=None)
    time.sleep(rng.uniform(2, 3))
    run.net.heal()
    t = time.time()
    run.fault("heal", list(run.nodes))
    run.fault("expect_no_put_ok_end", [m], end=t)


def sc_slow_slave(run, wl, rng):
    """One slave's HA link slower than the load (delay and a bandwidth below the put rate), so
    it falls behind; the master dies; the promotion must pick the other slave."""
    slow = run.slaves()[-1]
    run.set_proxy(slow, delay_ms=rng.choice([20, 50]), rate=rng.choice([32, 64]) * 1024)
    sleep(rng, 3, 5)
    old = run.master
    run.fault_t = time.time()
    run.nodes[old].kill9()
    run.fault("kill9", [old])
    time.sleep(0.5)
    chosen, _ = failover(run, wl, old)
    answered = [f for f in run.faults_seen if f["kind"] == "promote"][-1]["detail"]["answered"]
    run.set_proxy(slow, delay_ms=0, rate=0)
    fast = [n for n in answered if n != slow]
    ok = slow in answered and all(answered[slow] < answered[n] for n in fast) and chosen != slow
    run.fault("bite", [slow], fault="slow slave", ok=ok,
              evidence=f"answered offsets {answered}, promoted {chosen}")


def fill_until_stalled(run, rng):
    """Fills the last slave's disk and waits (bounded) until its log stalls while the master's
    grows: the `bite` record says whether the full disk took effect. Returns the slave."""
    full = run.slaves()[-1]
    sleep(rng, 1.5, 2.5)
    run.fill_disk(full, leave_bytes=rng.choice([0, 16 * 1024]))
    master, slave = run.nodes[run.master], run.nodes[full]

    def stalled():
        a, m0 = slave.status(), master.status()
        time.sleep(1.0)
        b, m1 = slave.status(), master.status()
        if a and b and m0 and m1 and a["max_offset"] == b["max_offset"] and m1["max_offset"] > m0["max_offset"]:
            return (b["max_offset"], m1["max_offset"])
        return None

    got = wait_for(stalled, 20, step=0)
    run.fault("bite", [full], fault="disk full", ok=got is not None,
              evidence=f"slave log stalled at {got[0]}, master at {got[1]}" if got
              else "the slave's log kept growing on the full disk")
    return full


def sc_slave_disk_full(run, wl, rng):
    """A slave's disk fills up (small segments, so its next segment cannot be made and its
    writes fail); the harness holds the fault until the slave's log stalls while the master's
    grows, then frees the disk; the slave must catch up."""
    full = fill_until_stalled(run, rng)
    time.sleep(rng.uniform(1, 3))
    run.free_disk(full)


def sc_slave_crash_loop(run, wl, rng):
    """A slave absent while the master fills its log, then restarted and killed (-9) again and
    again while it catches up (its HA link throttled, so the catch-up lasts); each kill checks
    the slave was still behind."""
    victim = run.slaves()[-1]
    run.nodes[victim].stop()
    run.fault("stop", [victim], why="absent while the master fills its log")
    run.set_proxy(victim, rate=rng.choice([128, 256]) * 1024)
    time.sleep(rng.uniform(3, 4))
    behind_at_kill = []
    for _ in range(rng.randint(3, 5)):
        run.nodes[victim].start()
        run.fault("restart", [victim])
        time.sleep(rng.uniform(0.3, 1.0))
        v, m = run.nodes[victim].status(), run.nodes[run.master].status()
        lag = (m["max_offset"] - v["max_offset"]) if v and m else None
        run.nodes[victim].kill9()
        run.fault("kill9", [victim], why="during catch-up", lag_bytes=lag)
        behind_at_kill.append(lag)
    run.fault("bite", [victim], fault="crash during catch-up",
              ok=all(x is not None and x > 0 for x in behind_at_kill),
              evidence=f"bytes behind the master at each kill: {behind_at_kill}")
    run.set_proxy(victim, rate=0)
    run.nodes[victim].start()
    run.fault("restart", [victim])


def sc_double_failover(run, wl, rng):
    """Two failovers in a row: the second while the demoted first master may still catch up."""
    sc_kill_master(run, wl, rng)
    time.sleep(rng.uniform(0.3, 2.0))
    sc_kill_master(run, wl, rng)


def sc_pause_slave_k2(run, wl, rng):
    """k = 2: one slave hangs (SIGSTOP), so no put can be acknowledged by two slaves; it
    resumes, catches up, and then the master dies and the group fails over."""
    sleep(rng, 2, 3)
    victim = rng.choice(run.slaves())
    run.nodes[victim].pause()
    t = time.time()
    run.fault("sigstop", [victim])
    # anything sent after the pause (plus a little slack for acks already in flight) needs
    # the paused slave's ack: no PUT_OK until it resumes
    run.fault("expect_no_put_ok", [run.master], start=t + 0.2, end=None)
    time.sleep(rng.uniform(2, 3))
    run.nodes[victim].resume()
    run.fault("sigcont", [victim])
    run.fault("expect_no_put_ok_end", [run.master], end=time.time())
    time.sleep(rng.uniform(1, 2))
    sc_kill_master(run, wl, rng)


def sc_async_failover(run, wl, rng):
    """ASYNC: both slaves' HA links delayed, then the master's host fails: its link stalls and
    drops what was in flight, and the process dies (kill -9). The failover loses what the
    promoted slave lacked, which the checker bounds by what the master last reported."""
    for s in run.slaves():
        run.set_proxy(s, delay_ms=rng.choice([30, 60, 100]))
    load(rng, 2, 4)
    old = run.master
    run.fault_t = time.time()
    for s in run.slaves():
        run.set_proxy(s, stall=True)
    run.nodes[old].kill9()
    run.fault("kill9", [old], why="the host fails: its HA links stall and drop what they held")
    for s in run.slaves():
        run.set_proxy(s, drop=True)
        run.set_proxy(s, stall=False, delay_ms=0)
    time.sleep(rng.uniform(0.2, 1.0))
    failover(run, wl, old)


def sc_wrong_promotion(run, wl, rng):
    """Negative control: promote the slave that did not ack (stalled by the proxy)."""
    stalled = run.slaves()[-1]
    load(rng, 1, 2)
    run.set_proxy(stalled, stall=True)
    time.sleep(rng.uniform(2, 3))
    old = run.master
    run.fault_t = time.time()
    run.nodes[old].kill9()
    run.fault("kill9", [old])
    run.stop_proxies()
    failover(run, wl, old, pick=stalled, force_repoint=True)


# ---- the hunt: nastier schedules (issue 16, point 8)


def kill_current_master(run, rng, why=None):
    old = run.master
    run.fault_t = time.time()
    run.nodes[old].kill9()
    run.fault("kill9", [old], **({"why": why} if why else {}))
    return old


def kill_and_promote(run, wl, rng):
    """Under load, kill -9 the master and promote the best slave (the other not repointed
    yet). Returns (the old master, the new one)."""
    sleep(rng, 2, 4)
    old = kill_current_master(run, rng)
    time.sleep(rng.uniform(0.2, 0.8))
    chosen, _ = failover(run, wl, old, promote_only=True)
    return old, chosen


def sc_kill_new_master(run, wl, rng):
    """The master dies; the harness promotes the best slave and, before it repoints the other
    slave, the new master dies too (kill -9): the group fails over again, from a master that
    ran for a moment in the new epoch without a slave, to one of the two others."""
    old, chosen = kill_and_promote(run, wl, rng)
    time.sleep(rng.uniform(0.0, 0.6))
    run.nodes[chosen].kill9()
    run.fault_t = time.time()
    run.fault("kill9", [chosen], why="the new master dies before the other slave is repointed")
    time.sleep(rng.uniform(0.2, 0.8))
    # the rule needs both others (the first master restarted, fenced by its unclean start)
    failover(run, wl, chosen)


def sc_pause_new_master(run, wl, rng):
    """The master dies; right after the promotion (the other slave not yet repointed) the new
    master hangs (SIGSTOP); the harness cuts it off and fails over again; it resumes as a
    zombie of the new epoch, still cut off, then is healed and demoted."""
    old, chosen = kill_and_promote(run, wl, rng)
    time.sleep(rng.uniform(0.0, 0.6))
    run.nodes[chosen].pause()
    run.fault_t = time.time()
    run.fault("sigstop", [chosen], why="the new master hangs right after its promotion")
    time.sleep(rng.uniform(1.5, 2.5))
    fence(run, chosen, cut_off=True)
    run.fault("expect_no_put_ok", [chosen], start=time.time(), end=None)
    second, epoch = failover(run, wl, chosen, restart_old=False, fenced="cut off while paused (above)")
    run.nodes[chosen].resume()
    run.fault("sigcont", [chosen], why="a zombie master of the last epoch resumes, cut off")
    time.sleep(rng.uniform(1, 2))
    heal_and_demote(run, chosen, second, epoch)


def sc_repeated_failovers(run, wl, rng):
    """Four failovers in a row, each to a node other than the last master, each fenced a
    different way: kill -9, a hang (SIGSTOP) and a cut-off, a partition."""
    prev = None
    for i in range(4):
        time.sleep(rng.uniform(0.5, 2.0))
        old = run.master
        how = rng.choice(["kill9", "pause", "partition"])
        run.fault_t = time.time()
        if how == "kill9":
            run.nodes[old].kill9()
            run.fault("kill9", [old], round=i)
            time.sleep(rng.uniform(0.2, 0.8))
            failover(run, wl, old)
        elif how == "pause":
            run.nodes[old].pause()
            run.fault("sigstop", [old], round=i)
            time.sleep(rng.uniform(1.2, 2.0))
            failover(run, wl, old)  # cut off, promote, repoint, heal, resume and demote
        else:
            for s in run.slaves():
                run.net.partition(old, s)
            run.fault("partition", [old] + run.slaves(), how="master from every slave", round=i)
            run.fault("expect_no_put_ok", [old], start=run.fault_t + 0.2, end=None)
            time.sleep(rng.uniform(1.2, 2.0))
            chosen, epoch = failover(run, wl, old, fenced="the partition", restart_old=False)
            heal_and_demote(run, old, chosen, epoch)
        run.fault("round", [run.master], round=i, how=how, previous_master=prev, old=old)
        prev = old


def sc_kill_all(run, wl, rng):
    """Every node dies at once (kill -9) under load; all restart in a random order (the old
    master fenced by its unclean start, the slaves from their configuration), then the runbook
    fails over from the old master to the best slave."""
    sleep(rng, 2, 4)
    old = run.master
    run.fault_t = time.time()
    for n in run.nodes.values():
        n.kill9()
    run.fault("kill9", list(run.nodes), why="every node at once")
    time.sleep(rng.uniform(0.2, 1.0))
    order = list(run.nodes)
    rng.shuffle(order)
    for n in order:
        run.nodes[n].start()
        run.fault("restart", [n])
        time.sleep(rng.uniform(0, 0.5))
    time.sleep(rng.uniform(0.5, 2.0))
    failover(run, wl, old)


def sc_oneway_failover(run, wl, rng):
    """The slaves' packets to the master are dropped (the master hears no ack, the slaves still
    hear it): no PUT_OK; the orchestrator cuts it off and fails over; heal; demote."""
    sleep(rng, 2, 4)
    old = run.master
    for s in run.slaves():
        run.net.partition_oneway(s, old)
    run.fault_t = time.time()
    run.fault("partition_oneway", [old] + run.slaves(), how="slaves' packets to the master dropped")
    run.fault("expect_no_put_ok", [old], start=run.fault_t + 0.2, end=None)
    time.sleep(rng.uniform(1.5, 3))
    for s in run.slaves():
        run.net.partition(old, s)
    chosen, epoch = failover(run, wl, old, fenced="one-way partition, then cut off both ways",
                             restart_old=False)
    time.sleep(rng.uniform(0.5, 1.5))
    run.net.heal()
    run.fault("heal", list(run.nodes))
    repoint(run, old, run.nodes[chosen], epoch, False)
    run.fault("expect_no_put_ok_end", [old], end=time.time())


def sc_mode_flip_failover(run, wl, rng):
    """SYNC, switched to ASYNC and back under load (SetReplicationMode on the master), then
    k raised to 2 while a slave hangs (no PUT_OK), lowered again; once both slaves hold what the
    ASYNC window acknowledged the master dies soon after the last switch; fail over."""
    sleep(rng, 1.5, 3)
    m = run.nodes[run.master]
    m.set_mode("ASYNC")
    run.fault("mode", [run.master], mode="ASYNC")
    time.sleep(rng.uniform(0.5, 1.5))
    m.set_mode("SYNC", k=1)
    t = time.time()
    run.fault("mode", [run.master], mode="SYNC", k=1)
    at = m.status()["max_offset"]

    def caught_up():
        st = m.status()
        return st and len(st["slaves"]) == 2 and all(x["ack_offset"] >= at for x in st["slaves"])

    ok = wait_for(caught_up, 20)
    run.fault("bite", [run.master], fault="both slaves hold the ASYNC window", ok=bool(ok),
              evidence=f"max offset {at} at the switch back, {time.time() - t:.2f}s")
    time.sleep(rng.uniform(0.5, 1.0))
    victim = rng.choice(run.slaves())
    m.set_mode("SYNC", k=2)
    run.fault("mode", [run.master], mode="SYNC", k=2)
    run.nodes[victim].pause()
    t = time.time()
    run.fault("sigstop", [victim])
    run.fault("expect_no_put_ok", [run.master], start=t + 0.2, end=None)
    time.sleep(rng.uniform(1.5, 2.5))
    m.set_mode("SYNC", k=1)
    run.fault("expect_no_put_ok_end", [run.master], end=time.time())
    run.fault("mode", [run.master], mode="SYNC", k=1)
    time.sleep(rng.uniform(0.0, 0.5))
    run.nodes[victim].resume()
    run.fault("sigcont", [victim])
    time.sleep(rng.uniform(0.0, 1.0))
    old = kill_current_master(run, rng)
    time.sleep(rng.uniform(0.2, 0.8))
    failover(run, wl, old)


def sc_kill_during_role_change(run, wl, rng):
    """A ChangeRole raced by kill -9: the promotion's and then the old master's demotion (its
    truncate and catch-up); each node restarts and the harness repeats the exact request (the
    runbook's way out of a half-done change). A change takes a few ms, so the kill often lands
    just after it (no bite is claimed): the repeat then confirms a completed change."""
    sleep(rng, 2, 4)
    old = kill_current_master(run, rng)
    time.sleep(rng.uniform(0.2, 0.8))
    slaves = run.slaves()
    got = {n: run.nodes[n].status(timeout=1) for n in slaves}
    if any(v is None for v in got.values()):
        raise RuntimeError(f"a slave did not answer: {got}")
    epoch = 1 + max([v["epoch"] for v in got.values()] + [max_epoch_seen(run), run.max_issued])
    run.max_issued = epoch
    chosen = max(sorted(got), key=lambda n: got[n]["max_offset"])
    run.fault("promote", [chosen], epoch=epoch, answered={n: got[n]["max_offset"] for n in got},
              rule_pick=chosen, deliberate_wrong_pick=False)
    node = run.nodes[chosen]
    th = threading.Thread(target=lambda: _swallow(lambda: node.change_role("master", epoch)), daemon=True)
    th.start()
    time.sleep(rng.uniform(0.0, 0.05))
    node.kill9()
    run.fault("kill9", [chosen], why="during its promotion")
    th.join(25)
    node.start()
    run.fault("restart", [chosen])
    retry(lambda: node.change_role("master", epoch))
    run.fault("promote_repeat", [chosen], epoch=epoch)
    run.master = chosen
    other = [n for n in slaves if n != chosen][0]
    repoint(run, other, node, epoch, False)
    # the old master: restarted, demoted, killed during the demotion, restarted, demoted again
    o = run.nodes[old]
    o.start()
    run.fault("restart", [old])
    th = threading.Thread(target=lambda: _swallow(lambda: o.change_role("slave", epoch, master=node)),
                          daemon=True)
    th.start()
    time.sleep(rng.uniform(0.0, 0.3))
    o.kill9()
    run.fault("kill9", [old], why="during its demotion")
    th.join(25)
    time.sleep(rng.uniform(0.0, 0.5))
    repoint(run, old, node, epoch, False)


def _swallow(fn):
    try:
        fn()
    except grpc.RpcError:
        pass


def sc_failover_disk_full(run, wl, rng):
    """A slave's disk is full when the master dies: the other slave is promoted and the full
    one is repointed while it cannot write (its role change may fail half-way: the harness
    repeats it); the disk is freed a little later."""
    full = fill_until_stalled(run, rng)
    old = kill_current_master(run, rng)
    time.sleep(rng.uniform(0.2, 0.8))
    chosen, epoch = failover(run, wl, old, promote_only=True)
    threading.Timer(rng.uniform(0.5, 3.0), lambda: run.free_disk(full)).start()
    new = run.nodes[chosen]
    repoint(run, full, new, epoch, False)
    run.nodes[old].start()
    run.fault("restart", [old])
    repoint(run, old, new, epoch, False)


def repromote_first_master(run, wl, rng):
    """The path to a re-promoted master, all by the runbook: the master dies, the best slave is
    promoted and dies before the other is repointed; the rule needs the first master's answer,
    so it restarts (fenced; the other slave follows it again and catches up) and, holding the
    most, is promoted again. Returns (that master, its epoch, the other slave)."""
    first, second = kill_and_promote(run, wl, rng)
    time.sleep(rng.uniform(0.0, 0.3))
    run.nodes[second].kill9()
    run.fault_t = time.time()
    run.fault("kill9", [second], why="the new master dies before the other slave is repointed")
    time.sleep(rng.uniform(0.2, 0.8))
    third = [n for n in run.nodes if n not in (first, second)][0]
    run.nodes[first].start()
    run.fault("restart", [first], why="the promotion needs 2 slaves' answers")
    wait_for(lambda: (a := run.nodes[first].status()) and (b := run.nodes[third].status())
             and b["max_offset"] >= a["max_offset"], 10)
    chosen, epoch = failover(run, wl, second, promote_only=True)
    return chosen, epoch, third


def sc_repromoted_master_slave(run, wl, rng):
    """A master re-promoted at a new epoch while a slave that followed it in the old epoch is
    connected (found by this harness: the master kept its data plane, so the slave followed it
    into the new epoch and acked its records with its own history still ending at the old
    epoch; fixed: the plane restarts and the slave's first bytes are checked against the
    master's epoch). The path there follows the runbook: the master dies,
    the best slave is promoted and dies before the other is repointed; the rule needs the first
    master's answer, so it restarts (fenced, the other slave follows it again) and, holding
    the most, is promoted. The orchestrator is slow to repoint the other slave (while it acks
    the new epoch's puts); once it is repointed, the master dies: the group fails over to it."""
    chosen, epoch, third = repromote_first_master(run, wl, rng)
    time.sleep(rng.uniform(0.8, 1.5))  # a slow orchestrator: puts go to the new master
    st = run.nodes[third].status()
    run.fault("observe", [third], status={k: st.get(k) for k in ("epoch", "max_offset", "master_link")}
              if st else None, master=run.nodes[chosen].status())
    repoint(run, third, run.nodes[chosen], epoch, False)
    st = run.nodes[third].status()
    run.fault("observe", [third], after_repoint=st["max_offset"] if st else None)
    kill_current_master(run, rng, why="right after the other slave was repointed")
    time.sleep(rng.uniform(0.2, 0.5))
    failover(run, wl, chosen)


def sc_repromoted_master_blip(run, wl, rng):
    """repromoted-master-slave without the repoint: the slave that followed the first master
    into its new epoch only loses its link for a moment (a partition past the slave timeout;
    the proxy closes its HA connection and throttles it); its reconnect runs the epoch check;
    then the master dies; fail over."""
    chosen, epoch, third = repromote_first_master(run, wl, rng)
    time.sleep(rng.uniform(0.8, 1.5))
    before = run.nodes[third].status()
    if third in run.proxies:  # the blip: the proxy closes the slave's HA connection once
        run.set_proxy(third, rate=32 * 1024)
        run.set_proxy(third, drop=True)
    else:  # (the slave promoted first was the proxied one) a partition past the timeout
        run.net.partition(third, chosen)
        run.fault("partition", [third, chosen], why="a blip on the slave's link")
        time.sleep(rng.uniform(1.5, 2.0))
        run.net.heal()
        run.fault("heal", list(run.nodes))
    # the reconnect's epoch check: the slave's history still ends at the old epoch, so it cuts
    # what it acked of the new one (its log drops below where it was), then fetches it again
    # through the throttled link
    b = before["max_offset"] if before else 0
    wait_for(lambda: (x := run.nodes[third].status()) and x["max_offset"] < b, 8)
    time.sleep(rng.uniform(0.2, 0.6))
    after = run.nodes[third].status()
    run.fault("observe", [third], before=before and before["max_offset"],
              after=after and after["max_offset"], link=after and after["master_link"])
    kill_current_master(run, rng, why="soon after the slave reconnected")
    if third in run.proxies:
        run.set_proxy(third, rate=0)
    time.sleep(rng.uniform(0.2, 0.5))
    failover(run, wl, chosen)


SCENARIOS = {
    "kill-master": dict(fn=sc_kill_master, mode="SYNC", k=1,
                        doc="kill -9 the master under load; fail over"),
    "kill-master-k2": dict(fn=sc_kill_master, mode="SYNC", k=2,
                           doc="kill -9 the master under load, k = 2; fail over"),
    "kill-master-and-slave": dict(fn=sc_kill_master_and_slave, mode="SYNC", k=1,
                                  doc="kill -9 the master and one slave at once; the rule needs both slaves"),
    "kill-master-and-slave-k2": dict(fn=sc_kill_master_and_slave, mode="SYNC", k=2,
                                     doc="kill -9 the master and one slave at once, k = 2"),
    "pause-master": dict(fn=sc_pause_master, mode="SYNC", k=1,
                         doc="SIGSTOP the master past the slave timeout, then SIGCONT"),
    "pause-failover": dict(fn=sc_pause_failover, mode="SYNC", k=1, smoke=True,
                           doc="SIGSTOP the master, fail over, resume it as a cut-off zombie, heal, demote"),
    "pause-slave-k2": dict(fn=sc_pause_slave_k2, mode="SYNC", k=2,
                           doc="k = 2: SIGSTOP a slave (no PUT_OK possible), SIGCONT, then kill the master; fail over"),
    "partition-master": dict(fn=sc_partition_master, mode="SYNC", k=1,
                             doc="partition the master from every slave; no PUT_OK; fail over; heal"),
    "oneway-partition": dict(fn=sc_oneway_partition, mode="SYNC", k=1,
                             doc="one-way partition between the master and the slaves; heal"),
    "slow-slave": dict(fn=sc_slow_slave, mode="SYNC", k=1, proxied="last",
                       doc="one slave behind a slow proxy (delay, bandwidth); kill the master; fail over"),
    "slave-disk-full": dict(fn=sc_slave_disk_full, mode="SYNC", k=1, tmpfs="last", smoke=True,
                            params={"segment_size": "128KiB", "max_message_size": "16KiB"},
                            doc="a slave's data dir on a tmpfs that fills up; free it"),
    "slave-crash-loop": dict(fn=sc_slave_crash_loop, mode="SYNC", k=1, proxied="last",
                             doc="kill -9 a slave again and again during catch-up"),
    "double-failover": dict(fn=sc_double_failover, mode="SYNC", k=1,
                            doc="kill -9 the master, fail over, then kill the new master soon after"),
    "async-failover": dict(fn=sc_async_failover, mode="ASYNC", k=1, smoke=True, proxied="all",
                           doc="ASYNC: kill -9 the master, fail over; loss only within the bound"),
    "kill-new-master": dict(fn=sc_kill_new_master, mode="SYNC", k=1,
                            doc="kill -9 the master, promote, kill -9 the new one before the other slave is repointed; fail over again"),
    "kill-new-master-k2": dict(fn=sc_kill_new_master, mode="SYNC", k=2,
                               doc="kill-new-master with k = 2"),
    "pause-new-master": dict(fn=sc_pause_new_master, mode="SYNC", k=1,
                             doc="kill -9 the master, promote, SIGSTOP the new one at once; cut it off, fail over, resume it as a zombie, heal, demote"),
    "repeated-failovers": dict(fn=sc_repeated_failovers, mode="SYNC", k=1,
                               doc="four failovers in a row (kill -9, hang and cut-off, partition: each round picks one)"),
    "repeated-failovers-k2": dict(fn=sc_repeated_failovers, mode="SYNC", k=2,
                                  doc="repeated-failovers with k = 2"),
    "kill-all": dict(fn=sc_kill_all, mode="SYNC", k=1,
                     doc="kill -9 every node at once, restart all, fail over"),
    "kill-all-flush-sync": dict(fn=sc_kill_all, mode="SYNC", k=1, params={"flush": "sync"},
                                doc="kill-all with store.flush = sync"),
    "oneway-failover": dict(fn=sc_oneway_failover, mode="SYNC", k=1,
                            doc="the master cannot hear its slaves (they hear it): no PUT_OK; cut off, fail over, heal, demote"),
    "mode-flip-failover": dict(fn=sc_mode_flip_failover, mode="SYNC", k=1,
                               doc="SYNC to ASYNC and back, then k = 2 with a slave hung (no PUT_OK), k = 1; kill -9 the master; fail over"),
    "kill-during-role-change": dict(fn=sc_kill_during_role_change, mode="SYNC", k=1,
                                    doc="kill -9 a slave at (or just after) its promotion and the old master at (or just after) its demotion; repeat each request"),
    "failover-disk-full": dict(fn=sc_failover_disk_full, mode="SYNC", k=1, tmpfs="last",
                               params={"segment_size": "128KiB", "max_message_size": "16KiB"},
                               doc="kill -9 the master while a slave's disk is full; repoint the full slave; free the disk"),
    "repromoted-master-slave": dict(fn=sc_repromoted_master_slave, mode="SYNC", k=1,
                                    doc="a slave follows a re-promoted master into its new epoch; repointed; the master dies; fail over"),
    "repromoted-master-blip": dict(fn=sc_repromoted_master_blip, mode="SYNC", k=1, proxied="last",
                                   doc="repromoted-master-slave, but the slave only reconnects (a partition blip) before the master dies"),
    "coord-kill-master": dict(fn=coordmod.sc_kill_master, mode="SYNC", k=1, coord=True, smoke=True,
                              doc="coordinator: kill -9 the master; the controller fails over after the TTL; exactly one failover"),
    "coord-pause-master": dict(fn=coordmod.sc_pause_master, mode="SYNC", k=1, coord=True,
                               doc="coordinator: SIGSTOP the master past the TTL, then SIGCONT; no PUT_OK from it after the promotion; demoted"),
    "coord-master-cut-from-etcd": dict(fn=coordmod.sc_master_cut_from_etcd, mode="SYNC", k=1, coord=True, smoke=True,
                                       doc="coordinator: the master cut off from etcd only; no promotion (pre-vote); it keeps serving SYNC"),
    "coord-master-and-voter-isolated": dict(fn=coordmod.sc_master_and_voter_isolated, mode="SYNC", k=2, coord=True,
                                            doc="coordinator, 5 nodes: the master and one voter cut off from the rest; the majority promotes; no PUT_OK on the minority"),
    "coord-master-and-voter-isolated-k1": dict(fn=coordmod.sc_master_and_voter_isolated_k1, mode="SYNC", k=1, coord=True,
                                               doc="coordinator, 3 nodes: the master and one voter cut off from the rest; too few voters to fence: no promotion"),
    "coord-controller-cut-off": dict(fn=coordmod.sc_controller_cut_off, mode="SYNC", k=1, coord=True,
                                     doc="coordinator: the active controller cut off from the voters (nothing happens), then from etcd (the standby takes over and fails over a killed master)"),
    "coord-etcd-down": dict(fn=coordmod.sc_etcd_down, mode="SYNC", k=1, coord=True,
                            doc="coordinator: etcd stopped (SIGSTOP or kill -9 and restart) past two TTLs; no promotion, no flapping"),
    "coord-switchover-under-load": dict(fn=coordmod.sc_switchover_under_load, mode="SYNC", k=1, coord=True, smoke=True,
                                        doc="coordinator: hasync switchover twice under load; no PUT_OK lost; the write pause recorded"),
    "coord-flapping": dict(fn=coordmod.sc_flapping, mode="SYNC", k=1, coord=True,
                           doc="coordinator: kill -9 and restart the master three times (at once, or after the failover)"),
    "coord-async-failover": dict(fn=coordmod.sc_async_failover, mode="ASYNC", k=1, coord=True,
                                 coord_params={"async_failover": True},
                                 doc="coordinator, ASYNC with async-failover: kill -9 the master; loss only within the history's bound"),
    "coord-kill-master-controller-cut": dict(fn=coordmod.sc_kill_master_controller_cut, mode="SYNC", k=1, coord=True,
                                             doc="coordinator: the active controller (and, by the seed, the standby) cut off from every node but not etcd; kill -9 the master: blocked (no fence reaches a voter), no promotion; healed, one failover, no PUT_OK lost"),
    "coord-etcd-minority-with-master": dict(fn=coordmod.sc_etcd_minority_with_master, mode="SYNC", k=1, coord=True,
                                            doc="coordinator, three etcd members: the master and one etcd member (leader or follower) cut off from the rest; the majority side fails over; no PUT_OK on the minority master; no loss"),
    "control-wrong-promotion": dict(fn=sc_wrong_promotion, mode="SYNC", k=1, proxied="last",
                                    expect=["lost"], control=True, smoke=True,
                                    doc="negative control: promote the stalled slave that did not ack"),
}


def run_scenario(name, seed, out_dir, binary, net, overrides=None):
    spec = SCENARIOS[name]
    if spec.get("coord"):
        return run_coord_scenario(name, seed, out_dir, binary, net, spec, overrides)
    rng = random.Random(f"{name}/{seed}")
    run = Run(name, seed, out_dir, binary, net, spec)
    run.fault_t = None
    os.makedirs(os.path.join(run.dir, "logs"), exist_ok=True)
    last = run.slaves()[-1]
    if spec.get("tmpfs") == "last":
        run.mount_tmpfs(last, "24m")
    wl = Workload(run, rng.random())
    run.workload = wl
    try:
        proxied = {"last": [last], "all": run.slaves()}.get(spec.get("proxied"), [])
        start_cluster(run, proxied=proxied)
        run.fault("start", list(run.nodes), master=run.master)
        wl.start_monitors()
        wl.start_clients()
        spec["fn"](run, wl, rng)
        if run.net.blackholes:
            run.net.heal()
            run.fault("heal", list(run.nodes))
        run.info["heal_t"] = time.time()
        load(rng, 1.5, 2.5)  # load after the heal: the group serves again
        wl.stop_clients()
        run.fault("clients_stopped", [])
        run.info["clients_stopped_t"] = time.time()
        run.info["converged_t"] = converge(run)
        run.info["final_master"] = run.master
        dump_final(run)
    finally:
        cleanup(run, wl)
    return run.dir


def run_coord_scenario(name, seed, out_dir, binary, net, spec, overrides):
    """A coordinator scenario (coord.py): etcd and the controllers orchestrate; the harness
    injects the faults, watches, and checks the scenario's own expectations at the end."""
    rng = random.Random(f"{name}/{seed}")
    run = Run(name, seed, out_dir, binary, net, spec, overrides)
    run.fault_t = None
    run.post = None
    os.makedirs(os.path.join(run.dir, "logs"), exist_ok=True)
    wl = Workload(run, rng.random())
    run.workload = wl
    co = coordmod.Coord(run, wl)
    run.coord = co
    try:
        co.start()
        run.fault("start", list(run.nodes), master=run.master)
        wl.start_monitors()
        co.start_watching()
        wl.start_clients()
        spec["fn"](run, wl, rng, co)
        for n, x in run.nodes.items():  # every node runs again before the heal
            if x.paused:
                x.resume()
                run.fault("sigcont", [n])
            if not x.alive():
                x.start(wait=False)
                run.fault("restart", [n])
        if run.net.blackholes:
            run.net.heal()
            run.fault("heal", list(run.net.ips))
        run.info["heal_t"] = time.time()
        load(rng, 1.5, 2.5)  # load after the heal: the group serves again
        wait_for(lambda: coordmod.put_oks(run, since=run.info["heal_t"]), 30, 0.5)
        wl.stop_clients()
        run.fault("clients_stopped", [])
        run.info["clients_stopped_t"] = time.time()
        run.info["converged_t"] = converge(run)
        run.info["final_master"] = run.master
        hist, _ = co.final()
        if run.post:
            run.post(hist)
        dump_final(run)
    except Exception as e:  # noqa: BLE001 — recorded as a failed expectation, then cleaned up
        co.expect("the scenario ran to its end", False, error=repr(e))
        raise
    finally:
        co.write()
        cleanup(run, wl)
    return run.dir


def cleanup(run, wl):
    """Stops everything the run started; each step runs even when an earlier one fails."""
    codes = {}

    def stop_nodes():
        for n, x in run.nodes.items():
            codes[n] = x.stop()
        run.info["exit_codes"] = codes

    def stop_coordinator():
        if run.coord is not None:
            run.coord.stop_watching()
            codes.update(run.coord.stop())
            run.info["exit_codes"] = codes

    def close_logs():
        for w in (run.history, run.reads, run.status_log, run.faults):
            w.close()
        if run.coord_params:
            run.routes.close()
            run.coord_log.close()

    errors = []
    for step in (wl.stop_clients, wl.stop_monitors, stop_nodes, stop_coordinator,
                 run.stop_proxies, run.unmount_all, close_logs, run.write_info):
        try:
            step()
        except Exception as e:  # noqa: BLE001 — the next step must run anyway
            errors.append(f"{step.__name__}: {e!r}")
    if errors:
        print("cleanup errors:", errors, file=sys.stderr)


def dump_final(run):
    for n, node in run.nodes.items():
        st = node.status(timeout=5)
        if st is None:
            continue
        rec = {
            "status": st,
            "epochs": node.epochs(),
            "min_offset": st["min_offset"],
            "max_offset": st["max_offset"],
            "records": node.read_all(st["min_offset"]),
        }
        with open(os.path.join(run.dir, "final", f"{n}.json"), "w") as f:
            json.dump(rec, f)
