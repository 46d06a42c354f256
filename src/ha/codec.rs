//! Wire frames of RocketMQ's classic HA protocol: pure encode and decode, no I/O.
//!
//! Two frame kinds, both big-endian, with no handshake, magic, version or checksum
//! (reference §1.2, §1.3):
//!
//! - slave → master, a *report*: 8 bytes, `i64` = the slave's max commitlog offset. The first one
//!   says where to start, later ones are acks, and they double as heartbeats.
//! - master → slave, a *transfer frame*: a 12-byte header (`i64` commitlog offset of the first body
//!   byte, `i32` body size) followed by that many raw commitlog bytes. A body size of 0 is a
//!   heartbeat whose offset is the connection's next offset to send.
//!
//! This module owns the byte layout and the checks that need nothing but the bytes: a transfer
//! header must have a non-negative offset, a non-negative size, a body that fits the slave's read
//! buffer (a stock Java slave livelocks on a bigger one, reference §1.9) and an end offset that
//! fits an `i64`. It does not own sockets, buffers, timers or what an offset *means* (whether a
//! report is plausible or a frame's offset matches the slave's log): that is the caller's job.
//!
//! The decoders follow mini-redis's `Frame::check`: a pure function over the bytes received so far
//! that answers "incomplete", "one frame of `n` bytes" or "protocol error". The slave checks each
//! header with [`TransferDecoder::decode_header`] over its own read buffer. Built for tests only:
//! `TransferDecoder::decode` (whole frames), `validate_report`, and `TransferFrameCodec`, a
//! `tokio_util::codec::Decoder` over the same checks that hands out zero-copy bodies.
#![warn(missing_docs)]

#[cfg(test)]
use std::io;

use bytes::Buf;
#[cfg(test)]
use bytes::{Bytes, BytesMut};

/// Size in bytes of a slave → master report: one big-endian `i64`.
pub const REPORT_SIZE: usize = 8;

/// Size in bytes of a master → slave transfer header: `i64` offset then `i32` body size.
pub const TRANSFER_HEADER_SIZE: usize = 12;

/// Size in bytes of the read buffer of a stock Java slave (`DefaultHAClient.READ_MAX_BUFFER_SIZE`).
pub(crate) const DEFAULT_SLAVE_BUFFER_SIZE: usize = 4 * 1024 * 1024;

/// Largest body the master may send to a stock Java slave: 4 MiB - 12 = 4_194_292 bytes.
///
/// A whole frame (header and body) must fit the slave's 4 MiB read buffer; a bigger frame makes
/// the Java client spin forever without progress (reference §1.9, §8 item 11).
pub(crate) const MAX_TRANSFER_BODY_SIZE: usize = DEFAULT_SLAVE_BUFFER_SIZE - TRANSFER_HEADER_SIZE;

/// A frame that breaks the protocol. Seeing one means the peer is broken or is not an HA peer:
/// the caller should close the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// A transfer header carries a negative body size.
    #[error("transfer frame has a negative body size: {0}")]
    NegativeBodySize(i32),
    /// A transfer header announces a body that cannot fit the slave's read buffer.
    #[error(
        "transfer frame body of {size} bytes cannot fit the slave's read buffer: \
         the largest body it can hold is {max} bytes"
    )]
    BodyTooLarge {
        /// Body size announced by the header, in bytes.
        size: usize,
        /// Largest body the slave's read buffer can hold, in bytes.
        max: usize,
    },
    /// A transfer header carries a negative commitlog offset.
    #[error("transfer frame has a negative commitlog offset: {0}")]
    NegativeOffset(i64),
    /// A transfer header whose body would end past `i64::MAX`.
    #[error("transfer frame at offset {offset} with a {size}-byte body ends past i64::MAX")]
    EndOffsetOverflow {
        /// Commitlog offset of the first body byte.
        offset: i64,
        /// Body size announced by the header, in bytes.
        size: usize,
    },
    /// A report carries a negative offset (only raised by `validate_report`).
    #[cfg(test)]
    #[error("slave reported a negative commitlog offset: {0}")]
    NegativeReport(i64),
}

/// Encodes a slave → master report of `offset` (the slave's max commitlog offset).
///
/// Any value is encoded, negative ones included: checking is the receiver's job.
pub fn encode_report(offset: i64) -> [u8; REPORT_SIZE] {
    offset.to_be_bytes()
}

/// Encodes a master → slave transfer header; the caller writes `body_size` body bytes after it.
///
/// The values are not checked, so tests can build broken frames; [`TransferDecoder`] rejects them.
pub fn encode_transfer_header(offset: i64, body_size: i32) -> [u8; TRANSFER_HEADER_SIZE] {
    let mut header = [0u8; TRANSFER_HEADER_SIZE];
    header[..8].copy_from_slice(&offset.to_be_bytes());
    header[8..].copy_from_slice(&body_size.to_be_bytes());
    header
}

/// Encodes a master → slave heartbeat: a transfer header with body size 0 whose offset is the
/// connection's next offset to send.
pub(crate) fn encode_heartbeat(next_offset: i64) -> [u8; TRANSFER_HEADER_SIZE] {
    encode_transfer_header(next_offset, 0)
}

/// Master side: scans bytes received from a slave and returns the **last** complete report and the
/// number of bytes it consumed (a multiple of [`REPORT_SIZE`]), or `None` below 8 bytes.
///
/// Reports are cumulative, so older ones in the same read are skipped, as upstream does
/// (reference §1.8). The trailing `consumed..` bytes (fewer than 8) are the start of the next
/// report: keep them for the next read. Negative values are returned as they are; see
/// `validate_report`.
pub fn decode_reports(buf: &[u8]) -> Option<(i64, usize)> {
    let consumed = buf.len() - buf.len() % REPORT_SIZE;
    if consumed < REPORT_SIZE {
        return None;
    }
    let value = (&buf[consumed - REPORT_SIZE..consumed]).get_i64();
    debug_assert!(consumed.is_multiple_of(REPORT_SIZE) && buf.len() - consumed < REPORT_SIZE);
    Some((value, consumed))
}

/// Checks that a reported offset is a possible commitlog offset (not negative).
#[cfg(test)]
pub(crate) fn validate_report(value: i64) -> Result<u64, CodecError> {
    u64::try_from(value).map_err(|_| CodecError::NegativeReport(value))
}

/// A checked transfer header, available as soon as its 12 bytes have arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransferHeader {
    /// Commitlog offset of the first body byte (for a heartbeat: the master's next offset to send).
    pub(crate) offset: i64,
    /// Number of body bytes that follow the header; 0 for a heartbeat.
    pub(crate) body_size: usize,
}

impl TransferHeader {
    /// Number of bytes the whole frame (header and body) occupies on the wire.
    pub fn frame_len(&self) -> usize {
        TRANSFER_HEADER_SIZE + self.body_size
    }

    /// Whether this is a heartbeat (body size 0).
    #[cfg(test)]
    pub(crate) fn is_heartbeat(&self) -> bool {
        self.body_size == 0
    }
}

/// One complete transfer frame, borrowed from the receive buffer.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TransferFrame<'a> {
    /// Commitlog offset of the first body byte (for a heartbeat: the master's next offset to send).
    pub(crate) offset: i64,
    /// Raw commitlog bytes `[offset, offset + body.len())`; empty for a heartbeat.
    pub(crate) body: &'a [u8],
    /// Number of bytes the frame occupies at the start of the buffer (header and body).
    pub(crate) frame_len: usize,
}

#[cfg(test)]
impl TransferFrame<'_> {
    /// Whether this is a heartbeat (empty body).
    pub(crate) fn is_heartbeat(&self) -> bool {
        self.body.is_empty()
    }
}

/// Slave side: decodes master → slave transfer frames from the start of a receive buffer.
///
/// It holds only the body limit, derived from the read buffer size the slave can afford.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransferDecoder {
    max_body_size: usize,
}

impl Default for TransferDecoder {
    /// A decoder with the limit of a stock Java slave: [`MAX_TRANSFER_BODY_SIZE`].
    fn default() -> Self {
        Self::new(DEFAULT_SLAVE_BUFFER_SIZE)
    }
}

impl TransferDecoder {
    /// A decoder for a slave whose read buffer holds `buffer_size` bytes: the largest accepted body
    /// is `buffer_size - 12`. A buffer smaller than a header gives a limit of 0 (heartbeats only);
    /// config validation should refuse such a size before it gets here.
    pub const fn new(buffer_size: usize) -> Self {
        Self { max_body_size: buffer_size.saturating_sub(TRANSFER_HEADER_SIZE) }
    }

    /// Largest body size this decoder accepts, in bytes.
    #[cfg(test)]
    pub(crate) const fn max_body_size(&self) -> usize {
        self.max_body_size
    }

    /// Decodes the frame at the start of `buf`.
    ///
    /// Returns `Ok(None)` while the frame is incomplete (read more and call again),
    /// `Ok(Some(frame))` for one complete frame occupying `frame.frame_len` bytes (drop them
    /// before the next call), and `Err` as soon as the 12-byte header is complete and invalid
    /// (see [`TransferDecoder::decode_header`]), so a body that can never fit is never awaited.
    #[cfg(test)]
    pub(crate) fn decode<'a>(
        &self,
        buf: &'a [u8],
    ) -> Result<Option<TransferFrame<'a>>, CodecError> {
        let Some(header) = self.decode_header(buf)? else {
            return Ok(None);
        };
        let frame_len = header.frame_len();
        if buf.len() < frame_len {
            return Ok(None);
        }
        let body = &buf[TRANSFER_HEADER_SIZE..frame_len];
        debug_assert_eq!(body.len(), header.body_size);
        Ok(Some(TransferFrame { offset: header.offset, body, frame_len }))
    }

    /// Decodes and checks only the header at the start of `buf`: `Ok(None)` below 12 bytes.
    ///
    /// The slave checks the frame's offset against its log before the body arrives, as upstream
    /// does (reference §1.9). Checks, in this order: offset ≥ 0 ([`CodecError::NegativeOffset`]),
    /// size ≥ 0 ([`CodecError::NegativeBodySize`]), size ≤ [`Self::max_body_size`]
    /// ([`CodecError::BodyTooLarge`]), `offset + size` ≤ `i64::MAX`
    /// ([`CodecError::EndOffsetOverflow`]).
    pub fn decode_header(&self, buf: &[u8]) -> Result<Option<TransferHeader>, CodecError> {
        if buf.len() < TRANSFER_HEADER_SIZE {
            return Ok(None);
        }
        let mut header = &buf[..TRANSFER_HEADER_SIZE];
        let offset = header.get_i64();
        let raw_size = header.get_i32();
        if offset < 0 {
            return Err(CodecError::NegativeOffset(offset));
        }
        if raw_size < 0 {
            return Err(CodecError::NegativeBodySize(raw_size));
        }
        let body_size = usize::try_from(raw_size).unwrap_or(usize::MAX);
        if body_size > self.max_body_size {
            return Err(CodecError::BodyTooLarge { size: body_size, max: self.max_body_size });
        }
        if offset.checked_add(i64::from(raw_size)).is_none() {
            return Err(CodecError::EndOffsetOverflow { offset, size: body_size });
        }
        Ok(Some(TransferHeader { offset, body_size }))
    }
}

/// A transfer frame that owns its body (a zero-copy slice of the receive buffer).
#[cfg(test)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OwnedTransferFrame {
    /// Commitlog offset of the first body byte (for a heartbeat: the master's next offset to send).
    pub(crate) offset: i64,
    /// Raw commitlog bytes; empty for a heartbeat.
    pub(crate) body: Bytes,
}

#[cfg(test)]
impl OwnedTransferFrame {
    /// Whether this is a heartbeat (empty body).
    pub(crate) fn is_heartbeat(&self) -> bool {
        self.body.is_empty()
    }
}

/// Error from `TransferFrameCodec`: the stream failed or carried a bad frame.
#[cfg(test)]
#[derive(Debug, thiserror::Error)]
pub(crate) enum TransferReadError {
    /// The master sent a frame that breaks the protocol.
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// Reading the connection failed, or it closed in the middle of a frame.
    #[error("reading transfer frames failed: {0}")]
    Io(#[from] io::Error),
}

/// Slave side `tokio_util` decoder: turns the master's byte stream into `OwnedTransferFrame`s.
///
/// Use it with `FramedRead`. Memory stays bounded: the buffer grows at most to one whole frame
/// (`12 + max_body_size` bytes) plus whatever the reader already had in it. Unlike
/// [`TransferDecoder::decode_header`], a frame comes out only once its body is complete; the header
/// checks still fail as soon as the header has arrived.
#[cfg(test)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TransferFrameCodec {
    decoder: TransferDecoder,
}

#[cfg(test)]
impl TransferFrameCodec {
    /// A codec for a slave whose read buffer holds `buffer_size` bytes (see
    /// [`TransferDecoder::new`]).
    pub(crate) const fn new(buffer_size: usize) -> Self {
        Self { decoder: TransferDecoder::new(buffer_size) }
    }
}

#[cfg(test)]
impl tokio_util::codec::Decoder for TransferFrameCodec {
    type Item = OwnedTransferFrame;
    type Error = TransferReadError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Self::Item>, Self::Error> {
        let Some(header) = self.decoder.decode_header(src)? else {
            src.reserve(TRANSFER_HEADER_SIZE - src.len());
            return Ok(None);
        };
        let frame_len = header.frame_len();
        if src.len() < frame_len {
            // Bounded: `frame_len <= 12 + max_body_size` was checked by `decode_header`.
            src.reserve(frame_len - src.len());
            return Ok(None);
        }
        src.advance(TRANSFER_HEADER_SIZE);
        let body = src.split_to(header.body_size).freeze();
        Ok(Some(OwnedTransferFrame { offset: header.offset, body }))
    }

    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<Self::Item>, Self::Error> {
        if let Some(frame) = self.decode(src)? {
            return Ok(Some(frame));
        }
        if src.is_empty() {
            return Ok(None);
        }
        Err(TransferReadError::Io(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("connection closed in the middle of a transfer frame ({} bytes)", src.len()),
        )))
    }
}

#[cfg(test)]
mod tests {
    use tokio_util::codec::Decoder;

    use super::*;

    fn frame_bytes(offset: i64, body: &[u8]) -> Vec<u8> {
        let size = i32::try_from(body.len()).unwrap();
        let mut out = encode_transfer_header(offset, size).to_vec();
        out.extend_from_slice(body);
        out
    }

    #[test]
    fn limits_match_the_java_slave() {
        assert_eq!(MAX_TRANSFER_BODY_SIZE, 4_194_292);
        assert_eq!(TransferDecoder::default().max_body_size(), 4_194_292);
        assert_eq!(TransferDecoder::new(12 + 100).max_body_size(), 100);
        assert_eq!(TransferDecoder::new(12).max_body_size(), 0);
        assert_eq!(TransferDecoder::new(5).max_body_size(), 0);
    }

    #[test]
    fn tiny_buffer_accepts_heartbeats_only() {
        let decoder = TransferDecoder::new(3);
        let heartbeat = encode_heartbeat(64);
        let frame = decoder.decode(&heartbeat).unwrap().unwrap();
        assert_eq!((frame.offset, frame.frame_len, frame.is_heartbeat()), (64, 12, true));
        let err = decoder.decode_header(&encode_transfer_header(64, 1)).unwrap_err();
        assert_eq!(err, CodecError::BodyTooLarge { size: 1, max: 0 });
    }

    #[test]
    fn body_too_large_message_names_the_buffer_and_both_numbers() {
        let msg = CodecError::BodyTooLarge { size: 4_194_293, max: 4_194_292 }.to_string();
        assert!(msg.contains("cannot fit the slave's read buffer"), "{msg}");
        assert!(msg.contains("4194293") && msg.contains("4194292"), "{msg}");
    }

    #[test]
    fn header_checks_run_in_documented_order() {
        let decoder = TransferDecoder::new(12 + 8);
        let both_negative = encode_transfer_header(-1, -1);
        assert_eq!(decoder.decode_header(&both_negative), Err(CodecError::NegativeOffset(-1)));
        let big_and_overflowing = encode_transfer_header(i64::MAX, 9);
        assert_eq!(
            decoder.decode_header(&big_and_overflowing),
            Err(CodecError::BodyTooLarge { size: 9, max: 8 })
        );
        let overflowing = encode_transfer_header(i64::MAX - 7, 8);
        assert_eq!(
            decoder.decode_header(&overflowing),
            Err(CodecError::EndOffsetOverflow { offset: i64::MAX - 7, size: 8 })
        );
        let last_fitting = encode_transfer_header(i64::MAX - 8, 8);
        assert_eq!(
            decoder.decode_header(&last_fitting),
            Ok(Some(TransferHeader { offset: i64::MAX - 8, body_size: 8 }))
        );
    }

    #[test]
    fn header_helpers() {
        let header = TransferHeader { offset: 7, body_size: 20 };
        assert_eq!((header.frame_len(), header.is_heartbeat()), (32, false));
        let heartbeat = TransferHeader { offset: 7, body_size: 0 };
        assert_eq!((heartbeat.frame_len(), heartbeat.is_heartbeat()), (12, true));
    }

    #[test]
    fn validate_report_accepts_zero_and_max_and_rejects_negatives() {
        assert_eq!(validate_report(0), Ok(0));
        assert_eq!(validate_report(i64::MAX), Ok(9_223_372_036_854_775_807));
        assert_eq!(validate_report(-1), Err(CodecError::NegativeReport(-1)));
        assert_eq!(validate_report(i64::MIN), Err(CodecError::NegativeReport(i64::MIN)));
    }

    #[test]
    fn codec_reserves_exactly_the_rest_of_the_frame() {
        let mut codec = TransferFrameCodec::new(12 + 1000);
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&encode_transfer_header(0, 1000));
        assert_eq!(codec.decode(&mut buf).unwrap(), None);
        assert!(buf.capacity() >= 1012, "capacity {}", buf.capacity());
        assert_eq!(buf.len(), 12, "an incomplete frame must stay in the buffer");
    }

    #[test]
    fn codec_splits_zero_copy_bodies_and_keeps_the_tail() {
        let mut codec = TransferFrameCodec::default();
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&frame_bytes(100, b"abc"));
        buf.extend_from_slice(&encode_heartbeat(103));
        buf.extend_from_slice(&[0, 0]);
        let first = codec.decode(&mut buf).unwrap().unwrap();
        assert_eq!(first, OwnedTransferFrame { offset: 100, body: Bytes::from_static(b"abc") });
        assert!(!first.is_heartbeat());
        let second = codec.decode(&mut buf).unwrap().unwrap();
        assert_eq!((second.offset, second.is_heartbeat()), (103, true));
        assert_eq!(codec.decode(&mut buf).unwrap(), None);
        assert_eq!(&buf[..], &[0, 0]);
    }

    #[test]
    fn codec_fails_at_header_time_on_a_body_that_cannot_fit() {
        let mut codec = TransferFrameCodec::new(12 + 16);
        let mut buf = BytesMut::from(&encode_transfer_header(0, 17)[..]);
        match codec.decode(&mut buf) {
            Err(TransferReadError::Codec(err)) => {
                assert_eq!(err, CodecError::BodyTooLarge { size: 17, max: 16 })
            }
            other => panic!("expected BodyTooLarge, got {other:?}"),
        }
    }

    #[test]
    fn codec_eof_mid_frame_is_an_error_and_clean_eof_is_none() {
        let mut codec = TransferFrameCodec::default();
        let mut empty = BytesMut::new();
        assert_eq!(codec.decode_eof(&mut empty).unwrap(), None);

        let mut complete = BytesMut::from(&frame_bytes(5, b"z")[..]);
        let frame = codec.decode_eof(&mut complete).unwrap().unwrap();
        assert_eq!((frame.offset, &frame.body[..]), (5, &b"z"[..]));

        let mut half = BytesMut::from(&frame_bytes(5, b"xyz")[..13]);
        match codec.decode_eof(&mut half) {
            Err(TransferReadError::Io(err)) => {
                assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
                assert!(err.to_string().contains("13 bytes"), "{err}");
            }
            other => panic!("expected UnexpectedEof, got {other:?}"),
        }
    }
}
