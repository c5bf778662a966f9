//! What the CLI asks the storage controllers (`docs/storage-controller.md`):
//! which pageserver serves the tenant, and drains and fills.

use std::time::{Duration, Instant};

use strata_protocol::api::controller::{AttachmentInfo, ControllerStatus, TenantDeleted};
use strata_protocol::api::pageserver::{LocationMode, PageserverStatus};
use strata_protocol::TenantShardId;

use super::error::{failed, Error, Result};
use super::http;
use super::layout::{Kind, Service, Workdir};
use super::process::Poll;
use super::report::PolicyChanged;
use crate::limits::{ATTACH_POLL, ATTACH_WAIT, CONTROLLER_ACTION_POLL, LOCATE_POLL, QUICK};

/// The controllers, the leader (as any of them knows it) first.
fn controllers(wd: &Workdir) -> Vec<&Service> {
    wd.cluster.of_kind(Kind::Controller).collect()
}

/// Where `tenant` is attached: asked of each controller in turn (a
/// follower answers from its copy of the state), waiting up to `wait` for
/// one that knows.
pub fn attachment(
    wd: &Workdir,
    tenant: impl Into<TenantShardId>,
    wait: Duration,
) -> Result<(&Service, AttachmentInfo)> {
    attachment_for(wd, tenant.into(), wait, None)
}

/// The reader of `site` (`docs/sites.md`), if the controllers have one
/// there, online and loaded; otherwise replicas read the attached pageserver.
pub fn site_reader<'a>(wd: &'a Workdir, tenant: impl Into<TenantShardId>, site: &str) -> Option<&'a Service> {
    let (ps, info) = attachment_for(wd, tenant.into(), Duration::ZERO, Some(site)).ok()?;
    info.reader.then_some(ps)
}

/// [`attachment`], or with `site` that site's reader if it has one.
fn attachment_for<'a>(
    wd: &'a Workdir,
    tenant: TenantShardId,
    wait: Duration,
    site: Option<&str>,
) -> Result<(&'a Service, AttachmentInfo)> {
    let deadline = Instant::now() + wait;
    let mut last = String::from("no controller answered");
    let query = site.map(|s| format!("?site={s}")).unwrap_or_default();
    // A starting cluster's controller places the tenant within milliseconds.
    let mut poll = Poll::every(LOCATE_POLL);
    loop {
        // Every controller is asked and the newest state's answer wins: a
        // follower's copy may be a failover behind the leader's.
        let mut newest: Option<(&Service, AttachmentInfo)> = None;
        for c in controllers(wd) {
            let url = format!("{}/v1/tenant/{tenant}/attachment{query}", c.http_url());
            match http::get(&url, QUICK) {
                Ok(r) if r.status == 200 => {
                    let info: AttachmentInfo = r.json().map_err(|e| Error::Failed(format!("{}: {e}", c.name)))?;
                    if newest.as_ref().is_none_or(|(_, n)| info.version > n.version) {
                        newest = Some((c, info));
                    }
                }
                Ok(r) => last = format!("{}: HTTP {}: {}", c.name, r.status, r.error_text()),
                Err(e) => last = format!("{}: {e}", c.name),
            }
        }
        if let Some((c, info)) = newest {
            let Some(ps) = wd.service(&info.pageserver).filter(|s| s.kind == Kind::Pageserver) else {
                return failed(format!(
                    "{}: names pageserver {:?}, which the cluster has not",
                    c.name, info.pageserver
                ));
            };
            return Ok((ps, info));
        }
        if Instant::now() >= deadline {
            return failed(format!("no controller says where tenant {tenant} is attached ({last})"));
        }
        poll.pause();
    }
}

/// The pageserver that serves the tenant now, once it has attached it
/// (the controller records a placement before it tells the pageserver). A
/// pageserver that does not answer is returned at once: the callers say
/// it is not running.
pub fn attached(wd: &Workdir, tenant: impl Into<TenantShardId>) -> Result<&Service> {
    let tenant = tenant.into();
    let deadline = Instant::now() + ATTACH_WAIT;
    let mut poll = Poll::every(ATTACH_POLL);
    loop {
        // Asked again at each poll: while a live move is under way the
        // answer is the origin under the target's generation, until the
        // move completes (a rebalance, or a split's children parting).
        let (ps, info) = attachment(wd, tenant, ATTACH_WAIT)?;
        let status = match http::get(&format!("{}/v1/status", ps.http_url()), QUICK) {
            Ok(r) if r.status == 200 => {
                r.json::<PageserverStatus>().map_err(|e| Error::Failed(format!("{}: {e}", ps.name)))?
            }
            _ => return Ok(ps),
        };
        let ready = status.locations.iter().any(|l| {
            l.tenant_id == tenant && l.mode == LocationMode::Attached && l.generation >= Some(info.generation)
        });
        if ready {
            return Ok(ps);
        }
        if Instant::now() >= deadline {
            return failed(format!(
                "{}: tenant {tenant} is placed there (generation {}) but not attached after {}s",
                ps.name,
                info.generation,
                ATTACH_WAIT.as_secs()
            ));
        }
        poll.pause();
    }
}

/// The pageserver that serves the tenant, if a controller says so at once
/// (for status pages, which must not wait).
pub fn attached_now(wd: &Workdir, tenant: impl Into<TenantShardId>) -> Option<&Service> {
    attachment(wd, tenant, Duration::ZERO).ok().map(|(s, _)| s)
}

/// The status of the first controller that answers, leaders first.
pub fn status(wd: &Workdir) -> Option<ControllerStatus> {
    let all: Vec<ControllerStatus> = controllers(wd)
        .iter()
        .filter_map(|c| http::get(&format!("{}/v1/status", c.http_url()), QUICK).ok())
        .filter(|r| r.status == 200)
        .filter_map(|r| r.json::<ControllerStatus>().ok())
        .collect();
    let leader = all.iter().position(|s| s.leader);
    leader.map(|i| all[i].clone()).or_else(|| all.into_iter().max_by_key(|s| s.state.as_ref().map(|x| x.version)))
}

/// Asks the controllers, until one (the leader) takes it or
/// [`ATTACH_WAIT`] passes: the answer of the one that took it.
fn to_leader(wd: &Workdir, what: &str, call: impl Fn(&Service) -> Result<http::Reply>) -> Result<http::Reply> {
    let deadline = Instant::now() + ATTACH_WAIT;
    loop {
        // Every controller's answer: the leader's says why, the others' only where it is.
        let mut answers = Vec::new();
        for c in controllers(wd) {
            match call(c) {
                Ok(r) if (200..300).contains(&r.status) => return Ok(r),
                Ok(r) => answers.push(format!("{}: HTTP {}: {}", c.name, r.status, r.error_text())),
                Err(e) => answers.push(format!("{}: {e}", c.name)),
            }
        }
        if Instant::now() >= deadline {
            return failed(format!("no controller took {what} ({})", answers.join("; ")));
        }
        std::thread::sleep(CONTROLLER_ACTION_POLL);
    }
}

/// Has the leading controller place `tenant` (idempotent): a new tenant
/// is attached within a decision round.
pub fn register(wd: &Workdir, tenant: TenantShardId) -> Result<()> {
    let what = format!("the registration of tenant {tenant}");
    to_leader(wd, &what, |c| {
        let url = format!("{}/v1/tenant/{tenant}", c.http_url());
        http::put(&url, &serde_json::json!({}), QUICK).map_err(|e| Error::Failed(e.to_string()))
    })?;
    Ok(())
}

/// Has the leading controller forget `tenant` (idempotent): its
/// pageservers are told to detach it. Its answer: the pageservers that
/// still hold a location of it, and those not online.
pub fn forget(wd: &Workdir, tenant: TenantShardId) -> Result<TenantDeleted> {
    let what = format!("the deletion of tenant {tenant}");
    let reply = to_leader(wd, &what, |c| {
        let url = format!("{}/v1/tenant/{tenant}", c.http_url());
        http::delete(&url, QUICK).map_err(|e| Error::Failed(e.to_string()))
    })?;
    reply.json().map_err(|e| Error::Failed(format!("{what}: {e}")))
}

/// `strata pageserver drain|fill NAME` (and `lost`, in a site failover):
/// asks the leading controller; what it took.
pub fn set_policy(wd: &Workdir, name: &str, action: &str) -> Result<PolicyChanged> {
    match wd.service(name) {
        Some(s) if s.kind == Kind::Pageserver => {}
        _ => {
            let known: Vec<&str> = wd.cluster.of_kind(Kind::Pageserver).map(|s| s.name.as_str()).collect();
            return Err(Error::Usage(format!("no pageserver named {name:?} (pageservers: {})", known.join(", "))));
        }
    }
    let deadline = Instant::now() + ATTACH_WAIT;
    loop {
        let mut answers = Vec::new();
        for c in controllers(wd) {
            let url = format!("{}/v1/pageserver/{name}/{action}", c.http_url());
            match http::post(&url, &serde_json::json!({}), QUICK) {
                Ok(r) if r.status == 200 => {
                    return Ok(PolicyChanged { pageserver: name.into(), action: action.into() });
                }
                Ok(r) => answers.push(format!("{}: HTTP {}: {}", c.name, r.status, r.error_text())),
                Err(e) => answers.push(format!("{}: {e}", c.name)),
            }
        }
        if Instant::now() >= deadline {
            return failed(format!("no controller took the {action} of {name} ({})", answers.join("; ")));
        }
        std::thread::sleep(CONTROLLER_ACTION_POLL);
    }
}
