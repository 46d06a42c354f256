//! The one rule for topic and subscription group names, upstream's (`TopicValidator`,
//! `Validators.checkGroup`): 1 to 127 characters (a group: 255) of `[A-Za-z0-9_%|-]`. Every
//! entry point checks it (Put, UpsertTopic, DeleteTopic, CommitConsumerOffset,
//! UpsertSubscriptionGroup, DeleteSubscriptionGroup (the deletes: for a name not held), the
//! CLI's put before sending); replication does not (a slave stores the master's bytes verbatim).

/// The longest topic name, in characters (upstream's `TOPIC_MAX_LENGTH`).
pub const TOPIC_MAX_LEN: usize = 127;
/// The longest subscription group name, in characters (upstream's `CHARACTER_MAX_LENGTH`).
pub const GROUP_MAX_LEN: usize = 255;

/// The rule, as refusals state it.
const ALLOWED: &str = "letters, digits, _ - % |";

/// A name that breaks the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {name}: {why}; a {what} name is 1 to {max} characters of {ALLOWED}")]
pub struct NameError {
    /// "topic" or "subscription group".
    pub what: &'static str,
    /// The name, escaped (quoted, control characters and non-ASCII as escapes).
    pub name: String,
    /// What is wrong with it.
    pub why: String,
    /// The length limit that applies.
    pub max: usize,
}

/// Whether `c` may appear in a topic or group name.
fn allowed(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '%' | '|')
}

fn check(what: &'static str, name: &str, max: usize) -> Result<(), NameError> {
    let fail = |why: String| {
        // At most 200 characters of the name are echoed back.
        let shown: String = name.chars().take(200).collect();
        let name = format!(
            "\"{}\"{}",
            shown.escape_default(),
            if shown.len() < name.len() { "..." } else { "" }
        );
        Err(NameError { what, name, why, max })
    };
    if name.is_empty() {
        return fail("it is empty".into());
    }
    let len = name.chars().count();
    if len > max {
        return fail(format!("{len} characters"));
    }
    if let Some(c) = name.chars().find(|c| !allowed(*c)) {
        return fail(format!("it holds '{}'", c.escape_default()));
    }
    Ok(())
}

/// Checks a topic name against the rule.
pub fn check_topic(name: &str) -> Result<(), NameError> {
    check("topic", name, TOPIC_MAX_LEN)
}

/// Checks a subscription group name against the rule.
pub fn check_group(name: &str) -> Result<(), NameError> {
    check("subscription group", name, GROUP_MAX_LEN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_is_upstreams() {
        for ok in ["TopicA", "a", "%RETRY%G|x-y_z", &"t".repeat(TOPIC_MAX_LEN)] {
            assert_eq!(check_topic(ok), Ok(()), "{ok}");
        }
        assert!(check_group(&"g".repeat(GROUP_MAX_LEN)).is_ok());
        assert!(check_group(&"g".repeat(GROUP_MAX_LEN + 1)).is_err());
        for bad in ["", "a b/../c", "a\u{1}b", "tea\u{1F375}", "a.b", &"t".repeat(128)] {
            let e = check_topic(bad).unwrap_err();
            let text = e.to_string();
            assert!(text.contains("1 to 127 characters of letters, digits, _ - % |"), "{text}");
            assert!(!text.chars().any(|c| c.is_control() || !c.is_ascii()), "escaped: {text}");
        }
        let e = check_topic("a b/../c").unwrap_err().to_string();
        assert!(e.starts_with("invalid topic \"a b/../c\": it holds ' '"), "{e}");
        let e = check_topic("a\u{1}b").unwrap_err().to_string();
        assert!(e.contains("\"a\\u{1}b\""), "{e}");
    }
}
