"""Unit tests of the checker side: the scanner and the synthetic encoder against upstream
RocketMQ's golden record vectors (tests/it/data/records.json), the JSONL reader, and the
negative controls. Run from tests/chaos: `python3 -m unittest test_checker_side`."""

import json
import os
import tempfile
import unittest
import zlib

from chaos import checker, jsonl, segments, synthetic

VECTORS = os.path.join(os.path.dirname(__file__), "..", "it", "data", "records.json")


def _body(text):
    if text.startswith("UTF-8 "):
        return json.loads(text[len("UTF-8 "):]).encode()
    if text.startswith("empty"):
        return b""
    if text.startswith("10240 bytes"):
        return bytes(ord("a") + i % 26 for i in range(10240))
    raise ValueError(text)


def _host(text):
    """The vectors write IPv6 hosts as `2001:db8::10:54321`."""
    host, _, port = text.rpartition(":")
    return f"[{host}]:{port}" if ":" in host else text


class Vectors(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(VECTORS) as f:
            cls.doc = json.load(f)
        cls.messages = {v["name"]: v for v in cls.doc["vectors"] if v["kind"] == "message"}

    def encode(self, v):
        i = v["inputs"]
        return synthetic.encode_record(
            v["physical_offset"], _body(i["body"]), i["topic"], queue_id=i["queue_id"],
            flag=i["flag"], properties=i["properties_string"].encode(),
            sys_flag=i["transaction_type_sysflag_bits"], born_ms=i["born_timestamp"],
            born_host=_host(i["born_host"]), store_ms=i["store_timestamp"],
            store_host=_host(i["store_host"]), reconsume_times=i["reconsume_times"],
            prepared_transaction_offset=i["prepared_transaction_offset"],
            queue_offset=i["assigned_queue_offset"])

    def test_the_encoder_writes_every_vector_byte_for_byte(self):
        for name, v in self.messages.items():
            with self.subTest(name):
                self.assertEqual(self.encode(v).hex(), v["hex"])

    def scan_one(self, raw, offset):
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "commitlog"))
            with open(os.path.join(d, "commitlog", f"{offset:020d}"), "wb") as f:
                f.write(raw + bytes(64))
            return segments.scan(d)

    def test_the_scanner_reads_every_vector(self):
        for name, v in self.messages.items():
            with self.subTest(name):
                scan = self.scan_one(bytes.fromhex(v["hex"]), v["physical_offset"])
                self.assertEqual(scan.errors, [])
                (rec,) = scan.records
                self.assertEqual((rec.offset, rec.size, rec.topic),
                                 (v["physical_offset"], v["size"], v["inputs"]["topic"]))
                self.assertEqual(rec.tag, segments.tag_of(_body(v["inputs"]["body"])))
                self.assertEqual(rec.body_crc, zlib.crc32(_body(v["inputs"]["body"])))

    def test_an_unmasked_body_crc_is_damage(self):
        v = self.messages["k_crc_top_bit"]
        raw = bytearray.fromhex(v["hex"])
        raw[8] |= 0x80  # 0x7FAB723A -> 0xFFAB723A, the CRC-32 without the mask
        scan = self.scan_one(bytes(raw), v["physical_offset"])
        self.assertEqual(len(scan.records), 1)
        self.assertIn("BODYCRC", scan.errors[0].reason)

    def test_the_two_file_commitlog_directory(self):
        cl = self.doc["commitlog_dir"]
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "commitlog"))
            for f in cl["files"]:
                with open(os.path.join(d, "commitlog", f["name"]), "wb") as out:
                    out.write(bytes.fromhex(f["hex"]))
            scan = segments.scan(d)
            self.assertEqual(scan.errors, [])
            self.assertEqual(scan.end, int(cl["end_offset"]))
            want = [(r["physical_offset"], r["size"]) for r in cl["records"]]
            got = sorted([(r.offset, r.size) for r in scan.records]
                         + [(b.offset, b.size) for b in scan.blanks])
            self.assertEqual(got, want)
            self.assertEqual(segments.read_range(d, 740, 750),
                             bytes.fromhex(cl["files"][0]["hex"])[740:] +
                             bytes.fromhex(cl["files"][1]["hex"])[:5])
            self.assertEqual(len(segments.scan(d, end=745).records), 4)


class Jsonl(unittest.TestCase):
    def test_a_torn_last_line_is_ignored_and_a_missing_file_is_empty(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "h.jsonl")
            self.assertEqual(jsonl.read(path), [])
            with jsonl.Writer(path) as w:
                w.write({"a": 1})
            jsonl.append(path, {"a": 2})
            with open(path, "a") as f:
                f.write('{"a": 3, "b"')
            self.assertEqual(jsonl.read(path), [{"a": 1}, {"a": 2}])


class Controls(unittest.TestCase):
    def test_every_negative_control_names_its_anomaly(self):
        for r in synthetic.run():
            with self.subTest(r["name"]):
                self.assertTrue(r["ok"], r)

    def test_the_async_bound_is_timed_from_its_fault_t(self):
        """detail.fault_t, when present, is the fault's time (not the record's t)."""
        with tempfile.TemporaryDirectory() as root:
            s = synthetic.async_failover(root, "a", None, False, 0.0, read_cut=False)
            bound = [f for f in s.faults if f["kind"] == "async_bound"][0]
            bound["t"] += 10.0  # a late-written record: its own t would put the cut out of bounds
            self.assertEqual(checker.check(s.write())["anomaly_counts"], {})
            bound["detail"]["fault_t"] += 10.0
            self.assertEqual(set(checker.check(s.write())["anomaly_counts"]), {"lost"})

    def test_a_bite_record_without_ok_did_not_bite(self):
        with tempfile.TemporaryDirectory() as root:
            s = synthetic.baseline(root)
            s.faults.append({"t": s.tick(), "kind": "bite", "nodes": ["n2"],
                             "detail": {"fault": "kill9"}})
            self.assertEqual(checker.check(s.write())["anomaly_counts"], {"fault-did-not-bite": 1})


class Docs(unittest.TestCase):
    def test_the_anomaly_table_names_every_kind(self):
        path = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "testing.md")
        with open(path) as f:
            rows = [line.split("|")[1].strip().strip("`") for line in f
                    if line.startswith("| `")]
        self.assertEqual([k for k in rows if k in checker.KINDS], list(checker.KINDS))


if __name__ == "__main__":
    unittest.main()
