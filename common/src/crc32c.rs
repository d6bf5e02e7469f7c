//! CRC-32C (Castagnoli, the iSCSI polynomial), the one checksum rmemfs writes: a
//! page's sum on the data path, and the CRC of a volume's records and log entries and
//! of a memnode's memory-file header and books. One crate computes it (`crc-fast`,
//! with the CPU's CRC instructions, as the data path needs); the `crc32c` crate stays
//! a test oracle only.

use crc_fast::{CrcAlgorithm, Digest};

/// The CRC-32C of `bytes`.
#[inline]
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc_fast::checksum(CrcAlgorithm::Crc32Iscsi, bytes) as u32
}

/// The CRC-32C of the concatenation of `parts`, without copying them together.
#[inline]
pub fn crc32c_of(parts: &[&[u8]]) -> u32 {
    let mut d = Digest::new(CrcAlgorithm::Crc32Iscsi);
    for p in parts {
        d.update(p);
    }
    d.finalize() as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_standard_check_value() {
        // The check value of CRC-32C (RFC 3720's polynomial) over "123456789".
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(b""), 0);
    }

    proptest! {
        #[test]
        fn agrees_with_the_oracle(a: Vec<u8>, b: Vec<u8>) {
            prop_assert_eq!(crc32c(&a), ::crc32c::crc32c(&a));
            let joined = [&a[..], &b[..]].concat();
            prop_assert_eq!(crc32c_of(&[&a, &b]), ::crc32c::crc32c(&joined));
        }
    }
}
