"""Producers, readers and the status monitor: threads that log every step as JSONL.

Producers put bodies tagged `client/seq` to the node the harness currently names master (the
"name server" view, `Run.master`), one message per put; a stray producer sends each put to a
random node, as a client with a stale route would. Every invoke and completion is logged; a put
is never retried: each attempt has a fresh seq. Readers follow every node's log from its start
without include_unconfirmed and log each record they saw. The monitor samples GetStatus of every
node every 100 ms.
"""

import collections
import random
import threading
import time
import zlib

import grpc

from . import cluster

TOPIC = "Chaos"
# A hard bound on every client thread's life, whatever the scenario does.
MAX_THREAD_S = 300
DEFINITE_FAIL = {grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT}


def classify(resp):
    status = cluster.STATUS.get(resp.status, str(resp.status))
    if status == "PUT_OK":
        return "ok", status
    if status in ("FLUSH_DISK_TIMEOUT", "FLUSH_SLAVE_TIMEOUT", "SLAVE_NOT_AVAILABLE") and resp.stored:
        return "stored", status
    return "unknown", status


class Producer(threading.Thread):
    def __init__(self, run, client, rng, stray=False, pause_s=0.002):
        super().__init__(daemon=True, name=f"producer-{client}")
        self.ctx, self.client, self.rng, self.stray, self.pause_s = run, client, rng, stray, pause_s
        self.seq = 0
        self.stop_event = threading.Event()

    def target(self):
        if self.stray:
            return self.rng.choice(list(self.ctx.nodes.values()))
        return self.ctx.nodes[self.ctx.master]

    def run_once(self):
        node = self.target()
        tag = f"{self.client}/{self.seq}"
        pad = b"x" * self.rng.randrange(0, self.ctx.params["max_pad"])
        body = tag.encode() + b" " + pad
        base = {"client": self.client, "seq": self.seq, "tag": tag, "node": node.name}
        queue_id = self.seq % 4
        self.seq += 1
        self.ctx.history.write({"t": time.time(), "type": "invoke", **base, "topic": TOPIC,
                                "queue_id": queue_id, "body_len": len(body),
                                "body_crc": zlib.crc32(body)})
        rec = {"type": "complete", **base, "status": None, "grpc_code": None, "stored": None,
               "offset": None, "size": None, "epoch": None, "detail": ""}
        try:
            resp = node.put(TOPIC, queue_id, body, timeout=self.ctx.params["put_timeout"])
            outcome, status = classify(resp)
            rec.update(outcome=outcome, status=status, stored=resp.stored, epoch=resp.epoch,
                       detail=resp.detail)
            if resp.results:
                rec.update(offset=resp.results[0].offset, size=resp.results[0].size)
        except grpc.RpcError as e:
            code = e.code()
            rec.update(outcome="fail" if code in DEFINITE_FAIL else "unknown",
                       grpc_code=code.name if code else None, detail=(e.details() or "")[:200])
        rec["t"] = time.time()
        self.ctx.history.write(rec)
        return rec

    def run(self):
        deadline = time.time() + MAX_THREAD_S
        while not self.stop_event.is_set() and time.time() < deadline:
            rec = self.run_once()
            if rec["outcome"] not in ("ok", "stored"):
                # a refused or failed put: back off a little (the master may be changing)
                self.stop_event.wait(0.05)
            elif self.pause_s:
                self.stop_event.wait(self.pause_s)


class Reader(threading.Thread):
    """Follows one node's readable log (no include_unconfirmed) and logs what it saw."""

    def __init__(self, run, node, name):
        super().__init__(daemon=True, name=f"reader-{name}")
        self.ctx, self.node, self.reader = run, node, name
        self.stop_event = threading.Event()
        self.pos = None

    def run(self):
        deadline = time.time() + MAX_THREAD_S
        while not self.stop_event.is_set() and time.time() < deadline:
            try:
                if self.pos is None:
                    st = self.node.status(timeout=1)
                    if st is None:
                        self.stop_event.wait(0.2)
                        continue
                    self.pos = st["min_offset"]
                r = self.node.read(self.pos, max_messages=256, timeout=2)
            except grpc.RpcError as e:
                if e.code() in (grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.INVALID_ARGUMENT):
                    self.pos = None  # truncated under us: start over from the node's start
                self.stop_event.wait(0.1)
                continue
            now = time.time()
            for m in r.messages:
                self.ctx.reads.write({
                    "t": now, "reader": self.reader, "node": self.node.name,
                    "offset": m.physical_offset, "size": m.size,
                    "tag": m.body.split(b" ", 1)[0].decode(errors="replace"),
                })
            if r.next_offset == self.pos:
                self.stop_event.wait(0.05)
            self.pos = r.next_offset


class Monitor(threading.Thread):
    """Samples one node's GetStatus every 100 ms; keeps the last sample for the orchestrator."""

    def __init__(self, run, node):
        super().__init__(daemon=True, name=f"monitor-{node.name}")
        self.ctx, self.node = run, node
        self.stop_event = threading.Event()
        self.last = None
        self.samples = collections.deque(maxlen=600)

    def run(self):
        deadline = time.time() + MAX_THREAD_S
        while not self.stop_event.is_set() and time.time() < deadline:
            st = self.node.status(timeout=0.5)
            sample = st if st is not None else {"node": self.node.name, "up": False}
            sample["t"] = time.time()
            sample["node"] = self.node.name
            if st is not None:
                self.last = sample
            self.samples.append(sample)
            self.ctx.status_log.write(sample)
            self.stop_event.wait(0.1)


class Workload:
    def __init__(self, run, seed):
        rng = random.Random(seed)
        p = run.params
        self.producers = [Producer(run, f"p{i}", random.Random(rng.random())) for i in range(p["producers"])]
        self.producers.append(Producer(run, "ps", random.Random(rng.random()), stray=True, pause_s=0.05))
        self.readers = [Reader(run, n, f"r-{n.name}") for n in run.nodes.values()]
        self.monitors = {n.name: Monitor(run, n) for n in run.nodes.values()}

    def start_monitors(self):
        for m in self.monitors.values():
            m.start()

    def start_clients(self):
        for t in self.producers + self.readers:
            t.start()

    @staticmethod
    def _stop(threads, timeout):
        for t in threads:
            t.stop_event.set()
        deadline = time.time() + timeout
        for t in threads:
            if t.ident is not None:  # started
                t.join(max(0.1, deadline - time.time()))

    def stop_clients(self):
        self._stop(self.producers + self.readers, 20)

    def stop_monitors(self):
        self._stop(list(self.monitors.values()), 5)
