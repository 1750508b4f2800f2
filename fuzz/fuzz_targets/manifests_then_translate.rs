//! Arbitrary manifest text: load, validate, translate, serve a few lookups.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice::fuzzing::manifests_then_translate(data));
