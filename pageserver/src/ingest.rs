//! WAL ingest: turns each decoded record into versions of keys.
//!
//! A block reference either carries an image (the compute runs with
//! `wal_consistency_checking` for every resource manager without native
//! redo, and full-page writes carry one too), stamped with the record's end
//! LSN as redo would, or belongs to a record the pageserver redoes natively
//! (heap, heap2, btree): then the record itself is stored for the block and
//! redone when the page is read. Once a page's records since its last image
//! would pass [`MAX_REDO_CHAIN`] records or [`MAX_CHAIN_BYTES`] bytes,
//! ingest redoes the next one itself and stores the page as an image
//! instead, so a read never applies more than that.
//! The changes PostgreSQL makes without a block reference — visibility-map
//! clearing, transaction status, multixacts, relation creation, truncation
//! and drops, databases, the relation map, two-phase state and checkpoint
//! counters — are derived from the records themselves.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bytes::Bytes;
// Ingest looks up a cached size, directory and chain for every block of
// every record; SipHash was a tenth of the ingest thread. The keys are
// relation and block numbers, bounded in count (`MAX_TRACKED_CHAINS`).
use rustc_hash::FxHashMap as HashMap;
use strata_formats::page::{checksum, is_new, set_pd_lsn};
use strata_formats::types::{BlockNumber, ForkNumber, Oid, RelFileNode};
use strata_formats::v15::checkpoint_state::CheckpointState;
use strata_formats::v15::records::slru::{ClogRecord, MultiXactRecord};
use strata_formats::v15::records::storage::{
    DbaseRecord, SmgrRecord, SMGR_TRUNCATE_FSM, SMGR_TRUNCATE_HEAP, SMGR_TRUNCATE_VM,
};
use strata_formats::v15::records::xact::{Outcome, XactRecord};
use strata_formats::v15::records::xlog::is_fpi_for_hint;
use strata_formats::v15::records::{self, gist, ParsedRecord};
use strata_formats::v15::{identify, rmgr};
use strata_formats::version::BLCKSZ;
use strata_formats::wal::record::{BlockRef, DecodedRecord};
use strata_formats::Lsn;
use strata_protocol::decoded_wal::Skeleton;
use strata_protocol::pageserver::SlruKind;
use strata_redo::{NativeRecord, HEAPBLOCKS_PER_VM_PAGE};

use crate::checkpoint_record::CheckpointRecord;
use crate::dirs;
use crate::key::{Key, RelTag};
use crate::layer::map::RecordLsns;
use crate::timeline::{ReadError, Timeline};
use crate::value::{RelDirChange, Value, WalRedo};

/// Pages per SLRU segment file.
pub const SLRU_PAGES_PER_SEGMENT: u32 = 32;

/// How long chains of stored records grow, and how many versions wait to
/// be made visible (`crate::limits`).
pub use crate::limits::{MAX_CHAIN_BYTES, MAX_PENDING_VERSIONS, MAX_REDO_CHAIN, MAX_TRACKED_CHAINS};

/// The records stored for a page since its last image: how many, and their bytes.
#[derive(Clone, Copy, Debug, Default)]
struct Chain {
    records: u32,
    bytes: usize,
}

/// A record that cannot be ingested: ingest of the timeline stops here.
#[derive(Debug, thiserror::Error)]
#[error("cannot ingest the {rmgr} {kind} record at {lsn}: {reason}")]
pub struct IngestError {
    pub lsn: Lsn,
    pub rmgr: String,
    pub kind: String,
    /// Boxed: the error is rare and the happy path should stay small.
    #[source]
    pub reason: Box<IngestFailure>,
}

/// Why a record cannot be ingested.
#[derive(Debug, thiserror::Error)]
pub enum IngestFailure {
    /// The record's body does not decode.
    #[error(transparent)]
    Parse(#[from] records::ParseError),
    /// A block reference without a full-page image, for a resource manager
    /// that has no native redo.
    #[error(
        "block {block} of {rel}{fork} changes without an image and there is no native redo for it \
         (is wal_consistency_checking set for this resource manager?)"
    )]
    NoImage { rel: RelFileNode, fork: &'static str, block: BlockNumber },
    /// A full-page image that cannot be restored.
    #[error("image of block {block} of {rel}{fork}: {source}")]
    Image {
        rel: RelFileNode,
        fork: &'static str,
        block: BlockNumber,
        #[source]
        source: ImageFailure,
    },
    /// Reading the state before the record failed.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// A block changed natively whose page does not exist.
    #[error("block {block} of {rel}{fork} is changed but does not exist (the relation has {size} blocks)")]
    NoBase { rel: RelFileNode, fork: &'static str, block: BlockNumber, size: BlockNumber },
    /// Native redo of a block failed.
    #[error("native redo of block {block} of {rel}{fork}: {source}")]
    Redo {
        rel: RelFileNode,
        fork: &'static str,
        block: BlockNumber,
        #[source]
        source: strata_redo::RedoError,
    },
}

/// What is wrong with a full-page image.
#[derive(Debug, thiserror::Error)]
pub enum ImageFailure {
    #[error(transparent)]
    Restore(#[from] strata_formats::wal::image::ImageError),
    #[error(transparent)]
    Page(#[from] strata_formats::page::PageError),
}

/// Ingest state of one timeline: the checkpoint counters and caches of the
/// directory-like values, so each record does not re-read them.
pub struct WalIngest {
    tl: Arc<Timeline>,
    checkpoint: CheckpointState,
    checksums: bool,
    db_dir: BTreeSet<(Oid, Oid)>,
    rel_dirs: HashMap<(Oid, Oid), BTreeSet<(Oid, u8)>>,
    rel_sizes: HashMap<RelTag, BlockNumber>,
    slru_dirs: HashMap<SlruKind, BTreeSet<u32>>,
    twophase: BTreeSet<u32>,
    /// Versions of whole records not yet visible, and the LSNs they reach.
    pending: Vec<(Key, Lsn, Value)>,
    pending_lsns: Option<RecordLsns>,
    // Per record:
    lsn: Lsn,
    batch: Vec<(Key, Lsn, Value)>,
    dirty_db_dir: bool,
    /// Relation directories to write whole (created, emptied or copied).
    dirty_rel_dirs: BTreeSet<(Oid, Oid)>,
    /// Entries the record added (true) to or removed (false) from
    /// relation directories, written as changes.
    rel_dir_edits: BTreeMap<(Oid, Oid), BTreeMap<(Oid, u8), bool>>,
    /// Changes written per relation directory since its last whole version
    /// (unknown, and so a whole one next, after a restart).
    rel_dir_chains: HashMap<(Oid, Oid), usize>,
    dirty_sizes: BTreeSet<RelTag>,
    dirty_slru: BTreeSet<SlruKind>,
    dirty_twophase: bool,
    /// Records stored for native redo per page since its last image.
    chains: HashMap<Key, Chain>,
    /// The last commit time written to [`Key::commit_time`].
    last_commit_time: Option<i64>,
}

/// The reason a record cannot be ingested; `ingest` wraps it into an
/// [`IngestError`] naming the record and its LSN.
type Res<T> = Result<T, IngestFailure>;

mod fsm;

impl WalIngest {
    /// Starts ingesting after the last record the timeline holds.
    pub fn new(tl: Arc<Timeline>) -> Result<WalIngest, ReadError> {
        let last = tl.record_lsns().last;
        let checkpoint = CheckpointState::new(tl.checkpoint_at(last)?);
        let checksums = tl.control_template()?.data_checksum_version != 0;
        let db_dir = tl.db_dir(last)?;
        let twophase = tl.twophase_xids(last)?;
        let last_commit_time = tl.commit_time_at(last)?;
        Ok(WalIngest {
            tl,
            checkpoint,
            checksums,
            db_dir,
            rel_dirs: HashMap::default(),
            rel_sizes: HashMap::default(),
            slru_dirs: HashMap::default(),
            twophase,
            pending: Vec::new(),
            pending_lsns: None,
            lsn: last,
            batch: Vec::new(),
            dirty_db_dir: false,
            dirty_rel_dirs: BTreeSet::new(),
            rel_dir_edits: BTreeMap::new(),
            rel_dir_chains: HashMap::default(),
            dirty_sizes: BTreeSet::new(),
            dirty_slru: BTreeSet::new(),
            dirty_twophase: false,
            chains: HashMap::default(),
            last_commit_time,
        })
    }

    /// Pages whose redo chain length is tracked now (at most
    /// [`MAX_TRACKED_CHAINS`]).
    pub fn tracked_chains(&self) -> usize {
        self.chains.len()
    }

    /// Ingests one record and makes its versions visible at its end LSN.
    pub fn ingest(&mut self, rec: &DecodedRecord) -> Result<(), IngestError> {
        let result = self.add(rec);
        self.commit();
        result
    }

    /// Ingests one record; its versions become visible with the next
    /// [`WalIngest::commit`], or earlier, before ingest reads the timeline
    /// or once [`MAX_PENDING_VERSIONS`] wait. A record that fails adds
    /// nothing; the records before it stay pending.
    pub fn add(&mut self, rec: &DecodedRecord) -> Result<(), IngestError> {
        self.add_with(rec.lsn, rec.end_lsn, |this| this.ingest_inner(rec)).map_err(|reason| IngestError {
            lsn: rec.lsn,
            rmgr: rmgr::name(rec.rmgr()).into_owned(),
            kind: identify::identify(rec.version, rec.rmgr(), rec.header.info).unwrap_or("UNKNOWN").to_string(),
            reason: Box::new(reason),
        })
    }

    /// Ingests the skeleton of a record whose blocks are all another
    /// shard's (a decoded stream, `strata_protocol::decoded_wal`): the
    /// relation sizes it implies and the transaction ids it carries, as
    /// [`WalIngest::add`] would keep of the whole record.
    pub fn add_skeleton(&mut self, s: &Skeleton) -> Result<(), IngestError> {
        self.add_with(s.lsn, s.end_lsn, |this| this.ingest_skeleton(s)).map_err(|reason| IngestError {
            lsn: s.lsn,
            rmgr: "(skeleton)".into(),
            kind: format!("{} blocks", s.blocks.len()),
            reason: Box::new(reason),
        })
    }

    /// Moves ingest past records this shard was not sent (they change
    /// nothing it keeps): the timeline reaches `end`, the last record
    /// having started at `last_record`.
    pub fn skip_to(&mut self, end: Lsn, last_record: Lsn) {
        debug_assert!(self.batch.is_empty(), "between records");
        let current = self.pending_lsns.unwrap_or_else(|| self.tl.record_lsns());
        if end > current.last {
            self.lsn = end;
            self.pending_lsns = Some(RecordLsns { last: end, prev: last_record });
        }
    }

    /// The frame of every record's ingest: `body` adds the record's
    /// versions, which become pending at `end_lsn`; a failure adds nothing.
    fn add_with(&mut self, lsn: Lsn, end_lsn: Lsn, body: impl FnOnce(&mut Self) -> Res<()>) -> Res<()> {
        debug_assert!(self.batch.is_empty(), "a record's versions outlived it");
        self.lsn = end_lsn;
        if let Err(reason) = body(self) {
            self.batch.clear();
            self.lsn = self.pending_lsns.unwrap_or_else(|| self.tl.record_lsns()).last;
            return Err(reason);
        }
        self.finish_record();
        self.pending.append(&mut self.batch);
        self.pending_lsns = Some(RecordLsns { last: end_lsn, prev: lsn });
        if self.pending.len() >= MAX_PENDING_VERSIONS {
            self.commit();
        }
        Ok(())
    }

    fn ingest_skeleton(&mut self, s: &Skeleton) -> Res<()> {
        for b in &s.blocks {
            let tag = RelTag { rel: b.rel, fork: b.fork };
            self.ensure_rel(tag)?;
            self.extend_to(tag, b.block + 1)?;
        }
        let before = self.checkpoint.checkpoint;
        self.checkpoint.observe_xids(s.xid, s.toplevel_xid);
        if self.checkpoint.checkpoint != before {
            self.put(Key::checkpoint(), Value::Image(Bytes::copy_from_slice(&self.checkpoint.checkpoint.encode())));
        }
        Ok(())
    }

    /// Makes the versions of every record added so far visible, at the end
    /// LSN of the last one.
    pub fn commit(&mut self) {
        if let Some(lsns) = self.pending_lsns.take() {
            self.tl.commit_record(std::mem::take(&mut self.pending), lsns);
        }
        debug_assert!(self.pending.is_empty());
    }

    fn ingest_inner(&mut self, rec: &DecodedRecord) -> Res<()> {
        let parsed = records::parse(rec)?;
        let gist_child = match &parsed {
            Some(ParsedRecord::GistFollowRight { block_id }) => Some(*block_id),
            _ => None,
        };
        for block in &rec.blocks {
            let (rel, fork, blkno) = (block.rel, block.fork.file_suffix(), block.block);
            let image_failure = |source: ImageFailure| IngestFailure::Image { rel, fork, block: blkno, source };
            let tag = RelTag { rel: block.rel, fork: block.fork };
            let key = Key::rel_block(tag, block.block);
            let native = strata_redo::supports(rec.rmgr(), rec.header.info);
            if !self.tl.shard.owns_block(block.rel.rel, block.fork, block.block) {
                // Another shard's block: this one keeps only the relation's
                // size, as the owner's ingest changes it below.
                if block.image.is_none() && is_fpi_for_hint(rec) {
                    continue;
                }
                self.ensure_rel(tag)?;
                self.extend_to(tag, block.block + 1)?;
                continue;
            }
            let Some(mut page) = rec.block_image(block).map_err(|e| image_failure(e.into()))? else {
                if is_fpi_for_hint(rec) {
                    self.stamp_hinted(tag, key, blkno)?;
                    continue;
                }
                if !native {
                    return Err(IngestFailure::NoImage { rel, fork, block: blkno });
                }
                self.ensure_rel(tag)?;
                self.store_redo(rec, block, tag, key)?;
                self.extend_to(tag, block.block + 1)?;
                continue;
            };
            // A full-page write is restored, not redone (its data is usually left out).
            let apply = block.image.as_ref().is_some_and(|i| i.apply());
            if native && !apply && self.tl.verify_redo {
                self.verify_block(rec, block, tag, key, &page)?;
            }
            self.chains.remove(&key);
            if !is_new(&page[..]).unwrap_or(true) {
                set_pd_lsn(&mut page[..], self.lsn.0).map_err(|e| image_failure(e.into()))?;
            }
            if gist_child == Some(block.id) {
                gist::clear_follow_right(&mut page, self.lsn);
            }
            if self.checksums && !is_new(&page[..]).unwrap_or(true) {
                checksum::set_checksum(&mut page, block.block);
            }
            self.ensure_rel(tag)?;
            self.extend_to(tag, block.block + 1)?;
            self.put(key, Value::Image(Bytes::from(page.to_vec())));
        }
        if let Some(p) = &parsed {
            self.apply_parsed(rec, p)?;
        }
        if let Some(ParsedRecord::Xlog(records::xlog::XlogRecord::Checkpoint { shutdown, checkpoint })) = &parsed {
            let at =
                CheckpointRecord { lsn: rec.lsn, end_lsn: rec.end_lsn, shutdown: *shutdown, checkpoint: *checkpoint };
            self.put(Key::checkpoint_record(), Value::Image(Bytes::copy_from_slice(&at.encode())));
        }
        let before = self.checkpoint.checkpoint;
        self.checkpoint.apply(rec, parsed.as_ref());
        if self.checkpoint.checkpoint != before {
            self.put(Key::checkpoint(), Value::Image(Bytes::copy_from_slice(&self.checkpoint.checkpoint.encode())));
        }
        Ok(())
    }

    /// A block of an `XLOG_FPI_FOR_HINT` record without an image (hint bits
    /// set with `full_page_writes` off): PostgreSQL's redo skips it, but the
    /// compute stamped the page with the record's LSN, so the page read at
    /// or after it carries that `pd_lsn` too. The hint bits themselves are
    /// not in the WAL and are never needed. Free space map blocks arrive
    /// whole, with their own `pd_lsn`, in the agent's messages
    /// (`docs/free-space-maps.md`), and a block the relation does not have
    /// (yet) has no LSN to stamp: both are left alone.
    fn stamp_hinted(&mut self, tag: RelTag, key: Key, blkno: BlockNumber) -> Res<()> {
        if tag.fork == ForkNumber::Fsm || self.rel_size(tag)?.is_none_or(|n| blkno >= n) {
            return Ok(());
        }
        // A stamp lengthens the page's chain like any stored change.
        if let Some(chain) = self.chains.get_mut(&key) {
            chain.records += 1;
        }
        self.put(key, Value::Native(NativeRecord::SetPageLsn(self.lsn.0)));
        Ok(())
    }

    fn apply_parsed(&mut self, rec: &DecodedRecord, parsed: &ParsedRecord) -> Res<()> {
        match parsed {
            ParsedRecord::VmClear(clears) => {
                let mut per_page: BTreeMap<(RelFileNode, BlockNumber), Vec<(u32, u8)>> = BTreeMap::new();
                for c in clears {
                    per_page
                        .entry((c.rel, c.heap_block / HEAPBLOCKS_PER_VM_PAGE))
                        .or_default()
                        .push((c.heap_block, c.bits));
                }
                for ((rel, vm_block), list) in per_page {
                    // From 18.6 the record references the VM page it clears
                    // bits on: that block reference (an image, or native
                    // redo of the record) is its change, not a derived one.
                    let referenced = rec
                        .blocks
                        .iter()
                        .any(|b| b.rel == rel && b.fork == ForkNumber::VisibilityMap && b.block == vm_block);
                    if referenced {
                        continue;
                    }
                    let tag = RelTag { rel, fork: ForkNumber::VisibilityMap };
                    // Bits can only be set on a VM page that exists; clearing
                    // beyond the fork changes nothing.
                    if self.rel_size(tag)?.is_some_and(|n| vm_block < n) {
                        self.put(Key::rel_block(tag, vm_block), Value::Native(NativeRecord::ClearVmBits(list)));
                    }
                }
            }
            ParsedRecord::Xact(XactRecord::Finish(f)) => {
                let xid = f.xid(rec.header.xid);
                let status = match f.outcome {
                    Outcome::Commit => strata_redo::CLOG_COMMITTED,
                    Outcome::Abort => strata_redo::CLOG_ABORTED,
                };
                let mut per_page: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
                for x in std::iter::once(xid).chain(f.subxacts.iter().copied()) {
                    per_page.entry(strata_redo::clog_page(x)).or_default().push(x);
                }
                for (page, xids) in per_page {
                    self.put(
                        Key::slru_page(SlruKind::Clog, page),
                        Value::Native(NativeRecord::ClogSetStatus { xids, status }),
                    );
                }
                for rel in &f.dropped_rels {
                    self.drop_rel(*rel)?;
                }
                if f.outcome == Outcome::Commit
                    // Every commit stamped later than all before it: the
                    // first commit after a time T is always recorded, so
                    // a branch at T is exact to the commit (docs/branches.md).
                    && self.last_commit_time.is_none_or(|t| f.xact_time > t)
                {
                    self.last_commit_time = Some(f.xact_time);
                    self.put(Key::commit_time(), Value::Image(Bytes::copy_from_slice(&f.xact_time.to_le_bytes())));
                }
                if f.prepared && self.twophase.remove(&xid) {
                    self.dirty_twophase = true;
                }
            }
            ParsedRecord::Xact(XactRecord::Prepare(p)) => {
                let data = rec.main_data();
                let mut file = Vec::with_capacity(data.len() + 4);
                file.extend_from_slice(data);
                file.extend_from_slice(&crc32c::crc32c(data).to_le_bytes());
                self.put(Key::twophase_file(p.xid), Value::Image(Bytes::from(file)));
                self.twophase.insert(p.xid);
                self.dirty_twophase = true;
            }
            ParsedRecord::Xact(_) => {}
            ParsedRecord::Clog(ClogRecord::ZeroPage { page }) => self.zero_slru_page(SlruKind::Clog, *page as u32)?,
            ParsedRecord::Clog(ClogRecord::Truncate { page, .. }) => {
                let cutoff = *page as u32 / SLRU_PAGES_PER_SEGMENT;
                self.remove_slru_segments(SlruKind::Clog, |seg| seg < cutoff)?;
            }
            ParsedRecord::MultiXact(m) => self.apply_multixact(m)?,
            ParsedRecord::Smgr(SmgrRecord::Create { rel, fork }) => {
                self.ensure_rel(RelTag { rel: *rel, fork: *fork })?
            }
            ParsedRecord::Smgr(SmgrRecord::Truncate { rel, blocks, flags }) => {
                if flags & SMGR_TRUNCATE_HEAP != 0 {
                    self.truncate(RelTag { rel: *rel, fork: ForkNumber::Main }, *blocks)?;
                }
                if flags & SMGR_TRUNCATE_VM != 0 {
                    // The VM keeps the page holding the new end's bits (its tail is cleared by an image).
                    let vm_blocks = blocks.div_ceil(HEAPBLOCKS_PER_VM_PAGE);
                    self.truncate(RelTag { rel: *rel, fork: ForkNumber::VisibilityMap }, vm_blocks)?;
                }
                if flags & SMGR_TRUNCATE_FSM != 0 {
                    // PostgreSQL's cut, which keeps the leaf of the new end
                    // (its tail slots are cleared in a page sent later).
                    let fsm_blocks = strata_protocol::fsm_pages::blocks_after_truncate(*blocks);
                    let fsm_blocks = BlockNumber::try_from(fsm_blocks).unwrap_or(BlockNumber::MAX);
                    self.truncate(RelTag { rel: *rel, fork: ForkNumber::Fsm }, fsm_blocks)?;
                }
            }
            ParsedRecord::Dbase(DbaseRecord::CreateFileCopy { db, tablespace, src_db, src_tablespace }) => {
                self.copy_database((*src_tablespace, *src_db), (*tablespace, *db))?;
            }
            ParsedRecord::Dbase(DbaseRecord::CreateWalLog { db, tablespace }) => {
                if self.db_dir.insert((*tablespace, *db)) {
                    self.dirty_db_dir = true;
                }
                self.rel_dirs.insert((*tablespace, *db), BTreeSet::new());
                self.dirty_rel_dirs.insert((*tablespace, *db));
            }
            ParsedRecord::Dbase(DbaseRecord::Drop { db, tablespaces }) => {
                for spc in tablespaces {
                    let old: Vec<(Oid, u8)> = self.rel_dir(*spc, *db)?.iter().copied().collect();
                    for (rel, fork) in old {
                        if let Some(fork) = ForkNumber::from_u8(fork) {
                            let tag = RelTag { rel: RelFileNode { spc: *spc, db: *db, rel }, fork };
                            self.tl.note_rel_size(tag, self.lsn, None);
                        }
                    }
                    if self.db_dir.remove(&(*spc, *db)) {
                        self.dirty_db_dir = true;
                    }
                    self.rel_dirs.insert((*spc, *db), BTreeSet::new());
                    self.dirty_rel_dirs.insert((*spc, *db));
                    self.rel_sizes.retain(|t, _| !(t.rel.spc == *spc && t.rel.db == *db));
                }
            }
            ParsedRecord::Tblspc(t) => {
                tracing::warn!(lsn = %rec.lsn, record = ?t, "tablespaces other than pg_default and pg_global are not served");
            }
            ParsedRecord::RelMap(u) => {
                self.put(Key::relmap(u.tablespace, u.db), Value::Image(Bytes::copy_from_slice(&u.data)));
            }
            ParsedRecord::LogicalMessage(m) => {
                // Transactional messages are not the agent's (it sends none).
                if !m.transactional && m.prefix == strata_protocol::fsm_pages::PREFIX.as_bytes() {
                    self.store_fsm_pages(&m.message)?;
                }
            }
            ParsedRecord::Xlog(_) | ParsedRecord::GistFollowRight { .. } => {}
        }
        Ok(())
    }

    fn apply_multixact(&mut self, m: &MultiXactRecord) -> Res<()> {
        match m {
            MultiXactRecord::ZeroOffsetsPage { page } => self.zero_slru_page(SlruKind::MultiXactOffsets, *page as u32),
            MultiXactRecord::ZeroMembersPage { page } => self.zero_slru_page(SlruKind::MultiXactMembers, *page as u32),
            MultiXactRecord::Create { multi, offset, members } => {
                self.put(
                    Key::slru_page(SlruKind::MultiXactOffsets, strata_redo::multixact_offsets_page(*multi)),
                    Value::Native(NativeRecord::MultiXactOffset { multi: *multi, offset: *offset }),
                );
                let mut per_page: BTreeMap<u32, Vec<(u32, u32, u8)>> = BTreeMap::new();
                for (i, m) in members.iter().enumerate() {
                    let at = offset.wrapping_add(i as u32);
                    per_page.entry(strata_redo::multixact_members_page(at)).or_default().push((
                        at,
                        m.xid,
                        m.status as u8,
                    ));
                }
                for (page, list) in per_page {
                    self.put(
                        Key::slru_page(SlruKind::MultiXactMembers, page),
                        Value::Native(NativeRecord::MultiXactMembers(list)),
                    );
                }
                Ok(())
            }
            MultiXactRecord::Truncate { start_offsets, end_offsets, start_members, end_members, .. } => {
                let seg = |page: u32| page / SLRU_PAGES_PER_SEGMENT;
                let (s, e) = (
                    seg(strata_redo::multixact_offsets_page(*start_offsets)),
                    seg(strata_redo::multixact_offsets_page(*end_offsets)),
                );
                self.remove_slru_segments(SlruKind::MultiXactOffsets, |x| in_wrapping_range(x, s, e))?;
                let (s, e) = (
                    seg(strata_redo::multixact_members_page(*start_members)),
                    seg(strata_redo::multixact_members_page(*end_members)),
                );
                self.remove_slru_segments(SlruKind::MultiXactMembers, |x| in_wrapping_range(x, s, e))
            }
        }
    }

    // ---- native redo ----

    /// Stores a natively redone block change: the record itself, or, once
    /// the page's chain would pass [`MAX_REDO_CHAIN`] records or
    /// [`MAX_CHAIN_BYTES`], the page redone here.
    fn store_redo(&mut self, rec: &DecodedRecord, block: &BlockRef, tag: RelTag, key: Key) -> Res<()> {
        let (rel, fork, blkno) = (block.rel, block.fork.file_suffix(), block.block);
        if let Some(size) = self.missing_base(block, tag)? {
            return Err(IngestFailure::NoBase { rel, fork, block: blkno, size });
        }
        let before =
            if block.will_init() { Chain::default() } else { self.chains.get(&key).copied().unwrap_or_default() };
        let chain = Chain { records: before.records + 1, bytes: before.bytes + rec.raw.len() };
        if !block.will_init() && (chain.records >= MAX_REDO_CHAIN || chain.bytes > MAX_CHAIN_BYTES) {
            let mut page = self.page_before(key)?;
            strata_redo::redo_block(rec, block.id, &mut page).map_err(|source| IngestFailure::Redo {
                rel,
                fork,
                block: blkno,
                source,
            })?;
            if self.checksums && !is_new(&page[..]).unwrap_or(true) {
                checksum::set_checksum(&mut page, blkno);
            }
            self.chains.remove(&key);
            self.tl.metrics.redo_pages_materialized.inc();
            self.put(key, Value::Image(Bytes::from(page.to_vec())));
            return Ok(());
        }
        if self.chains.len() >= MAX_TRACKED_CHAINS && !self.chains.contains_key(&key) {
            self.chains.clear();
        }
        self.chains.insert(key, chain);
        self.tl.metrics.redo_records_stored.inc();
        self.put(
            key,
            Value::Wal(WalRedo {
                block_id: block.id,
                will_init: block.will_init(),
                lsn: rec.lsn,
                end_lsn: rec.end_lsn,
                record: Bytes::copy_from_slice(&rec.raw),
            }),
        );
        Ok(())
    }

    /// The relation's size if `block` has no page for the record to change:
    /// beyond the end and not initialized by the record. A page beyond the
    /// end reads as zeros, but only the visibility map is extended that way
    /// before a record changes it (heap and index pages are initialized by
    /// the record that first uses them).
    fn missing_base(&mut self, block: &BlockRef, tag: RelTag) -> Res<Option<BlockNumber>> {
        let size = self.rel_size(tag)?.unwrap_or(0);
        let missing = !block.will_init() && block.block >= size && tag.fork != ForkNumber::VisibilityMap;
        Ok(missing.then_some(size))
    }

    /// The page as of the previous record (zeros if it has no version).
    fn page_before(&mut self, key: Key) -> Res<Box<[u8; BLCKSZ]>> {
        let mut page = Box::new([0u8; BLCKSZ]);
        let lsn = self.read_lsn();
        if let Some(b) = self.tl.get(&key, lsn)? {
            if b.len() != BLCKSZ {
                return Err(IngestFailure::Read(ReadError::Corrupt {
                    timeline: self.tl.timeline_id,
                    reason: format!("key {key}: a page of {} bytes", b.len()),
                }));
            }
            page.copy_from_slice(&b);
        }
        Ok(page)
    }

    /// The oracle at ingest: redo natively what PostgreSQL also logged an
    /// image of, and report any difference. The image is what is stored.
    fn verify_block(
        &mut self,
        rec: &DecodedRecord,
        block: &BlockRef,
        tag: RelTag,
        key: Key,
        image: &[u8; BLCKSZ],
    ) -> Res<()> {
        if self.missing_base(block, tag)?.is_some() {
            // First touch of a page never logged before (e.g. extended by a
            // bulk load): nothing to redo from.
            return Ok(());
        }
        let before = self.page_before(key)?;
        let kind = identify::identify(rec.version, rec.rmgr(), rec.header.info).unwrap_or("UNKNOWN");
        let outcome = match strata_redo::verify::check_block(rec, block.id, &before, image) {
            Ok((_, None)) => None,
            Ok((_, Some(m))) => Some(m.to_string()),
            Err(e) => Some(e.to_string()),
        };
        self.tl.metrics.redo_blocks_verified.inc();
        let mut check = self.tl.redo_check.lock();
        check.verified += 1;
        if let Some(problem) = outcome {
            self.tl.metrics.redo_mismatches.inc();
            check.mismatches += 1;
            let what = format!(
                "{} {kind} record at {} (block {} of {}{}): {problem}",
                rmgr::name(rec.rmgr()),
                rec.lsn,
                block.block,
                block.rel,
                block.fork.file_suffix()
            );
            tracing::error!(timeline = %self.tl.timeline_id, "native redo differs from PostgreSQL: {what}");
            check.last_mismatch = Some(what);
        }
        Ok(())
    }

    // ---- cached state ----

    fn put(&mut self, key: Key, value: Value) {
        self.batch.push((key, self.lsn, value));
    }

    /// The state before this record is what the timeline holds at its last
    /// LSN, once the records before it are visible: every read of the
    /// timeline during ingest goes through here.
    fn read_lsn(&mut self) -> Lsn {
        self.commit();
        self.tl.record_lsns().last
    }

    fn rel_dir(&mut self, spc: Oid, db: Oid) -> Res<&mut BTreeSet<(Oid, u8)>> {
        if !self.rel_dirs.contains_key(&(spc, db)) {
            let lsn = self.read_lsn();
            let dir = self.tl.rel_dir(spc, db, lsn)?;
            self.rel_dirs.insert((spc, db), dir);
        }
        Ok(self.rel_dirs.get_mut(&(spc, db)).expect("just inserted"))
    }

    fn rel_size(&mut self, tag: RelTag) -> Res<Option<BlockNumber>> {
        if !self.rel_dir(tag.rel.spc, tag.rel.db)?.contains(&(tag.rel.rel, tag.fork as u8)) {
            return Ok(None);
        }
        if let Some(n) = self.rel_sizes.get(&tag) {
            return Ok(Some(*n));
        }
        let lsn = self.read_lsn();
        let n = self.tl.listed_rel_size(tag, lsn)?;
        self.rel_sizes.insert(tag, n);
        Ok(Some(n))
    }

    /// Makes a relation fork exist (empty if it is new).
    fn ensure_rel(&mut self, tag: RelTag) -> Res<()> {
        let (spc, db) = (tag.rel.spc, tag.rel.db);
        if self.rel_dir(spc, db)?.insert((tag.rel.rel, tag.fork as u8)) {
            self.rel_dir_edits.entry((spc, db)).or_default().insert((tag.rel.rel, tag.fork as u8), true);
            self.rel_sizes.insert(tag, 0);
            self.dirty_sizes.insert(tag);
        }
        Ok(())
    }

    fn extend_to(&mut self, tag: RelTag, blocks: BlockNumber) -> Res<()> {
        let size = self.rel_size(tag)?.unwrap_or(0);
        if blocks > size {
            self.rel_sizes.insert(tag, blocks);
            self.dirty_sizes.insert(tag);
        }
        Ok(())
    }

    /// Shrinks a fork; the cut blocks read as zeros if the fork grows again.
    fn truncate(&mut self, tag: RelTag, blocks: BlockNumber) -> Res<()> {
        let Some(size) = self.rel_size(tag)? else { return Ok(()) };
        if blocks >= size {
            return Ok(());
        }
        for b in blocks..size {
            self.put(Key::rel_block(tag, b), Value::ZeroPage);
        }
        self.rel_sizes.insert(tag, blocks);
        self.dirty_sizes.insert(tag);
        Ok(())
    }

    fn drop_rel(&mut self, rel: RelFileNode) -> Res<()> {
        let dir = self.rel_dir(rel.spc, rel.db)?;
        let forks: Vec<u8> = dir.iter().filter(|(r, _)| *r == rel.rel).map(|(_, f)| *f).collect();
        dir.retain(|(r, _)| *r != rel.rel);
        if !forks.is_empty() {
            let edits = self.rel_dir_edits.entry((rel.spc, rel.db)).or_default();
            edits.extend(forks.iter().map(|f| ((rel.rel, *f), false)));
        }
        for fork in forks.into_iter().filter_map(ForkNumber::from_u8) {
            self.tl.note_rel_size(RelTag { rel, fork }, self.lsn, None);
        }
        self.rel_sizes.retain(|t, _| t.rel != rel);
        self.dirty_sizes.retain(|t| t.rel != rel);
        Ok(())
    }

    fn slru_dir(&mut self, kind: SlruKind) -> Res<&mut BTreeSet<u32>> {
        if !self.slru_dirs.contains_key(&kind) {
            let lsn = self.read_lsn();
            let dir = self.tl.slru_segments(kind, lsn)?;
            self.slru_dirs.insert(kind, dir);
        }
        Ok(self.slru_dirs.get_mut(&kind).expect("just inserted"))
    }

    fn zero_slru_page(&mut self, kind: SlruKind, page: u32) -> Res<()> {
        self.put(Key::slru_page(kind, page), Value::ZeroPage);
        if self.slru_dir(kind)?.insert(page / SLRU_PAGES_PER_SEGMENT) {
            self.dirty_slru.insert(kind);
        }
        Ok(())
    }

    fn remove_slru_segments(&mut self, kind: SlruKind, remove: impl Fn(u32) -> bool) -> Res<()> {
        let dir = self.slru_dir(kind)?;
        let before = dir.len();
        dir.retain(|s| !remove(*s));
        if dir.len() != before {
            self.dirty_slru.insert(kind);
        }
        Ok(())
    }

    /// CREATE DATABASE … STRATEGY FILE_COPY: every fork of the source
    /// database, and its relation map, as of this record.
    fn copy_database(&mut self, src: (Oid, Oid), dst: (Oid, Oid)) -> Res<()> {
        let lsn = self.read_lsn();
        let rels = self.rel_dir(src.0, src.1)?.clone();
        let mut new_dir = BTreeSet::new();
        for (rel, fork) in rels {
            let Some(fork_number) = ForkNumber::from_u8(fork) else { continue };
            let src_tag = RelTag { rel: RelFileNode { spc: src.0, db: src.1, rel }, fork: fork_number };
            let dst_tag = RelTag { rel: RelFileNode { spc: dst.0, db: dst.1, rel }, fork: fork_number };
            let size = self.rel_size(src_tag)?.unwrap_or(0);
            // The file node is the same in both databases, and with it the
            // shard of every block (`docs/sharding.md`): a shard copies its own.
            let shard = self.tl.shard;
            for b in (0..size).filter(|b| shard.owns_block(rel, fork_number, *b)) {
                if let Some(page) = self.tl.get(&Key::rel_block(src_tag, b), lsn)? {
                    self.put(Key::rel_block(dst_tag, b), Value::Image(page));
                }
            }
            new_dir.insert((rel, fork));
            self.rel_sizes.insert(dst_tag, size);
            self.dirty_sizes.insert(dst_tag);
        }
        self.rel_dirs.insert(dst, new_dir);
        self.dirty_rel_dirs.insert(dst);
        if let Some(map) = self.tl.get(&Key::relmap(src.0, src.1), lsn)? {
            self.put(Key::relmap(dst.0, dst.1), Value::Image(map));
        }
        if self.db_dir.insert(dst) {
            self.dirty_db_dir = true;
        }
        Ok(())
    }

    /// Writes relation directory `dir` whole.
    fn put_rel_dir(&mut self, dir: (Oid, Oid)) {
        let v = dirs::encode_rels(&self.rel_dirs[&dir]);
        self.put(Key::rel_dir(dir.0, dir.1), Value::Image(Bytes::from(v)));
        self.rel_dir_chains.insert(dir, 0);
    }

    /// Writes the directory-like values this record changed, once each.
    fn finish_record(&mut self) {
        if std::mem::take(&mut self.dirty_db_dir) {
            let v = dirs::encode_pairs(&self.db_dir);
            self.put(Key::db_dir(), Value::Image(Bytes::from(v)));
        }
        for dir in std::mem::take(&mut self.dirty_rel_dirs) {
            self.rel_dir_edits.remove(&dir);
            self.put_rel_dir(dir);
        }
        for (dir, edits) in std::mem::take(&mut self.rel_dir_edits) {
            let chain = self.rel_dir_chains.get(&dir).copied().unwrap_or(usize::MAX);
            if chain >= rel_dir_chain_limit(self.rel_dirs[&dir].len()) {
                self.put_rel_dir(dir);
                continue;
            }
            let mut change = RelDirChange::default();
            for (entry, present) in edits {
                if present { &mut change.added } else { &mut change.removed }.push(entry);
            }
            self.put(Key::rel_dir(dir.0, dir.1), Value::RelDirChange(change));
            self.rel_dir_chains.insert(dir, chain + 1);
        }
        for tag in std::mem::take(&mut self.dirty_sizes) {
            if let Some(n) = self.rel_sizes.get(&tag).copied() {
                self.put(Key::rel_size(tag), Value::Image(Bytes::copy_from_slice(&n.to_le_bytes())));
                self.tl.note_rel_size(tag, self.lsn, Some(n));
            }
        }
        for kind in std::mem::take(&mut self.dirty_slru) {
            let v = dirs::encode_u32s(&self.slru_dirs[&kind]);
            self.put(Key::slru_dir(kind), Value::Image(Bytes::from(v)));
        }
        if std::mem::take(&mut self.dirty_twophase) {
            let v = dirs::encode_u32s(&self.twophase);
            self.put(Key::twophase_dir(), Value::Image(Bytes::from(v)));
        }
    }
}

/// Most changes written on top of a relation directory of `entries` before
/// it is written whole again: a sixteenth of its size, from 16 to 512. A
/// read then gathers at most 512 small changes, and a directory of N
/// relations created one by one costs about 5·N²/1024 bytes in all, 30 MB
/// for 80 000 (written whole each time, as before, it cost 5·N²/2 bytes:
/// 80 000 relations made gigabytes of layers).
fn rel_dir_chain_limit(entries: usize) -> usize {
    (entries / 16).clamp(16, 512)
}

/// `x` in `[start, end)` on a circle of segment numbers.
fn in_wrapping_range(x: u32, start: u32, end: u32) -> bool {
    if start <= end {
        x >= start && x < end
    } else {
        x >= start || x < end
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_formats::version::BLCKSZ;

    #[test]
    fn wrapping_ranges() {
        assert!(in_wrapping_range(3, 2, 5));
        assert!(!in_wrapping_range(5, 2, 5));
        assert!(in_wrapping_range(9, 8, 2) && in_wrapping_range(1, 8, 2) && !in_wrapping_range(4, 8, 2));
        assert!(!in_wrapping_range(4, 4, 4), "an empty range removes nothing");
    }

    #[test]
    fn blcksz_is_a_page() {
        assert_eq!(BLCKSZ, 8192);
    }
}
