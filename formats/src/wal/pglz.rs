//! Decompression of PostgreSQL's built-in LZ format (`pglz`), used for
//! `wal_compression=pglz` page images and TOAST.
//!
//! The stream is a sequence of groups: one control byte whose bits (least
//! significant first) say whether each of the next eight items is a literal
//! byte (0) or a back-reference tag (1). A tag is two bytes — length-3 in the
//! low nibble of the first, a 12-bit offset in the high nibble and the second —
//! plus an extra length byte when the nibble is 15.

/// The stream is malformed or does not decode to exactly the expected size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("corrupt pglz data: {0}")]
pub struct PglzError(pub &'static str);

/// Decompresses `src` into exactly `raw_size` bytes; both the input and the
/// output must be consumed completely.
pub fn decompress(src: &[u8], raw_size: usize) -> Result<Vec<u8>, PglzError> {
    let mut out: Vec<u8> = Vec::with_capacity(raw_size);
    let mut sp = 0usize;
    while sp < src.len() && out.len() < raw_size {
        let mut control = src[sp];
        sp += 1;
        for _ in 0..8 {
            if sp >= src.len() || out.len() >= raw_size {
                break;
            }
            if control & 1 != 0 {
                if sp + 2 > src.len() {
                    return Err(PglzError("tag runs past the end of the input"));
                }
                let mut len = (src[sp] & 0x0f) as usize + 3;
                let offset = (((src[sp] & 0xf0) as usize) << 4) | src[sp + 1] as usize;
                sp += 2;
                if len == 18 {
                    let extra = *src.get(sp).ok_or(PglzError("extended length runs past the end of the input"))?;
                    len += extra as usize;
                    sp += 1;
                }
                if offset == 0 || offset > out.len() {
                    return Err(PglzError("back-reference before the start of the output"));
                }
                len = len.min(raw_size - out.len());
                // Byte by byte: a reference may overlap the bytes it produces.
                let start = out.len() - offset;
                for i in 0..len {
                    let byte = out[start + i];
                    out.push(byte);
                }
            } else {
                out.push(src[sp]);
                sp += 1;
            }
            control >>= 1;
        }
    }
    if out.len() != raw_size || sp != src.len() {
        return Err(PglzError("decoded size differs from the expected size"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_and_overlapping_reference() {
        // control 0b0000_0011? no: items are literal 'a' (bit0=0), then tag (bit1=1).
        // Tag: len-3 = 5 (len 8), offset 1 → "aaaaaaaa" after the literal.
        let src = [0b0000_0010, b'a', 0x05, 0x01];
        assert_eq!(decompress(&src, 9).unwrap(), b"aaaaaaaaa");
    }

    #[test]
    fn extended_length() {
        // literal 'x', tag with nibble 15 (len 18) + 10 extra = 28, offset 1.
        let src = [0b0000_0010, b'x', 0x0f, 0x01, 10];
        assert_eq!(decompress(&src, 29).unwrap(), vec![b'x'; 29]);
    }

    #[test]
    fn rejects_bad_input() {
        assert!(decompress(&[0b0000_0001, 0x05, 0x01], 8).is_err(), "reference with no output yet");
        assert!(decompress(&[0x00, b'a'], 2).is_err(), "too short");
        assert!(decompress(&[0x00, b'a', b'b', b'c'], 2).is_err(), "input left over");
        assert!(decompress(&[0b0000_0010, b'a', 0x0f], 20).is_err(), "truncated tag");
    }
}
