//! Membership configurations of a timeline's safekeepers
//! (`docs/safekeeper-membership.md`): which acceptors count for elections
//! and commits, under a generation that only grows. A joint configuration
//! (old and new set together) needs a majority of each set.

use strata_formats::Lsn;

use super::election::{quorum, quorum_lsn};
use crate::ids::NodeId;

/// Most members in one set.
pub const MAX_MEMBERS: usize = 16;

/// One safekeeper of a configuration.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Member {
    pub id: NodeId,
    /// Its protocol address (`host:port`).
    pub address: String,
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
}

impl Membership {
    /// The sets whose majorities an election or a commit needs.
    pub fn sets(&self) -> impl Iterator<Item = &[Member]> {
        std::iter::once(&self.members[..]).chain(self.new_members.as_deref())
    }

    /// Whether `id` belongs to either set.
    pub fn is_member(&self, id: NodeId) -> bool {
        self.sets().any(|s| s.iter().any(|m| m.id == id))
    }

    /// Every member of either set, once each, in id order.
    pub fn all(&self) -> Vec<Member> {
        let mut all: Vec<Member> = self.sets().flatten().cloned().collect();
        all.sort_by_key(|m| m.id.0);
        all.dedup_by_key(|m| m.id);
        all
    }

    /// Whether `voters` hold a majority of every set.
    pub fn has_quorum(&self, voters: &[NodeId]) -> bool {
        self.sets().all(|set| set.iter().filter(|m| voters.contains(&m.id)).count() >= quorum(set.len()))
    }

    /// The highest LSN a majority of every set has flushed, from the flush
    /// LSNs of the acceptors that accepted the current term.
    pub fn quorum_lsn(&self, flushes: &[(NodeId, Lsn)]) -> Lsn {
        self.sets()
            .map(|set| {
                let in_set: Vec<Lsn> =
                    flushes.iter().filter(|(id, _)| set.iter().any(|m| m.id == *id)).map(|(_, l)| *l).collect();
                quorum_lsn(&in_set, set.len())
            })
            .min()
            .unwrap_or(Lsn::INVALID)
    }

    /// Checks a configuration from the network or a file.
    pub fn validate(&self) -> Result<(), String> {
        if self.generation == 0 {
            return if self.members.is_empty() && self.new_members.is_none() {
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
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ids: &[u64]) -> Vec<Member> {
        ids.iter().map(|&i| Member { id: NodeId(i), address: format!("sk{i}:5454") }).collect()
    }

    #[test]
    fn a_joint_configuration_needs_a_majority_of_each_set() {
        let old = Membership { generation: 1, members: set(&[1, 2, 3]), new_members: None };
        let joint = Membership { generation: 2, members: set(&[1, 2, 3]), new_members: Some(set(&[1, 2, 4])) };
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
            Membership { generation: 0, members: set(&[1]), new_members: None },
            Membership { generation: 1, members: vec![], new_members: None },
            Membership { generation: 1, members: set(&[1, 1, 2]), new_members: None },
            Membership { generation: 1, members: set(&[1]), new_members: Some(vec![]) },
            Membership { generation: 1, members: set(&(1..=17).collect::<Vec<_>>()), new_members: None },
            Membership {
                generation: 1,
                members: vec![Member { id: NodeId(1), address: String::new() }],
                new_members: None,
            },
        ];
        for m in bad {
            assert!(m.validate().is_err(), "{m:?}");
        }
    }
}
