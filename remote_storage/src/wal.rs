//! Offloaded WAL: where the safekeepers put completed segments in object
//! storage and the metadata object beside each (`docs/safekeeper.md`, "WAL
//! in object storage"). The safekeepers write it; the pageserver, peer
//! safekeepers and `strata wal restore` read it, each through
//! [`fetch_segment`], which checks a segment against its metadata.
//!
//! The segment being written is offloaded too, as a partial segment (its
//! committed prefix) once committed WAL has waited a configured time on
//! the safekeepers' disks only; it is replaced as it grows, and removed
//! once the whole segment is offloaded.

use strata_formats::wal::segment::SegmentName;
use strata_formats::Lsn;
use strata_protocol::{NodeId, TenantId, TimelineId};

use crate::{RemoteError, RemoteStorage};

/// Version of the metadata object format.
pub const FORMAT_VERSION: u32 = 1;
/// PostgreSQL timeline id of the segments (as on the safekeepers' disks).
pub const PG_TIMELINE: u32 = 1;

/// The object-name prefix of a timeline's WAL.
pub fn timeline_prefix(tenant: TenantId, timeline: TimelineId) -> String {
    format!("wal/{tenant}/{timeline}")
}

/// The object name of a segment (its PostgreSQL file name under the prefix).
pub fn segment_key(tenant: TenantId, timeline: TimelineId, segno: u64, segment_size: u64) -> String {
    let name = SegmentName { timeline: PG_TIMELINE, segment_number: segno }.file_name(segment_size);
    format!("{}/{name}", timeline_prefix(tenant, timeline))
}

/// The object name of a segment's metadata.
pub fn meta_key(tenant: TenantId, timeline: TimelineId, segno: u64, segment_size: u64) -> String {
    format!("{}.json", segment_key(tenant, timeline, segno, segment_size))
}

/// The object name of a partial segment: the committed prefix of a segment not yet complete.
pub fn partial_key(tenant: TenantId, timeline: TimelineId, segno: u64, segment_size: u64) -> String {
    format!("{}.partial", segment_key(tenant, timeline, segno, segment_size))
}

/// The object name of a partial segment's metadata.
pub fn partial_meta_key(tenant: TenantId, timeline: TimelineId, segno: u64, segment_size: u64) -> String {
    format!("{}.json", partial_key(tenant, timeline, segno, segment_size))
}

/// The metadata object of an offloaded segment (format version 1).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SegmentMeta {
    pub format_version: u32,
    pub segment_size: u64,
    /// The object covers `[start_lsn, end_lsn)`: a whole segment, or the
    /// committed prefix of one (`partial`).
    pub start_lsn: Lsn,
    pub end_lsn: Lsn,
    /// CRC-32C of the segment object's bytes.
    pub crc32c: u32,
    /// Set on the timeline's first segment when the timeline starts inside
    /// it: the WAL begins here (before it: page headers only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_start_lsn: Option<Lsn>,
    /// The safekeeper that uploaded it.
    pub uploaded_by: NodeId,
    /// A partial segment: `end_lsn` is where its committed WAL ends.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub partial: bool,
}

impl SegmentMeta {
    /// Decodes and checks a metadata object.
    pub fn decode(bytes: &[u8]) -> Result<SegmentMeta, String> {
        let m: SegmentMeta = serde_json::from_slice(bytes).map_err(|e| format!("malformed segment metadata: {e}"))?;
        if m.format_version != FORMAT_VERSION {
            return Err(format!(
                "segment metadata format version {}, this build reads {FORMAT_VERSION}",
                m.format_version
            ));
        }
        let size_ok = m.segment_size.is_power_of_two() && (1 << 20..=1 << 30).contains(&m.segment_size);
        let len = m.end_lsn.0.checked_sub(m.start_lsn.0);
        let len_ok =
            if m.partial { len.is_some_and(|l| l > 0 && l < m.segment_size) } else { len == Some(m.segment_size) };
        if !size_ok || !m.start_lsn.0.is_multiple_of(m.segment_size) || !len_ok {
            return Err(format!(
                "segment metadata covers [{}, {}) with segments of {} bytes",
                m.start_lsn, m.end_lsn, m.segment_size
            ));
        }
        if m.wal_start_lsn.is_some_and(|s| s < m.start_lsn || s >= m.end_lsn) {
            return Err(format!("segment metadata puts the WAL start outside [{}, {})", m.start_lsn, m.end_lsn));
        }
        Ok(m)
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).expect("plain data serializes")
    }
}

/// Why an offloaded segment could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error(transparent)]
    Remote(#[from] RemoteError),
    /// The object and its metadata disagree, or the metadata is malformed:
    /// a damaged archive, never to be used.
    #[error("{key}: {message}")]
    Damaged { key: String, message: String },
}

/// Segment `segno` of a timeline and its metadata, checked against each
/// other (size, range, CRC-32C); `None` when it was not offloaded (its
/// metadata object, written last, is absent).
pub async fn fetch_segment(
    storage: &RemoteStorage,
    tenant: TenantId,
    timeline: TimelineId,
    segno: u64,
    segment_size: u64,
) -> Result<Option<(SegmentMeta, Vec<u8>)>, FetchError> {
    let keys = (meta_key(tenant, timeline, segno, segment_size), segment_key(tenant, timeline, segno, segment_size));
    fetch_checked(storage, keys, segno, segment_size, false).await
}

/// The partial segment `segno` (the committed prefix of a segment that was
/// not complete when it was offloaded) and its metadata, checked; `None`
/// when there is none. A partial segment is replaced as it grows: a
/// metadata object and a segment object of two different rounds disagree,
/// so a mismatch is read again a few times before it counts as damage.
pub async fn fetch_partial_segment(
    storage: &RemoteStorage,
    tenant: TenantId,
    timeline: TimelineId,
    segno: u64,
    segment_size: u64,
) -> Result<Option<(SegmentMeta, Vec<u8>)>, FetchError> {
    let mut attempts = 0;
    loop {
        let keys = (
            partial_meta_key(tenant, timeline, segno, segment_size),
            partial_key(tenant, timeline, segno, segment_size),
        );
        match fetch_checked(storage, keys, segno, segment_size, true).await {
            Err(FetchError::Damaged { .. } | FetchError::Remote(RemoteError::NotFound { .. }))
                if attempts < crate::limits::PARTIAL_FETCH_RETRIES =>
            {
                attempts += 1;
                tokio::time::sleep(crate::limits::PARTIAL_FETCH_RETRY_WAIT).await;
            }
            Err(FetchError::Remote(RemoteError::NotFound { .. })) => return Ok(None),
            other => return other,
        }
    }
}

async fn fetch_checked(
    storage: &RemoteStorage,
    (mkey, key): (String, String),
    segno: u64,
    segment_size: u64,
    partial: bool,
) -> Result<Option<(SegmentMeta, Vec<u8>)>, FetchError> {
    let meta = match storage.get(&mkey).await {
        Ok(m) => SegmentMeta::decode(&m).map_err(|message| FetchError::Damaged { key: mkey.clone(), message })?,
        Err(RemoteError::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let damaged = |message: String| FetchError::Damaged { key: key.clone(), message };
    if meta.segment_size != segment_size
        || meta.start_lsn.0 != segno.saturating_mul(segment_size)
        || meta.partial != partial
    {
        return Err(damaged(format!(
            "metadata for [{}, {}) in segments of {}{}, expected {}segment {segno} of {segment_size} bytes",
            meta.start_lsn,
            meta.end_lsn,
            meta.segment_size,
            if meta.partial { " (partial)" } else { "" },
            if partial { "partial " } else { "" },
        )));
    }
    let bytes = storage.get(&key).await?.to_vec();
    let want = meta.end_lsn.0 - meta.start_lsn.0;
    if bytes.len() as u64 != want {
        return Err(damaged(format!("{} bytes, expected {want}", bytes.len())));
    }
    if crc32c::crc32c(&bytes) != meta.crc32c {
        return Err(damaged("CRC-32C mismatch with its metadata".into()));
    }
    Ok(Some((meta, bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn meta() -> SegmentMeta {
        SegmentMeta {
            format_version: 1,
            segment_size: 16 << 20,
            start_lsn: Lsn(0x0100_0000),
            end_lsn: Lsn(0x0200_0000),
            crc32c: 0xDEAD_BEEF,
            wal_start_lsn: None,
            uploaded_by: NodeId(2),
            partial: false,
        }
    }

    #[test]
    fn segment_metadata_round_trips_and_bad_ranges_are_refused() {
        let m = meta();
        assert_eq!(SegmentMeta::decode(&m.encode()).unwrap(), m);
        for bad in [
            SegmentMeta { format_version: 2, ..m.clone() },
            SegmentMeta { end_lsn: Lsn(0x0300_0000), ..m.clone() },
            SegmentMeta { start_lsn: Lsn(0x0100_0001), end_lsn: Lsn(0x0200_0001), ..m.clone() },
            SegmentMeta { segment_size: 3 << 20, ..m.clone() },
            SegmentMeta { wal_start_lsn: Some(Lsn(0x0200_0000)), ..m.clone() },
            // A partial segment is shorter than a segment and not empty.
            SegmentMeta { partial: true, ..m.clone() },
            SegmentMeta { partial: true, end_lsn: m.start_lsn, ..m.clone() },
        ] {
            assert!(SegmentMeta::decode(&bad.encode()).is_err(), "{bad:?}");
        }
        assert!(SegmentMeta::decode(b"{}").is_err());
        let partial = SegmentMeta { partial: true, end_lsn: Lsn(0x0100_2000), ..m.clone() };
        assert_eq!(SegmentMeta::decode(&partial.encode()).unwrap(), partial);
        assert!(!String::from_utf8(m.encode()).unwrap().contains("partial"), "a whole segment's metadata is as before");
        assert_eq!(
            segment_key(TenantId([1; 16]), TimelineId([2; 16]), 2, 16 << 20),
            "wal/01010101010101010101010101010101/02020202020202020202020202020202/000000010000000000000002"
        );
    }

    #[tokio::test]
    async fn fetch_checks_the_segment_against_its_metadata() {
        let dir = std::env::temp_dir().join(format!("strata-wal-fetch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let storage = RemoteStorage::new(&crate::RemoteStorageConfig::Local { path: dir.clone() }).unwrap();
        let (t, l, size) = (TenantId([1; 16]), TimelineId([2; 16]), 1u64 << 20);
        assert!(fetch_segment(&storage, t, l, 1, size).await.unwrap().is_none(), "absent");

        let bytes = vec![7u8; size as usize];
        let m = SegmentMeta {
            segment_size: size,
            start_lsn: Lsn(size),
            end_lsn: Lsn(2 * size),
            crc32c: crc32c::crc32c(&bytes),
            ..meta()
        };
        storage.put(&segment_key(t, l, 1, size), Bytes::from(bytes.clone())).await.unwrap();
        storage.put(&meta_key(t, l, 1, size), Bytes::from(m.encode())).await.unwrap();
        let (got, data) = fetch_segment(&storage, t, l, 1, size).await.unwrap().expect("present");
        assert_eq!((got, data), (m.clone(), bytes.clone()));

        // A flipped byte, a short object, metadata of another segment: damaged, never used.
        let mut flipped = bytes.clone();
        flipped[100] ^= 1;
        storage.put(&segment_key(t, l, 1, size), Bytes::from(flipped)).await.unwrap();
        assert!(matches!(fetch_segment(&storage, t, l, 1, size).await, Err(FetchError::Damaged { .. })));
        storage.put(&segment_key(t, l, 1, size), Bytes::from(bytes[..1000].to_vec())).await.unwrap();
        assert!(matches!(fetch_segment(&storage, t, l, 1, size).await, Err(FetchError::Damaged { .. })));
        storage.put(&meta_key(t, l, 2, size), Bytes::from(m.encode())).await.unwrap();
        assert!(matches!(fetch_segment(&storage, t, l, 2, size).await, Err(FetchError::Damaged { .. })));

        // A partial segment: its committed prefix, found only as partial.
        assert!(fetch_partial_segment(&storage, t, l, 1, size).await.unwrap().is_none());
        let prefix = bytes[..5000].to_vec();
        let pm = SegmentMeta { partial: true, end_lsn: Lsn(size + 5000), crc32c: crc32c::crc32c(&prefix), ..m.clone() };
        storage.put(&partial_key(t, l, 1, size), Bytes::from(prefix.clone())).await.unwrap();
        storage.put(&partial_meta_key(t, l, 1, size), Bytes::from(pm.encode())).await.unwrap();
        assert_eq!(fetch_partial_segment(&storage, t, l, 1, size).await.unwrap(), Some((pm.clone(), prefix)));
        // Its metadata under a whole segment's name is refused.
        storage.put(&meta_key(t, l, 3, size), Bytes::from(pm.encode())).await.unwrap();
        assert!(matches!(fetch_segment(&storage, t, l, 3, size).await, Err(FetchError::Damaged { .. })));
        // Metadata of a newer round than the object (a replacement under way), for good: damaged.
        let newer = SegmentMeta { end_lsn: Lsn(size + 6000), ..pm.clone() };
        storage.put(&partial_meta_key(t, l, 1, size), Bytes::from(newer.encode())).await.unwrap();
        assert!(matches!(fetch_partial_segment(&storage, t, l, 1, size).await, Err(FetchError::Damaged { .. })));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
