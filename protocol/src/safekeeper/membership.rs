//! Membership configurations of a timeline's safekeepers
//! (`docs/safekeeper-membership.md`): which acceptors count for elections
//! and commits, under a generation that only grows. A joint configuration
//! (old and new set together, or the same set under an old and a new
//! placement) needs a quorum of each.
//!
//! The placement (`docs/sites.md`) decides what a quorum is: a majority of
//! the set; a majority of the home site's members (`local-quorum`, the
//! others are asynchronous); or a majority that spans at least two sites
//! for commits (`stretched`).

use strata_formats::Lsn;

use super::quorum::{quorum, quorum_lsn};
use crate::ids::NodeId;

/// `max_async_lag` of a `local-quorum` placement unless told otherwise.
pub use crate::limits::DEFAULT_MAX_ASYNC_LAG;
use crate::limits::{MAX_MEMBERS, MAX_SITE_LEN};

/// One safekeeper of a configuration.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Member {
    pub id: NodeId,
    /// Its protocol address (`host:port`).
    pub address: String,
    /// Its site (data centre); placements other than `majority` need it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site: Option<String>,
}

impl Member {
    /// A member with no site.
    pub fn new(id: NodeId, address: impl Into<String>) -> Member {
        Member { id, address: address.into(), site: None }
    }

    fn in_site(&self, site: &str) -> bool {
        self.site.as_deref() == Some(site)
    }
}

/// What a `local-quorum` placement does with an asynchronous member that
/// falls more than `max_async_lag` behind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnAsyncLag {
    /// Stop holding WAL for it: it catches up from its peers later, and
    /// the home site never waits for it.
    #[default]
    FallBehind,
    /// Hold commits until it is within the bound again.
    Throttle,
}

impl OnAsyncLag {
    pub fn as_str(self) -> &'static str {
        match self {
            OnAsyncLag::FallBehind => "fall-behind",
            OnAsyncLag::Throttle => "throttle",
        }
    }
}

/// How a configuration's set decides elections and commits.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "policy", rename_all = "kebab-case")]
pub enum Placement {
    /// A majority of the set, wherever its members are.
    #[default]
    Majority,
    /// A majority of the members in `home`; the others are asynchronous.
    LocalQuorum {
        home: String,
        /// Bytes an asynchronous member may lag behind the WAL received.
        #[serde(default = "default_max_async_lag")]
        max_async_lag: u64,
        #[serde(default)]
        on_async_lag: OnAsyncLag,
    },
    /// Elections need a majority; a commit needs a majority that spans at
    /// least two sites.
    Stretched,
}

fn default_max_async_lag() -> u64 {
    DEFAULT_MAX_ASYNC_LAG
}

impl Placement {
    /// Its policy's name, as `strata branch placement` takes it.
    pub fn policy(&self) -> &'static str {
        match self {
            Placement::Majority => "majority",
            Placement::LocalQuorum { .. } => "local-quorum",
            Placement::Stretched => "stretched",
        }
    }

    pub fn is_majority(&self) -> bool {
        *self == Placement::Majority
    }

    /// Whether `m` counts in elections and commits of `set` under it.
    fn is_voter(&self, m: &Member) -> bool {
        match self {
            Placement::LocalQuorum { home, .. } => m.in_site(home),
            Placement::Majority | Placement::Stretched => true,
        }
    }

    /// Whether `ids` are enough to elect in `set`.
    fn elects(&self, set: &[Member], ids: &[NodeId]) -> bool {
        let voters: Vec<&Member> = set.iter().filter(|m| self.is_voter(m)).collect();
        let present = voters.iter().filter(|m| ids.contains(&m.id)).count();
        !voters.is_empty() && present >= quorum(voters.len())
    }

    /// The highest LSN whose holders commit it in `set`.
    fn commit_lsn(&self, set: &[Member], flushes: &[(NodeId, Lsn)]) -> Lsn {
        let flush_of = |m: &Member| flushes.iter().find(|(id, _)| *id == m.id).map(|(_, l)| *l);
        match self {
            Placement::Majority | Placement::LocalQuorum { .. } => {
                let voters: Vec<&Member> = set.iter().filter(|m| self.is_voter(m)).collect();
                let held: Vec<Lsn> = voters.iter().filter_map(|m| flush_of(m)).collect();
                if voters.is_empty() {
                    return Lsn::INVALID;
                }
                quorum_lsn(&held, voters.len())
            }
            Placement::Stretched => {
                // The highest flush LSN L such that the members holding L
                // are a majority and sit in at least two sites.
                let mut candidates: Vec<Lsn> = set.iter().filter_map(flush_of).collect();
                candidates.sort_unstable_by(|a, b| b.cmp(a));
                candidates.dedup();
                for l in candidates {
                    let holders: Vec<&Member> = set.iter().filter(|m| flush_of(m).is_some_and(|f| f >= l)).collect();
                    let mut sites: Vec<&str> = holders.iter().filter_map(|m| m.site.as_deref()).collect();
                    sites.sort_unstable();
                    sites.dedup();
                    if holders.len() >= quorum(set.len()) && sites.len() >= 2 {
                        return l;
                    }
                }
                Lsn::INVALID
            }
        }
    }

    fn validate(&self, set: &[Member]) -> Result<(), String> {
        match self {
            Placement::Majority => Ok(()),
            Placement::LocalQuorum { home, max_async_lag, .. } => {
                check_site(home)?;
                if *max_async_lag == 0 {
                    return Err("local-quorum: max_async_lag must be above 0".into());
                }
                if !set.iter().any(|m| m.in_site(home)) {
                    return Err(format!("local-quorum: no member in the home site {home:?}"));
                }
                Ok(())
            }
            Placement::Stretched => {
                if let Some(m) = set.iter().find(|m| m.site.is_none()) {
                    return Err(format!("stretched: member {} has no site", m.id));
                }
                let mut sites: Vec<&str> = set.iter().filter_map(|m| m.site.as_deref()).collect();
                sites.sort_unstable();
                sites.dedup();
                if sites.len() < 2 {
                    return Err(format!(
                        "stretched: the members sit in {} site(s), at least 2 are needed",
                        sites.len()
                    ));
                }
                Ok(())
            }
        }
    }
}

/// Checks a site's name: 1 to [`MAX_SITE_LEN`] letters, digits, `-`, `_` or `.`.
pub fn check_site(site: &str) -> Result<(), String> {
    let ok = !site.is_empty()
        && site.len() <= MAX_SITE_LEN
        && site.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(format!("{site:?} is not a site name (1 to {MAX_SITE_LEN} letters, digits, '-', '_' or '.')"))
    }
}

/// A timeline's membership configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Membership {
    /// 0: unset (the set the proposer was configured with).
    pub generation: u32,
    pub members: Vec<Member>,
    /// Set while the configuration is joint: the set being moved to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_members: Option<Vec<Member>>,
    /// How `members` decide.
    #[serde(default, skip_serializing_if = "Placement::is_majority")]
    pub placement: Placement,
    /// Set while the configuration is joint: the placement being moved to
    /// (of `new_members`, or of `members` if the set stays).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_placement: Option<Placement>,
}

impl Membership {
    /// A configuration of one set under a placement.
    pub fn of(generation: u32, members: Vec<Member>, placement: Placement) -> Membership {
        Membership { generation, members, new_members: None, placement, new_placement: None }
    }

    /// Whether the configuration is joint (a new set or a new placement).
    pub fn is_joint(&self) -> bool {
        self.new_members.is_some() || self.new_placement.is_some()
    }

    /// The (set, placement) pairs whose quorums an election or a commit needs.
    pub fn rules(&self) -> impl Iterator<Item = (&[Member], &Placement)> {
        let joint = self.is_joint().then(|| {
            (
                self.new_members.as_deref().unwrap_or(&self.members[..]),
                self.new_placement.as_ref().unwrap_or(&self.placement),
            )
        });
        std::iter::once((&self.members[..], &self.placement)).chain(joint)
    }

    /// The sets of the configuration (one, or two while joint).
    pub fn sets(&self) -> impl Iterator<Item = &[Member]> {
        std::iter::once(&self.members[..]).chain(self.new_members.as_deref())
    }

    /// The configuration it ends in: the new set under the new placement.
    pub fn target(&self) -> (Vec<Member>, Placement) {
        let (set, placement) = self.rules().last().expect("one rule at least");
        (set.to_vec(), placement.clone())
    }

    /// Whether `id` belongs to either set.
    pub fn is_member(&self, id: NodeId) -> bool {
        self.sets().any(|s| s.iter().any(|m| m.id == id))
    }

    /// Whether `id` counts in some rule's elections and commits (a member
    /// that is asynchronous under every rule does not).
    pub fn is_voter(&self, id: NodeId) -> bool {
        self.rules().any(|(set, p)| set.iter().any(|m| m.id == id && p.is_voter(m)))
    }

    /// Every member of either set, once each, in id order.
    pub fn all(&self) -> Vec<Member> {
        let mut all: Vec<Member> = self.sets().flatten().cloned().collect();
        all.sort_by_key(|m| m.id.0);
        all.dedup_by_key(|m| m.id);
        all
    }

    /// Whether `voters` can elect a proposer: a quorum under every rule.
    pub fn has_quorum(&self, voters: &[NodeId]) -> bool {
        self.rules().all(|(set, p)| p.elects(set, voters))
    }

    /// The highest LSN committed under every rule, from the flush LSNs of
    /// the acceptors that accepted the current term.
    pub fn quorum_lsn(&self, flushes: &[(NodeId, Lsn)]) -> Lsn {
        self.rules().map(|(set, p)| p.commit_lsn(set, flushes)).min().unwrap_or(Lsn::INVALID)
    }

    /// The bound on asynchronous members and what to do past it, if a
    /// `local-quorum` placement is in force.
    pub fn async_rule(&self) -> Option<(u64, OnAsyncLag)> {
        self.rules().find_map(|(_, p)| match p {
            Placement::LocalQuorum { max_async_lag, on_async_lag, .. } => Some((*max_async_lag, *on_async_lag)),
            _ => None,
        })
    }

    /// Checks a configuration from the network or a file.
    pub fn validate(&self) -> Result<(), String> {
        if self.generation == 0 {
            return if self.members.is_empty() && !self.is_joint() && self.placement.is_majority() {
                Ok(())
            } else {
                Err("generation 0 has no members (it stands for the proposer's configured set)".into())
            };
        }
        for set in self.sets() {
            if set.is_empty() || set.len() > MAX_MEMBERS {
                return Err(format!("a set of {} members (1 to {MAX_MEMBERS})", set.len()));
            }
            let mut ids: Vec<u64> = set.iter().map(|m| m.id.0).collect();
            ids.sort_unstable();
            if ids.windows(2).any(|w| w[0] == w[1]) {
                return Err(format!("node ids repeat in a set: {ids:?}"));
            }
            if let Some(m) = set.iter().find(|m| m.address.is_empty()) {
                return Err(format!("member {} has no address", m.id));
            }
            if let Some(site) = set.iter().find_map(|m| m.site.as_deref()) {
                check_site(site).map_err(|e| format!("a member's site: {e}"))?;
            }
        }
        for (set, p) in self.rules() {
            p.validate(set)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ids: &[u64]) -> Vec<Member> {
        ids.iter().map(|&i| Member::new(NodeId(i), format!("sk{i}:5454"))).collect()
    }

    #[test]
    fn a_joint_configuration_needs_a_majority_of_each_set() {
        let old = Membership::of(1, set(&[1, 2, 3]), Placement::Majority);
        let joint = Membership {
            generation: 2,
            members: set(&[1, 2, 3]),
            new_members: Some(set(&[1, 2, 4])),
            ..Default::default()
        };
        let ids = |v: &[u64]| v.iter().map(|&i| NodeId(i)).collect::<Vec<_>>();
        assert!(old.has_quorum(&ids(&[1, 3])));
        assert!(joint.has_quorum(&ids(&[1, 2])), "two shared members are a majority of both");
        assert!(!joint.has_quorum(&ids(&[1, 3])), "not a majority of the new set");
        assert!(!joint.has_quorum(&ids(&[2, 4])), "not a majority of the old set");
        assert!(joint.has_quorum(&ids(&[1, 3, 4])));
        assert_eq!(joint.all().len(), 4);
        assert!(joint.is_member(NodeId(4)) && !old.is_member(NodeId(4)));

        // Commit: the lower of the two sets' quorum LSNs.
        let f = |v: &[(u64, u64)]| v.iter().map(|&(i, l)| (NodeId(i), Lsn(l))).collect::<Vec<_>>();
        assert_eq!(old.quorum_lsn(&f(&[(1, 10), (3, 8)])), Lsn(8));
        assert_eq!(joint.quorum_lsn(&f(&[(1, 10), (3, 8), (4, 2)])), Lsn(2), "the new set has only 1 and 4");
        assert_eq!(joint.quorum_lsn(&f(&[(1, 10), (2, 9), (3, 8), (4, 2)])), Lsn(9));
    }

    #[test]
    fn malformed_configurations_are_refused() {
        assert!(Membership::default().validate().is_ok());
        let bad = [
            Membership { generation: 0, members: set(&[1]), new_members: None, ..Default::default() },
            Membership { generation: 1, members: vec![], new_members: None, ..Default::default() },
            Membership { generation: 1, members: set(&[1, 1, 2]), new_members: None, ..Default::default() },
            Membership { generation: 1, members: set(&[1]), new_members: Some(vec![]), ..Default::default() },
            Membership {
                generation: 1,
                members: set(&(1..=17).collect::<Vec<_>>()),
                new_members: None,
                ..Default::default()
            },
            Membership { generation: 1, members: vec![Member::new(NodeId(1), "")], ..Default::default() },
        ];
        for m in bad {
            assert!(m.validate().is_err(), "{m:?}");
        }
    }

    fn sited(v: &[(u64, &str)]) -> Vec<Member> {
        v.iter()
            .map(|&(i, s)| Member { site: Some(s.into()), ..Member::new(NodeId(i), format!("sk{i}:5454")) })
            .collect()
    }

    fn ids(v: &[u64]) -> Vec<NodeId> {
        v.iter().map(|&i| NodeId(i)).collect()
    }

    fn flushes(v: &[(u64, u64)]) -> Vec<(NodeId, Lsn)> {
        v.iter().map(|&(i, l)| (NodeId(i), Lsn(l))).collect()
    }

    fn local_quorum(home: &str) -> Placement {
        Placement::LocalQuorum { home: home.into(), max_async_lag: 1 << 20, on_async_lag: OnAsyncLag::FallBehind }
    }

    #[test]
    fn local_quorum_counts_only_the_home_site() {
        let set = sited(&[(1, "dc1"), (2, "dc1"), (3, "dc2")]);
        let m = Membership::of(2, set, local_quorum("dc1"));
        m.validate().unwrap();
        assert!(m.has_quorum(&ids(&[1, 2])));
        assert!(!m.has_quorum(&ids(&[1, 3])), "a majority of the set, but not of the home site");
        assert!(m.is_voter(NodeId(1)) && !m.is_voter(NodeId(3)) && m.is_member(NodeId(3)));
        // dc2 being behind (or absent) never holds a commit back; dc1 being behind does.
        assert_eq!(m.quorum_lsn(&flushes(&[(1, 10), (2, 9)])), Lsn(9));
        assert_eq!(m.quorum_lsn(&flushes(&[(1, 10), (2, 9), (3, 1)])), Lsn(9));
        assert_eq!(m.quorum_lsn(&flushes(&[(1, 10), (3, 12)])), Lsn::INVALID);
        assert_eq!(m.async_rule(), Some((1 << 20, OnAsyncLag::FallBehind)));
        // Home dc2 with one member there: that member alone decides.
        let dc2 = Membership { placement: local_quorum("dc2"), ..m.clone() };
        assert!(dc2.has_quorum(&ids(&[3])));
        assert_eq!(dc2.quorum_lsn(&flushes(&[(1, 10), (2, 9), (3, 4)])), Lsn(4));
    }

    #[test]
    fn stretched_commits_need_two_sites() {
        let set = sited(&[(1, "dc1"), (2, "dc1"), (3, "dc2")]);
        let m = Membership::of(2, set, Placement::Stretched);
        m.validate().unwrap();
        // Elections: any majority.
        assert!(m.has_quorum(&ids(&[1, 2])) && m.has_quorum(&ids(&[2, 3])) && !m.has_quorum(&ids(&[3])));
        // A majority inside dc1 commits nothing on its own.
        assert_eq!(m.quorum_lsn(&flushes(&[(1, 10), (2, 9)])), Lsn::INVALID);
        assert_eq!(m.quorum_lsn(&flushes(&[(1, 10), (2, 9), (3, 4)])), Lsn(4));
        assert_eq!(m.quorum_lsn(&flushes(&[(1, 10), (2, 3), (3, 7)])), Lsn(7), "{{1, 3}} spans both sites");
        assert_eq!(m.quorum_lsn(&flushes(&[(1, 10), (3, 7)])), Lsn(7));
        // Five members, three in dc1: the best L held by a majority that includes dc2.
        let five = Membership::of(
            3,
            sited(&[(1, "dc1"), (2, "dc1"), (3, "dc1"), (4, "dc2"), (5, "dc2")]),
            Placement::Stretched,
        );
        assert_eq!(five.quorum_lsn(&flushes(&[(1, 50), (2, 40), (3, 30), (4, 20), (5, 10)])), Lsn(20));
        assert_eq!(five.quorum_lsn(&flushes(&[(1, 50), (2, 40), (3, 30)])), Lsn::INVALID);
    }

    #[test]
    fn a_placement_change_is_joint_and_needs_both_rules() {
        let set = sited(&[(1, "dc1"), (2, "dc1"), (3, "dc2")]);
        let m = Membership {
            generation: 3,
            members: set,
            new_members: None,
            placement: Placement::Majority,
            new_placement: Some(local_quorum("dc2")),
        };
        m.validate().unwrap();
        assert!(m.is_joint());
        assert!(!m.has_quorum(&ids(&[1, 2])), "no dc2 member: not a quorum of the new rule");
        assert!(!m.has_quorum(&ids(&[3])), "not a majority of the old rule");
        assert!(m.has_quorum(&ids(&[1, 3])));
        assert_eq!(m.quorum_lsn(&flushes(&[(1, 10), (2, 9), (3, 4)])), Lsn(4));
        assert_eq!(m.target().1, local_quorum("dc2"));
        // The JSON form: placements tagged by policy, omitted for majority.
        let json = serde_json::to_value(&m).unwrap();
        assert!(json.get("placement").is_none());
        assert_eq!(json["new_placement"]["policy"], "local-quorum");
        assert_eq!(json["new_placement"]["on_async_lag"], "fall-behind");
        assert_eq!(json["members"][2]["site"], "dc2");
        let back: Membership = serde_json::from_value(json).unwrap();
        assert_eq!(back, m);
        let lq: Placement = serde_json::from_str(r#"{"policy":"local-quorum","home":"dc1"}"#).unwrap();
        assert_eq!(
            lq,
            Placement::LocalQuorum {
                home: "dc1".into(),
                max_async_lag: DEFAULT_MAX_ASYNC_LAG,
                on_async_lag: OnAsyncLag::FallBehind
            }
        );
    }

    #[test]
    fn placements_the_members_cannot_satisfy_are_refused() {
        let three = sited(&[(1, "dc1"), (2, "dc1"), (3, "dc2")]);
        let bad = [
            Membership::of(1, three.clone(), local_quorum("dc3")),
            Membership::of(1, three.clone(), local_quorum("")),
            Membership::of(
                1,
                three.clone(),
                Placement::LocalQuorum { home: "dc1".into(), max_async_lag: 0, on_async_lag: OnAsyncLag::Throttle },
            ),
            Membership::of(1, sited(&[(1, "dc1"), (2, "dc1")]), Placement::Stretched),
            Membership::of(1, set(&[1, 2, 3]), Placement::Stretched),
            Membership::of(1, sited(&[(1, "dc 1")]), Placement::Majority),
            Membership { placement: Placement::Stretched, ..Default::default() },
        ];
        for m in bad {
            assert!(m.validate().is_err(), "{m:?}");
        }
    }
}
