"""The offline checker of a chaos run (issue 16, point 4): reads a run directory (the histories
the harness logged, every node's log as the API served it in `final/`, the data dirs on disk, the
epoch histories) and says whether hasync kept its promises. Stdlib only; it trusts nothing the
nodes say about themselves that it can check on disk instead.

    python -m chaos.checker RUN_DIR [RUN_DIR...]     (exit 1 if any verdict is "fail")

Decisions where the contract (/work/notes/i16-formats.md) is silent:

- "counts" partitions the puts: PUT_OK and the `stored` statuses by status name, `fail` and
  `unknown` by outcome (an `unknown` SERVICE_NOT_AVAILABLE counts as `unknown` only), and an
  invoke with no completion (the producer was stopped mid-call) counts as `unknown`.
- "anomalies" has one entry per kind found: {"kind", "detail" (the first example), "count" (the
  total), "examples": [{"detail", ...}] (the first MAX_EXAMPLES)}, so that a run with 50k lost
  records stays readable; "anomaly_counts" is {kind: count}.
- The final master is run.json's final_master; when it is null, the one node whose final status
  says MASTER, else initial_master.
- The final log is the final master's API view (final/<node>.json records); its disk scan is
  checked against that view separately (`divergent`).
- Disk bytes are compared record by record (offset, size, CRC-32 of every byte of the record);
  for an end-of-file blank only its 8-byte header counts: the rest of the file behind it is not
  data and may hold stale bytes after a truncation.
- A damaged record on disk (bad BODYCRC, bad structure) or a scan that ends before the node's
  max_offset is `divergent` (the disk disagrees with what the API served). A node with no
  commitlog segments on disk is `divergent` too: its disk view cannot be compared.
- Epoch histories: every history gets the implicit (0, 0) when it lacks it; entries agree when
  epoch and start agree and the master names are equal or one is empty (the Rust side keeps
  names for people and never compares them; an adopted history from a build without names has
  none). The API and the disk history of each node are compared like any two histories, and a
  history whose epochs do not increase (or whose starts go back) is `epoch-divergent` as well.
  An unreadable epoch file (bad header, CRC mismatch, not JSON) is `epoch-divergent`.
- one writer per epoch: the history used is the final master's (API, else disk). The master of
  epoch 0 is run.json's initial_master (epoch 0 has no name). A PUT_OK whose epoch is not in that
  history, or whose node is not the epoch's master, or whose epoch was answered by two nodes, is
  `two-writers`. The offset check (inside [start_e, start_next)) applies only to PUT_OKs that are
  in the final log at their offset: a missing one is already `lost` (or allowed by the ASYNC
  bound, e.g. an old ASYNC master answering after the promotion, whose offset lies past the new
  epoch's start by construction). PUT_OKs with no epoch are counted, not checked.
- misplaced: a PUT_OK or stored put whose tag is in the final log but not at the offset the put
  returned, or at that offset with another record size than the put returned.
- ASYNC bound: applied only when run.json mode is ASYNC. A missing PUT_OK is allowed by an
  async_bound record when it was answered by that record's old_master, at an offset >=
  ack_offset, completed at fault_t - lag_millis/1000 - 0.5 s <= t <= fault_t + 0.5 s (fault_t:
  detail.fault_t, else the record's t; lag_millis missing counts as 0). An ack_offset of null
  makes that record allow nothing (its bound text says it is invalid). Several async_bound
  records: allowed by any of them.
- In ASYNC mode a stale read is allowed by the same rule, with the read's own t and node (read
  on old_master at an offset >= ack_offset inside the same time window): Read serves
  unconfirmed data up to max_offset there.
- Offsets below the final master's min_offset: the harness never enables retention, so unless
  run.json params has "retention": true such a PUT_OK is `lost` and such a read `stale-read`
  (the detail says "below min_offset"); the ASYNC bound still applies to them, as to any
  missing PUT_OK. With retention they are counted in "checked" as unverifiable, not reported.
- not-converged: a run.json without a converged_t key (an old harness) is not flagged, only an
  explicit null; a non-master's final status without a master_link (old harness) is judged by
  its role alone. A final status that says MASTER on the final master and on another node
  gives one report for the count and one for the other node's role.
- corrupt: one report per record, listing every differing field; a field is compared only when
  both the invoke and the record have it non-null. The disk check compares a record's API
  body_crc with the disk's (zlib.crc32 of the body, unmasked) at the same offset when the API
  record has one and the tags agree (a tag or layout difference is already reported). The API
  views of two nodes are compared with queue_id and body_crc too.
- vacuous: "before the first fault" is a PUT_OK completion strictly before the t of the first
  faults.jsonl record whose kind is not start/proxy/bite (async_bound, expect_no_put_ok, mode
  ... count as faults); with no such record at all, at least one PUT_OK is enough. "after the
  heal" is a completion strictly after heal_t. A node's reads are the reads.jsonl rows whose
  "node" is that node. A negative control (expect non-empty) is exempt from the "after the
  heal" part only; its verdict still depends on its expected kinds alone, so a vacuous or
  fault-did-not-bite finding is listed but does not fail it.
- fault-did-not-bite: a bite record whose detail.ok is anything but true (false, missing).
- epoch-regressed looks at status.jsonl samples per node in time order, then the final status.
- Unavailability: PUT_OK completion times between the first and the last invoke; a gap over
  1 s (also from the first invoke to the first PUT_OK, and from the last PUT_OK to the last
  invoke) is a window; with no PUT_OK at all the whole span is one.
"""

import json
import os
import sys
import zlib
from collections import Counter, defaultdict

from chaos import jsonl, segments

MAX_EXAMPLES = 10
UNAVAILABLE_GAP_S = 1.0
ASYNC_SLACK_S = 0.5
KINDS = (
    "lost",
    "misplaced",
    "duplicate",
    "phantom",
    "corrupt",
    "divergent",
    "epoch-divergent",
    "two-writers",
    "epoch-regressed",
    "stale-read",
    "acked-while-cut-off",
    "not-converged",
    "fault-did-not-bite",
    "vacuous",
)


class Findings:
    """Anomalies found so far: totals per kind and the first MAX_EXAMPLES of each."""

    def __init__(self):
        self.counts = Counter()
        self.examples = defaultdict(list)

    def add(self, kind, detail, **extra):
        assert kind in KINDS, kind
        self.counts[kind] += 1
        if self.counts[kind] <= MAX_EXAMPLES:
            self.examples[kind].append({"detail": detail, **extra})

    def listing(self):
        """One entry per kind found: the first example's detail, the total count, and the
        first MAX_EXAMPLES examples."""
        return [
            {"kind": kind, "detail": self.examples[kind][0]["detail"], "count": self.counts[kind],
             "examples": self.examples[kind]}
            for kind in KINDS if self.counts[kind]
        ]


class Run:
    """Everything the checker reads from one run directory, loaded once."""

    def __init__(self, run_dir):
        self.dir = run_dir
        with open(os.path.join(run_dir, "run.json"), encoding="utf-8") as f:
            self.meta = json.load(f)
        self.nodes = sorted(self.meta.get("nodes", {}))
        self.history = jsonl.read(os.path.join(run_dir, "history.jsonl"))
        self.reads = jsonl.read(os.path.join(run_dir, "reads.jsonl"))
        self.status = jsonl.read(os.path.join(run_dir, "status.jsonl"))
        self.faults = jsonl.read(os.path.join(run_dir, "faults.jsonl"))
        self.final = {}
        for node in self.nodes:
            path = os.path.join(run_dir, "final", f"{node}.json")
            if os.path.exists(path):
                with open(path, encoding="utf-8") as f:
                    self.final[node] = json.load(f)
        self.master = self._final_master()

    def _final_master(self):
        named = self.meta.get("final_master")
        if named:
            return named
        masters = [
            n for n, fin in self.final.items() if (fin.get("status") or {}).get("role") == "MASTER"
        ]
        return masters[0] if len(masters) == 1 else self.meta.get("initial_master")

    def data_dir(self, node):
        """The node's data dir: run.json's path if it holds commitlog segments, else
        `data/<node>` beside run.json (a run directory copied elsewhere for a replay, or a copy
        of a tmpfs data dir the harness unmounted), else run.json's path."""
        given = (self.meta["nodes"][node] or {}).get("data_dir")
        beside = os.path.join(self.dir, "data", node)
        for candidate in (given, beside):
            if candidate and segments.segment_files(candidate):
                return candidate
        return given or beside

    @property
    def retention(self):
        """Whether the run enabled retention (run.json params "retention": true): only then may
        the final master's min_offset be above 0 without losing data."""
        return (self.meta.get("params") or {}).get("retention") is True

    def master_min_offset(self):
        """The final master's min_offset (0 without a final view of it)."""
        return self.bounds_of(self.master)[0] if self.master in self.final else 0

    def bounds_of(self, node):
        """(min_offset, max_offset) of a node as its final API view says."""
        fin = self.final[node]
        return int(fin.get("min_offset", 0)), int(fin["max_offset"])


def _key(rec):
    return (rec["offset"], rec["size"], rec["tag"], rec["topic"])


def _full_key(rec):
    """_key plus the optional queue_id and body_crc (None in old run dirs)."""
    return _key(rec) + (rec.get("queue_id"), rec.get("body_crc"))


def _first_difference(a, b):
    """Index of the first element where the lists differ (or where the shorter ends); None if
    they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# -- convergence, disk and replicas ------------------------------------------------------------


def check_converged(run, found):
    """not-converged: the harness's convergence wait must not have timed out (run.json
    converged_t null), every node must have a final view, all with the same max_offset, and the
    roles must have settled: exactly one final status says MASTER and it is the final master's,
    every other node's says SLAVE with its master link connected (the checker judges a group
    after it converged; a node behind would make every other check meaningless for it)."""
    if "converged_t" in run.meta and run.meta["converged_t"] is None:
        found.add("not-converged", "run.json converged_t is null: the harness's convergence wait "
                  "timed out")
    if run.master not in run.nodes:
        found.add("not-converged", f"the final master {run.master!r} is not a node of the run")
    for node in run.nodes:
        if node not in run.final:
            found.add("not-converged", f"{node} has no final/{node}.json", node=node)
    ends = {n: run.bounds_of(n)[1] for n in run.final}
    if len(set(ends.values())) > 1:
        found.add("not-converged", f"final max_offsets differ: {ends}", max_offsets=ends)
    statuses = {n: run.final[n].get("status") or {} for n in sorted(run.final)}
    masters = [n for n, st in statuses.items() if st.get("role") == "MASTER"]
    if len(masters) > 1:
        found.add("not-converged", f"{len(masters)} nodes' final status says MASTER: {masters}",
                  nodes=masters)
    if run.master in statuses and statuses[run.master].get("role") != "MASTER":
        found.add("not-converged", f"the final master {run.master}'s final status says role "
                  f"{statuses[run.master].get('role')!r}", node=run.master)
    for node, st in statuses.items():
        if node == run.master:
            continue
        link = st.get("master_link")
        if st.get("role") != "SLAVE":
            found.add("not-converged", f"{node} (not the final master) has final role "
                      f"{st.get('role')!r}, not SLAVE", node=node)
        elif "master_link" in st and (link or {}).get("connected") is not True:
            found.add("not-converged", f"{node}'s final master_link is not connected: {link}",
                      node=node)


def scan_disks(run, found):
    """divergent (API vs disk): each node's commitlog scanned on disk up to its max_offset must
    hold exactly the records its API served, undamaged. Returns {node: Scan}."""
    scans = {}
    for node in run.nodes:
        if node not in run.final:
            continue
        lo, hi = run.bounds_of(node)
        directory = run.data_dir(node)
        scan = segments.scan(directory, hi)
        scans[node] = scan
        if not segments.segment_files(directory):
            found.add("divergent", f"{node}: no commitlog segments in {directory}", node=node)
            continue
        for err in scan.errors:
            found.add("divergent", f"{node} disk at {err.offset}: {err.reason}", node=node)
        if scan.end != hi:
            found.add(
                "divergent",
                f"{node} disk scan ends at {scan.end} ({scan.stop_reason}), max_offset is {hi}",
                node=node,
            )
        api = [_key(r) for r in run.final[node].get("records", [])]
        disk = [(r.offset, r.size, r.tag, r.topic) for r in scan.records if r.offset >= lo]
        _report_first_difference(found, api, disk, f"{node}: API view and disk scan",
                                 ("API", "disk"), node=node)
        on_disk = {r.offset: r for r in scan.records}
        for rec in run.final[node].get("records", []):
            d = on_disk.get(rec["offset"])
            if rec.get("body_crc") is not None and d is not None and d.tag == rec["tag"] \
                    and d.body_crc != rec["body_crc"]:
                found.add("divergent", f"{node}: {rec['tag']} at {rec['offset']} has body_crc "
                          f"{rec['body_crc']:#010x} through the API, {d.body_crc:#010x} on disk",
                          node=node, offset=rec["offset"])
    return scans


def _report_first_difference(found, a, b, what, names, **extra):
    """divergent: the first record at which two record lists differ, if any."""
    i = _first_difference(a, b)
    if i is not None:
        found.add("divergent", f"{what} differ at record {i}: "
                  f"{names[0]} {a[i] if i < len(a) else 'ends'}, "
                  f"{names[1]} {b[i] if i < len(b) else 'ends'}", **extra)


def check_replicas(run, scans, found):
    """divergent (across nodes): every node must agree with the final master over their common
    range [max(min_offsets), min(max_offsets)), byte for byte on disk and record for record
    through the API."""
    master = run.master
    if master not in run.final:
        return
    for node in run.nodes:
        if node == master or node not in run.final:
            continue
        lo = max(run.bounds_of(node)[0], run.bounds_of(master)[0])
        hi = min(run.bounds_of(node)[1], run.bounds_of(master)[1])

        def api_view(n):
            return [_full_key(r) for r in run.final[n].get("records", [])
                    if lo <= r["offset"] < hi]

        _report_first_difference(found, api_view(master), api_view(node),
                                 f"API logs of {master} and {node} in [{lo}, {hi})",
                                 (master, node), nodes=[master, node])
        if master in scans and node in scans:
            _compare_disks(run, master, node, scans[master], scans[node], lo, hi, found)


def _disk_items(scan, lo, hi):
    items = [(r.offset, r.size, r.crc) for r in scan.records if lo <= r.offset < hi]
    items += [(b.offset, b.size, b.crc) for b in scan.blanks if lo <= b.offset < hi]
    items.sort()
    return items


def _compare_disks(run, master, node, scan_a, scan_b, lo, hi, found):
    a, b = _disk_items(scan_a, lo, hi), _disk_items(scan_b, lo, hi)
    i = _first_difference(a, b)
    if i is None:
        return
    at = min(x[0] for x in (a[i:i + 1] + b[i:i + 1]))
    detail = f"disk bytes of {master} and {node} differ in [{lo}, {hi}) at record offset {at}"
    bytes_a = segments.read_range(run.data_dir(master), at, hi)
    bytes_b = segments.read_range(run.data_dir(node), at, hi)
    j = _first_difference(bytes_a[:1 << 20], bytes_b[:1 << 20])
    if j is not None:
        detail += f" (first differing byte at {at + j})"
    found.add("divergent", detail, nodes=[master, node], offset=at)


# -- the puts --------------------------------------------------------------------------------


class Log:
    """One node's final log (API view) indexed by offset and by tag."""

    def __init__(self, records):
        self.at = {}
        self.offsets_of = defaultdict(list)
        for r in records:
            self.at[r["offset"]] = r
            self.offsets_of[r["tag"]].append(r["offset"])


def _completions(run):
    """{tag: complete} (the last completion of each tag) and {tag: invoke}."""
    invokes, completes = {}, {}
    for op in run.history:
        if op.get("type") == "invoke":
            invokes[op["tag"]] = op
        elif op.get("type") == "complete":
            completes[op["tag"]] = op
    return invokes, completes


def count_puts(invokes, completes):
    """Puts by status (PUT_OK and the stored statuses) or by outcome (fail, unknown)."""
    counts = Counter()
    for op in completes.values():
        outcome = op.get("outcome")
        if outcome in ("ok", "stored"):
            counts[op.get("status") or outcome] += 1
        else:
            counts[outcome or "unknown"] += 1
    counts["unknown"] += sum(1 for tag in invokes if tag not in completes)
    return dict(counts)


def async_bounds(run):
    """The ASYNC loss bounds (async_bound fault records) as (old_master, ack_offset, since,
    until) and their statements. An ack_offset of null (the master never reported the promoted
    slave) makes the bound invalid: it allows nothing."""
    if run.meta.get("mode") != "ASYNC":
        return [], []
    bounds, texts = [], []
    for fault in run.faults:
        if fault.get("kind") != "async_bound":
            continue
        d = fault.get("detail") or {}
        old, promoted, ack = d.get("old_master"), d.get("promoted"), d.get("ack_offset")
        if ack is None:
            texts.append(f"ASYNC bound invalid: the master never reported {promoted}: every "
                         f"PUT_OK missing from {run.master}'s log is lost")
            continue
        fault_t = d.get("fault_t")
        fault_t = fault["t"] if fault_t is None else fault_t
        lag = d.get("lag_millis") or 0
        since = fault_t - lag / 1000 - ASYNC_SLACK_S
        until = fault_t + ASYNC_SLACK_S
        bounds.append((old, int(ack), since, until))
        texts.append(
            f"ASYNC: a PUT_OK missing from {run.master}'s log (or a stale read) is allowed only "
            f"if {old} answered (served) it at offset >= {ack} ({promoted}'s last ack) at "
            f"{since:.3f} <= t <= {until:.3f} (fault t {fault_t:.3f} - largest lag {lag} ms - "
            f"{ASYNC_SLACK_S} s, fault t + {ASYNC_SLACK_S} s)"
        )
    if not bounds and not texts:
        texts.append("ASYNC run without an async_bound record: every missing PUT_OK is lost")
    return bounds, texts


def _allowed_by(bounds, node, offset, t):
    """Whether a loss at `offset` on `node` (a put completed, or a read served, at `t`) lies
    inside an ASYNC bound."""
    return any(
        node == old and offset is not None and offset >= ack and t is not None
        and since <= t <= until
        for old, ack, since, until in bounds
    )


def check_puts(run, final_log, completes, bounds, found, checked):
    """lost and misplaced: every PUT_OK must be in the final log exactly at the offset (and
    with the size) its put returned (below the final master's min_offset too, unless the run
    enabled retention); a stored put may be cut, but if present it must be where its put
    said."""
    lo = run.master_min_offset()
    allowed = unverifiable = present_unknown = 0
    for tag, op in completes.items():
        outcome = op.get("outcome")
        offset = op.get("offset")
        if outcome == "unknown":
            present_unknown += tag in final_log.offsets_of
            continue
        if outcome not in ("ok", "stored"):
            continue
        below = offset is not None and offset < lo
        if below and run.retention:
            unverifiable += 1
            continue
        offsets = final_log.offsets_of.get(tag)
        if not offsets:
            if outcome != "ok":
                continue
            if _allowed_by(bounds, op.get("node"), offset, op["t"]):
                allowed += 1
            else:
                why = (f" (it lies below {run.master}'s min_offset {lo}, and the run has no "
                       f"retention)" if below else "")
                found.add("lost", f"PUT_OK {tag} (offset {offset}, epoch {op.get('epoch')}, "
                          f"answered by {op.get('node')} at {op['t']:.3f}) is not in "
                          f"{run.master}'s log{why}", tag=tag, offset=offset)
            continue
        if offset is None:
            continue
        rec = final_log.at.get(offset)
        if offset not in offsets:
            found.add("misplaced", f"{op.get('status')} {tag} returned offset {offset}, the final "
                      f"log has it at {offsets}", tag=tag, offset=offset)
        elif op.get("size") is not None and rec["size"] != op["size"]:
            found.add("misplaced", f"{op.get('status')} {tag} at {offset} is {rec['size']} bytes, "
                      f"its put returned {op['size']}", tag=tag, offset=offset)
    checked["async_allowed_lost"] = allowed
    checked["put_ok_unverifiable"] = unverifiable
    checked["unknown_in_final_log"] = present_unknown


def check_duplicates_and_phantoms(run, logs, invokes, completes, found):
    """duplicate: no tag twice in one node's log (a producer never reuses a tag, so any repeat
    is the system's). phantom: no record whose tag nobody invoked, or whose put ended `fail`
    (refused before admission: definitely not stored)."""
    phantoms = defaultdict(list)
    for node, log in logs.items():
        for tag, offsets in log.offsets_of.items():
            if len(offsets) > 1:
                found.add("duplicate", f"{tag} is {len(offsets)} times in {node}'s log at "
                          f"{offsets[:5]}", tag=tag, node=node)
            if tag not in invokes or (completes.get(tag) or {}).get("outcome") == "fail":
                phantoms[tag].append((node, offsets[0]))
    for tag, where in phantoms.items():
        why = "nobody invoked it" if tag not in invokes else "its put ended fail"
        found.add("phantom", f"{tag} is in the log ({where[:3]}) but {why}", tag=tag)


def check_corrupt(run, final_log, invokes, found):
    """corrupt: a record of the final master's log whose tag a producer invoked must carry the
    invoke's topic, queue_id and body_crc (each compared when both sides have it)."""
    for offset in sorted(final_log.at):
        rec = final_log.at[offset]
        inv = invokes.get(rec["tag"])
        if inv is None:
            continue
        diffs = [(field, inv.get(field), rec.get(field)) for field in ("topic", "queue_id", "body_crc")
                 if inv.get(field) is not None and rec.get(field) is not None
                 and inv.get(field) != rec.get(field)]
        if diffs:
            def show(f, v):
                return f"{v:#010x}" if f == "body_crc" and isinstance(v, int) else repr(v)

            found.add("corrupt", f"{rec['tag']} at {offset} in {run.master}'s log has "
                      + ", ".join(f"{f} {show(f, got)} (its invoke: {show(f, want)})"
                                  for f, want, got in diffs),
                      tag=rec["tag"], offset=offset, fields=[f for f, _, _ in diffs])


def _put_time(run, read):
    """When the put of the record a reader saw completed (else was invoked; else the read's own
    time). An ASYNC read is judged by its record: the old master serves what it holds, up to its
    max offset, until it is demoted (a crashed one restarts fenced against puts, not reads), so a
    read of a record whose loss the bound allows is allowed whenever it happened."""
    op = run.completes.get(read.get("tag")) or run.invokes.get(read.get("tag"))
    return op["t"] if op else read.get("t")


def check_stale_reads(run, final_log, bounds, found, checked):
    """stale-read: a record a reader saw without include_unconfirmed (so: confirmed) must still
    be in the final log at that offset with that tag (and size); below the final master's
    min_offset too unless the run enabled retention. In ASYNC mode Read serves up to
    max_offset, unconfirmed, so a read the ASYNC bound allows (on the old master, at or past
    the promoted slave's ack, its put inside the bound's time window) is allowed too."""
    lo = run.master_min_offset()
    unverifiable = allowed = 0
    for read in run.reads:
        below = read["offset"] < lo
        if below and run.retention:
            unverifiable += 1
            continue
        rec = final_log.at.get(read["offset"])
        same = rec is not None and rec["tag"] == read["tag"] and (
            read.get("size") is None or rec["size"] == read["size"]
        )
        if not same and _allowed_by(bounds, read.get("node"), read["offset"], _put_time(run, read)):
            allowed += 1
        elif not same:
            now = f"{rec['tag']} ({rec['size']} bytes)" if rec else "no record"
            why = (f" (below {run.master}'s min_offset {lo}, and the run has no retention)"
                   if below else "")
            found.add("stale-read", f"{read.get('reader')} read {read['tag']} at {read['offset']} "
                      f"on {read.get('node')} at {read['t']:.3f}; the final log has {now} "
                      f"there{why}", tag=read["tag"], offset=read["offset"])
    checked["reads_unverifiable"] = unverifiable
    checked["async_allowed_stale_reads"] = allowed


# -- epochs ----------------------------------------------------------------------------------


def parse_epoch_file(path):
    """The entries of a `<data_dir>/epoch` file, or None if there is none. Accepts the state-file
    format (`hasync-state epoch v1 len=<n> crc32=<hex>` then a JSON list), the legacy JSON object
    with "entries", and a plain JSON list. Raises ValueError for a damaged file."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    if data.startswith(b"hasync-state "):
        header, _, payload = data.partition(b"\n")
        fields = dict(w.split("=", 1) for w in header.decode("ascii", "replace").split() if "=" in w)
        if "len" in fields and int(fields["len"]) != len(payload):
            raise ValueError(f"payload of {len(payload)} bytes, header says {fields['len']}")
        if "crc32" in fields and int(fields["crc32"], 16) != zlib.crc32(payload):
            raise ValueError("payload CRC-32 differs from the header")
        data = payload
    try:
        doc = json.loads(data)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON: {e}") from None
    entries = doc.get("entries") if isinstance(doc, dict) else doc
    if not isinstance(entries, list):
        raise ValueError("no list of entries")
    return entries


def _normalize(entries):
    """[(epoch, start_offset, master_name)] with the implicit (0, 0) first."""
    out = [(int(e["epoch"]), int(e["start_offset"]), e.get("master_name") or "") for e in entries]
    if not out or out[0][:2] != (0, 0):
        out.insert(0, (0, 0, ""))
    return out


def _same_entry(a, b):
    return a[:2] == b[:2] and (a[2] == b[2] or not a[2] or not b[2])


def epoch_histories(run, found):
    """{label: normalized history} from each node's final API view and its epoch file."""
    histories = {}
    for node in run.nodes:
        if node in run.final and run.final[node].get("epochs") is not None:
            histories[f"{node} (API)"] = _normalize(run.final[node]["epochs"])
        path = os.path.join(run.data_dir(node), "epoch")
        try:
            entries = parse_epoch_file(path)
        except (ValueError, KeyError, TypeError) as e:
            found.add("epoch-divergent", f"{node}: epoch file {path} unreadable: {e}", node=node)
            continue
        if entries is not None:
            histories[f"{node} (disk)"] = _normalize(entries)
    return histories


def check_epoch_histories(histories, found):
    """epoch-divergent: each history increases, and every two are prefix-consistent (same epochs
    with the same starts and masters, none missing in the middle). One report per pair of
    nodes (a node's API and disk histories are a pair too)."""
    for label, h in histories.items():
        for prev, cur in zip(h, h[1:]):
            if cur[0] <= prev[0] or cur[1] < prev[1]:
                found.add("epoch-divergent", f"{label}: epoch {cur[:2]} does not follow {prev[:2]}")
    labels = sorted(histories)
    reported = set()
    for i, a in enumerate(labels):
        for b in labels[i + 1:]:
            nodes = (a.split()[0], b.split()[0])
            if nodes in reported:
                continue
            ha, hb = histories[a], histories[b]
            j = next((k for k, (x, y) in enumerate(zip(ha, hb)) if not _same_entry(x, y)), None)
            if j is not None:
                reported.add(nodes)
                found.add("epoch-divergent", f"{a} and {b} differ at entry {j}: {ha[j]} vs {hb[j]}",
                          histories={a: ha, b: hb})


def check_one_writer(run, histories, final_log, completes, found, checked):
    """two-writers: every PUT_OK of epoch e was answered by the master the history names for e
    (one node per epoch), at an offset inside e's range [start_e, start_next)."""
    history = histories.get(f"{run.master} (API)") or histories.get(f"{run.master} (disk)")
    if history is None:
        history = max(histories.values(), key=len, default=[(0, 0, "")])
    index = {e[0]: i for i, e in enumerate(history)}
    writers = defaultdict(set)
    no_epoch = 0
    for tag, op in completes.items():
        if op.get("outcome") != "ok":
            continue
        epoch = op.get("epoch")
        if epoch is None:
            no_epoch += 1
            continue
        node = op.get("node")
        writers[epoch].add(node)
        if epoch not in index:
            found.add("two-writers", f"PUT_OK {tag} by {node} in epoch {epoch}, which is not in "
                      f"{run.master}'s history", tag=tag, epoch=epoch)
            continue
        i = index[epoch]
        master = history[i][2] or (run.meta.get("initial_master") if epoch == 0 else None)
        if master and node != master:
            found.add("two-writers", f"PUT_OK {tag} in epoch {epoch} answered by {node}; the "
                      f"history names {master}", tag=tag, epoch=epoch)
            continue
        offset = op.get("offset")
        start = history[i][1]
        end = history[i + 1][1] if i + 1 < len(history) else None
        in_log = offset is not None and tag in final_log.offsets_of and offset in final_log.offsets_of[tag]
        if in_log and (offset < start or (end is not None and offset >= end)):
            found.add("two-writers", f"PUT_OK {tag} of epoch {epoch} at {offset}, outside the "
                      f"epoch's range [{start}, {end})", tag=tag, epoch=epoch)
    for epoch, nodes in writers.items():
        if len(nodes) > 1:
            found.add("two-writers", f"epoch {epoch} has PUT_OKs from {sorted(map(str, nodes))}",
                      epoch=epoch)
    checked["put_ok_without_epoch"] = no_epoch


def check_epochs_grow(run, found):
    """epoch-regressed: a node's epoch never goes down between two status samples (the epoch is
    durable; going back means a node forgot a fence or a promotion)."""
    samples = defaultdict(list)
    for s in sorted(run.status, key=lambda s: s.get("t", 0)):
        if s.get("epoch") is not None:
            samples[s["node"]].append((s["t"], s["epoch"]))
    for node, fin in run.final.items():
        epoch = (fin.get("status") or {}).get("epoch")
        if epoch is not None:
            samples[node].append((float("inf"), epoch))
    for node, seq in samples.items():
        for (t0, e0), (t1, e1) in zip(seq, seq[1:]):
            if e1 < e0:
                when = "in its final status" if t1 == float("inf") else f"at {t1:.3f}"
                found.add("epoch-regressed", f"{node}'s epoch went from {e0} (at {t0:.3f}) to {e1} "
                          f"{when}", node=node)
                break


def check_cut_off_windows(run, completes, found, checked):
    """acked-while-cut-off: a SYNC master that no slave can reach (the harness logged the
    window as `expect_no_put_ok` ... `expect_no_put_ok_end` for that node; a node may have
    several) must not answer PUT_OK for a put it was sent inside the window and answered before
    the window closed: no slave can have acknowledged it. (A put answered after the window may
    legitimately be PUT_OK.) The outcomes of the puts sent to it inside the windows are
    reported (FLUSH_SLAVE_TIMEOUT / SLAVE_NOT_AVAILABLE expected; SERVICE_NOT_AVAILABLE when a
    demotion ended a waiting put)."""
    windows = []  # [node, start, end]
    for f in run.faults:
        for node in f.get("nodes", []):
            if f.get("kind") == "expect_no_put_ok":
                windows.append([node, f["detail"]["start"], None])
            elif f.get("kind") == "expect_no_put_ok_end":
                for w in windows:
                    if w[0] == node and w[2] is None:
                        w[2] = f["detail"]["end"]
    outcomes = Counter()
    for node, start, end in windows:
        for op in completes.values():
            invoked = run.invoke_t.get(op["tag"])
            if op.get("node") != node or invoked is None or invoked < start:
                continue
            if end is not None and invoked > end:
                continue
            outcomes[op.get("status") or op.get("grpc_code") or op.get("outcome")] += 1
            if op.get("outcome") == "ok" and (end is None or op["t"] < end):
                found.add("acked-while-cut-off",
                          f"{op['tag']} answered PUT_OK by {node} at {op['t']:.3f}, sent at "
                          f"{invoked:.3f}, while no slave could reach it (from {start:.3f})",
                          tag=op["tag"], node=node)
    checked["cut_off_windows"] = windows
    checked["cut_off_outcomes"] = dict(outcomes)


NOT_FAULTS = ("start", "proxy", "bite")


def check_bites(run, found):
    """fault-did-not-bite: every `bite` record (the harness's proof that a fault took effect)
    must say ok: true."""
    for f in run.faults:
        if f.get("kind") != "bite":
            continue
        d = f.get("detail") or {}
        if d.get("ok") is not True:
            found.add("fault-did-not-bite", f"fault {d.get('fault')!r} on {f.get('nodes')} at "
                      f"{f.get('t', 0):.3f} did not bite (ok {d.get('ok')!r}): "
                      f"{d.get('evidence')}", fault=d.get("fault"), nodes=f.get("nodes"))


def check_vacuous(run, completes, found, checked):
    """vacuous: the run proved nothing if no PUT_OK completed before the first fault (the first
    faults.jsonl record whose kind is not start/proxy/bite), or none after run.json heal_t
    (when set; negative controls are exempt from this part), or a node's reader saw no record."""
    oks = sorted(op["t"] for op in completes.values() if op.get("outcome") == "ok")
    faults = [f["t"] for f in run.faults if f.get("kind") not in NOT_FAULTS and "t" in f]
    first = min(faults, default=None)
    if first is None:
        if not oks:
            found.add("vacuous", "no PUT_OK completed at all (and no fault was logged)")
    elif not any(t < first for t in oks):
        found.add("vacuous", f"no PUT_OK completed before the first fault at {first:.3f}")
    heal = run.meta.get("heal_t")
    if heal is not None and not run.meta.get("expect") and not any(t > heal for t in oks):
        found.add("vacuous", f"no PUT_OK completed after the heal at {heal:.3f}")
    seen = Counter(r.get("node") for r in run.reads)
    for node in run.nodes:
        if not seen[node]:
            found.add("vacuous", f"no reader saw a record on {node}", node=node)
    checked["put_ok_before_first_fault"] = sum(1 for t in oks if first is None or t < first)
    checked["put_ok_after_heal"] = sum(1 for t in oks if heal is not None and t > heal)
    checked["reads_per_node"] = {n: seen[n] for n in run.nodes}


# -- figures ---------------------------------------------------------------------------------


def unavailability(invokes, completes):
    """Windows longer than UNAVAILABLE_GAP_S with no PUT_OK while producers ran."""
    if not invokes:
        return {"windows": [], "longest_s": 0.0, "total_s": 0.0}
    start = min(op["t"] for op in invokes.values())
    stop = max(op["t"] for op in invokes.values())
    oks = sorted(op["t"] for op in completes.values()
                 if op.get("outcome") == "ok" and start <= op["t"] <= stop)
    points = [start] + oks + [stop]
    windows = [[a, b] for a, b in zip(points, points[1:]) if b - a > UNAVAILABLE_GAP_S]
    lengths = [b - a for a, b in windows]
    return {
        "windows": [[round(a, 3), round(b, 3)] for a, b in windows],
        "longest_s": round(max(lengths, default=0.0), 3),
        "total_s": round(sum(lengths), 3),
    }


# -- the verdict -----------------------------------------------------------------------------


def check(run_dir):
    """Checks one run directory, writes RUN_DIR/verdict.json and returns the verdict."""
    run = Run(run_dir)
    found = Findings()
    checked = {}
    check_converged(run, found)
    scans = scan_disks(run, found)
    check_replicas(run, scans, found)

    if run.master in run.final:
        final_log = Log(run.final[run.master].get("records", []))
    elif run.master in scans:
        final_log = Log([{"offset": r.offset, "size": r.size, "tag": r.tag, "topic": r.topic,
                          "body_crc": r.body_crc} for r in scans[run.master].records])
    else:
        final_log = Log([])
    logs = {n: Log(fin.get("records", [])) for n, fin in run.final.items()}

    invokes, completes = _completions(run)
    run.invokes, run.completes = invokes, completes
    bounds, bound_texts = async_bounds(run)
    check_puts(run, final_log, completes, bounds, found, checked)
    check_duplicates_and_phantoms(run, logs, invokes, completes, found)
    check_corrupt(run, final_log, invokes, found)
    check_stale_reads(run, final_log, bounds, found, checked)
    histories = epoch_histories(run, found)
    check_epoch_histories(histories, found)
    check_one_writer(run, histories, final_log, completes, found, checked)
    check_epochs_grow(run, found)
    run.invoke_t = {tag: op["t"] for tag, op in invokes.items()}
    check_cut_off_windows(run, completes, found, checked)
    check_bites(run, found)
    check_vacuous(run, completes, found, checked)

    counts = count_puts(invokes, completes)
    expect = list(run.meta.get("expect") or [])
    if expect:
        ok = all(found.counts[k] > 0 for k in expect)
    else:
        ok = not found.counts
    # time to converge: from the end of the load (the producers stopped after the heal) to
    # every node holding the master's max offset
    heal = run.meta.get("clients_stopped_t") or run.meta.get("heal_t")
    converged = run.meta.get("converged_t")
    checked.update({
        "put_ok": counts.get("PUT_OK", 0),
        "puts": len(invokes),
        "reads": len(run.reads),
        "records": {n: len(fin.get("records", [])) for n, fin in run.final.items()},
        "disk_records": {n: len(s.records) for n, s in scans.items()},
        "epoch_histories": sorted(histories),
        "final_master": run.master,
    })
    verdict = {
        "verdict": "pass" if ok else "fail",
        "scenario": run.meta.get("scenario"),
        "seed": run.meta.get("seed"),
        "anomalies": found.listing(),
        "anomaly_counts": dict(found.counts),
        "counts": counts,
        "unknown": counts.get("unknown", 0),
        "unavailability": unavailability(invokes, completes),
        "converge_s": round(converged - heal, 3) if heal is not None and converged is not None else None,
        "bounds": bound_texts,
        "expect": expect,
        "checked": checked,
    }
    with open(os.path.join(run_dir, "verdict.json"), "w", encoding="utf-8") as f:
        json.dump(verdict, f, indent=1)
    return verdict


def report(run_dir, verdict):
    """A readable report of one verdict."""
    lines = [f"{run_dir}: {verdict['verdict'].upper()}"
             + (f" (negative control, expects {verdict['expect']})" if verdict["expect"] else "")]
    lines.append("  puts: " + ", ".join(f"{k} {v}" for k, v in sorted(verdict["counts"].items())))
    u = verdict["unavailability"]
    lines.append(f"  unavailability: {len(u['windows'])} window(s), longest {u['longest_s']} s, "
                 f"total {u['total_s']} s; converge: {verdict['converge_s']} s")
    c = verdict["checked"]
    lines.append(f"  checked: {c['put_ok']} PUT_OK, {c['reads']} reads, records {c['records']}, "
                 f"final master {c['final_master']}")
    for text in verdict["bounds"]:
        lines.append(f"  bound: {text}")
    if not verdict["anomaly_counts"]:
        lines.append("  anomalies: none")
    for a in verdict["anomalies"]:
        lines.append(f"  {a['kind']}: {a['count']}")
        lines.extend(f"    - {e['detail']}" for e in a["examples"])
        if a["count"] > len(a["examples"]):
            lines.append(f"    ... and {a['count'] - len(a['examples'])} more")
    return "\n".join(lines)


def main(argv):
    if not argv:
        print("usage: python -m chaos.checker RUN_DIR [RUN_DIR...]", file=sys.stderr)
        return 2
    failed = False
    for run_dir in argv:
        verdict = check(run_dir)
        print(report(run_dir, verdict))
        failed |= verdict["verdict"] != "pass"
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
