//! `hasync metadata` (Get: every table) and `hasync topic create|delete|list`; the writes
//! follow a slave's refusal to the master it names, once (unless `--no-follow`).

use clap::{Args, Subcommand};

use crate::cli::client::{Client, Connection, Failure, block_on};
use crate::control::pb;

/// Arguments of `hasync metadata`.
#[derive(Debug, Clone, Args)]
pub struct MetadataArgs {
    /// Print JSON instead of a summary.
    #[arg(long)]
    pub(crate) json: bool,
    /// Where the node is and how to authenticate.
    #[command(flatten)]
    pub(crate) conn: Connection,
}

/// `hasync topic ...`
#[derive(Debug, Clone, Subcommand)]
pub enum TopicCommand {
    /// Create or update a topic (UpsertTopic on the master).
    Create {
        /// Topic name.
        name: String,
        /// Read and write queues.
        #[arg(long, default_value_t = 8)]
        queues: u32,
        /// Permission: 2 write, 4 read, 6 both.
        #[arg(long, default_value_t = 6)]
        perm: u32,
        /// An ordered topic.
        #[arg(long)]
        order: bool,
        /// Do not follow a slave's refusal to the master it names.
        #[arg(long)]
        no_follow: bool,
        /// Where the node is and how to authenticate.
        #[command(flatten)]
        conn: Connection,
    },
    /// Delete a topic (DeleteTopic on the master).
    Delete {
        /// Topic name.
        name: String,
        /// Do not follow a slave's refusal to the master it names.
        #[arg(long)]
        no_follow: bool,
        /// Where the node is and how to authenticate.
        #[command(flatten)]
        conn: Connection,
    },
    /// List the topics (from any node).
    List {
        /// Where the node is and how to authenticate.
        #[command(flatten)]
        conn: Connection,
    },
}

async fn all_chunks(
    client: &Client,
    table: pb::MetadataTable,
) -> Result<Vec<pb::MetadataChunk>, Failure> {
    let mut m = client.metadata();
    let mut stream =
        client.call("Metadata.Get", m.get(pb::GetMetadataRequest { table: table as i32 })).await?;
    let mut out = Vec::new();
    while let Some(c) = stream.message().await.map_err(|s| client.failure("Metadata.Get", &s))? {
        out.push(c);
    }
    Ok(out)
}

fn version(v: Option<&pb::DataVersion>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{}@{}", v.counter, v.timestamp_unix_ms))
}

/// Runs `hasync metadata`.
pub(crate) fn run(args: MetadataArgs) -> Result<(), Failure> {
    block_on(async move {
        let client = Client::connect(&args.conn).await?;
        let chunks = all_chunks(&client, pb::MetadataTable::Unspecified).await?;
        let mut topics = Vec::new();
        let mut offsets = Vec::new();
        let mut delay = Vec::new();
        let mut groups = Vec::new();
        let mut versions = std::collections::BTreeMap::new();
        for c in chunks {
            versions.insert(c.table().as_str_name().to_owned(), c.version);
            topics.extend(c.topics);
            offsets.extend(c.consumer_offsets);
            delay.extend(c.delay_offsets);
            groups.extend(c.subscription_groups);
        }
        if args.json {
            let v = serde_json::json!({
                "topics": topics.iter().map(|t| serde_json::json!({
                    "topic_name": t.topic_name, "read_queue_nums": t.read_queue_nums,
                    "write_queue_nums": t.write_queue_nums, "perm": t.perm,
                    "topic_filter_type": t.topic_filter_type, "order": t.order})).collect::<Vec<_>>(),
                "consumer_offsets": offsets.iter().map(|o| serde_json::json!({
                    "group": o.group, "topic": o.topic, "queue_id": o.queue_id, "offset": o.offset}))
                    .collect::<Vec<_>>(),
                "delay_offsets": delay.iter().map(|d| serde_json::json!({"level": d.level, "offset": d.offset}))
                    .collect::<Vec<_>>(),
                "subscription_groups": groups.iter().map(|g| serde_json::json!({
                    "group_name": g.group_name, "consume_enable": g.consume_enable,
                    "retry_max_times": g.retry_max_times})).collect::<Vec<_>>(),
                "versions": versions.iter().map(|(k, v)| (k.clone(), serde_json::json!(v.as_ref().map(|v| serde_json::json!({
                    "state_version": v.state_version, "timestamp_unix_ms": v.timestamp_unix_ms, "counter": v.counter}))))).collect::<serde_json::Map<_, _>>(),
            });
            println!("{v}");
            return Ok(());
        }
        for (table, v) in &versions {
            println!("{:<36} version {}", table, version(v.as_ref()));
        }
        println!(
            "{} topics, {} consumer offsets, {} delay offsets, {} subscription groups",
            topics.len(),
            offsets.len(),
            delay.len(),
            groups.len()
        );
        Ok(())
    })
}

/// Runs `hasync topic`.
pub(crate) fn topic(cmd: TopicCommand) -> Result<(), Failure> {
    block_on(async move {
        match cmd {
            TopicCommand::Create { name, queues, perm, order, no_follow, conn } => {
                let mut client = Client::connect(&conn).await?;
                let t = pb::TopicConfig {
                    topic_name: name.clone(),
                    read_queue_nums: queues,
                    write_queue_nums: queues,
                    perm,
                    topic_filter_type: "SINGLE_TAG".into(),
                    topic_sys_flag: 0,
                    order,
                };
                let upsert = |c: Client| {
                    let topic = Some(t.clone());
                    async move { c.metadata().upsert_topic(pb::UpsertTopicRequest { topic }).await }
                };
                let r = client.call_on_master("UpsertTopic", !no_follow, upsert).await?;
                println!(
                    "topic {name}: {queues} queues, perm {perm} (topics version {})",
                    version(r.version.as_ref())
                );
            }
            TopicCommand::Delete { name, no_follow, conn } => {
                let mut client = Client::connect(&conn).await?;
                let delete = |c: Client| {
                    let topic_name = name.clone();
                    let request = pb::DeleteTopicRequest { topic_name };
                    async move { c.metadata().delete_topic(request).await }
                };
                let r = client.call_on_master("DeleteTopic", !no_follow, delete).await?;
                println!("topic {name} deleted (topics version {})", version(r.version.as_ref()));
            }
            TopicCommand::List { conn } => {
                let client = Client::connect(&conn).await?;
                for c in all_chunks(&client, pb::MetadataTable::Topics).await? {
                    for t in c.topics {
                        println!(
                            "{:<40} read {:>4} write {:>4} perm {}{}",
                            t.topic_name,
                            t.read_queue_nums,
                            t.write_queue_nums,
                            t.perm,
                            if t.order { " ordered" } else { "" }
                        );
                    }
                }
            }
        }
        Ok(())
    })
}
