//! Framing shared by Strata's protocols: `u32 length | u8 tag | payload`,
//! little-endian fields, appended to an output buffer by a builder whose
//! length prefix is filled in when the frame is finished. Each protocol sets
//! its own limits and adds its own field helpers (`impl FrameWriter` in its
//! codec).

use strata_formats::Lsn;

/// Size of the length prefix.
pub const LENGTH_SIZE: usize = 4;

/// Why a length prefix is refused before its frame is buffered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BadLength {
    Empty,
    TooLarge(usize),
}

/// Finds the first frame in `buf`: `Ok(Some((consumed, frame)))` where
/// `consumed` counts the length prefix too and `frame` is the tag and payload;
/// `Ok(None)` if `buf` does not hold a whole frame yet.
pub(crate) fn split(buf: &[u8], max_frame: usize) -> Result<Option<(usize, &[u8])>, BadLength> {
    let Some(prefix) = buf.first_chunk::<LENGTH_SIZE>() else { return Ok(None) };
    let len = u32::from_le_bytes(*prefix) as usize;
    if len == 0 {
        return Err(BadLength::Empty);
    }
    if len > max_frame {
        return Err(BadLength::TooLarge(len));
    }
    Ok(buf.get(LENGTH_SIZE..LENGTH_SIZE + len).map(|frame| (LENGTH_SIZE + len, frame)))
}

/// Appends one frame to an output buffer; the length is filled in by `finish`.
pub(crate) struct FrameWriter<'a> {
    pub(crate) out: &'a mut Vec<u8>,
    start: usize,
    max_frame: usize,
    max_string: usize,
}

impl<'a> FrameWriter<'a> {
    /// Starts a frame with `tag`; `finish` panics if it exceeds `max_frame`,
    /// strings are cut at `max_string` bytes.
    pub(crate) fn begin(out: &'a mut Vec<u8>, tag: u8, max_frame: usize, max_string: usize) -> FrameWriter<'a> {
        let start = out.len();
        out.extend_from_slice(&[0; LENGTH_SIZE]);
        out.push(tag);
        FrameWriter { out, start, max_frame, max_string }
    }

    pub(crate) fn u8(&mut self, v: u8) -> &mut Self {
        self.out.push(v);
        self
    }
    pub(crate) fn u16(&mut self, v: u16) -> &mut Self {
        self.out.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn u32(&mut self, v: u32) -> &mut Self {
        self.out.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn u64(&mut self, v: u64) -> &mut Self {
        self.out.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn lsn(&mut self, v: Lsn) -> &mut Self {
        self.u64(v.0)
    }
    pub(crate) fn bool(&mut self, v: bool) -> &mut Self {
        self.u8(u8::from(v))
    }
    pub(crate) fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.out.extend_from_slice(v);
        self
    }
    /// A u32 length and the bytes; longer strings are cut at a character boundary.
    pub(crate) fn string(&mut self, s: &str) -> &mut Self {
        let mut end = s.len().min(self.max_string);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.u32(end as u32);
        self.out.extend_from_slice(&s.as_bytes()[..end]);
        self
    }
    pub(crate) fn finish(&mut self) {
        let len = self.out.len() - self.start - LENGTH_SIZE;
        assert!(len <= self.max_frame, "frame of {len} bytes exceeds the protocol limit of {}", self.max_frame);
        self.out[self.start..self.start + LENGTH_SIZE].copy_from_slice(&(len as u32).to_le_bytes());
    }
}
