//! Harness artifacts on this host (spec §11): at a generation's end, once its cgroup is
//! verified empty (nothing of it can still write), what its harness kept of its session —
//! the files its adapter names under the private area — is packed (a tar of regular files,
//! links never followed), encrypted to the recovery recipients its stage named (age), and
//! written durably under `<state_dir>/artifacts/`, named by generation, with a note of
//! whose it is. The receipt names its digest (over the encrypted bytes); the host uploads
//! it to the coordinator's store and removes its copy once the store holds it.
//!
//! **Never:** writes a plaintext byte of an artifact to disk (it is encrypted in memory),
//! captures anything for a generation whose stage named no recipient, follows a link the
//! harness left, or names a digest in a receipt before its bytes are durable.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::state::GenRecord;
use super::Inner;
use crate::protocol::artifact::{
    parse_recipients, recipients_digest, ArtifactRef, MAX_FILES, MAX_PLAIN_BYTES,
};

/// Whose an artifact file is: written beside it, read by the upload.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ArtifactNote {
    pub assignment_id: String,
    pub lane_incarnation_id: String,
    pub generation: u64,
    pub artifact: ArtifactRef,
}

pub(crate) fn dir(inner: &Inner) -> PathBuf {
    inner.cfg.state_dir.join("artifacts")
}

/// The encrypted file and its note, for one generation.
pub(crate) fn files_of(inner: &Inner, incarnation: &str, generation: u64) -> (PathBuf, PathBuf) {
    names_in(&dir(inner), incarnation, generation)
}

/// `<incarnation>.gen-<n>.age` and `.json` in `dir`: one pair per generation (built whole:
/// `with_extension` on `….gen-<n>` would take `gen-<n>` for the extension).
fn names_in(dir: &Path, incarnation: &str, generation: u64) -> (PathBuf, PathBuf) {
    (
        dir.join(format!("{incarnation}.gen-{generation}.age")),
        dir.join(format!("{incarnation}.gen-{generation}.json")),
    )
}

/// Captures the artifact of `rec`'s generation: `None` when there is none to capture (no
/// recipient named, an adapter that exports nothing, a harness that wrote nothing there),
/// an error when there was one and it could not be captured (the receipt says why).
/// Blocking; called only once the generation's cgroup is verified empty, before its
/// private area is removed. One already sealed for this generation whose bytes are whole
/// is taken again, never sealed anew: a receipt built again after a restart may find its
/// first build already durable, naming that one.
pub(crate) fn seal(inner: &Inner, rec: &GenRecord) -> Option<Result<ArtifactRef, String>> {
    let c = rec.coord.as_ref()?;
    if c.artifact_recipients.is_empty() || rec.artifact_paths.is_empty() {
        return None;
    }
    if let Some(a) = sealed_before(inner, rec) {
        return Some(Ok(a));
    }
    let area = super::generation::harness_dir(inner, &rec.lane_incarnation_id, rec.generation);
    let files = match collect(&area, &rec.artifact_paths) {
        Ok(f) if f.is_empty() => return None,
        Ok(f) => f,
        Err(e) => return Some(Err(e)),
    };
    Some(seal_files(
        inner,
        rec,
        &c.assignment_id,
        &c.artifact_recipients,
        &files,
    ))
}

/// The artifact sealed for `rec`'s generation before, if its note and whole bytes are here.
fn sealed_before(inner: &Inner, rec: &GenRecord) -> Option<ArtifactRef> {
    let (file, note) = files_of(inner, &rec.lane_incarnation_id, rec.generation);
    let n: ArtifactNote = serde_json::from_slice(&std::fs::read(note).ok()?).ok()?;
    let bytes = std::fs::read(file).ok()?;
    let digest = format!(
        "sha256:{}",
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes))
    );
    (digest == n.artifact.digest && bytes.len() as u64 == n.artifact.size).then_some(n.artifact)
}

fn seal_files(
    inner: &Inner,
    rec: &GenRecord,
    assignment_id: &str,
    recipients: &[String],
    files: &[Exported],
) -> Result<ArtifactRef, String> {
    let recipients = parse_recipients(recipients).map_err(|e| e.to_string())?;
    let keys: Vec<age::x25519::Recipient> = recipients.iter().filter_map(|r| r.age()).collect();
    let encryptor = age::Encryptor::with_recipients(keys.iter().map(|k| k as &dyn age::Recipient))
        .map_err(|e| format!("age: {e}"))?;
    let mut sealed = Vec::new();
    let mut w = encryptor
        .wrap_output(&mut sealed)
        .map_err(|e| format!("age: {e}"))?;
    pack(files, &mut w)?;
    w.finish().map_err(|e| format!("age: {e}"))?;
    let digest = format!(
        "sha256:{}",
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&sealed))
    );
    let artifact = ArtifactRef {
        digest,
        size: sealed.len() as u64,
        files: files.len() as u32,
        recipients_digest: recipients_digest(&recipients),
    };
    let note = ArtifactNote {
        assignment_id: assignment_id.to_string(),
        lane_incarnation_id: rec.lane_incarnation_id.clone(),
        generation: rec.generation,
        artifact: artifact.clone(),
    };
    let (file, note_file) = files_of(inner, &rec.lane_incarnation_id, rec.generation);
    let durable = |e: crate::util::durable::DurableError| e.to_string();
    crate::util::durable::ensure_dir(&dir(inner), 0o700).map_err(durable)?;
    let json = serde_json::to_vec(&note).map_err(|e| e.to_string())?;
    // The bytes, then the note that names them: a note never names a missing file (an
    // atomic write that fails leaves what was there; a file without its note is swept at
    // start).
    crate::util::durable::write_atomic(&file, &sealed)
        .and_then(|()| crate::util::durable::write_atomic(&note_file, &json))
        .map_err(|e| format!("writing it: {}", durable(e)))?;
    tracing::info!(lane_id = %rec.lane_id, generation = rec.generation, artifact_digest = %artifact.digest,
        files = artifact.files, "the harness's artifact is sealed");
    Ok(artifact)
}

/// One exported file: its path under the private area and its bytes.
#[derive(Debug)]
pub(crate) struct Exported {
    pub path: String,
    pub data: Vec<u8>,
}

/// Most directory entries one capture looks at (files, directories, anything else).
const MAX_ENTRIES: usize = 100_000;
/// Deepest directory one capture descends into.
const MAX_DEPTH: usize = 32;

/// What a capture has taken so far, against the limits.
#[derive(Default)]
struct Budget {
    entries: usize,
    files: usize,
    bytes: u64,
}

impl Budget {
    fn over(&self) -> Option<String> {
        (self.entries > MAX_ENTRIES || self.files > MAX_FILES || self.bytes > MAX_PLAIN_BYTES)
            .then(|| {
                format!(
                    "the harness's session files are more than {MAX_ENTRIES} entries, {MAX_FILES} files or {MAX_PLAIN_BYTES} bytes: not captured"
                )
            })
    }
}

/// The regular files under `area` the paths name (each a file or a directory), read
/// through file descriptors beneath the area that never cross a link — one anywhere on
/// the way (the harness owns every directory under its area and could have swapped one
/// for a link to anywhere) is not followed, and the path is not exported — sorted by
/// path; refused beyond the limits. FIFOs, sockets and devices are never opened.
pub(crate) fn collect(area: &Path, paths: &[String]) -> Result<Vec<Exported>, String> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let root = match rustix::fs::open(
        area,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(vec![]),
        Err(e) => return Err(format!("opening {}: {e}", area.display())),
    };
    let mut out = Vec::new();
    let mut budget = Budget::default();
    for p in paths {
        let rel = Path::new(p);
        if rel.is_absolute()
            || rel
                .components()
                .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            return Err(format!(
                "the adapter's artifact path {p:?} is not a plain relative path"
            ));
        }
        let fd = match rustix::fs::openat2(
            &root,
            rel,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        ) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) => continue,
            Err(rustix::io::Errno::LOOP) | Err(rustix::io::Errno::XDEV) => {
                tracing::warn!(path = %p, "a link where the harness's session should be: not followed, not exported");
                continue;
            }
            Err(e) => return Err(format!("opening {p}: {e}")),
        };
        walk(fd, p.clone(), 0, &mut out, &mut budget)?;
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

fn walk(
    fd: std::os::fd::OwnedFd,
    rel: String,
    depth: usize,
    out: &mut Vec<Exported>,
    budget: &mut Budget,
) -> Result<(), String> {
    use rustix::fs::{FileType, Mode, OFlags};
    let st = rustix::fs::fstat(&fd).map_err(|e| format!("{rel}: {e}"))?;
    match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => {
            budget.files += 1;
            budget.bytes += st.st_size.max(0) as u64;
            if let Some(e) = budget.over() {
                return Err(e);
            }
            let mut data = Vec::new();
            std::fs::File::from(fd)
                .take(st.st_size.max(0) as u64)
                .read_to_end(&mut data)
                .map_err(|e| format!("reading {rel}: {e}"))?;
            out.push(Exported { path: rel, data });
        }
        FileType::Directory if depth < MAX_DEPTH => {
            let dir = rustix::fs::Dir::read_from(&fd).map_err(|e| format!("{rel}: {e}"))?;
            for entry in dir {
                let entry = entry.map_err(|e| format!("{rel}: {e}"))?;
                let name = entry.file_name().to_bytes();
                if name == b"." || name == b".." {
                    continue;
                }
                budget.entries += 1;
                if let Some(e) = budget.over() {
                    return Err(e);
                }
                let Ok(name) = std::str::from_utf8(name) else {
                    continue; // not a name a harness writes its session under
                };
                // Only directories and regular files are opened (never a FIFO, socket or
                // device), and never through a link.
                let kind = rustix::fs::statat(&fd, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
                    .map(|s| FileType::from_raw_mode(s.st_mode));
                if !matches!(kind, Ok(FileType::Directory) | Ok(FileType::RegularFile)) {
                    continue;
                }
                let child = match rustix::fs::openat(
                    &fd,
                    name,
                    OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
                    Mode::empty(),
                ) {
                    Ok(c) => c,
                    Err(rustix::io::Errno::LOOP) | Err(rustix::io::Errno::NOENT) => continue,
                    Err(e) => return Err(format!("opening {rel}/{name}: {e}")),
                };
                walk(child, format!("{rel}/{name}"), depth + 1, out, budget)?;
            }
        }
        FileType::Directory => {
            return Err(format!(
                "the harness's session files nest deeper than {MAX_DEPTH} directories: not captured"
            ))
        }
        _ => {} // opened, then found not to be a file or directory: never read
    }
    Ok(())
}

/// A tar of `files`, each as read, with no owner, time or mode of the host's in it.
pub(crate) fn pack(files: &[Exported], w: &mut impl Write) -> Result<(), String> {
    let mut tar = tar::Builder::new(w);
    for f in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(f.data.len() as u64);
        h.set_mode(0o600);
        h.set_mtime(0);
        h.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut h, &f.path, f.data.as_slice())
            .map_err(|e| format!("packing {}: {e}", f.path))?;
    }
    tar.into_inner()
        .map_err(|e| format!("packing: {e}"))?
        .flush()
        .map_err(|e| e.to_string())
}

/// The artifacts of this host not in the coordinator's store yet: their notes.
pub(crate) fn pending(inner: &Inner) -> Vec<(ArtifactNote, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir(inner)) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let note = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<ArtifactNote>(&b).ok());
        match note {
            Some(n) => {
                let file = path.with_extension("age");
                if file.is_file() && !refused_mark(&path).exists() {
                    out.push((n, file));
                }
            }
            None => {
                tracing::warn!(note = %path.display(), "an artifact note that does not parse is left alone")
            }
        }
    }
    out.sort_by(|a, b| a.1.cmp(&b.1));
    out
}

/// The mark that the store refused an artifact for good: it stays here, its only copy.
pub(crate) fn refused_mark(note: &Path) -> PathBuf {
    note.with_extension("refused")
}

/// The store holds `file`'s artifact: this host's copy goes (the note last).
pub(crate) fn stored(file: &Path) {
    let _ = std::fs::remove_file(file);
    let _ = std::fs::remove_file(file.with_extension("json"));
    let _ = std::fs::remove_file(file.with_extension("refused"));
}

/// Temporary files a crash left in the artifact directory (a write cut short), and an
/// artifact whose note was never written (its receipt never named it): removed at start.
pub(crate) fn sweep(inner: &Inner) {
    let Ok(entries) = std::fs::read_dir(dir(inner)) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let keep = match path.extension().and_then(|x| x.to_str()) {
            Some("json") | Some("refused") => true,
            Some("age") => path.with_extension("json").is_file(),
            _ => false,
        };
        if !keep {
            tracing::info!(file = %path.display(), "removing an unfinished artifact write");
            let _ = std::fs::remove_file(&path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each generation has its own pair of files, and each name maps to its partner.
    #[test]
    fn each_generation_has_its_own_files() {
        let d = Path::new("/s/artifacts");
        let (a1, n1) = names_in(d, "li-1", 1);
        let (a2, n2) = names_in(d, "li-1", 2);
        assert_ne!(a1, a2);
        assert_ne!(n1, n2);
        assert_eq!(a1, d.join("li-1.gen-1.age"));
        assert_eq!(n1.with_extension("age"), a1);
        assert_eq!(a1.with_extension("json"), n1);
        assert_eq!(refused_mark(&n2), d.join("li-1.gen-2.refused"));
    }
}
