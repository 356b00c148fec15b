//! The harness's own mount and IPC namespaces: the supervisor's directories hidden under
//! empty tmpfs mounts (so every socket in them, the lanes' tmux servers and the control
//! socket among them, is unreachable by path), the generation's own areas and lane socket
//! mounted back in place, and a private `/tmp` and `/dev/shm`.
//!
//! Everything is computed in `Plan::new`, before the fork (C strings, the directories to
//! make); `Plan::enter` runs in the child and makes raw system calls only.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::ConfineError;

const OPEN_TREE_CLONE: libc::c_uint = 0x1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const LANDLOCK_RULE_PATH_BENEATH: libc::c_int = 1;
pub(super) const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const AT_RECURSIVE: libc::c_int = 0x8000;

/// `mount_setattr(2)` on `dirfd`/`path`: raw, allocation-free.
///
/// # Safety
/// `path` must be a valid C string.
unsafe fn setattr(dirfd: libc::c_int, path: &std::ffi::CStr, flags: libc::c_int, set: u64) -> bool {
    let attr = MountAttr {
        attr_set: set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    libc::syscall(
        libc::SYS_mount_setattr,
        dirfd,
        path.as_ptr(),
        flags,
        &attr as *const MountAttr,
        std::mem::size_of::<MountAttr>(),
    ) == 0
}

/// A detached copy of the mount tree at `path` with `attrs` set: its descriptor, or -1.
///
/// # Safety
/// Raw system calls on a C string the caller owns; allocates nothing (the forked child).
unsafe fn clone_tree(path: &std::ffi::CStr, attrs: u64) -> libc::c_int {
    let fd = libc::syscall(
        libc::SYS_open_tree,
        libc::AT_FDCWD,
        path.as_ptr(),
        OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint,
    ) as libc::c_int;
    if fd >= 0 && !setattr(fd, c"", libc::AT_EMPTY_PATH, attrs) {
        libc::close(fd);
        return -1;
    }
    fd
}

/// Mounts the detached tree `fd` at `path` and closes it: whether it was mounted.
///
/// # Safety
/// As `clone_tree`.
unsafe fn attach_tree(fd: libc::c_int, path: &std::ffi::CStr) -> bool {
    let ok = libc::syscall(
        libc::SYS_move_mount,
        fd,
        c"".as_ptr(),
        libc::AT_FDCWD,
        path.as_ptr(),
        MOVE_MOUNT_F_EMPTY_PATH,
    ) == 0;
    libc::close(fd);
    ok
}

fn cstr(p: &Path) -> Result<CString, ConfineError> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| ConfineError::Policy(format!("{} holds a NUL byte", p.display())))
}

/// One path mounted back below a covered directory.
struct Exposed {
    path: CString,
    is_dir: bool,
    /// Below a covered directory (its mount point is made); otherwise mounted onto itself.
    covered: bool,
    read_only: bool,
    /// Directories to make in the tmpfs, outermost first, before the mount point.
    make: Vec<CString>,
}

#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

/// `struct mount_attr` (linux/mount.h).
#[repr(C)]
pub(super) struct MountAttr {
    pub(super) attr_set: u64,
    pub(super) attr_clr: u64,
    pub(super) propagation: u64,
    pub(super) userns_fd: u64,
}

/// Landlock right masks the child grants on what it mounts.
pub struct Access {
    pub all: u64,
    pub device: u64,
    pub device_file: u64,
    /// What a read root gets (the new `/proc`).
    pub read: u64,
}

/// The most paths mounted back (the areas, a lane socket, a few read roots).
pub const MAX_EXPOSED: usize = 16;

/// `landlock_add_rule(2)` for `path` (opened `O_PATH` here): raw, allocation-free.
///
/// # Safety
/// `path` must be a valid C string.
unsafe fn add_rule(ruleset: libc::c_int, path: &std::ffi::CStr, access: u64) -> bool {
    let fd = libc::open(path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
    if fd < 0 {
        return false;
    }
    let attr = PathBeneathAttr {
        allowed_access: access,
        parent_fd: fd,
    };
    let r = libc::syscall(
        libc::SYS_landlock_add_rule,
        ruleset,
        LANDLOCK_RULE_PATH_BENEATH,
        &attr as *const PathBeneathAttr,
        0u32,
    );
    libc::close(fd);
    r == 0
}

pub struct Plan {
    /// Covered with an empty tmpfs, parents before children: the directory, whether the
    /// harness may write it, and the directories to make first (inside a covering parent).
    covered: Vec<(CString, bool, Vec<CString>)>,
    exposed: Vec<Exposed>,
    tmpfs: CString,
    hidden_opts: CString,
    tmp_opts: CString,
    /// Landlock rights a private directory gets (every filesystem right).
    private_access: u64,
    /// Landlock rights on the new terminals: the directory, and the ptmx file.
    device_access: u64,
    device_file_access: u64,
    /// A procfs of its own over `/proc` that shows only its own uid's processes
    /// (`hidepid=invisible`), with read rights: for a harness that has a uid of its own.
    own_proc: Option<u64>,
    /// The workspace, mounted onto itself read-only once everything else is in place.
    staged: Option<CString>,
    /// A directory of the host bound over the workspace first (the assignment's own).
    bound: Option<CString>,
}

/// The directories to make, outermost first, from inside `root` down to `path` (itself
/// included when `include_last`).
fn chain(root: &Path, path: &Path, include_last: bool) -> Result<Vec<CString>, ConfineError> {
    let mut make = Vec::new();
    let mut acc = root.to_path_buf();
    let comps: Vec<_> = path
        .strip_prefix(root)
        .unwrap_or(path)
        .components()
        .collect();
    for (i, c) in comps.iter().enumerate() {
        acc.push(c);
        if i + 1 < comps.len() || include_last {
            make.push(cstr(&acc)?);
        }
    }
    Ok(make)
}

impl Plan {
    /// `hidden`: directories covered by an empty tmpfs, read-only once what is exposed
    /// below is in place; `private`: covered by a fresh tmpfs the harness may write
    /// (`/tmp`, `/dev/shm`); `exposed`: paths below a covered directory that stay visible
    /// (`true`: read-only).
    pub fn new(
        hidden: &[PathBuf],
        private: &[PathBuf],
        exposed: &[(PathBuf, bool)],
        access: Access,
        own_proc: bool,
        staged: Option<&Path>,
        bound: Option<&Path>,
    ) -> Result<Self, ConfineError> {
        let mut all: Vec<(&PathBuf, bool)> = hidden
            .iter()
            .map(|h| (h, false))
            .chain(private.iter().map(|p| (p, true)))
            .filter(|(p, _)| p.is_dir())
            .collect();
        // Parents before children (a path sorts before every path below it); a directory
        // both hidden and private is private (`true` sorts after `false`: keep the last).
        all.sort();
        all.reverse();
        all.dedup_by(|a, b| a.0 == b.0);
        all.reverse();
        // The deepest covered directory above `p` (strictly).
        let cover_of = |p: &Path| {
            all.iter()
                .filter(|(c, _)| p != c.as_path() && p.starts_with(c))
                .max_by_key(|(c, _)| c.components().count())
                .map(|(c, _)| c.to_path_buf())
        };
        let mut covered = Vec::new();
        for (dir, writable) in &all {
            let make = match cover_of(dir) {
                Some(parent) => chain(&parent, dir, true)?,
                None => vec![],
            };
            covered.push((cstr(dir)?, *writable, make));
        }
        let mut ex = Vec::new();
        for (e, read_only) in exposed {
            // Mounted back over a cover above it would undo the cover: refused.
            if let Some((c, _)) = all.iter().find(|(c, _)| c.starts_with(e)) {
                return Err(ConfineError::Policy(format!(
                    "{} would be mounted back over {}, which must stay covered",
                    e.display(),
                    c.display()
                )));
            }
            let root = cover_of(e);
            if root.is_none() && *read_only {
                continue; // in view, and read-only like the rest of the tree
            }
            let meta = match std::fs::metadata(e) {
                Ok(m) => m,
                // A root the host does not have (no harness install yet): nothing to mount.
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
                Err(source) => {
                    return Err(ConfineError::Read {
                        path: e.clone(),
                        source,
                    })
                }
            };
            ex.push(Exposed {
                path: cstr(e)?,
                is_dir: meta.is_dir(),
                covered: root.is_some(),
                read_only: *read_only,
                // Writable and not covered: mounted back onto itself, over the read-only
                // tree, with nothing to make.
                make: match &root {
                    Some(root) => chain(root, e, meta.is_dir())?,
                    None => vec![],
                },
            });
        }
        if ex.len() > MAX_EXPOSED {
            return Err(ConfineError::Policy(format!(
                "{} paths to mount back; at most {MAX_EXPOSED}",
                ex.len()
            )));
        }
        Ok(Self {
            covered,
            exposed: ex,
            tmpfs: cstr(Path::new("tmpfs"))?,
            hidden_opts: cstr(Path::new("mode=0755,size=64k"))?,
            // Bounded: a full /tmp must not take the host's memory with it.
            tmp_opts: cstr(Path::new("mode=1777,size=25%"))?,
            private_access: access.all,
            device_access: access.device,
            device_file_access: access.device_file,
            own_proc: own_proc.then_some(access.read),
            staged: staged.map(cstr).transpose()?,
            bound: bound.map(cstr).transpose()?,
        })
    }

    /// In the forked child, before its capabilities are dropped: new mount and IPC
    /// namespaces, the hidden directories covered, the exposed paths mounted back, the
    /// private directories made writable in `ruleset` (not yet enforced).
    pub fn enter(&self, ruleset: libc::c_int) -> std::io::Result<()> {
        let fail = || Err(std::io::Error::last_os_error());
        let null = std::ptr::null::<libc::c_char>();
        // SAFETY: every pointer is to a C string or struct this value owns, alive for the
        // call; the calls allocate nothing.
        unsafe {
            if libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWIPC) != 0 {
                return fail();
            }
            // Nothing done here propagates back to the host.
            if libc::mount(
                null,
                c"/".as_ptr(),
                null,
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) != 0
            {
                return fail();
            }
            // Detached copies of what stays visible, taken before it is covered (a fixed
            // array: no allocation).
            let mut trees = [-1i32; MAX_EXPOSED];
            for (i, e) in self.exposed.iter().enumerate() {
                // What is mounted back keeps no setuid or device meaning; what is read
                // only stays so.
                let set = MOUNT_ATTR_NOSUID
                    | MOUNT_ATTR_NODEV
                    | if e.read_only { MOUNT_ATTR_RDONLY } else { 0 };
                trees[i] = clone_tree(&e.path, set);
                if trees[i] < 0 {
                    return fail();
                }
            }
            // The assignment's workspace, detached before its parent is covered.
            let mut bound = -1i32;
            if let Some(b) = &self.bound {
                bound = clone_tree(b, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV);
                if bound < 0 {
                    return fail();
                }
            }
            // The whole host tree read-only and without setuid: landlock does not govern
            // chmod, chown, xattrs or timestamps (a policy without a uid keeps uid 0, the
            // host files' owner).
            if !setattr(
                libc::AT_FDCWD,
                c"/",
                AT_RECURSIVE,
                MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID,
            ) {
                return fail();
            }
            for (dir, writable, make) in &self.covered {
                for d in make {
                    if libc::mkdir(d.as_ptr(), 0o755) != 0
                        && *libc::__errno_location() != libc::EEXIST
                    {
                        return fail();
                    }
                }
                let opts = if *writable {
                    &self.tmp_opts
                } else {
                    &self.hidden_opts
                };
                if libc::mount(
                    self.tmpfs.as_ptr(),
                    dir.as_ptr(),
                    self.tmpfs.as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV,
                    opts.as_ptr().cast(),
                ) != 0
                {
                    return fail();
                }
            }
            for (i, e) in self.exposed.iter().enumerate() {
                for d in &e.make {
                    if libc::mkdir(d.as_ptr(), 0o755) != 0
                        && *libc::__errno_location() != libc::EEXIST
                    {
                        return fail();
                    }
                }
                if !e.is_dir && e.covered {
                    let fd = libc::open(
                        e.path.as_ptr(),
                        libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                        0o600,
                    );
                    if fd < 0 {
                        return fail();
                    }
                    libc::close(fd);
                }
                if !attach_tree(trees[i], &e.path) {
                    return fail();
                }
            }
            // A hidden directory's skeleton is read-only from here on (even inside a
            // private one, whose landlock rule would let the harness write it).
            for (dir, writable, _) in &self.covered {
                if !*writable
                    && libc::mount(
                        null,
                        dir.as_ptr(),
                        null,
                        // MS_BIND: this mount's flags, never its filesystem's.
                        libc::MS_REMOUNT
                            | libc::MS_BIND
                            | libc::MS_RDONLY
                            | libc::MS_NOSUID
                            | libc::MS_NODEV,
                        std::ptr::null(),
                    ) != 0
                {
                    return fail();
                }
            }
            // The workspace read-only until the supervisor opens it: a mount of its own
            // (cloned from what is now mounted there), the one flag the switch changes.
            if let Some(ws) = &self.staged {
                if bound >= 0 && !attach_tree(bound, ws) {
                    return fail();
                }
                let fd = clone_tree(ws, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_RDONLY);
                if fd < 0 || !attach_tree(fd, ws) {
                    return fail();
                }
            }
            // Its own terminals: a new devpts instance (no other pane's terminal in it;
            // its own stays open on its descriptors and as /dev/tty) and its ptmx.
            if libc::mount(
                c"devpts".as_ptr(),
                c"/dev/pts".as_ptr(),
                c"devpts".as_ptr(),
                libc::MS_NOSUID | libc::MS_NOEXEC,
                c"newinstance,ptmxmode=0666,mode=0620".as_ptr().cast(),
            ) != 0
                || libc::mount(
                    c"/dev/pts/ptmx".as_ptr(),
                    c"/dev/ptmx".as_ptr(),
                    null,
                    libc::MS_BIND,
                    std::ptr::null(),
                ) != 0
            {
                return fail();
            }
            // Its own processes only: a procfs instance that hides every process of
            // another uid (the shim, the supervisor, other lanes, the host's services:
            // their command lines, their existence). The host's /proc stays beneath it.
            if let Some(read) = self.own_proc {
                if libc::mount(
                    c"proc".as_ptr(),
                    c"/proc".as_ptr(),
                    c"proc".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    c"hidepid=invisible".as_ptr().cast(),
                ) != 0
                    || !add_rule(ruleset, c"/proc", read)
                {
                    return fail();
                }
            }
            // Rules for what exists only from here on: the private directories (every
            // right) and the new terminals (device rights).
            for (dir, writable, _) in &self.covered {
                if *writable && !add_rule(ruleset, dir, self.private_access) {
                    return fail();
                }
            }
            if !add_rule(ruleset, c"/dev/pts", self.device_access)
                || !add_rule(ruleset, c"/dev/ptmx", self.device_file_access)
            {
                return fail();
            }
        }
        Ok(())
    }
}
