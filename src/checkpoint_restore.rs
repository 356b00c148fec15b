//! `mosaic checkpoint restore`: an operator's own copy of a stored checkpoint, as a
//! repository to read, build, test or push from by hand. The CLI reads the checkpoint's
//! objects from the coordinator (`checkpoint-read`, part by part), checks each whole
//! against its address, imports them into a private scratch repository with git checking
//! every object, and builds the repository the way a host restores a workspace: on the
//! branch `mosaic/<assignment>` at the checkpoint's base, its files exactly the
//! checkpoint's tree (checked by writing them back into a tree), so `git status` shows the
//! work as changes against the base.
//!
//! **Never:** writes into a directory that exists and is not empty, leaves a half-built
//! repository at the destination (it is built beside it and renamed into place), or uses
//! a byte of an object before the whole has been checked against its digest.

use std::io::Write;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use sha2::{Digest, Sha256};

use crate::coordinator::error::Category;
use crate::coordinator::service::{operator_request_any, OpError, OperatorRequest, OperatorTarget};
use crate::protocol::repo::{base_ref, branch_of};
use crate::util::git::{fetch_checked, git};

fn err(c: Category, m: impl Into<String>) -> OpError {
    OpError::new(c, m)
}

/// Restores checkpoint `digest` into `into` (absent, or an empty directory, whose parent
/// exists), reading it from the first of `targets` that answers. Returns what was made.
pub fn checkpoint_restore(
    targets: &[OperatorTarget],
    digest: &str,
    into: &Path,
) -> Result<serde_json::Value, OpError> {
    if !crate::protocol::envelope::is_digest(digest) {
        return Err(err(
            Category::BadInput,
            "a checkpoint digest is sha256: and 64 lowercase hex digits",
        ));
    }
    let dest = destination(into)?;
    // Its records only (the coordinator's read-only view of it would import every object
    // there first, only for them to be read again here).
    let listed = operator_request_any(
        targets,
        &OperatorRequest::Checkpoints {
            assignment_id: None,
            checkpoint_digest: Some(digest.to_string()),
        },
    )?;
    let rows = listed.as_array().cloned().unwrap_or_default();
    if rows.is_empty() {
        return Err(err(Category::NotFound, format!("no checkpoint {digest}")));
    }
    let field = |k: &str| rows.iter().find_map(|r| r[k].as_str().map(String::from));
    let (Some(commit), Some(tree), Some(assignment), Some(bundle)) = (
        field("commit_id"),
        field("tree_id"),
        field("assignment_id"),
        field("bundle_object"),
    ) else {
        return Err(err(
            Category::WrongState,
            format!("checkpoint {digest} is not whole in the coordinator's store"),
        ));
    };
    let base = field("base_commit_id");
    let base_object = match (&base, field("base_object")) {
        (Some(_), None) => {
            return Err(err(
                Category::WrongState,
                format!("checkpoint {digest}'s base is not in the coordinator's store"),
            ))
        }
        (_, o) => o,
    };
    let parent = dest.parent().unwrap_or(Path::new("/"));
    let scratch = parent.join(format!(".mosaic-restore-{}", uuid::Uuid::new_v4().simple()));
    crate::util::durable::ensure_dir(&scratch, 0o700)
        .map_err(|e| err(Category::Internal, format!("{}: {e}", scratch.display())))?;
    let built = (|| {
        let store = scratch.join("store.git");
        let store_s = store.to_string_lossy().to_string();
        git(&["init", "--quiet", "--bare", &store_s], None).map_err(internal)?;
        if let (Some(b), Some(o)) = (&base, &base_object) {
            let f = scratch.join("base.bundle");
            read_object(targets, digest, o, &f)?;
            let r = base_ref(b);
            fetch_checked(&store, &f.to_string_lossy(), &format!("{r}:{r}")).map_err(internal)?;
            if !crate::supervisor::checkpoints::has_base(&store, b) {
                return Err(err(
                    Category::Conflict,
                    format!("checkpoint {digest}: its base bundle does not hold base {b}"),
                ));
            }
        }
        let f = scratch.join("checkpoint.bundle");
        read_object(targets, digest, &bundle, &f)?;
        fetch_checked(
            &store,
            &f.to_string_lossy(),
            "+refs/mosaic/checkpoints/*:refs/mosaic/restored/*",
        )
        .map_err(internal)?;
        // The same check a host makes of what it imported: the commit, its parent the
        // base, its tree the checkpoint's.
        crate::supervisor::checkpoints::check_imported(
            &store,
            digest,
            &commit,
            base.as_deref(),
            &tree,
        )
        .map_err(|e| err(Category::Conflict, e))?;
        let work = scratch.join("work");
        crate::supervisor::checkpoints::materialize(
            &store,
            &work,
            &branch_of(&assignment),
            base.as_deref(),
            &tree,
            None,
        )
        .map_err(internal)?;
        // An empty directory given as the destination is replaced (never one with files:
        // `remove_dir` refuses those, and nothing is moved).
        if dest.is_dir() {
            std::fs::remove_dir(&dest)
                .map_err(|e| err(Category::BadInput, format!("{}: {e}", dest.display())))?;
        }
        std::fs::rename(&work, &dest)
            .map_err(|e| err(Category::Internal, format!("{}: {e}", dest.display())))
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    built?;
    Ok(serde_json::json!({
        "checkpoint_digest": digest,
        "into": dest,
        "branch": branch_of(&assignment),
        "assignment_id": assignment,
        "base_commit_id": base,
        "commit_id": commit,
        "tree_id": tree,
    }))
}

fn internal(e: String) -> OpError {
    err(Category::Internal, format!("restoring the checkpoint: {e}"))
}

/// `into` as an absolute path: it must not exist, or be an empty directory (not a link),
/// and its parent must exist.
fn destination(into: &Path) -> Result<PathBuf, OpError> {
    let bad = |m: String| err(Category::BadInput, m);
    let name = into
        .file_name()
        .ok_or_else(|| bad(format!("{}: not a directory name", into.display())))?;
    let parent = match into.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let parent =
        std::fs::canonicalize(parent).map_err(|e| bad(format!("{}: {e}", parent.display())))?;
    let dest = parent.join(name);
    match std::fs::symlink_metadata(&dest) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(dest),
        Err(e) => Err(bad(format!("{}: {e}", dest.display()))),
        Ok(m) if m.is_dir() => {
            let empty = std::fs::read_dir(&dest)
                .map_err(|e| bad(format!("{}: {e}", dest.display())))?
                .next()
                .is_none();
            if empty {
                Ok(dest)
            } else {
                Err(bad(format!(
                    "{} exists and is not empty: restore into a new directory",
                    dest.display()
                )))
            }
        }
        Ok(_) => Err(bad(format!(
            "{} exists and is not a directory",
            dest.display()
        ))),
    }
}

/// Reads a stored object whole, part by part (`request(offset)` asks for the part at
/// `offset`), handing each part to `sink`; returns the digest of what was read (the caller
/// compares it with the address it asked for before it uses a byte).
pub(crate) fn read_parts(
    targets: &[OperatorTarget],
    request: impl Fn(u64) -> OperatorRequest,
    mut sink: impl FnMut(&[u8]) -> Result<(), OpError>,
) -> Result<String, OpError> {
    let mut h = Sha256::new();
    let mut offset = 0u64;
    loop {
        let v = operator_request_any(targets, &request(offset))?;
        let data = v["data"]
            .as_str()
            .and_then(|d| base64::engine::general_purpose::STANDARD.decode(d).ok());
        let (Some(size), Some(data)) = (v["size"].as_u64(), data) else {
            return Err(err(
                Category::Internal,
                "the coordinator's answer to a read of a stored object is malformed",
            ));
        };
        if v["offset"].as_u64() != Some(offset) || data.is_empty() {
            return Err(err(
                Category::Internal,
                "the coordinator answered a read of a stored object with the wrong part",
            ));
        }
        h.update(&data);
        sink(&data)?;
        offset += data.len() as u64;
        if offset >= size {
            return Ok(format!("sha256:{}", hex::encode(h.finalize())));
        }
    }
}

/// Reads stored object `object` of checkpoint `digest` into `file`, checking the whole
/// against its address.
fn read_object(
    targets: &[OperatorTarget],
    digest: &str,
    object: &str,
    file: &Path,
) -> Result<(), OpError> {
    let io = |e: std::io::Error| err(Category::Internal, format!("{}: {e}", file.display()));
    let mut f = std::fs::File::create(file).map_err(io)?;
    let got = read_parts(
        targets,
        |offset| OperatorRequest::CheckpointRead {
            checkpoint_digest: digest.to_string(),
            object_digest: object.to_string(),
            offset,
        },
        |data| f.write_all(data).map_err(io),
    )?;
    f.sync_all().map_err(io)?;
    if got != object {
        return Err(err(
            Category::Conflict,
            format!("corrupt: object {object} as read hashes to {got}: not restored"),
        ));
    }
    Ok(())
}
