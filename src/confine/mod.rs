//! Confinement of a generation's harness: the kernel boundary the harness (and every tool it
//! runs) lives behind, built by the shim between fork and exec, and checked by the
//! supervisor before the generation counts as live.
//!
//! The layers, each enforced by the kernel, each inherited by every descendant and none of
//! them removable from inside:
//!
//! 1. **No capabilities.** The bounding and ambient sets are emptied: a harness started as
//!    root execs with no capability at all (no `CAP_DAC_OVERRIDE`, `CAP_KILL`,
//!    `CAP_SYS_PTRACE`, `CAP_SYS_ADMIN`, `CAP_NET_RAW`), and nothing it execs regains one.
//! 2. **`no_new_privs`**: no setuid or file-capability exec raises privileges again.
//! 3. **Landlock** (ABI 6 or newer, required): the filesystem is read-only everywhere the
//!    policy allows reading, writable only in the generation's own areas, and invisible
//!    where the policy masks it (other lanes' state, the supervisor's state and runtime
//!    directories, credentials, keys). Landlock's own process scoping keeps the harness
//!    from signalling, tracing or reading the memory or `/proc/<pid>/environ` of any
//!    process outside its domain (the shim, the supervisor, other lanes), and from
//!    connecting to abstract Unix sockets made outside it.
//! 4. **seccomp**: the system calls a coding agent never needs and an escape would
//!    (ptrace, process_vm_*, bpf, io_uring, mount and friends, unshare/setns and clone
//!    into new namespaces, keyctl, perf_event_open, userfaultfd, module and reboot calls,
//!    raw and exotic sockets) fail with `EPERM` (`ENOSYS` where a runtime falls back on
//!    it: io_uring, clone3).
//! 5. **No inherited descriptor**: every descriptor above stdio is marked close-on-exec.
//! 6. **No network** (`net`): a network namespace of its own with loopback alone, made by
//!    the shim on itself just before the fork; the broker's listener in it (the provider
//!    gateway, served by the supervisor) is the only way out.
//!
//! Order: everything is validated and built in the shim before it forks (policy paths, the
//! ruleset with every rule, both BPF programs: any failure is a failed start, nothing
//! half-applied); the forked child then only makes raw system calls (`Prepared::enter`),
//! in the order above, landlock before seccomp. The supervisor observes the harness's
//! `/proc/<pid>/status` (`observe`): seccomp filtering on, `no_new_privs` set, no
//! capability in any set. Landlock leaves no mark in `/proc`; its presence follows from
//! the order: the child installs the seccomp filter only after `landlock_restrict_self`
//! succeeded, and a child whose enter failed never execs.
//!
//! **Never:** weakens a layer when the kernel lacks it (that is a refused start, unless the
//! operator opted the lane out); allocates or takes a lock between fork and exec; confines
//! the shim itself (it stays outside the domain, so the harness cannot reach it).

mod landlock_rules;
mod mounts;
pub mod net;
pub mod pidns;
mod seccomp;
pub mod workspace;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use landlock_rules::REQUIRED_ABI;

#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    #[error("landlock is not available with the rights confinement needs (ABI 6 or newer): {0}")]
    Landlock(String),
    #[error("seccomp filter: {0}")]
    Seccomp(String),
    #[error("{0}")]
    Privilege(String),
    #[error("confinement policy: {0}")]
    Policy(String),
    #[error("process {pid} is exiting: its namespaces are gone")]
    Exiting { pid: i32 },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl ConfineError {
    pub fn category(&self) -> &'static str {
        match self {
            Self::Landlock(_) | Self::Seccomp(_) | Self::Privilege(_) => "confinement-unavailable",
            Self::Policy(_) | Self::Read { .. } | Self::Exiting { .. } => "confinement",
        }
    }
}

/// How one generation's harness runs: confined by `policy`, or (an operator's explicit
/// per-lane opt-out, for hosts that cannot confine) not at all.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Confinement {
    Enforced { policy: Box<Policy> },
    None,
}

impl Confinement {
    pub fn name(&self) -> &'static str {
        match self {
            Self::Enforced { .. } => "enforced",
            Self::None => "none",
        }
    }
}

/// What a confined harness may reach on the filesystem. Built by the supervisor per
/// generation, carried to the shim in its launch message, applied by the shim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    /// Hierarchies the harness may read and execute (the system, its install, the mosaic
    /// binaries it calls back through).
    pub read: Vec<PathBuf>,
    /// Hierarchies it may also write: its private area and run directory.
    pub write: Vec<PathBuf>,
    /// Device files it may read, write and use terminal ioctls on (`/dev/null`, its pty).
    pub devices: Vec<PathBuf>,
    /// Paths no read rule may cover, even below a readable hierarchy: other lanes' and the
    /// supervisor's state, credentials, keys. A writable area may lie below one (the
    /// generation's own private area is below the supervisor's state dir).
    pub masked: Vec<PathBuf>,
    /// Directories covered by an empty tmpfs in the harness's own mount namespace, so
    /// nothing in them (the lanes' tmux sockets, the control socket) exists for it: the
    /// supervisor's state and runtime directories.
    pub hidden: Vec<PathBuf>,
    /// Directories replaced by a fresh tmpfs the harness may write (`/tmp`, `/dev/shm`).
    pub private: Vec<PathBuf>,
    /// Socket directories below a covered directory the harness still reaches (its lane
    /// socket's: a directory, so a socket bound there again is seen).
    pub sockets: Vec<PathBuf>,
    /// The loopback port of the provider gateway in the generation's own network namespace
    /// (`net`), when its runtime has a provider; `None`: loopback alone, no way out.
    #[serde(default)]
    pub gateway: Option<u16>,
    /// The unprivileged uid (and gid: the same number) the harness runs as, its lane
    /// incarnation's own; `None`: the shim's (root's, without any capability).
    #[serde(default)]
    pub uid: Option<u32>,
    /// The workspace: a directory below a `write` hierarchy mounted read-only until the
    /// supervisor opens it (`workspace::switch`, at activation); `None`: no such switch
    /// (writable like the rest of its hierarchy).
    #[serde(default)]
    pub staged: Option<PathBuf>,
    /// The assignment's workspace, a directory of the host kept across its generations
    /// (a repository clone): bound over `staged` before it is made read-only, so the
    /// harness works in it under the same switch. Taken before anything is covered (it
    /// lies below the supervisor's hidden state).
    #[serde(default)]
    pub workspace_source: Option<PathBuf>,
}

/// System hierarchies a harness reads: programs, libraries, configuration (`/etc`: only
/// what every user may read, see `WORLD_READABLE_ONLY`), and the kernel's views a runtime
/// asks (`/proc`, scoped by landlock: another process's memory, descriptors and environment
/// stay out of reach; its cgroup's limits and the CPU list, read-only, so no `cgroup.procs`
/// can be written). Not `/dev` (raw disks are root's to read: only `DEVICES`), not the
/// rest of `/sys`.
pub const SYSTEM_READ: &[&str] = &[
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
    "/opt",
    "/proc",
    "/sys/fs/cgroup",
    "/sys/devices/system/cpu",
];

/// Hierarchies where a file only its owner (root) may read is left out, whatever the
/// rules above grant: a second layer behind the lane's own uid (which file permissions
/// already keep from them), and the only one for a policy without a uid. Walked at every
/// launch (about a thousand entries).
pub const WORLD_READABLE_ONLY: &[&str] = &["/etc"];

/// Devices a harness uses: the null and zero devices, the random devices, its controlling
/// terminal. New terminals come from a devpts instance of its own, granted in the child.
pub const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
];

/// Directories hidden from every generation besides the supervisor's own: where other
/// services keep their sockets and state (`/run`: docker, D-Bus, PostgreSQL, a coordinator
/// on the same host; `/var`: every service's state; the users' homes). What a generation
/// needs below them (its install, its areas) is mounted back.
pub const SYSTEM_HIDDEN: &[&str] = &["/run", "/var", "/home", "/root", "/srv", "/mnt", "/media"];

/// Directories replaced by a private tmpfs the harness may write.
pub const PRIVATE: &[&str] = &["/tmp", "/var/tmp", "/dev/shm"];

impl Policy {
    /// Checks the policy before anything is built from it: absolute paths only, no
    /// writable area masked or above a masked path.
    pub fn validate(&self) -> Result<(), ConfineError> {
        for p in self
            .read
            .iter()
            .chain(&self.write)
            .chain(&self.devices)
            .chain(&self.masked)
            .chain(&self.hidden)
            .chain(&self.private)
            .chain(&self.sockets)
        {
            if !p.is_absolute() {
                return Err(ConfineError::Policy(format!(
                    "{} is not an absolute path",
                    p.display()
                )));
            }
        }
        if let Some(st) = &self.staged {
            // Directly below a writable root: nothing between the two the harness could
            // rename and replace with a link, so the supervisor's switch, which names the
            // workspace by path, always finds its mount.
            if !st.is_absolute()
                || !st
                    .parent()
                    .is_some_and(|p| self.write.iter().any(|w| w == p))
            {
                return Err(ConfineError::Policy(format!(
                    "the workspace {} is not directly below a writable hierarchy",
                    st.display()
                )));
            }
        }
        if let Some(src) = &self.workspace_source {
            if self.staged.is_none() || !src.is_absolute() {
                return Err(ConfineError::Policy(format!(
                    "the workspace {} is bound only over a staged working directory, by an absolute path",
                    src.display()
                )));
            }
        }
        for w in &self.write {
            if let Some(m) = self.masked.iter().find(|m| m.starts_with(w)) {
                return Err(ConfineError::Policy(format!(
                    "writable {} would expose masked {}",
                    w.display(),
                    m.display()
                )));
            }
        }
        Ok(())
    }
}

/// The confinement, built and ready for `enter` in a forked child.
pub struct Prepared {
    ruleset: std::os::fd::OwnedFd,
    filters: Vec<seccompiler::BpfProgram>,
    mounts: mounts::Plan,
    /// The harness's working directory, entered again once the mounts are in place.
    cwd: Option<std::ffi::CString>,
    uid: Option<u32>,
}

impl Prepared {
    /// Validates `policy` and builds every layer (the landlock ruleset with all its rules,
    /// the seccomp programs). Nothing is applied yet.
    pub fn build(policy: &Policy, cwd: Option<&std::path::Path>) -> Result<Self, ConfineError> {
        policy.validate()?;
        if policy.uid == Some(0) {
            return Err(ConfineError::Policy("a harness never runs as uid 0".into()));
        }
        let ruleset = landlock_rules::build(policy)?;
        let filters = seccomp::programs()?;
        // The socket directory read-only: `connect` works through it, nothing else does.
        let exposed: Vec<(PathBuf, bool)> = policy
            .write
            .iter()
            .map(|p| (p.clone(), false))
            .chain(
                policy
                    .read
                    .iter()
                    .chain(&policy.sockets)
                    .map(|p| (p.clone(), true)),
            )
            .collect();
        let mounts = mounts::Plan::new(
            &policy.hidden,
            &policy.private,
            &exposed,
            landlock_rules::mount_access(),
            policy.uid.is_some(),
            policy.staged.as_deref(),
            policy.workspace_source.as_deref(),
        )?;
        let cwd = cwd
            .map(|c| {
                std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(c.as_os_str()))
                    .map_err(|_| ConfineError::Policy("the working directory holds a NUL".into()))
            })
            .transpose()?;
        Ok(Self {
            ruleset,
            filters,
            mounts,
            cwd,
            uid: policy.uid,
        })
    }

    /// Applies every layer to the calling process. Meant for the child between fork and
    /// exec: raw system calls only, no allocation, no lock.
    pub fn enter(&self) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        let fail = || Err(std::io::Error::last_os_error());
        // SAFETY: each call passes plain integers or pointers to memory this value owns
        // and keeps alive for the call; none allocates.
        unsafe {
            // 0. Its own mount and IPC namespaces (needs CAP_SYS_ADMIN: before the
            //    capabilities go), then back into its working directory as now mounted.
            self.mounts.enter(self.ruleset.as_raw_fd())?;
            // (No directory given: "/", never one left behind under a cover.)
            let cwd = self.cwd.as_deref().unwrap_or(c"/");
            if libc::chdir(cwd.as_ptr()) != 0 {
                return fail();
            }
            // 1. No capabilities: empty the bounding set (needs CAP_SETPCAP, which the
            //    shim has as the supervisor's child), then the ambient set.
            let last = last_cap();
            for cap in 0..=last {
                if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0
                    && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL)
                {
                    return fail();
                }
            }
            if libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL,
                0,
                0,
                0,
            ) != 0
            {
                return fail();
            }
            // 1b. Its lane's own uid and gid, no supplementary group: every set (real,
            //     effective, saved, filesystem), so nothing can switch back.
            if let Some(id) = self.uid {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setresgid(id, id, id) != 0
                    || libc::setresuid(id, id, id) != 0
                {
                    return fail();
                }
            }
            // 2. no_new_privs.
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return fail();
            }
            // 3. Landlock.
            if libc::syscall(
                libc::SYS_landlock_restrict_self,
                self.ruleset.as_raw_fd(),
                0u32,
            ) != 0
            {
                return fail();
            }
            // 4. seccomp, after landlock (its presence proves landlock's).
            for f in &self.filters {
                let prog = libc::sock_fprog {
                    len: f.len() as u16,
                    filter: f.as_ptr() as *mut libc::sock_filter,
                };
                if libc::syscall(
                    libc::SYS_seccomp,
                    libc::SECCOMP_SET_MODE_FILTER,
                    0u32,
                    &prog as *const libc::sock_fprog,
                ) != 0
                {
                    return fail();
                }
            }
            // 5. Nothing above stdio crosses exec.
            if libc::syscall(
                libc::SYS_close_range,
                3u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            ) != 0
            {
                return fail();
            }
            // The process's own capability sets: emptied last (dropping the bounding set
            // above needed CAP_SETPCAP). Exec would recompute them from the empty bounding
            // set anyway; this covers the time until exec.
            let mut header = CapHeader {
                version: LINUX_CAPABILITY_VERSION_3,
                pid: 0,
            };
            let data = [CapData::default(); 2];
            if libc::syscall(
                libc::SYS_capset,
                &mut header as *mut CapHeader,
                data.as_ptr(),
            ) != 0
            {
                return fail();
            }
        }
        Ok(())
    }
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// The highest capability number this kernel knows (`/proc/sys/kernel/cap_last_cap` is
/// not readable between fork and exec without allocating; probing with PR_CAPBSET_READ is).
fn last_cap() -> libc::c_ulong {
    let mut cap: libc::c_ulong = 0;
    // SAFETY: PR_CAPBSET_READ takes an integer and touches no memory.
    while cap < 64 && unsafe { libc::prctl(libc::PR_CAPBSET_READ, cap + 1, 0, 0, 0) } >= 0 {
        cap += 1;
    }
    cap
}

/// Gives the pane's terminal (the shim's stdio, a pty tmux made for this generation's
/// pane alone) to the harness's uid, so the harness and its tools can open it by name
/// (`/dev/stderr`, `/dev/tty`) as they would as its owner. Called by the shim before the
/// fork; no other lane's uid can open it.
pub fn give_terminal(uid: u32) -> Result<(), ConfineError> {
    for fd in 0..=2 {
        // SAFETY: isatty and fchown take an integer descriptor and ids.
        unsafe {
            if libc::isatty(fd) == 1 && libc::fchown(fd, uid, uid) != 0 {
                return Err(ConfineError::Privilege(format!(
                    "giving the pane's terminal to uid {uid}: {}",
                    std::io::Error::last_os_error()
                )));
            }
        }
    }
    Ok(())
}

/// What the host's kernel supports, probed once by the supervisor (and `mosaic doctor`).
#[derive(Debug, Clone, Serialize)]
pub struct Support {
    pub landlock_abi: i32,
}

/// Probes every layer confinement needs; the first missing one is the error.
pub fn probe() -> Result<Support, ConfineError> {
    let abi = landlock_rules::abi();
    if abi < REQUIRED_ABI as i32 {
        return Err(ConfineError::Landlock(if abi < 0 {
            "the kernel has no landlock (or it is disabled: lsm= on the kernel command line)".into()
        } else {
            format!(
                "the kernel has landlock ABI {abi}; signal and socket scoping need ABI {}",
                REQUIRED_ABI as i32
            )
        }));
    }
    // SAFETY: PR_GET_SECCOMP takes no pointer.
    if unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) } < 0 {
        return Err(ConfineError::Seccomp(format!(
            "the kernel has no seccomp: {}",
            std::io::Error::last_os_error()
        )));
    }
    seccomp::programs()?;
    // The shim (this process's child) needs CAP_SYS_ADMIN for the namespaces and
    // mounts, and CAP_SETPCAP to empty the bounding set; the supervisor needs
    // CAP_SYS_PTRACE to take the gateway's listener from the shim (`pidfd_getfd`).
    let eff = Status::read("self")
        .and_then(|s| s.hex("CapEff"))
        .unwrap_or(0);
    for (bit, name) in [
        (21, "CAP_SYS_ADMIN"),
        (8, "CAP_SETPCAP"),
        (19, "CAP_SYS_PTRACE"),
    ] {
        if eff & (1 << bit) == 0 {
            return Err(ConfineError::Privilege(format!(
                "the supervisor lacks {name}, which building the confinement needs (run it as root)"
            )));
        }
    }
    Ok(Support { landlock_abi: abi })
}

/// What the supervisor saw of a generation's confinement, as its identity records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Seen {
    /// The harness showed every layer in `/proc/<pid>/status` before the generation went
    /// live.
    Verified,
    /// The lane is opted out (`unconfined_lanes`): the harness runs unconfined.
    None,
    /// Not observed: the harness was gone before it could be read (its exit report
    /// follows), or the record predates confinement.
    #[default]
    Unobserved,
}

/// What `/proc/<pid>/status` says about a process's confinement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    pub no_new_privs: bool,
    /// 2: filtering.
    pub seccomp_mode: u32,
    pub seccomp_filters: u32,
    /// Every capability set (effective, permitted, inheritable, bounding, ambient) empty.
    pub no_capabilities: bool,
    /// In mount, IPC and network namespaces other than the observer's.
    pub own_namespaces: bool,
    /// Its uid and gid when every one of their sets (real, effective, saved, filesystem)
    /// holds the same number and it has no supplementary group; `None` otherwise.
    pub only_id: Option<(u32, u32)>,
}

impl Observed {
    /// Whether the process shows every layer `Prepared::enter` applies.
    pub fn is_confined(&self) -> bool {
        self.no_new_privs
            && self.seccomp_mode == 2
            && self.seccomp_filters >= seccomp::FILTERS
            && self.no_capabilities
            && self.own_namespaces
    }
}

/// Whether a local socket's peer must be refused by the daemons' own sockets (the
/// supervisor's control socket, the coordinator's operator socket): a confined generation
/// (or anything it started: `no_new_privs` and the empty bounding set are inherited and
/// permanent) never speaks them. A peer that cannot be read, or is already dead (a zombie
/// child that connected and exited, its socket used by its parent), is refused too.
pub fn refuse_peer(pid: Option<i32>) -> bool {
    let Some(st) = pid.and_then(|p| Status::read(&p.to_string())) else {
        return true;
    };
    let no_new_privs = st.field("NoNewPrivs") != Some("0");
    let no_bounding = st.hex("CapBnd").is_none_or(|v| v == 0);
    st.dead() || (no_new_privs && no_bounding)
}

/// Whether `pid` is gone or a zombie (or cannot be read).
pub fn is_dead(pid: i32) -> bool {
    Status::read(&pid.to_string()).is_none_or(|s| s.dead())
}

/// One process's `/proc/<pid>/status`, read once, its fields by name.
struct Status(String);

impl Status {
    /// `who`: a pid, or `self`.
    fn read(who: &str) -> Option<Self> {
        std::fs::read_to_string(format!("/proc/{who}/status"))
            .ok()
            .map(Self)
    }

    fn field(&self, name: &str) -> Option<&str> {
        self.0
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    }

    /// A hexadecimal field (the capability sets).
    fn hex(&self, name: &str) -> Option<u64> {
        u64::from_str_radix(self.field(name)?, 16).ok()
    }

    /// A zombie, or a process being torn down (or no state line at all).
    fn dead(&self) -> bool {
        self.field("State")
            .is_none_or(|s| s.starts_with(['Z', 'X']))
    }
}

/// Reads `pid`'s confinement from `/proc/<pid>/status`.
pub fn observe(pid: i32) -> Result<Observed, ConfineError> {
    let path = PathBuf::from(format!("/proc/{pid}/status"));
    let text = std::fs::read_to_string(&path).map_err(|source| ConfineError::Read {
        path: path.clone(),
        source,
    })?;
    let mut o = parse_status(&Status(text)).ok_or_else(|| ConfineError::Read {
        path,
        source: std::io::Error::other("no NoNewPrivs/Seccomp/Cap* lines"),
    })?;
    let ns = |who: &str, kind: &str| std::fs::read_link(format!("/proc/{who}/ns/{kind}")).ok();
    let kinds = ["mnt", "ipc", "net", "pid"];
    let theirs: Vec<_> = kinds.iter().map(|k| ns(&pid.to_string(), k)).collect();
    // A process gives up its namespaces only in exit, just before it becomes a zombie:
    // then they cannot be read, and nothing can be said of them.
    if theirs.iter().any(Option::is_none) {
        return Err(ConfineError::Exiting { pid });
    }
    o.own_namespaces = kinds
        .iter()
        .zip(&theirs)
        .all(|(k, t)| ns("self", k).is_some_and(|ours| Some(ours) != *t));
    Ok(o)
}

fn parse_status(st: &Status) -> Option<Observed> {
    let caps_empty = ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"]
        .iter()
        .map(|c| st.hex(c).map(|v| v == 0))
        .collect::<Option<Vec<bool>>>()?;
    Some(Observed {
        no_new_privs: st.field("NoNewPrivs")? == "1",
        seccomp_mode: st.field("Seccomp")?.parse().ok()?,
        seccomp_filters: st.field("Seccomp_filters")?.parse().ok()?,
        no_capabilities: caps_empty.iter().all(|e| *e),
        own_namespaces: false,
        only_id: {
            let same = |name: &str| -> Option<u32> {
                let v: Vec<u32> = st
                    .field(name)?
                    .split_whitespace()
                    .map(|x| x.parse().ok())
                    .collect::<Option<_>>()?;
                (v.len() == 4 && v.iter().all(|x| *x == v[0])).then_some(v[0])
            };
            match (same("Uid"), same("Gid"), st.field("Groups")) {
                (Some(u), Some(g), Some("")) => Some((u, g)),
                _ => None,
            }
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines_are_read_by_name() {
        let confined_text = "Name:\tx\nCapInh:\t0000000000000000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\nSeccomp_filters:\t2\n";
        let parse = |t: &str| parse_status(&Status(t.to_string()));
        let with_ns = |t: &str| Observed {
            own_namespaces: true,
            ..parse(t).unwrap()
        };
        assert!(with_ns(confined_text).is_confined());
        assert!(
            !parse(confined_text).unwrap().is_confined(),
            "namespaces unseen"
        );
        let confined = confined_text;
        let root = confined.replace("CapBnd:\t0000000000000000", "CapBnd:\t000001ffffffffff");
        assert!(!with_ns(&root).is_confined());
        let unfiltered = confined.replace("Seccomp:\t2", "Seccomp:\t0");
        assert!(!with_ns(&unfiltered).is_confined());
        assert!(parse("Name:\tx\n").is_none());
        // A zombie is dead; a running process is not.
        assert!(Status("State:\tZ (zombie)\n".into()).dead());
        assert!(!Status("State:\tS (sleeping)\n".into()).dead());
    }

    #[test]
    fn a_policy_cannot_write_where_it_masks() {
        let p = Policy {
            read: vec!["/usr".into()],
            write: vec!["/var/lib/mosaic".into()],
            devices: vec![],
            masked: vec!["/var/lib/mosaic/harness/other".into()],
            hidden: vec![],
            private: vec![],
            sockets: vec![],
            gateway: None,
            uid: None,
            staged: None,
            workspace_source: None,
        };
        assert!(p.validate().is_err());
        // A workspace only below a writable hierarchy (never the hierarchy itself).
        for (write, staged) in [
            ("/srv/a", "/srv/b/work"),
            ("/srv/a", "/srv/a"),
            ("/srv/a", "/srv/a/b/work"),
        ] {
            let w = Policy {
                write: vec![write.into()],
                masked: vec![],
                staged: Some(staged.into()),
                workspace_source: None,
                ..p.clone()
            };
            assert!(w.validate().is_err(), "{write} {staged}");
        }
        let ok = Policy {
            write: vec!["/srv/a".into()],
            masked: vec![],
            staged: Some("/srv/a/work".into()),
            workspace_source: None,
            ..p.clone()
        };
        assert!(ok.validate().is_ok());
        let rel = Policy {
            read: vec!["usr".into()],
            write: vec![],
            devices: vec![],
            masked: vec![],
            hidden: vec![],
            private: vec![],
            sockets: vec![],
            gateway: None,
            uid: None,
            staged: None,
            workspace_source: None,
        };
        assert!(rel.validate().is_err());
    }
}
