//! `strata storage …`: the object store as a service sees it, with its
//! storage key (`docs/security.md`, "Encryption at rest"): read an object
//! (opened and authenticated when sealed), add a tenant's data key, wrap
//! every data key again under the newest cluster key, delete a tenant's
//! data keys.

use crate::out::{errln, outln};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context};
use clap::Subcommand;
use strata_protocol::TenantId;
use strata_remote_storage::{RemoteStorage, RemoteStorageConfig};

#[derive(Subcommand)]
pub enum StorageCommand {
    /// Write an object's content to stdout: opened and authenticated when it
    /// is a tenant's sealed object (a tampered one is refused, exit 1).
    Cat {
        /// A pageserver's or safekeeper's config (`[remote_storage]`, `storage_key`).
        #[arg(long)]
        config: PathBuf,
        /// The object's name (`tenants/<tenant>/…`, `wal/<tenant>/…`).
        key: String,
    },
    /// Add a data key for a tenant: its new objects are sealed with it.
    RotateDataKey {
        #[arg(long)]
        config: PathBuf,
        #[arg(long)]
        tenant_id: TenantId,
    },
    /// Wrap every tenant's data keys again under the newest cluster key
    /// (after one was added to the storage key file), so the older can go.
    RewrapDataKeys {
        #[arg(long)]
        config: PathBuf,
    },
    /// Delete a tenant's data keys: its objects can no longer be opened.
    DeleteDataKeys {
        #[arg(long)]
        config: PathBuf,
        #[arg(long)]
        tenant_id: TenantId,
    },
    /// What sealing costs the storage layer: a file uploaded to and
    /// downloaded from a local-directory store, sealed and plain,
    /// alternating; medians and ratios as JSON.
    Bench {
        /// A scratch directory on the disk to measure.
        #[arg(long)]
        dir: PathBuf,
        /// Size of the file, in MiB.
        #[arg(long, default_value_t = 256)]
        mb: usize,
        /// Timed runs of each mode (after one that warms up).
        #[arg(long, default_value_t = 5)]
        runs: usize,
    },
}

/// What a service config holds about its object storage.
#[derive(serde::Deserialize)]
struct StorageOnly {
    remote_storage: Option<RemoteStorageConfig>,
    storage_key: Option<PathBuf>,
}

/// The storage a service config names, with its storage key if any.
fn open(config: &Path, need_key: bool) -> anyhow::Result<RemoteStorage> {
    let text = std::fs::read_to_string(config).with_context(|| format!("reading {}", config.display()))?;
    let cfg: StorageOnly = toml::from_str(&text).with_context(|| format!("parsing {}", config.display()))?;
    let remote = cfg.remote_storage.ok_or_else(|| anyhow!("{} has no [remote_storage]", config.display()))?;
    let storage = RemoteStorage::new(&remote)?;
    match cfg.storage_key {
        Some(key) => Ok(storage.with_storage_key(&key)?),
        None if need_key => Err(anyhow!("{} names no storage_key: its objects are not encrypted", config.display())),
        None => Ok(storage),
    }
}

pub fn run(cmd: StorageCommand) -> i32 {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            errln!("strata storage: error: {e}");
            return 2;
        }
    };
    let result: anyhow::Result<()> = runtime.block_on(async {
        match cmd {
            StorageCommand::Cat { config, key } => {
                let bytes = open(&config, false)?.get(&key).await?;
                std::io::stdout().lock().write_all(&bytes).context("writing to stdout")?;
            }
            StorageCommand::RotateDataKey { config, tenant_id } => {
                let id = open(&config, true)?.rotate_data_key(tenant_id).await?;
                outln!("tenant {tenant_id}: data key {id} seals new objects");
            }
            StorageCommand::RewrapDataKeys { config } => {
                let n = open(&config, true)?.rewrap_data_keys().await?;
                outln!("{n} tenants' data keys wrapped again under the newest cluster key");
            }
            StorageCommand::DeleteDataKeys { config, tenant_id } => {
                open(&config, true)?.delete_data_keys(tenant_id).await?;
                outln!("tenant {tenant_id}: data keys deleted");
            }
            StorageCommand::Bench { dir, mb, runs } => {
                let report = crate::storage_bench::run(&crate::storage_bench::Bench { dir, mb, runs }).await?;
                outln!("{}", serde_json::to_string_pretty(&report)?);
            }
        }
        Ok(())
    });
    match result {
        Ok(()) => 0,
        Err(e) => {
            errln!("strata storage: error: {e:#}");
            1
        }
    }
}
