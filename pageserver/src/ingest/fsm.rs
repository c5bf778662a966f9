//! Free space map pages a compute's agent carries in a logical message
//! (`docs/free-space-maps.md`). Any database user may emit a message with
//! this prefix, so every page is checked against what the timeline knows,
//! and what does not hold is skipped: a hint never stops ingest.

use bytes::Bytes;
use strata_formats::page::{checksum, pd_lower, pd_lsn, pd_pagesize_version, pd_special, pd_upper};
use strata_formats::types::ForkNumber;
use strata_formats::version::BLCKSZ;
use strata_protocol::fsm_pages::{self, FsmPage};
use tracing::warn;

use super::{Res, WalIngest};
use crate::key::{Key, RelTag};
use crate::value::Value;

/// `pd_pagesize_version` of a page PostgreSQL 15 to 18 initialized: the
/// size with layout version 4.
const PAGESIZE_VERSION: u16 = BLCKSZ as u16 | 4;

impl WalIngest {
    /// Stores the pages of one message at its LSN; each shard keeps the
    /// pages of its blocks and every fork size, as for any block.
    pub(super) fn store_fsm_pages(&mut self, message: &[u8]) -> Res<()> {
        let pages = match fsm_pages::decode(message) {
            Ok(pages) => pages,
            Err(e) => {
                self.tl.metrics.fsm_pages_refused.inc();
                warn!(lsn = %self.lsn, "{e}; the message is skipped");
                return Ok(());
            }
        };
        for p in pages {
            if let Err(why) = self.check_fsm_page(&p)? {
                self.tl.metrics.fsm_pages_refused.inc();
                warn!(lsn = %self.lsn, page = ?p, "a free space map page is skipped: {why}");
                continue;
            }
            let tag = RelTag { rel: p.rel, fork: ForkNumber::Fsm };
            self.ensure_rel(tag)?;
            self.extend_to(tag, p.block + 1)?;
            if self.tl.shard.owns_block(p.rel.rel, ForkNumber::Fsm, p.block) {
                let key = Key::rel_block(tag, p.block);
                self.chains.remove(&key);
                self.put(key, Value::Image(Bytes::from(p.page.to_vec())));
                self.tl.metrics.fsm_pages_stored.inc();
            }
        }
        Ok(())
    }

    /// Whether `p` could be PostgreSQL's page of a logged relation's map
    /// at this LSN; the reason when not.
    fn check_fsm_page(&mut self, p: &FsmPage) -> Res<Result<(), String>> {
        let main = RelTag { rel: p.rel, fork: ForkNumber::Main };
        let Some(heap_blocks) = self.rel_size(main)? else {
            return Ok(Err("no such relation".into()));
        };
        let init = RelTag { rel: p.rel, fork: ForkNumber::Init };
        if self.rel_size(init)?.is_some() {
            // An unlogged relation's map starts afresh with its data.
            return Ok(Err("an unlogged relation".into()));
        }
        let bound = fsm_pages::blocks_for_heap(heap_blocks);
        if u64::from(p.block) >= bound {
            return Ok(Err(format!("a map of {heap_blocks} heap blocks has {bound} blocks")));
        }
        Ok(check_header(&p.page, p.block, self.lsn.0, self.checksums))
    }
}

/// The header of a map page as PostgreSQL writes it: initialized with no
/// line pointers and no special space, not from the future, its checksum
/// right when the cluster has them.
fn check_header(page: &[u8; BLCKSZ], block: u32, lsn: u64, checksums: bool) -> Result<(), String> {
    let field = |e: strata_formats::page::PageError| e.to_string();
    let version = pd_pagesize_version(page).map_err(field)?;
    if version != PAGESIZE_VERSION {
        return Err(format!("pd_pagesize_version {version:#x}"));
    }
    let (lower, upper, special) =
        (pd_lower(page).map_err(field)?, pd_upper(page).map_err(field)?, pd_special(page).map_err(field)?);
    if lower != 24 || upper as usize != BLCKSZ || special as usize != BLCKSZ {
        return Err(format!("pd_lower {lower}, pd_upper {upper}, pd_special {special}"));
    }
    let page_lsn = pd_lsn(page).map_err(field)?;
    if page_lsn > lsn {
        return Err(format!("pd_lsn {page_lsn:#x} is past the message"));
    }
    if checksums && !checksum::verify_checksum(page, block) {
        return Err("its checksum does not match".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fsm_page(lsn: u64) -> Box<[u8; BLCKSZ]> {
        let mut p = Box::new([0u8; BLCKSZ]);
        strata_formats::page::set_pd_lsn(&mut p[..], lsn).unwrap();
        strata_formats::page::set_pd_lower(&mut p[..], 24).unwrap();
        strata_formats::page::set_pd_upper(&mut p[..], BLCKSZ as u16).unwrap();
        strata_formats::page::set_pd_special(&mut p[..], BLCKSZ as u16).unwrap();
        strata_formats::page::set_pd_pagesize_version(&mut p[..], PAGESIZE_VERSION).unwrap();
        p[24 + 4..24 + 4 + 100].fill(0x20);
        p
    }

    #[test]
    fn headers_are_checked() {
        let good = fsm_page(0x100);
        assert_eq!(check_header(&good, 3, 0x100, false), Ok(()));
        assert!(check_header(&good, 3, 0xff, false).unwrap_err().contains("past the message"));
        let mut sum = good.clone();
        checksum::set_checksum(&mut sum, 3);
        assert_eq!(check_header(&sum, 3, 0x100, true), Ok(()));
        assert!(check_header(&sum, 4, 0x100, true).unwrap_err().contains("checksum"));
        let mut heap_like = good.clone();
        strata_formats::page::set_pd_lower(&mut heap_like[..], 40).unwrap();
        assert!(check_header(&heap_like, 3, 0x100, false).is_err());
        let mut other = good;
        strata_formats::page::set_pd_pagesize_version(&mut other[..], 0x1004).unwrap();
        assert!(check_header(&other, 3, 0x100, false).is_err());
        assert!(check_header(&[0u8; BLCKSZ], 3, 0x100, false).is_err());
    }
}
