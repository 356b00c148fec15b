//! The landlock ruleset of a confined generation: every filesystem right handled, scoped
//! signals and abstract sockets, rules from the policy with its masked paths cut out.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use landlock::{
    Access, AccessFs, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreated, RulesetCreatedAttr, Scope, ABI,
};

use super::{ConfineError, Policy};

/// The oldest ABI with every right the boundary rests on: device ioctls (ABI 5) and the
/// signal and abstract-socket scopes (ABI 6). Required, never best effort.
pub const REQUIRED_ABI: ABI = ABI::V6;

/// The kernel's landlock ABI (negative when it has none).
pub fn abi() -> i32 {
    // SAFETY: LANDLOCK_CREATE_RULESET_VERSION with a null attribute only returns a number.
    unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32, // LANDLOCK_CREATE_RULESET_VERSION
        ) as i32
    }
}

/// Rights on a device: read, write, terminal ioctls.
fn device() -> BitFlags<AccessFs> {
    AccessFs::from_read(REQUIRED_ABI) | AccessFs::WriteFile | AccessFs::IoctlDev
}

/// The right masks the child grants on what it mounts itself.
pub fn mount_access() -> super::mounts::Access {
    super::mounts::Access {
        all: AccessFs::from_all(REQUIRED_ABI).bits(),
        device: device().bits(),
        device_file: (device() & AccessFs::from_file(REQUIRED_ABI)).bits(),
        read: AccessFs::from_read(REQUIRED_ABI).bits(),
    }
}

fn ll(e: impl std::fmt::Display) -> ConfineError {
    ConfineError::Landlock(e.to_string())
}

/// Builds the ruleset (created, every rule added, not yet applied) and returns its fd.
pub fn build(policy: &Policy) -> Result<OwnedFd, ConfineError> {
    let all = AccessFs::from_all(REQUIRED_ABI);
    let read = AccessFs::from_read(REQUIRED_ABI);
    let mut rs: RulesetCreated = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(all)
        .map_err(ll)?
        .scope(Scope::from_all(REQUIRED_ABI))
        .map_err(ll)?
        .create()
        .map_err(ll)?;
    let mut masked = policy.masked.clone();
    for root in super::WORLD_READABLE_ONLY {
        owner_only_below(Path::new(root), &mut masked);
    }
    for root in &policy.read {
        rs = add_unmasked(rs, root, read, &masked, true)?;
    }
    for w in &policy.write {
        rs = add(rs, w, all)?;
    }
    for d in &policy.devices {
        rs = add(rs, d, device())?;
    }
    // Its pane's terminal, also by name (`/dev/stderr`, `/proc/self/fd/2`, `ttyname`):
    // the one this shim was given, on the host's devpts, which the harness's own
    // devpts instance covers.
    if let Ok(tty) = std::fs::read_link("/proc/self/fd/0") {
        if tty.starts_with("/dev/pts/") {
            rs = add(rs, &tty, device())?;
        }
    }
    // Directory listings (names only) everywhere: `ls /etc` works although /etc is
    // granted entry by entry; what is hidden is not there to list.
    rs = add(rs, Path::new("/"), BitFlags::from(AccessFs::ReadDir))?;
    let fd: Option<OwnedFd> = rs.into();
    fd.ok_or_else(|| ll("the ruleset has no file descriptor"))
}

/// One rule for `path`, with the rights that apply to what it is (a file takes no
/// directory rights).
fn add(
    rs: RulesetCreated,
    path: &Path,
    access: BitFlags<AccessFs>,
) -> Result<RulesetCreated, ConfineError> {
    let fd = match PathFd::new(path) {
        Ok(fd) => fd,
        // A hierarchy the host does not have (no /lib32): nothing to allow.
        Err(_) if !path.exists() => return Ok(rs),
        Err(e) => return Err(ll(format!("{}: {e}", path.display()))),
    };
    let access = if path.is_dir() {
        access
    } else {
        access & AccessFs::from_file(REQUIRED_ABI)
    };
    rs.add_rule(PathBeneath::new(fd, access))
        .map_err(|e| ll(format!("{}: {e}", path.display())))
}

/// Collects every entry below `dir` that not every user may read (or, for a directory,
/// enter), without following links: those stay out of the harness's reach.
fn owner_only_below(dir: &Path, out: &mut Vec<PathBuf>) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let Ok(meta) = e.metadata() else {
            continue;
        };
        let mode = meta.permissions().mode();
        let world = if meta.is_dir() { 0o005 } else { 0o004 };
        if meta.file_type().is_symlink() {
            continue;
        }
        if mode & world != world {
            out.push(e.path());
        } else if meta.is_dir() {
            owner_only_below(&e.path(), out);
        }
    }
}

/// Rules granting `access` beneath `root` except beneath any masked path: a root with no
/// masked path below it is one rule; one with a masked path below is replaced by its
/// entries, recursively, leaving the masked ones out.
fn add_unmasked(
    mut rs: RulesetCreated,
    root: &Path,
    access: BitFlags<AccessFs>,
    masked: &[PathBuf],
    explicit: bool,
) -> Result<RulesetCreated, ConfineError> {
    // A root the policy names is granted even below a masked directory (the harness
    // install below the state dir); what it finds below itself is still cut out.
    if masked
        .iter()
        .any(|m| root == m || (!explicit && root.starts_with(m)))
    {
        return Ok(rs);
    }
    if !masked.iter().any(|m| m.starts_with(root)) {
        return add(rs, root, access);
    }
    let entries = match std::fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(rs),
        Err(source) => {
            return Err(ConfineError::Read {
                path: root.to_path_buf(),
                source,
            })
        }
    };
    for entry in entries {
        let entry = entry.map_err(|source| ConfineError::Read {
            path: root.to_path_buf(),
            source,
        })?;
        let path = entry.path();
        // A rule follows a symbolic link to its target: one that leads into (or above) a
        // masked path is left out, not followed.
        if entry.file_type().is_ok_and(|t| t.is_symlink()) {
            use std::os::unix::fs::PermissionsExt;
            match std::fs::canonicalize(&path) {
                Ok(t) if !masked.iter().any(|m| t.starts_with(m) || m.starts_with(&t)) => {
                    // Only to what every user could read anyway.
                    let world_readable = std::fs::metadata(&t).is_ok_and(|m| {
                        let need = if m.is_dir() { 0o005 } else { 0o004 };
                        m.permissions().mode() & need == need
                    });
                    if !world_readable {
                        continue;
                    }
                }
                _ => continue,
            }
        }
        rs = add_unmasked(rs, &path, access, masked, false)?;
    }
    Ok(rs)
}
