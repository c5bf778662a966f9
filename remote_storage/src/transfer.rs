//! What a transfer between a local file and the store wrote: its size and
//! the CRC-32C of its bytes, computed on the way.

/// A file uploaded by [`RemoteStorage::upload_file`]: its size and the
/// CRC-32C of its bytes (computed while they are copied, not read again).
///
/// [`RemoteStorage::upload_file`]: crate::RemoteStorage::upload_file
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Uploaded {
    /// Bytes uploaded.
    pub size: u64,
    /// CRC-32C of those bytes.
    pub crc32c: u32,
}

/// What [`RemoteStorage::download_file`] wrote.
///
/// [`RemoteStorage::download_file`]: crate::RemoteStorage::download_file
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Downloaded {
    /// Bytes written to the local file.
    pub size: u64,
    /// CRC-32C of those bytes.
    pub crc32c: u32,
}
