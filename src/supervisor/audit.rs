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
    /// Rings when lines are held: the unwritten-ends writer writes them off the runtime's
    /// threads (a caller never writes a backlog inline).
    pub(crate) pending: tokio::sync::Notify,
}

/// Lines the filesystem did not take yet (full, read-only), oldest first, each with the
/// time it was recorded; beyond [`HELD_MAX`] the newest are counted, not kept.
#[derive(Debug, Default)]
struct Held {
    lines: std::collections::VecDeque<Vec<u8>>,
    dropped: u64,
    /// A failed write could not be taken back (the file could not be truncated): the next
    /// write starts on a new line, so the fragment stays a line of its own.
    torn: bool,
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

fn line_bytes(line: &Line<'_>) -> Option<Vec<u8>> {
    let mut bytes = serde_json::to_vec(line).ok()?;
    bytes.push(b'\n');
    Some(bytes)
}

impl Audit {
    pub fn new(path: PathBuf) -> Self {
        Self {
            path,
            held: Mutex::new(Held::default()),
            pending: tokio::sync::Notify::new(),
        }
    }

    /// Appends a line (with the time it is recorded). One the filesystem refuses is held,
    /// with every line after it, and the unwritten-ends writer writes them — in order, each
    /// with its own time — once the filesystem takes them ([`Audit::flush`]): a full or
    /// read-only state filesystem loses no line (but the ones past [`HELD_MAX`], counted
    /// and said in a line of their own). With lines held, a caller only queues its own.
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
        let Some(bytes) = line_bytes(&line) else {
            return;
        };
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let backlog = !held.lines.is_empty() || held.dropped > 0;
        if held.lines.len() < HELD_MAX {
            held.lines.push_back(bytes);
        } else {
            held.dropped += 1;
        }
        if backlog {
            drop(held);
            self.pending.notify_one();
            return;
        }
        // One line: written now, as before any fault.
        if !self.write_held(&mut held) {
            drop(held);
            self.pending.notify_one();
        }
    }

    /// Writes what is held, if the filesystem takes it now (blocking: call it off the
    /// runtime's threads).
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

    /// Writes every held line (and the overflow note) as one append and one sync, taken
    /// back whole if it fails: whether it was written.
    fn write_held(&self, held: &mut Held) -> bool {
        let mut buf = Vec::new();
        if held.torn {
            buf.push(b'\n');
        }
        for l in &held.lines {
            buf.extend_from_slice(l);
        }
        if held.dropped > 0 {
            let detail = format!(
                "{} audit lines were dropped while the state filesystem refused writes (more than {HELD_MAX} held)",
                held.dropped
            );
            let note = Line {
                at: crate::util::now_rfc3339(),
                category: "audit-overflow",
                lane: None,
                generation: None,
                detail: &detail,
            };
            buf.extend(line_bytes(&note).unwrap_or_default());
        }
        let mut torn = false;
        let res = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .and_then(|mut f| {
                let before = f.metadata()?.len();
                let r = f.write_all(&buf).and_then(|()| f.sync_data());
                if r.is_err() {
                    // Taken back, so every line stays one whole JSON object.
                    torn = f.set_len(before).and_then(|()| f.sync_data()).is_err();
                }
                r
            });
        match res {
            Ok(()) => {
                held.lines.clear();
                held.dropped = 0;
                held.torn = false;
                true
            }
            Err(e) => {
                held.torn |= torn;
                tracing::error!(path = %self.path.display(), error = %e, held = held.lines.len(),
                    "cannot append to the audit log: the lines are held and written when it can be");
                false
            }
        }
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}
