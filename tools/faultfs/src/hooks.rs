//! The faults as passthrough hooks: fsyncs (and writes that sync) fail with
//! EIO while `fsync` is armed, writes and fallocate with ENOSPC while
//! `write` is.

use std::fs::File;
use std::sync::Arc;

use fuser::Errno;
use strata_fusefs::{Hooks, Node, Result};

use crate::faults::Faults;

/// Fails operations as the control file says.
pub struct FaultHooks(pub Arc<Faults>);

impl Hooks for FaultHooks {
    fn before_write(&self, node: &Node, _file: &File, _offset: u64, _data: &[u8], sync: bool) -> Result<()> {
        let active = self.0.active();
        if active.write {
            self.0.inject("write", node, "ENOSPC");
            return Err(Errno::ENOSPC);
        }
        if active.fsync && sync {
            self.0.inject("synchronous write", node, "EIO");
            return Err(Errno::EIO);
        }
        Ok(())
    }

    fn before_fsync(&self, node: &Node, op: &str) -> Result<()> {
        if self.0.active().fsync {
            self.0.inject(op, node, "EIO");
            return Err(Errno::EIO);
        }
        Ok(())
    }

    fn before_fallocate(&self, node: &Node) -> Result<()> {
        if self.0.active().write {
            self.0.inject("fallocate", node, "ENOSPC");
            return Err(Errno::ENOSPC);
        }
        Ok(())
    }
}
