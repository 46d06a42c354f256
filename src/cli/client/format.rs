//! Pure formatting helpers of the client output: human sizes and durations, printable bodies,
//! base64 (the proto3 JSON form of `bytes`).

/// A byte count in 1024-based units: `0 B`, `512 B`, `1.5 KiB`, `3.0 MiB`.
pub(crate) fn bytes(n: i64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n.unsigned_abs() < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v.abs() >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// A duration in milliseconds, short: `0ms`, `850ms`, `1.2s`, `3m 04s`, `2h 05m`.
pub(crate) fn millis(ms: i64) -> String {
    let ms = ms.max(0);
    match ms {
        0..=999 => format!("{ms}ms"),
        1_000..=59_999 => format!("{:.1}s", ms as f64 / 1000.0),
        60_000..=3_599_999 => format!("{}m {:02}s", ms / 60_000, ms % 60_000 / 1000),
        _ => format!("{}h {:02}m", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

/// How long before `now_ms` the Unix-ms time `then_ms` was (`never` for 0).
pub(crate) fn ago(now_ms: i64, then_ms: i64) -> String {
    if then_ms <= 0 { "never".into() } else { format!("{} ago", millis(now_ms - then_ms)) }
}

/// A rate in bytes per second (`12.0 KiB/s`).
pub(crate) fn rate(bytes_per_sec: f64) -> String {
    format!("{}/s", bytes(bytes_per_sec.round() as i64))
}

/// A body as one printable line: UTF-8 (lossy) with control characters escaped, cut after
/// `max_chars` characters with the number of bytes left out.
pub(crate) fn body_preview(body: &[u8], max_chars: usize) -> String {
    let text = String::from_utf8_lossy(body);
    let mut out = String::new();
    for (n, c) in text.chars().enumerate() {
        if n == max_chars {
            let shown: usize = text.chars().take(max_chars).map(char::len_utf8).sum();
            out.push_str(&format!("... (+{} bytes)", body.len().saturating_sub(shown)));
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Standard base64 with padding (RFC 4648), as proto3 JSON writes `bytes`.
pub fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations_read_well() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(3 << 20), "3.0 MiB");
        assert_eq!(millis(0), "0ms");
        assert_eq!(millis(850), "850ms");
        assert_eq!(millis(1_250), "1.2s");
        assert_eq!(millis(184_000), "3m 04s");
        assert_eq!(millis(7_500_000), "2h 05m");
        assert_eq!(ago(10_000, 0), "never");
        assert_eq!(ago(10_000, 9_900), "100ms ago");
        assert_eq!(rate(12_288.0), "12.0 KiB/s");
    }

    #[test]
    fn bodies_print_on_one_line() {
        assert_eq!(body_preview(b"hello", 10), "hello");
        assert_eq!(body_preview(b"a\nb", 10), "a\\nb");
        assert_eq!(body_preview(b"abcdefgh", 3), "abc... (+5 bytes)");
    }

    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (plain, enc) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), enc);
        }
    }
}
