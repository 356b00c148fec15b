//! The host audit log: one JSON object per line, appended and fsync'd, for every rejection
//! the supervisor makes (forged identity, stale generation, malformed request). A line the
//! state filesystem refuses (full, read-only) is held in memory, in order, and written with
//! the time it was recorded once the filesystem takes it (the next record, or the
//! unwritten-ends writer's next pass).
//!
//! **Never** records secret material: callers pass categories and redacted detail only.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;

use serde::Serialize;

#[derive(Debug)]
pub struct Audit {
    path: PathBuf,
    held: Mutex<Held>,
}

/// Lines the filesystem did not take yet (full, read-only), oldest first, each with the
/// time it was recorded; beyond [`HELD_MAX`] the newest are counted, not kept.
#[derive(Debug, Default)]
struct Held {
    lines: std::collections::VecDeque<Vec<u8>>,
    dropped: u64,
}

/// Most lines held in memory while the audit log cannot be written.
pub const HELD_MAX: usize = 10_000;

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
            held: Mutex::new(Held::default()),
        }
    }

    /// Appends a line (with the time it is recorded). One the filesystem refuses is held,
    /// with every line after it, and written — in order, with its own time — by the next
    /// record or [`Audit::flush`]: a full or read-only state filesystem loses no line (but
    /// the ones past [`HELD_MAX`], counted and said in a line of their own).
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
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if held.lines.len() < HELD_MAX {
            held.lines.push_back(bytes);
        } else {
            held.dropped += 1;
        }
        self.write_held(&mut held);
    }

    /// Writes what is held, if the filesystem takes it now.
    pub fn flush(&self) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if !held.lines.is_empty() || held.dropped > 0 {
            self.write_held(&mut held);
        }
    }

    /// Lines held, not written yet.
    pub fn held(&self) -> usize {
        self.held.lock().map(|h| h.lines.len()).unwrap_or_default()
    }

    fn write_held(&self, held: &mut Held) {
        let res = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .and_then(|mut f| {
                while let Some(bytes) = held.lines.front() {
                    // A line cut short by a full filesystem is taken back, so the next
                    // one does not continue it: every line stays one whole JSON object.
                    let before = f.metadata()?.len();
                    let r = f.write_all(bytes).and_then(|()| f.sync_data());
                    if let Err(e) = r {
                        let _ = f.set_len(before);
                        return Err(e);
                    }
                    held.lines.pop_front();
                }
                if held.dropped > 0 {
                    let note = Line {
                        at: crate::util::now_rfc3339(),
                        category: "audit-overflow",
                        lane: None,
                        generation: None,
                        detail: &format!(
                            "{} audit lines were dropped while the state filesystem refused writes (more than {HELD_MAX} held)",
                            held.dropped
                        ),
                    };
                    let mut b = serde_json::to_vec(&note).unwrap_or_default();
                    b.push(b'\n');
                    f.write_all(&b).and_then(|()| f.sync_data())?;
                    held.dropped = 0;
                }
                Ok(())
            });
        if let Err(e) = res {
            tracing::error!(path = %self.path.display(), error = %e, held = held.lines.len(),
                "cannot append to the audit log: the lines are held and written when it can be");
        }
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}
