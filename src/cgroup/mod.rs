//! The cgroup v2 layer: discovery, the delegated root, the lane/generation layout, and the
//! kill-and-verify primitive every stop is built on.
//!
//! **Owns:** every write under the cgroup mount (mkdir, `cgroup.procs`, `cgroup.kill`,
//! `cgroup.freeze`, rmdir). No other module touches the cgroup filesystem for writing.
//!
//! **Never:** reports a cgroup empty on a read error (a failed read is an error, not "no
//! processes"), falls back to cgroup v1, or signals a PID that was not frozen or verified
//! first.
//!
//! cgroups-rs does the generic work (create, `cgroup.kill`, freeze/thaw, rmdir) through
//! [`MountedV2`], our `Hierarchy` implementation for wherever the unified hierarchy is
//! actually mounted (the crate assumes `/sys/fs/cgroup`). `cgroup.events` and
//! `cgroup.procs` are read here directly, because the crate either does not expose them or
//! turns read failures into empty lists.

pub mod discover;

use std::fs;
use std::io::{self, Write as _};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cgroups_rs::freezer::FreezerController;
use cgroups_rs::{Hierarchy, Subsystem};

pub use discover::V2Mount;

/// Errors of the cgroup layer. Every variant names the path it failed on.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("no usable cgroup v2 hierarchy: {detail}")]
    NoV2 { detail: String },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot write {data:?} to {path}: {source}")]
    Write {
        path: PathBuf,
        data: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot create cgroup {path}: {source}")]
    Create {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot remove cgroup {path}: {source}")]
    Remove {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "cgroup {path} is not writable by this process ({source}); run as root with \
         `cgroup_root` configured, or under a systemd unit with Delegate=yes"
    )]
    NotWritable {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "this process sits in the root cgroup, which cannot be delegated; set `cgroup_root` \
         in the supervisor config (as root) or run under systemd with Delegate=yes"
    )]
    RootCgroupNotDelegated,
    #[error("configured cgroup root {path} is not inside the cgroup v2 mount {mount}")]
    OutsideMount { path: PathBuf, mount: PathBuf },
    #[error("malformed {file}: {detail}")]
    Malformed { file: PathBuf, detail: String },
    #[error("cgroup {path} did not empty within {waited:?}: {remaining} process(es) remain")]
    WillNotEmpty {
        path: PathBuf,
        waited: Duration,
        remaining: usize,
    },
    #[error("cgroup {path} did not freeze within {waited:?}")]
    WillNotFreeze { path: PathBuf, waited: Duration },
    #[error("cgroup operation on {path} failed: {detail}")]
    Library { path: PathBuf, detail: String },
}

/// cgroups-rs `Hierarchy` for a v2 mount found at run time rather than assumed.
///
/// Only the freezer "subsystem" is listed: in v2 it is core functionality (`cgroup.freeze`),
/// and Mosaic enables no resource controllers, so creating a cgroup never writes
/// `cgroup.subtree_control` and the no-internal-process rule never bites.
#[derive(Debug, Clone)]
pub struct MountedV2 {
    mount: PathBuf,
}

impl MountedV2 {
    pub fn new(mount: PathBuf) -> Self {
        Self { mount }
    }
}

impl Hierarchy for MountedV2 {
    fn subsystems(&self) -> Vec<Subsystem> {
        vec![Subsystem::Freezer(FreezerController::new(
            self.root(),
            true,
        ))]
    }
    fn root(&self) -> PathBuf {
        self.mount.clone()
    }
    fn root_control_group(&self) -> cgroups_rs::Cgroup {
        cgroups_rs::Cgroup::load(Box::new(self.clone()), "")
    }
    fn parent_control_group(&self, path: &str) -> cgroups_rs::Cgroup {
        let parent = Path::new(path).parent().unwrap_or(Path::new(""));
        cgroups_rs::Cgroup::load(Box::new(self.clone()), parent)
    }
    fn v2(&self) -> bool {
        true
    }
}

/// How a cgroup's members are killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KillMethod {
    /// `cgroup.kill` (Linux 5.14+): the kernel SIGKILLs the whole subtree, racing nothing.
    CgroupKill,
    /// Freeze the cgroup, SIGKILL every member (PIDs cannot exit or be reused while frozen),
    /// thaw, repeat until empty.
    FreezeAndKill,
}

/// `cgroup.events` as read at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Events {
    pub populated: bool,
    pub frozen: bool,
}

/// What a kill-and-verify pass saw.
#[derive(Debug, Clone, serde::Serialize)]
pub struct KillReport {
    pub method: KillMethod,
    /// Members present when the kill began (a snapshot; the kernel kills the whole subtree).
    pub members_before: usize,
    pub waited_us: u64,
}

/// The delegated subtree this supervisor owns.
#[derive(Debug, Clone)]
pub struct CgroupTree {
    mount: PathBuf,
    root: PathBuf,
    kill_method: KillMethod,
}

impl CgroupTree {
    /// Resolves the supervisor's root: `configured` (must lie inside the mount) or, when
    /// none is configured, the cgroup this process already runs in (systemd
    /// `Delegate=yes`). Creates it if needed and proves it is writable.
    pub fn open(
        mount: &V2Mount,
        configured: Option<&Path>,
        own_cgroup: &str,
        force_freezer: bool,
    ) -> Result<Self, CgroupError> {
        let root = match configured {
            Some(p) => {
                if !p.starts_with(&mount.path) || p == mount.path {
                    return Err(CgroupError::OutsideMount {
                        path: p.to_path_buf(),
                        mount: mount.path.clone(),
                    });
                }
                p.to_path_buf()
            }
            None => {
                if own_cgroup == "/" || own_cgroup.is_empty() {
                    return Err(CgroupError::RootCgroupNotDelegated);
                }
                mount.path.join(own_cgroup.trim_start_matches('/'))
            }
        };
        if !mount.path.join("cgroup.controllers").exists() {
            return Err(CgroupError::NoV2 {
                detail: format!("{} has no cgroup.controllers", mount.path.display()),
            });
        }
        match fs::create_dir(&root) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                return Err(CgroupError::NotWritable {
                    path: root,
                    source: e,
                })
            }
            Err(e) => {
                return Err(CgroupError::Create {
                    path: root,
                    source: e,
                })
            }
        }
        rustix::fs::access(root.join("cgroup.procs"), rustix::fs::Access::WRITE_OK).map_err(
            |e| CgroupError::NotWritable {
                path: root.join("cgroup.procs"),
                source: e.into(),
            },
        )?;
        let kill_method = if !force_freezer && root.join("cgroup.kill").exists() {
            KillMethod::CgroupKill
        } else {
            KillMethod::FreezeAndKill
        };
        Ok(Self {
            mount: mount.path.clone(),
            root,
            kill_method,
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }
    pub fn kill_method(&self) -> KillMethod {
        self.kill_method
    }

    pub fn mount(&self) -> &Path {
        &self.mount
    }

    /// `abs` as `/proc/<pid>/cgroup` prints it: relative to the mount, with a leading `/`.
    pub fn rel(&self, abs: &Path) -> String {
        format!(
            "/{}",
            abs.strip_prefix(&self.mount).unwrap_or(abs).display()
        )
    }

    /// A handle for an absolute cgroup directory (from a persisted record).
    pub fn at_abs(&self, abs: &Path) -> Cg {
        Cg::new(&self.mount, abs.to_path_buf(), self.kill_method)
    }

    /// A handle for `<root>/<rel>`; nothing is created.
    pub fn at(&self, rel: &str) -> Cg {
        Cg::new(&self.mount, self.root.join(rel), self.kill_method)
    }

    pub fn supervisor(&self) -> Cg {
        self.at("supervisor")
    }

    /// Moves this process out of the tree (to the root's parent) and removes what Mosaic
    /// made in it (`lanes/`, `supervisor/`) and then the root: a supervisor leaving the
    /// fleet (`mosaic host decommission`). Refused by the kernel while anything still runs
    /// in it; a root holding anything else is left (its rmdir fails).
    pub fn leave_and_remove(&self) -> Result<(), CgroupError> {
        let procs = self
            .root
            .parent()
            .unwrap_or(&self.mount)
            .join("cgroup.procs");
        fs::write(&procs, std::process::id().to_string()).map_err(|source| {
            CgroupError::Remove {
                path: procs.clone(),
                source,
            }
        })?;
        for part in ["lanes", "supervisor"] {
            let c = self.at(part);
            if c.exists() {
                c.remove_tree()?;
            }
        }
        fs::remove_dir(&self.root).map_err(|source| CgroupError::Remove {
            path: self.root.clone(),
            source,
        })
    }
    pub fn lanes(&self) -> Cg {
        self.at("lanes")
    }
    pub fn lane(&self, lane: &str) -> Cg {
        self.at(&format!("lanes/{lane}"))
    }
    pub fn lane_tmux(&self, lane: &str) -> Cg {
        self.at(&format!("lanes/{lane}/tmux"))
    }
    pub fn incarnation(&self, lane: &str, incarnation: &str) -> Cg {
        self.at(&format!("lanes/{lane}/{incarnation}"))
    }
    pub fn generation(&self, lane: &str, incarnation: &str, generation: u64) -> Cg {
        self.at(&format!("lanes/{lane}/{incarnation}/gen-{generation}"))
    }

    /// Kills and removes everything below the root, then the root itself. For tests and
    /// `mosaic up` teardown; the supervisor never calls it on a live fleet.
    pub fn destroy_all(&self, timeout: Duration) -> Result<(), CgroupError> {
        let root = Cg::new(&self.mount, self.root.clone(), self.kill_method);
        if !root.exists() {
            return Ok(());
        }
        root.kill_and_wait(timeout)?;
        root.remove_tree()
    }
}

/// One cgroup directory.
#[derive(Debug)]
pub struct Cg {
    mount: PathBuf,
    abs: PathBuf,
    inner: cgroups_rs::Cgroup,
    kill_method: KillMethod,
}

impl Cg {
    fn new(mount: &Path, abs: PathBuf, kill_method: KillMethod) -> Self {
        let rel = abs.strip_prefix(mount).unwrap_or(&abs).to_path_buf();
        let inner = cgroups_rs::Cgroup::load_with_specified_controllers(
            Box::new(MountedV2::new(mount.to_path_buf())),
            rel,
            Vec::new(),
        );
        Self {
            mount: mount.to_path_buf(),
            abs,
            inner,
            kill_method,
        }
    }

    pub fn path(&self) -> &Path {
        &self.abs
    }

    pub fn exists(&self) -> bool {
        self.abs.join("cgroup.procs").exists()
    }

    /// Creates the cgroup (and missing parents). Idempotent.
    pub fn create(&self) -> Result<(), CgroupError> {
        self.inner.create().map_err(|e| CgroupError::Create {
            path: self.abs.clone(),
            source: io::Error::other(e.to_string()),
        })
    }

    /// Creates the cgroup, refusing if it already exists: a fresh generation never reuses a
    /// directory some earlier process may still sit in.
    pub fn create_fresh(&self) -> Result<(), CgroupError> {
        if let Some(parent) = self.abs.parent() {
            fs::create_dir_all(parent).map_err(|e| CgroupError::Create {
                path: parent.to_path_buf(),
                source: e,
            })?;
        }
        fs::create_dir(&self.abs).map_err(|e| CgroupError::Create {
            path: self.abs.clone(),
            source: e,
        })
    }

    /// The cgroup id: the inode of the cgroup directory (what `name_to_handle_at` and
    /// bpf report). Changes whenever the directory is recreated.
    pub fn id(&self) -> Result<u64, CgroupError> {
        fs::metadata(&self.abs)
            .map(|m| m.ino())
            .map_err(|e| CgroupError::Read {
                path: self.abs.clone(),
                source: e,
            })
    }

    /// Member processes (thread-group ids). A read failure is an error, never "empty".
    pub fn procs(&self) -> Result<Vec<i32>, CgroupError> {
        let path = self.abs.join("cgroup.procs");
        let text = fs::read_to_string(&path).map_err(|e| CgroupError::Read {
            path: path.clone(),
            source: e,
        })?;
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                l.trim().parse::<i32>().map_err(|_| CgroupError::Malformed {
                    file: path.clone(),
                    detail: format!("not a pid: {l:?}"),
                })
            })
            .collect()
    }

    /// Members of this cgroup and every cgroup below it.
    pub fn procs_recursive(&self) -> Result<Vec<i32>, CgroupError> {
        let mut all = self.procs()?;
        for child in self.children()? {
            all.extend(child.procs_recursive()?);
        }
        Ok(all)
    }

    fn children(&self) -> Result<Vec<Cg>, CgroupError> {
        let rd = fs::read_dir(&self.abs).map_err(|e| CgroupError::Read {
            path: self.abs.clone(),
            source: e,
        })?;
        let mut out = Vec::new();
        for entry in rd {
            let entry = entry.map_err(|e| CgroupError::Read {
                path: self.abs.clone(),
                source: e,
            })?;
            if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                out.push(Cg::new(&self.mount, entry.path(), self.kill_method));
            }
        }
        Ok(out)
    }

    pub fn events(&self) -> Result<Events, CgroupError> {
        let path = self.abs.join("cgroup.events");
        let text = fs::read_to_string(&path).map_err(|e| CgroupError::Read {
            path: path.clone(),
            source: e,
        })?;
        parse_events(&text).ok_or_else(|| CgroupError::Malformed {
            file: path,
            detail: format!("unexpected content {text:?}"),
        })
    }

    /// Empty means both views agree: no member listed and the kernel says unpopulated.
    pub fn is_empty(&self) -> Result<bool, CgroupError> {
        Ok(!self.events()?.populated && self.procs_recursive()?.is_empty())
    }

    /// Moves the calling process into this cgroup (writing `0` moves the writer).
    pub fn join_self(&self) -> Result<(), CgroupError> {
        write_file(&self.abs.join("cgroup.procs"), "0")
    }

    /// Opens `cgroup.procs` for a later `write("0")` from a `pre_exec` hook, where only
    /// async-signal-safe calls are allowed.
    pub fn open_procs_for_join(&self) -> Result<fs::File, CgroupError> {
        let path = self.abs.join("cgroup.procs");
        fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(|e| CgroupError::Write {
                path,
                data: "0".into(),
                source: e,
            })
    }

    /// SIGKILLs every process in the subtree and waits, bounded, until the kernel and
    /// `cgroup.procs` both say it is empty. Does not remove anything.
    pub fn kill_and_wait(&self, timeout: Duration) -> Result<KillReport, CgroupError> {
        let start = Instant::now();
        let members_before = self.procs_recursive()?.len();
        match self.kill_method {
            KillMethod::CgroupKill => {
                self.inner.kill().map_err(|e| CgroupError::Write {
                    path: self.abs.join("cgroup.kill"),
                    data: "1".into(),
                    source: io::Error::other(e.to_string()),
                })?;
            }
            KillMethod::FreezeAndKill => self.freeze_kill_thaw(start, timeout)?,
        }
        self.wait_empty(start, timeout)?;
        Ok(KillReport {
            method: self.kill_method,
            members_before,
            waited_us: start.elapsed().as_micros() as u64,
        })
    }

    /// Freezes the cgroup's whole subtree and waits (up to `timeout`) until the kernel says
    /// it is frozen: no member runs (a system call under way has returned) until a kill
    /// ends it or it is thawed. Blocking.
    pub fn freeze_and_wait(&self, timeout: Duration) -> Result<(), CgroupError> {
        let start = Instant::now();
        write_file(&self.abs.join("cgroup.freeze"), "1")?;
        self.wait_until(start, timeout, |e| e.frozen || !e.populated)
            .map_err(|_| CgroupError::WillNotFreeze {
                path: self.abs.clone(),
                waited: start.elapsed(),
            })
    }

    /// Lets a frozen cgroup run again.
    pub fn thaw(&self) -> Result<(), CgroupError> {
        write_file(&self.abs.join("cgroup.freeze"), "0")
    }

    /// The fallback for kernels without `cgroup.kill`. While the cgroup is frozen its
    /// members can neither exit nor fork, so the PIDs read from `cgroup.procs` cannot be
    /// recycled under us before the SIGKILL lands. Freezing a cgroup freezes its whole
    /// subtree. Loops because a member could have been mid-fork when the freeze began.
    fn freeze_kill_thaw(&self, start: Instant, timeout: Duration) -> Result<(), CgroupError> {
        loop {
            write_file(&self.abs.join("cgroup.freeze"), "1")?;
            self.wait_until(start, timeout, |e| e.frozen || !e.populated)
                .map_err(|_| CgroupError::WillNotFreeze {
                    path: self.abs.clone(),
                    waited: start.elapsed(),
                })?;
            let members = self.procs_recursive()?;
            for pid in &members {
                // ESRCH is fine: it died on its own. Anything else is caught by the
                // emptiness check that follows.
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(*pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            write_file(&self.abs.join("cgroup.freeze"), "0")?;
            // Let this round's victims finish dying before looking again, so a PID listed
            // in the next round is a live member, not one on its way out.
            let round = Instant::now();
            if members.is_empty()
                || self
                    .wait_until(round, Duration::from_millis(200), |e| !e.populated)
                    .is_ok()
            {
                return Ok(());
            }
            if start.elapsed() >= timeout {
                return Err(CgroupError::WillNotEmpty {
                    path: self.abs.clone(),
                    waited: start.elapsed(),
                    remaining: self.procs_recursive()?.len(),
                });
            }
        }
    }

    fn wait_until(
        &self,
        start: Instant,
        timeout: Duration,
        done: impl Fn(Events) -> bool,
    ) -> Result<(), CgroupError> {
        let mut nap = Duration::from_micros(200);
        loop {
            if done(self.events()?) {
                return Ok(());
            }
            if start.elapsed() >= timeout {
                return Err(CgroupError::WillNotEmpty {
                    path: self.abs.clone(),
                    waited: start.elapsed(),
                    remaining: self
                        .procs_recursive()
                        .map(|p| p.len())
                        .unwrap_or(usize::MAX),
                });
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(5));
        }
    }

    fn wait_empty(&self, start: Instant, timeout: Duration) -> Result<(), CgroupError> {
        let mut nap = Duration::from_micros(200);
        loop {
            if self.is_empty()? {
                return Ok(());
            }
            if start.elapsed() >= timeout {
                return Err(CgroupError::WillNotEmpty {
                    path: self.abs.clone(),
                    waited: start.elapsed(),
                    remaining: self.procs_recursive()?.len(),
                });
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(5));
        }
    }

    /// Removes this (empty) cgroup. The kernel refuses while any member or child remains,
    /// which is exactly the check we want: a successful rmdir proves emptiness.
    pub fn remove(&self) -> Result<(), CgroupError> {
        self.inner.delete().map_err(|e| CgroupError::Remove {
            path: self.abs.clone(),
            source: io::Error::other(e.to_string()),
        })
    }

    /// Removes this cgroup and every cgroup below it, deepest first.
    pub fn remove_tree(&self) -> Result<(), CgroupError> {
        for child in self.children()? {
            child.remove_tree()?;
        }
        fs::remove_dir(&self.abs).map_err(|e| CgroupError::Remove {
            path: self.abs.clone(),
            source: e,
        })
    }
}

/// Parses `cgroup.events`; `None` if either key is missing.
pub fn parse_events(text: &str) -> Option<Events> {
    let mut populated = None;
    let mut frozen = None;
    for line in text.lines() {
        match line.split_once(' ') {
            Some(("populated", v)) => populated = Some(v.trim() == "1"),
            Some(("frozen", v)) => frozen = Some(v.trim() == "1"),
            _ => {}
        }
    }
    Some(Events {
        populated: populated?,
        frozen: frozen.unwrap_or(false),
    })
}

fn write_file(path: &Path, data: &str) -> Result<(), CgroupError> {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| CgroupError::Write {
            path: path.to_path_buf(),
            data: data.to_string(),
            source: e,
        })?;
    f.write_all(data.as_bytes())
        .map_err(|e| CgroupError::Write {
            path: path.to_path_buf(),
            data: data.to_string(),
            source: e,
        })
}

/// Reads the real mount table and returns the v2 mount, failing closed without one.
pub fn discover_mount() -> Result<V2Mount, CgroupError> {
    let path = PathBuf::from("/proc/self/mountinfo");
    let text = fs::read_to_string(&path).map_err(|e| CgroupError::Read { path, source: e })?;
    discover::find_v2_mount(&text)
}

/// The v2 cgroup path (relative to the mount) of `pid`, or of this process for `None`.
pub fn cgroup_of(pid: Option<i32>) -> Result<String, CgroupError> {
    let path = match pid {
        Some(p) => PathBuf::from(format!("/proc/{p}/cgroup")),
        None => PathBuf::from("/proc/self/cgroup"),
    };
    let text = fs::read_to_string(&path).map_err(|e| CgroupError::Read { path, source: e })?;
    discover::v2_path_of(&text)
}

/// Moves the calling process into the cgroup directory `path` (used by the shim, which has
/// no `CgroupTree`). The kernel refuses if the caller may not write there.
pub fn join_path(path: &Path) -> Result<(), CgroupError> {
    write_file(&path.join("cgroup.procs"), "0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_parse() {
        assert_eq!(
            parse_events("populated 1\nfrozen 0\n"),
            Some(Events {
                populated: true,
                frozen: false
            })
        );
        assert_eq!(parse_events("frozen 1\n"), None);
    }
}
