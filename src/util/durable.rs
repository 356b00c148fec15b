//! Crash-safe file writes: write a temp file, fsync it, publish it with rename or link, and
//! fsync the directory so the new name itself survives power loss.
//!
//! **Never** leaves a half-written file under the final name; `create_new` never
//! overwrites.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum DurableError {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} already exists")]
    Exists { path: PathBuf },
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> DurableError + 'a {
    move |source| DurableError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

fn tmp_name(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".tmp-{}", uuid::Uuid::new_v4().simple()));
    path.with_file_name(name)
}

/// Writes `bytes` to a fresh temp file beside `path` and fsyncs it. A write that fails
/// (a full or read-only filesystem) removes its temp file: nothing half-written stays.
fn write_tmp(path: &Path, bytes: &[u8]) -> Result<PathBuf, DurableError> {
    let tmp = tmp_name(path);
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io_err("create", &tmp))?;
    let written = f
        .write_all(bytes)
        .map_err(io_err("write", &tmp))
        .and_then(|()| f.sync_all().map_err(io_err("fsync", &tmp)));
    if let Err(e) = written {
        drop(f);
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(tmp)
}

/// fsyncs a directory so entries created, renamed or removed in it are durable.
pub fn sync_dir(dir: &Path) -> Result<(), DurableError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("fsync dir", dir))
}

fn parent(path: &Path) -> &Path {
    path.parent().unwrap_or(Path::new("."))
}

/// Atomically replaces `path` with `bytes`.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), DurableError> {
    let tmp = write_tmp(path, bytes)?;
    if let Err(e) = fs::rename(&tmp, path) {
        let _ = fs::remove_file(&tmp);
        return Err(io_err("rename", path)(e));
    }
    sync_dir(parent(path))
}

/// Creates `path` with `bytes` only if no file of that name exists, durably. The `link`
/// system call is the atomic exclusive publish: two racing writers cannot both succeed.
pub fn create_new(path: &Path, bytes: &[u8]) -> Result<(), DurableError> {
    let tmp = write_tmp(path, bytes)?;
    let linked = fs::hard_link(&tmp, path);
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(()) => sync_dir(parent(path)),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Err(DurableError::Exists {
            path: path.to_path_buf(),
        }),
        Err(e) => Err(io_err("link", path)(e)),
    }
}

/// Creates `path` (0600, never over an existing file) holding `bytes`, without fsync: for
/// a hand-off that only has to outlive the current operation (a launch nonce), never for
/// state a restart reads.
pub fn create_private(path: &Path, bytes: &[u8]) -> Result<(), DurableError> {
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| match e.kind() {
            io::ErrorKind::AlreadyExists => DurableError::Exists {
                path: path.to_path_buf(),
            },
            _ => io_err("create", path)(e),
        })?;
    f.write_all(bytes).map_err(|e| {
        let _ = fs::remove_file(path);
        io_err("write", path)(e)
    })
}

/// Moves `from` to `to` (same filesystem) and makes both directory entries durable.
pub fn move_file(from: &Path, to: &Path) -> Result<(), DurableError> {
    fs::rename(from, to).map_err(io_err("rename", from))?;
    sync_dir(parent(to))?;
    sync_dir(parent(from))
}

/// `mkdir -p` with the given mode on the directories it creates.
pub fn ensure_dir(path: &Path, mode: u32) -> Result<(), DurableError> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)
        .map_err(io_err("mkdir", path))
}

/// Gives `root` and everything below it to `uid`:`gid`, never following a symbolic link
/// (a link is re-owned itself, its target left alone). What is already theirs is not
/// touched (a `chown` changes a file's ctime, which would make every file look changed
/// to a checkpoint's index).
pub fn chown_tree(root: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let meta = std::fs::symlink_metadata(&p)?;
        if meta.uid() != uid || meta.gid() != gid {
            std::os::unix::fs::lchown(&p, Some(uid), Some(gid))?;
        }
        if meta.is_dir() {
            for e in std::fs::read_dir(&p)? {
                stack.push(e?.path());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_new_refuses_second_writer() {
        let dir = std::env::temp_dir().join(format!("mosaic-durable-{}", uuid::Uuid::new_v4()));
        ensure_dir(&dir, 0o700).unwrap();
        let p = dir.join("x.json");
        create_new(&p, b"one").unwrap();
        assert!(matches!(
            create_new(&p, b"two"),
            Err(DurableError::Exists { .. })
        ));
        assert_eq!(fs::read(&p).unwrap(), b"one");
        write_atomic(&p, b"three").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"three");
        // No temp files left behind.
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 1);
        fs::remove_dir_all(&dir).unwrap();
    }
}
