//! Validated names: host ids, lane sessions, lane ids and incarnation ids.
//!
//! A name that reaches a cgroup path, a tmux target or a socket path has passed through
//! here first, so no `..`, `/`, `:` or shell-significant character can get that far.

use std::fmt;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NameError {
    #[error(
        "invalid lane name {0:?}: use 1-32 characters from a-z, 0-9, '-' and '_', starting \
         with a letter or digit"
    )]
    Lane(String),
    #[error("invalid host id {0:?}: use 1-64 characters from A-Z, a-z, 0-9, '.', '-' and '_'")]
    Host(String),
    #[error("invalid lane incarnation id {0:?}")]
    Incarnation(String),
}

fn ok_chars(s: &str, max: usize, extra: &[u8], upper: bool) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.as_bytes()[0].is_ascii_alphanumeric()
        && s.bytes().all(|b| {
            b.is_ascii_digit()
                || b.is_ascii_lowercase()
                || (upper && b.is_ascii_uppercase())
                || extra.contains(&b)
        })
}

/// The tmux-session half of a lane id; also the lane's directory name everywhere.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LaneName(String);

impl LaneName {
    pub fn parse(s: &str) -> Result<Self, NameError> {
        if ok_chars(s, 32, b"-_", false) {
            Ok(Self(s.to_string()))
        } else {
            Err(NameError::Lane(s.to_string()))
        }
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LaneName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostId(String);

impl HostId {
    pub fn parse(s: &str) -> Result<Self, NameError> {
        if ok_chars(s, 64, b"-_.", true) {
            Ok(Self(s.to_string()))
        } else {
            Err(NameError::Host(s.to_string()))
        }
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// `host:session`, the stable lane id of spec section 4.
    pub fn lane_id(&self, lane: &LaneName) -> String {
        format!("{}:{}", self.0, lane.0)
    }
}

/// An opaque lane incarnation id: `li-` and 32 hex digits of fresh randomness.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IncarnationId(String);

impl IncarnationId {
    pub fn fresh() -> Self {
        Self(format!("li-{}", uuid::Uuid::new_v4().simple()))
    }
    pub fn parse(s: &str) -> Result<Self, NameError> {
        match s.strip_prefix("li-") {
            Some(h) if h.len() == 32 && h.bytes().all(|b| b.is_ascii_hexdigit()) => {
                Ok(Self(s.to_string()))
            }
            _ => Err(NameError::Incarnation(s.to_string())),
        }
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IncarnationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lane_names() {
        for good in ["a", "lane-1", "w_2", "0abc"] {
            assert!(LaneName::parse(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "-a",
            "A",
            "a/b",
            "..",
            "a:b",
            "a b",
            "a;rm",
            &"x".repeat(33),
        ] {
            assert_eq!(LaneName::parse(bad), Err(NameError::Lane(bad.to_string())));
        }
    }

    #[test]
    fn host_ids_and_lane_ids() {
        let h = HostId::parse("build-01.example").unwrap();
        assert_eq!(
            h.lane_id(&LaneName::parse("w1").unwrap()),
            "build-01.example:w1"
        );
        assert!(HostId::parse("a:b").is_err());
        assert!(HostId::parse("").is_err());
    }

    #[test]
    fn incarnations_are_fresh_and_checked() {
        let a = IncarnationId::fresh();
        let b = IncarnationId::fresh();
        assert_ne!(a, b);
        assert_eq!(IncarnationId::parse(a.as_str()).unwrap(), a);
        assert!(IncarnationId::parse("li-xyz").is_err());
        assert!(IncarnationId::parse("../etc").is_err());
    }
}
