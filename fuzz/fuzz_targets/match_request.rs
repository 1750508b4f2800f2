//! Arbitrary requests against a fixed route table.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice::fuzzing::match_request(data));
