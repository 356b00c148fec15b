//! A fresh workspace's setup (`RepoSetup`, declared with its repository): the files it gets
//! from the repository's source directory, then the commands run in it — before any
//! harness of the assignment runs there, in the starting generation's own cgroup (empty
//! until its shim joins), as the lane's uid behind the lane's confinement (no network),
//! each within the declared time limit. What the workspace was made from is recorded
//! (`WorkspaceInputs`, in its marker); every checkpoint of it carries that record's digest.
//!
//! **Never:** follows a link, in the source or in the workspace (a restored tree is the
//! agent's work: a link there would aim a root write anywhere); overwrites a file of a
//! fresh clone; runs a command of a confined lane without its confinement; leaves a
//! process of the setup alive (the cgroup is killed after the commands, whatever
//! happened); logs a byte of a copied file or of a command's output (that goes to the
//! setup log beside the workspace, root's only).

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::{Mode, OFlags};
use sha2::{Digest, Sha256};

use crate::cgroup::Cg;
use crate::confine::{Policy, Prepared};
use crate::protocol::repo::{CopiedFile, CopyPath, RepoSetup};

/// Most bytes one copied file may hold (they are configuration, not data).
pub(crate) const COPY_MAX_BYTES: u64 = 1 << 20;

/// How long the setup's leftovers get to die once the cgroup is killed.
const KILL_WAIT: Duration = Duration::from_secs(10);

/// Where a setup runs its commands: the starting generation's cgroup, its confinement
/// (`None`: the lane is unconfined, the operator's opt-out), and the log.
pub(crate) struct Runner<'a> {
    pub cg: &'a Cg,
    pub policy: Option<Policy>,
    pub log: PathBuf,
    pub env: Vec<(String, String)>,
}

/// Copies `files` from `source` (a repository's directory) into the workspace `ws`, never
/// through a link on either side. A file a restored workspace already has is the work's
/// own and is kept (`digest: None`); in a fresh clone one is an error (a copied file is
/// one the repository does not carry). Blocking.
pub(crate) fn copy_files(
    source: &Path,
    ws: &Path,
    files: &[CopyPath],
    restored: bool,
) -> Result<Vec<CopiedFile>, String> {
    let open_dir = |p: &Path| {
        rustix::fs::open(
            p,
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| format!("opening {}: {e}", p.display()))
    };
    let (src_root, dst_root) = (open_dir(source)?, open_dir(ws)?);
    let mut out = vec![];
    for f in files {
        let parts: Vec<&str> = f.as_str().split('/').collect();
        let Some((name, dirs)) = parts.split_last() else {
            return Err(format!("file to copy {:?} is empty", f.as_str()));
        };
        // The source: each directory opened without following a link, then the file.
        let mut dir = src_root.try_clone().map_err(|e| e.to_string())?;
        for d in dirs {
            dir = rustix::fs::openat(
                &dir,
                *d,
                OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| {
                format!(
                    "file to copy {}: {d}: {e} (links are not followed)",
                    f.as_str()
                )
            })?;
        }
        // Its type first, without opening it (a device's open may act); then opened without
        // following a link and checked to be the file just looked at.
        let seen = rustix::fs::statat(&dir, *name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW).map_err(
            |e| {
                format!(
                    "file to copy {} in {}: {e} (declared with the repository)",
                    f.as_str(),
                    source.display()
                )
            },
        )?;
        if rustix::fs::FileType::from_raw_mode(seen.st_mode) != rustix::fs::FileType::RegularFile {
            return Err(format!(
                "file to copy {} is not a regular file (links are not followed)",
                f.as_str()
            ));
        }
        let src = rustix::fs::openat(
            &dir,
            *name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
            Mode::empty(),
        )
        .map_err(|e| format!("file to copy {}: {e}", f.as_str()))?;
        let st = rustix::fs::fstat(&src).map_err(|e| e.to_string())?;
        if (st.st_dev, st.st_ino) != (seen.st_dev, seen.st_ino) {
            return Err(format!(
                "file to copy {} changed while it was opened",
                f.as_str()
            ));
        }
        if st.st_size as u64 > COPY_MAX_BYTES {
            return Err(format!(
                "file to copy {} holds {} bytes, more than the {COPY_MAX_BYTES} a copied file may",
                f.as_str(),
                st.st_size
            ));
        }
        let mut bytes = Vec::with_capacity(st.st_size as usize);
        std::fs::File::from(src)
            .take(COPY_MAX_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| format!("reading {}: {e}", f.as_str()))?;
        if bytes.len() as u64 > COPY_MAX_BYTES {
            return Err(format!("file to copy {} grew past the limit", f.as_str()));
        }
        // The workspace: its directories made or opened without following a link.
        let mut dir: OwnedFd = dst_root.try_clone().map_err(|e| e.to_string())?;
        let mut kept = false;
        for d in dirs {
            let open = |at: &OwnedFd| {
                rustix::fs::openat(
                    at,
                    *d,
                    OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
                    Mode::empty(),
                )
            };
            dir = match open(&dir) {
                Ok(fd) => fd,
                Err(rustix::io::Errno::NOENT) => {
                    rustix::fs::mkdirat(&dir, *d, Mode::from_raw_mode(0o755))
                        .map_err(|e| format!("making {d} for {}: {e}", f.as_str()))?;
                    open(&dir).map_err(|e| e.to_string())?
                }
                // A restored tree is the work's: what it put there is kept.
                Err(_) if restored => {
                    kept = true;
                    break;
                }
                Err(e) => {
                    return Err(format!(
                    "the workspace's {d} (for {}) is not a directory: {e} (links are not followed)",
                    f.as_str()
                ))
                }
            };
        }
        if kept {
            tracing::info!(file = f.as_str(), "the restored checkpoint has something else on this copied file's path: the work's own is kept");
            out.push(CopiedFile {
                path: f.clone(),
                digest: None,
            });
            continue;
        }
        let dst = rustix::fs::openat(
            &dir,
            *name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        );
        match dst {
            Ok(fd) => {
                let mut file = std::fs::File::from(fd);
                file.write_all(&bytes)
                    .and_then(|()| file.sync_all())
                    .map_err(|e| format!("writing {}: {e}", f.as_str()))?;
                out.push(CopiedFile {
                    path: f.clone(),
                    digest: Some(format!("sha256:{}", hex::encode(Sha256::digest(&bytes)))),
                });
            }
            Err(rustix::io::Errno::EXIST) if restored => {
                tracing::info!(file = f.as_str(), "the restored checkpoint has this copied file: the work's own is kept");
                out.push(CopiedFile {
                    path: f.clone(),
                    digest: None,
                });
            }
            Err(rustix::io::Errno::EXIST) => {
                return Err(format!(
                    "the repository itself has {} (or a link there): a copied file is one its clone does not carry; declare the repository again without it",
                    f.as_str()
                ))
            }
            Err(e) => return Err(format!("creating {}: {e}", f.as_str())),
        }
    }
    Ok(out)
}

/// Runs `setup`'s commands in `ws`, in order, each in `runner`'s cgroup behind its
/// confinement and within the time limit; stops at the first that fails. Whatever
/// happened, the cgroup is killed and verified empty before this returns (a command's
/// background process never outlives the setup). The number run (all, on `Ok`).
/// Blocking.
pub(crate) fn run_commands(
    runner: &Runner<'_>,
    ws: &Path,
    setup: &RepoSetup,
) -> Result<usize, String> {
    let n = setup.commands().len();
    if n == 0 {
        return Ok(0);
    }
    let out = run_all(runner, ws, setup);
    let killed = runner
        .cg
        .kill_and_wait(KILL_WAIT)
        .map_err(|e| format!("ending what the setup left running: {e}"));
    let ran = out?;
    killed?;
    Ok(ran)
}

fn run_all(runner: &Runner<'_>, ws: &Path, setup: &RepoSetup) -> Result<usize, String> {
    let n = setup.commands().len();
    // One log per setup run (the latest), written by this process only: a command's
    // output reaches it through a pipe, at most `LOG_MAX_BYTES` of it.
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode_private()
        .open(&runner.log)
        .map_err(|e| format!("opening the setup log {}: {e}", runner.log.display()))?;
    let mut logged = 0u64;
    let limit = Duration::from_secs(u64::from(setup.timeout_s()));
    for (i, c) in setup.commands().iter().enumerate() {
        let _ = writeln!(log, "== setup command {} of {n}: {} ==", i + 1, c.as_str());
        let procs = runner.cg.open_procs_for_join().map_err(|e| e.to_string())?;
        let mut cmd = std::process::Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(c.as_str())
            .current_dir(ws)
            .env_clear()
            .envs(runner.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        // Built whole for each command (its mounts are taken by the child that enters it).
        let p = match &runner.policy {
            Some(p) => Some(
                Prepared::build(p, Some(ws))
                    .map_err(|e| format!("the setup's confinement: {e}"))?,
            ),
            None => None,
        };
        let procs_fd = procs.as_fd().as_raw_fd();
        use std::os::unix::process::CommandExt;
        // SAFETY: the hook makes raw system calls only, on a descriptor and memory the
        // closure owns (`p`) or on the stack: no allocation, no lock (the child of a
        // threaded process).
        unsafe {
            cmd.pre_exec(move || {
                // Into the generation's cgroup first (writing 0 moves the writer): every
                // process it makes is there, and dies with it.
                if libc::write(procs_fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                // A session of its own: no controlling terminal (the supervisor's, when it
                // has one), no signal from it.
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if let Some(p) = &p {
                    // Its own network namespace: loopback alone, down.
                    if libc::unshare(libc::CLONE_NEWNET) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    p.enter()?;
                }
                Ok(())
            });
        }
        let started = Instant::now();
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("setup command {} of {n} could not start: {e}", i + 1))?;
        drop(procs);
        let output = drain(&mut child, LOG_MAX_BYTES.saturating_sub(logged));
        let status = wait_within(&mut child, limit, runner.cg);
        // The readers end once every holder of the pipes is gone: at the command's end, or
        // (a background process keeping them) when the cgroup is killed below.
        if !matches!(status, Ok(Some(_))) || !runner.cg.is_empty().unwrap_or(false) {
            let _ = runner.cg.kill_and_wait(KILL_WAIT);
        }
        let (bytes, cut) = output.join().unwrap_or_default();
        logged += bytes.len() as u64;
        let _ = log.write_all(&bytes);
        if cut {
            let _ = writeln!(log, "\n== output cut at {LOG_MAX_BYTES} bytes ==");
        }
        let status = status?;
        let Some(status) = status else {
            let _ = writeln!(log, "== killed after {} s ==", limit.as_secs());
            return Err(format!(
                "setup command {} of {n} did not finish within {} s: killed (its output: {})",
                i + 1,
                limit.as_secs(),
                runner.log.display()
            ));
        };
        let _ = writeln!(
            log,
            "== {status} after {} ms ==",
            started.elapsed().as_millis()
        );
        if !status.success() {
            return Err(format!(
                "setup command {} of {n} failed ({status}; its output: {})",
                i + 1,
                runner.log.display()
            ));
        }
    }
    Ok(n)
}

/// Most bytes of the commands' output the setup log keeps (per setup run).
pub(crate) const LOG_MAX_BYTES: u64 = 1 << 20;

/// Reads `child`'s stdout and stderr on threads of their own, keeping at most `room`
/// bytes: what was kept, and whether more was cut.
fn drain(child: &mut std::process::Child, room: u64) -> std::thread::JoinHandle<(Vec<u8>, bool)> {
    let streams: Vec<Box<dyn Read + Send>> = [
        child
            .stdout
            .take()
            .map(|o| Box::new(o) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|e| Box::new(e) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .flatten()
    .collect();
    std::thread::spawn(move || {
        let kept = std::sync::Arc::new(std::sync::Mutex::new((Vec::new(), false)));
        let readers: Vec<_> = streams
            .into_iter()
            .map(|mut r| {
                let kept = kept.clone();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 8192];
                    while let Ok(n) = r.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        let Ok(mut k) = kept.lock() else { break };
                        let left = usize::try_from(room)
                            .unwrap_or(usize::MAX)
                            .saturating_sub(k.0.len());
                        k.0.extend_from_slice(&buf[..n.min(left)]);
                        k.1 |= n > left;
                    }
                })
            })
            .collect();
        for r in readers {
            let _ = r.join();
        }
        let k = kept.lock().map(|k| k.clone()).unwrap_or_default();
        k
    })
}

/// Waits for `child` until `limit`; past it, kills the whole cgroup and answers `None`.
fn wait_within(
    child: &mut std::process::Child,
    limit: Duration,
    cg: &Cg,
) -> Result<Option<std::process::ExitStatus>, String> {
    let start = Instant::now();
    let pidfd = rustix::process::Pid::from_raw(child.id() as i32)
        .and_then(|p| rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok());
    loop {
        if let Some(st) = child.try_wait().map_err(|e| e.to_string())? {
            return Ok(Some(st));
        }
        let left = limit.saturating_sub(start.elapsed());
        if left.is_zero() {
            let _ = cg.kill_and_wait(KILL_WAIT);
            let _ = child.wait();
            return Ok(None);
        }
        match &pidfd {
            Some(fd) => {
                let mut fds = [rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN)];
                let ts = rustix::event::Timespec {
                    tv_sec: left.as_secs() as i64,
                    tv_nsec: left.subsec_nanos() as i64,
                };
                let _ = rustix::event::poll(&mut fds, Some(&ts));
            }
            // No pidfd (a kernel without it): the wait blocks; the limit is then kept by
            // nobody, so it is refused instead.
            None => {
                let _ = cg.kill_and_wait(KILL_WAIT);
                let _ = child.wait();
                return Err(
                    "this kernel gives no pidfd: a setup's time limit cannot be kept".into(),
                );
            }
        }
    }
}

trait PrivateOpen {
    fn mode_private(&mut self) -> &mut Self;
}

impl PrivateOpen for std::fs::OpenOptions {
    fn mode_private(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.mode(0o600)
    }
}
