//! A framed protocol connection: whole frames read with a timeout (and
//! those already buffered, for group commit), replies written with a
//! timeout. The buffering is the protocol crate's one frame reader.

use std::time::Duration;

use strata_service::tls::Stream;
use tokio::io::{ReadHalf, WriteHalf};

use strata_protocol::framed::{self, FrameError, FrameReader};
use strata_protocol::safekeeper::codec::{self, CodecError};

/// Why a connection ended.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("malformed frame: {0}")]
    Codec(#[from] CodecError),
    #[error("no greeting within {0:?}")]
    Handshake(Duration),
    #[error("TLS handshake: {0}")]
    Tls(std::io::Error),
    #[error("reading WAL: {0}")]
    Wal(#[from] std::io::Error),
}

impl ConnectionError {
    /// Whether the peer simply closed the connection between messages.
    pub fn is_closed(&self) -> bool {
        matches!(self, ConnectionError::Frame(e) if e.is_closed())
    }
}

/// Reader of frames of this protocol.
pub type Frames = FrameReader<ReadHalf<Stream>>;
/// The writing half of a connection.
pub type Writer = WriteHalf<Stream>;

/// Buffered reader and writer of frames.
pub struct Connection {
    reader: Frames,
    writer: Writer,
    out: Vec<u8>,
}

impl Connection {
    pub fn new(stream: Stream) -> Connection {
        let (r, w) = tokio::io::split(stream);
        Connection { reader: FrameReader::new(r, codec::MAX_FRAME_SIZE), writer: w, out: Vec::with_capacity(1 << 12) }
    }

    /// A frame (tag and payload) already buffered, without reading the socket.
    pub fn buffered_frame(&mut self) -> Result<Option<&[u8]>, ConnectionError> {
        Ok(self.reader.buffered_frame()?)
    }

    /// Reads the next frame, waiting at most `timeout` for each read.
    pub async fn read_frame(&mut self, timeout: Duration) -> Result<&[u8], ConnectionError> {
        Ok(self.reader.read_frame(timeout).await?)
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
        let result = framed::write_all(&mut self.writer, &self.out, timeout).await;
        self.out.clear();
        Ok(result?)
    }

    /// Splits into the reader of frames and the writer (consumers read
    /// feedback while WAL is sent).
    pub fn into_split(self) -> (Frames, Writer) {
        (self.reader, self.writer)
    }
}
