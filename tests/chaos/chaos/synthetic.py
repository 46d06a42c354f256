"""Negative controls (a) for the checker (issue 16, point 7a): synthetic run directories, each
with one anomaly planted, and a clean baseline; the checker must name exactly the planted kind
in each (and nothing in the baseline).

    python -m chaos.synthetic          (prints a table; exit 1 unless every control is right)

The data dirs hold real commitlog bytes from a small encoder of the RocketMQ record format
(`encode_record`, checked against upstream's golden vectors in tests/test_segments.py), so the
disk half of the checker is exercised too.
"""

import ipaddress
import json
import os
import struct
import sys
import tempfile
import zlib

from chaos import checker, segments

SEGMENT_SIZE = 4096
TOPIC = "chaos"
T0 = 1_700_000_000.0
NODES = ("n1", "n2", "n3")


def _host(text):
    host, _, port = text.rpartition(":")
    ip = ipaddress.ip_address(host.strip("[]"))
    return ip.packed + struct.pack(">i", int(port)), ip.version == 6


def encode_record(physical_offset, body, topic=TOPIC, *, queue_id=0, flag=0, properties=b"",
                  sys_flag=0, born_ms=1_700_000_000_000, born_host="127.0.0.1:40000",
                  store_ms=1_700_000_000_000, store_host="127.0.0.1:10920", reconsume_times=0,
                  prepared_transaction_offset=0, queue_offset=0):
    """One RocketMQ commitlog message record (see chaos.segments for the layout): V2 magic only
    for a topic over 127 bytes, the IPv6 SYSFLAG bits from the host families, QUEUEOFFSET 0 for
    a PREPARED or ROLLBACK transaction type, BODYCRC = crc32(body) & 0x7FFFFFFF."""
    born, born_v6 = _host(born_host)
    store, store_v6 = _host(store_host)
    sys_flag &= ~(segments.SYSFLAG_BORNHOST_V6 | segments.SYSFLAG_STOREHOST_V6)
    sys_flag |= (segments.SYSFLAG_BORNHOST_V6 if born_v6 else 0)
    sys_flag |= (segments.SYSFLAG_STOREHOST_V6 if store_v6 else 0)
    if sys_flag & 0xC in (0x4, 0xC):
        queue_offset = 0
    topic_bytes = topic.encode()
    v2 = len(topic_bytes) > 127
    topic_field = struct.pack(">h" if v2 else ">b", len(topic_bytes)) + topic_bytes
    tail = (struct.pack(">q", born_ms) + born + struct.pack(">q", store_ms) + store
            + struct.pack(">iqi", reconsume_times, prepared_transaction_offset, len(body))
            + body + topic_field + struct.pack(">h", len(properties)) + properties)
    size = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + len(tail)
    crc = zlib.crc32(body) & segments.BODY_CRC_MASK if body else 0
    magic = segments.MAGIC_V2 if v2 else segments.MAGIC_V1
    head = struct.pack(">iIiiiqqi", size, magic, crc, queue_id, flag, queue_offset,
                       physical_offset, sys_flag)
    return head + tail


def encode_blank(remaining):
    """The 8-byte end-of-file blank record header."""
    return struct.pack(">iI", remaining, segments.BLANK_MAGIC)


def state_file(kind, payload):
    """A hasync state file: `hasync-state <kind> v1 len=<n> crc32=<hex>` then the payload."""
    data = json.dumps(payload, separators=(",", ":")).encode()
    return f"hasync-state {kind} v1 len={len(data)} crc32={zlib.crc32(data):08x}\n".encode() + data


class NodeLog:
    """One node's commitlog being built: bodies placed as hasync places them (a record that
    would leave less than the 8-byte blank in its segment goes to the next one)."""

    def __init__(self):
        self.records = []  # (offset, body)
        self.end = 0
        self.min_offset = 0  # segments below it are gone (written neither to disk nor to final/)

    def append(self, body):
        size = len(encode_record(0, body))
        remaining = SEGMENT_SIZE - self.end % SEGMENT_SIZE
        if size + segments.BLANK_HEADER_SIZE > remaining:
            self.end += remaining
        offset = self.end
        self.records.append((offset, body))
        self.end += size
        return offset

    def write(self, data_dir):
        """Writes the segment files (full size, zero-filled, with their blanks)."""
        directory = os.path.join(data_dir, "commitlog")
        os.makedirs(directory, exist_ok=True)
        files, ends = {}, {}
        for offset, body in self.records:
            seg = offset - offset % SEGMENT_SIZE
            if seg < self.min_offset:
                continue
            buf = files.setdefault(seg, bytearray(SEGMENT_SIZE))
            rec = encode_record(offset, body)
            buf[offset - seg:offset - seg + len(rec)] = rec
            ends[seg] = offset + len(rec)
        for seg, buf in files.items():
            last = ends[seg]
            if seg + SEGMENT_SIZE <= self.end:
                buf[last - seg:last - seg + 8] = encode_blank(seg + SEGMENT_SIZE - last)
            with open(os.path.join(directory, f"{seg:020d}"), "wb") as f:
                f.write(buf)

    def api_records(self):
        return [{"offset": o, "size": len(encode_record(o, b)), "tag": segments.tag_of(b),
                 "topic": TOPIC, "queue_id": 0, "body_crc": zlib.crc32(b)}
                for o, b in self.records if o >= self.min_offset]


class Synthetic:
    """A synthetic run: three nodes, n1 the initial master, every record on every node unless
    a control says otherwise; `write()` lays it out as the harness would."""

    def __init__(self, root, name, mode="SYNC", expect=()):
        self.dir = os.path.join(root, name)
        self.mode = mode
        self.expect = list(expect)
        self.t = T0
        self.logs = {n: NodeLog() for n in NODES}
        self.epochs = {n: [{"epoch": 0, "start_offset": 0}] for n in NODES}
        self.master = "n1"
        self.epoch = 0
        self.history, self.reads, self.status, self.faults = [], [], [], []
        self.seqs = {}
        self.disk_edits = []  # (node, offset, bytes): raw overwrites applied after writing
        self.final_edits = []  # f(node, final dict): edits of final/<node>.json before writing
        self.run_edits = {}  # run.json fields to override
        self.params = {}
        self.heal_t = None  # set by promote(): the failover is the fault that heals
        self.legacy = False  # write as the older harness did: without the optional new fields
        self.sample()

    def tick(self, dt=0.05):
        self.t += dt
        return self.t

    def sample(self):
        for n in NODES:
            self.status.append({"t": self.tick(0.001), "node": n, "up": True,
                                "role": "MASTER" if n == self.master else "SLAVE",
                                "epoch": self.epochs[n][-1]["epoch"], "mode": self.mode})

    def next_tag(self, client="p0"):
        seq = self.seqs.get(client, 0)
        self.seqs[client] = seq + 1
        return f"{client}/{seq}", client, seq

    def put(self, client="p0", outcome="ok", status="PUT_OK", on=NODES, node=None, epoch=None,
            offset=None, t=None, pad=b"x" * 24):
        """One put: an invoke, its record appended to the logs of `on`, and its completion with
        the offset in the answering node's log (or `offset`)."""
        tag, client, seq = self.next_tag(client)
        node = node or self.master
        body = tag.encode() + b" " + pad
        self.history.append({"t": self.tick(), "type": "invoke", "client": client, "seq": seq,
                             "tag": tag, "node": node, "topic": TOPIC, "queue_id": 0,
                             "body_len": len(body), "body_crc": zlib.crc32(body)})
        at = None
        for n in on:
            placed = self.logs[n].append(body)
            at = placed if n == node or at is None else at
        if offset is None:
            offset = at if at is not None else self.logs[node].end
        stored = outcome in ("ok", "stored")
        self.history.append({
            "t": t if t is not None else self.tick(), "type": "complete", "client": client,
            "seq": seq, "tag": tag, "node": node, "outcome": outcome, "status": status,
            "grpc_code": None, "stored": stored if outcome != "unknown" else None,
            "offset": offset if stored else None,
            "size": len(encode_record(0, body)) if stored else None,
            "epoch": self.epoch if epoch is None else epoch, "detail": ""})
        return tag, offset

    def read(self, tag, offset, node="n2"):
        self.reads.append({"t": self.tick(), "reader": "r0", "node": node, "offset": offset,
                           "size": len(encode_record(0, tag.encode() + b" " + b"x" * 24)),
                           "tag": tag})

    def promote(self, node):
        """The harness's failover: `node` opens the next epoch at its max offset; the others
        adopt its history and are truncated to its log."""
        self.faults.append({"t": self.tick(), "kind": "promote", "nodes": [node], "detail": {}})
        self.epoch += 1
        entry = {"epoch": self.epoch, "start_offset": self.logs[node].end, "master_name": node}
        history = self.epochs[node] + [entry]
        for n in NODES:
            self.epochs[n] = [dict(e) for e in history]
            if n != node:
                self.logs[n].records = list(self.logs[node].records)
                self.logs[n].end = self.logs[node].end
        self.master = node
        self.heal_t = self.t
        self.sample()

    def bite(self, fault, ok=True, nodes=("n3",)):
        """The harness's proof that a fault took effect (or did not)."""
        self.faults.append({"t": self.tick(), "kind": "bite", "nodes": list(nodes),
                            "detail": {"fault": fault, "ok": ok, "evidence": "synthetic"}})

    def write(self):
        os.makedirs(os.path.join(self.dir, "final"), exist_ok=True)
        nodes = {}
        for i, n in enumerate(NODES):
            data_dir = os.path.join(self.dir, "data", n)
            self.logs[n].write(data_dir)
            with open(os.path.join(data_dir, "epoch"), "wb") as f:
                f.write(state_file("epoch", self.epochs[n]))
            nodes[n] = {"grpc": f"198.18.0.{11 + i}:10920", "ha": f"198.18.0.{11 + i}:10912",
                        "data_dir": data_dir}
        for node, offset, raw in self.disk_edits:
            seg = offset - offset % SEGMENT_SIZE
            with open(os.path.join(self.dir, "data", node, "commitlog", f"{seg:020d}"), "r+b") as f:
                f.seek(offset - seg)
                f.write(raw)
        self.sample()
        for n in NODES:
            log = self.logs[n]
            status = {"t": self.tick(), "node": n, "up": True,
                      "role": "MASTER" if n == self.master else "SLAVE",
                      "epoch": self.epochs[n][-1]["epoch"], "min_offset": log.min_offset,
                      "max_offset": log.end, "confirm_offset": log.end,
                      "readable_offset": log.end, "mode": self.mode, "slaves": []}
            if n != self.master:
                status["master_link"] = {"address": nodes[self.master]["ha"], "connected": True}
            final = {"status": status, "epochs": self.epochs[n], "min_offset": log.min_offset,
                     "max_offset": log.end, "records": log.api_records()}
            for edit in self.final_edits:
                edit(n, final)
            if self.legacy:
                status.pop("master_link", None)
                for r in final["records"]:
                    r.pop("queue_id"), r.pop("body_crc")
            with open(os.path.join(self.dir, "final", f"{n}.json"), "w") as f:
                json.dump(final, f)
        run = {"scenario": os.path.basename(self.dir), "seed": 0, "mode": self.mode, "k": 1,
               "nodes": nodes, "initial_master": "n1", "final_master": self.master,
               "expect": self.expect, "heal_t": self.heal_t, "converged_t": self.tick(),
               "params": self.params}
        run.update(self.run_edits)
        history, faults = self.history, self.faults
        if self.legacy:
            new = ("topic", "queue_id", "body_len", "body_crc")
            history = [{k: v for k, v in op.items() if k not in new} for op in history]
            faults = [f for f in faults if f["kind"] != "bite"]
        with open(os.path.join(self.dir, "run.json"), "w") as f:
            json.dump(run, f)
        for name, rows in (("history", history), ("reads", self.reads),
                           ("status", self.status), ("faults", faults)):
            with open(os.path.join(self.dir, f"{name}.jsonl"), "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
        return self.dir


def baseline(root, name="baseline", mode="SYNC", expect=()):
    """A clean run: 40 PUT_OKs on n1 in epoch 0 (with a failed and an unknown put, and a
    FLUSH_SLAVE_TIMEOUT the failover cut), a failover to n2 (epoch 1: the first fault, and the
    heal) that bit, 20 PUT_OKs on n2 after it, reads on every node."""
    s = Synthetic(root, name, mode, expect)
    for i in range(40):
        tag, offset = s.put()
        if i % 10 == 0:
            s.read(tag, offset, node="n3")
        if i % 10 == 5:
            s.read(tag, offset, node="n1")
    s.put(outcome="fail", status=None, on=())
    s.put(outcome="unknown", status=None)
    s.put(outcome="stored", status="FLUSH_SLAVE_TIMEOUT", on=("n1",))
    s.promote("n2")
    s.bite("promote")
    for i in range(20):
        tag, offset = s.put(client="p1")
        if i % 5 == 0:
            s.read(tag, offset, node="n2")
    return s


def _edit_body(s, node, tag, new_pad):
    """Makes `node`'s copy of `tag` carry another padding of the same length (a valid record,
    same tag and size, other bytes)."""
    log = s.logs[node]
    for i, (offset, body) in enumerate(log.records):
        if segments.tag_of(body) == tag:
            log.records[i] = (offset, tag.encode() + b" " + new_pad)
            return offset
    raise KeyError(tag)


def _set_role(node, role):
    def edit(n, final):
        if n == node:
            final["status"]["role"] = role
    return edit


def _set_link(node, connected):
    def edit(n, final):
        if n == node:
            final["status"]["master_link"]["connected"] = connected
    return edit


def _set_api_body_crc(node, tag):
    """Makes `node`'s API view of `tag` report another body_crc than its disk holds."""
    def edit(n, final):
        if n == node:
            for r in final["records"]:
                if r["tag"] == tag:
                    r["body_crc"] ^= 1
    return edit


def _controls(root):
    """[(name, expected kind or kinds or None, Synthetic)]."""
    out = [("baseline", None, baseline(root))]

    s = baseline(root, "lost", expect=["lost"])
    s.put(client="p1", on=())
    out.append(("lost", "lost", s))

    s = baseline(root, "duplicate", expect=["duplicate"])
    _, offset = s.put(client="p1")
    for n in NODES:
        s.logs[n].append(s.logs[n].records[-1][1])
    out.append(("duplicate", "duplicate", s))

    s = baseline(root, "phantom", expect=["phantom"])
    for n in NODES:
        s.logs[n].append(b"p9/0 " + b"x" * 24)
    out.append(("phantom", "phantom", s))

    s = baseline(root, "divergent", expect=["divergent"])
    _edit_body(s, "n3", "p1/5", b"y" * 24)
    out.append(("divergent", "divergent", s))

    s = baseline(root, "disk-damage", expect=["divergent"])
    offset = [o for o, b in s.logs["n2"].records if segments.tag_of(b) == "p0/7"][0]
    s.disk_edits.append(("n2", offset + 100, b"Z"))  # a body byte: BODYCRC no longer matches
    out.append(("disk-damage", "divergent", s))

    s = baseline(root, "two-writers", expect=["two-writers"])
    s.put(client="p1", node="n1")  # epoch 1 belongs to n2
    out.append(("two-writers", "two-writers", s))

    s = baseline(root, "stale-read", expect=["stale-read"])
    tag, offset = s.put(client="p1", outcome="stored", status="FLUSH_SLAVE_TIMEOUT", on=())
    s.read(tag, offset, node="n2")
    out.append(("stale-read", "stale-read", s))

    s = baseline(root, "epoch-regressed", expect=["epoch-regressed"])
    s.status.append({"t": s.tick(), "node": "n3", "up": True, "role": "SLAVE", "epoch": 0,
                     "mode": "SYNC"})
    out.append(("epoch-regressed", "epoch-regressed", s))

    s = baseline(root, "epoch-divergent", expect=["epoch-divergent"])
    s.epochs["n3"][1]["start_offset"] += 1
    out.append(("epoch-divergent", "epoch-divergent", s))

    s = baseline(root, "misplaced", expect=["misplaced"])
    tag, offset = s.put(client="p1")
    s.history[-1]["offset"] = offset + 4096
    out.append(("misplaced", "misplaced", s))

    s = baseline(root, "cut-off", expect=["acked-while-cut-off"])
    last = [op for op in s.history if op.get("type") == "invoke"][-1]
    start = last["t"] - 0.001  # n2 cut off from its slaves just before its last put
    s.faults.append({"t": start, "kind": "expect_no_put_ok", "nodes": ["n2"],
                     "detail": {"start": start, "end": None}})
    out.append(("cut-off", "acked-while-cut-off", s))

    # no retention, yet the final master's log starts at 4096: the PUT_OKs and the reads below
    # are gone; with params retention: true they are unverifiable only
    s = baseline(root, "below-min-offset", expect=["lost", "stale-read"])
    s.logs["n2"].min_offset = SEGMENT_SIZE
    out.append(("below-min-offset", ["lost", "stale-read"], s))
    s = baseline(root, "below-min-offset-retention")
    s.logs["n2"].min_offset = SEGMENT_SIZE
    s.params["retention"] = True
    out.append(("below-min-offset-retention", None, s))

    s = baseline(root, "two-masters", expect=["not-converged"])
    s.final_edits.append(_set_role("n3", "MASTER"))
    out.append(("two-masters", "not-converged", s))

    s = baseline(root, "link-down", expect=["not-converged"])
    s.final_edits.append(_set_link("n3", False))
    out.append(("link-down", "not-converged", s))

    s = baseline(root, "converge-timeout", expect=["not-converged"])
    s.run_edits["converged_t"] = None
    out.append(("converge-timeout", "not-converged", s))

    s = baseline(root, "corrupt", expect=["corrupt"])
    for n in NODES:
        _edit_body(s, n, "p1/5", b"y" * 24)  # every copy alike: only the invoke's body_crc differs
    out.append(("corrupt", "corrupt", s))

    s = baseline(root, "api-body-crc", expect=["divergent"])
    s.final_edits.append(_set_api_body_crc("n3", "p1/5"))
    out.append(("api-body-crc", "divergent", s))

    s = baseline(root, "vacuous-no-reads", expect=["vacuous"])
    s.reads = [r for r in s.reads if r["node"] != "n1"]
    out.append(("vacuous-no-reads", "vacuous", s))

    # (run.json expect stays empty: a negative control is exempt from the after-the-heal part)
    s = baseline(root, "vacuous-after-heal")
    s.run_edits["heal_t"] = s.tick()  # the heal after the last put
    out.append(("vacuous-after-heal", "vacuous", s))
    s = baseline(root, "control-after-heal", expect=["lost"])
    s.put(client="p1", on=())
    s.run_edits["heal_t"] = s.tick()
    out.append(("control-after-heal", "lost", s))

    s = baseline(root, "vacuous-before-fault", expect=["vacuous"])
    s.faults.insert(0, {"t": T0, "kind": "kill9", "nodes": ["n3"], "detail": {}})
    out.append(("vacuous-before-fault", "vacuous", s))

    s = baseline(root, "did-not-bite", expect=["fault-did-not-bite"])
    s.bite("fill_disk", ok=False)
    out.append(("did-not-bite", "fault-did-not-bite", s))

    s = baseline(root, "legacy-fields")  # an old harness's run dir: no optional new field
    s.legacy = True
    out.append(("legacy-fields", None, s))

    for name, expect, ack_past_cut, early_s in (
        ("async-inside", None, False, 0.0),
        ("async-below-ack", "lost", True, 0.0),
        ("async-too-early", "lost", False, 5.0),
        ("async-too-late", "lost", False, -1.0),
        ("async-ack-null", "lost", None, 0.0),
    ):
        s = async_failover(root, name, expect, ack_past_cut, early_s, read_cut=expect is None)
        out.append((name, expect, s))
    return out


def async_failover(root, name, expect, ack_past_cut, early_s, read_cut):
    """An ASYNC run whose failover cuts n1's last PUT_OKs that n2 never acked: 30 PUT_OKs
    replicated (read on every node), then 3 on n1 only, n2 promoted. `ack_past_cut` puts the
    bound's ack_offset past the cut records (so they were lost below the promoted slave's ack),
    None makes it null (the master never reported n2: the bound allows nothing); `early_s` moves
    their completion that much earlier (out of the lag window; negative: later than the fault
    + 0.5 s); `read_cut` has a reader see the first cut record on n1 (ASYNC reads are
    unconfirmed: allowed inside the bound)."""
    s = Synthetic(root, name, "ASYNC", [expect] if expect else [])
    for i in range(30):
        tag, offset = s.put()
        if i % 10 == 0:
            for n in NODES:
                s.read(tag, offset, node=n)
    ack = s.logs["n2"].end
    fault_t = s.tick(1.0) + 0.3
    for i in range(3):
        tag, offset = s.put(on=("n1",), t=fault_t - 0.1 - early_s + i * 0.01)
        if read_cut and i == 0:
            s.read(tag, offset, node="n1")
    s.faults.append({"t": fault_t, "kind": "async_bound", "nodes": ["n2"], "detail": {
        "old_master": "n1", "promoted": "n2",
        "ack_offset": None if ack_past_cut is None else ack + (SEGMENT_SIZE if ack_past_cut else 0),
        "lag_millis": 150, "sample_t": fault_t - 0.1, "fault_t": fault_t}})
    s.promote("n2")
    for _ in range(10):
        s.put(client="p1")
    return s


def run():
    """Builds every control in a temporary directory, checks it, and returns
    [{"name", "expected": [kind] or [], "found_kinds", "ok", "bounds", "details"}]; an ASYNC
    control is ok only if its verdict states the bound it checked."""
    results = []
    with tempfile.TemporaryDirectory(prefix="chaos-synthetic-") as root:
        for name, expected, s in _controls(root):
            verdict = checker.check(s.write())
            kinds = sorted(verdict["anomaly_counts"])
            expected = sorted([expected] if isinstance(expected, str) else expected or [])
            ok = kinds == expected and (bool(verdict["bounds"]) or not name.startswith("async"))
            results.append({"name": name, "expected": expected, "found_kinds": kinds, "ok": ok,
                            "bounds": verdict["bounds"],
                            "details": [a["detail"] for a in verdict["anomalies"]]})
    return results


def main():
    results = run()
    width = max(len(r["name"]) for r in results)
    print(f"{'control':<{width}}  {'expected':<20} {'found':<28} result")
    for r in results:
        print(f"{r['name']:<{width}}  {', '.join(r['expected']) or '-':<20} "
              f"{', '.join(r['found_kinds']) or '-':<28} {'ok' if r['ok'] else 'WRONG'}")
        if not r["ok"]:
            for d in r["details"]:
                print(f"{'':<{width}}    {d}")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
