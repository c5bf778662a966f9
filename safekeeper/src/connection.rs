//! A framed protocol connection: reads whole frames with a timeout and
//! knows which frames are already buffered (for group commit).

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use strata_protocol::safekeeper::codec::{self, CodecError};

/// Why a connection ended.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    #[error("connection closed by peer")]
    Closed,
    #[error("no message for {0:?}")]
    Timeout(Duration),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("malformed frame: {0}")]
    Codec(#[from] CodecError),
}

/// Buffered reader/writer of frames.
pub struct Connection {
    stream: TcpStream,
    buf: Vec<u8>,
    start: usize,
    out: Vec<u8>,
}

impl Connection {
    pub fn new(stream: TcpStream) -> Connection {
        let _ = stream.set_nodelay(true);
        Connection { stream, buf: Vec::with_capacity(1 << 16), start: 0, out: Vec::with_capacity(1 << 12) }
    }

    /// A frame (tag and payload) already in the buffer, without reading the socket.
    pub fn buffered_frame(&mut self) -> Result<Option<Vec<u8>>, ConnectionError> {
        match codec::split_frame(&self.buf[self.start..])? {
            Some((consumed, frame)) => {
                let frame = frame.to_vec();
                self.start += consumed;
                if self.start == self.buf.len() {
                    self.buf.clear();
                    self.start = 0;
                }
                Ok(Some(frame))
            }
            None => Ok(None),
        }
    }

    /// Reads the next frame, waiting at most `timeout` for it to start arriving.
    pub async fn read_frame(&mut self, timeout: Duration) -> Result<Vec<u8>, ConnectionError> {
        loop {
            if let Some(frame) = self.buffered_frame()? {
                return Ok(frame);
            }
            if self.start > 0 {
                self.buf.drain(..self.start);
                self.start = 0;
            }
            let mut chunk = [0u8; 64 * 1024];
            let n = tokio::time::timeout(timeout, self.stream.read(&mut chunk))
                .await
                .map_err(|_| ConnectionError::Timeout(timeout))??;
            if n == 0 {
                return Err(ConnectionError::Closed);
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// The output buffer: encode messages into it, then `flush`.
    pub fn out(&mut self) -> &mut Vec<u8> {
        &mut self.out
    }

    /// Sends what was encoded, waiting at most `timeout`.
    pub async fn flush(&mut self, timeout: Duration) -> Result<(), ConnectionError> {
        if self.out.is_empty() {
            return Ok(());
        }
        tokio::time::timeout(timeout, self.stream.write_all(&self.out))
            .await
            .map_err(|_| ConnectionError::Timeout(timeout))??;
        self.out.clear();
        Ok(())
    }

    /// Splits into a reader of frames and the raw writer (consumers read feedback while WAL is sent).
    pub fn into_split(self) -> (FrameReader, tokio::net::tcp::OwnedWriteHalf) {
        let (r, w) = self.stream.into_split();
        (FrameReader { read: r, buf: self.buf[self.start..].to_vec() }, w)
    }
}

/// The reading half of a split connection.
pub struct FrameReader {
    read: tokio::net::tcp::OwnedReadHalf,
    buf: Vec<u8>,
}

impl FrameReader {
    pub async fn read_frame(&mut self) -> Result<Vec<u8>, ConnectionError> {
        loop {
            if let Some((consumed, frame)) = codec::split_frame(&self.buf)? {
                let frame = frame.to_vec();
                self.buf.drain(..consumed);
                return Ok(frame);
            }
            let mut chunk = [0u8; 16 * 1024];
            let n = self.read.read(&mut chunk).await?;
            if n == 0 {
                return Err(ConnectionError::Closed);
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}
