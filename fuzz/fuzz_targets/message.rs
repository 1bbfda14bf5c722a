//! See `memarts_fuzz::message` for what this target feeds and checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| memarts_fuzz::message::check(data));
