//! The fake harness's hostile directives (`attack=KIND:ARG`): what a tool inside a
//! generation would try in order to reach beyond it. Each attempt is made for real, and its
//! outcome appended as one line to `$HOME/attacks` (`attack KIND:ARG allowed` or
//! `attack KIND:ARG denied: <error>`), so a test can read what the kernel let through.
//! A denied attempt is not a failure of the harness: it goes on with its other directives.

use std::io::Write;
use std::path::PathBuf;

/// One hostile attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum Attack {
    /// Create or append to a file.
    Write(PathBuf),
    /// Read a file (or list a directory).
    Read(PathBuf),
    /// Move itself into the cgroup at this directory (its own parent: leaving its cgroup).
    Join(PathBuf),
    /// Send SIGURG (ignored by default: harmless where it gets through) to a process.
    Signal(i32),
    /// Seize a process with ptrace (and let go at once).
    Ptrace(i32),
    /// Read another process's environment.
    Environ(i32),
    /// Open another process's memory.
    Mem(i32),
    /// Mount a tmpfs below its home.
    Mount,
    /// Enter new user and mount namespaces.
    Unshare,
    /// Use a descriptor it did not open.
    Fd(i32),
    /// Open a raw IP socket.
    RawSocket,
    /// Connect to a Unix socket, send one line and read the answer: allowed only when the
    /// server answers (a daemon that refuses the peer closes without a word).
    Connect(PathBuf),
    /// The same, through a zombie: a child connects and exits unreaped, the parent sends
    /// on the connected socket (the server sees a dead peer).
    ZombieConnect(PathBuf),
    /// Change a file's mode to 04777 (setuid, writable by all).
    Chmod(PathBuf),
    /// Open a file (a device: another pane's terminal) for reading and writing.
    Open(PathBuf),
    /// Read another process's resource limits through `prlimit` (the same call sets them).
    Prlimit(i32),
    /// Set another process's nice value to 0 (its usual value: harmless where it works).
    Renice(i32),
    /// Open a TCP connection to `HOST:PORT` (a host loopback service, an outside address).
    Tcp(String),
    /// Ask the model provider for one chat completion at `$MOSAIC_PROVIDER_URL`, with the
    /// API key the environment variable named by the argument holds, as a harness would:
    /// allowed when the answer is `200`, its body then kept in `$HOME/provider-answer`.
    Provider(String),
    /// Wait (up to a minute) until a file exists, so a test can order the attempts after
    /// it around its own steps (a supervisor restart); allowed once it exists.
    Wait(PathBuf),
    /// Open a tunnel to `HOST:PORT` through the egress proxy in `$HTTPS_PROXY` (`CONNECT`),
    /// as a tool honouring the variable would; once open, send `ping` and keep what comes
    /// back in `$HOME/egress-answer`: allowed when the proxy opened the tunnel.
    Egress(String),
    /// Commit (empty) to `$HOME/pushrepo` (made on first use) and push it through
    /// `mosaic lane push --repo REPO` (to the assignment's own branch unless a ref is given,
    /// under the key given if any); its answer appended to `$HOME/push-answers`: allowed
    /// when the remote took it.
    Push {
        repo: String,
        reference: Option<String>,
        key: Option<String>,
        /// Make a new commit first (`repush` does not: the same commit again).
        commit: bool,
    },
    /// Open a file for writing, wait (up to a minute) until `$HOME/go` exists, then write
    /// through the descriptor it held all along: allowed when the write went through.
    HoldWrite(PathBuf),
    /// Open this many connections to the provider gateway and hold them (idle) until
    /// `$HOME/release` exists (at most a minute), having written `$HOME/flooding`: allowed
    /// when every one connected.
    Flood(u32),
}

impl Attack {
    /// Parses the value of `attack=` (`KIND:ARG`, or `KIND` for those without one).
    pub fn parse(v: &str) -> Option<Self> {
        let (kind, arg) = v.split_once(':').unwrap_or((v, ""));
        let pid = || arg.parse::<i32>().ok().filter(|p| *p > 0);
        let path = || (arg.starts_with('/')).then(|| PathBuf::from(arg));
        Some(match kind {
            "write" => Self::Write(path()?),
            "read" => Self::Read(path()?),
            "join" => Self::Join(path()?),
            "signal" => Self::Signal(pid()?),
            "ptrace" => Self::Ptrace(pid()?),
            "environ" => Self::Environ(pid()?),
            "mem" => Self::Mem(pid()?),
            "mount" if arg.is_empty() => Self::Mount,
            "unshare" if arg.is_empty() => Self::Unshare,
            "fd" => Self::Fd(arg.parse::<i32>().ok().filter(|f| *f >= 0)?),
            "raw-socket" if arg.is_empty() => Self::RawSocket,
            "connect" => Self::Connect(path()?),
            "zombie-connect" => Self::ZombieConnect(path()?),
            "chmod" => Self::Chmod(path()?),
            "open" => Self::Open(path()?),
            "prlimit" => Self::Prlimit(pid()?),
            "renice" => Self::Renice(pid()?),
            "tcp"
                if arg
                    .rsplit_once(':')
                    .is_some_and(|(_, p)| p.parse::<u16>().is_ok()) =>
            {
                Self::Tcp(arg.to_string())
            }
            "provider" if !arg.is_empty() => Self::Provider(arg.to_string()),
            "egress"
                if arg
                    .rsplit_once(':')
                    .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok()) =>
            {
                Self::Egress(arg.to_string())
            }
            // push:REPO, push:REPO:KEY (the assignment's branch); push-ref:REPO:REF.
            "push" | "repush" if !arg.is_empty() => {
                let (repo, key) = arg
                    .split_once(':')
                    .map_or((arg, None), |(r, k)| (r, Some(k)));
                Self::Push {
                    repo: repo.to_string(),
                    reference: None,
                    key: key.map(String::from),
                    commit: kind == "push",
                }
            }
            "push-ref" => {
                let (repo, reference) = arg.split_once(':')?;
                Self::Push {
                    repo: repo.to_string(),
                    reference: Some(reference.to_string()),
                    key: None,
                    commit: true,
                }
            }
            "wait" => Self::Wait(path()?),
            "hold-write" => Self::HoldWrite(path()?),
            "flood" => Self::Flood(arg.parse().ok().filter(|n| (1..=1000).contains(n))?),
            _ => return None,
        })
    }

    fn label(&self) -> String {
        match self {
            Self::Write(p) => format!("write:{}", p.display()),
            Self::Read(p) => format!("read:{}", p.display()),
            Self::Join(p) => format!("join:{}", p.display()),
            Self::Signal(p) => format!("signal:{p}"),
            Self::Ptrace(p) => format!("ptrace:{p}"),
            Self::Environ(p) => format!("environ:{p}"),
            Self::Mem(p) => format!("mem:{p}"),
            Self::Mount => "mount".into(),
            Self::Unshare => "unshare".into(),
            Self::Fd(f) => format!("fd:{f}"),
            Self::RawSocket => "raw-socket".into(),
            Self::Connect(p) => format!("connect:{}", p.display()),
            Self::ZombieConnect(p) => format!("zombie-connect:{}", p.display()),
            Self::Chmod(p) => format!("chmod:{}", p.display()),
            Self::Open(p) => format!("open:{}", p.display()),
            Self::Prlimit(p) => format!("prlimit:{p}"),
            Self::Renice(p) => format!("renice:{p}"),
            Self::Tcp(a) => format!("tcp:{a}"),
            Self::Provider(v) => format!("provider:{v}"),
            Self::Egress(a) => format!("egress:{a}"),
            Self::Push {
                repo,
                reference,
                key,
                commit,
            } => {
                let kind = if *commit { "push" } else { "repush" };
                match (reference, key) {
                    (Some(r), _) => format!("push-ref:{repo}:{r}"),
                    (None, Some(k)) => format!("{kind}:{repo}:{k}"),
                    (None, None) => format!("{kind}:{repo}"),
                }
            }
            Self::Wait(p) => format!("wait:{}", p.display()),
            Self::HoldWrite(p) => format!("hold-write:{}", p.display()),
            Self::Flood(n) => format!("flood:{n}"),
        }
    }

    /// Makes the attempt; `Ok` when the kernel let it through.
    fn attempt(&self) -> std::io::Result<()> {
        use nix::errno::Errno;
        let nix = |r: Result<(), Errno>| r.map_err(std::io::Error::from);
        match self {
            Self::Write(p) => std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .and_then(|mut f| f.write_all(b"attack\n")),
            Self::Read(p) if p.is_dir() => std::fs::read_dir(p).map(|_| ()),
            Self::Read(p) => std::fs::read(p).map(|_| ()),
            Self::Join(dir) => std::fs::write(dir.join("cgroup.procs"), "0"),
            Self::Signal(pid) => nix(nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*pid),
                nix::sys::signal::Signal::SIGURG,
            )),
            Self::Ptrace(pid) => {
                let p = nix::unistd::Pid::from_raw(*pid);
                nix(nix::sys::ptrace::seize(
                    p,
                    nix::sys::ptrace::Options::empty(),
                ))?;
                let _ = nix::sys::ptrace::detach(p, None);
                Ok(())
            }
            Self::Environ(pid) => std::fs::read(format!("/proc/{pid}/environ")).map(|_| ()),
            Self::Mem(pid) => std::fs::File::open(format!("/proc/{pid}/mem")).map(|_| ()),
            Self::Mount => {
                let home = std::env::var_os("HOME")
                    .map(PathBuf::from)
                    .unwrap_or_default();
                let at = home.join("mnt");
                let _ = std::fs::create_dir_all(&at);
                nix(nix::mount::mount(
                    Some("tmpfs"),
                    &at,
                    Some("tmpfs"),
                    nix::mount::MsFlags::empty(),
                    None::<&str>,
                ))
            }
            Self::Unshare => nix(nix::sched::unshare(
                nix::sched::CloneFlags::CLONE_NEWUSER | nix::sched::CloneFlags::CLONE_NEWNS,
            )),
            Self::Fd(fd) => {
                // SAFETY: F_GETFD reads a flag of the descriptor number; no memory.
                match unsafe { libc::fcntl(*fd, libc::F_GETFD) } {
                    -1 => Err(std::io::Error::last_os_error()),
                    _ => Ok(()),
                }
            }
            Self::Connect(p) => ask(&mut std::os::unix::net::UnixStream::connect(p)?),
            Self::ZombieConnect(p) => {
                use std::os::fd::{AsRawFd, FromRawFd};
                // SAFETY: socket(2) with integer arguments; the fd is owned below.
                let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) };
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // SAFETY: fd was just returned by socket(2) and is owned only here.
                let mut s = unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd) };
                if p.as_os_str().len() >= 108 {
                    return Err(std::io::Error::other("path too long for a Unix socket"));
                }
                let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes())
                    .map_err(std::io::Error::other)?;
                // SAFETY: the child only builds a sockaddr on its stack, connects and
                // exits (async-signal-safe calls); the parent keeps the connected socket.
                match unsafe { libc::fork() } {
                    -1 => return Err(std::io::Error::last_os_error()),
                    0 => unsafe {
                        let mut sa: libc::sockaddr_un = std::mem::zeroed();
                        sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
                        let bytes = c.as_bytes_with_nul();
                        let n = bytes.len().min(sa.sun_path.len());
                        for (d, b) in sa.sun_path.iter_mut().zip(&bytes[..n]) {
                            *d = *b as libc::c_char;
                        }
                        let r = libc::connect(
                            s.as_raw_fd(),
                            &sa as *const libc::sockaddr_un as *const libc::sockaddr,
                            std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
                        );
                        libc::_exit(if r == 0 { 0 } else { 1 });
                    },
                    _child => {}
                }
                // Not reaped: the connecting process stays a zombie while we talk.
                std::thread::sleep(std::time::Duration::from_millis(200));
                ask(&mut s)
            }
            Self::Chmod(p) => {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o4777))
            }
            Self::Open(p) => std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(p)
                .map(|_| ()),
            Self::Prlimit(pid) => {
                let mut old = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                // SAFETY: prlimit(2) writes only `old`, which lives on this stack.
                match unsafe {
                    libc::prlimit(*pid, libc::RLIMIT_NOFILE, std::ptr::null(), &mut old)
                } {
                    0 => Ok(()),
                    _ => Err(std::io::Error::last_os_error()),
                }
            }
            Self::Renice(pid) => {
                // SAFETY: setpriority(2) takes integers only.
                match unsafe { libc::setpriority(libc::PRIO_PROCESS, *pid as libc::id_t, 0) } {
                    0 => Ok(()),
                    _ => Err(std::io::Error::last_os_error()),
                }
            }
            Self::RawSocket => {
                // SAFETY: socket(2) takes integers; the returned fd is closed at once.
                match unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_ICMP) } {
                    -1 => Err(std::io::Error::last_os_error()),
                    fd => {
                        // SAFETY: fd was just returned by socket(2) and is ours.
                        unsafe { libc::close(fd) };
                        Ok(())
                    }
                }
            }
            Self::Tcp(addr) => {
                use std::net::ToSocketAddrs;
                let to = addr
                    .to_socket_addrs()?
                    .next()
                    .ok_or_else(|| std::io::Error::other("no address"))?;
                std::net::TcpStream::connect_timeout(&to, std::time::Duration::from_secs(3))
                    .map(drop)
            }
            Self::Provider(var) => provider_request(var),
            Self::Egress(to) => egress_request(to),
            Self::Push {
                repo,
                reference,
                key,
                commit,
            } => push_request(repo, reference.as_deref(), key.as_deref(), *commit),
            Self::Flood(n) => {
                let base = std::env::var("MOSAIC_PROVIDER_URL")
                    .map_err(|_| std::io::Error::other("no MOSAIC_PROVIDER_URL"))?;
                let authority = base
                    .strip_prefix("http://")
                    .and_then(|r| r.split('/').next())
                    .ok_or_else(|| std::io::Error::other("not an http:// provider URL"))?
                    .to_string();
                let held = (0..*n)
                    .map(|_| std::net::TcpStream::connect(authority.as_str()))
                    .collect::<std::io::Result<Vec<_>>>();
                let home = PathBuf::from(std::env::var_os("HOME").unwrap_or_default());
                std::fs::write(home.join("flooding"), "")?;
                let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
                while !home.join("release").exists() && std::time::Instant::now() < until {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                held.map(drop)
            }
            Self::Wait(p) => wait_for(p),
            Self::HoldWrite(p) => {
                let mut f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)?;
                let home = std::env::var_os("HOME")
                    .map(PathBuf::from)
                    .unwrap_or_default();
                wait_for(&home.join("go"))?;
                f.write_all(b"held\n")
            }
        }
    }
}

/// Waits (up to a minute) until `p` exists.
fn wait_for(p: &std::path::Path) -> std::io::Result<()> {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !p.exists() {
        if std::time::Instant::now() > until {
            return Err(std::io::Error::other("it never appeared"));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Ok(())
}

/// One chat completion from the provider at `$MOSAIC_PROVIDER_URL` (plain http, as the
/// gateway serves it), keyed by the value of `key_var`.
fn provider_request(key_var: &str) -> std::io::Result<()> {
    use std::io::Read;
    let base = std::env::var("MOSAIC_PROVIDER_URL")
        .map_err(|_| std::io::Error::other("no MOSAIC_PROVIDER_URL"))?;
    let key = std::env::var(key_var).map_err(|_| std::io::Error::other(format!("no {key_var}")))?;
    let rest = base
        .strip_prefix("http://")
        .ok_or_else(|| std::io::Error::other("not an http:// provider URL"))?;
    let (authority, prefix) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
    let body = r#"{"model":"mosaic-test-model","stream":false,"messages":[{"role":"user","content":"hello from a fake harness"}]}"#;
    let mut s = std::net::TcpStream::connect(authority)?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    let path = format!("/{prefix}/v1/chat/completions").replace("//", "/");
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {authority}\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut answer = Vec::new();
    s.read_to_end(&mut answer)?;
    let text = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split(' ').nth(1).unwrap_or("");
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    if let Some(home) = std::env::var_os("HOME") {
        std::fs::write(PathBuf::from(home).join("provider-answer"), body)?;
    }
    match status {
        "200" => Ok(()),
        other => Err(std::io::Error::other(format!("status {other}"))),
    }
}

/// A tunnel to `to` through the proxy `$HTTPS_PROXY` names.
fn egress_request(to: &str) -> std::io::Result<()> {
    use std::io::Read;
    let proxy =
        std::env::var("HTTPS_PROXY").map_err(|_| std::io::Error::other("no HTTPS_PROXY"))?;
    let authority = proxy
        .strip_prefix("http://")
        .map(|r| r.trim_end_matches('/'))
        .ok_or_else(|| std::io::Error::other("not an http:// proxy"))?;
    let mut s = std::net::TcpStream::connect(authority)?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(15)))?;
    write!(s, "CONNECT {to} HTTP/1.1\r\nHost: {to}\r\n\r\n")?;
    // The proxy's answer head, byte by byte (what follows it is the tunnel's).
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 8192 {
        if s.read(&mut b)? == 0 {
            break;
        }
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let status = head.split(' ').nth(1).unwrap_or("").to_string();
    if status != "200" {
        // The refusal's body says why (the connection stays open: read its length).
        let len = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .and_then(|v| v.trim().parse::<usize>().ok())
            })
            .unwrap_or(0)
            .min(8192);
        let mut rest = vec![0u8; len];
        let _ = s.read_exact(&mut rest);
        return Err(std::io::Error::other(format!(
            "status {status}: {}",
            String::from_utf8_lossy(&rest)
                .chars()
                .take(300)
                .collect::<String>()
        )));
    }
    s.write_all(b"ping\n")?;
    // The answer's first line.
    let mut answer = Vec::new();
    while !answer.ends_with(b"\n") && answer.len() < 256 {
        match s.read(&mut b) {
            Ok(1) => answer.push(b[0]),
            _ => break,
        }
    }
    if let Some(home) = std::env::var_os("HOME") {
        std::fs::write(PathBuf::from(home).join("egress-answer"), &answer)?;
    }
    Ok(())
}

/// A fresh commit of `$HOME/pushrepo`, pushed through `mosaic lane push`.
fn push_request(
    repo: &str,
    reference: Option<&str>,
    key: Option<&str>,
    commit: bool,
) -> std::io::Result<()> {
    let home = PathBuf::from(std::env::var_os("HOME").unwrap_or_default());
    let dir = home.join("pushrepo");
    let git = |args: &[&str]| -> std::io::Result<()> {
        let st = std::process::Command::new("git")
            .arg("-C")
            .arg(&dir)
            .args([
                "-c",
                "user.name=fake",
                "-c",
                "user.email=fake@mosaic.invalid",
            ])
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()?;
        if st.success() {
            Ok(())
        } else {
            Err(std::io::Error::other(format!("git {} failed", args[0])))
        }
    };
    if !dir.join(".git").exists() {
        std::fs::create_dir_all(&dir)?;
        git(&["init", "-q"])?;
    }
    if commit {
        git(&[
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "a fake harness's commit",
        ])?;
    }
    let bin =
        std::env::var_os("MOSAIC_BIN").ok_or_else(|| std::io::Error::other("no MOSAIC_BIN"))?;
    let mut c = std::process::Command::new(bin);
    c.args(["lane", "push", "--repo", repo, "--from"]).arg(&dir);
    if let Some(r) = reference {
        c.args(["--ref", r]);
    }
    if let Some(k) = key {
        c.args(["--key", k]);
    }
    let out = c.output()?;
    let answer = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(home.join("push-answers"))?;
    writeln!(f, "{}", answer.trim())?;
    let v: serde_json::Value = serde_json::from_str(answer.trim()).unwrap_or_default();
    if v["ok"] == true && matches!(v["push"]["state"].as_str(), Some("pushed" | "up-to-date")) {
        Ok(())
    } else {
        Err(std::io::Error::other(
            v["error"]
                .as_str()
                .unwrap_or(v["state"].as_str().unwrap_or("no answer"))
                .to_string(),
        ))
    }
}

/// A chunked body's data (sizes in hex, each chunk followed by CRLF, a zero chunk last).
fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16).unwrap_or(0);
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}

/// Sends one line on a connected socket and reads the answer: `Ok` only when the server
/// answers (a daemon that refuses the peer closes without a word).
fn ask(s: &mut std::os::unix::net::UnixStream) -> std::io::Result<()> {
    use std::io::Read;
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))?;
    s.write_all(b"{}\n")?;
    let mut buf = [0u8; 1];
    match s.read(&mut buf)? {
        0 => Err(std::io::Error::other("the server closed without answering")),
        _ => Ok(()),
    }
}

/// Makes every attempt in order and records each outcome in `$HOME/attacks`.
pub fn run_all(attacks: &[&Attack]) {
    run_into(attacks, "attacks")
}

/// Makes every attempt in order and records each outcome in `$HOME/<file>`, one line as
/// each ends (so a harness stopped part-way leaves what it did), then `attacks done`.
pub fn run_into(attacks: &[&Attack], file: &str) {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    let path = home.join(file);
    let _ = std::fs::remove_file(&path);
    let record = |line: &str| {
        print!("{line}");
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = written {
            eprintln!("mosaic-fake-harness: cannot record attacks: {e}");
        }
    };
    for a in attacks {
        record(&match a.attempt() {
            Ok(()) => format!("attack {} allowed\n", a.label()),
            Err(e) => format!("attack {} denied: {e}\n", a.label()),
        });
    }
    record("attacks done\n");
}
