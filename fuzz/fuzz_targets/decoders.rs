//! Fuzz target for every decoder of untrusted bytes: WAL stream, record
//! fragments, images, pg_control, page masking (`strata-formats`), and the
//! safekeeper protocol frames (`strata-protocol`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    strata_formats::fuzz::fuzz_one(data);
    strata_protocol::safekeeper::codec::fuzz_decode(data);
});
