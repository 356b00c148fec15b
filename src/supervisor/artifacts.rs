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
    let base = dir(inner).join(format!("{incarnation}.gen-{generation}"));
    (base.with_extension("age"), base.with_extension("json"))
}

/// Captures the artifact of `rec`'s generation: `None` when there is none to capture (no
/// recipient named, an adapter that exports nothing, a harness that wrote nothing there),
/// an error when there was one and it could not be captured (the receipt says why).
/// Blocking; called only once the generation's cgroup is verified empty, before its
/// private area is removed.
pub(crate) fn seal(inner: &Inner, rec: &GenRecord) -> Option<Result<ArtifactRef, String>> {
    let c = rec.coord.as_ref()?;
    if c.artifact_recipients.is_empty() || rec.artifact_paths.is_empty() {
        return None;
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
        &area,
        &files,
    ))
}

fn seal_files(
    inner: &Inner,
    rec: &GenRecord,
    assignment_id: &str,
    recipients: &[String],
    area: &Path,
    files: &[PathBuf],
) -> Result<ArtifactRef, String> {
    let recipients = parse_recipients(recipients).map_err(|e| e.to_string())?;
    let keys: Vec<age::x25519::Recipient> = recipients.iter().filter_map(|r| r.age()).collect();
    let encryptor = age::Encryptor::with_recipients(keys.iter().map(|k| k as &dyn age::Recipient))
        .map_err(|e| format!("age: {e}"))?;
    let mut sealed = Vec::new();
    let mut w = encryptor
        .wrap_output(&mut sealed)
        .map_err(|e| format!("age: {e}"))?;
    pack(area, files, &mut w)?;
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
    // The bytes, then the note that names them: a note never names a missing file.
    let written = crate::util::durable::write_atomic(&file, &sealed)
        .and_then(|()| crate::util::durable::write_atomic(&note_file, &json));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&note_file);
        let _ = std::fs::remove_file(&file);
        return Err(format!("writing it: {}", durable(e)));
    }
    tracing::info!(lane_id = %rec.lane_id, generation = rec.generation, artifact_digest = %artifact.digest,
        files = artifact.files, "the harness's artifact is sealed");
    Ok(artifact)
}

/// The regular files under `area` the paths name (each a file or a directory, walked
/// without following links), sorted; refused beyond the limits.
pub(crate) fn collect(area: &Path, paths: &[String]) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    let mut bytes = 0u64;
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
        let mut stack = vec![area.join(rel)];
        while let Some(at) = stack.pop() {
            let meta = match std::fs::symlink_metadata(&at) {
                Ok(m) => m,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(format!("reading {}: {e}", at.display())),
            };
            if meta.is_dir() {
                let entries =
                    std::fs::read_dir(&at).map_err(|e| format!("reading {}: {e}", at.display()))?;
                for e in entries {
                    stack.push(e.map_err(|e| e.to_string())?.path());
                }
            } else if meta.is_file() {
                bytes += meta.len();
                out.push(at);
                if out.len() > MAX_FILES || bytes > MAX_PLAIN_BYTES {
                    return Err(format!(
                        "the harness's session files are more than {MAX_FILES} files or {MAX_PLAIN_BYTES} bytes: not captured"
                    ));
                }
            }
            // Links, sockets, FIFOs: never read.
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// A tar of `files` (paths relative to `area`), each as it is now, with no owner, time or
/// mode of the host's in it.
pub(crate) fn pack(area: &Path, files: &[PathBuf], w: &mut impl Write) -> Result<(), String> {
    let mut tar = tar::Builder::new(w);
    for f in files {
        let rel = f.strip_prefix(area).map_err(|e| e.to_string())?;
        let mut data = Vec::new();
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(f)
            .and_then(|mut h| h.read_to_end(&mut data))
            .map_err(|e| format!("reading {}: {e}", f.display()))?;
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o600);
        h.set_mtime(0);
        h.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut h, rel, data.as_slice())
            .map_err(|e| format!("packing {}: {e}", rel.display()))?;
    }
    tar.into_inner()
        .map_err(|e| format!("packing: {e}"))?
        .flush()
        .map_err(|e| e.to_string())
}

use std::os::unix::fs::OpenOptionsExt as _;

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
