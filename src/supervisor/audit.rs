//! The host audit log: one JSON object per line, appended and fsync'd, for every rejection
//! the supervisor makes (forged identity, stale generation, malformed request).
//!
//! **Never** records secret material: callers pass categories and redacted detail only.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;

use serde::Serialize;

#[derive(Debug)]
pub struct Audit {
    path: PathBuf,
    lock: Mutex<()>,
}

#[derive(Debug, Serialize)]
struct Line<'a> {
    at: String,
    category: &'a str,
    lane: Option<&'a str>,
    generation: Option<u64>,
    detail: &'a str,
}

impl Audit {
    pub fn new(path: PathBuf) -> Self {
        Self {
            path,
            lock: Mutex::new(()),
        }
    }

    pub fn record(
        &self,
        category: &str,
        lane: Option<&str>,
        generation: Option<u64>,
        detail: &str,
    ) {
        tracing::warn!(category, lane, generation, detail, "rejected");
        let line = Line {
            at: crate::util::now_rfc3339(),
            category,
            lane,
            generation,
            detail,
        };
        let Ok(mut bytes) = serde_json::to_vec(&line) else {
            return;
        };
        bytes.push(b'\n');
        let _g = self.lock.lock();
        let res = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .and_then(|mut f| {
                // A line cut short by a full filesystem is taken back, so the next one
                // does not continue it: every line stays one whole JSON object.
                let before = f.metadata()?.len();
                let r = f.write_all(&bytes).and_then(|()| f.sync_data());
                if r.is_err() {
                    let _ = f.set_len(before);
                }
                r
            });
        if let Err(e) = res {
            tracing::error!(path = %self.path.display(), error = %e, "cannot append to the audit log");
        }
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}
