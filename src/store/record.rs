//! placeholder (being written)
/// placeholder
#[derive(Debug, thiserror::Error)]
pub enum RecordError {}
