//! The RocketMQ commitlog message record: constants, encoder and checking decoder.
//!
//! Byte-compatible with upstream `MessageExtEncoder`, `CommitLog.DefaultAppendMessageCallback`
//! and `CommitLog.checkMessageAndReturnSize` (rocketmq-all-5.3.3, default store config). All
//! integers are big-endian. Layout (offsets for IPv4 hosts; each IPv6 host adds 12 bytes):
//!
//! ```text
//!  0 TOTALSIZE i32        4 MAGICCODE i32       8 BODYCRC i32        12 QUEUEID i32
//! 16 FLAG i32            20 QUEUEOFFSET i64    28 PHYSICALOFFSET i64 36 SYSFLAG i32
//! 40 BORNTIMESTAMP i64   48 BORNHOST 8|20      56 STORETIMESTAMP i64 64 STOREHOST 8|20
//! 72 RECONSUMETIMES i32  76 PREPAREDTXOFFSET i64
//! 84 BODYLENGTH i32 + body, TOPICLENGTH i8 (V1) | i16 (V2) + topic, PROPERTIESLENGTH i16 + props
//! ```
//!
//! A file ends with a blank record (`remaining: i32`, [`BLANK_MAGIC`]) once a record no longer
//! fits. This module is pure: no I/O, no clocks, no knowledge of files beyond that blank.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use bytes::{Buf, BufMut, Bytes};

/// Magic of a V1 record: 1-byte signed topic length, so a topic of at most 127 bytes.
pub const MAGIC_V1: i32 = 0xDAA3_20A7_u32 as i32;
/// Magic of a V2 record (RocketMQ >= 5.1.0): 2-byte topic length. Written only for topics longer
/// than 127 bytes, so that 4.x readers can still read every other record.
pub const MAGIC_V2: i32 = 0xDAA3_20AB_u32 as i32;
/// Magic of the end-of-file blank record: `remaining: i32` followed by this magic.
pub const BLANK_MAGIC: i32 = 0xCBD4_3194_u32 as i32;
/// Bytes written for the end-of-file blank record (the rest of the file is left untouched).
pub const BLANK_HEADER_SIZE: usize = 8;
/// Longest topic the encoder accepts, in UTF-8 bytes. The decoder accepts whatever V2 can hold.
pub const MAX_TOPIC_BYTES: usize = 255;
/// Longest properties string, in bytes (the length is stored as a signed 16-bit integer).
pub const MAX_PROPERTIES_BYTES: usize = 32767;

/// SYSFLAG bit: the body is compressed.
pub const SYSFLAG_COMPRESSED: i32 = 0x1;
/// SYSFLAG bit: the message has several tags.
pub const SYSFLAG_MULTI_TAGS: i32 = 0x2;
/// SYSFLAG mask of the transaction type (bits 2-3).
pub const SYSFLAG_TRANSACTION_MASK: i32 = 0xC;
/// Transaction type: not a transactional message.
pub const SYSFLAG_TRANSACTION_NOT_TYPE: i32 = 0x0;
/// Transaction type: half (prepared) message; not dispatched to a consume queue.
pub const SYSFLAG_TRANSACTION_PREPARED: i32 = 0x4;
/// Transaction type: commit message.
pub const SYSFLAG_TRANSACTION_COMMIT: i32 = 0x8;
/// Transaction type: rollback message; not dispatched to a consume queue.
pub const SYSFLAG_TRANSACTION_ROLLBACK: i32 = 0xC;
/// SYSFLAG bit: BORNHOST is IPv6 (20 bytes instead of 8). Set by the encoder from the address.
pub const SYSFLAG_BORNHOST_V6: i32 = 0x10;
/// SYSFLAG bit: STOREHOSTADDRESS is IPv6 (20 bytes instead of 8). Set by the encoder.
pub const SYSFLAG_STOREHOST_V6: i32 = 0x20;

/// Bytes of the fixed fields without the two hosts and the body length: TOTALSIZE, MAGICCODE,
/// BODYCRC, QUEUEID, FLAG, QUEUEOFFSET, PHYSICALOFFSET, SYSFLAG, BORNTIMESTAMP, STORETIMESTAMP,
/// RECONSUMETIMES, PREPAREDTRANSACTIONOFFSET.
const FIXED_NO_HOSTS_SIZE: usize = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + 8 + 4 + 8;
const HOST_V4_SIZE: usize = 4 + 4;
const HOST_V6_SIZE: usize = 16 + 4;
const BODY_LENGTH_SIZE: usize = 4;
const PROPERTIES_LENGTH_SIZE: usize = 2;
const TOPIC_V1_MAX_BYTES: usize = i8::MAX as usize;
const BODY_CRC_MASK: u32 = 0x7FFF_FFFF;
/// The smallest V1 record: IPv4 hosts, empty body, topic and properties.
const MIN_V1_RECORD_SIZE: usize =
    FIXED_NO_HOSTS_SIZE + 2 * HOST_V4_SIZE + BODY_LENGTH_SIZE + 1 + PROPERTIES_LENGTH_SIZE;

/// Largest possible record size minus the body: the fixed fields with IPv6 hosts (including the
/// 4-byte body length), a 2-byte topic length with [`MAX_TOPIC_BYTES`] of topic, and a 2-byte
/// properties length with [`MAX_PROPERTIES_BYTES`] of properties.
pub const MAX_RECORD_OVERHEAD: usize = FIXED_NO_HOSTS_SIZE
    + 2 * HOST_V6_SIZE
    + BODY_LENGTH_SIZE
    + 2
    + MAX_TOPIC_BYTES
    + PROPERTIES_LENGTH_SIZE
    + MAX_PROPERTIES_BYTES;

const PROPERTY_NAME_VALUE_SEPARATOR: u8 = 0x01;
const PROPERTY_SEPARATOR: u8 = 0x02;
const PROPERTY_TAGS: &[u8] = b"TAGS";
const PROPERTY_KEYS: &[u8] = b"KEYS";

/// Why a record could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// The buffer ends before the record header (8 bytes) or before `total_size` bytes. At the
    /// end of written data this is a torn tail, not corruption.
    #[error("incomplete record: needed {needed} bytes, {available} available")]
    Incomplete {
        /// Bytes needed: the header size, or the record's `total_size`.
        needed: usize,
        /// Bytes in the buffer.
        available: usize,
    },
    /// MAGICCODE is none of [`MAGIC_V1`], [`MAGIC_V2`], [`BLANK_MAGIC`].
    #[error("bad magic code {0:#010x}")]
    BadMagic(i32),
    /// TOTALSIZE is non-positive, below the smallest record, or not the sum of the fields.
    #[error("bad total_size {total_size}: the fields need {fields_size} bytes")]
    BadTotalSize {
        /// The stored TOTALSIZE.
        total_size: i32,
        /// The size the fields add up to, or the smallest possible record when TOTALSIZE is
        /// below it.
        fields_size: usize,
    },
    /// PHYSICALOFFSET differs from the position the record was read at.
    #[error("physical offset mismatch: expected {expected}, record says {found}")]
    PhysicalOffsetMismatch {
        /// Commitlog position of the record.
        expected: i64,
        /// Stored PHYSICALOFFSET.
        found: i64,
    },
    /// BODYCRC differs from `crc32(body) & 0x7FFFFFFF` (0 for an empty body).
    #[error("body crc mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    BodyCrcMismatch {
        /// Stored BODYCRC.
        stored: i32,
        /// CRC computed over the stored body.
        computed: i32,
    },
    /// A body, topic or properties length is negative or runs past the end of the record.
    #[error(
        "{field} length {length} is negative or runs past the record end (total_size {total_size})"
    )]
    LengthOutOfBounds {
        /// `"body"`, `"topic"` or `"properties"`.
        field: &'static str,
        /// The stored length.
        length: i32,
        /// The stored TOTALSIZE.
        total_size: i32,
    },
    /// A host port is outside `0..=65535`.
    #[error("{field} port {port} is outside 0..=65535")]
    PortOutOfRange {
        /// `"born_host"` or `"store_host"`.
        field: &'static str,
        /// The stored port.
        port: i32,
    },
    /// The stored topic is not UTF-8.
    #[error("topic is not valid UTF-8")]
    TopicNotUtf8,
    /// The stored topic is empty or holds NUL bytes. Nothing writes such a topic; a torn write
    /// that zeroed the end of a record leaves one, and BODYCRC does not cover the topic.
    #[error("topic is empty or holds NUL bytes (a torn record?)")]
    MalformedTopic,
    /// The stored properties are not `name\u{1}value\u{2}` entries. Every RocketMQ writer ends
    /// each entry with `\u{2}`; a torn write that zeroed the end of a record breaks that, and
    /// BODYCRC does not cover the properties.
    #[error("properties are malformed at byte {at} (a torn record?)")]
    MalformedProperties {
        /// Where the structure breaks.
        at: usize,
    },
    /// A blank record whose size is below its own 8-byte header.
    #[error("blank record size {size} is below {BLANK_HEADER_SIZE}")]
    BlankSize {
        /// The stored remaining size.
        size: i32,
    },
    /// The topic is longer than [`MAX_TOPIC_BYTES`].
    #[error("topic is {length} bytes, at most {MAX_TOPIC_BYTES} allowed")]
    TopicTooLong {
        /// Topic length in bytes.
        length: usize,
    },
    /// The topic is empty.
    #[error("topic is empty")]
    TopicEmpty,
    /// The properties string is longer than [`MAX_PROPERTIES_BYTES`].
    #[error("properties are {length} bytes, at most {MAX_PROPERTIES_BYTES} allowed")]
    PropertiesTooLong {
        /// Properties length in bytes.
        length: usize,
    },
    /// The encoded record would not fit in TOTALSIZE (an `i32`).
    #[error("record would be {size_bytes} bytes, more than i32::MAX")]
    RecordTooLarge {
        /// Size the record would have.
        size_bytes: usize,
    },
    /// The destination slice given to [`encode_into`] is not exactly the record size.
    #[error("destination is {actual} bytes, the record is {expected}")]
    DestinationLength {
        /// The record size, [`encoded_len`].
        expected: usize,
        /// Length of the destination slice.
        actual: usize,
    },
    /// A property name or value cannot be stored, or a properties string is malformed.
    #[error("invalid property at entry {index}: {reason}")]
    InvalidProperty {
        /// Zero-based entry index.
        index: usize,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// A message as the put path gives it (owned).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Topic name; its UTF-8 bytes are stored.
    pub topic: String,
    /// Consume queue id.
    pub queue_id: i32,
    /// Application flag.
    pub flag: i32,
    /// Message body.
    pub body: Bytes,
    /// Raw properties string, `name\u{1}value\u{2}` per entry, stored verbatim.
    pub properties: Bytes,
    /// SYSFLAG; the encoder overrides [`SYSFLAG_BORNHOST_V6`] and [`SYSFLAG_STOREHOST_V6`].
    pub sys_flag: i32,
    /// Producer-side timestamp, milliseconds since the Unix epoch.
    pub born_timestamp_ms: i64,
    /// Producer address.
    pub born_host: SocketAddr,
    /// Broker-side timestamp, milliseconds since the Unix epoch.
    pub store_timestamp_ms: i64,
    /// Broker address.
    pub store_host: SocketAddr,
    /// Redelivery count.
    pub reconsume_times: i32,
    /// Commitlog offset of the matching half message (transaction commit/rollback), else 0.
    pub prepared_transaction_offset: i64,
}

/// Tests: a message of `body` on `topic`, queue 0, no properties, fixed hosts and timestamps.
#[cfg(test)]
pub(crate) fn test_message(topic: &str, body: &[u8]) -> Message {
    Message {
        topic: topic.into(),
        queue_id: 0,
        flag: 0,
        body: bytes::Bytes::copy_from_slice(body),
        properties: bytes::Bytes::new(),
        sys_flag: 0,
        born_timestamp_ms: 1,
        born_host: ([127, 0, 0, 1], 1).into(),
        store_timestamp_ms: 1,
        store_host: ([127, 0, 0, 1], 2).into(),
        reconsume_times: 0,
        prepared_transaction_offset: 0,
    }
}

/// Borrowed view of one decoded, checked record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordView<'a> {
    /// TOTALSIZE: the whole record in bytes.
    pub total_size: i32,
    /// MAGICCODE: [`MAGIC_V1`] or [`MAGIC_V2`].
    pub magic: i32,
    /// BODYCRC as stored (checked).
    pub body_crc: i32,
    /// QUEUEID.
    pub queue_id: i32,
    /// FLAG.
    pub flag: i32,
    /// QUEUEOFFSET: consume-queue logical offset (0 for prepared/rollback messages).
    pub queue_offset: i64,
    /// PHYSICALOFFSET (checked against the read position).
    pub physical_offset: i64,
    /// SYSFLAG as stored.
    pub sys_flag: i32,
    /// BORNTIMESTAMP in milliseconds.
    pub born_timestamp_ms: i64,
    /// BORNHOST.
    pub born_host: SocketAddr,
    /// STORETIMESTAMP in milliseconds.
    pub store_timestamp_ms: i64,
    /// STOREHOSTADDRESS.
    pub store_host: SocketAddr,
    /// RECONSUMETIMES.
    pub reconsume_times: i32,
    /// PREPARED TRANSACTION OFFSET.
    pub prepared_transaction_offset: i64,
    /// Body bytes.
    pub body: &'a [u8],
    /// Topic bytes (checked to be UTF-8).
    pub topic: &'a [u8],
    /// Raw properties string.
    pub properties: &'a [u8],
}

/// What [`decode`] found at the start of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// A checked message record.
    Message(RecordView<'a>),
    /// The end-of-file blank: `size` is the number of bytes from it to the end of the file.
    Blank {
        /// The stored remaining size (at least [`BLANK_HEADER_SIZE`]).
        size: i32,
    },
}

/// True when the SYSFLAG transaction type is PREPARED or ROLLBACK: such messages never enter a
/// consume queue, and their QUEUEOFFSET is written as 0.
pub fn is_transaction_prepared_or_rollback(sys_flag: i32) -> bool {
    let tx_type = sys_flag & SYSFLAG_TRANSACTION_MASK;
    tx_type == SYSFLAG_TRANSACTION_PREPARED || tx_type == SYSFLAG_TRANSACTION_ROLLBACK
}

/// `crc32(body) & 0x7FFFFFFF`, as upstream's `UtilAll.crc32`; 0 for an empty body.
fn body_crc(body: &[u8]) -> i32 {
    if body.is_empty() {
        return 0;
    }
    (crc32fast::hash(body) & BODY_CRC_MASK) as i32
}

fn host_size(addr: &SocketAddr) -> usize {
    match addr {
        SocketAddr::V4(_) => HOST_V4_SIZE,
        SocketAddr::V6(_) => HOST_V6_SIZE,
    }
}

/// Size of the fixed fields (up to and including BODYLENGTH) for the host families in `sys_flag`.
fn fixed_size(sys_flag: i32) -> usize {
    let host = |bit: i32| if sys_flag & bit != 0 { HOST_V6_SIZE } else { HOST_V4_SIZE };
    FIXED_NO_HOSTS_SIZE + host(SYSFLAG_BORNHOST_V6) + host(SYSFLAG_STOREHOST_V6) + BODY_LENGTH_SIZE
}

fn topic_length_size(magic: i32) -> usize {
    if magic == MAGIC_V2 { 2 } else { 1 }
}

/// The size of `msg`'s record, after checking that it can be encoded.
pub fn encoded_len(msg: &Message) -> Result<usize, RecordError> {
    let topic_bytes = msg.topic.len();
    if topic_bytes == 0 {
        return Err(RecordError::TopicEmpty);
    }
    if topic_bytes > MAX_TOPIC_BYTES {
        return Err(RecordError::TopicTooLong { length: topic_bytes });
    }
    if msg.topic.as_bytes().contains(&0) {
        return Err(RecordError::MalformedTopic);
    }
    if msg.properties.len() > MAX_PROPERTIES_BYTES {
        return Err(RecordError::PropertiesTooLong { length: msg.properties.len() });
    }
    // Never write a record that the decoder (and so recovery) would refuse.
    check_properties_shape(&msg.properties)?;
    let topic_length_size = if topic_bytes > TOPIC_V1_MAX_BYTES { 2 } else { 1 };
    let size_bytes = FIXED_NO_HOSTS_SIZE
        + host_size(&msg.born_host)
        + host_size(&msg.store_host)
        + BODY_LENGTH_SIZE
        + msg.body.len()
        + topic_length_size
        + topic_bytes
        + PROPERTIES_LENGTH_SIZE
        + msg.properties.len();
    if size_bytes > i32::MAX as usize {
        return Err(RecordError::RecordTooLarge { size_bytes });
    }
    Ok(size_bytes)
}

fn put_host(dst: &mut &mut [u8], addr: &SocketAddr) {
    match addr.ip() {
        IpAddr::V4(ip) => dst.put_slice(&ip.octets()),
        IpAddr::V6(ip) => dst.put_slice(&ip.octets()),
    }
    dst.put_i32(i32::from(addr.port()));
}

/// Writes `msg`'s record into `dst`, which must be exactly [`encoded_len`] bytes, as upstream
/// `doAppend` does: QUEUEOFFSET is `queue_offset`, or 0 for a PREPARED or ROLLBACK transaction
/// type; PHYSICALOFFSET is `physical_offset`; the IPv6 SYSFLAG bits follow the host address
/// families (the caller's bits are overridden); the magic is V2 only for a topic over 127 bytes;
/// BODYCRC is `crc32(body) & 0x7FFFFFFF`.
pub fn encode_into(
    msg: &Message,
    queue_offset: i64,
    physical_offset: i64,
    dst: &mut [u8],
) -> Result<(), RecordError> {
    let size_bytes = encoded_len(msg)?;
    if dst.len() != size_bytes {
        return Err(RecordError::DestinationLength { expected: size_bytes, actual: dst.len() });
    }
    let mut sys_flag = msg.sys_flag & !(SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6);
    if msg.born_host.is_ipv6() {
        sys_flag |= SYSFLAG_BORNHOST_V6;
    }
    if msg.store_host.is_ipv6() {
        sys_flag |= SYSFLAG_STOREHOST_V6;
    }
    let queue_offset = if is_transaction_prepared_or_rollback(sys_flag) { 0 } else { queue_offset };
    let topic = msg.topic.as_bytes();
    let magic = if topic.len() > TOPIC_V1_MAX_BYTES { MAGIC_V2 } else { MAGIC_V1 };

    let mut w: &mut [u8] = dst;
    w.put_i32(size_bytes as i32);
    w.put_i32(magic);
    w.put_i32(body_crc(&msg.body));
    w.put_i32(msg.queue_id);
    w.put_i32(msg.flag);
    w.put_i64(queue_offset);
    w.put_i64(physical_offset);
    w.put_i32(sys_flag);
    w.put_i64(msg.born_timestamp_ms);
    put_host(&mut w, &msg.born_host);
    w.put_i64(msg.store_timestamp_ms);
    put_host(&mut w, &msg.store_host);
    w.put_i32(msg.reconsume_times);
    w.put_i64(msg.prepared_transaction_offset);
    w.put_i32(msg.body.len() as i32);
    w.put_slice(&msg.body);
    if magic == MAGIC_V2 {
        w.put_i16(topic.len() as i16);
    } else {
        w.put_i8(topic.len() as i8);
    }
    w.put_slice(topic);
    w.put_i16(msg.properties.len() as i16);
    w.put_slice(&msg.properties);
    debug_assert!(w.is_empty(), "encoded_len and encode_into disagree");
    Ok(())
}

/// Encodes `msg` into a new vector; see [`encode_into`].
pub fn encode(
    msg: &Message,
    queue_offset: i64,
    physical_offset: i64,
) -> Result<Vec<u8>, RecordError> {
    let mut out = vec![0; encoded_len(msg)?];
    encode_into(msg, queue_offset, physical_offset, &mut out)?;
    Ok(out)
}

/// Writes the 8-byte end-of-file blank record: `remaining` (bytes from here to the end of the
/// file, at least [`BLANK_HEADER_SIZE`]) and [`BLANK_MAGIC`]. Only `dst[..8]` is written.
///
/// # Panics
///
/// If `dst` is shorter than [`BLANK_HEADER_SIZE`].
pub fn encode_blank(remaining: i32, dst: &mut [u8]) {
    debug_assert!(remaining >= BLANK_HEADER_SIZE as i32, "blank of {remaining} bytes");
    dst[..4].copy_from_slice(&remaining.to_be_bytes());
    dst[4..BLANK_HEADER_SIZE].copy_from_slice(&BLANK_MAGIC.to_be_bytes());
}

/// Decodes and checks the record at the start of `buf`, which sits at commitlog position
/// `expected_offset`.
///
/// Checks: a known magic; for a blank, size >= 8 (only 8 bytes are needed); for a message,
/// TOTALSIZE at least the smallest record and within `buf` (else [`RecordError::Incomplete`]),
/// PHYSICALOFFSET equal to `expected_offset`, ports in range, body/topic/properties lengths
/// non-negative and inside the record, the fields adding up to TOTALSIZE, a UTF-8 topic, and
/// BODYCRC equal to the masked CRC of the body.
pub fn decode(buf: &[u8], expected_offset: i64) -> Result<Decoded<'_>, RecordError> {
    if buf.len() < BLANK_HEADER_SIZE {
        return Err(RecordError::Incomplete { needed: BLANK_HEADER_SIZE, available: buf.len() });
    }
    let mut header = &buf[..BLANK_HEADER_SIZE];
    let total_size = header.get_i32();
    let magic = header.get_i32();
    if magic == BLANK_MAGIC {
        if total_size < BLANK_HEADER_SIZE as i32 {
            return Err(RecordError::BlankSize { size: total_size });
        }
        return Ok(Decoded::Blank { size: total_size });
    }
    if magic != MAGIC_V1 && magic != MAGIC_V2 {
        return Err(RecordError::BadMagic(magic));
    }
    let min_size = MIN_V1_RECORD_SIZE + topic_length_size(magic) - 1;
    if total_size <= 0 || (total_size as usize) < min_size {
        return Err(RecordError::BadTotalSize { total_size, fields_size: min_size });
    }
    if buf.len() < total_size as usize {
        return Err(RecordError::Incomplete { needed: total_size as usize, available: buf.len() });
    }
    decode_message(&buf[..total_size as usize], magic, expected_offset).map(Decoded::Message)
}

fn get_host(r: &mut &[u8], v6: bool, field: &'static str) -> Result<SocketAddr, RecordError> {
    let ip = if v6 {
        let mut octets = [0u8; 16];
        r.copy_to_slice(&mut octets);
        IpAddr::V6(Ipv6Addr::from(octets))
    } else {
        let mut octets = [0u8; 4];
        r.copy_to_slice(&mut octets);
        IpAddr::V4(Ipv4Addr::from(octets))
    };
    let port = r.get_i32();
    let port = u16::try_from(port).map_err(|_| RecordError::PortOutOfRange { field, port })?;
    Ok(SocketAddr::new(ip, port))
}

/// Decodes a message record; `rec` is exactly TOTALSIZE bytes, at least the smallest record.
fn decode_message(
    rec: &[u8],
    magic: i32,
    expected_offset: i64,
) -> Result<RecordView<'_>, RecordError> {
    let total_size = rec.len() as i32;
    let mut r = &rec[BLANK_HEADER_SIZE..];
    let body_crc = r.get_i32();
    let queue_id = r.get_i32();
    let flag = r.get_i32();
    let queue_offset = r.get_i64();
    let physical_offset = r.get_i64();
    let sys_flag = r.get_i32();
    let fixed_bytes = fixed_size(sys_flag);
    let min_size = fixed_bytes + topic_length_size(magic) + PROPERTIES_LENGTH_SIZE;
    if rec.len() < min_size {
        return Err(RecordError::BadTotalSize { total_size, fields_size: min_size });
    }
    if physical_offset != expected_offset {
        return Err(RecordError::PhysicalOffsetMismatch {
            expected: expected_offset,
            found: physical_offset,
        });
    }
    let born_timestamp_ms = r.get_i64();
    let born_host = get_host(&mut r, sys_flag & SYSFLAG_BORNHOST_V6 != 0, "born_host")?;
    let store_timestamp_ms = r.get_i64();
    let store_host = get_host(&mut r, sys_flag & SYSFLAG_STOREHOST_V6 != 0, "store_host")?;
    let reconsume_times = r.get_i32();
    let prepared_transaction_offset = r.get_i64();
    let Variable { body, topic, properties } = split_variable(rec, fixed_bytes, magic)?;
    if std::str::from_utf8(topic).is_err() {
        return Err(RecordError::TopicNotUtf8);
    }
    let computed = self::body_crc(body);
    if body_crc != computed {
        return Err(RecordError::BodyCrcMismatch { stored: body_crc, computed });
    }
    Ok(RecordView {
        total_size,
        magic,
        body_crc,
        queue_id,
        flag,
        queue_offset,
        physical_offset,
        sys_flag,
        born_timestamp_ms,
        born_host,
        store_timestamp_ms,
        store_host,
        reconsume_times,
        prepared_transaction_offset,
        body,
        topic,
        properties,
    })
}

/// The variable-length fields of a record.
struct Variable<'a> {
    body: &'a [u8],
    topic: &'a [u8],
    properties: &'a [u8],
}

/// Splits body, topic and properties out of `rec`, whose fixed fields take `fixed_bytes` (the
/// last 4 of them being BODYLENGTH). Each length must be non-negative and leave room inside the
/// record for the fields after it; the properties must end exactly at TOTALSIZE.
fn split_variable(rec: &[u8], fixed_bytes: usize, magic: i32) -> Result<Variable<'_>, RecordError> {
    let total_size = rec.len() as i32;
    let topic_length_size = topic_length_size(magic);
    let out_of_bounds =
        |field, length| RecordError::LengthOutOfBounds { field, length, total_size };
    let mut r = &rec[fixed_bytes - BODY_LENGTH_SIZE..];

    let body_length = r.get_i32();
    let body_bytes =
        usize::try_from(body_length).map_err(|_| out_of_bounds("body", body_length))?;
    if body_bytes > r.remaining().saturating_sub(topic_length_size + PROPERTIES_LENGTH_SIZE) {
        return Err(out_of_bounds("body", body_length));
    }
    let body = &r[..body_bytes];
    r.advance(body_bytes);

    let topic_length =
        if magic == MAGIC_V2 { i32::from(r.get_i16()) } else { i32::from(r.get_i8()) };
    let topic_bytes =
        usize::try_from(topic_length).map_err(|_| out_of_bounds("topic", topic_length))?;
    if topic_bytes > r.remaining().saturating_sub(PROPERTIES_LENGTH_SIZE) {
        return Err(out_of_bounds("topic", topic_length));
    }
    let topic = &r[..topic_bytes];
    r.advance(topic_bytes);

    let properties_length = i32::from(r.get_i16());
    let properties_bytes = usize::try_from(properties_length)
        .map_err(|_| out_of_bounds("properties", properties_length))?;
    if properties_bytes != r.remaining() {
        let fields_size = rec.len() - r.remaining() + properties_bytes;
        return Err(RecordError::BadTotalSize { total_size, fields_size });
    }
    if topic.is_empty() || topic.contains(&0) {
        return Err(RecordError::MalformedTopic);
    }
    check_properties_shape(r)?;
    Ok(Variable { body, topic, properties: r })
}

/// Checks, without allocating, that `raw` is a sequence of `name\u{1}value\u{2}` entries with a
/// non-empty name: the shape every RocketMQ writer produces.
fn check_properties_shape(raw: &[u8]) -> Result<(), RecordError> {
    let mut entry_start = 0;
    let mut separator_seen = false;
    for (at, &b) in raw.iter().enumerate() {
        match b {
            PROPERTY_NAME_VALUE_SEPARATOR if !separator_seen && at > entry_start => {
                separator_seen = true
            }
            PROPERTY_SEPARATOR if separator_seen => {
                entry_start = at + 1;
                separator_seen = false;
            }
            PROPERTY_NAME_VALUE_SEPARATOR | PROPERTY_SEPARATOR => {
                return Err(RecordError::MalformedProperties { at });
            }
            _ => {}
        }
    }
    if entry_start != raw.len() {
        return Err(RecordError::MalformedProperties { at: raw.len() });
    }
    Ok(())
}

impl RecordView<'_> {
    /// The message this record holds, owned. SYSFLAG keeps its stored IPv6 bits, so encoding the
    /// result at the same offsets gives the same bytes. A non-UTF-8 topic (possible only in a view
    /// not made by [`decode`]) is converted lossily.
    pub fn to_message(&self) -> Message {
        Message {
            topic: String::from_utf8_lossy(self.topic).into_owned(),
            queue_id: self.queue_id,
            flag: self.flag,
            body: Bytes::copy_from_slice(self.body),
            properties: Bytes::copy_from_slice(self.properties),
            sys_flag: self.sys_flag,
            born_timestamp_ms: self.born_timestamp_ms,
            born_host: self.born_host,
            store_timestamp_ms: self.store_timestamp_ms,
            store_host: self.store_host,
            reconsume_times: self.reconsume_times,
            prepared_transaction_offset: self.prepared_transaction_offset,
        }
    }

    /// The record size in bytes (TOTALSIZE).
    pub fn size(&self) -> usize {
        self.total_size as usize
    }

    /// The `TAGS` property value, if present.
    pub fn tags(&self) -> Option<&[u8]> {
        find_property(self.properties, PROPERTY_TAGS)
    }

    /// The `KEYS` property value (space-separated keys), if present.
    pub fn keys(&self) -> Option<&[u8]> {
        find_property(self.properties, PROPERTY_KEYS)
    }
}

/// The value of the first entry named `name` in a raw properties string. Malformed entries are
/// skipped, as upstream's `string2messageProperties` does.
fn find_property<'a>(raw: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    raw.split(|&b| b == PROPERTY_SEPARATOR).find_map(|entry| {
        let split = entry.iter().position(|&b| b == PROPERTY_NAME_VALUE_SEPARATOR)?;
        (&entry[..split] == name).then(|| &entry[split + 1..])
    })
}

/// Builds a raw properties string, `name\u{1}value\u{2}` per pair, in the given order. Names and
/// values must be non-empty (upstream drops empty ones when reading) and must not contain
/// `\u{1}` or `\u{2}`; the result must fit [`MAX_PROPERTIES_BYTES`].
pub fn encode_properties(pairs: &[(&str, &str)]) -> Result<Bytes, RecordError> {
    let is_separator = |c: char| c == '\u{1}' || c == '\u{2}';
    let mut out = Vec::new();
    for (index, (name, value)) in pairs.iter().enumerate() {
        let invalid = |reason| RecordError::InvalidProperty { index, reason };
        if name.is_empty() || value.is_empty() {
            return Err(invalid("empty name or value"));
        }
        if name.contains(is_separator) || value.contains(is_separator) {
            return Err(invalid("name or value contains \\u{1} or \\u{2}"));
        }
        out.extend_from_slice(name.as_bytes());
        out.push(PROPERTY_NAME_VALUE_SEPARATOR);
        out.extend_from_slice(value.as_bytes());
        out.push(PROPERTY_SEPARATOR);
    }
    if out.len() > MAX_PROPERTIES_BYTES {
        return Err(RecordError::PropertiesTooLong { length: out.len() });
    }
    Ok(Bytes::from(out))
}

/// Parses a raw properties string into `(name, value)` pairs, in stored order. Strict: every
/// entry is `name\u{1}value\u{2}` with a non-empty name, UTF-8 name and value, and no further
/// `\u{1}` in the value.
pub fn parse_properties(raw: &[u8]) -> Result<Vec<(String, String)>, RecordError> {
    let mut pairs = Vec::new();
    let mut rest = raw;
    while !rest.is_empty() {
        let index = pairs.len();
        let invalid = |reason| RecordError::InvalidProperty { index, reason };
        let end = rest
            .iter()
            .position(|&b| b == PROPERTY_SEPARATOR)
            .ok_or_else(|| invalid("entry does not end with \\u{2}"))?;
        let entry = &rest[..end];
        rest = &rest[end + 1..];
        let split = entry
            .iter()
            .position(|&b| b == PROPERTY_NAME_VALUE_SEPARATOR)
            .ok_or_else(|| invalid("entry has no \\u{1}"))?;
        let (name, value) = (&entry[..split], &entry[split + 1..]);
        if name.is_empty() {
            return Err(invalid("empty name"));
        }
        if value.contains(&PROPERTY_NAME_VALUE_SEPARATOR) {
            return Err(invalid("value contains \\u{1}"));
        }
        let name = std::str::from_utf8(name).map_err(|_| invalid("name is not UTF-8"))?;
        let value = std::str::from_utf8(value).map_err(|_| invalid("value is not UTF-8"))?;
        pairs.push((name.to_owned(), value.to_owned()));
    }
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(topic: &str, born_host: &str, store_host: &str) -> Message {
        Message {
            topic: topic.to_owned(),
            queue_id: 3,
            flag: 7,
            body: Bytes::from_static(b"hello"),
            properties: Bytes::from_static(b"TAGS\x01TagA\x02KEYS\x01k1 k2\x02"),
            sys_flag: 0,
            born_timestamp_ms: 1_700_000_000_000,
            born_host: born_host.parse().unwrap(),
            store_timestamp_ms: 1_700_000_000_123,
            store_host: store_host.parse().unwrap(),
            reconsume_times: 2,
            prepared_transaction_offset: 99,
        }
    }

    fn be_i32(bytes: &[u8], at: usize) -> i32 {
        i32::from_be_bytes(bytes[at..at + 4].try_into().unwrap())
    }

    fn be_i64(bytes: &[u8], at: usize) -> i64 {
        i64::from_be_bytes(bytes[at..at + 8].try_into().unwrap())
    }

    #[test]
    fn constants_match_upstream() {
        assert_eq!(MAGIC_V1, -626_843_481);
        assert_eq!(MAGIC_V2, -626_843_477);
        assert_eq!(BLANK_MAGIC, -875_286_124);
        assert_eq!(MIN_V1_RECORD_SIZE, 91);
        assert_eq!(MAX_RECORD_OVERHEAD, 112 + 2 + 255 + 2 + 32767);
    }

    #[test]
    fn v1_ipv4_field_layout() {
        let msg = sample("TopicA", "192.168.1.10:54321", "10.0.0.1:10911");
        let rec = encode(&msg, 42, 4096).unwrap();
        assert_eq!(rec.len(), 88 + 5 + 1 + 6 + 2 + 21);
        assert_eq!(be_i32(&rec, 0), rec.len() as i32);
        assert_eq!(be_i32(&rec, 4), MAGIC_V1);
        assert_eq!(be_i32(&rec, 8), 907_060_870); // crc32("hello") & 0x7FFFFFFF
        assert_eq!(be_i32(&rec, 12), 3);
        assert_eq!(be_i32(&rec, 16), 7);
        assert_eq!(be_i64(&rec, 20), 42);
        assert_eq!(be_i64(&rec, 28), 4096);
        assert_eq!(be_i32(&rec, 36), 0);
        assert_eq!(be_i64(&rec, 40), 1_700_000_000_000);
        assert_eq!(&rec[48..56], &[192, 168, 1, 10, 0, 0, 0xd4, 0x31]);
        assert_eq!(be_i64(&rec, 56), 1_700_000_000_123);
        assert_eq!(&rec[64..72], &[10, 0, 0, 1, 0, 0, 0x2a, 0x9f]);
        assert_eq!(be_i32(&rec, 72), 2);
        assert_eq!(be_i64(&rec, 76), 99);
        assert_eq!(be_i32(&rec, 84), 5);
        assert_eq!(&rec[88..93], b"hello");
        assert_eq!(rec[93], 6);
        assert_eq!(&rec[94..100], b"TopicA");
        assert_eq!(&rec[100..102], &[0, 21]);
        assert_eq!(&rec[102..], b"TAGS\x01TagA\x02KEYS\x01k1 k2\x02");
    }

    #[test]
    fn ipv6_hosts_set_sysflag_and_widen_hosts() {
        let mut msg = sample("TopicA", "[2001:db8::10]:54321", "10.0.0.1:10911");
        msg.sys_flag = SYSFLAG_STOREHOST_V6 | SYSFLAG_TRANSACTION_COMMIT; // wrong bit on purpose
        let rec = encode(&msg, 1, 0).unwrap();
        assert_eq!(be_i32(&rec, 36), SYSFLAG_BORNHOST_V6 | SYSFLAG_TRANSACTION_COMMIT);
        assert_eq!(&rec[48..52], &[0x20, 0x01, 0x0d, 0xb8]);
        assert_eq!(be_i32(&rec, 64), 54321);
        assert_eq!(&rec[76..84], &[10, 0, 0, 1, 0, 0, 0x2a, 0x9f]);
        assert_eq!(be_i32(&rec, 96), 5);
        let Decoded::Message(view) = decode(&rec, 0).unwrap() else { panic!("not a message") };
        assert_eq!(view.born_host, msg.born_host);
        assert_eq!(view.store_host, msg.store_host);
    }

    #[test]
    fn magic_follows_topic_length() {
        let v1 = encode(&sample(&"t".repeat(127), "1.2.3.4:5", "5.6.7.8:9"), 0, 0).unwrap();
        assert_eq!(be_i32(&v1, 4), MAGIC_V1);
        assert_eq!(v1[93], 127);
        let v2 = encode(&sample(&"t".repeat(128), "1.2.3.4:5", "5.6.7.8:9"), 0, 0).unwrap();
        assert_eq!(be_i32(&v2, 4), MAGIC_V2);
        assert_eq!(&v2[93..95], &[0, 128]);
        assert_eq!(v2.len(), v1.len() + 2);
        let Decoded::Message(view) = decode(&v2, 0).unwrap() else { panic!("not a message") };
        assert_eq!(view.magic, MAGIC_V2);
        assert_eq!(view.topic, "t".repeat(128).as_bytes());
    }

    #[test]
    fn prepared_and_rollback_write_queue_offset_zero() {
        for (tx_type, expected) in [
            (SYSFLAG_TRANSACTION_NOT_TYPE, 42),
            (SYSFLAG_TRANSACTION_PREPARED, 0),
            (SYSFLAG_TRANSACTION_COMMIT, 42),
            (SYSFLAG_TRANSACTION_ROLLBACK, 0),
        ] {
            let mut msg = sample("T", "1.2.3.4:5", "5.6.7.8:9");
            msg.sys_flag = tx_type;
            assert_eq!(be_i64(&encode(&msg, 42, 0).unwrap(), 20), expected, "type {tx_type}");
        }
    }

    #[test]
    fn blank_round_trip() {
        let mut buf = [0xAAu8; 10];
        encode_blank(24, &mut buf);
        assert_eq!(buf, [0, 0, 0, 24, 0xcb, 0xd4, 0x31, 0x94, 0xAA, 0xAA]);
        assert_eq!(decode(&buf[..8], 12345), Ok(Decoded::Blank { size: 24 }));
        assert_eq!(decode(&buf[..7], 0), Err(RecordError::Incomplete { needed: 8, available: 7 }));
        buf[..4].copy_from_slice(&7i32.to_be_bytes());
        assert_eq!(decode(&buf, 0), Err(RecordError::BlankSize { size: 7 }));
    }
}
