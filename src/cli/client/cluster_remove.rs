//! `hasync cluster remove-group --group G`: removes a group from the cluster (RemoveGroup):
//! every record of the group deleted, refused while the group has a live member or a leader
//! key (the node names them).

use crate::cli::client::{Client, Connection, Failure};
use crate::control::pb;

/// Runs `hasync cluster remove-group`.
pub(crate) async fn remove_group(conn: &Connection, group: String) -> Result<(), Failure> {
    let client = Client::connect(conn).await?;
    let mut c = client.cluster();
    let req = pb::RemoveGroupRequest { group };
    let r = client.call("RemoveGroup", c.remove_group(req)).await?;
    println!("{}", removed_line(&r));
    Ok(())
}

fn removed_line(r: &pb::RemoveGroupResponse) -> String {
    let s = if r.removed_keys == 1 { "" } else { "s" };
    format!(
        "group {} removed: {} key{s} deleted at coordinator revision {}",
        r.group, r.removed_keys, r.revision
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_says_what_was_deleted() {
        let r = pb::RemoveGroupResponse { group: "g1".into(), removed_keys: 7, revision: 118 };
        assert_eq!(
            removed_line(&r),
            "group g1 removed: 7 keys deleted at coordinator revision 118"
        );
    }
}
