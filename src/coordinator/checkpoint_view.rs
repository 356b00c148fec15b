//! `mosaic checkpoint show`: an operator opens a stored checkpoint read-only — what it
//! binds, the files it changed against its base, and (asked) the diff. The coordinator
//! reads the checkpoint's objects from its own store, verifying each against its digest as
//! it writes it to a private scratch repository, lets git import them checking every
//! object, and answers from there; the scratch is removed before the answer goes.
//!
//! **Never:** logs a byte of checkpoint content, shows a checkpoint whose objects are not
//! whole and equal to their digests, or reads any repository but the scratch one.

use std::io::Write;
use std::path::Path;

use sha2::{Digest, Sha256};

use super::error::{reject, AuthorityError, Category};
use super::rows::RowExt;
use super::store::Store;
use crate::util::git::git;

/// Most bytes of diff an answer carries; beyond, it is cut and says so.
pub const DIFF_MAX_BYTES: usize = 1 << 20;

/// git's empty tree: the base of a checkpoint that has none.
const EMPTY_TREE: &str = "4b825dc642cb6eb9a060e54bf8d69288fbee4904";

const OP: &str = "checkpoint-show";

impl Store {
    /// The checkpoint `digest`: its rows, the files it changed against its base, and with
    /// `diff` the patch (at most `DIFF_MAX_BYTES`). `scratch` is a directory only this
    /// process writes (removed after).
    pub async fn checkpoint_show(
        &self,
        digest: &str,
        diff: bool,
        scratch: &Path,
        who: &str,
    ) -> Result<serde_json::Value, AuthorityError> {
        if !crate::protocol::envelope::is_digest(digest) {
            return Err(reject(
                OP,
                Category::BadInput,
                "a checkpoint digest is sha256: and 64 lowercase hex digits",
            ));
        }
        let rows = self.checkpoints(None, Some(digest)).await?;
        let Some(first) = rows.first() else {
            return Err(reject(
                OP,
                Category::NotFound,
                format!("no checkpoint {digest}"),
            ));
        };
        let text = |k: &str| first[k].as_str().map(String::from);
        let (commit, bundle, base, base_object) = (
            text("commit_id").unwrap_or_default(),
            rows.iter()
                .find_map(|r| r["bundle_object"].as_str().map(String::from)),
            text("base_commit_id"),
            rows.iter()
                .find_map(|r| r["base_object"].as_str().map(String::from)),
        );
        let Some(bundle) = bundle else {
            let why = rows
                .iter()
                .find_map(|r| r["transfer_error"].as_str().map(String::from))
                .unwrap_or_else(|| "its host has not uploaded it yet".into());
            return Err(reject(
                OP,
                Category::WrongState,
                format!(
                    "checkpoint {digest} is not in the store ({why}); it is on host:{} only",
                    text("host_id").unwrap_or_default()
                ),
            ));
        };
        let dir = scratch.join(format!("view-{}", uuid::Uuid::new_v4().simple()));
        let out = self
            .view_in(
                &dir,
                &commit,
                base.as_deref(),
                base_object.as_deref(),
                &bundle,
                diff,
            )
            .await;
        let _ = std::fs::remove_dir_all(&dir);
        let (files, patch) = out?;
        // Recorded once there is something to show, before it is shown.
        self.record_read(OP, digest, None, who).await?;
        let mut v =
            serde_json::json!({ "checkpoint_digest": digest, "checkpoints": rows, "files": files });
        if let Some((p, cut)) = patch {
            v["diff"] = serde_json::json!(p);
            v["diff_truncated"] = serde_json::json!(cut);
        }
        Ok(v)
    }

    /// Writes the objects into a scratch repository at `dir` and reads the change there.
    #[allow(clippy::type_complexity)]
    async fn view_in(
        &self,
        dir: &Path,
        commit: &str,
        base: Option<&str>,
        base_object: Option<&str>,
        bundle: &str,
        diff: bool,
    ) -> Result<(Vec<serde_json::Value>, Option<(String, bool)>), AuthorityError> {
        let internal = |e: String| reject(OP, Category::Internal, e);
        crate::util::durable::ensure_dir(dir, 0o700).map_err(|e| internal(e.to_string()))?;
        let mut files = vec![];
        if let (Some(_), Some(o)) = (base, base_object) {
            files.push(self.object_file(o, &dir.join("base.bundle")).await?);
        }
        files.push(
            self.object_file(bundle, &dir.join("checkpoint.bundle"))
                .await?,
        );
        let (dir, commit, base) = (
            dir.to_path_buf(),
            commit.to_string(),
            base.map(String::from),
        );
        tokio::task::spawn_blocking(move || {
            let repo = dir.join("repo.git");
            let r = repo.to_string_lossy().to_string();
            git(&["init", "--quiet", "--bare", &r], None)?;
            for (i, f) in files.iter().enumerate() {
                let f = f.to_string_lossy().to_string();
                let spec = format!("+refs/*:refs/view/{i}/*");
                crate::util::git::fetch_checked(&repo, &f, &spec)?;
            }
            let from = base.as_deref().unwrap_or(EMPTY_TREE);
            let names = git(
                &[
                    "diff",
                    "--no-color",
                    "--no-renames",
                    "--name-status",
                    from,
                    &commit,
                ],
                Some(&repo),
            )?;
            let files: Vec<serde_json::Value> = names
                .lines()
                .filter_map(|l| l.split_once('\t'))
                .map(|(s, p)| serde_json::json!({ "status": s, "path": p }))
                .collect();
            let patch = if diff {
                let p = git(
                    &[
                        "diff",
                        "--no-color",
                        "--no-renames",
                        "--no-ext-diff",
                        "--no-textconv",
                        from,
                        &commit,
                    ],
                    Some(&repo),
                )?;
                let cut = p.len() > DIFF_MAX_BYTES;
                let mut end = p.len().min(DIFF_MAX_BYTES);
                while !p.is_char_boundary(end) {
                    end -= 1;
                }
                Some((p[..end].to_string(), cut))
            } else {
                None
            };
            Ok::<_, String>((files, patch))
        })
        .await
        .map_err(|e| internal(e.to_string()))?
        .map_err(|e| {
            reject(
                OP,
                Category::Internal,
                format!("reading the stored checkpoint: {e}"),
            )
        })
    }

    /// Writes stored object `digest` to `path` part by part, checking the whole against
    /// its digest; refused as `corrupt` (and audited) when it differs.
    async fn object_file(
        &self,
        digest: &str,
        path: &Path,
    ) -> Result<std::path::PathBuf, AuthorityError> {
        let c = self.pool.get().await?;
        let stored = c
            .query_opt(
                "SELECT size FROM checkpoint_objects WHERE object_digest = $1 AND stored_at IS NOT NULL",
                &[&digest],
            )
            .await?;
        if stored.is_none() {
            return Err(reject(
                OP,
                Category::WrongState,
                format!("object {digest} is not stored"),
            ));
        }
        let mut f = std::fs::File::create(path)
            .map_err(|e| reject(OP, Category::Internal, e.to_string()))?;
        let mut h = Sha256::new();
        let mut part = 0i32;
        loop {
            let Some(r) = c
                .query_opt(
                    "SELECT data FROM checkpoint_object_parts WHERE object_digest = $1 AND part = $2",
                    &[&digest, &part],
                )
                .await?
            else {
                break;
            };
            let d: Vec<u8> = r.col("data")?;
            h.update(&d);
            f.write_all(&d)
                .map_err(|e| reject(OP, Category::Internal, e.to_string()))?;
            part += 1;
        }
        if format!("sha256:{}", hex::encode(h.finalize())) != digest {
            self.auditor().record(
                OP,
                Category::Conflict,
                None,
                None,
                None,
                &format!("corrupt: stored object {digest} does not hash to its address: not shown"),
            );
            return Err(reject(
                OP,
                Category::Conflict,
                format!("corrupt: stored object {digest} does not hash to its address"),
            ));
        }
        Ok(path.to_path_buf())
    }
}

/// Most parts of an object one `checkpoint-read` answer carries (about 960 KiB).
pub const READ_PARTS: i32 = 20;

const READ_OP: &str = "checkpoint-read";
const ARTIFACT_READ_OP: &str = "artifact-read";

impl Store {
    /// Bytes of object `object` of the stored checkpoint `digest`, for an operator's
    /// `checkpoint restore`: from `offset` (a whole number of parts), at most
    /// [`READ_PARTS`] parts, base64. An object only that checkpoint names, only once
    /// stored; a read from its start verifies the whole against its address first (a
    /// changed byte is refused as `corrupt`, and audited). The reader verifies the whole
    /// again: an answer proves nothing by itself.
    pub async fn checkpoint_read(
        &self,
        digest: &str,
        object: &str,
        offset: u64,
        who: &str,
    ) -> Result<serde_json::Value, AuthorityError> {
        use crate::protocol::messages::PART_BYTES;
        let is = crate::protocol::envelope::is_digest;
        if !is(digest) || !is(object) || offset % PART_BYTES as u64 != 0 {
            return Err(reject(
                READ_OP,
                Category::BadInput,
                "a checkpoint and an object are each sha256: and 64 lowercase hex digits; an offset is a whole number of parts",
            ));
        }
        self.read_stored(
            READ_OP,
            "SELECT o.size, o.stored_at IS NOT NULL AS stored FROM checkpoints ck \
             JOIN checkpoint_objects o ON o.object_digest = $2 \
             WHERE ck.checkpoint_digest = $1 AND (ck.bundle_object = $2 OR ck.base_object = $2) LIMIT 1",
            digest,
            object,
            offset,
            who,
        )
        .await
    }

    /// Bytes of stored harness artifact `digest` (encrypted: the operator's identity opens
    /// it), from `offset`, for `mosaic checkpoint artifact`; like a checkpoint's object
    /// (verified from its start, each read recorded before the answer).
    pub async fn artifact_read(
        &self,
        digest: &str,
        offset: u64,
        who: &str,
    ) -> Result<serde_json::Value, AuthorityError> {
        use crate::protocol::messages::PART_BYTES;
        if !crate::protocol::envelope::is_digest(digest) || offset % PART_BYTES as u64 != 0 {
            return Err(reject(
                ARTIFACT_READ_OP,
                Category::BadInput,
                "an artifact is sha256: and 64 lowercase hex digits; an offset is a whole number of parts",
            ));
        }
        self.read_stored(
            ARTIFACT_READ_OP,
            "SELECT o.size, o.stored_at IS NOT NULL AS stored FROM harness_artifacts a \
             JOIN checkpoint_objects o ON o.object_digest = a.object \
             WHERE a.artifact_digest = $1 AND a.object = $2 LIMIT 1",
            digest,
            digest,
            offset,
            who,
        )
        .await
    }

    /// Serves `object` of `digest` (a checkpoint's or an artifact's, found by `lookup`:
    /// `$1` the digest, `$2` the object; answering its size and whether it is whole).
    #[allow(clippy::too_many_arguments)]
    async fn read_stored(
        &self,
        op: &'static str,
        lookup: &str,
        digest: &str,
        object: &str,
        offset: u64,
        who: &str,
    ) -> Result<serde_json::Value, AuthorityError> {
        use crate::protocol::messages::PART_BYTES;
        use base64::Engine as _;
        let part_bytes = PART_BYTES as u64;
        let c = self.pool.get().await?;
        let Some(r) = c.query_opt(lookup, &[&digest, &object]).await? else {
            return Err(reject(
                op,
                Category::NotFound,
                format!("{digest} names no stored object {object}"),
            ));
        };
        let size: i64 = r.col("size")?;
        if !r.col::<bool>("stored")? {
            return Err(reject(
                op,
                Category::WrongState,
                format!("object {object} is not whole in the store yet"),
            ));
        }
        let size = size as u64;
        if offset >= size {
            return Err(reject(
                op,
                Category::BadInput,
                format!("offset {offset} is past the object's {size} bytes"),
            ));
        }
        let corrupt = || {
            let why = format!("corrupt: stored object {object} does not hash to its address");
            self.auditor().record(
                op,
                Category::Conflict,
                None,
                None,
                None,
                &format!("{why}: not served"),
            );
            reject(op, Category::Conflict, why)
        };
        if offset == 0 {
            if !super::checkpoint_store::whole_matches(&c, object).await? {
                return Err(corrupt());
            }
            tracing::info!(
                checkpoint_digest = digest,
                object_digest = object,
                "a stored checkpoint object read by an operator"
            );
        }
        let first = (offset / part_bytes) as i32;
        let want = (size - offset).div_ceil(part_bytes).min(READ_PARTS as u64) as usize;
        let rows = c
            .query(
                "SELECT part, data FROM checkpoint_object_parts \
                 WHERE object_digest = $1 AND part >= $2 AND part < $3 ORDER BY part",
                &[&object, &first, &(first + READ_PARTS)],
            )
            .await?;
        let mut data = Vec::with_capacity(want * PART_BYTES);
        for (i, r) in rows.iter().enumerate() {
            if r.col::<i32>("part")? != first + i as i32 {
                return Err(corrupt());
            }
            data.extend_from_slice(&r.col::<Vec<u8>>("data")?);
        }
        if rows.len() != want {
            return Err(corrupt());
        }
        self.record_read(op, digest, Some((object, offset)), who)
            .await?;
        Ok(serde_json::json!({
            "object_digest": object,
            "size": size,
            "offset": offset,
            "data": base64::engine::general_purpose::STANDARD.encode(&data),
        }))
    }

    /// Records that operator `who` reads checkpoint `digest` (`show`), or `object` from
    /// `offset` (`read`): committed before the answer is given, so nothing of a checkpoint
    /// reaches an operator unrecorded.
    async fn record_read(
        &self,
        what: &'static str,
        digest: &str,
        object: Option<(&str, u64)>,
        who: &str,
    ) -> Result<(), AuthorityError> {
        let c = self.pool.get().await?;
        let who: String = who.chars().take(200).collect();
        let (object, offset) = match object {
            Some((o, at)) => (Some(o), Some(at as i64)),
            None => (None, None),
        };
        // An artifact's read names the artifact's digest (its work is the artifact's).
        let n = c
            .execute(
                if what == ARTIFACT_READ_OP {
                    "INSERT INTO checkpoint_reads (what, checkpoint_digest, object_digest, byte_offset, assignment_id, reader) \
                     SELECT $1, $2, $3, $4, assignment_id, $5 FROM harness_artifacts WHERE artifact_digest = $2 LIMIT 1"
                } else {
                    "INSERT INTO checkpoint_reads (what, checkpoint_digest, object_digest, byte_offset, assignment_id, reader) \
                     SELECT $1, $2, $3, $4, assignment_id, $5 FROM checkpoints WHERE checkpoint_digest = $2 LIMIT 1"
                },
                &[&what, &digest, &object, &offset, &who],
            )
            .await?;
        if n != 1 {
            return Err(reject(
                what,
                Category::NotFound,
                format!("no checkpoint {digest}"),
            ));
        }
        Ok(())
    }

    /// What operators read of stored checkpoints (of one assignment), oldest first.
    pub async fn checkpoint_reads(
        &self,
        assignment_id: Option<&str>,
    ) -> Result<Vec<serde_json::Value>, AuthorityError> {
        let c = self.pool.get().await?;
        let rows = c
            .query(
                "SELECT what, checkpoint_digest, object_digest, byte_offset, assignment_id, reader, mosaic_ts(read_at) AS read_at \
                 FROM checkpoint_reads WHERE $1::text IS NULL OR assignment_id = $1 ORDER BY read_id",
                &[&assignment_id],
            )
            .await?;
        rows.iter()
            .map(|r| {
                Ok(serde_json::json!({
                    "what": r.col::<String>("what")?,
                    "checkpoint_digest": r.col::<String>("checkpoint_digest")?,
                    "object_digest": r.col::<Option<String>>("object_digest")?,
                    "offset": r.col::<Option<i64>>("byte_offset")?,
                    "assignment_id": r.col::<String>("assignment_id")?,
                    "reader": r.col::<String>("reader")?,
                    "read_at": r.col::<String>("read_at")?,
                }))
            })
            .collect()
    }
}
