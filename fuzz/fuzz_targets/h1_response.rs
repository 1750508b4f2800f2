//! The same bytes, as the answer to a GET and to a HEAD, to sluice's
//! HTTP/1.1 response parser and to hyper's client: fails on any
//! disagreement about framing (see `sluice::fuzzing::h1_response`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice::fuzzing::h1_response(data));
