//! What a task may be. The coordinator checks a task here before it reserves anything: a
//! bad request gets a typed error and changes nothing.
//!
//! **Owns:** the task size limit, each runtime family's task grammar, and the digests of
//! what an operator supplies with a task (scope, holds, completion policy).
//!
//! **Never:** reads or stores anything; these are pure functions over the request.

use sha2::{Digest, Sha256};

use super::canonical::{encode, Value};

/// The largest task accepted, measured as its canonical JSON string encoding (what the
/// contract envelope carries): 128 KiB. Ordinary text encodes at about one byte per byte;
/// control characters cost up to six.
pub const MAX_TASK_BYTES: usize = 128 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TaskError {
    #[error("the task is empty")]
    Empty,
    #[error("the task encodes to {bytes} bytes; the limit is {max} bytes")]
    TooLarge { bytes: usize, max: usize },
    #[error("runtime must be written family@version, got {0:?}")]
    BadRuntime(String),
    #[error("the {family} runtime refuses this task: {detail}")]
    Grammar { family: String, detail: String },
}

/// Checks what every task must be, whatever its runtime: not empty, within the size
/// limit, for a runtime written `family@version`. Returns the family. A family's own
/// grammar is its adapter's to check (`adapter::validate_task` does both).
pub fn validate_envelope(runtime_id: &str, task: &str) -> Result<String, TaskError> {
    if task.trim().is_empty() {
        return Err(TaskError::Empty);
    }
    let bytes = encode(&Value::Str(task.to_string())).len();
    if bytes > MAX_TASK_BYTES {
        return Err(TaskError::TooLarge {
            bytes,
            max: MAX_TASK_BYTES,
        });
    }
    let family = runtime_id
        .split_once('@')
        .map(|(f, _)| f)
        .filter(|f| !f.is_empty())
        .ok_or_else(|| TaskError::BadRuntime(runtime_id.to_string()))?;
    Ok(family.to_string())
}

fn digest_of(domain: &str, v: &Value) -> String {
    let mut h = Sha256::new();
    h.update(domain.as_bytes());
    h.update([0]);
    h.update(encode(v));
    format!("sha256:{}", hex::encode(h.finalize()))
}

/// Digest of a task text.
pub fn task_digest(task: &str) -> String {
    digest_of("mosaic/task/v1", &Value::Str(task.to_string()))
}

/// Digest of a capability list (scope or holds) as supplied: order and duplicates do not
/// matter, so the list is sorted and deduplicated first.
pub fn list_digest(kind: &str, items: &[String]) -> String {
    let mut v: Vec<&String> = items.iter().collect();
    v.sort();
    v.dedup();
    digest_of(
        &format!("mosaic/{kind}/v1"),
        &Value::Array(v.into_iter().map(|s| Value::Str(s.clone())).collect()),
    )
}

/// Digest of a completion policy name.
pub fn policy_digest(policy: &str) -> String {
    digest_of(
        "mosaic/completion-policy/v1",
        &Value::Str(policy.to_string()),
    )
}

/// The completion policies this coordinator enforces.
pub const COMPLETION_POLICIES: [&str; 1] = ["operator-evidence/v1"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_digests_ignore_order_and_duplicates_but_not_content() {
        let a = list_digest("scope", &["b".into(), "a".into()]);
        assert_eq!(
            a,
            list_digest("scope", &["a".into(), "b".into(), "a".into()])
        );
        assert_ne!(a, list_digest("scope", &["a".into()]));
        assert_ne!(a, list_digest("holds", &["a".into(), "b".into()]));
    }
}
