//! Unit tests of the registry: handles, snapshots, formats.

use super::*;

#[test]
fn counter_handles_are_shared_with_the_registry() {
    let m = Metrics::new();
    // A data plane built before a role change and one built after share the same counters.
    let (before, after) = (m.ha_counters(), m.ha_counters());
    before.sent_bytes.inc_by(5);
    before.closed("bad_ack").inc();
    after.sent_bytes.inc_by(3);
    m.pull_counters().record(false);
    let text = m.encode(Format::Prometheus);
    for line in [
        "hasync_ha_sent_bytes_total 8\n",
        "hasync_ha_connections_closed_total{reason=\"bad_ack\"} 1\n",
        "hasync_ha_connections_closed_total{reason=\"offset_deleted\"} 0\n",
        "hasync_metadata_pulls_total{outcome=\"failed\"} 1\n",
        "hasync_metadata_pulls_total{outcome=\"ok\"} 0\n",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    assert_eq!(after.closed("bad_ack").get(), 1);
}

fn snapshot() -> Snapshot {
    Snapshot {
        node_name: "n1".into(),
        role: Role::Master,
        epoch: 3,
        fenced: false,
        mode: ReplicationMode::Sync,
        sync_ack_replicas: 1,
        min_offset: 0,
        max_offset: 5000,
        flushed_offset: 4000,
        confirm_offset: 4500,
        in_sync_replicas: 1,
        replicas: vec![ReplicaGauges {
            address: "127.0.0.1:4000".into(),
            ack_offset: 4500,
            lag_bytes: 500,
            lag_millis: 1500,
            in_sync: true,
            identity: "data-dir 0a".into(),
            node_name: "b".into(),
        }],
        ha_connections: 2,
        master_link: None,
        metadata_pull: None,
        store: StoreGauges { data_fs_max_used_ratio: 0.9, ..StoreGauges::default() },
    }
}

#[test]
fn gauges_come_from_the_snapshot_and_per_replica_series_go_with_it() {
    let m = Metrics::new();
    let mut s = snapshot();
    let text = m.render(&s, Format::Prometheus);
    for line in [
        "hasync_role{role=\"master\"} 1\n",
        "hasync_role{role=\"slave\"} 0\n",
        "hasync_store_max_offset_bytes 5000\n",
        "hasync_replication_connected_replicas 1\n",
        "hasync_replica_in_sync{address=\"127.0.0.1:4000\"} 1\n",
        "hasync_replica_lag_seconds{address=\"127.0.0.1:4000\"} 1.5\n",
        "hasync_replica_info{address=\"127.0.0.1:4000\",identity=\"data-dir 0a\",node_name=\"b\"} 1\n",
        "hasync_ha_connections 2\n",
        "hasync_data_fs_used_ratio NaN\n",
        "hasync_data_fs_max_used_ratio 0.9\n",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    s.replicas.clear();
    s.role = Role::Slave;
    s.master_link = Some(LinkGauges {
        master: "m:10912".into(),
        connected: true,
        master_max_offset: Some(6000),
        last_frame_unix_ms: 0,
    });
    let text = m.render(&s, Format::Prometheus);
    assert!(!text.contains("hasync_replica_in_sync{"), "{text}");
    assert!(!text.contains("hasync_replica_info{"), "{text}");
    assert!(text.contains("hasync_master_link_up{master=\"m:10912\"} 1\n"), "{text}");
    assert!(text.contains("hasync_master_link_lag_bytes{master=\"m:10912\"} 1000\n"));
}

#[test]
fn accept_header_picks_the_format() {
    assert_eq!(Format::from_accept(None), Format::Prometheus);
    assert_eq!(Format::from_accept(Some("text/plain;version=0.0.4")), Format::Prometheus);
    assert_eq!(
        Format::from_accept(Some("application/openmetrics-text;version=1.0.0,*/*;q=0.1")),
        Format::OpenMetrics
    );
}

#[test]
fn put_and_flush_observations_are_encoded() {
    let m = Metrics::new();
    m.observe_put("sync", "PUT_OK", Duration::from_millis(3));
    m.observe_put("sync", "FLUSH_SLAVE_TIMEOUT", Duration::from_secs(5));
    m.observe_flush(Duration::from_micros(700));
    m.set_recovery_duration(Duration::from_millis(1500));
    let text = m.encode(Format::Prometheus);
    for line in [
        "hasync_puts_total{status=\"PUT_OK\"} 1\n",
        "hasync_puts_total{status=\"FLUSH_SLAVE_TIMEOUT\"} 1\n",
        "hasync_puts_total{status=\"SLAVE_NOT_AVAILABLE\"} 0\n",
        "hasync_put_duration_seconds_count{mode=\"sync\"} 2\n",
        "hasync_put_duration_seconds_count{mode=\"async\"} 0\n",
        "hasync_store_flush_duration_seconds_count 1\n",
        "hasync_store_recovery_duration_seconds 1.5\n",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
}
