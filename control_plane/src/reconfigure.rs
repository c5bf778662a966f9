//! A membership change of one timeline (`docs/safekeeper-membership.md`):
//! from a set of safekeepers under a placement to another set (one member
//! replaced, or the same set) under another placement (or the same),
//! through a joint configuration: a new safekeeper catches up first, then
//! the joint configuration (a quorum of both the old and the new rule for
//! every election and commit), then the new rule alone. A change
//! interrupted half-way is resumed by running it again: the generations
//! say where it stopped. Used by `strata safekeeper replace` and `strata
//! branch placement`.

use std::time::Instant;

use strata_protocol::api::safekeeper::{CreateTimelineRequest, TimelineStatus};
use strata_protocol::safekeeper::{Member, Membership, Placement, TimelineIdentity};
use strata_protocol::{NodeId, TenantId, TimelineId};
use strata_safekeeper::config::SafekeeperConfig;

use super::error::{failed, Error, Result};
use super::http;
use super::layout::{read_toml, Kind, Service, Workdir};
use super::report::{ChangeEvent, Progress};
use crate::limits::{
    CATCH_UP_REPORT_INTERVAL, CATCH_UP_TIMEOUT, INSTALL_PATIENCE, JOINT_TIMEOUT, PROPOSER_WAIT, QUICK, RECONFIGURE_POLL,
};

/// One safekeeper as the change sees it.
#[derive(Clone, Debug)]
pub(super) struct Node {
    pub name: String,
    pub member: Member,
    /// Base URL of its HTTP API.
    pub http: String,
}

/// The change of one timeline from `old` to `new` (the same minus OLD
/// plus NEW, or the same set), and to `placement` (none: the placement
/// stays).
pub(super) struct Change<'a> {
    pub tenant: TenantId,
    pub timeline: TimelineId,
    pub old: &'a [Node],
    pub new: &'a [Node],
    pub placement: Option<Placement>,
}

fn tl_url(n: &Node, t: TenantId, l: TimelineId) -> String {
    format!("{}/v1/tenant/{t}/timeline/{l}", n.http)
}

impl Change<'_> {
    /// Every safekeeper of either set, once.
    fn everyone(&self) -> Vec<&Node> {
        let mut all: Vec<&Node> = self.old.iter().collect();
        all.extend(self.new.iter().filter(|n| !self.old.iter().any(|o| o.member.id == n.member.id)));
        all
    }

    fn state(&self, n: &Node) -> std::result::Result<TimelineStatus, String> {
        let r = http::get(&tl_url(n, self.tenant, self.timeline), QUICK)?;
        if r.status != 200 {
            return Err(format!("HTTP {}: {}", r.status, r.error_text()));
        }
        r.json().map_err(|e| format!("its timeline status: {e}"))
    }

    fn membership(&self, n: &Node) -> std::result::Result<Membership, String> {
        let r = http::get(&format!("{}/membership", tl_url(n, self.tenant, self.timeline)), QUICK)?;
        if r.status != 200 {
            return Err(format!("HTTP {}: {}", r.status, r.error_text()));
        }
        r.json().map_err(|e| format!("its membership: {e}"))
    }

    /// Installs `m` on every reachable node of `on`; succeeds once a
    /// quorum of `need` holds it (or a later generation refused it — then
    /// someone else moved on, and that is an error). A quorum of the
    /// configuration being left is what keeps its proposers from being
    /// elected or committing any more. A member that is briefly away (a
    /// restart, a timeline healing after a disk error, a partition) is
    /// asked again for up to `INSTALL_PATIENCE`: the change goes on while
    /// writes do, and such hiccups come with them.
    fn install(&self, m: &Membership, on: &[&Node], need: &Membership, progress: &mut dyn Progress) -> Result<()> {
        let body = serde_json::to_value(m).expect("a membership serializes");
        let mut holding = Vec::new();
        let started = Instant::now();
        loop {
            let mut problems = Vec::new();
            let asked: Vec<&&Node> = on.iter().filter(|n| !holding.contains(&n.member.id)).collect();
            for n in asked {
                let url = format!("{}/membership", tl_url(n, self.tenant, self.timeline));
                match http::put(&url, &body, QUICK) {
                    Ok(r) if r.status == 200 => holding.push(n.member.id),
                    Ok(r) if r.status == 409 => {
                        return failed(format!(
                            "timeline {}: {} refused generation {}: {}",
                            self.timeline,
                            n.name,
                            m.generation,
                            r.error_text()
                        ))
                    }
                    Ok(r) => problems.push(format!("{}: HTTP {}: {}", n.name, r.status, r.error_text())),
                    Err(e) => problems.push(format!("{}: {e}", n.name)),
                }
            }
            if need.has_quorum(&holding) {
                for p in problems {
                    progress.tell(ChangeEvent::NotReached(p));
                }
                return Ok(());
            }
            if started.elapsed() >= INSTALL_PATIENCE {
                return failed(format!(
                    "timeline {}: generation {} reached safekeepers {:?}, not a quorum of {:?} ({}), in {:?}: {}",
                    self.timeline,
                    m.generation,
                    holding.iter().map(|id| id.0).collect::<Vec<_>>(),
                    need.all().iter().map(|m| m.id.0).collect::<Vec<_>>(),
                    need.placement.policy(),
                    INSTALL_PATIENCE,
                    problems.join("; ")
                ));
            }
            std::thread::sleep(RECONFIGURE_POLL * 5);
        }
    }

    /// The highest-generation configuration any reachable node holds.
    fn current(&self) -> Result<Membership> {
        let mut best: Option<Membership> = None;
        for n in self.everyone() {
            if let Ok(m) = self.membership(n) {
                if best.as_ref().is_none_or(|b| m.generation > b.generation) {
                    best = Some(m);
                }
            }
        }
        best.ok_or_else(|| Error::Failed(format!("timeline {}: no safekeeper answered", self.timeline)))
    }

    /// The first configuration of a timeline no proposer was elected on
    /// (`placement` over `new`), installed on every node that answers and
    /// enough once they make a quorum of it: a site failover's new timeline
    /// while the other site is gone. Nodes that return later get the
    /// configuration the others hold by running this again (a node already
    /// holding a generation is left as it is).
    pub fn first_on_reachable(&self, progress: &mut dyn Progress) -> Result<()> {
        // Each node's configuration, read once (those that answer).
        let held: Vec<(&Node, Membership)> =
            self.everyone().into_iter().filter_map(|n| self.membership(n).ok().map(|m| (n, m))).collect();
        let Some(newest) = held.iter().map(|(_, m)| m).max_by_key(|m| m.generation).cloned() else {
            return failed(format!("timeline {}: no safekeeper answered", self.timeline));
        };
        let target = if newest.generation == 0 {
            if held.iter().any(|(n, _)| self.state(n).is_ok_and(|s| !s.term_history.0.is_empty())) {
                return failed(format!("timeline {}: a proposer was elected before any configuration", self.timeline));
            }
            let members = self.new.iter().map(|n| n.member.clone()).collect();
            Membership::of(1, members, self.placement.clone().unwrap_or(Placement::Majority))
        } else {
            newest
        };
        let lacking: Vec<&str> =
            held.iter().filter(|(_, m)| m.generation < target.generation).map(|(n, _)| n.name.as_str()).collect();
        if lacking.is_empty() {
            return Ok(());
        }
        // Installing the configuration a node holds already changes nothing there.
        let reachable: Vec<&Node> = held.iter().map(|(n, _)| *n).collect();
        self.install(&target, &reachable, &target, progress)?;
        progress.tell(ChangeEvent::GenerationOn {
            timeline: self.timeline,
            generation: target.generation,
            policy: target.placement.policy().to_string(),
            on: lacking.iter().map(|n| n.to_string()).collect(),
        });
        Ok(())
    }

    /// Runs the change (or resumes it where an earlier run stopped).
    pub fn run(&self, progress: &mut dyn Progress) -> Result<()> {
        debug_assert!(!self.old.is_empty() && !self.new.is_empty(), "a change needs both sets");
        let members = |set: &[Node]| set.iter().map(|n| n.member.clone()).collect::<Vec<_>>();
        let same = |a: &[Member], b: &[Node]| {
            let mut x: Vec<u64> = a.iter().map(|m| m.id.0).collect();
            let mut y: Vec<u64> = b.iter().map(|n| n.member.id.0).collect();
            x.sort_unstable();
            y.sort_unstable();
            x == y
        };
        let everyone = self.everyone();
        let mut current = self.current()?;
        if current.generation == 0 {
            let fresh = self.old.iter().all(|n| self.state(n).is_ok_and(|s| s.term_history.0.is_empty()));
            if fresh && self.new.iter().all(|n| self.old.iter().any(|o| o.member.id == n.member.id)) {
                // No proposer was ever elected: nothing is committed, and the
                // target configuration can be the first one.
                let first = Membership::of(1, members(self.new), self.placement.clone().unwrap_or(Placement::Majority));
                let configured = Membership::of(1, members(self.old), Placement::Majority);
                self.install(&first, &everyone, &configured, progress)?;
                progress.tell(ChangeEvent::FirstWithoutWal { policy: first.placement.policy().into() });
                return Ok(());
            }
            // The configured set becomes generation 1, so that a new
            // safekeeper can be told it is not a member yet.
            let first = Membership::of(1, members(self.old), Placement::Majority);
            self.install(&first, &everyone[..self.old.len()], &first, progress)?;
            progress.tell(ChangeEvent::FirstIsCurrent);
            current = first;
        }
        let placement = self.placement.clone().unwrap_or_else(|| current.target().1);
        if !current.is_joint() && same(&current.members, self.new) && current.placement == placement {
            progress
                .tell(ChangeEvent::AlreadyDone { generation: current.generation, policy: placement.policy().into() });
            return Ok(());
        }
        if !current.is_joint() {
            if !same(&current.members, self.old) {
                return failed(format!(
                    "timeline {}: generation {} has members {:?}, not the cluster's safekeepers",
                    self.timeline,
                    current.generation,
                    current.members.iter().map(|m| m.id.0).collect::<Vec<_>>()
                ));
            }
            for n in self.new.iter().filter(|n| !current.is_member(n.member.id)) {
                self.create_on_new(n, &current, progress)?;
                self.catch_up(n, progress)?;
            }
            let joint = Membership {
                generation: current.generation + 1,
                members: current.members.clone(),
                new_members: (!same(&current.members, self.new)).then(|| members(self.new)),
                placement: current.placement.clone(),
                new_placement: (current.placement != placement).then(|| placement.clone()),
            };
            debug_assert!(joint.is_joint() && joint.generation == current.generation + 1);
            self.install(&joint, &everyone, &current, progress)?;
            progress.tell(ChangeEvent::Joint { generation: joint.generation });
            current = joint;
        } else {
            let (set, target) = current.target();
            if !same(&set, self.new) || target != placement {
                return failed(format!(
                    "timeline {}: a change to another configuration is under way (generation {})",
                    self.timeline, current.generation
                ));
            }
        }
        // The one rule that keeps a change safe: the last configuration
        // only ever follows a joint one (a quorum of the old rule saw the
        // joint generation, so no proposer of the old can still commit).
        debug_assert!(current.is_joint(), "generation {} is not joint", current.generation);
        let last = Membership::of(current.generation + 1, members(self.new), placement);
        debug_assert!(!last.is_joint() && last.generation > current.generation);
        self.joint_committed(&current, &last, progress)?;
        self.install(&last, &everyone, &last, progress)?;
        progress.tell(ChangeEvent::Last { generation: last.generation, policy: last.placement.policy().into() });
        Ok(())
    }

    /// Creates the timeline on the new safekeeper with a member's identity
    /// and tells it the current configuration (it is no member: it neither
    /// votes nor accepts WAL from proposers, but recovers from its peers).
    fn create_on_new(&self, new_node: &Node, current: &Membership, progress: &mut dyn Progress) -> Result<()> {
        let mut source = None;
        for n in self.old.iter().filter(|n| n.member.id != new_node.member.id) {
            if let Ok(s) = self.state(n) {
                source = Some(s);
                break;
            }
        }
        let Some(s) = source else {
            return failed(format!("timeline {}: no member answered", self.timeline));
        };
        let body = CreateTimelineRequest {
            system_id: s.system_id,
            pg_version: s.pg_version,
            wal_segment_size: s.wal_segment_size,
            start_lsn: s.timeline_start_lsn,
        };
        let r = http::post(&tl_url(new_node, self.tenant, self.timeline), &body, QUICK)
            .map_err(|e| Error::Failed(format!("{}: {e}", new_node.name)))?;
        if r.status != 200 && r.status != 201 {
            return failed(format!(
                "{}: creating timeline {}: HTTP {}: {}",
                new_node.name,
                self.timeline,
                r.status,
                r.error_text()
            ));
        }
        self.install(
            current,
            &[new_node],
            &Membership::of(current.generation, vec![new_node.member.clone()], Placement::Majority),
            progress,
        )
    }

    /// Waits until the new safekeeper holds what the members had committed
    /// when the wait began (from its peers and object storage), so the
    /// joint phase, in which it counts, is short.
    fn catch_up(&self, new_node: &Node, progress: &mut dyn Progress) -> Result<()> {
        let target = self
            .old
            .iter()
            .filter_map(|n| self.state(n).ok())
            .map(|s| s.commit_lsn)
            .max()
            .ok_or_else(|| Error::Failed(format!("timeline {}: no member answered", self.timeline)))?;
        progress.tell(ChangeEvent::CatchingUp { safekeeper: new_node.name.clone(), target });
        let t = Instant::now();
        let mut told = Instant::now();
        loop {
            match self.state(new_node) {
                Ok(s) if s.flush_lsn >= target => {
                    let (safekeeper, seconds) = (new_node.name.clone(), t.elapsed().as_secs_f64());
                    progress.tell(ChangeEvent::CaughtUp { safekeeper, lsn: s.flush_lsn, seconds });
                    return Ok(());
                }
                Ok(s) if told.elapsed() > CATCH_UP_REPORT_INTERVAL => {
                    progress.tell(ChangeEvent::CatchUpAt {
                        safekeeper: new_node.name.clone(),
                        lsn: s.flush_lsn,
                        target,
                    });
                    told = Instant::now();
                }
                _ => {}
            }
            if t.elapsed() > CATCH_UP_TIMEOUT {
                return failed(format!(
                    "{} did not catch up to {target} within {}s (see its log)",
                    new_node.name,
                    CATCH_UP_TIMEOUT.as_secs()
                ));
            }
            std::thread::sleep(RECONFIGURE_POLL);
        }
    }

    /// Waits until a proposer of the joint generation was elected and a
    /// quorum of the new rule (`last`) holds its epoch start: then
    /// everything ever committed is on such a quorum (that proposer's
    /// voters included a quorum of the old rule, so its epoch start holds
    /// all that was committed before; what it commits is committed under
    /// both). A running compute is re-elected within a second; without
    /// one, this command elects a proposer itself.
    fn joint_committed(&self, joint: &Membership, last: &Membership, progress: &mut dyn Progress) -> Result<()> {
        let started = Instant::now();
        let mut elected_here = false;
        loop {
            let holding: Vec<NodeId> = self
                .new
                .iter()
                .filter(|n| {
                    // The status lists the history up to the flush LSN: the
                    // elected term is last once the epoch start is flushed.
                    self.state(n).is_ok_and(|s| {
                        s.elected_generation >= joint.generation
                            && s.term_history.0.last().is_some_and(|last| s.flush_lsn >= last.lsn)
                            && s.term_history.0.last().map(|l| l.term) == Some(s.elected_term)
                    })
                })
                .map(|n| n.member.id)
                .collect();
            if last.has_quorum(&holding) {
                progress.tell(ChangeEvent::JointHeld { seconds: started.elapsed().as_secs_f64() });
                return Ok(());
            }
            if !elected_here && started.elapsed() > PROPOSER_WAIT {
                progress.tell(ChangeEvent::Electing { generation: joint.generation });
                self.sync(joint, progress)?;
                elected_here = true;
            }
            if started.elapsed() > JOINT_TIMEOUT {
                return failed(format!(
                    "timeline {}: generation {} was not committed within {}s",
                    self.timeline,
                    joint.generation,
                    JOINT_TIMEOUT.as_secs()
                ));
            }
            std::thread::sleep(RECONFIGURE_POLL);
        }
    }

    /// Runs an election under `joint` and commits its epoch start (what
    /// `strata compute sync-safekeepers` does).
    fn sync(&self, joint: &Membership, progress: &mut dyn Progress) -> Result<()> {
        let s = self
            .old
            .iter()
            .find_map(|n| self.state(n).ok())
            .ok_or_else(|| Error::Failed(format!("timeline {}: no member answered", self.timeline)))?;
        let identity = TimelineIdentity {
            tenant_id: self.tenant,
            timeline_id: self.timeline,
            system_id: s.system_id,
            pg_version: s.pg_version,
            wal_segment_size: s.wal_segment_size,
        };
        let addresses = joint.all().into_iter().map(|m| m.address).collect();
        let mut cfg = strata_compute::proposer::ProposerConfig::new(addresses, identity);
        cfg.token = super::http::token();
        cfg.tls = super::http::tls();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::Failed(format!("a runtime: {e}")))?;
        let end = runtime
            .block_on(async {
                tokio::time::timeout(JOINT_TIMEOUT, strata_compute::proposer::sync_safekeepers(cfg)).await
            })
            .map_err(|_| Error::Failed("the election under the joint configuration timed out".into()))?
            .map_err(|e| Error::Failed(format!("the election under the joint configuration: {e}")))?;
        progress.tell(ChangeEvent::Elected { end });
        Ok(())
    }
}

/// A safekeeper as a member: its protocol address (as the operator's
/// machine reaches it) and its host's site.
pub(super) fn node_of(wd: &Workdir, s: &Service, id: NodeId) -> Node {
    let site = wd.cluster.host(&s.host).map(|h| h.site.clone());
    Node {
        name: s.name.clone(),
        member: Member { id, address: s.addr("listen").expect("checked on load"), site },
        http: s.http_url(),
    }
}

/// Every safekeeper of the cluster as a member.
pub(super) fn nodes(wd: &Workdir) -> Result<Vec<Node>> {
    wd.cluster
        .of_kind(Kind::Safekeeper)
        .map(|s| {
            let c: SafekeeperConfig = read_toml(&wd.config_path(s))?;
            Ok(node_of(wd, s, c.id))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::rc::Rc;

    use strata_formats::Lsn;

    use super::*;
    use crate::fakes::{FakeServices, FakeTimeline};
    use crate::http::with_transport;
    use crate::report::Event;

    /// Safekeeper `id` of the fakes: its API and protocol on one port.
    fn node(id: u64) -> Node {
        let port = 7000 + id;
        Node {
            name: format!("sk{id}"),
            member: Member { id: NodeId(id), address: format!("127.0.0.1:{port}"), site: None },
            http: format!("http://127.0.0.1:{port}"),
        }
    }

    /// Three safekeepers holding a timeline a writer has written, and a
    /// fourth, empty one; a compute runs (it is elected again under each
    /// new generation).
    fn cluster() -> (Rc<FakeServices>, TenantId, TimelineId, Vec<Node>) {
        let (tenant, timeline) = (TenantId::generate(), TimelineId::generate());
        let fake = Rc::new(FakeServices { tenant: Some(tenant), compute_running: true, ..Default::default() });
        let nodes: Vec<Node> = (1..=4).map(node).collect();
        for (i, n) in nodes.iter().enumerate() {
            fake.safekeeper(&n.http, |s| {
                if i < 3 {
                    s.timelines.insert(timeline, FakeTimeline::written(Lsn(0x0200_0000)));
                }
            });
        }
        (fake, tenant, timeline, nodes)
    }

    fn ids(m: &Membership) -> Vec<u64> {
        m.members.iter().map(|m| m.id.0).collect()
    }

    fn replace_3_by_4(fake: &Rc<FakeServices>, tenant: TenantId, timeline: TimelineId, nodes: &[Node]) -> Result<()> {
        replace_3_by_4_telling(fake, tenant, timeline, nodes, &mut Vec::new())
    }

    fn replace_3_by_4_telling(
        fake: &Rc<FakeServices>,
        tenant: TenantId,
        timeline: TimelineId,
        nodes: &[Node],
        events: &mut Vec<Event>,
    ) -> Result<()> {
        let (old, new) = (nodes[..3].to_vec(), vec![nodes[0].clone(), nodes[1].clone(), nodes[3].clone()]);
        let change = Change { tenant, timeline, old: &old, new: &new, placement: None };
        with_transport(fake.clone(), || change.run(events))
    }

    /// The events as the steps they are, without their numbers.
    fn steps(events: &[Event]) -> Vec<&'static str> {
        events
            .iter()
            .map(|e| match e {
                Event::Change(ChangeEvent::NotReached(_)) => "not reached",
                Event::Change(ChangeEvent::FirstIsCurrent) => "first is current",
                Event::Change(ChangeEvent::CatchingUp { .. }) => "catching up",
                Event::Change(ChangeEvent::CaughtUp { .. }) => "caught up",
                Event::Change(ChangeEvent::Joint { .. }) => "joint",
                Event::Change(ChangeEvent::JointHeld { .. }) => "joint held",
                Event::Change(ChangeEvent::Last { .. }) => "last",
                Event::Change(ChangeEvent::AlreadyDone { .. }) => "already done",
                other => panic!("unexpected event {other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_member_is_replaced_through_a_joint_configuration() {
        let (fake, tenant, timeline, nodes) = cluster();
        replace_3_by_4(&fake, tenant, timeline, &nodes).unwrap();
        for n in [&nodes[0], &nodes[1], &nodes[3]] {
            let m = fake.membership(&n.http, timeline).unwrap();
            assert_eq!((m.generation, ids(&m), m.is_joint()), (3, vec![1, 2, 4], false), "{}", n.name);
        }
        // The joint configuration came first, on every node, before the last one.
        let puts: Vec<String> = fake.calls.borrow().iter().filter(|c| c.starts_with("PUT")).cloned().collect();
        assert!(puts.len() >= 3 + 4 + 4, "{puts:?}");
        // Run again: nothing to do.
        let before = fake.calls.borrow().len();
        replace_3_by_4(&fake, tenant, timeline, &nodes).unwrap();
        assert!(
            fake.calls.borrow()[before..].iter().all(|c| !c.starts_with("PUT")),
            "a finished change changes nothing"
        );
    }

    #[test]
    fn a_dead_member_is_replaced_by_the_others() {
        let (fake, tenant, timeline, nodes) = cluster();
        fake.safekeeper(&nodes[2].http, |s| s.down = true);
        let mut events = Vec::new();
        replace_3_by_4_telling(&fake, tenant, timeline, &nodes, &mut events).unwrap();
        // Every step is told as it happens; the dead member each time it is not reached.
        assert_eq!(
            steps(&events),
            [
                "not reached",
                "first is current",
                "catching up",
                "caught up",
                "not reached",
                "joint",
                "joint held",
                "not reached",
                "last"
            ]
        );
        let lines: Vec<String> = events.iter().map(|e| e.to_string()).collect();
        assert!(lines[0].starts_with("  (not reached: sk3: "), "{lines:?}");
        assert_eq!(lines[1], "  generation 1: the current safekeepers");
        assert_eq!(lines[2], "  sk4 catching up to 0/2000000");
        assert_eq!(lines.last().unwrap(), "  generation 3: majority of the new set");
        let mut again = Vec::new();
        replace_3_by_4_telling(&fake, tenant, timeline, &nodes, &mut again).unwrap();
        assert_eq!(again.last().map(|e| e.to_string()).as_deref(), Some("  already done (generation 3, majority)"));
        assert_eq!(
            fake.membership(&nodes[3].http, timeline).map(|m| (m.generation, ids(&m))),
            Some((3, vec![1, 2, 4]))
        );
        assert_eq!(fake.membership(&nodes[2].http, timeline).unwrap().generation, 0, "the dead one was never reached");
    }

    #[test]
    fn an_unreachable_new_member_stops_the_change_before_the_joint_configuration() {
        let (fake, tenant, timeline, nodes) = cluster();
        fake.safekeeper(&nodes[3].http, |s| s.down = true);
        let mut events = Vec::new();
        let e = replace_3_by_4_telling(&fake, tenant, timeline, &nodes, &mut events).unwrap_err();
        assert!(e.to_string().contains("sk4"), "{e}");
        // What was done before the failure was told; nothing after it.
        assert_eq!(steps(&events), ["first is current"]);
        for n in &nodes[..3] {
            let m = fake.membership(&n.http, timeline).unwrap();
            assert_eq!((m.generation, ids(&m)), (1, vec![1, 2, 3]), "only the current set was recorded on {}", n.name);
        }
    }

    #[test]
    fn a_joint_configuration_without_a_quorum_of_the_old_fails_and_resumes_later() {
        let (fake, tenant, timeline, nodes) = cluster();
        // Two of the old members refuse generation 2 on: the joint
        // configuration cannot reach a quorum of the old rule.
        for n in &nodes[..2] {
            fake.safekeeper(&n.http, |s| s.refuse_membership = Some((2, 503)));
        }
        let e = replace_3_by_4(&fake, tenant, timeline, &nodes).unwrap_err();
        assert!(e.to_string().contains("not a quorum"), "{e}");
        let generations: Vec<u32> =
            nodes.iter().filter_map(|n| fake.membership(&n.http, timeline)).map(|m| m.generation).collect();
        assert!(generations.iter().all(|g| *g <= 2), "the last configuration went nowhere: {generations:?}");
        // The old rule still rules: a quorum of {1, 2, 3} holds generation 1.
        assert_eq!(fake.membership(&nodes[0].http, timeline).unwrap().generation, 1);
        // Once they accept again, running the change again completes it.
        for n in &nodes[..2] {
            fake.safekeeper(&n.http, |s| s.refuse_membership = None);
        }
        replace_3_by_4(&fake, tenant, timeline, &nodes).unwrap();
        let m = fake.membership(&nodes[0].http, timeline).unwrap();
        assert_eq!((m.generation, ids(&m), m.is_joint()), (3, vec![1, 2, 4], false));
    }
}
