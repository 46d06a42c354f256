//! Human units in the configuration: byte sizes ("1GiB", "32KiB") and durations ("5s", "500ms").
//!
//! Both parse from TOML strings and from command-line values with the same code, and both
//! display in a form that parses back to the same value, so `hasync serve --print-config` and
//! `hasync config defaults` round-trip.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::time::Duration;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;

/// A size in bytes, written in configuration as `"1GiB"`, `"32KiB"`, `"4MiB"`, `"512B"` or a
/// plain integer (`1024` or `"1024"`, meaning bytes).
///
/// Units are 1024-based and case-insensitive: `B`, `KiB`, `MiB`, `GiB`, `TiB`. `KB`, `MB`, `GB`
/// and `TB` are accepted as aliases of the binary units, as RocketMQ users write them (so
/// `"1GB"` is 1073741824 bytes, not 10^9). A space between number and unit is allowed
/// (`"4 MiB"`); fractions are not. A size displays in the largest unit that divides it exactly
/// (`"1GiB"`, `"100B"`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// `n` bytes.
    pub const fn b(n: u64) -> Self {
        Self(n)
    }

    /// `n` KiB.
    pub const fn kib(n: u64) -> Self {
        Self(n * KIB)
    }

    /// `n` MiB.
    pub const fn mib(n: u64) -> Self {
        Self(n * MIB)
    }

    /// `n` GiB.
    pub const fn gib(n: u64) -> Self {
        Self(n * GIB)
    }

    /// The size in bytes.
    pub const fn bytes(self) -> u64 {
        self.0
    }
}

/// A size string that is not a number of bytes with an optional known unit.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid size {input:?}: {reason} (examples: \"1GiB\", \"32KiB\", \"512B\", \"1024\")")]
pub struct ParseSizeError {
    input: String,
    reason: &'static str,
}

impl FromStr for ByteSize {
    type Err = ParseSizeError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let fail = |reason| ParseSizeError { input: input.to_owned(), reason };
        let s = input.trim();
        let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (number, unit) = s.split_at(digits_end);
        if number.is_empty() {
            return Err(fail("expected a whole number of bytes, optionally with a unit"));
        }
        let number: u64 = number.parse().map_err(|_| fail("number too large"))?;
        let multiplier = match unit.trim_start().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "kib" | "kb" => KIB,
            "mib" | "mb" => MIB,
            "gib" | "gb" => GIB,
            "tib" | "tb" => TIB,
            _ if unit.starts_with('.') => return Err(fail("fractions are not allowed")),
            _ => return Err(fail("unknown unit; use B, KiB, MiB, GiB or TiB")),
        };
        number.checked_mul(multiplier).map(ByteSize).ok_or_else(|| fail("size too large"))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        let units = [(TIB, "TiB"), (GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")];
        for (size, name) in units {
            if n != 0 && n.is_multiple_of(size) {
                return write!(f, "{}{name}", n / size);
            }
        }
        write!(f, "{n}B")
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SizeVisitor;

        impl Visitor<'_> for SizeVisitor {
            type Value = ByteSize;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size such as \"1GiB\", \"32KiB\", \"512B\" or a number of bytes")
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom(format!("invalid size {v}: must not be negative")))
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                v.parse().map_err(E::custom)
            }
        }

        deserializer.deserialize_any(SizeVisitor)
    }
}

/// Parses a duration such as `"5s"`, `"500ms"`, `"72h"` or `"1m 30s"` (humantime syntax).
///
/// Used both for configuration values and for command-line flags.
pub fn parse_duration(input: &str) -> Result<Duration, humantime::DurationError> {
    humantime::parse_duration(input.trim())
}

/// Formats a duration as one number and the largest unit that divides it exactly: `"72h"`,
/// `"90s"`, `"500ms"`, `"0s"`. The result parses back with [`parse_duration`].
pub(crate) fn format_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    let units: [(u128, &str); 5] = [
        (3_600_000_000_000, "h"),
        (60_000_000_000, "m"),
        (1_000_000_000, "s"),
        (1_000_000, "ms"),
        (1_000, "us"),
    ];
    if nanos == 0 {
        return "0s".to_owned();
    }
    for (size, name) in units {
        if nanos.is_multiple_of(size) {
            return format!("{}{name}", nanos / size);
        }
    }
    format!("{nanos}ns")
}

/// Serde helper for `std::time::Duration` fields written as humantime strings:
/// `#[serde(with = "units::duration")]`.
pub(crate) mod duration {
    use super::*;

    /// Writes the duration as [`format_duration`] does.
    pub(crate) fn serialize<S: Serializer>(d: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&format_duration(*d))
    }

    /// Reads a humantime string such as `"5s"`; a bare number is refused because its unit
    /// would be a guess.
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Duration, D::Error> {
        struct DurationVisitor;

        impl Visitor<'_> for DurationVisitor {
            type Value = Duration;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration string such as \"5s\", \"500ms\" or \"72h\"")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Duration, E> {
                parse_duration(v).map_err(|e| {
                    E::custom(format!(
                        "invalid duration {v:?}: {e} (examples: \"5s\", \"500ms\", \"72h\")"
                    ))
                })
            }
        }

        deserializer.deserialize_str(DurationVisitor)
    }
}

/// Serde helper for an optional IP address written as a string, where `""` means none:
/// `#[serde(with = "units::optional_ip")]`.
pub(crate) mod optional_ip {
    use super::*;

    /// Writes the address, or `""` for none (TOML has no null).
    pub(crate) fn serialize<S: Serializer>(
        ip: &Option<IpAddr>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match ip {
            Some(ip) => serializer.collect_str(ip),
            None => serializer.serialize_str(""),
        }
    }

    /// Reads `""` as none, otherwise an IPv4 or IPv6 address.
    pub(crate) fn deserialize<'de, D>(deserializer: D) -> Result<Option<IpAddr>, D::Error>
    where
        D: Deserializer<'de>,
    {
        let s = String::deserialize(deserializer)?;
        let s = s.trim();
        if s.is_empty() {
            return Ok(None);
        }
        s.parse().map(Some).map_err(|_| {
            de::Error::custom(format!("invalid IP address {s:?} (examples: \"10.0.0.5\", \"::1\")"))
        })
    }
}

/// Parses a network in CIDR form (`"10.0.0.0/8"`, `"fd00::/8"`), or a bare address meaning
/// that one host (`/32` for IPv4, `/128` for IPv6).
pub(crate) fn parse_net(input: &str) -> Result<ipnet::IpNet, String> {
    let s = input.trim();
    s.parse::<ipnet::IpNet>()
        .or_else(|_| s.parse::<IpAddr>().map(ipnet::IpNet::from))
        .map_err(|_| format!("invalid network {input:?} (examples: \"10.0.0.0/8\", \"10.1.2.3\")"))
}

/// Serde helper for a list of networks, each written as [`parse_net`] reads it:
/// `#[serde(with = "units::net_list")]`.
pub(crate) mod net_list {
    use super::*;

    /// Writes each network in CIDR form.
    pub(crate) fn serialize<S: Serializer>(
        nets: &[ipnet::IpNet],
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(nets.iter().map(ToString::to_string))
    }

    /// Reads a list of CIDR networks or bare addresses.
    pub(crate) fn deserialize<'de, D>(deserializer: D) -> Result<Vec<ipnet::IpNet>, D::Error>
    where
        D: Deserializer<'de>,
    {
        let items = Vec::<String>::deserialize(deserializer)?;
        items.iter().map(|s| parse_net(s).map_err(de::Error::custom)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size(s: &str) -> u64 {
        s.parse::<ByteSize>().unwrap_or_else(|e| panic!("{s:?}: {e}")).0
    }

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(size("1GiB"), 1 << 30);
        assert_eq!(size("32KiB"), 32 * 1024);
        assert_eq!(size("4MiB"), 4 << 20);
        assert_eq!(size("2TiB"), 2 << 40);
        assert_eq!(size("512B"), 512);
        assert_eq!(size("1024"), 1024);
        assert_eq!(size("0"), 0);
    }

    #[test]
    fn sizes_accept_decimal_spellings_as_binary_aliases_any_case_and_a_space() {
        assert_eq!(size("1GB"), 1 << 30);
        assert_eq!(size("64kb"), 64 * 1024);
        assert_eq!(size("4 MiB"), 4 << 20);
        assert_eq!(size(" 1gib "), 1 << 30);
        assert_eq!(size("8mb"), 8 << 20);
        assert_eq!(size("1tb"), 1 << 40);
    }

    #[test]
    fn bad_sizes_are_refused_with_the_input_in_the_message() {
        for bad in
            ["", "GiB", "-1", "1.5GiB", "12XB", "1 G i B", "99999999999999999999", "16777216TiB"]
        {
            let err = bad.parse::<ByteSize>().expect_err(bad);
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    fn sizes_display_in_the_largest_exact_unit_and_round_trip() {
        let cases = [
            (1 << 30, "1GiB"),
            (4 << 20, "4MiB"),
            (32 * 1024, "32KiB"),
            (100, "100B"),
            (0, "0B"),
            (1536, "1536B"),
            (3 << 40, "3TiB"),
            ((1 << 30) + (1 << 20), "1025MiB"),
        ];
        for (bytes, text) in cases {
            assert_eq!(ByteSize(bytes).to_string(), text);
            assert_eq!(size(text), bytes);
        }
    }

    #[test]
    fn durations_display_in_the_largest_exact_unit_and_round_trip() {
        let cases = [
            (Duration::from_secs(5), "5s"),
            (Duration::from_millis(500), "500ms"),
            (Duration::from_secs(72 * 3600), "72h"),
            (Duration::from_secs(90), "90s"),
            (Duration::from_secs(120), "2m"),
            (Duration::ZERO, "0s"),
            (Duration::from_micros(1500), "1500us"),
            (Duration::from_nanos(7), "7ns"),
        ];
        for (d, text) in cases {
            assert_eq!(format_duration(d), text);
            assert_eq!(parse_duration(text).unwrap(), d);
        }
        assert_eq!(parse_duration("1m 30s").unwrap(), Duration::from_secs(90));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("fast").is_err());
    }

    #[test]
    fn networks_accept_cidr_and_bare_addresses() {
        assert_eq!(parse_net("10.0.0.0/8").unwrap().to_string(), "10.0.0.0/8");
        assert_eq!(parse_net("10.1.2.3").unwrap().to_string(), "10.1.2.3/32");
        assert_eq!(parse_net("::1").unwrap().to_string(), "::1/128");
        assert_eq!(parse_net("fd00::/8").unwrap().to_string(), "fd00::/8");
        assert!(parse_net("10.0.0.0/33").is_err());
        assert!(parse_net("example.com").is_err());
    }
}
