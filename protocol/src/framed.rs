//! Reading and writing frames (`u32 length | u8 tag | payload`) on a byte
//! stream: the one buffering loop every connection of both protocols uses,
//! with a frame size limit checked before anything is buffered and a
//! timeout on every wait.
//!
//! [`FrameReader`] serves async streams (`read_frame`, cancel-safe: bytes
//! already read stay buffered if the future is dropped) and blocking ones
//! (`read_frame_blocking`, bounded by the socket's own read timeout).
//! [`write_all`] is the matching bounded write.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::frame::{self, BadLength, LENGTH_SIZE};
use crate::limits::{MAX_IOVECS, READ_CHUNK};

/// Why no frame could be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("connection closed by the peer")]
    Closed,
    #[error("connection closed by the peer in the middle of a frame ({0} bytes buffered)")]
    ClosedMidFrame(usize),
    #[error("nothing received for {0:?}")]
    Timeout(Duration),
    #[error("sending stalled for {0:?}")]
    WriteTimeout(Duration),
    #[error("empty frame: a frame holds at least a tag")]
    Empty,
    #[error("frame of {len} bytes exceeds the maximum of {max}")]
    TooLarge { len: usize, max: usize },
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

impl FrameError {
    /// Whether the peer simply went away (closed between frames).
    pub fn is_closed(&self) -> bool {
        matches!(self, FrameError::Closed)
    }
}

/// Frames read from `io`, one buffer, frames at most `max_frame` bytes.
#[derive(Debug)]
pub struct FrameReader<R> {
    io: R,
    buf: Vec<u8>,
    /// Start of the unconsumed bytes in `buf`.
    start: usize,
    /// Where in `buf` the frame returned last lies.
    last: std::ops::Range<usize>,
    max_frame: usize,
}

impl<R> FrameReader<R> {
    /// A reader of frames of at most `max_frame` bytes (tag and payload).
    pub fn new(io: R, max_frame: usize) -> FrameReader<R> {
        Self::with_buffered(io, Vec::new(), max_frame)
    }

    /// A reader that first returns the frames in `buffered` (bytes already
    /// read from `io` by someone else).
    pub fn with_buffered(io: R, buffered: Vec<u8>, max_frame: usize) -> FrameReader<R> {
        FrameReader { io, buf: buffered, start: 0, last: 0..0, max_frame }
    }

    /// The next frame (tag and payload) if it is already buffered; never reads.
    pub fn buffered_frame(&mut self) -> Result<Option<&[u8]>, FrameError> {
        let consumed = match frame::split(&self.buf[self.start..], self.max_frame) {
            Ok(found) => found.map(|(consumed, _)| consumed),
            Err(BadLength::Empty) => return Err(FrameError::Empty),
            Err(BadLength::TooLarge(len)) => return Err(FrameError::TooLarge { len, max: self.max_frame }),
        };
        let Some(consumed) = consumed else { return Ok(None) };
        self.last = self.start + LENGTH_SIZE..self.start + consumed;
        self.start += consumed;
        debug_assert!(self.start <= self.buf.len());
        Ok(Some(&self.buf[self.last.clone()]))
    }

    /// Bytes received but not yet returned as frames.
    pub fn buffered_len(&self) -> usize {
        self.buf.len() - self.start
    }

    /// Moves the unconsumed bytes to the front and makes room for a read, so
    /// the buffer never holds more than one partial frame and one read.
    fn make_room(&mut self) {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.reserve(READ_CHUNK);
    }

    fn end_of_stream(&self) -> FrameError {
        match self.buffered_len() {
            0 => FrameError::Closed,
            n => FrameError::ClosedMidFrame(n),
        }
    }

    pub fn get_ref(&self) -> &R {
        &self.io
    }

    pub fn get_mut(&mut self) -> &mut R {
        &mut self.io
    }

    /// The stream and the bytes read from it but not yet returned.
    pub fn into_parts(self) -> (R, Vec<u8>) {
        let rest = self.buf[self.start..].to_vec();
        (self.io, rest)
    }
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// The next frame (tag and payload), waiting at most `timeout` for each
    /// read. Cancel-safe: what was read stays buffered for the next call.
    pub async fn read_frame(&mut self, timeout: Duration) -> Result<&[u8], FrameError> {
        loop {
            if self.buffered_frame()?.is_some() {
                break;
            }
            self.make_room();
            let n = tokio::time::timeout(timeout, self.io.read_buf(&mut self.buf))
                .await
                .map_err(|_| FrameError::Timeout(timeout))??;
            if n == 0 {
                return Err(self.end_of_stream());
            }
        }
        // Found above: step back over it and return it (the borrow checker
        // cannot return the first borrow from inside the loop).
        self.last_frame()
    }
}

impl<R: std::io::Read> FrameReader<R> {
    /// The next frame, reading with blocking calls (bounded by the stream's
    /// own read timeout, which must be set).
    pub fn read_frame_blocking(&mut self) -> Result<&[u8], FrameError> {
        loop {
            if self.buffered_frame()?.is_some() {
                break;
            }
            self.make_room();
            let len = self.buf.len();
            self.buf.resize(len + READ_CHUNK, 0);
            let n = match self.io.read(&mut self.buf[len..]) {
                Ok(n) => n,
                Err(e) => {
                    self.buf.truncate(len);
                    return Err(match e.kind() {
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                            FrameError::Timeout(Duration::ZERO)
                        }
                        _ => FrameError::Io(e),
                    });
                }
            };
            self.buf.truncate(len + n);
            if n == 0 {
                return Err(self.end_of_stream());
            }
        }
        self.last_frame()
    }
}

impl<R> FrameReader<R> {
    /// The frame `buffered_frame` returned last (nothing moved it since:
    /// `make_room` runs only when no whole frame is buffered).
    fn last_frame(&self) -> Result<&[u8], FrameError> {
        Ok(&self.buf[self.last.clone()])
    }
}

/// Writes all of `bytes` and flushes them (a TLS stream may hold written
/// bytes back until flushed), waiting at most `timeout` for the peer to take them.
pub async fn write_all<W: AsyncWrite + Unpin>(w: &mut W, bytes: &[u8], timeout: Duration) -> Result<(), FrameError> {
    let write = async {
        w.write_all(bytes).await?;
        w.flush().await
    };
    tokio::time::timeout(timeout, write).await.map_err(|_| FrameError::WriteTimeout(timeout))??;
    Ok(())
}

/// Writes all of `parts` one after another, as vectored writes, so that
/// bytes lying in many places reach the socket without being gathered into
/// one buffer first; waits at most `timeout` for the peer to take them.
pub async fn write_all_vectored<W: AsyncWrite + Unpin>(
    w: &mut W,
    parts: &[&[u8]],
    timeout: Duration,
) -> Result<(), FrameError> {
    let write = async {
        let mut slices: Vec<std::io::IoSlice<'_>> =
            parts.iter().filter(|p| !p.is_empty()).map(|p| std::io::IoSlice::new(p)).collect();
        let mut rest = &mut slices[..];
        while !rest.is_empty() {
            let n = w.write_vectored(&rest[..rest.len().min(MAX_IOVECS)]).await?;
            if n == 0 {
                return Err(std::io::Error::from(std::io::ErrorKind::WriteZero));
            }
            std::io::IoSlice::advance_slices(&mut rest, n);
        }
        w.flush().await
    };
    tokio::time::timeout(timeout, write).await.map_err(|_| FrameError::WriteTimeout(timeout))??;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(tag: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = ((payload.len() + 1) as u32).to_le_bytes().to_vec();
        out.push(tag);
        out.extend_from_slice(payload);
        out
    }

    #[tokio::test]
    async fn reads_frames_split_anywhere_and_batched() {
        let mut stream = Vec::new();
        for i in 0..50u8 {
            stream.extend(frame(i, &vec![i; i as usize * 100]));
        }
        // Every split point of the byte stream into two writes.
        for cut in [0, 1, 3, 4, 5, 77, stream.len() / 2, stream.len() - 1] {
            let (client, mut server) = tokio::io::duplex(1 << 20);
            let bytes = stream.clone();
            tokio::spawn(async move {
                write_all(&mut server, &bytes[..cut], Duration::from_secs(5)).await.unwrap();
                tokio::task::yield_now().await;
                write_all(&mut server, &bytes[cut..], Duration::from_secs(5)).await.unwrap();
            });
            let mut r = FrameReader::new(client, 1 << 16);
            for i in 0..50u8 {
                let f = r.read_frame(Duration::from_secs(5)).await.unwrap();
                assert_eq!(f[0], i);
                assert_eq!(f.len(), 1 + i as usize * 100);
                assert!(f[1..].iter().all(|b| *b == i));
            }
            assert!(r.read_frame(Duration::from_secs(5)).await.unwrap_err().is_closed());
        }
    }

    #[tokio::test]
    async fn limits_timeouts_and_half_frames() {
        let (client, mut server) = tokio::io::duplex(1 << 16);
        let mut r = FrameReader::new(client, 100);
        server.write_all(&frame(1, &[0; 150])).await.unwrap();
        assert!(matches!(r.read_frame(Duration::from_secs(5)).await, Err(FrameError::TooLarge { len: 151, max: 100 })));

        let (client, mut server) = tokio::io::duplex(1 << 16);
        let mut r = FrameReader::new(client, 100);
        server.write_all(&[0, 0, 0, 0]).await.unwrap();
        assert!(matches!(r.read_frame(Duration::from_secs(5)).await, Err(FrameError::Empty)));

        let (client, mut server) = tokio::io::duplex(1 << 16);
        let mut r = FrameReader::new(client, 100);
        server.write_all(&frame(7, &[1, 2, 3])[..5]).await.unwrap();
        let t = Duration::from_millis(50);
        assert!(matches!(r.read_frame(t).await, Err(FrameError::Timeout(d)) if d == t));
        // The partial frame survived the timeout; the rest completes it.
        server.write_all(&[1, 2, 3]).await.unwrap();
        assert_eq!(r.read_frame(t).await.unwrap(), &[7, 1, 2, 3]);
        server.write_all(&frame(8, &[9])[..3]).await.unwrap();
        drop(server);
        assert!(matches!(r.read_frame(t).await, Err(FrameError::ClosedMidFrame(3))));
    }

    #[tokio::test]
    async fn buffered_frames_and_leftovers() {
        let mut bytes = frame(1, b"a");
        bytes.extend(frame(2, b"bb"));
        bytes.extend(&frame(3, b"ccc")[..2]);
        let (client, _server) = tokio::io::duplex(64);
        let mut r = FrameReader::with_buffered(client, bytes, 100);
        assert_eq!(r.buffered_frame().unwrap(), Some(&b"\x01a"[..]));
        assert_eq!(r.buffered_frame().unwrap(), Some(&b"\x02bb"[..]));
        assert_eq!(r.buffered_frame().unwrap(), None);
        assert_eq!(r.buffered_len(), 2);
        let (_, rest) = r.into_parts();
        assert_eq!(rest, frame(3, b"ccc")[..2].to_vec());
    }

    #[test]
    fn blocking_reads_and_write_timeouts() {
        let mut bytes = frame(1, b"xyz");
        bytes.extend(frame(2, b""));
        let mut r = FrameReader::new(std::io::Cursor::new(bytes), 100);
        assert_eq!(r.read_frame_blocking().unwrap(), b"\x01xyz");
        assert_eq!(r.read_frame_blocking().unwrap(), b"\x02");
        assert!(r.read_frame_blocking().unwrap_err().is_closed());
    }

    #[tokio::test]
    async fn write_times_out_when_the_peer_does_not_read() {
        let (mut client, _server) = tokio::io::duplex(16);
        let err = write_all(&mut client, &[0; 1024], Duration::from_millis(50)).await.unwrap_err();
        assert!(matches!(err, FrameError::WriteTimeout(_)), "{err}");
    }

    /// Takes at most `per_call` bytes from at most `max_bufs` buffers per
    /// write, as a socket under pressure does.
    struct Trickle {
        got: Vec<u8>,
        per_call: usize,
        max_bufs: usize,
        calls: usize,
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            self.poll_write_vectored(cx, &[std::io::IoSlice::new(buf)])
        }
        fn poll_write_vectored(
            mut self: std::pin::Pin<&mut Self>,
            _cx: &mut std::task::Context<'_>,
            bufs: &[std::io::IoSlice<'_>],
        ) -> std::task::Poll<std::io::Result<usize>> {
            let mut room = self.per_call;
            let mut n = 0;
            for b in bufs.iter().take(self.max_bufs) {
                let take = b.len().min(room);
                self.got.extend_from_slice(&b[..take]);
                (room, n) = (room - take, n + take);
                if room == 0 {
                    break;
                }
            }
            self.calls += 1;
            std::task::Poll::Ready(Ok(n))
        }
        fn is_write_vectored(&self) -> bool {
            true
        }
        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn vectored_writes_send_every_part_in_order_through_partial_writes() {
        let parts: Vec<Vec<u8>> = (0..3000u32).map(|i| vec![i as u8; (i % 13) as usize]).collect();
        let refs: Vec<&[u8]> = parts.iter().map(|p| &p[..]).collect();
        let expected = parts.concat();
        for (per_call, max_bufs) in [(1, 1), (7, 3), (1000, 2000), (usize::MAX, usize::MAX)] {
            let mut w = Trickle { got: Vec::new(), per_call, max_bufs, calls: 0 };
            write_all_vectored(&mut w, &refs, Duration::from_secs(5)).await.unwrap();
            assert_eq!(w.got, expected, "per_call {per_call}, max_bufs {max_bufs}");
            // Never more than the kernel's limit of buffers in one call.
            assert!(w.calls >= refs.iter().filter(|p| !p.is_empty()).count().div_ceil(MAX_IOVECS));
        }
    }

    #[tokio::test]
    async fn a_vectored_write_times_out_when_the_peer_does_not_read() {
        let (mut client, _server) = tokio::io::duplex(16);
        let page = [0u8; 512];
        let err = write_all_vectored(&mut client, &[&page, &page], Duration::from_millis(50)).await.unwrap_err();
        assert!(matches!(err, FrameError::WriteTimeout(_)), "{err}");
    }
}
