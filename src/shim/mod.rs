//! `mosaic-shim`: the first process of every generation, running in the lane's tmux pane.
//!
//! Order matters and is the whole point (each step depends on the one before):
//! 1. join the generation's cgroup — before anything else, so nothing it starts can be
//!    outside the cgroup;
//! 2. become a child subreaper, so double-forked descendants reparent to us (and stay
//!    reapable) instead of escaping to init;
//! 3. make every catchable asynchronous signal harmless, so the only way to kill the shim
//!    silently is SIGKILL — which is what lets the supervisor call a silent death `sigkill`;
//! 4. read and delete the nonce file, then present pid, start time and nonce on the
//!    per-generation socket;
//! 5. only after the supervisor verified all that, build the harness's confinement
//!    (`crate::confine`: validated and built whole before the fork, applied by the child
//!    between fork and exec), then fork and exec the harness;
//! 6. reap everything, report the harness's exit, and wait to be cgroup-killed.
//!
//! **Never:** exits on its own after a successful launch (the supervisor ends it with the
//! rest of the cgroup), starts the harness before verification, logs the nonce.

pub mod proto;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{self, SaFlags, SigAction, SigHandler, SigSet, Signal};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::Pid;

use proto::{ExitStatus, HarnessState, NonceHex, ShimMsg, SupervisorMsg};

#[derive(Debug, thiserror::Error)]
pub enum ShimError {
    #[error("joining the generation cgroup failed: {0}")]
    Join(#[from] crate::cgroup::CgroupError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("system call {what} failed: {source}")]
    Sys {
        what: &'static str,
        #[source]
        source: nix::Error,
    },
    #[error("supervisor rejected this generation: {0}")]
    Rejected(String),
    #[error("unexpected message from supervisor: {0}")]
    Protocol(String),
}

#[derive(Debug, Clone)]
pub struct ShimArgs {
    pub cgroup: PathBuf,
    pub socket: PathBuf,
    pub nonce_file: PathBuf,
    pub exit_record: PathBuf,
}

struct Shared {
    writer: Option<UnixStream>,
    harness: Option<HarnessState>,
}

extern "C" fn ignore_signal(_: libc::c_int) {}

impl ShimArgs {
    /// Parses `--cgroup P --socket P --nonce-file P --exit-record P` (each once, all
    /// required). The shim is its own small binary (`mosaic-shim`) because it starts once
    /// per generation on the start path: without the CLI's parser and the big binary's
    /// relocations it is running about a millisecond sooner.
    pub fn parse(args: impl IntoIterator<Item = std::ffi::OsString>) -> Result<Self, String> {
        let (mut cgroup, mut socket, mut nonce_file, mut exit_record) = (None, None, None, None);
        let mut it = args.into_iter();
        while let Some(flag) = it.next() {
            let slot = match flag.to_str() {
                Some("--cgroup") => &mut cgroup,
                Some("--socket") => &mut socket,
                Some("--nonce-file") => &mut nonce_file,
                Some("--exit-record") => &mut exit_record,
                _ => return Err(format!("unexpected argument {flag:?}")),
            };
            let value = it.next().ok_or_else(|| format!("{flag:?} needs a value"))?;
            if slot.replace(PathBuf::from(value)).is_some() {
                return Err(format!("{flag:?} given twice"));
            }
        }
        let need = |v: Option<PathBuf>, name: &str| v.ok_or_else(|| format!("missing {name}"));
        Ok(Self {
            cgroup: need(cgroup, "--cgroup")?,
            socket: need(socket, "--socket")?,
            nonce_file: need(nonce_file, "--nonce-file")?,
            exit_record: need(exit_record, "--exit-record")?,
        })
    }
}

/// The `mosaic-shim` binary: parses its arguments and runs. Returns the exit code of a
/// failure before launch (after launch the shim never returns).
pub fn main(args: impl IntoIterator<Item = std::ffi::OsString>) -> i32 {
    let e = match ShimArgs::parse(args) {
        Err(e) => {
            say_err(&format!("mosaic-shim: {e}"));
            return 2;
        }
        Ok(args) => match run(args) {
            Err(e) => e,
            Ok(never) => match never {},
        },
    };
    say_err(&format!("mosaic-shim: {e}"));
    126
}

/// Runs the shim. Returns only on failure before launch; afterwards it never returns.
pub fn run(args: ShimArgs) -> Result<std::convert::Infallible, ShimError> {
    // 1. cgroup first.
    crate::cgroup::join_path(&args.cgroup)?;
    // 2. subreaper.
    nix::sys::prctl::set_child_subreaper(true).map_err(|source| ShimError::Sys {
        what: "prctl(PR_SET_CHILD_SUBREAPER)",
        source,
    })?;
    // 3. A handler (not SIG_IGN) so that the harness, after exec, gets default dispositions.
    let act = SigAction::new(
        SigHandler::Handler(ignore_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for sig in [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
        Signal::SIGPIPE,
        Signal::SIGALRM,
        Signal::SIGTSTP,
        Signal::SIGTTIN,
        Signal::SIGTTOU,
    ] {
        // SAFETY: the handler is an empty extern "C" fn: trivially async-signal-safe.
        unsafe { signal::sigaction(sig, &act) }.map_err(|source| ShimError::Sys {
            what: "sigaction",
            source,
        })?;
    }
    // 4. nonce: read, then delete so no later process of the generation can read it.
    let nonce = NonceHex(
        std::fs::read_to_string(&args.nonce_file)
            .map_err(|source| ShimError::Io {
                what: format!("reading nonce file {}", args.nonce_file.display()),
                source,
            })?
            .trim()
            .to_string(),
    );
    let _ = std::fs::remove_file(&args.nonce_file);
    let pid = std::process::id() as i32;
    let start_time = own_start_time()?;

    let mut stream = connect(&args.socket)?;
    send(
        &mut stream,
        &ShimMsg::Hello {
            pid,
            start_time,
            nonce: nonce.clone(),
            harness: None,
        },
    )?;
    let mut reader = BufReader::new(clone(&stream)?);
    let (argv, env, secret_env, cwd, banner, confinement) = match recv(&mut reader)? {
        SupervisorMsg::Launch {
            argv,
            env,
            secret_env,
            cwd,
            banner,
            confinement,
        } => (argv, env, secret_env, cwd, banner, confinement),
        SupervisorMsg::Reject { reason } => return Err(ShimError::Rejected(reason)),
        other => return Err(ShimError::Protocol(format!("{other:?}"))),
    };
    say(&banner);

    // 5. launch: the confinement is validated and built whole first (a failure is a failed
    //    start, reported like an exec failure); the child only applies it.
    let confined = match &confinement {
        crate::confine::Confinement::Enforced { policy } => {
            crate::confine::Prepared::build(policy, cwd.as_deref().map(std::path::Path::new))
                .map(Some)
        }
        crate::confine::Confinement::None => Ok(None),
    };
    // The network namespace last, on the shim itself, just before the fork: the harness is
    // born in it. The gateway's listener stays open in the shim for the generation's life
    // (close-on-exec: the harness never holds it), so a supervisor restarted later takes
    // the same one again.
    // Its PID namespace too: the harness's parent inside it is the namespace's init (see
    // `confine::pidns`), which hands the harness's wait status back through this pipe.
    let confined = confined.and_then(|p| match (&p, &confinement) {
        // The pane's terminal goes to the lane's uid last: a start that failed before
        // leaves it as it was.
        (Some(_), crate::confine::Confinement::Enforced { policy }) => {
            crate::confine::net::isolate(policy.gateway).and_then(|l| {
                let pidns = crate::confine::pidns::isolate()?;
                match policy.uid.map_or(Ok(()), crate::confine::give_terminal) {
                    Ok(()) => Ok((p, l, Some(pidns))),
                    Err(e) => {
                        let _ = pidns.end();
                        Err(e)
                    }
                }
            })
        }
        _ => Ok((p, None, None)),
    });
    let status_pipe = match &confined {
        Ok((Some(_), _, _)) => Some(nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(
            |source| ShimError::Sys {
                what: "pipe2",
                source,
            },
        )?),
        _ => None,
    };
    let (confined, gateway, pidns) = match confined {
        Ok((p, l, n)) => (Ok(p), l, n),
        Err(e) => (Err(e), None, None),
    };
    let gateway_fd = gateway.as_ref().map(std::os::fd::AsRawFd::as_raw_fd);
    let child = match (confined, argv.split_first()) {
        (Err(e), _) => Err(std::io::Error::other(format!("confinement: {e}"))),
        (Ok(confined), Some((prog, rest))) => {
            let mut c = std::process::Command::new(prog);
            if let Some(p) = confined {
                use std::os::fd::AsRawFd;
                use std::os::unix::process::CommandExt;
                let status_w = status_pipe.as_ref().map_or(-1, |(_, w)| w.as_raw_fd());
                // SAFETY: `enter` and `split` make raw system calls on memory `p` owns
                // (moved into the closure) or on the stack; they neither allocate nor
                // lock. The shim has no other thread yet (the link keeper starts after the
                // spawn: the kernel refuses one before `pidns.end()`), so the child may
                // fork the harness.
                unsafe {
                    c.pre_exec(move || {
                        p.enter()?;
                        crate::confine::pidns::split(status_w)
                    });
                }
            }
            c.args(rest).envs(env);
            for (k, v) in &secret_env {
                c.env(k, &v.0);
            }
            if let Some(d) = &cwd {
                c.current_dir(d);
            }
            let spawned = c.spawn();
            drop(c);
            drop(secret_env);
            spawned
        }
        (Ok(_), None) => Err(std::io::Error::other("empty command")),
    };
    // Back in its own PID namespace, or no thread: a harness started meanwhile is killed
    // with the cgroup on the failure this reports.
    let child = match pidns.map(crate::confine::pidns::Isolated::end) {
        Some(Err(e)) => Err(std::io::Error::other(format!("confinement: {e}"))),
        _ => child,
    };
    let child = match child {
        Ok(c) => c,
        Err(e) => {
            let reason = format!("cannot start {:?}: {e}", argv.first());
            let _ = send(
                &mut stream,
                &ShimMsg::LaunchFailed {
                    reason: reason.clone(),
                },
            );
            say_err(&format!("mosaic-shim: {reason}"));
            std::process::exit(127);
        }
    };
    // The read end only: the init holds the write end until the harness ends.
    let status_read = status_pipe.map(|(r, w)| {
        drop(w);
        r
    });
    let harness_pid = child.id() as i32;
    // If the harness already exited, its start time is unreadable; 0 marks "unknown", and
    // its exit is reported by the reaper below anyway.
    let harness_start_time = procfs::process::Process::new(harness_pid)
        .and_then(|p| p.stat())
        .map(|s| s.starttime)
        .unwrap_or(0);
    drop(child); // reaped with waitpid(-1) below; std's handle must not wait on it
    send(
        &mut stream,
        &ShimMsg::Started {
            harness_pid,
            harness_start_time,
            gateway_fd,
        },
    )?;

    let shared = Arc::new(Mutex::new(Shared {
        writer: Some(stream),
        harness: Some(HarnessState {
            harness_pid,
            harness_start_time,
            exit: None,
            gateway_fd,
        }),
    }));
    {
        let shared = shared.clone();
        let socket = args.socket.clone();
        std::thread::Builder::new()
            .name("link-keeper".into())
            .spawn(move || link_keeper(reader, shared, socket, pid, start_time, nonce))
            .map_err(|source| ShimError::Io {
                what: "starting the link keeper".into(),
                source,
            })?;
    }

    // 6. reap forever (holding the gateway's listener: see above).
    let _gateway = gateway;
    loop {
        match waitpid(Pid::from_raw(-1), None) {
            Ok(status) => {
                let (who, exit) = match status {
                    WaitStatus::Exited(p, code) => (
                        p,
                        ExitStatus {
                            code: Some(code),
                            signal: None,
                            core_dumped: false,
                        },
                    ),
                    WaitStatus::Signaled(p, sig, core) => (
                        p,
                        ExitStatus {
                            code: None,
                            signal: Some(sig as i32),
                            core_dumped: core,
                        },
                    ),
                    _ => continue,
                };
                if who.as_raw() == harness_pid {
                    // Confined, the harness's own status, as its namespace's init saw it
                    // (the init's is only its echo); else, or if the init died before it
                    // could say (killed with the namespace), the init's own.
                    let exit = status_read.as_ref().and_then(read_status).unwrap_or(exit);
                    report_exit(&shared, &args, harness_pid, harness_start_time, exit);
                }
            }
            Err(nix::errno::Errno::ECHILD) => std::thread::sleep(Duration::from_secs(3600)),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(source) => {
                return Err(ShimError::Sys {
                    what: "waitpid",
                    source,
                })
            }
        }
    }
}

/// The harness's wait status the namespace's init wrote, if it wrote one.
fn read_status(fd: &std::os::fd::OwnedFd) -> Option<ExitStatus> {
    let mut raw = [0u8; 4];
    let n = nix::unistd::read(fd, &mut raw).ok()?;
    if n != raw.len() {
        return None;
    }
    let (code, signal, core_dumped) = crate::confine::pidns::decode(raw);
    (code.is_some() || signal.is_some()).then_some(ExitStatus {
        code,
        signal,
        core_dumped,
    })
}

fn report_exit(
    shared: &Mutex<Shared>,
    args: &ShimArgs,
    harness_pid: i32,
    harness_start_time: u64,
    exit: ExitStatus,
) {
    let gateway_fd = match shared.lock() {
        Ok(g) => g.harness.as_ref().and_then(|h| h.gateway_fd),
        Err(p) => p.into_inner().harness.as_ref().and_then(|h| h.gateway_fd),
    };
    let state = HarnessState {
        harness_pid,
        harness_start_time,
        exit: Some(exit),
        gateway_fd,
    };
    // Durable first: a supervisor that restarts after the whole generation is gone can still
    // prove how the harness ended.
    if let Ok(bytes) = serde_json::to_vec(&state) {
        if let Err(e) = crate::util::durable::write_atomic(&args.exit_record, &bytes) {
            say_err(&format!("mosaic-shim: cannot write exit record: {e}"));
        }
    }
    let mut g = match shared.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    };
    g.harness = Some(state);
    if let Some(w) = g.writer.as_mut() {
        if send(
            w,
            &ShimMsg::Exited {
                harness_pid,
                status: exit,
            },
        )
        .is_err()
        {
            g.writer = None; // the link keeper reattaches and carries the exit in Hello
        }
    }
    drop(g);
    match (exit.code, exit.signal) {
        (Some(c), _) => say(&format!("\r\nmosaic: harness exited with code {c}")),
        (_, Some(s)) => say(&format!("\r\nmosaic: harness killed by signal {s}")),
        _ => {}
    }
}

/// Watches the supervisor link; when it drops (supervisor restart), reconnects with backoff
/// and re-presents identity plus what happened meanwhile.
fn link_keeper(
    mut reader: BufReader<UnixStream>,
    shared: Arc<Mutex<Shared>>,
    socket: PathBuf,
    pid: i32,
    start_time: u64,
    nonce: NonceHex,
) {
    loop {
        // Block until the supervisor goes away (EOF or error); it sends nothing meanwhile.
        let mut line = String::new();
        while matches!(reader.read_line(&mut line), Ok(n) if n > 0) {
            line.clear();
        }
        if let Ok(mut g) = shared.lock() {
            g.writer = None;
        }
        let mut backoff = Duration::from_millis(20);
        reader = loop {
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_millis(250));
            let Ok(mut s) = UnixStream::connect(&socket) else {
                continue;
            };
            // A supervisor that accepts but never answers must not wedge the reaper, which
            // needs the same lock to report an exit.
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let mut g = match shared.lock() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
            let hello = ShimMsg::Hello {
                pid,
                start_time,
                nonce: nonce.clone(),
                harness: g.harness.clone(),
            };
            if send(&mut s, &hello).is_err() {
                continue;
            }
            let Ok(rs) = s.try_clone() else { continue };
            let mut r = BufReader::new(rs);
            match recv(&mut r) {
                Ok(SupervisorMsg::Adopted) => {
                    let _ = s.set_read_timeout(None);
                    let _ = r.get_ref().set_read_timeout(None);
                    g.writer = Some(s);
                    break r;
                }
                _ => continue,
            }
        };
    }
}

/// Writes a line to the pane, ignoring errors: the pane's terminal may be gone (tmux
/// server killed), and the shim must outlive that rather than panic on EPIPE/EIO.
fn say(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stdout(), "{line}");
}

fn say_err(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "{line}");
}

fn own_start_time() -> Result<u64, ShimError> {
    procfs::process::Process::myself()
        .and_then(|p| p.stat())
        .map(|s| s.starttime)
        .map_err(|e| ShimError::Io {
            what: "reading /proc/self/stat".into(),
            source: std::io::Error::other(e.to_string()),
        })
}

fn connect(path: &std::path::Path) -> Result<UnixStream, ShimError> {
    UnixStream::connect(path).map_err(|source| ShimError::Io {
        what: format!("connecting to {}", path.display()),
        source,
    })
}

fn clone(s: &UnixStream) -> Result<UnixStream, ShimError> {
    s.try_clone().map_err(|source| ShimError::Io {
        what: "cloning socket".into(),
        source,
    })
}

fn send(s: &mut UnixStream, msg: &ShimMsg) -> Result<(), ShimError> {
    let mut line = serde_json::to_vec(msg).map_err(|e| ShimError::Protocol(e.to_string()))?;
    line.push(b'\n');
    s.write_all(&line).map_err(|source| ShimError::Io {
        what: "writing to supervisor".into(),
        source,
    })
}

fn recv(r: &mut BufReader<UnixStream>) -> Result<SupervisorMsg, ShimError> {
    let mut line = String::new();
    let n = r.read_line(&mut line).map_err(|source| ShimError::Io {
        what: "reading from supervisor".into(),
        source,
    })?;
    if n == 0 {
        return Err(ShimError::Protocol("supervisor closed the socket".into()));
    }
    serde_json::from_str(&line).map_err(|e| ShimError::Protocol(e.to_string()))
}
