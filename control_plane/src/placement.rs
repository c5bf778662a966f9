//! `strata branch placement`: a branch's WAL placement (`docs/sites.md`),
//! kept in `cluster.toml` and applied to the safekeepers through a
//! membership change (`reconfigure`).

use strata_protocol::safekeeper::{OnAsyncLag, Placement};

use super::error::{failed, Error, Result};
use super::layout::{update_cluster, Workdir};
use super::report::{BranchEvent, Progress};

/// The placement `strata branch placement` asks for, checked against the
/// cluster's sites.
pub fn placement_of(
    wd: &Workdir,
    policy: &str,
    home: Option<&str>,
    max_async_lag: Option<u64>,
    on_async_lag: Option<&str>,
) -> Result<Placement> {
    if policy != "local-quorum" && (home.is_some() || max_async_lag.is_some() || on_async_lag.is_some()) {
        return Err(Error::Usage("--home, --max-async-lag and --on-async-lag apply to local-quorum".into()));
    }
    let sites = wd.cluster.safekeeper_sites();
    Ok(match policy {
        "majority" => Placement::Majority,
        "stretched" => {
            if sites.len() < 2 {
                return failed(format!(
                    "stretched needs safekeepers in two sites; they are all in {}",
                    sites.first().map_or("-", |(s, _)| s.as_str())
                ));
            }
            Placement::Stretched
        }
        "local-quorum" => {
            // The site with the most safekeepers (the first such) by default.
            let most = sites.iter().max_by_key(|(_, n)| *n).map(|(s, _)| s.clone()).unwrap_or_default();
            let home = home.map(str::to_string).unwrap_or(most);
            if !sites.iter().any(|(s, _)| *s == home) {
                let known: Vec<&str> = sites.iter().map(|(s, _)| s.as_str()).collect();
                return failed(format!("no safekeeper in site {home:?} (sites: {})", known.join(", ")));
            }
            let on_async_lag = match on_async_lag {
                Some("throttle") => OnAsyncLag::Throttle,
                _ => OnAsyncLag::FallBehind,
            };
            if max_async_lag == Some(0) {
                return Err(Error::Usage("--max-async-lag must be above 0".into()));
            }
            Placement::LocalQuorum {
                home,
                max_async_lag: max_async_lag.unwrap_or(strata_protocol::safekeeper::membership::DEFAULT_MAX_ASYNC_LAG),
                on_async_lag,
            }
        }
        other => return Err(Error::Usage(format!("unknown placement {other:?}"))),
    })
}

/// `strata branch placement NAME POLICY`: records the placement in
/// `cluster.toml`, then moves every safekeeper's configuration of the
/// branch's timeline to it (a membership change; every safekeeper that
/// must take part has to run).
pub fn set_placement(
    wd: &Workdir,
    tenant: &str,
    name: &str,
    placement: Placement,
    progress: &mut dyn Progress,
) -> Result<()> {
    let t = wd.cluster.tenant_named(tenant)?;
    let Some(branch) = t.branch(name).cloned() else {
        return failed(format!("no branch named {name:?} (branches: {})", t.branch_names()));
    };
    update_cluster(&wd.root, |cluster| {
        if let Some(b) = cluster.tenant_mut(tenant).and_then(|t| t.branches.iter_mut().find(|b| b.name == name)) {
            b.placement = (!placement.is_majority()).then(|| placement.clone());
        }
        Ok(())
    })?;
    progress.tell(BranchEvent::PlacementSet { branch: name.into(), timeline: branch.timeline_id, placement });
    apply_placement(&Workdir::open(&wd.root)?, tenant, &branch.name, progress)
}

/// Brings the safekeepers' configuration of a branch's timeline to the
/// placement `cluster.toml` gives it.
pub fn apply_placement(wd: &Workdir, tenant: &str, name: &str, progress: &mut dyn Progress) -> Result<()> {
    let t = wd.cluster.tenant_named(tenant)?;
    let branch = t.branch(name).ok_or_else(|| Error::Failed(format!("no branch named {name:?}")))?;
    let nodes = super::reconfigure::nodes(wd)?;
    let change = super::reconfigure::Change {
        tenant: t.tenant_id,
        timeline: branch.timeline_id,
        old: &nodes,
        new: &nodes,
        placement: Some(branch.placement.clone().unwrap_or_default()),
    };
    change.run(progress)
}
