//! Framing shared by Strata's protocols: `u32 length | u8 tag | payload`,
//! little-endian fields, appended to an output buffer by a builder whose
//! length prefix is filled in when the frame is finished. Each protocol sets
//! its own limits and adds its own field helpers (`impl FrameWriter` in its
//! codec).

use strata_formats::types::{Cursor, Truncated};
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

/// The fuzz entry points' loop, one for both protocols: `reencode` runs
/// every decoder of a protocol over one frame (tag and payload) and appends
/// the encoding of whatever decoded. It runs over `data` taken as one
/// frame, then over each length-prefixed frame `split` finds in `data`.
/// What decodes must re-encode to exactly the same bytes (the encodings are
/// canonical); a difference panics, which is the finding.
pub(crate) fn fuzz_frames<E>(
    data: &[u8],
    split: impl Fn(&[u8]) -> Result<Option<(usize, &[u8])>, E>,
    reencode: impl Fn(&[u8], &mut Vec<u8>),
) {
    let check = |frame: &[u8]| {
        let mut out = Vec::new();
        reencode(frame, &mut out);
        if !out.is_empty() {
            // Tags are disjoint: at most one decoder accepts a frame.
            assert_eq!(&out[LENGTH_SIZE..], frame, "a decoded message re-encodes differently");
        }
    };
    check(data);
    let mut rest = data;
    while let Ok(Some((consumed, frame))) = split(rest) {
        assert!(consumed == LENGTH_SIZE + frame.len() && consumed <= rest.len());
        check(frame);
        rest = &rest[consumed..];
    }
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

/// A field that does not decode; each codec turns it into its own error
/// type (the variants of the same names), so both protocols share one reader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FieldError {
    Truncated { message: &'static str, field: &'static str, offset: usize, needed: usize, available: usize },
    TrailingBytes { message: &'static str, count: usize },
    InvalidBool { message: &'static str, field: &'static str, value: u8 },
    BadUtf8 { message: &'static str, field: &'static str, valid_up_to: usize },
    StringTooLong { message: &'static str, field: &'static str, len: usize },
}

/// Reads the fields of one message, naming the message and field in errors.
/// `E` is the codec's error type; protocol-specific fields are added with an
/// `impl Fields<'_, ThatError>` in the codec.
pub(crate) struct Fields<'a, E> {
    pub(crate) cur: Cursor<'a>,
    pub(crate) message: &'static str,
    max_string: usize,
    error: std::marker::PhantomData<E>,
}

impl<'a, E: From<FieldError>> Fields<'a, E> {
    pub(crate) fn truncated(&self, field: &'static str, t: Truncated) -> E {
        E::from(FieldError::Truncated {
            message: self.message,
            field,
            offset: t.offset,
            needed: t.needed,
            available: t.available,
        })
    }
    pub(crate) fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], E> {
        self.cur.take(n).map_err(|t| self.truncated(field, t))
    }
    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8, E> {
        self.cur.u8().map_err(|t| self.truncated(field, t))
    }
    pub(crate) fn u16(&mut self, field: &'static str) -> Result<u16, E> {
        self.cur.u16().map_err(|t| self.truncated(field, t))
    }
    pub(crate) fn u32(&mut self, field: &'static str) -> Result<u32, E> {
        self.cur.u32().map_err(|t| self.truncated(field, t))
    }
    pub(crate) fn u64(&mut self, field: &'static str) -> Result<u64, E> {
        self.cur.u64().map_err(|t| self.truncated(field, t))
    }
    pub(crate) fn lsn(&mut self, field: &'static str) -> Result<Lsn, E> {
        self.u64(field).map(Lsn)
    }
    pub(crate) fn bool(&mut self, field: &'static str) -> Result<bool, E> {
        match self.u8(field)? {
            0 => Ok(false),
            1 => Ok(true),
            value => Err(E::from(FieldError::InvalidBool { message: self.message, field, value })),
        }
    }
    pub(crate) fn id16(&mut self, field: &'static str) -> Result<[u8; 16], E> {
        let mut id = [0u8; 16];
        id.copy_from_slice(self.take(16, field)?);
        Ok(id)
    }
    /// A `u32` length and that many bytes of UTF-8, at most the protocol's string limit.
    pub(crate) fn string(&mut self, field: &'static str) -> Result<String, E> {
        let len = self.u32(field)? as usize;
        if len > self.max_string {
            return Err(E::from(FieldError::StringTooLong { message: self.message, field, len }));
        }
        let bytes = self.take(len, field)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => Err(E::from(FieldError::BadUtf8 { message: self.message, field, valid_up_to: e.valid_up_to() })),
        }
    }
    /// Everything up to the end of the frame.
    pub(crate) fn rest(&mut self, field: &'static str) -> Result<&'a [u8], E> {
        self.take(self.cur.remaining(), field)
    }
}

/// Decodes `frame` (tag and payload) as `message` with `fields`, after
/// skipping the tag, and checks that nothing follows the last field.
pub(crate) fn read_fields<'a, T, E: From<FieldError>>(
    frame: &'a [u8],
    message: &'static str,
    max_string: usize,
    fields: impl FnOnce(&mut Fields<'a, E>) -> Result<T, E>,
) -> Result<T, E> {
    let mut r: Fields<'a, E> = Fields { cur: Cursor::new(frame), message, max_string, error: std::marker::PhantomData };
    r.u8("tag")?;
    let value = fields(&mut r)?;
    match r.cur.remaining() {
        0 => Ok(value),
        count => Err(E::from(FieldError::TrailingBytes { message, count })),
    }
}
