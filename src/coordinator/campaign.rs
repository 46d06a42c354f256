//! A campaign for a leader key, over any [`Coordinator`]: the key is created only when absent
//! (a create-only transaction), under the campaigner's lease, so the leader is whoever created
//! it and leadership ends when the lease does. The key's create revision is the fencing value
//! of a leadership: it only grows from one leader to the next, and [`Leadership::guard`] makes
//! a transaction run only while that leadership holds.

use super::{
    CmpOp, CmpTarget, Compare, Coordinator, Error, KeyValue, LeaseId, Op, Revision, Txn, WatchEvent,
};

/// A won campaign: the key, the lease it is held under and its create revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leadership {
    /// The campaign key.
    pub key: String,
    /// The value the leader wrote there.
    pub value: Vec<u8>,
    /// The lease the key is held under.
    pub lease: LeaseId,
    /// The key's create revision: this leadership's fencing value (a later leader's is higher).
    pub revision: Revision,
}

impl Leadership {
    /// A compare that holds only while this leadership does (the key still carries its create
    /// revision): add it to a transaction to fence it by the leadership.
    pub fn guard(&self) -> Compare {
        Compare {
            key: self.key.clone(),
            op: CmpOp::Equal,
            target: CmpTarget::CreateRevision(self.revision),
        }
    }

    /// Whether this leadership still holds (a linearizable read of the key).
    pub async fn holds(&self, coord: &dyn Coordinator) -> Result<bool, Error> {
        let (kv, _) = coord.get(&self.key).await?;
        Ok(kv.is_some_and(|kv| kv.create_revision == self.revision))
    }

    /// Gives the leadership up: deletes the key if it is still this leadership's (a later
    /// leader's key is left alone). The lease is the caller's: it is not revoked.
    pub async fn resign(&self, coord: &dyn Coordinator) -> Result<(), Error> {
        coord
            .txn(Txn {
                compares: vec![self.guard()],
                success: vec![Op::Delete { key: self.key.clone() }],
                failure: Vec::new(),
            })
            .await?;
        Ok(())
    }
}

/// Campaigns for `key`: returns once this campaigner holds it, with `value`, under `lease`.
/// While another holds it, waits (a watch of the key) until it is deleted, then tries again.
/// A key already held under `lease` (a retry after an answer that was lost) is taken as won.
/// Errors of the engine end the campaign (the caller retries, or gives up when its lease is
/// [`Error::LeaseNotFound`]); dropping the future stops it.
pub async fn campaign(
    coord: &dyn Coordinator,
    key: &str,
    value: &[u8],
    lease: LeaseId,
) -> Result<Leadership, Error> {
    loop {
        let resp = coord
            .txn(Txn {
                compares: vec![Compare {
                    key: key.to_owned(),
                    op: CmpOp::Equal,
                    target: CmpTarget::CreateRevision(0),
                }],
                success: vec![Op::Put {
                    key: key.to_owned(),
                    value: value.to_vec(),
                    lease: Some(lease),
                }],
                failure: vec![Op::Get { key: key.to_owned() }],
            })
            .await?;
        let won =
            |revision| Leadership { key: key.to_owned(), value: value.to_vec(), lease, revision };
        if resp.succeeded {
            return Ok(won(resp.revision));
        }
        let holder = resp.reads.first().and_then(|r| r.first());
        match holder {
            Some(kv) if kv.lease == lease => {
                return take_back(coord, kv, won(kv.create_revision)).await;
            }
            Some(_) => wait_for_delete(coord, key, resp.revision + 1).await?,
            // Deleted between the compare and the read: try again at once.
            None => {}
        }
    }
}

/// The key is already held under our lease: write our value there, if it still is ours.
async fn take_back(
    coord: &dyn Coordinator,
    held: &KeyValue,
    leadership: Leadership,
) -> Result<Leadership, Error> {
    if held.value != leadership.value {
        coord
            .txn(Txn {
                compares: vec![leadership.guard()],
                success: vec![Op::Put {
                    key: leadership.key.clone(),
                    value: leadership.value.clone(),
                    lease: Some(leadership.lease),
                }],
                failure: Vec::new(),
            })
            .await?;
    }
    Ok(leadership)
}

/// Waits until `key` is deleted at or after revision `from`; returns early (for a re-read)
/// when the watch ends without an error.
async fn wait_for_delete(coord: &dyn Coordinator, key: &str, from: Revision) -> Result<(), Error> {
    let mut watch = coord.watch(key, from).await?;
    while let Some(batch) = watch.recv().await {
        let deleted = batch?
            .events
            .iter()
            .any(|e| matches!(e, WatchEvent::Delete { key: k, .. } if k == key));
        if deleted {
            return Ok(());
        }
    }
    Ok(())
}

/// Who holds `key`: its value and create revision (the holder's fencing value), or None.
pub async fn leader(
    coord: &dyn Coordinator,
    key: &str,
) -> Result<Option<(Vec<u8>, Revision)>, Error> {
    let (kv, _) = coord.get(key).await?;
    Ok(kv.map(|kv| (kv.value, kv.create_revision)))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::coordinator::memory::MemoryCoordinator;

    const KEY: &str = "/hasync/v1/c1/controller";

    #[tokio::test(start_paused = true)]
    async fn the_second_campaigner_waits_until_the_first_resigns_and_then_leads_with_a_higher_revision()
     {
        let a = MemoryCoordinator::new();
        let b = a.new_client();
        let la = a.grant(Duration::from_secs(10)).await.unwrap();
        let lb = b.grant(Duration::from_secs(10)).await.unwrap();
        let first = campaign(&a, KEY, b"a", la.id).await.unwrap();
        assert_eq!(leader(&a, KEY).await.unwrap(), Some((b"a".to_vec(), first.revision)));
        let mut second = tokio::spawn({
            let b = b.clone();
            async move { campaign(&b, KEY, b"b", lb.id).await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!second.is_finished(), "b waits while a leads");
        // A campaign again with the same lease is the same leadership.
        assert_eq!(campaign(&a, KEY, b"a", la.id).await.unwrap(), first);
        first.resign(&a).await.unwrap();
        let won = tokio::time::timeout(Duration::from_secs(5), &mut second)
            .await
            .expect("b wins once a resigned")
            .unwrap()
            .unwrap();
        assert!(won.revision > first.revision);
        assert_eq!(leader(&b, KEY).await.unwrap(), Some((b"b".to_vec(), won.revision)));
        assert!(!first.holds(&a).await.unwrap());
        assert!(won.holds(&a).await.unwrap());
        // A stale resign leaves the new leader's key alone.
        first.resign(&a).await.unwrap();
        assert!(won.holds(&b).await.unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn the_leaders_lease_expiring_hands_over_and_fences_the_old_leaders_transactions() {
        let a = MemoryCoordinator::new();
        let b = a.new_client();
        let la = a.grant(Duration::from_secs(3)).await.unwrap();
        let lb = b.grant(Duration::from_secs(30)).await.unwrap();
        let first = campaign(&a, KEY, b"a", la.id).await.unwrap();
        // a is cut off: its keep-alives fail and its lease runs out.
        a.set_unavailable(true);
        let second = tokio::time::timeout(Duration::from_secs(10), campaign(&b, KEY, b"b", lb.id))
            .await
            .expect("b wins once a's lease expired")
            .unwrap();
        assert!(second.revision > first.revision);
        a.set_unavailable(false);
        let fenced = a
            .txn(Txn {
                compares: vec![first.guard()],
                success: vec![Op::Put { key: "/x".into(), value: b"a".to_vec(), lease: None }],
                failure: Vec::new(),
            })
            .await
            .unwrap();
        assert!(!fenced.succeeded, "the old leader's guarded write does not run");
        assert!(matches!(
            campaign(&a, KEY, b"a", la.id).await,
            Err(Error::LeaseNotFound(id)) if id == la.id
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_campaign_with_the_same_lease_rewrites_a_changed_value() {
        let c = MemoryCoordinator::new();
        let l = c.grant(Duration::from_secs(10)).await.unwrap();
        let first = campaign(&c, KEY, b"v1", l.id).await.unwrap();
        let again = campaign(&c, KEY, b"v2", l.id).await.unwrap();
        assert_eq!(again.revision, first.revision);
        assert_eq!(leader(&c, KEY).await.unwrap(), Some((b"v2".to_vec(), first.revision)));
    }
}
