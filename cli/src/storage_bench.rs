//! `strata storage bench`: what sealing costs the storage layer itself, in
//! one run on one disk: a file uploaded into a local-directory store and
//! downloaded back (both streamed, fsynced, with their CRC-32C), into a
//! store with a storage key and into one without, alternating run by run.
//! Reports the medians, ranges and ratios as JSON.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use strata_remote_storage::seal::keys::ClusterKeys;
use strata_remote_storage::{RemoteStorage, RemoteStorageConfig};

/// The arguments of `strata storage bench`.
pub struct Bench {
    /// A scratch directory (created, and emptied of what the bench made).
    pub dir: PathBuf,
    pub mb: usize,
    pub runs: usize,
}

/// Median and range of some seconds.
fn summary(mut secs: Vec<f64>) -> serde_json::Value {
    secs.sort_by(f64::total_cmp);
    serde_json::json!({"median_s": secs[secs.len() / 2], "min_s": secs[0], "max_s": secs[secs.len() - 1], "runs": secs})
}

fn storage(dir: &Path, key: Option<&Path>) -> anyhow::Result<RemoteStorage> {
    let s = RemoteStorage::new(&RemoteStorageConfig::Local { path: dir.to_path_buf() })?;
    Ok(match key {
        Some(k) => s.with_storage_key(k)?,
        None => s,
    })
}

/// Runs the bench; its report.
pub async fn run(b: &Bench) -> anyhow::Result<serde_json::Value> {
    use std::os::unix::fs::PermissionsExt;
    anyhow::ensure!(b.runs > 0 && b.mb > 0, "--runs and --mb must be at least 1");
    std::fs::create_dir_all(&b.dir).with_context(|| format!("creating {}", b.dir.display()))?;
    let key = b.dir.join("storage.key");
    std::fs::write(&key, ClusterKeys::new_file_text())?;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))?;
    let file = b.dir.join("layer");
    let mut rng = fastrand::Rng::with_seed(1);
    let mut content = vec![0u8; b.mb << 20];
    let modes =
        [("sealed", storage(&b.dir.join("sealed"), Some(&key))?), ("plain", storage(&b.dir.join("plain"), None)?)];
    let name = "tenants/0123456789abcdef0123456789abcdef/timelines/0123456789abcdef0123456789abcdef/layer";
    let mut times: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); modes.len()];
    for run in 0..=b.runs {
        // New content every run, for both modes: a disk that recognises
        // bytes it has just written (the plain object, unlike a sealed one,
        // would be the same each time) must not favour one mode.
        rng.fill(&mut content);
        std::fs::write(&file, &content)?;
        // Each mode goes first in every other run: what one leaves to the
        // disk's writeback does not always fall on the other.
        let order: Vec<usize> = if run % 2 == 0 { vec![0, 1] } else { vec![1, 0] };
        for i in order {
            let s = &modes[i].1;
            let t = Instant::now();
            let up = s.upload_file(name, &file).await?;
            let upload = t.elapsed().as_secs_f64();
            let back = b.dir.join("back");
            let t = Instant::now();
            let down = s.download_file(name, &back).await?;
            let download = t.elapsed().as_secs_f64();
            anyhow::ensure!(
                (up.size, up.crc32c) == (down.size, down.crc32c),
                "the download differs from the upload: {up:?} {down:?}"
            );
            // The first round warms the page cache and the key cache.
            if run > 0 {
                times[i].0.push(upload);
                times[i].1.push(download);
            }
        }
    }
    let mut out = serde_json::json!({"mb": b.mb, "runs": b.runs});
    for ((mode, _), (up, down)) in modes.iter().zip(times) {
        out[*mode] = serde_json::json!({"upload": summary(up), "download": summary(down)});
    }
    for op in ["upload", "download"] {
        let ratio = out["sealed"][op]["median_s"].as_f64().unwrap_or(f64::NAN)
            / out["plain"][op]["median_s"].as_f64().unwrap_or(f64::NAN);
        out[format!("{op}_ratio")] = serde_json::json!(ratio);
    }
    for p in ["sealed", "plain", "back", "layer", "storage.key"] {
        let path = b.dir.join(p);
        let _ = if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
    }
    Ok(out)
}
