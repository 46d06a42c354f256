//! The classic HA wire codec against hand-written bytes, and against streams cut at random points.

use crate::ha::codec::*;
use bytes::BytesMut;
use proptest::prelude::*;
use proptest::sample::Index;
use tokio_util::codec::Decoder;

/// A transfer frame as the test wrote it: offset and body.
type Sent = (i64, Vec<u8>);

/// The 12-byte header written out by hand, followed by `body`.
fn with_body(header: [u8; 12], body: &[u8]) -> Vec<u8> {
    let mut out = header.to_vec();
    out.extend_from_slice(body);
    out
}

// ---- wire vectors: expected bytes are literals, never produced by the encoder ----

#[test]
fn report_wire_vectors() {
    let cases: [(i64, [u8; 8]); 6] = [
        (0x0000_0001_4000_1000, [0x00, 0x00, 0x00, 0x01, 0x40, 0x00, 0x10, 0x00]),
        (0, [0x00; 8]),
        (1, [0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01]),
        (i64::MAX, [0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]),
        (-1, [0xff; 8]),
        (i64::MIN, [0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00]),
    ];
    for (value, bytes) in cases {
        assert_eq!(encode_report(value), bytes, "encode {value:#x}");
        assert_eq!(decode_reports(&bytes), Some((value, 8)), "decode {bytes:02x?}");
    }
}

#[test]
fn heartbeat_wire_vector() {
    // Next offset 1 GiB (the start of the second commitlog file), body size 0.
    let bytes = [0x00, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00];
    assert_eq!(encode_heartbeat(0x4000_0000), bytes);
    assert_eq!(encode_transfer_header(0x4000_0000, 0), bytes);

    let frame = TransferDecoder::default().decode(&bytes).unwrap().unwrap();
    assert_eq!(frame.offset, 1_073_741_824);
    assert!(frame.body.is_empty());
    assert_eq!(frame.frame_len, 12);
    assert!(frame.is_heartbeat());
}

#[test]
fn transfer_header_with_body_wire_vector() {
    // Offset 0x1_4000_1000, body size 5, body "hello".
    let bytes = [
        0x00, 0x00, 0x00, 0x01, 0x40, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x05, 0x68, 0x65, 0x6c,
        0x6c, 0x6f,
    ];
    assert_eq!(encode_transfer_header(0x0000_0001_4000_1000, 5), bytes[..12]);

    let decoder = TransferDecoder::default();
    let header = decoder.decode_header(&bytes).unwrap().unwrap();
    assert_eq!(header, TransferHeader { offset: 5_368_713_216, body_size: 5 });
    let frame = decoder.decode(&bytes).unwrap().unwrap();
    assert_eq!(frame.offset, 5_368_713_216);
    assert_eq!(frame.body, b"hello");
    assert_eq!(frame.frame_len, 17);
    assert!(!frame.is_heartbeat());
}

#[test]
fn transfer_header_batch_size_wire_vector() {
    // haTransferBatchSize = 32768 = 0x8000.
    let bytes = [0x00, 0x00, 0x00, 0x01, 0x40, 0x00, 0x10, 0x00, 0x00, 0x00, 0x80, 0x00];
    assert_eq!(encode_transfer_header(0x0000_0001_4000_1000, 32_768), bytes);
    assert_eq!(
        TransferDecoder::default().decode_header(&bytes),
        Ok(Some(TransferHeader { offset: 0x0000_0001_4000_1000, body_size: 32_768 }))
    );
}

#[test]
fn transfer_header_edge_value_encodings() {
    assert_eq!(
        encode_transfer_header(i64::MAX, i32::MAX),
        [0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0xff, 0xff, 0xff]
    );
    assert_eq!(
        encode_transfer_header(i64::MIN, i32::MIN),
        [0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x80, 0x00, 0x00, 0x00]
    );
    assert_eq!(encode_transfer_header(-1, -1), [0xff; 12]);
    assert_eq!(
        encode_heartbeat(i64::MAX),
        [0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00]
    );
}

#[test]
fn transfer_header_edge_value_decodings() {
    let decoder = TransferDecoder::default();
    let hb_max = [0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00];
    let frame = decoder.decode(&hb_max).unwrap().unwrap();
    assert_eq!((frame.offset, frame.frame_len, frame.is_heartbeat()), (i64::MAX, 12, true));

    let size_i32_max = [0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x7f, 0xff, 0xff, 0xff];
    assert_eq!(
        decoder.decode(&size_i32_max),
        Err(CodecError::BodyTooLarge { size: 2_147_483_647, max: 4_194_292 })
    );
    let size_i32_min = [0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x80, 0x00, 0x00, 0x00];
    assert_eq!(decoder.decode(&size_i32_min), Err(CodecError::NegativeBodySize(i32::MIN)));
    let size_minus_one = [0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff];
    assert_eq!(decoder.decode(&size_minus_one), Err(CodecError::NegativeBodySize(-1)));
    let offset_i64_min = [0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00];
    assert_eq!(decoder.decode(&offset_i64_min), Err(CodecError::NegativeOffset(i64::MIN)));
    // i64::MAX with a 1-byte body would end past i64::MAX.
    let end_overflow = [0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x01];
    assert_eq!(
        decoder.decode_header(&end_overflow),
        Err(CodecError::EndOffsetOverflow { offset: i64::MAX, size: 1 })
    );
}

// ---- decode_reports ----

#[test]
fn decode_reports_returns_the_last_of_several() {
    let mut buf = Vec::new();
    buf.extend_from_slice(&[0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00]); // 4096
    buf.extend_from_slice(&[0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x20, 0x00]); // 8192
    buf.extend_from_slice(&[0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x30, 0x00]); // 12288
    assert_eq!(decode_reports(&buf), Some((12_288, 24)));
}

#[test]
fn decode_reports_leaves_a_partial_trailing_report() {
    let mut buf = Vec::new();
    buf.extend_from_slice(&[0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00]); // 4096
    buf.extend_from_slice(&[0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x20, 0x00]); // 8192
    buf.extend_from_slice(&[0x00, 0x00, 0x00, 0x00, 0x00]); // first 5 bytes of the next one
    assert_eq!(decode_reports(&buf), Some((8192, 16)));

    // The caller drains 16 bytes, then the rest of the report arrives.
    let mut rest = buf[16..].to_vec();
    assert_eq!(decode_reports(&rest), None);
    rest.extend_from_slice(&[0x00, 0x30, 0x00]);
    assert_eq!(decode_reports(&rest), Some((12_288, 8)));
}

#[test]
fn decode_reports_below_eight_bytes_is_none() {
    assert_eq!(decode_reports(&[]), None);
    assert_eq!(decode_reports(&[0x00]), None);
    assert_eq!(decode_reports(&[0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]), None);
}

#[test]
fn decode_reports_passes_negative_values_through_and_validate_report_rejects_them() {
    let (value, consumed) = decode_reports(&[0xff; 8]).unwrap();
    assert_eq!((value, consumed), (-1, 8));
    assert_eq!(validate_report(value), Err(CodecError::NegativeReport(-1)));
    assert_eq!(validate_report(0x0000_0001_4000_1000), Ok(0x0000_0001_4000_1000));
}

// ---- transfer decoder ----

#[test]
fn incomplete_header_is_none() {
    let decoder = TransferDecoder::default();
    let header = [0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x04];
    for len in 0..12 {
        assert_eq!(decoder.decode(&header[..len]), Ok(None), "{len} bytes");
        assert_eq!(decoder.decode_header(&header[..len]), Ok(None), "{len} bytes");
    }
}

#[test]
fn incomplete_body_is_none_but_the_header_is_available() {
    let decoder = TransferDecoder::default();
    let bytes = with_body(
        [0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x04],
        &[0xde, 0xad, 0xbe],
    );
    assert_eq!(decoder.decode(&bytes), Ok(None));
    assert_eq!(
        decoder.decode_header(&bytes),
        Ok(Some(TransferHeader { offset: 256, body_size: 4 }))
    );
}

#[test]
fn exact_frame_is_decoded() {
    let decoder = TransferDecoder::default();
    let bytes = with_body(
        [0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x04],
        &[0xde, 0xad, 0xbe, 0xef],
    );
    let frame = decoder.decode(&bytes).unwrap().unwrap();
    assert_eq!(
        frame,
        TransferFrame { offset: 256, body: &[0xde, 0xad, 0xbe, 0xef], frame_len: 16 }
    );
}

#[test]
fn two_frames_back_to_back() {
    let decoder = TransferDecoder::default();
    let mut bytes = with_body(
        [0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x02],
        &[0x11, 0x22],
    );
    bytes.extend(with_body(
        [0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x02, 0x00, 0x00, 0x00, 0x03],
        &[0x33, 0x44, 0x55],
    ));
    assert_eq!(bytes.len(), 29);

    let first = decoder.decode(&bytes).unwrap().unwrap();
    assert_eq!(first, TransferFrame { offset: 256, body: &[0x11, 0x22], frame_len: 14 });
    let second = decoder.decode(&bytes[first.frame_len..]).unwrap().unwrap();
    assert_eq!(second, TransferFrame { offset: 258, body: &[0x33, 0x44, 0x55], frame_len: 15 });
    assert_eq!(first.frame_len + second.frame_len, bytes.len());
}

#[test]
fn heartbeat_followed_by_a_partial_frame() {
    let decoder = TransferDecoder::default();
    let mut bytes = vec![0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00];
    bytes.extend_from_slice(&[0x00, 0x00, 0x00]);
    let frame = decoder.decode(&bytes).unwrap().unwrap();
    assert_eq!(frame, TransferFrame { offset: 512, body: &[], frame_len: 12 });
    assert!(frame.is_heartbeat());
    assert_eq!(decoder.decode(&bytes[12..]), Ok(None));
}

#[test]
fn body_size_equal_to_max_is_accepted() {
    let decoder = TransferDecoder::new(12 + 16);
    assert_eq!(decoder.max_body_size(), 16);
    let header = [0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x10];
    // Header alone: valid, body not there yet.
    assert_eq!(
        decoder.decode_header(&header),
        Ok(Some(TransferHeader { offset: 64, body_size: 16 }))
    );
    assert_eq!(decoder.decode(&header), Ok(None));
    let bytes = with_body(header, &[0xab; 16]);
    let frame = decoder.decode(&bytes).unwrap().unwrap();
    assert_eq!((frame.offset, frame.body, frame.frame_len), (64, &[0xab; 16][..], 28));
}

#[test]
fn body_size_max_plus_one_fails_at_header_time() {
    let decoder = TransferDecoder::new(12 + 16);
    // Size 17, and not a single body byte present.
    let header = [0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x11];
    let expected = CodecError::BodyTooLarge { size: 17, max: 16 };
    assert_eq!(decoder.decode_header(&header), Err(expected));
    assert_eq!(decoder.decode(&header), Err(expected));
    let msg = expected.to_string();
    assert!(msg.contains("cannot fit the slave's read buffer"), "{msg}");
    assert!(msg.contains("17") && msg.contains("16"), "{msg}");
}

#[test]
fn stock_java_slave_limit_is_four_mib_minus_twelve() {
    assert_eq!(MAX_TRANSFER_BODY_SIZE, 4_194_292);
    let decoder = TransferDecoder::new(DEFAULT_SLAVE_BUFFER_SIZE);
    // 4_194_292 = 0x3F_FFF4 is accepted, 4_194_293 = 0x3F_FFF5 is not.
    let ok = [0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x3f, 0xff, 0xf4];
    assert_eq!(
        decoder.decode_header(&ok),
        Ok(Some(TransferHeader { offset: 0, body_size: 4_194_292 }))
    );
    let too_big = [0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x3f, 0xff, 0xf5];
    assert_eq!(
        decoder.decode_header(&too_big),
        Err(CodecError::BodyTooLarge { size: 4_194_293, max: 4_194_292 })
    );
}

#[test]
fn negative_body_size_is_an_error() {
    let decoder = TransferDecoder::default();
    let header = [0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x40, 0xff, 0xff, 0xff, 0xfe];
    assert_eq!(decoder.decode_header(&header), Err(CodecError::NegativeBodySize(-2)));
    assert_eq!(decoder.decode(&header), Err(CodecError::NegativeBodySize(-2)));
}

#[test]
fn negative_offset_is_an_error() {
    let decoder = TransferDecoder::default();
    let header = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xf0, 0x00, 0x00, 0x00, 0x00];
    assert_eq!(decoder.decode(&header), Err(CodecError::NegativeOffset(-16)));
}

// ---- streams cut at random points ----

/// Body limit of the decoders in the stream properties.
const SMALL_MAX_BODY: usize = 64;

/// Frames with contiguous offsets, as a master sends them: a heartbeat carries the next offset.
fn frame_sequence() -> impl Strategy<Value = Vec<Sent>> {
    let body = prop_oneof![
        1 => Just(Vec::new()),
        1 => Just(vec![0x5a; SMALL_MAX_BODY]),
        4 => prop::collection::vec(any::<u8>(), 0..=SMALL_MAX_BODY),
    ];
    (0..=i64::MAX / 2, prop::collection::vec(body, 1..24)).prop_map(|(start, bodies)| {
        let mut offset = start;
        let mut frames = Vec::with_capacity(bodies.len());
        for body in bodies {
            let len = i64::try_from(body.len()).unwrap();
            frames.push((offset, body));
            offset += len;
        }
        frames
    })
}

fn encode_frames(frames: &[Sent]) -> Vec<u8> {
    let mut stream = Vec::new();
    for (offset, body) in frames {
        stream.extend_from_slice(&encode_transfer_header(
            *offset,
            i32::try_from(body.len()).unwrap(),
        ));
        stream.extend_from_slice(body);
    }
    stream
}

/// Splits `stream` at the given cut points (taken modulo its length) into chunks, in order.
fn chunks<'a>(stream: &'a [u8], cuts: &[Index]) -> Vec<&'a [u8]> {
    let mut points: Vec<usize> = cuts.iter().map(|cut| cut.index(stream.len() + 1)).collect();
    points.push(0);
    points.push(stream.len());
    points.sort_unstable();
    points.dedup();
    points.windows(2).map(|w| &stream[w[0]..w[1]]).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn transfer_stream_survives_any_chunking(
        frames in frame_sequence(),
        cuts in prop::collection::vec(any::<Index>(), 0..32),
    ) {
        let stream = encode_frames(&frames);
        let decoder = TransferDecoder::new(TRANSFER_HEADER_SIZE + SMALL_MAX_BODY);
        let mut buf: Vec<u8> = Vec::new();
        let mut decoded: Vec<Sent> = Vec::new();
        for chunk in chunks(&stream, &cuts) {
            buf.extend_from_slice(chunk);
            let mut consumed = 0;
            while let Some(frame) = decoder.decode(&buf[consumed..]).unwrap() {
                prop_assert_eq!(frame.is_heartbeat(), frame.body.is_empty());
                prop_assert_eq!(frame.frame_len, TRANSFER_HEADER_SIZE + frame.body.len());
                decoded.push((frame.offset, frame.body.to_vec()));
                consumed += frame.frame_len;
            }
            buf.drain(..consumed);
            // Whatever is left is a strict prefix of one frame.
            prop_assert!(buf.len() < TRANSFER_HEADER_SIZE + SMALL_MAX_BODY);
        }
        prop_assert!(buf.is_empty(), "{} bytes left over", buf.len());
        prop_assert_eq!(decoded, frames);
    }

    #[test]
    fn transfer_codec_survives_any_chunking(
        frames in frame_sequence(),
        cuts in prop::collection::vec(any::<Index>(), 0..32),
    ) {
        let stream = encode_frames(&frames);
        let mut codec = TransferFrameCodec::new(TRANSFER_HEADER_SIZE + SMALL_MAX_BODY);
        let mut buf = BytesMut::new();
        let mut decoded: Vec<Sent> = Vec::new();
        for chunk in chunks(&stream, &cuts) {
            buf.extend_from_slice(chunk);
            while let Some(frame) = codec.decode(&mut buf).unwrap() {
                decoded.push((frame.offset, frame.body.to_vec()));
            }
        }
        prop_assert_eq!(codec.decode_eof(&mut buf).unwrap(), None);
        prop_assert!(buf.is_empty(), "{} bytes left over", buf.len());
        prop_assert_eq!(decoded, frames);
    }

    #[test]
    fn report_stream_yields_the_last_complete_report_after_each_chunk(
        reports in prop::collection::vec(any::<i64>(), 1..40),
        cuts in prop::collection::vec(any::<Index>(), 0..32),
    ) {
        let stream: Vec<u8> = reports.iter().flat_map(|r| encode_report(*r)).collect();
        let mut buf: Vec<u8> = Vec::new();
        let mut received = 0usize;
        let mut latest: Option<i64> = None;
        for chunk in chunks(&stream, &cuts) {
            let complete_before = received / REPORT_SIZE;
            buf.extend_from_slice(chunk);
            received += chunk.len();
            let complete_now = received / REPORT_SIZE;
            match decode_reports(&buf) {
                Some((value, consumed)) => {
                    prop_assert!(complete_now > complete_before);
                    prop_assert_eq!(consumed, (complete_now - complete_before) * REPORT_SIZE);
                    buf.drain(..consumed);
                    latest = Some(value);
                }
                None => prop_assert_eq!(complete_now, complete_before),
            }
            prop_assert_eq!(buf.len(), received % REPORT_SIZE);
            let expected = complete_now.checked_sub(1).map(|i| reports[i]);
            prop_assert_eq!(latest, expected);
        }
        prop_assert!(buf.is_empty());
        prop_assert_eq!(latest, reports.last().copied());
    }
}
