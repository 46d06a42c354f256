//! Reading the PEM files of TLS (`grpc.tls-cert-file`, `grpc.tls-key-file`,
//! `slave.master-grpc-ca-file`) with errors that name the file and its key: a file that cannot
//! be read, or that holds no PEM block of the expected kind, is refused before TLS sees it.

use std::path::{Path, PathBuf};

/// What a PEM file must hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PemKind {
    /// At least one `CERTIFICATE` block.
    Certificate,
    /// A private key block (`PRIVATE KEY`, `RSA PRIVATE KEY`, `EC PRIVATE KEY`).
    PrivateKey,
}

impl PemKind {
    fn describe(self) -> &'static str {
        match self {
            PemKind::Certificate => "a PEM certificate (-----BEGIN CERTIFICATE-----)",
            PemKind::PrivateKey => "a PEM private key (-----BEGIN PRIVATE KEY-----)",
        }
    }

    fn accepts(self, label: &str) -> bool {
        match self {
            PemKind::Certificate => label == "CERTIFICATE",
            PemKind::PrivateKey => label.ends_with("PRIVATE KEY"),
        }
    }
}

/// A TLS file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PemError {
    /// The file could not be read.
    #[error("cannot read {key} {}", path.display())]
    Read {
        /// The configuration key.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file holds no usable block of the expected kind.
    #[error("{key} {}: not {}: {reason}", path.display(), kind.describe())]
    NotPem {
        /// The configuration key.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// What it should hold.
        kind: PemKind,
        /// What is wrong.
        reason: &'static str,
    },
}

/// Reads `path` (the value of `key`) and checks it holds a PEM block of `kind`.
pub(crate) fn read(key: &'static str, path: &Path, kind: PemKind) -> Result<Vec<u8>, PemError> {
    let bytes =
        std::fs::read(path).map_err(|source| PemError::Read { key, path: path.into(), source })?;
    check(&bytes, kind).map_err(|reason| PemError::NotPem {
        key,
        path: path.into(),
        kind,
        reason,
    })?;
    Ok(bytes)
}

/// Whether `bytes` hold at least one well-formed block of `kind`: `-----BEGIN L-----`, base64
/// lines, `-----END L-----`.
fn check(bytes: &[u8], kind: PemKind) -> Result<(), &'static str> {
    let text = std::str::from_utf8(bytes).map_err(|_| "the file is not text")?;
    let mut found_any = false;
    let mut lines = text.lines().map(str::trim);
    while let Some(line) = lines.next() {
        let Some(label) = line.strip_prefix("-----BEGIN ").and_then(|l| l.strip_suffix("-----"))
        else {
            continue;
        };
        found_any = true;
        let end = format!("-----END {label}-----");
        let mut body = 0usize;
        let mut closed = false;
        for l in lines.by_ref() {
            if l == end {
                closed = true;
                break;
            }
            if !l.bytes().all(|b| b.is_ascii_alphanumeric() || b"+/=".contains(&b)) {
                return Err("a block holds a line that is not base64");
            }
            body += l.len();
        }
        if !closed {
            return Err("a block has no END line");
        }
        if body == 0 {
            return Err("a block is empty");
        }
        if kind.accepts(label) {
            return Ok(());
        }
    }
    Err(if found_any { "no block of that kind" } else { "no PEM block (-----BEGIN ...)" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pem_blocks_are_checked_by_kind() {
        let cert = "junk\n-----BEGIN CERTIFICATE-----\nQUJD\nREVG\n-----END CERTIFICATE-----\n";
        let key = "-----BEGIN EC PRIVATE KEY-----\nQUJD\n-----END EC PRIVATE KEY-----\n";
        assert_eq!(check(cert.as_bytes(), PemKind::Certificate), Ok(()));
        assert_eq!(check(key.as_bytes(), PemKind::PrivateKey), Ok(()));
        assert!(check(cert.as_bytes(), PemKind::PrivateKey).is_err());
        assert!(check(b"not pem at all", PemKind::Certificate).is_err());
        assert!(check(&[0xff, 0xfe, 0x00], PemKind::Certificate).is_err());
        let unclosed = "-----BEGIN CERTIFICATE-----\nQUJD\n";
        assert!(check(unclosed.as_bytes(), PemKind::Certificate).is_err());
        let bad = "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n";
        assert!(check(bad.as_bytes(), PemKind::Certificate).is_err());
    }
}
