//! The same bytes to sluice's HTTP/1.1 parser and to hyper's server: fails
//! on any disagreement about framing (see `sluice::fuzzing::h1_framing`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice::fuzzing::h1_framing(data));
