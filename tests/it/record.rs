//! The record codec against upstream RocketMQ's golden vectors (`data/records.json`, made by
//! rocketmq-all-5.3.3's encoder), round-trip properties, and one crafted record per decode check.

use std::net::{IpAddr, SocketAddr};
use std::sync::LazyLock;

use bytes::Bytes;
use hasync::store::record::*;
use proptest::prelude::*;
use serde::Deserialize;

const VECTORS_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/data/records.json");

#[derive(Deserialize)]
struct VectorFile {
    vectors: Vec<Vector>,
    commitlog_dir: CommitlogDir,
}

#[derive(Deserialize)]
struct Vector {
    name: String,
    kind: String,
    inputs: serde_json::Value,
    physical_offset: i64,
    size: usize,
    #[serde(default)]
    magic: Option<String>,
    #[serde(default)]
    sysflag: Option<i32>,
    #[serde(default)]
    body_crc: Option<i32>,
    #[serde(default)]
    decoded: serde_json::Value,
    fields: Vec<Field>,
    #[serde(default)]
    hex: Option<String>,
}

#[derive(Deserialize)]
struct Field {
    name: String,
    offset: usize,
    length: usize,
    hex: String,
}

#[derive(Deserialize)]
struct MessageInputs {
    topic: String,
    queue_id: i32,
    flag: i32,
    body_length: usize,
    body: String,
    properties: std::collections::BTreeMap<String, String>,
    properties_string: String,
    transaction_type_sysflag_bits: i32,
    born_timestamp: i64,
    born_host: String,
    store_timestamp: i64,
    store_host: String,
    reconsume_times: i32,
    prepared_transaction_offset: i64,
    assigned_queue_offset: i64,
}

#[derive(Deserialize)]
struct BlankInputs {
    remaining: i32,
}

#[derive(Deserialize)]
struct CommitlogDir {
    file_size: usize,
    files: Vec<DirFile>,
    records: Vec<DirRecord>,
    end_offset: i64,
}

#[derive(Deserialize)]
struct DirFile {
    name: String,
    length: usize,
    hex: String,
}

#[derive(Deserialize)]
struct DirRecord {
    file: String,
    position: usize,
    physical_offset: i64,
    size: usize,
    vector: String,
}

static VECTORS: LazyLock<VectorFile> = LazyLock::new(|| {
    let text = std::fs::read_to_string(VECTORS_PATH).expect("read records.json");
    serde_json::from_str(&text).expect("parse records.json")
});

fn unhex(hex: &str) -> Vec<u8> {
    assert!(hex.len().is_multiple_of(2), "odd hex length {}", hex.len());
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect()
}

fn vector(name: &str) -> &'static Vector {
    VECTORS.vectors.iter().find(|v| v.name == name).unwrap_or_else(|| panic!("no vector {name}"))
}

fn vector_bytes(name: &str) -> Vec<u8> {
    unhex(vector(name).hex.as_deref().expect("vector has hex"))
}

/// Hosts are written `ip:port`, IPv6 unbracketed (`2001:db8::10:54321`): the port follows the
/// last colon.
fn parse_host(text: &str) -> SocketAddr {
    let (ip, port) = text.rsplit_once(':').expect("host has a port");
    SocketAddr::new(ip.parse::<IpAddr>().expect("host ip"), port.parse().expect("host port"))
}

/// The three body descriptions the vectors use.
fn parse_body(description: &str, body_length: usize) -> Vec<u8> {
    let body = if let Some(text) = description.strip_prefix("UTF-8 \"") {
        text.strip_suffix('"').expect("closing quote").as_bytes().to_vec()
    } else if description == "empty (0 bytes)" {
        Vec::new()
    } else if description.starts_with(&format!("{body_length} bytes: byte i = 'a' + (i % 26)")) {
        (0..body_length).map(|i| b'a' + (i % 26) as u8).collect()
    } else {
        panic!("unknown body description {description:?}")
    };
    assert_eq!(body.len(), body_length);
    body
}

fn message_inputs(v: &Vector) -> MessageInputs {
    assert_eq!(v.kind, "message", "{}", v.name);
    serde_json::from_value(v.inputs.clone()).expect("message inputs")
}

fn message_of(inputs: &MessageInputs) -> Message {
    Message {
        topic: inputs.topic.clone(),
        queue_id: inputs.queue_id,
        flag: inputs.flag,
        body: Bytes::from(parse_body(&inputs.body, inputs.body_length)),
        properties: Bytes::from(inputs.properties_string.clone().into_bytes()),
        sys_flag: inputs.transaction_type_sysflag_bits,
        born_timestamp_ms: inputs.born_timestamp,
        born_host: parse_host(&inputs.born_host),
        store_timestamp_ms: inputs.store_timestamp,
        store_host: parse_host(&inputs.store_host),
        reconsume_times: inputs.reconsume_times,
        prepared_transaction_offset: inputs.prepared_transaction_offset,
    }
}

fn expect_message(decoded: Result<Decoded<'_>, RecordError>) -> RecordView<'_> {
    match decoded {
        Ok(Decoded::Message(view)) => view,
        other => panic!("expected a message record, got {other:?}"),
    }
}

fn check_message_vector(v: &Vector) {
    let inputs = message_inputs(v);
    let msg = message_of(&inputs);
    let expected = unhex(v.hex.as_deref().unwrap());
    assert_eq!(expected.len(), v.size, "{}", v.name);
    assert_eq!(encoded_len(&msg), Ok(v.size), "{}", v.name);
    let encoded = encode(&msg, inputs.assigned_queue_offset, v.physical_offset).unwrap();
    assert_eq!(encoded, expected, "{}: encoded bytes differ", v.name);
    for field in v.fields.iter().filter(|f| !f.hex.is_empty()) {
        let got = &encoded[field.offset..field.offset + field.length];
        assert_eq!(got, unhex(&field.hex), "{}: field {}", v.name, field.name);
    }

    let view = expect_message(decode(&expected, v.physical_offset));
    let magic = v.magic.as_deref().unwrap().trim_start_matches("0x");
    assert_eq!(view.magic, u32::from_str_radix(magic, 16).unwrap() as i32, "{}", v.name);
    assert_eq!(view.size(), v.size);
    assert_eq!(view.total_size, v.size as i32);
    assert_eq!(view.body_crc, v.body_crc.unwrap(), "{}", v.name);
    assert_eq!(view.sys_flag, v.sysflag.unwrap(), "{}", v.name);
    let check = &v.decoded["check_message_and_return_size"];
    assert_eq!(view.queue_offset, check["consume_queue_offset"].as_i64().unwrap(), "{}", v.name);
    let tx_bits = inputs.transaction_type_sysflag_bits;
    let queue_offset =
        if tx_bits == 4 || tx_bits == 0xC { 0 } else { inputs.assigned_queue_offset };
    assert_eq!(view.queue_offset, queue_offset, "{}", v.name);
    assert_eq!(view.physical_offset, v.physical_offset);
    assert_eq!(view.queue_id, inputs.queue_id);
    assert_eq!(view.flag, inputs.flag);
    assert_eq!(view.born_timestamp_ms, inputs.born_timestamp);
    assert_eq!(view.born_host, msg.born_host);
    assert_eq!(view.store_timestamp_ms, inputs.store_timestamp);
    assert_eq!(view.store_host, msg.store_host);
    assert_eq!(view.reconsume_times, inputs.reconsume_times);
    assert_eq!(view.prepared_transaction_offset, inputs.prepared_transaction_offset);
    assert_eq!(view.body, &msg.body[..]);
    assert_eq!(view.topic, inputs.topic.as_bytes());
    assert_eq!(view.properties, inputs.properties_string.as_bytes());
    assert_eq!(view.tags(), inputs.properties.get("TAGS").map(|t| t.as_bytes()));
    assert_eq!(view.keys(), inputs.properties.get("KEYS").map(|k| k.as_bytes()));
    let mut pairs = parse_properties(view.properties).unwrap();
    pairs.sort();
    let map_pairs: Vec<_> = inputs.properties.into_iter().collect();
    assert_eq!(pairs, map_pairs, "{}", v.name);

    let back = view.to_message();
    assert_eq!(back, Message { sys_flag: v.sysflag.unwrap(), ..msg }, "{}", v.name);
    assert_eq!(encode(&back, view.queue_offset, v.physical_offset).unwrap(), expected);
}

#[test]
fn every_golden_vector_encodes_and_decodes_byte_for_byte() {
    let mut seen = Vec::new();
    for v in &VECTORS.vectors {
        match v.kind.as_str() {
            "message" => check_message_vector(v),
            "blank" => {
                let inputs: BlankInputs = serde_json::from_value(v.inputs.clone()).unwrap();
                let expected = unhex(v.hex.as_deref().unwrap());
                assert_eq!(expected.len(), v.size);
                let mut fresh = vec![0u8; inputs.remaining as usize];
                encode_blank(inputs.remaining, &mut fresh);
                assert_eq!(fresh, expected);
                assert_eq!(
                    decode(&expected[..BLANK_HEADER_SIZE], v.physical_offset),
                    Ok(Decoded::Blank { size: 24 })
                );
            }
            other => panic!("unknown vector kind {other}"),
        }
        seen.push(v.name.as_str());
    }
    assert_eq!(
        seen,
        [
            "a_v1_basic",
            "b_v1_empty_body",
            "c_ipv6_hosts",
            "d_v2_topic_200",
            "e_body_10KiB",
            "f_flag_reconsume_tx",
            "g_blank_24",
            "h_no_properties",
            "i_v1_topic_127",
            "j_prepared_half",
            "k_crc_top_bit",
        ]
    );
}

/// Rebuilds records.md's two-file directory (segments of 745 bytes, blank at 721) and then
/// walks it the way recovery does.
#[test]
fn two_file_commitlog_directory_is_rebuilt_byte_for_byte() {
    let dir = &VECTORS.commitlog_dir;
    assert_eq!(dir.file_size, 745);
    let mut files: Vec<Vec<u8>> = dir.files.iter().map(|_| vec![0u8; dir.file_size]).collect();
    let file_index = |name: &str| dir.files.iter().position(|f| f.name == name).unwrap();
    for rec in &dir.records {
        let index = file_index(&rec.file);
        let base_offset: i64 = rec.file.parse().unwrap();
        assert_eq!(base_offset, (index * dir.file_size) as i64);
        assert_eq!(rec.physical_offset, base_offset + rec.position as i64);
        let segment = &mut files[index];
        if rec.vector == "g_blank_24" {
            assert_eq!(rec.position + rec.size, dir.file_size);
            encode_blank(rec.size as i32, &mut segment[rec.position..]);
            continue;
        }
        let inputs = message_inputs(vector(&rec.vector));
        let msg = message_of(&inputs);
        assert_eq!(encoded_len(&msg), Ok(rec.size));
        assert!(rec.position + rec.size + BLANK_HEADER_SIZE <= dir.file_size, "room for blank");
        let dst = &mut segment[rec.position..rec.position + rec.size];
        encode_into(&msg, inputs.assigned_queue_offset, rec.physical_offset, dst).unwrap();
    }
    for (built, file) in files.iter().zip(&dir.files) {
        assert_eq!(file.length, dir.file_size);
        assert_eq!(*built, unhex(&file.hex), "file {}", file.name);
    }

    let (mut index, mut position, mut records) = (0, 0, 0);
    let end_error = loop {
        let offset = (index * dir.file_size + position) as i64;
        match decode(&files[index][position..], offset) {
            Ok(Decoded::Message(view)) => {
                position += view.size();
                records += 1;
            }
            Ok(Decoded::Blank { size }) => {
                assert_eq!(position + size as usize, dir.file_size);
                (index, position) = (index + 1, 0);
            }
            Err(error) => break error,
        }
    };
    assert_eq!(records, 6);
    assert_eq!((index * dir.file_size + position) as i64, dir.end_offset);
    assert_eq!(end_error, RecordError::BadMagic(0));
}

fn decode_err(buf: &[u8], expected_offset: i64) -> RecordError {
    decode(buf, expected_offset).expect_err("decode must reject the record")
}

fn put_i32(rec: &mut [u8], at: usize, value: i32) {
    rec[at..at + 4].copy_from_slice(&value.to_be_bytes());
}

const A_OFFSET: i64 = 5_368_713_216;

#[test]
fn total_size_bigger_than_fields_is_rejected() {
    let mut rec = vector_bytes("a_v1_basic");
    put_i32(&mut rec, 0, 171);
    assert_eq!(decode_err(&rec, A_OFFSET), RecordError::Incomplete { needed: 171, available: 170 });
    rec.push(0);
    let err = decode_err(&rec, A_OFFSET);
    assert_eq!(err, RecordError::BadTotalSize { total_size: 171, fields_size: 170 });
}

#[test]
fn total_size_smaller_than_fields_is_rejected() {
    let mut rec = vector_bytes("a_v1_basic");
    put_i32(&mut rec, 0, 169);
    let err = decode_err(&rec, A_OFFSET);
    assert_eq!(err, RecordError::BadTotalSize { total_size: 169, fields_size: 170 });
    for (total_size, fields_size) in [(90, 91), (0, 91), (-170, 91)] {
        put_i32(&mut rec, 0, total_size);
        let err = decode_err(&rec, A_OFFSET);
        assert_eq!(err, RecordError::BadTotalSize { total_size, fields_size }, "{total_size}");
    }
    let mut v2 = vector_bytes("d_v2_topic_200");
    put_i32(&mut v2, 0, 91);
    let err = decode_err(&v2, 5_368_725_504);
    assert_eq!(err, RecordError::BadTotalSize { total_size: 91, fields_size: 92 });
    let mut ipv6 = vector_bytes("c_ipv6_hosts");
    put_i32(&mut ipv6, 0, 100);
    let err = decode_err(&ipv6, 5_368_721_408);
    assert_eq!(err, RecordError::BadTotalSize { total_size: 100, fields_size: 115 });
}

#[test]
fn wrong_magic_is_rejected() {
    let mut rec = vector_bytes("a_v1_basic");
    put_i32(&mut rec, 4, 0x1234_5678);
    assert_eq!(decode_err(&rec, A_OFFSET), RecordError::BadMagic(0x1234_5678));
    assert_eq!(decode_err(&[0u8; 16], 0), RecordError::BadMagic(0));
}

#[test]
fn flipped_body_byte_is_rejected() {
    let mut rec = vector_bytes("a_v1_basic");
    rec[88] ^= 0x01; // "hello" -> "iello"
    let computed = (crc32fast::hash(b"iello") & 0x7FFF_FFFF) as i32;
    let err = decode_err(&rec, A_OFFSET);
    assert_eq!(err, RecordError::BodyCrcMismatch { stored: 907_060_870, computed });
}

#[test]
fn unmasked_crc_is_rejected() {
    let mut rec = vector_bytes("k_crc_top_bit");
    put_i32(&mut rec, 8, 0xFFAB_723A_u32 as i32);
    let err = decode_err(&rec, 5_368_758_272);
    assert_eq!(err, RecordError::BodyCrcMismatch { stored: -5_541_318, computed: 0x7FAB_723A });
}

#[test]
fn empty_body_with_nonzero_crc_is_rejected() {
    let mut rec = vector_bytes("b_v1_empty_body");
    put_i32(&mut rec, 8, 1);
    let err = decode_err(&rec, 5_368_717_312);
    assert_eq!(err, RecordError::BodyCrcMismatch { stored: 1, computed: 0 });
}

#[test]
fn physical_offset_mismatch_is_rejected() {
    let rec = vector_bytes("a_v1_basic");
    let err = decode_err(&rec, A_OFFSET + 170);
    assert_eq!(
        err,
        RecordError::PhysicalOffsetMismatch { expected: A_OFFSET + 170, found: A_OFFSET }
    );
}

#[test]
fn body_length_past_end_or_negative_is_rejected() {
    for length in [1000, 80, -1, i32::MIN] {
        let mut rec = vector_bytes("a_v1_basic");
        put_i32(&mut rec, 84, length);
        let err = decode_err(&rec, A_OFFSET);
        let field = "body";
        assert_eq!(err, RecordError::LengthOutOfBounds { field, length, total_size: 170 });
    }
}

#[test]
fn topic_length_negative_or_past_end_is_rejected() {
    for (byte, length) in [(0x80u8, -128), (0xFF, -1), (0x7F, 127), (0x4B, 75)] {
        let mut rec = vector_bytes("a_v1_basic");
        rec[93] = byte;
        let err = decode_err(&rec, A_OFFSET);
        let field = "topic";
        assert_eq!(err, RecordError::LengthOutOfBounds { field, length, total_size: 170 });
    }
    let mut v2 = vector_bytes("d_v2_topic_200");
    v2[93..95].copy_from_slice(&[0xFF, 0xFF]);
    let err = decode_err(&v2, 5_368_725_504);
    assert_eq!(err, RecordError::LengthOutOfBounds { field: "topic", length: -1, total_size: 365 });
}

#[test]
fn properties_length_negative_is_rejected() {
    let mut rec = vector_bytes("a_v1_basic");
    rec[100..102].copy_from_slice(&[0x80, 0x00]);
    let err = decode_err(&rec, A_OFFSET);
    let field = "properties";
    assert_eq!(err, RecordError::LengthOutOfBounds { field, length: -32768, total_size: 170 });
    rec[100..102].copy_from_slice(&[0x00, 0x45]);
    let err = decode_err(&rec, A_OFFSET);
    assert_eq!(err, RecordError::BadTotalSize { total_size: 170, fields_size: 171 });
}

#[test]
fn truncated_buffer_is_incomplete() {
    let rec = vector_bytes("a_v1_basic");
    for available in [169, 100, 8] {
        let err = decode_err(&rec[..available], A_OFFSET);
        assert_eq!(err, RecordError::Incomplete { needed: 170, available });
    }
    for available in [7, 1, 0] {
        let err = decode_err(&rec[..available], A_OFFSET);
        assert_eq!(err, RecordError::Incomplete { needed: 8, available });
    }
}

#[test]
fn blank_smaller_than_its_header_is_rejected() {
    for size in [7, 0, -1] {
        let mut blank = [0u8; 8];
        put_i32(&mut blank, 0, size);
        put_i32(&mut blank, 4, BLANK_MAGIC);
        assert_eq!(decode_err(&blank, 0), RecordError::BlankSize { size });
    }
    let mut blank = [0u8; 8];
    encode_blank(8, &mut blank);
    assert_eq!(decode(&blank, 0), Ok(Decoded::Blank { size: 8 }));
}

#[test]
fn port_out_of_range_and_non_utf8_topic_are_rejected() {
    let mut rec = vector_bytes("a_v1_basic");
    put_i32(&mut rec, 52, 70_000);
    let err = decode_err(&rec, A_OFFSET);
    assert_eq!(err, RecordError::PortOutOfRange { field: "born_host", port: 70_000 });
    // An IPv6 flag on IPv4 hosts shifts the fields: the born port is read from the store ip.
    let mut rec = vector_bytes("a_v1_basic");
    put_i32(&mut rec, 36, SYSFLAG_BORNHOST_V6);
    let err = decode_err(&rec, A_OFFSET);
    assert_eq!(err, RecordError::PortOutOfRange { field: "born_host", port: 0x0A00_0001 });
    let mut rec = vector_bytes("a_v1_basic");
    rec[94] = 0xFF;
    assert_eq!(decode_err(&rec, A_OFFSET), RecordError::TopicNotUtf8);
}

#[test]
fn error_messages_name_the_field_and_values() {
    let err = RecordError::LengthOutOfBounds { field: "topic", length: -1, total_size: 170 };
    assert_eq!(
        err.to_string(),
        "topic length -1 is negative or runs past the record end (total_size 170)"
    );
    let err = RecordError::BodyCrcMismatch { stored: -5_541_318, computed: 0x7FAB_723A };
    assert_eq!(err.to_string(), "body crc mismatch: stored 0xffab723a, computed 0x7fab723a");
    assert_eq!(RecordError::BadMagic(0).to_string(), "bad magic code 0x00000000");
    let err = RecordError::PhysicalOffsetMismatch { expected: 1, found: 2 };
    assert_eq!(err.to_string(), "physical offset mismatch: expected 1, record says 2");
}

fn sample(topic: &str) -> Message {
    Message {
        topic: topic.to_owned(),
        queue_id: 3,
        flag: 7,
        body: Bytes::from_static(b"hello"),
        properties: Bytes::from_static(b"TAGS\x01TagA\x02KEYS\x01k1 k2\x02"),
        sys_flag: 0,
        born_timestamp_ms: 1_700_000_000_000,
        born_host: "1.2.3.4:5".parse().unwrap(),
        store_timestamp_ms: 1_700_000_000_123,
        store_host: "[::1]:9".parse().unwrap(),
        reconsume_times: 2,
        prepared_transaction_offset: 99,
    }
}

#[test]
fn encode_rejects_bad_messages() {
    let mut msg = sample("a\0b");
    assert_eq!(encoded_len(&msg), Err(RecordError::MalformedTopic));
    msg.topic = String::new();
    assert_eq!(encoded_len(&msg), Err(RecordError::TopicEmpty));
    assert_eq!(encode(&msg, 0, 0), Err(RecordError::TopicEmpty));
    msg.topic = "t".repeat(256);
    assert_eq!(encoded_len(&msg), Err(RecordError::TopicTooLong { length: 256 }));
    msg.topic = "t".repeat(255);
    msg.properties = Bytes::from(vec![b'a'; 32768]);
    assert_eq!(encoded_len(&msg), Err(RecordError::PropertiesTooLong { length: 32768 }));
    msg.properties = Bytes::from(vec![b'a'; 32767]);
    assert_eq!(encoded_len(&msg), Err(RecordError::MalformedProperties { at: 32767 }));
    let mut props = b"a\x01".to_vec();
    props.resize(32766, b'a');
    props.push(b'\x02');
    msg.properties = Bytes::from(props);
    let size = encoded_len(&msg).unwrap();
    assert_eq!(size, MAX_RECORD_OVERHEAD - 12 + 5);
    assert_eq!(
        encode_into(&msg, 0, 0, &mut vec![0; size + 1]),
        Err(RecordError::DestinationLength { expected: size, actual: size + 1 })
    );
    assert_eq!(
        encode_into(&msg, 0, 0, &mut vec![0; size - 1]),
        Err(RecordError::DestinationLength { expected: size, actual: size - 1 })
    );
}

#[test]
fn tags_and_keys_come_from_raw_properties() {
    let rec = encode(&sample("T"), 0, 0).unwrap();
    let view = expect_message(decode(&rec, 0));
    assert_eq!(view.tags(), Some(&b"TagA"[..]));
    assert_eq!(view.keys(), Some(&b"k1 k2"[..]));
    let mut msg = sample("T");
    msg.properties = Bytes::from_static(b"KEYSX\x01a\x02TAG\x01b\x02");
    let rec = encode(&msg, 0, 0).unwrap();
    let view = expect_message(decode(&rec, 0));
    assert_eq!((view.tags(), view.keys()), (None, None));
}

#[test]
fn properties_encode_and_parse() {
    let raw = encode_properties(&[("KEYS", "a b"), ("TAGS", "x")]).unwrap();
    assert_eq!(&raw[..], b"KEYS\x01a b\x02TAGS\x01x\x02");
    let parsed = parse_properties(&raw).unwrap();
    assert_eq!(
        parsed,
        [("KEYS".to_owned(), "a b".to_owned()), ("TAGS".to_owned(), "x".to_owned())]
    );
    assert_eq!(parse_properties(b"").unwrap(), Vec::<(String, String)>::new());
    assert_eq!(encode_properties(&[]).unwrap(), Bytes::new());
    let bad = |index, reason| RecordError::InvalidProperty { index, reason };
    let separator = "name or value contains \\u{1} or \\u{2}";
    assert_eq!(encode_properties(&[("a", "b"), ("c\u{1}", "d")]).unwrap_err(), bad(1, separator));
    assert_eq!(encode_properties(&[("a", "b\u{2}")]).unwrap_err(), bad(0, separator));
    assert_eq!(encode_properties(&[("", "b")]).unwrap_err(), bad(0, "empty name or value"));
    assert_eq!(encode_properties(&[("a", "")]).unwrap_err(), bad(0, "empty name or value"));
    let long = "v".repeat(32767);
    let err = encode_properties(&[("k", &long)]).unwrap_err();
    assert_eq!(err, RecordError::PropertiesTooLong { length: 32770 });
    let err = |raw: &[u8]| parse_properties(raw).unwrap_err();
    assert_eq!(err(b"a\x01b"), bad(0, "entry does not end with \\u{2}"));
    assert_eq!(err(b"a\x01b\x02ab\x02"), bad(1, "entry has no \\u{1}"));
    assert_eq!(err(b"\x01b\x02"), bad(0, "empty name"));
    assert_eq!(err(b"a\x01b\x01c\x02"), bad(0, "value contains \\u{1}"));
    assert_eq!(err(b"a\x01\xff\x02"), bad(0, "value is not UTF-8"));
    assert_eq!(err(b"\xff\x01b\x02"), bad(0, "name is not UTF-8"));
}

/// A full 64 KiB segment: the largest body that leaves room for the blank, with the largest
/// overhead (IPv6 hosts, 255-byte topic, 32767 bytes of properties).
#[test]
fn largest_body_fills_a_64_kib_segment_with_room_for_the_blank() {
    const SEGMENT_SIZE: usize = 64 * 1024;
    let mut msg = sample(&"T".repeat(MAX_TOPIC_BYTES));
    msg.born_host = "[2001:db8::10]:54321".parse().unwrap();
    let mut props = b"k\x01".to_vec();
    props.resize(MAX_PROPERTIES_BYTES - 1, b'v');
    props.push(b'\x02');
    msg.properties = Bytes::from(props);
    msg.body = Bytes::from(vec![0x5A; SEGMENT_SIZE - BLANK_HEADER_SIZE - MAX_RECORD_OVERHEAD]);
    let mut segment = vec![0u8; SEGMENT_SIZE];
    let size = encoded_len(&msg).unwrap();
    assert_eq!(size, SEGMENT_SIZE - BLANK_HEADER_SIZE);
    let base_offset = 7 * SEGMENT_SIZE as i64;
    encode_into(&msg, 5, base_offset, &mut segment[..size]).unwrap();
    encode_blank(BLANK_HEADER_SIZE as i32, &mut segment[size..]);
    let view = expect_message(decode(&segment, base_offset));
    assert_eq!(view.magic, MAGIC_V2);
    assert_eq!(view.sys_flag, SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6);
    assert_eq!(view.to_message(), Message { sys_flag: view.sys_flag, ..msg });
    let blank_offset = base_offset + size as i64;
    assert_eq!(decode(&segment[size..], blank_offset), Ok(Decoded::Blank { size: 8 }));
}

fn arb_host() -> impl Strategy<Value = SocketAddr> {
    prop_oneof![
        (any::<[u8; 4]>(), any::<u16>()).prop_map(|(ip, port)| SocketAddr::from((ip, port))),
        (any::<[u8; 16]>(), any::<u16>()).prop_map(|(ip, port)| SocketAddr::from((ip, port))),
    ]
}

fn arb_topic() -> impl Strategy<Value = String> {
    prop_oneof!["[A-Za-z0-9_%|-]{1,127}", "[A-Za-z0-9_%|-]{128,255}"]
}

fn arb_properties() -> impl Strategy<Value = Vec<(String, String)>> {
    prop::collection::vec(("[A-Z_]{1,12}", "[ -~]{1,40}"), 0..8)
}

fn arb_body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![Just(Vec::new()), prop::collection::vec(any::<u8>(), 0..2048)]
}

prop_compose! {
    fn arb_message()(
        topic in arb_topic(),
        properties in arb_properties(),
        body in arb_body(),
        (queue_id, flag, sys_flag, reconsume_times) in any::<(i32, i32, i32, i32)>(),
        (born_timestamp_ms, store_timestamp_ms) in any::<(i64, i64)>(),
        prepared_transaction_offset in any::<i64>(),
        born_host in arb_host(),
        store_host in arb_host(),
    ) -> (Message, Vec<(String, String)>) {
        let refs: Vec<(&str, &str)> = properties.iter().map(|(n, v)| (&n[..], &v[..])).collect();
        let msg = Message {
            topic, queue_id, flag, body: Bytes::from(body),
            properties: encode_properties(&refs).unwrap(),
            sys_flag, born_timestamp_ms, born_host, store_timestamp_ms, store_host,
            reconsume_times, prepared_transaction_offset,
        };
        (msg, properties)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_messages_round_trip(
        (msg, pairs) in arb_message(),
        queue_offset in any::<i64>(),
        physical_offset in any::<i64>(),
    ) {
        let rec = encode(&msg, queue_offset, physical_offset).unwrap();
        prop_assert_eq!(rec.len(), encoded_len(&msg).unwrap());
        let view = expect_message(decode(&rec, physical_offset));
        let v2 = msg.topic.len() > 127;
        prop_assert_eq!(view.magic, if v2 { MAGIC_V2 } else { MAGIC_V1 });
        let mut sys_flag = msg.sys_flag & !(SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6);
        if msg.born_host.is_ipv6() { sys_flag |= SYSFLAG_BORNHOST_V6; }
        if msg.store_host.is_ipv6() { sys_flag |= SYSFLAG_STOREHOST_V6; }
        prop_assert_eq!(view.sys_flag, sys_flag);
        let hidden = matches!(sys_flag & 0xC, 0x4 | 0xC);
        prop_assert_eq!(view.queue_offset, if hidden { 0 } else { queue_offset });
        prop_assert_eq!(view.physical_offset, physical_offset);
        let crc = if msg.body.is_empty() { 0 } else { crc32fast::hash(&msg.body) & 0x7FFF_FFFF };
        prop_assert_eq!(view.body_crc, crc as i32);
        prop_assert_eq!(parse_properties(view.properties).unwrap(), pairs);
        prop_assert_eq!(view.to_message(), Message { sys_flag, ..msg });
        let again = encode(&view.to_message(), view.queue_offset, physical_offset).unwrap();
        prop_assert_eq!(again, rec);
    }

    #[test]
    fn largest_body_for_any_overhead_fits_a_segment(
        (mut msg, _) in arb_message(),
        segment_kib in 33usize..=128,
    ) {
        let segment_size = segment_kib * 1024;
        msg.body = Bytes::new();
        let overhead = encoded_len(&msg).unwrap();
        msg.body = Bytes::from(vec![0xA5; segment_size - BLANK_HEADER_SIZE - overhead]);
        let mut segment = vec![0u8; segment_size];
        let size = encoded_len(&msg).unwrap();
        prop_assert_eq!(size + BLANK_HEADER_SIZE, segment_size);
        encode_into(&msg, 1, 0, &mut segment[..size]).unwrap();
        encode_blank(BLANK_HEADER_SIZE as i32, &mut segment[size..]);
        let view = expect_message(decode(&segment, 0));
        prop_assert_eq!(view.size(), size);
        prop_assert_eq!(view.body, &msg.body[..]);
        prop_assert_eq!(decode(&segment[size..], size as i64), Ok(Decoded::Blank { size: 8 }));
    }

    /// Any single-byte corruption of a golden record either fails with an error or decodes to a
    /// record no longer than the buffer at the expected offset; it never panics.
    #[test]
    fn corrupted_records_never_panic(index in 0usize..170, xor in 1u8..=255, cut in 0usize..=170) {
        let mut rec = vector_bytes("a_v1_basic");
        rec[index] ^= xor;
        rec.truncate(cut);
        if let Ok(Decoded::Message(view)) = decode(&rec, A_OFFSET) {
            prop_assert!(view.size() <= rec.len());
            prop_assert_eq!(view.physical_offset, A_OFFSET);
        }
    }
}

/// BODYCRC covers only the body: a torn write that zeroed the end of a record is caught by the
/// shape of the topic and properties instead.
#[test]
fn torn_record_tails_are_rejected() {
    let v = VECTORS.vectors.iter().find(|v| v.name == "a_v1_basic").unwrap();
    let mut rec = unhex(v.hex.as_deref().unwrap());
    let len = rec.len();
    for zeroed in 1..=68 {
        rec[len - zeroed..].fill(0);
        assert!(
            matches!(decode(&rec, v.physical_offset), Err(RecordError::MalformedProperties { .. })),
            "{zeroed} zeroed bytes"
        );
    }
    let h = VECTORS.vectors.iter().find(|v| v.name == "h_no_properties").unwrap();
    let mut rec = unhex(h.hex.as_deref().unwrap());
    let len = rec.len();
    rec[len - 3..len - 2].fill(0); // last topic byte
    assert_eq!(decode(&rec, h.physical_offset), Err(RecordError::MalformedTopic));
}
