//! Operators' side of harness artifacts: the recovery identity a principal holds (an age
//! X25519 key pair, `mosaic pki recovery-key`), and `mosaic checkpoint artifact`, which
//! reads an artifact from the coordinator's store (`artifact-read`, part by part, each read
//! recorded there), checks the whole against its digest, decrypts it with the operator's
//! identity and unpacks the harness's session files into a new directory.
//!
//! **Never:** prints or logs a secret key, writes a plaintext byte before the encrypted
//! whole has been checked against its address, or writes into a directory that exists.

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

use crate::coordinator::error::Category;
use crate::coordinator::service::{OpError, OperatorRequest, OperatorTarget};
use age::secrecy::ExposeSecret as _;

fn err(c: Category, m: impl Into<String>) -> OpError {
    OpError::new(c, m)
}

/// The recovery identity at `path`, made (mode 0600, never overwritten) when `create` and
/// absent. Returns its public recipient (`age1…`).
pub fn recovery_key(path: &Path, create: bool) -> Result<String, String> {
    if create && !path.exists() {
        let id = age::x25519::Identity::generate();
        let text = format!(
            "# a Mosaic recovery identity: decrypts harness artifacts; keep it secret\n{}\n",
            id.to_string().expose_secret()
        );
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .and_then(|mut f| f.write_all(text.as_bytes()).and_then(|()| f.sync_all()))
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(read_identity(path)?.to_public().to_string())
}

/// The identity in `path` (its one `AGE-SECRET-KEY-1…` line; `#` lines are comments).
pub fn read_identity(path: &Path) -> Result<age::x25519::Identity, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut keys = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'));
    match (keys.next(), keys.next()) {
        (Some(k), None) => k.parse::<age::x25519::Identity>().map_err(|_| {
            format!(
                "{}: not an age X25519 identity (AGE-SECRET-KEY-1…)",
                path.display()
            )
        }),
        _ => Err(format!(
            "{}: expected exactly one AGE-SECRET-KEY-1… line",
            path.display()
        )),
    }
}

/// `mosaic checkpoint artifact DIGEST --identity FILE --out DIR`: the artifact read from
/// the first of `targets` that answers, verified, decrypted and unpacked into `into`
/// (which must not exist).
pub fn recover(
    targets: &[OperatorTarget],
    digest: &str,
    identity: &Path,
    into: &Path,
) -> Result<serde_json::Value, OpError> {
    if !crate::protocol::envelope::is_digest(digest) {
        return Err(err(
            Category::BadInput,
            "an artifact digest is sha256: and 64 lowercase hex digits",
        ));
    }
    if into.symlink_metadata().is_ok() {
        return Err(err(
            Category::BadInput,
            format!(
                "{} exists: an artifact is unpacked into a new directory",
                into.display()
            ),
        ));
    }
    // The identity first: nothing is read (and recorded as read) for a key that cannot
    // open it.
    let id = read_identity(identity).map_err(|e| err(Category::BadInput, e))?;
    let sealed = read_sealed(targets, digest)?;
    let files = open_artifact(&sealed, &id, into).map_err(|e| err(Category::Conflict, e))?;
    Ok(serde_json::json!({
        "artifact_digest": digest,
        "into": into,
        "files": files,
    }))
}

/// The whole of stored artifact `digest`, checked against it.
fn read_sealed(targets: &[OperatorTarget], digest: &str) -> Result<Vec<u8>, OpError> {
    let mut out = Vec::new();
    let got = crate::checkpoint_restore::read_parts(
        targets,
        |offset| OperatorRequest::ArtifactRead {
            artifact_digest: digest.to_string(),
            offset,
        },
        |data| {
            out.extend_from_slice(data);
            Ok(())
        },
    )?;
    if got != digest {
        return Err(err(
            Category::Conflict,
            format!("corrupt: artifact {digest} as read hashes to {got}: not opened"),
        ));
    }
    Ok(out)
}

/// Decrypts and unpacks an artifact (the operator's side): `sealed` with `identity` into
/// `into`, which must not exist. Returns the files written.
pub fn open_artifact(
    sealed: &[u8],
    identity: &age::x25519::Identity,
    into: &Path,
) -> Result<Vec<String>, String> {
    let d = age::Decryptor::new(sealed).map_err(|e| format!("not an age file: {e}"))?;
    let mut r = d
        .decrypt(std::iter::once(identity as &dyn age::Identity))
        .map_err(|e| format!("cannot decrypt it with this identity: {e}"))?;
    let mut plain = Vec::new();
    r.read_to_end(&mut plain)
        .map_err(|e| format!("decrypting: {e}"))?;
    std::fs::create_dir(into).map_err(|e| format!("{}: {e}", into.display()))?;
    // Nothing half unpacked stays: a refused entry removes what was written.
    unpack(&plain, into).inspect_err(|_| {
        let _ = std::fs::remove_dir_all(into);
    })
}

fn unpack(plain: &[u8], into: &Path) -> Result<Vec<String>, String> {
    let mut names = Vec::new();
    let mut a = tar::Archive::new(plain);
    for entry in a.entries().map_err(|e| e.to_string())? {
        let mut entry = entry.map_err(|e| e.to_string())?;
        let path = entry.path().map_err(|e| e.to_string())?.into_owned();
        if entry.header().entry_type() != tar::EntryType::Regular
            || path
                .components()
                .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            return Err(format!(
                "the artifact holds an entry {path:?} that is not a plain file"
            ));
        }
        let dest = into.join(&path);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
        }
        let mut data = Vec::new();
        entry.read_to_end(&mut data).map_err(|e| e.to_string())?;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&dest)
            .and_then(|mut f| f.write_all(&data))
            .map_err(|e| format!("{}: {e}", dest.display()))?;
        names.push(path.display().to_string());
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::supervisor::artifacts::{collect, pack};
    use std::path::PathBuf;

    fn tmp() -> PathBuf {
        let d = std::env::temp_dir().join(format!("mosaic-art-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// Only regular files under the named paths are taken: a link the harness left (at the
    /// end of a path or in the middle of one: a directory it swapped for a link to
    /// elsewhere), a FIFO, a path out of the area — never; the pack opens with the
    /// recipient's identity to exactly those files, and with no other identity.
    #[test]
    fn only_regular_files_under_the_paths_are_packed_and_they_open_whole() {
        let area = tmp();
        let s = area.join("agent/sessions");
        std::fs::create_dir_all(s.join("deep")).unwrap();
        std::fs::write(s.join("one.jsonl"), "one\n").unwrap();
        std::fs::write(s.join("deep/two.jsonl"), "two\n").unwrap();
        std::os::unix::fs::symlink("/etc/hostname", s.join("link")).unwrap();
        std::os::unix::fs::symlink("/etc", s.join("dirlink")).unwrap();
        nix::unistd::mkfifo(&s.join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        std::fs::write(area.join("outside.txt"), "no\n").unwrap();
        // `home` swapped for a link to a directory outside the area.
        let elsewhere = tmp();
        std::fs::create_dir_all(elsewhere.join("projects")).unwrap();
        std::fs::write(elsewhere.join("projects/secret.jsonl"), "theirs\n").unwrap();
        std::os::unix::fs::symlink(&elsewhere, area.join("home")).unwrap();
        let files = collect(
            &area,
            &[
                "agent/sessions".into(),
                "missing".into(),
                "home/projects".into(),
            ],
        )
        .unwrap();
        let rel: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            rel,
            vec!["agent/sessions/deep/two.jsonl", "agent/sessions/one.jsonl"]
        );
        for bad in ["../x", "/etc", "a/../../b", "./a"] {
            assert!(collect(&area, &[bad.into()]).is_err(), "{bad}");
        }
        // Packed, encrypted, opened: the same bytes.
        let id = age::x25519::Identity::generate();
        let enc = age::Encryptor::with_recipients(std::iter::once(
            &id.to_public() as &dyn age::Recipient
        ))
        .unwrap();
        let mut sealed = Vec::new();
        let mut w = enc.wrap_output(&mut sealed).unwrap();
        pack(&files, &mut w).unwrap();
        w.finish().unwrap();
        let into = area.join("opened");
        let names = open_artifact(&sealed, &id, &into).unwrap();
        assert_eq!(
            names,
            vec!["agent/sessions/deep/two.jsonl", "agent/sessions/one.jsonl"]
        );
        assert_eq!(
            std::fs::read_to_string(into.join("agent/sessions/one.jsonl")).unwrap(),
            "one\n"
        );
        // Another identity opens nothing and makes nothing.
        let other = age::x25519::Identity::generate();
        let into2 = area.join("opened2");
        assert!(open_artifact(&sealed, &other, &into2).is_err());
        assert!(!into2.exists());
        std::fs::remove_dir_all(&area).unwrap();
        std::fs::remove_dir_all(&elsewhere).unwrap();
    }

    /// A tree of many entries that are no files at all is refused, not walked for ever.
    #[test]
    fn a_tree_of_too_many_entries_is_refused() {
        let area = tmp();
        let s = area.join("agent/sessions");
        std::fs::create_dir_all(&s).unwrap();
        for i in 0..100_001 {
            std::os::unix::fs::symlink("/nowhere", s.join(format!("l{i}"))).unwrap();
        }
        let e = collect(&area, &["agent/sessions".into()]).unwrap_err();
        assert!(e.contains("entries"), "{e}");
        std::fs::remove_dir_all(&area).unwrap();
    }

    /// An artifact whose pack names a path out of its directory is refused, not unpacked
    /// there (an operator's machine is not the harness's to write).
    #[test]
    fn an_entry_out_of_the_destination_is_refused() {
        let id = age::x25519::Identity::generate();
        let mut tarball = Vec::new();
        {
            let mut t = tar::Builder::new(&mut tarball);
            let mut h = tar::Header::new_gnu();
            let data = b"pwned";
            h.set_size(data.len() as u64);
            h.set_mode(0o600);
            h.set_entry_type(tar::EntryType::Regular);
            // Written raw: the builder itself refuses `..` in a path.
            h.as_gnu_mut().unwrap().name[..9].copy_from_slice(b"../escape");
            h.set_cksum();
            t.append(&h, &data[..]).unwrap();
            t.finish().unwrap();
        }
        let sealed = age::encrypt(&id.to_public(), &tarball).unwrap();
        let area = tmp();
        let into = area.join("opened");
        let e = open_artifact(&sealed, &id, &into).unwrap_err();
        assert!(e.contains("not a plain file"), "{e}");
        assert!(!area.join("escape").exists());
        std::fs::remove_dir_all(&area).unwrap();
    }
}
