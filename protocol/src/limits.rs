//! Every bound of the protocol crate: what grows with load or time and where
//! it stops (frame and string sizes, list lengths, buffers, pipelines and the
//! defaults that bound lag). Format constants (tags, versions, field sizes)
//! stay with their formats.
//!
//! The relations between them are checked when the crate compiles (the
//! `const _` items at the end), so that changing one bound cannot quietly
//! break another.

use strata_formats::version::BLCKSZ;

// The safekeeper protocol.

/// Largest WAL chunk carried by one `Append` or `Wal` message.
pub const MAX_WAL_CHUNK: usize = 16 << 20;
/// Largest value of a safekeeper-protocol frame's length field (tag and
/// payload): a maximal WAL chunk plus room for the fixed fields.
pub const SAFEKEEPER_MAX_FRAME_SIZE: usize = MAX_WAL_CHUNK + (64 << 10);
/// Largest string of the safekeeper protocol (error message, consumer id), in bytes.
pub const SAFEKEEPER_MAX_STRING_LEN: usize = 4096;
/// Largest number of entries in a term history.
pub const MAX_HISTORY_ENTRIES: usize = 10_000;
/// Most members in one set.
pub const MAX_MEMBERS: usize = 16;
/// Longest site name.
pub const MAX_SITE_LEN: usize = 64;
/// `max_async_lag` of a `local-quorum` placement unless told otherwise.
pub const DEFAULT_MAX_ASYNC_LAG: u64 = 128 << 20;

// Decoded WAL (`crate::decoded_wal`).

/// WAL a safekeeper decodes into one batch before it sends it (less when
/// it has caught up).
pub const DECODED_BATCH_TARGET: usize = 1 << 20;
/// Largest record sent whole in a decoded stream; a consumer that meets a
/// larger one streams raw WAL past it (`ErrorCode::RecordTooLarge`).
pub const DECODED_MAX_RECORD: usize = 8 << 20;
/// Largest batch before compression: the target, one more record, and
/// the skeletons' overhead.
pub const DECODED_MAX_BATCH: usize = DECODED_BATCH_TARGET + DECODED_MAX_RECORD + (1 << 20);
/// The zstd window of a decoded stream (128 KiB): what each consumer's
/// decoder holds, whatever its peer sends.
pub const DECODED_WINDOW_LOG: u32 = 17;
/// zstd's level 1: the stream is made once per shard on the safekeeper,
/// which also writes and fsyncs the WAL.
pub const DECODED_ZSTD_LEVEL: i32 = 1;

// The page service protocol.

/// Largest value of a page-service frame's length field (tag and payload).
/// The largest message of version 1, a full SLRU segment, needs 262 153; the
/// rest is room for later versions without letting a peer make us buffer much.
pub const PAGESERVER_MAX_FRAME_SIZE: usize = 1 << 20;
/// Largest error message of the page service, in bytes.
pub const PAGESERVER_MAX_STRING_LEN: usize = 4096;
/// Most requests a client may have sent and not yet seen answered on one
/// connection. Keeping under it guarantees that neither side can block
/// forever writing to a peer that is itself blocked writing (see the spec).
pub const MAX_PIPELINE_DEPTH: usize = 128;

// Framing of both protocols.

/// Bytes asked of the stream per read.
pub const READ_CHUNK: usize = 64 * 1024;
/// Most buffers one vectored write is given (Linux takes at most 1024).
pub const MAX_IOVECS: usize = 1024;

// Documents.

/// Largest controller state object accepted: room for
/// [`STATE_SIZED_FOR_TENANTS`] placements and every tombstone, twice over
/// (names of a dozen bytes, as clusters have, take half the room assumed).
pub const MAX_STATE_BYTES: usize = 16 << 20;
/// Tenants deleted through the controller's API whose tombstones the state
/// keeps (besides those of its config's tenants), the oldest dropped
/// first. A tombstone is needed until every pageserver that held the
/// tenant has detached it: seconds, or as long as one is down. Every
/// write of the state rewrites them all, so they are bounded: 4096 take
/// about 600 KB. A pageserver down through more deletions than that comes
/// back with the local files of tenants the state no longer names, which
/// the controller leaves alone.
pub const MAX_DELETED_TENANTS: usize = 4096;
/// The number of placed tenants the state object's size is checked for.
pub const STATE_SIZED_FOR_TENANTS: usize = 10_000;
/// Bytes of one placement in the state object at most (as written, indented:
/// a tenant id, a generation, the attached pageserver, a move and a few
/// secondaries, each name up to 64 bytes); `state_size_is_bounded` in
/// `api/controller.rs` measures it.
pub const STATE_PLACEMENT_BYTES: usize = 768;
/// Bytes of one tombstone in the state object at most (a tenant id, a
/// generation, a version).
pub const STATE_TOMBSTONE_BYTES: usize = 160;
/// Largest lazy-basebackup manifest accepted (about a million relation forks).
pub const MAX_MANIFEST_BYTES: usize = 64 << 20;

/// Bytes of a term history entry on the wire (term and LSN).
const HISTORY_ENTRY_BYTES: usize = 16;
/// Bytes of a member on the wire at most: its id, then its address and site
/// as length-prefixed strings.
const MEMBER_BYTES: usize = 8 + 2 * (4 + SAFEKEEPER_MAX_STRING_LEN);

// Every frame length fits the wire format's 32-bit length field.
const _: () = assert!(SAFEKEEPER_MAX_FRAME_SIZE <= u32::MAX as usize);
// A compressed batch (at most its input plus zstd's block overhead, under
// 1/128) and its fixed fields fit in a frame.
const _: () = assert!(DECODED_MAX_BATCH + DECODED_MAX_BATCH / 128 + 4096 <= SAFEKEEPER_MAX_FRAME_SIZE);
const _: () = assert!(PAGESERVER_MAX_FRAME_SIZE <= u32::MAX as usize);
// A maximal WAL chunk leaves room for its message's fixed fields (tag,
// LSNs, length), which take well under 256 bytes.
const _: () = assert!(MAX_WAL_CHUNK + 256 <= SAFEKEEPER_MAX_FRAME_SIZE);
// The largest message without WAL fits a frame: a full term history, two
// full member sets (a joint configuration) and a few maximal strings.
const _: () = assert!(
    MAX_HISTORY_ENTRIES * HISTORY_ENTRY_BYTES + 2 * MAX_MEMBERS * MEMBER_BYTES + 4 * (4 + SAFEKEEPER_MAX_STRING_LEN)
        <= SAFEKEEPER_MAX_FRAME_SIZE
);
// Site names travel as strings: a valid one is never cut on the wire.
const _: () = assert!(MAX_SITE_LEN <= SAFEKEEPER_MAX_STRING_LEN);
// An error message of either protocol fits its frame.
const _: () = assert!(SAFEKEEPER_MAX_STRING_LEN + 64 <= SAFEKEEPER_MAX_FRAME_SIZE);
const _: () = assert!(PAGESERVER_MAX_STRING_LEN + 64 <= PAGESERVER_MAX_FRAME_SIZE);
// A page answer (length, tag, request id, page) arrives in one read.
const _: () = assert!(4 + 1 + 8 + BLCKSZ <= READ_CHUNK);
// Linux refuses a vectored write of more buffers than IOV_MAX (1024).
const _: () = assert!(MAX_IOVECS >= 1 && MAX_IOVECS <= 1024);
// The state object holds the tenants it is sized for and every tombstone,
// with room to spare for the config's own tombstones and the pageservers'
// policies.
const _: () = assert!(
    2 * (STATE_SIZED_FOR_TENANTS * STATE_PLACEMENT_BYTES + MAX_DELETED_TENANTS * STATE_TOMBSTONE_BYTES)
        <= MAX_STATE_BYTES
);
