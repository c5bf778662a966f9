//! `strata safekeeper replace OLD NEW`: replaces a safekeeper (typically
//! one whose disk is gone) by a new, empty one while writes go on: every
//! branch's timeline goes through the membership change of `reconfigure`
//! (`docs/safekeeper-membership.md`), then the old safekeeper leaves
//! `cluster.toml` and every config.

use std::collections::BTreeMap;
use std::path::PathBuf;

use strata_protocol::NodeId;
use strata_safekeeper::config::{Peer, SafekeeperConfig};

use super::error::{Error, Result};
use super::layout::{read_toml, save_cluster, write_toml, Kind, Service, Workdir};
use super::reconfigure::{node_of, Change, Node};
use super::report::{Progress, ReplaceEvent};
use super::services;
use strata_service::ports;

/// `strata safekeeper replace OLD NEW`.
pub fn replace(wd: &Workdir, old: &str, new: &str, progress: &mut dyn Progress) -> Result<()> {
    super::endpoint::check_name(new)?;
    let Some(old_service) = wd.service(old).filter(|s| s.kind == Kind::Safekeeper).cloned() else {
        return Err(Error::Usage(format!("no safekeeper named {old:?}")));
    };
    let wd = match wd.service(new) {
        Some(s) if s.kind == Kind::Safekeeper => {
            progress.tell(ReplaceEvent::Resuming { old: old.into(), new: new.into() });
            Workdir::open(&wd.root)?
        }
        Some(_) => return Err(Error::Usage(format!("{new:?} names another service"))),
        None => add_safekeeper(wd, &old_service, new, progress)?,
    };
    let new_service = wd.service(new).expect("added").clone();
    services::start_anywhere(&wd, &new_service, progress)?;

    let node = |s: &Service| -> Result<Node> {
        let c: SafekeeperConfig = read_toml(&wd.config_path(s))?;
        Ok(node_of(&wd, s, c.id))
    };
    let old_set: Vec<Node> =
        wd.cluster.of_kind(Kind::Safekeeper).filter(|s| s.name != new).map(node).collect::<Result<_>>()?;
    let new_node = node(&new_service)?;
    let new_set: Vec<Node> =
        old_set.iter().filter(|n| n.name != old).cloned().chain(std::iter::once(new_node.clone())).collect();

    for (t, branch) in wd.cluster.all_branches() {
        progress.tell(ReplaceEvent::Timeline { branch: t.label(&branch.name), timeline: branch.timeline_id });
        let change =
            Change { tenant: t.tenant_id, timeline: branch.timeline_id, old: &old_set, new: &new_set, placement: None };
        change.run(progress)?;
    }

    // The old safekeeper leaves the cluster: stopped if it runs, its
    // directory kept, its place in every config taken by the new one.
    services::stop_anywhere(&wd, &old_service, false, progress)?;
    let mut cluster = wd.cluster.clone();
    cluster.services.retain(|s| s.name != old);
    save_cluster(&wd.root, &mut cluster)?;
    let wd = Workdir::open(&wd.root)?;
    rewrite_configs(&wd)?;
    progress.tell(ReplaceEvent::Replaced { old: old.into(), new: new.into() });
    Ok(())
}

/// Adds the new safekeeper to `cluster.toml` with fresh ports and the next
/// free node id, its config a copy of `like`'s with its own addresses.
fn add_safekeeper(wd: &Workdir, like: &Service, name: &str, progress: &mut dyn Progress) -> Result<Workdir> {
    let mut highest = 0u64;
    for s in &wd.cluster.services {
        let v: toml::Value = read_toml(&wd.config_path(s))?;
        highest = highest.max(v.get("id").and_then(|i| i.as_integer()).unwrap_or(0) as u64);
    }
    let id = NodeId(highest + 1);
    let p = ports::allocate(3, &wd.cluster.ports()).map_err(|e| Error::Failed(format!("finding free ports: {e}")))?;
    let service = Service {
        name: name.to_string(),
        kind: Kind::Safekeeper,
        // On the host of the one it replaces, which keeps the sites' balance.
        host: like.host.clone(),
        config: PathBuf::from(name).join("safekeeper.toml"),
        ports: BTreeMap::from([("listen".into(), p[0]), ("http".into(), p[1]), ("pg".into(), p[2])]),
        address: like.address,
    };
    let mut config: SafekeeperConfig = read_toml(&wd.config_path(like))?;
    config.id = id;
    let addr = |port: u16| std::net::SocketAddr::new(like.address, port);
    config.listen = addr(p[0]);
    config.listen_http = addr(p[1]);
    config.listen_pg = Some(addr(p[2]));
    config.data_dir = wd.root.join(name).join("data");
    super::layout::create_private_dir(&config.data_dir)?;
    let mut cluster = wd.cluster.clone();
    cluster.services.push(service.clone());
    let header = "# Written by `strata safekeeper replace`; ports and paths must match cluster.toml.\n";
    write_toml(&wd.root.join(&service.config), header, &config)?;
    save_cluster(&wd.root, &mut cluster)?;
    progress.tell(ReplaceEvent::Added { name: name.into(), id, listen: config.listen });
    let wd = Workdir::open(&wd.root)?;
    rewrite_configs(&wd)?;
    Ok(wd)
}

/// Points every safekeeper's peers, and the pageserver's safekeeper list,
/// at the safekeepers `cluster.toml` names.
fn rewrite_configs(wd: &Workdir) -> Result<()> {
    let sks: Vec<&Service> = wd.cluster.of_kind(Kind::Safekeeper).collect();
    let mut ids = BTreeMap::new();
    for s in &sks {
        let c: SafekeeperConfig = read_toml(&wd.config_path(s))?;
        ids.insert(s.name.clone(), c.id);
    }
    for s in &sks {
        let path = wd.config_path(s);
        let mut c: SafekeeperConfig = read_toml(&path)?;
        // Peers of another site through the link proxy (`docs/sites.md`).
        let site = wd.cluster.site_of(s);
        c.peers = sks
            .iter()
            .filter(|p| p.name != s.name)
            .map(|p| Peer {
                id: ids[&p.name],
                address: wd.cluster.addr_from(site, p, "listen").expect("checked"),
                http: wd.cluster.addr_from(site, p, "http"),
            })
            .collect();
        write_toml(&path, "# Ports and paths must match cluster.toml.\n", &c)?;
    }
    for ps in wd.cluster.of_kind(Kind::Pageserver) {
        let path = wd.config_path(ps);
        let mut c: strata_pageserver::config::PageserverConfig = read_toml(&path)?;
        c.safekeepers = wd.cluster.safekeeper_addrs_from(wd.cluster.site_of(ps));
        c.safekeepers_http = wd.cluster.safekeeper_addrs_from_role(wd.cluster.site_of(ps), "http");
        c.site_safekeepers = wd.cluster.site_safekeepers(wd.cluster.site_of(ps));
        write_toml(&path, "# Ports and paths must match cluster.toml.\n", &c)?;
    }
    Ok(())
}
