//! Where each record lives: `<prefix><cluster>/...`, the prefix ending in `/`
//! (`coordinator.prefix`, default `/hasync/v1/`).
//!
//! ```text
//! <root>controller                      the active controller (campaign key, its lease)
//! <root>paused                          present: the whole cluster's controller is paused
//! <root>groups/<g>/state                the group's state record (GroupState), CAS only
//! <root>groups/<g>/leader               held by the master under its lease (LeaderRecord)
//! <root>groups/<g>/members/<name>       a member's record under its own lease (MemberRecord)
//! <root>groups/<g>/names/<name>         the claim of a name: the data-dir id, no lease
//! <root>groups/<g>/history/<epoch:020>  the decision that opened an epoch (HistoryRecord)
//! <root>groups/<g>/request              an operator's request (OperatorRequest), create-only
//! <root>groups/<g>/outcome              what became of the last request (RequestOutcome)
//! ```

/// The keys of one cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    root: String,
}

impl Keys {
    /// The keys of `cluster` under `prefix` (a `/` is added to a prefix that lacks one).
    pub fn new(prefix: &str, cluster: &str) -> Self {
        let mut root = prefix.to_owned();
        if !root.ends_with('/') {
            root.push('/');
        }
        root.push_str(cluster);
        root.push('/');
        Self { root }
    }

    /// Everything of the cluster.
    pub fn root(&self) -> &str {
        &self.root
    }

    /// The controller's campaign key.
    pub fn controller(&self) -> String {
        format!("{}controller", self.root)
    }

    /// Present while the cluster's controller is paused.
    pub fn paused(&self) -> String {
        format!("{}paused", self.root)
    }

    /// Every group's keys.
    pub fn groups(&self) -> String {
        format!("{}groups/", self.root)
    }

    /// Everything of one group.
    pub fn group(&self, group: &str) -> String {
        format!("{}groups/{group}/", self.root)
    }

    /// A group's state record.
    pub fn state(&self, group: &str) -> String {
        format!("{}state", self.group(group))
    }

    /// A group's leader key.
    pub fn leader(&self, group: &str) -> String {
        format!("{}leader", self.group(group))
    }

    /// A group's member records.
    pub fn members(&self, group: &str) -> String {
        format!("{}members/", self.group(group))
    }

    /// One member's record.
    pub fn member(&self, group: &str, name: &str) -> String {
        format!("{}members/{name}", self.group(group))
    }

    /// The claim of a member name.
    pub fn name_claim(&self, group: &str, name: &str) -> String {
        format!("{}names/{name}", self.group(group))
    }

    /// A group's history records.
    pub fn history(&self, group: &str) -> String {
        format!("{}history/", self.group(group))
    }

    /// The history record of one epoch (zero-padded so keys sort by epoch).
    pub fn history_of(&self, group: &str, epoch: u64) -> String {
        format!("{}history/{epoch:020}", self.group(group))
    }

    /// A group's pending operator request.
    pub fn request(&self, group: &str) -> String {
        format!("{}request", self.group(group))
    }

    /// The outcome of a group's last operator request.
    pub fn outcome(&self, group: &str) -> String {
        format!("{}outcome", self.group(group))
    }

    /// A group's pending change of V, k or the mode (rule B; the master's to make).
    pub fn change(&self, group: &str) -> String {
        format!("{}change", self.group(group))
    }

    /// The outcome of a group's last change request.
    pub fn change_outcome(&self, group: &str) -> String {
        format!("{}change-outcome", self.group(group))
    }

    /// The group a key under [`Keys::groups`] belongs to, and the rest of the key.
    pub fn split_group<'a>(&self, key: &'a str) -> Option<(&'a str, &'a str)> {
        let rest = key.strip_prefix(self.groups().as_str())?;
        rest.split_once('/')
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_nest_under_the_prefix_and_cluster_and_history_sorts_by_epoch() {
        let k = Keys::new("/hasync/v1", "c1");
        assert_eq!(k.state("g"), "/hasync/v1/c1/groups/g/state");
        assert_eq!(k.member("g", "n1"), "/hasync/v1/c1/groups/g/members/n1");
        assert!(k.history_of("g", 9) < k.history_of("g", 10));
        assert_eq!(k.split_group(&k.leader("g2")), Some(("g2", "leader")));
    }
}
