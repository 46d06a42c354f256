"""On-disk commitlog scanner, independent of the Rust code (stdlib only).

A node's `<data_dir>/commitlog/` holds segment files named by their 20-digit start offset. Each
holds RocketMQ commitlog records back to back (all integers big-endian) and, once the next record
no longer fits, an end-of-file BLANK record (`remaining: i32`, magic 0xCBD43194) that stands for
the rest of the file. A message record (RocketMQ 5.x `MessageExtEncoder`; offsets for IPv4 hosts,
each IPv6 host adds 12 bytes):

     0 TOTALSIZE i32        4 MAGICCODE i32        8 BODYCRC i32         12 QUEUEID i32
    16 FLAG i32            20 QUEUEOFFSET i64     28 PHYSICALOFFSET i64  36 SYSFLAG i32
    40 BORNTIMESTAMP i64   48 BORNHOST 8|20       .. STORETIMESTAMP i64  .. STOREHOST 8|20
    .. RECONSUMETIMES i32  .. PREPAREDTXOFFSET i64
    .. BODYLENGTH i32 + body, TOPICLENGTH i8 (V1 magic) | i16 (V2 magic) + topic,
       PROPERTIESLENGTH i16 + properties

SYSFLAG bit 0x10 makes BORNHOST IPv6 (16-byte address), bit 0x20 STOREHOST. BODYCRC is
`crc32(body) & 0x7FFFFFFF` (0 for an empty body), as upstream's `UtilAll.crc32`.
"""

import os
import struct
import zlib
from dataclasses import dataclass

MAGIC_V1 = 0xDAA320A7
MAGIC_V2 = 0xDAA320AB
BLANK_MAGIC = 0xCBD43194
BLANK_HEADER_SIZE = 8
SYSFLAG_BORNHOST_V6 = 0x10
SYSFLAG_STOREHOST_V6 = 0x20
BODY_CRC_MASK = 0x7FFFFFFF

# TOTALSIZE .. SYSFLAG: everything before BORNTIMESTAMP.
_HEAD = struct.Struct(">iIiiiqqi")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_SEGMENT_NAME_LEN = 20
# The smallest V1 record: fixed fields, IPv4 hosts, empty body, 1-byte topic length, no topic,
# no properties (91 bytes).
MIN_RECORD_SIZE = _HEAD.size + 8 + 8 + 8 + 8 + 4 + 8 + 4 + 1 + 2


@dataclass(frozen=True)
class Record:
    """One message record as it lies on disk. `crc` is the CRC-32 of all its bytes, so two
    records with equal (offset, size, crc) hold the same bytes (up to CRC collisions);
    `body_crc` is `zlib.crc32(body)` (unsigned, unmasked: the harness's body_crc, not the
    record's BODYCRC field)."""

    offset: int
    size: int
    tag: str
    topic: str
    crc: int
    body_crc: int


@dataclass(frozen=True)
class Blank:
    """An end-of-file blank record; `crc` covers its 8 header bytes only, since the rest of the
    file behind it is not data (never written, or stale bytes a truncation left)."""

    offset: int
    size: int
    crc: int


@dataclass(frozen=True)
class ScanError:
    """A record the scan could not accept (damage), at `offset`."""

    offset: int
    reason: str


@dataclass
class Scan:
    """What `scan` found: messages and blanks in offset order, damaged records, where the
    segments start (`min_offset`) and where the scan stopped (`end`)."""

    records: list
    blanks: list
    errors: list
    min_offset: int
    end: int
    stop_reason: str


def tag_of(body):
    """The put's tag: the body up to its first space, as text."""
    head = body.split(b" ", 1)[0]
    return head.decode("utf-8", errors="replace")


def segment_files(data_dir):
    """[(start_offset, path)] of the commitlog segments, in offset order."""
    directory = os.path.join(data_dir, "commitlog")
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    out = [
        (int(name), os.path.join(directory, name))
        for name in names
        if len(name) == _SEGMENT_NAME_LEN and name.isdigit()
    ]
    out.sort()
    return out


def _decode_message(buf, pos, offset, magic):
    """(size, tag, topic, error, body_crc) of the message record at buf[pos:] (commitlog
    `offset`); a structurally broken record returns size None; a CRC mismatch returns its size
    and an error."""
    (total,) = _I32.unpack_from(buf, pos)
    if total < MIN_RECORD_SIZE or pos + total > len(buf):
        return None, None, None, f"TOTALSIZE {total} does not fit the segment", None
    _, _, body_crc, _, _, _, physical, sys_flag = _HEAD.unpack_from(buf, pos)
    if physical != offset:
        return None, None, None, f"PHYSICALOFFSET {physical} differs from the position", None
    end = pos + total
    p = pos + _HEAD.size + 8  # BORNTIMESTAMP
    p += 20 if sys_flag & SYSFLAG_BORNHOST_V6 else 8
    p += 8  # STORETIMESTAMP
    p += 20 if sys_flag & SYSFLAG_STOREHOST_V6 else 8
    p += 4 + 8  # RECONSUMETIMES, PREPAREDTRANSACTIONOFFSET
    if p + 4 > end:
        return None, None, None, "fixed fields run past TOTALSIZE", None
    (body_len,) = _I32.unpack_from(buf, p)
    p += 4
    if body_len < 0 or p + body_len > end:
        return None, None, None, f"BODYLENGTH {body_len} runs past TOTALSIZE", None
    body = bytes(buf[p : p + body_len])
    p += body_len
    if magic == MAGIC_V2:
        if p + 2 > end:
            return None, None, None, "topic length runs past TOTALSIZE", None
        (topic_len,) = _I16.unpack_from(buf, p)
        p += 2
    else:
        if p + 1 > end:
            return None, None, None, "topic length runs past TOTALSIZE", None
        topic_len = struct.unpack_from(">b", buf, p)[0]
        p += 1
    if topic_len <= 0 or p + topic_len + 2 > end:
        return None, None, None, f"TOPICLENGTH {topic_len} is not inside the record", None
    topic = bytes(buf[p : p + topic_len]).decode("utf-8", errors="replace")
    p += topic_len
    (props_len,) = _I16.unpack_from(buf, p)
    p += 2
    if props_len < 0 or p + props_len != end:
        return None, None, None, f"fields add up to {p + props_len - pos}, TOTALSIZE is {total}", None
    full_crc = zlib.crc32(body)
    computed = full_crc & BODY_CRC_MASK if body else 0
    error = None
    if computed != body_crc:
        error = f"BODYCRC {body_crc:#010x} != crc32(body) {computed:#010x}"
    return total, tag_of(body), topic, error, full_crc


def scan(data_dir, end=None):
    """Walks every segment of `data_dir` from the first one, up to `end` (exclusive; the node's
    max_offset) or the first position that holds no record. A structurally broken record stops
    the walk with a ScanError; a record whose only fault is its BODYCRC is reported as a
    ScanError too but skipped over (its size is trustworthy), so one damaged body does not hide
    the rest of the log from the comparison."""
    files = segment_files(data_dir)
    records, blanks, errors = [], [], []
    if not files:
        return Scan(records, blanks, errors, 0, 0, "no commitlog segments")
    min_offset = files[0][0]
    offset = min_offset
    stop_reason = "end of the last segment"
    for index, (start, path) in enumerate(files):
        if start != offset:
            stop_reason = f"segment {start} does not start where the previous one ended ({offset})"
            if start > offset:
                errors.append(ScanError(offset, stop_reason))
            break
        with open(path, "rb") as f:
            buf = memoryview(f.read())
        pos = 0
        next_segment = False
        while True:
            if end is not None and offset >= end:
                return Scan(records, blanks, errors, min_offset, offset, "reached the end asked")
            if pos + BLANK_HEADER_SIZE > len(buf):
                stop_reason = "the segment ends without a blank record"
                break
            total, magic = struct.unpack_from(">iI", buf, pos)
            if total == 0:
                stop_reason = "zero TOTALSIZE (never written)"
                break
            if magic == BLANK_MAGIC:
                if total < BLANK_HEADER_SIZE or pos + total != len(buf):
                    stop_reason = f"blank record of {total} bytes does not end the segment"
                    errors.append(ScanError(offset, stop_reason))
                    break
                header = bytes(buf[pos : pos + BLANK_HEADER_SIZE])
                blanks.append(Blank(offset, total, zlib.crc32(header)))
                offset += total
                next_segment = True
                break
            if magic not in (MAGIC_V1, MAGIC_V2):
                stop_reason = f"unknown magic {magic:#010x}"
                errors.append(ScanError(offset, stop_reason))
                break
            size, tag, topic, error, body_crc = _decode_message(buf, pos, offset, magic)
            if size is None:
                stop_reason = error
                errors.append(ScanError(offset, error))
                break
            if end is not None and offset + size > end:
                stop_reason = f"record of {size} bytes runs past the end asked ({end})"
                errors.append(ScanError(offset, stop_reason))
                break
            if error:
                errors.append(ScanError(offset, error))
            records.append(Record(offset, size, tag, topic, zlib.crc32(buf[pos : pos + size]),
                                  body_crc))
            pos += size
            offset += size
        if not next_segment:
            break
        if index == len(files) - 1:
            stop_reason = "end of the last segment"
    return Scan(records, blanks, errors, min_offset, offset, stop_reason)


def read_range(data_dir, start, end):
    """The raw commitlog bytes [start, end) of `data_dir`, across segments (shorter when the
    segments end before `end`)."""
    out = bytearray()
    for seg_start, path in segment_files(data_dir):
        size = os.path.getsize(path)
        lo, hi = max(start, seg_start), min(end, seg_start + size)
        if lo >= hi:
            continue
        with open(path, "rb") as f:
            f.seek(lo - seg_start)
            out += f.read(hi - lo)
    return bytes(out)
