#![no_main]
//! Any bytes handed to the spool's record decoder: never a panic, and whatever decodes re-encodes
//! to the same bytes (a record that passes its checksum is exactly what was written).

use libfuzzer_sys::fuzz_target;
use rigd::spool::record;

fuzz_target!(|data: &[u8]| {
    if let Ok(total) = record::total_len(data) {
        if let Ok(frame) = record::decode(bytes::Bytes::copy_from_slice(data)) {
            assert_eq!(record::encode(&frame), &data[..total]);
        }
    }
});
