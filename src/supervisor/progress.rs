//! Progress the supervisor sees for itself (spec §14 rule 8's evidence, for harnesses that
//! never call `mosaic lane progress`): what changed in a RUNNING generation's working
//! directory since its activation, read from the files — never the harness's word.
//!
//! Three kinds of evidence, each reported only when it is new:
//!
//! - **file-set**: every file added, changed or removed under the working directory since
//!   the baseline (taken at activation), with its contents' digest, as a canonical JSON
//!   listing. The root's `.git` and `.mosaic` are left out (the repository's own records, and
//!   the declared test-result path below). A change undone gives the listing an earlier
//!   observation had: the coordinator never counts the same evidence twice.
//! - **test-result**: the bytes of `.mosaic/test-result` (the declared path the contract
//!   names), whenever they differ from the last ones seen.
//! - **commit**: the commit the root's `.git/HEAD` names, once it differs from the
//!   baseline's and its loose object is there and hashes to its id (a ref file alone is
//!   the harness's word; the object is git's own proof). A commit only in a pack is not
//!   seen: a harness's fresh commits are loose.
//!
//! Every read goes through descriptors beneath the working directory that never cross a
//! link (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`), opened non-blocking and
//! checked to be regular files: the harness owns the tree and may swap anything for a link,
//! a FIFO or a device at any moment. Bounded in files, bytes and depth. git is never run
//! here (the workspace's config and hooks are the harness's).
//!
//! **Never:** reports output, hook chatter or a turn's end as progress; follows a link;
//! blocks on a file; reads beyond the limits; puts file contents anywhere but into a digest.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags, ResolveFlags};
use serde::{Deserialize, Serialize};

/// The declared path of a harness's test result, relative to its working directory.
pub const TEST_RESULT: &str = ".mosaic/test-result";

/// Most directory entries one observation looks at (files, directories, anything else).
const MAX_ENTRIES: usize = 200_000;
/// Most bytes of paths one observation keeps.
const MAX_PATH_BYTES: usize = 64 << 20;
/// Longest path kept (a longer one is not a file a harness's work is judged by).
const MAX_PATH: usize = 4096;
/// Most bytes one observation reads (unchanged files are not read again).
const MAX_BYTES: u64 = 1 << 30;
/// Deepest directory one observation descends into.
const MAX_DEPTH: usize = 64;

/// One piece of evidence, its kind one of `protocol::work::EVIDENCE_KINDS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evidence {
    pub kind: &'static str,
    pub bytes: Vec<u8>,
}

/// What a file looked like when its contents were last digested: unchanged stat data
/// spares reading it again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Seen {
    len: u64,
    mtime_ns: i128,
    ctime_ns: i128,
    ino: u64,
    digest: String,
}

/// What the observer keeps across observations (and, on disk, across a supervisor
/// restart: the baseline is the generation's activation, not the restart).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Kept {
    /// Path → contents digest at the baseline; `None` when the working directory was too
    /// large to read then (no file set is ever evidence for it; test results and commits
    /// still are).
    baseline: Option<BTreeMap<String, String>>,
    baseline_head: Option<String>,
    /// The last evidence digests reported, per kind (nothing is reported twice in a row).
    reported: BTreeMap<String, String>,
}

/// The observer of one generation's working directory.
#[derive(Debug)]
pub struct Observer {
    dir: PathBuf,
    kept_at: PathBuf,
    kept: Kept,
    cache: BTreeMap<String, Seen>,
}

impl Observer {
    /// The observer of `dir`, its state kept at `kept_at`: loaded if a previous supervisor
    /// process kept one, else the baseline taken now (and kept).
    pub fn start(dir: &Path, kept_at: &Path) -> Result<Self, String> {
        let mut o = Self {
            dir: dir.to_path_buf(),
            kept_at: kept_at.to_path_buf(),
            kept: Kept::default(),
            cache: BTreeMap::new(),
        };
        match std::fs::read(kept_at) {
            Ok(b) => {
                o.kept = serde_json::from_slice(&b)
                    .map_err(|e| format!("{}: {e}", kept_at.display()))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                o.kept.baseline = match o.scan() {
                    Ok(files) => Some(files),
                    Err(e) => {
                        tracing::warn!(error = %e, "the working directory cannot be read whole: its file set is never evidence (test results and commits still are)");
                        None
                    }
                };
                o.kept.baseline_head = o.head();
                o.keep()?;
            }
            Err(e) => return Err(format!("{}: {e}", kept_at.display())),
        }
        Ok(o)
    }

    fn keep(&self) -> Result<(), String> {
        let bytes = serde_json::to_vec(&self.kept).map_err(|e| e.to_string())?;
        crate::util::durable::write_atomic(&self.kept_at, &bytes)
            .map_err(|e| format!("{}: {e}", self.kept_at.display()))
    }

    /// The evidence new since the last observation (nothing when nothing changed).
    pub fn observe(&mut self) -> Result<Vec<Evidence>, String> {
        let mut out = Vec::new();
        let mut listing: Vec<(String, Option<String>)> = Vec::new();
        if let Some(baseline) = self.kept.baseline.clone() {
            match self.scan() {
                Ok(files) => {
                    for (p, d) in &files {
                        if baseline.get(p) != Some(d) {
                            listing.push((p.clone(), Some(d.clone())));
                        }
                    }
                    for p in baseline.keys() {
                        if !files.contains_key(p) {
                            listing.push((p.clone(), None));
                        }
                    }
                }
                // Grown past the limits: no file set this time; the rest is still looked at.
                Err(e) => tracing::warn!(error = %e, "the working directory cannot be read whole"),
            }
        }
        listing.sort();
        if !listing.is_empty() {
            let bytes = serde_json::to_vec(&listing).map_err(|e| e.to_string())?;
            out.push(Evidence {
                kind: "file-set",
                bytes,
            });
        }
        if let Some(bytes) = self.test_result()? {
            out.push(Evidence {
                kind: "test-result",
                bytes,
            });
        }
        if let Some(head) = self
            .head()
            .filter(|h| Some(h) != self.kept.baseline_head.as_ref())
        {
            out.push(Evidence {
                kind: "commit",
                bytes: head.into_bytes(),
            });
        }
        // Only what differs from the last report of its kind; kept durably before it is
        // reported (a write that fails reports nothing, and the next look finds it again).
        let before = self.kept.reported.clone();
        let mut new = Vec::new();
        for e in out {
            let digest = crate::protocol::work::evidence_digest(e.kind, &e.bytes);
            if self.kept.reported.get(e.kind) != Some(&digest) {
                self.kept.reported.insert(e.kind.to_string(), digest);
                new.push(e);
            }
        }
        if !new.is_empty() {
            if let Err(e) = self.keep() {
                self.kept.reported = before;
                return Err(e);
            }
        }
        Ok(new)
    }

    fn root(&self) -> Result<OwnedFd, String> {
        rustix::fs::open(
            &self.dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| format!("opening {}: {e}", self.dir.display()))
    }

    /// Every regular file under the directory (but the root's `.git` and `.mosaic`), with
    /// its contents' digest. Depth first, holding no more than the directory being read and
    /// the entry being looked at open (each reopened beneath the root, never across a link);
    /// bounded in entries, path bytes and bytes read. The stat cache survives a failed scan.
    fn scan(&mut self) -> Result<BTreeMap<String, String>, String> {
        let root = self.root()?;
        let mut files = BTreeMap::new();
        let (mut bytes, mut entries, mut path_bytes) = (0u64, 0usize, 0usize);
        let mut stack: Vec<(String, usize)> = vec![(String::new(), 0)];
        let mut fresh = BTreeMap::new();
        while let Some((rel, depth)) = stack.pop() {
            let fd = if rel.is_empty() {
                rustix::io::dup(&root).map_err(|e| e.to_string())?
            } else {
                match open_beneath(&root, &rel)? {
                    Some(fd) => fd,
                    None => continue, // gone, or swapped for a link meanwhile
                }
            };
            let Ok(dir) = rustix::fs::Dir::read_from(&fd) else {
                continue; // no longer a directory (swapped meanwhile)
            };
            for entry in dir {
                let entry = entry.map_err(|e| format!("{rel}: {e}"))?;
                let raw = entry.file_name().to_bytes();
                if raw == b"." || raw == b".." {
                    continue;
                }
                entries += 1;
                if entries > MAX_ENTRIES {
                    return Err(format!(
                        "the working directory holds more than {MAX_ENTRIES} entries"
                    ));
                }
                let name = String::from_utf8_lossy(raw).into_owned();
                if rel.is_empty() && (name == ".git" || name == ".mosaic") {
                    continue;
                }
                let path = if rel.is_empty() {
                    name
                } else {
                    format!("{rel}/{name}")
                };
                if path.len() > MAX_PATH {
                    continue;
                }
                path_bytes += path.len();
                if path_bytes > MAX_PATH_BYTES {
                    return Err("the working directory's paths are too many to keep".into());
                }
                let Some(child) = open_beneath(&fd, entry.file_name())? else {
                    continue;
                };
                let st = rustix::fs::fstat(&child).map_err(|e| format!("{path}: {e}"))?;
                match FileType::from_raw_mode(st.st_mode) {
                    FileType::Directory if depth < MAX_DEPTH => stack.push((path, depth + 1)),
                    FileType::RegularFile => {
                        let seen = Seen {
                            len: st.st_size.max(0) as u64,
                            mtime_ns: st.st_mtime as i128 * 1_000_000_000
                                + st.st_mtime_nsec as i128,
                            ctime_ns: st.st_ctime as i128 * 1_000_000_000
                                + st.st_ctime_nsec as i128,
                            ino: st.st_ino,
                            digest: String::new(),
                        };
                        let digest = match self.cache.get(&path) {
                            Some(c)
                                if Seen {
                                    digest: c.digest.clone(),
                                    ..seen.clone()
                                } == *c =>
                            {
                                c.digest.clone()
                            }
                            _ => {
                                bytes = bytes.saturating_add(seen.len);
                                if bytes > MAX_BYTES {
                                    return Err(format!(
                                        "the working directory holds more than {} MiB to read",
                                        MAX_BYTES >> 20
                                    ));
                                }
                                digest_of(child, seen.len).map_err(|e| format!("{path}: {e}"))?
                            }
                        };
                        fresh.insert(
                            path.clone(),
                            Seen {
                                digest: digest.clone(),
                                ..seen
                            },
                        );
                        files.insert(path, digest);
                    }
                    // Links, FIFOs, sockets, devices, and directories too deep: not files.
                    _ => {}
                }
            }
        }
        self.cache = fresh;
        Ok(files)
    }

    /// The bytes at the declared test-result path, when they differ from the baseline's
    /// absence (`None` when there is no such regular file).
    fn test_result(&self) -> Result<Option<Vec<u8>>, String> {
        let root = self.root()?;
        let Some(fd) = open_beneath(&root, TEST_RESULT)? else {
            return Ok(None);
        };
        let st = rustix::fs::fstat(&fd).map_err(|e| e.to_string())?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Ok(None);
        }
        let mut data = Vec::new();
        std::fs::File::from(fd)
            .take(crate::protocol::work::MAX_EVIDENCE_BYTES as u64)
            .read_to_end(&mut data)
            .map_err(|e| format!("reading {TEST_RESULT}: {e}"))?;
        Ok((!data.is_empty()).then_some(data))
    }

    /// The commit `.git/HEAD` names, if its loose object is there and hashes to its id.
    fn head(&self) -> Option<String> {
        let root = self.root().ok()?;
        let head = small_file(&root, ".git/HEAD")?;
        let head = head.trim();
        let id = match head.strip_prefix("ref: ") {
            Some(r) => {
                let plain = r.starts_with("refs/heads/")
                    && r.split('/').all(|c| !c.is_empty() && c != "." && c != "..");
                if !plain {
                    return None;
                }
                small_file(&root, &format!(".git/{r}"))?.trim().to_string()
            }
            None => head.to_string(),
        };
        (id.len() == 40
            && id
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
        .then_some(())?;
        let object =
            open_beneath(&root, &format!(".git/objects/{}/{}", &id[..2], &id[2..])).ok()??;
        commit_object_is(object, &id).then_some(id)
    }
}

/// The relative path `rel` beneath `root` (a name in it, or a path below it), opened
/// non-blocking and never crossing a link; `None` if it is gone, a link, or not reachable
/// as a file (a socket, a path through a non-directory).
fn open_beneath<P: rustix::path::Arg + Copy + std::fmt::Debug>(
    root: &OwnedFd,
    rel: P,
) -> Result<Option<OwnedFd>, String> {
    match rustix::fs::openat2(
        root,
        rel,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    ) {
        Ok(fd) => Ok(Some(fd)),
        Err(
            rustix::io::Errno::NOENT
            | rustix::io::Errno::LOOP
            | rustix::io::Errno::XDEV
            | rustix::io::Errno::NOTDIR
            | rustix::io::Errno::NXIO,
        ) => Ok(None),
        Err(e) => Err(format!("{rel:?}: {e}")),
    }
}

/// A regular file of at most 4 KiB beneath `root`, as text.
fn small_file(root: &OwnedFd, rel: &str) -> Option<String> {
    let fd = open_beneath(root, rel).ok()??;
    let st = rustix::fs::fstat(&fd).ok()?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile || st.st_size > 4096 {
        return None;
    }
    let mut s = String::new();
    std::fs::File::from(fd)
        .take(4096)
        .read_to_string(&mut s)
        .ok()?;
    Some(s)
}

/// The sha256 of the first `len` bytes of an open regular file.
fn digest_of(fd: OwnedFd, len: u64) -> std::io::Result<String> {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    let mut f = std::fs::File::from(fd).take(len);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}

/// Whether the loose object file `fd` is a commit whose SHA-1 object id is `id`.
fn commit_object_is(fd: OwnedFd, id: &str) -> bool {
    use sha1::Digest;
    let Ok(st) = rustix::fs::fstat(&fd) else {
        return false;
    };
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return false;
    }
    // A commit object is small; a bound keeps a crafted one from costing anything.
    let mut raw = Vec::new();
    let z = flate2::read::ZlibDecoder::new(std::fs::File::from(fd).take(1 << 20));
    if z.take(1 << 20).read_to_end(&mut raw).is_err() || !raw.starts_with(b"commit ") {
        return false;
    }
    hex::encode(sha1::Sha1::digest(&raw)) == id
}

#[cfg(test)]
mod tests;
