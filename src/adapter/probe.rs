//! Version probes: the installed binary must report exactly the version requested, and a
//! verdict is remembered only for the exact file that produced it (device, inode, size,
//! ctime, mtime), so a binary swapped in place is probed again.

use std::path::Path;
use std::time::Duration;

use super::*;

/// Runs the entry's version probe; the installed binary must report exactly the version
/// requested. A probe that disagrees, fails or cannot run refuses the launch.
pub fn probe_version(entry: &Entry, r: &RuntimeRef, paths: &Paths) -> Result<(), RegistryError> {
    let v = r.version.to_string();
    let fail = |detail: String| RegistryError::Probe {
        runtime: r.runtime.clone(),
        version: v.clone(),
        detail,
    };
    let argv = probe_argv(entry, r, paths);
    let (prog, rest) = argv
        .split_first()
        .ok_or_else(|| fail("empty probe command".into()))?;
    // A clean environment and a throwaway HOME/TMPDIR: the probe must not read or write the
    // supervisor's own state (harnesses create config and cache directories on any start),
    // and it is killed if it does not answer in time.
    let home = std::env::temp_dir().join(format!("mosaic-probe-{}", uuid::Uuid::new_v4().simple()));
    crate::util::durable::ensure_dir(&home, 0o700).map_err(|e| fail(e.to_string()))?;
    let out = crate::util::run_bounded(
        std::process::Command::new(prog)
            .args(rest)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", &home)
            .env("TMPDIR", &home)
            // Claude Code puts a socket under $XDG_RUNTIME_DIR, else in /tmp/cc-socks-<uid>.
            .env("XDG_RUNTIME_DIR", &home)
            .env("XDG_CONFIG_HOME", &home)
            .env("XDG_DATA_HOME", &home)
            .env("XDG_STATE_HOME", &home)
            .env("XDG_CACHE_HOME", &home)
            .env("LANG", "C.UTF-8")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null()),
        PROBE_TIMEOUT,
    );
    let _ = std::fs::remove_dir_all(&home);
    let out = out.map_err(|e| fail(format!("cannot run {prog}: {e}")))?;
    let got = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let want = entry.probes.version.expect.replace("{version}", &v);
    if !out.status.success() || got != want {
        return Err(fail(format!(
            "expected {want:?}, probe printed {got:?} ({})",
            out.status
        )));
    }
    Ok(())
}

/// How long a version probe may take before it is killed and the launch refused.
pub(super) const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

pub(super) fn probe_argv(entry: &Entry, r: &RuntimeRef, paths: &Paths) -> Vec<String> {
    let vars = Vars {
        bin_dir: paths.bin_dir.clone(),
        harness_root: paths.harness_root.clone(),
        version: r.version.to_string(),
        ..Vars::default()
    };
    expand(&entry.probes.version.command, &vars, &[])
}

/// The identity of one file a probe runs: a binary replaced, rewritten or touched in place
/// changes at least one of these.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct FileId {
    path: PathBuf,
    dev: u64,
    ino: u64,
    size: u64,
    ctime: (i64, i64),
    mtime: (i64, i64),
}

pub(super) fn file_id(p: &Path) -> Option<FileId> {
    use std::os::unix::fs::MetadataExt;
    let real = std::fs::canonicalize(p).ok()?;
    let m = std::fs::metadata(&real).ok()?;
    m.is_file().then(|| FileId {
        path: real,
        dev: m.dev(),
        ino: m.ino(),
        size: m.size(),
        ctime: (m.ctime(), m.ctime_nsec()),
        mtime: (m.mtime(), m.mtime_nsec()),
    })
}

/// Passed probes, by runtime and the identity of every file the probe ran. A probe is
/// re-run whenever any of those files changes (a binary swapped or rewritten in place), or
/// its symlink points elsewhere; a failed probe is never remembered.
#[derive(Debug, Default)]
pub struct ProbeCache {
    passed: std::sync::Mutex<std::collections::HashSet<(String, Vec<FileId>)>>,
    runs: std::sync::atomic::AtomicU64,
}

impl ProbeCache {
    /// How many probes actually ran (for tests and metrics).
    pub fn runs(&self) -> u64 {
        self.runs.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Registry {
    /// The version probe, recalled when the same binary already passed it.
    pub fn probe(&self, entry: &Entry, r: &RuntimeRef, paths: &Paths) -> Result<(), RegistryError> {
        let argv = probe_argv(entry, r, paths);
        let ids: Option<Vec<FileId>> = {
            let files: Vec<FileId> = argv
                .iter()
                .filter(|a| a.starts_with('/'))
                .filter_map(|a| file_id(Path::new(a)))
                .collect();
            // Only a probe whose program is a file we can identify can be cached.
            (argv.first().is_some_and(|a| a.starts_with('/')) && !files.is_empty()).then_some(files)
        };
        let key = ids.map(|ids| (r.to_string(), ids));
        if let Some(k) = &key {
            if self.probes.passed.lock().is_ok_and(|p| p.contains(k)) {
                return Ok(());
            }
        }
        self.probes
            .runs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        probe_version(entry, r, paths)?;
        if let Some(k) = key {
            // The files must not have changed while the probe ran.
            let still: Vec<FileId> = k.1.iter().filter_map(|f| file_id(&f.path)).collect();
            if still == k.1 {
                if let Ok(mut p) = self.probes.passed.lock() {
                    p.insert(k);
                }
            }
        }
        Ok(())
    }

    pub fn probe_cache(&self) -> &ProbeCache {
        &self.probes
    }

    /// The entry for an installable runtime reference (for `mosaic harness install`).
    pub fn entry(&self, r: &RuntimeRef) -> Result<&Entry, RegistryError> {
        self.resolve(r)
    }
}
