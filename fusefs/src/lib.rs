//! A FUSE passthrough of a backing directory on `fuser`, shared by the
//! storage fault injector (`strata-faultfs`) and the lazy compute's relation
//! file system (`docs/lazy-compute.md`): both serve a real directory and
//! change a few operations, through [`Hooks`].

pub mod inodes;
pub mod limits;
mod open_files;
mod passthrough;
pub mod sys;
pub mod testing;

pub use passthrough::{Hooks, Node, Passthrough, Result};
