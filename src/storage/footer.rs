//! A Parquet file's footer checked before anything trusts it: the last 8 bytes give the length
//! of the metadata before them, and a reader allocates that much. A file (or a server) claiming
//! more than the file holds, or more than `batchinfer.max_footer_bytes`, is one error naming it,
//! never an allocation of gigabytes or a panic in the decoder (parquet's push decoder subtracts
//! the claimed length from the file's size unchecked). The cap is the session's: each session
//! reads through stores of its own that hold it ([`super::SessionStores`]).

pub use crate::config::DEFAULT_MAX_FOOTER_BYTES;

/// Why a file's footer is not read: the file, and what its last 8 bytes claim.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FooterError {
    #[error("{file} is not a Parquet file (it does not end in PAR1)")]
    NotParquet { file: String },
    #[error(
        "{file} is not a Parquet file, or is cut short: its footer claims {length} bytes of \
         metadata and the file has {size} bytes"
    )]
    CutShort {
        file: String,
        length: u64,
        size: u64,
    },
    #[error(
        "{file}: its footer claims {length} bytes of metadata, more than \
         batchinfer.max_footer_bytes ({cap}); SET batchinfer.max_footer_bytes to a larger size \
         to read it"
    )]
    OverCap { file: String, length: u64, cap: u64 },
}

/// Whether `tail`, the last bytes of a file, ends as a Parquet file does (`PAR1`, or `PARE`
/// for encrypted footers).
pub fn is_parquet_tail(tail: &[u8]) -> bool {
    tail.len() >= 8 && matches!(&tail[tail.len() - 4..], b"PAR1" | b"PARE")
}

/// The length of the metadata that `tail` (the last 8 bytes of `what`, `size` bytes in all)
/// claims, checked against the file's size and `cap` (`batchinfer.max_footer_bytes`); the error
/// names the file.
pub fn metadata_len(
    what: &dyn std::fmt::Display,
    size: u64,
    tail: [u8; 8],
    cap: u64,
) -> Result<u64, FooterError> {
    let file = what.to_string();
    if !is_parquet_tail(&tail) {
        return Err(FooterError::NotParquet { file });
    }
    let length = u64::from(u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]));
    // The magic at the start, the metadata, its length and the magic at the end.
    if length + 12 > size {
        return Err(FooterError::CutShort { file, length, size });
    }
    if length > cap {
        return Err(FooterError::OverCap { file, length, cap });
    }
    Ok(length)
}

#[cfg(test)]
#[test]
fn footers_are_checked_against_the_file_and_the_cap() {
    let tail = |length: u32, magic: &[u8; 4]| {
        let mut tail = [0u8; 8];
        tail[..4].copy_from_slice(&length.to_le_bytes());
        tail[4..].copy_from_slice(magic);
        tail
    };
    let cap = DEFAULT_MAX_FOOTER_BYTES;
    assert_eq!(metadata_len(&"f", 1_000, tail(100, b"PAR1"), cap), Ok(100));
    assert!(metadata_len(&"f", 1_000, tail(100, b"PAR1"), 99).is_err());
    // `PAR1garbagePAR1`: the 15 bytes claim 1,701,273,954 bytes of metadata.
    let garbage: [u8; 8] = b"bagePAR1".to_owned();
    let e = metadata_len(&"g.parquet", 15, garbage, cap)
        .unwrap_err()
        .to_string();
    assert!(e.contains("g.parquet") && e.contains("cut short"), "{e}");
    assert!(metadata_len(&"f", 100, tail(100, b"PAR1"), cap).is_err());
    assert!(metadata_len(&"f", 1_000, tail(100, b"JUNK"), cap).is_err());
    let e = metadata_len(&"big", 8 << 30, tail(u32::MAX - 15, b"PAR1"), cap)
        .unwrap_err()
        .to_string();
    assert!(e.contains("batchinfer.max_footer_bytes"), "{e}");
}
