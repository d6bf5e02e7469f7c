//! A durable volume's metadata decoders (log entries and their records, the
//! superblock, checkpoints) on arbitrary bytes, as a damaged or hostile memnode could
//! hand them to fsd at mount: an error, never a panic; and records that decode
//! encode back to the same records.
#![no_main]

use fsd::volume::format::{
    decode_checkpoint, decode_records, encode_records, scan_log, Superblock,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    if let Ok(records) = decode_records(bytes) {
        let again = decode_records(&encode_records(&records)).expect("re-encoded records decode");
        assert_eq!(again, records);
    }
    let _ = Superblock::decode(bytes);
    let generation = bytes.first().copied().unwrap_or(0) as u64;
    let _ = decode_checkpoint(bytes, generation);
    for entry in scan_log(bytes, 1).entries {
        let _ = decode_records(entry.body);
    }
});
