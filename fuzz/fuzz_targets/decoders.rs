//! Fuzz target for every decoder of untrusted bytes in `strata-formats`
//! (WAL stream, record fragments, images, pg_control, page masking).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    strata_formats::fuzz::fuzz_one(data);
});
