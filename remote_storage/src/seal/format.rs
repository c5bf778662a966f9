//! The sealed object format, version 1 (`docs/sealed-objects.md`): a
//! header, then the content in chunks, each sealed with AES-256-GCM under a
//! key derived for this object alone.
//!
//! Both directions stream: [`ObjectSealer`] and [`ObjectOpener`] hold one
//! chunk at a time, whatever the object's size. The opener hands out a
//! chunk's bytes only once that chunk is authenticated, and the object is
//! whole only once [`ObjectOpener::finish`] accepts its final chunk.

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use aws_lc_rs::hkdf::{Salt, HKDF_SHA256};

use super::keys::DataKey;
use super::SealError;

/// The first bytes of every sealed object.
pub const MAGIC: [u8; 8] = *b"STRATA-E";
/// The format version this build writes and reads.
pub const VERSION: u16 = 1;
/// Bytes of the header: magic, version, flags, chunk size, data key id, salt.
pub const HEADER_LEN: usize = 8 + 2 + 2 + 4 + 4 + SALT_LEN;
/// Random bytes per object from which its own key is derived.
pub const SALT_LEN: usize = 32;
/// The authentication tag after each chunk.
pub const TAG_LEN: usize = 16;
/// Content bytes per chunk written by this build: a chunk is what a reader
/// holds in memory at once.
pub const CHUNK_SIZE: usize = 1 << 20;
/// Smallest and largest chunk size a reader accepts (powers of two): the
/// largest bounds a reader's memory whatever the header claims.
pub const CHUNK_SIZE_RANGE: (usize, usize) = (16, 1 << 20);
/// HKDF info of an object's key: binds the derivation to this format.
const OBJECT_KEY_INFO: &[u8] = b"strata sealed object v1";

/// The parsed header of a sealed object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// Content bytes per chunk (the final chunk holds fewer).
    pub chunk_size: usize,
    /// Which of the tenant's data keys sealed it.
    pub key_id: u32,
    /// This object's random salt.
    pub salt: [u8; SALT_LEN],
}

impl Header {
    /// The header's bytes, as written at the start of the object.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[..8].copy_from_slice(&MAGIC);
        h[8..10].copy_from_slice(&VERSION.to_le_bytes());
        // h[10..12]: flags, none defined in version 1.
        h[12..16].copy_from_slice(&(self.chunk_size as u32).to_le_bytes());
        h[16..20].copy_from_slice(&self.key_id.to_le_bytes());
        h[20..].copy_from_slice(&self.salt);
        h
    }

    /// Parses the first [`HEADER_LEN`] bytes of an object; anything that
    /// is not a version 1 header is refused.
    pub fn decode(bytes: &[u8]) -> Result<Header, SealError> {
        if bytes.len() < HEADER_LEN {
            let n = bytes.len().min(MAGIC.len());
            return Err(if bytes[..n] == MAGIC[..n] { SealError::Truncated } else { SealError::NotSealed });
        }
        if bytes[..8] != MAGIC {
            return Err(SealError::NotSealed);
        }
        let u16_at = |i: usize| u16::from_le_bytes([bytes[i], bytes[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        let version = u16_at(8);
        if version != VERSION {
            return Err(SealError::Header(format!("format version {version}, this build reads {VERSION}")));
        }
        let flags = u16_at(10);
        if flags != 0 {
            return Err(SealError::Header(format!("unknown flags {flags:#06x}")));
        }
        let chunk_size = u32_at(12) as usize;
        let (min, max) = CHUNK_SIZE_RANGE;
        if !chunk_size.is_power_of_two() || !(min..=max).contains(&chunk_size) {
            return Err(SealError::Header(format!(
                "chunk size {chunk_size}, expected a power of two in [{min}, {max}]"
            )));
        }
        let mut salt = [0u8; SALT_LEN];
        salt.copy_from_slice(&bytes[20..HEADER_LEN]);
        Ok(Header { chunk_size, key_id: u32_at(16), salt })
    }
}

/// The AES-256-GCM key of one object: HKDF-SHA256 of the data key with the
/// object's salt, so no two objects share a key and chunk nonces can count.
fn object_key(data_key: &DataKey, salt: &[u8; SALT_LEN]) -> LessSafeKey {
    let prk = Salt::new(HKDF_SHA256, salt).extract(data_key.bytes());
    let okm = prk.expand(&[OBJECT_KEY_INFO], &AES_256_GCM).expect("32 bytes are within HKDF-SHA256's output limit");
    LessSafeKey::new(UnboundKey::from(okm))
}

/// Chunk `index`'s nonce: 4 zero bytes, then the index (big-endian).
fn nonce(index: u64) -> Nonce {
    let mut n = [0u8; NONCE_LEN];
    n[4..].copy_from_slice(&index.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

/// What a chunk is authenticated with besides its bytes: the header, whether
/// it is the final chunk, and the object's name (so a chunk cannot move to
/// another object, and an object not to another name).
fn aad(header: &[u8; HEADER_LEN], last: bool, name: &str) -> Vec<u8> {
    let mut a = Vec::with_capacity(HEADER_LEN + 1 + name.len());
    a.extend_from_slice(header);
    a.push(u8::from(last));
    a.extend_from_slice(name.as_bytes());
    a
}

/// Seals content into a sealed object, a chunk at a time.
pub struct ObjectSealer {
    key: LessSafeKey,
    header: [u8; HEADER_LEN],
    name: String,
    chunk_size: usize,
    index: u64,
    /// Content of the chunk being filled.
    pending: Vec<u8>,
}

impl ObjectSealer {
    /// A sealer for the object `name` under data key `key_id`, with a
    /// fresh random salt; [`ObjectSealer::header`] comes first.
    pub fn new(data_key: &DataKey, key_id: u32, name: &str) -> ObjectSealer {
        let mut salt = [0u8; SALT_LEN];
        aws_lc_rs::rand::fill(&mut salt).expect("the system's random source works");
        ObjectSealer::with_salt(data_key, Header { chunk_size: CHUNK_SIZE, key_id, salt }, name)
    }

    /// A sealer with the given header (the test vectors fix the salt and
    /// a small chunk size).
    pub fn with_salt(data_key: &DataKey, header: Header, name: &str) -> ObjectSealer {
        ObjectSealer {
            key: object_key(data_key, &header.salt),
            chunk_size: header.chunk_size,
            header: header.encode(),
            name: name.to_string(),
            index: 0,
            pending: Vec::with_capacity(header.chunk_size.min(CHUNK_SIZE)),
        }
    }

    /// The header bytes, to be written before any chunk.
    pub fn header(&self) -> &[u8] {
        &self.header
    }

    /// Takes `data`, appending to `out` every chunk it completes.
    pub fn push(&mut self, mut data: &[u8], out: &mut Vec<u8>) {
        while !data.is_empty() {
            if self.pending.is_empty() && data.len() >= self.chunk_size {
                // A whole chunk of the caller's bytes: sealed where it is
                // appended, not copied through `pending` first.
                let (chunk, rest) = data.split_at(self.chunk_size);
                self.seal_chunk(chunk, false, out);
                data = rest;
                continue;
            }
            let take = (self.chunk_size - self.pending.len()).min(data.len());
            self.pending.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.pending.len() == self.chunk_size {
                self.seal_pending(false, out);
            }
        }
    }

    /// Appends the final chunk (shorter than a chunk, possibly empty) to `out`.
    pub fn finish(mut self, out: &mut Vec<u8>) {
        self.seal_pending(true, out);
    }

    fn seal_pending(&mut self, last: bool, out: &mut Vec<u8>) {
        let pending = std::mem::take(&mut self.pending);
        self.seal_chunk(&pending, last, out);
        self.pending = pending;
        self.pending.clear();
    }

    /// Appends chunk `self.index` (`content`, sealed) to `out`.
    fn seal_chunk(&mut self, content: &[u8], last: bool, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(content);
        let aad = aad(&self.header, last, &self.name);
        let tag = self
            .key
            .seal_in_place_separate_tag(nonce(self.index), Aad::from(&aad[..]), &mut out[start..])
            .expect("a chunk is far below AES-GCM's length limit");
        out.extend_from_slice(tag.as_ref());
        self.index += 1;
    }
}

/// Opens a sealed object a chunk at a time, once its header is read.
pub struct ObjectOpener {
    key: LessSafeKey,
    header: [u8; HEADER_LEN],
    name: String,
    chunk_size: usize,
    index: u64,
    /// Sealed bytes of the chunk being received.
    pending: Vec<u8>,
}

impl ObjectOpener {
    /// An opener of the object `name` whose header is `header`, sealed with
    /// `data_key` (the one the header's key id names).
    pub fn new(data_key: &DataKey, header: &Header, name: &str) -> ObjectOpener {
        ObjectOpener {
            key: object_key(data_key, &header.salt),
            header: header.encode(),
            name: name.to_string(),
            chunk_size: header.chunk_size,
            index: 0,
            pending: Vec::with_capacity(header.chunk_size + TAG_LEN),
        }
    }

    /// Takes sealed bytes (after the header), appending the content of every
    /// chunk they complete, once authenticated, to `out`. A full-size
    /// chunk is never the final one (see the format).
    pub fn push(&mut self, mut data: &[u8], out: &mut Vec<u8>) -> Result<(), SealError> {
        let full = self.chunk_size + TAG_LEN;
        while !data.is_empty() {
            let take = (full - self.pending.len()).min(data.len());
            self.pending.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.pending.len() == full {
                self.open_pending(false, out)?;
            }
        }
        Ok(())
    }

    /// Opens the final chunk: an object that ends on a full chunk (or
    /// before a whole tag) was cut short.
    pub fn finish(mut self, out: &mut Vec<u8>) -> Result<(), SealError> {
        if self.pending.len() < TAG_LEN {
            return Err(SealError::Truncated);
        }
        self.open_pending(true, out)
    }

    fn open_pending(&mut self, last: bool, out: &mut Vec<u8>) -> Result<(), SealError> {
        let aad = aad(&self.header, last, &self.name);
        let index = self.index;
        let content = self
            .key
            .open_in_place(nonce(index), Aad::from(&aad[..]), &mut self.pending)
            .map_err(|_| SealError::Authentication { chunk: index })?;
        out.extend_from_slice(content);
        self.pending.clear();
        self.index += 1;
        Ok(())
    }
}

/// Seals `content` whole as the object `name`.
pub fn seal(data_key: &DataKey, key_id: u32, name: &str, content: &[u8]) -> Vec<u8> {
    seal_with(ObjectSealer::new(data_key, key_id, name), content)
}

/// Seals `content` whole with a sealer made by the caller (the test
/// vectors fix its salt).
pub fn seal_with(mut sealer: ObjectSealer, content: &[u8]) -> Vec<u8> {
    let chunks = content.len() / sealer.chunk_size + 1;
    let mut out = Vec::with_capacity(HEADER_LEN + content.len() + chunks * TAG_LEN);
    out.extend_from_slice(sealer.header());
    sealer.push(content, &mut out);
    sealer.finish(&mut out);
    out
}

/// Opens the sealed object `name` whole; `key_for` gives the data key the
/// header names (or why there is none).
pub fn open(
    name: &str,
    sealed: &[u8],
    key_for: impl FnOnce(u32) -> Result<DataKey, SealError>,
) -> Result<Vec<u8>, SealError> {
    let header = Header::decode(sealed)?;
    let key = key_for(header.key_id)?;
    let mut opener = ObjectOpener::new(&key, &header, name);
    let body = &sealed[HEADER_LEN..];
    let mut out = Vec::with_capacity(body.len());
    opener.push(body, &mut out)?;
    opener.finish(&mut out)?;
    Ok(out)
}
