//! Decompression of the zstd frames a layer file stores (values, value
//! groups, index blocks), with one decompression context per thread:
//! creating one per value costs more than decompressing a page.

thread_local! {
    static DECOMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { std::cell::RefCell::new(None) };
}

/// Decompresses one zstd frame that states its size, refusing one larger
/// than `max` (or, with `exact`, of any other size).
pub(super) fn decompress(data: &[u8], max: usize, exact: bool) -> std::io::Result<Vec<u8>> {
    DECOMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(zstd::bulk::Decompressor::new()?);
        }
        // The frame states its size (the writer compresses whole values); an
        // output buffer of exactly that size avoids a huge allocation per value.
        let size = match zstd::zstd_safe::get_frame_content_size(data) {
            Ok(Some(n)) if n <= max as u64 && (!exact || n == max as u64) => n as usize,
            Ok(Some(n)) => {
                return Err(std::io::Error::other(format!("zstd frame of {n} bytes, expected at most {max}")))
            }
            _ => return Err(std::io::Error::other("zstd frame without a valid content size")),
        };
        let out = slot.as_mut().expect("set above").decompress(data, size)?;
        if out.len() != size {
            return Err(std::io::Error::other("zstd frame shorter than it states"));
        }
        Ok(out)
    })
}
