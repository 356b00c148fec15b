//! A confined generation's workspace (its working directory) is one mount of its own in the
//! generation's mount namespace, read-only until its activation commits (spec §3 invariant
//! 7: staging makes no effect) and read-only again once the coordinator fences it. The
//! shim's child mounts it read-only (`mounts::Plan`); the supervisor switches that one
//! mount's read-only flag from outside, in a short-lived child that enters the namespace.
//! Landlock grants the write rights from the start: the mount flag is the switch, and
//! nothing in the generation can change it (no capability, no mount system call).
//!
//! **Never** switches a mount of a process it has not identified by its start time (a pid
//! alone names nothing), or allocates, unwinds or touches anything but its own arguments in
//! the child (it shares the supervisor's memory).

use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::ConfineError;

use super::mounts::{MountAttr, MOUNT_ATTR_RDONLY};

/// Why a switch failed: the process is not (any longer) the one named, or the kernel
/// refused (`EBUSY` closing a workspace a file is still open for writing in).
#[derive(Debug, thiserror::Error)]
pub enum SwitchError {
    #[error("the generation's process {pid} is gone or not the one recorded")]
    Gone { pid: i32 },
    #[error("{what}: {source}")]
    Sys {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

impl SwitchError {
    /// Closing found a file open for writing in the workspace (the kernel keeps such a
    /// mount writable).
    pub fn busy(&self) -> bool {
        matches!(self, Self::Sys { source, .. } if source.raw_os_error() == Some(libc::EBUSY))
    }
}

impl From<SwitchError> for ConfineError {
    fn from(e: SwitchError) -> Self {
        ConfineError::Privilege(e.to_string())
    }
}

/// The switch's child: what it is given, all prepared before the clone.
struct Call {
    ns: libc::c_int,
    target: *const libc::c_char,
    attr: *const MountAttr,
}

/// The child's stack: two system calls and their arguments.
const CHILD_STACK: usize = 64 * 1024;

/// The child: enters the generation's mount namespace and sets the workspace mount's
/// flag. Exit code: 0, or the errno of the step that failed (below 128), with 0x80 set
/// when it was mount_setattr.
extern "C" fn enter_and_switch(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `Call` the parent keeps alive until this child has exited.
    unsafe {
        let call = &*(arg as *const Call);
        if libc::setns(call.ns, libc::CLONE_NEWNS) != 0 {
            *libc::__errno_location() & 0x7f
        } else if libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            call.target,
            0u32,
            call.attr,
            std::mem::size_of::<MountAttr>(),
        ) != 0
        {
            0x80 | (*libc::__errno_location() & 0x7f)
        } else {
            0
        }
    }
}

/// Makes the workspace mount at `path` in the mount namespace of process `pid` (whose start
/// time, in clock ticks after boot, must be `start_time`) writable or read-only.
/// Idempotent. Blocks for the child's life (a clone sharing our memory, two system calls):
/// call it off the async runtime's threads.
pub fn switch(pid: i32, start_time: u64, path: &Path, writable: bool) -> Result<(), SwitchError> {
    let target = CString::new(path.as_os_str().as_bytes()).map_err(|_| SwitchError::Sys {
        what: "workspace path",
        source: std::io::Error::from_raw_os_error(libc::EINVAL),
    })?;
    // The namespace first, the identity after: if the start time still matches once the
    // descriptor is open, the descriptor is that process's (a pid is not reused while its
    // process lives).
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/mnt"))
        .map_err(|_| SwitchError::Gone { pid })?;
    let started = procfs::process::Process::new(pid)
        .and_then(|p| p.stat())
        .map(|s| s.starttime)
        .map_err(|_| SwitchError::Gone { pid })?;
    if started != start_time {
        return Err(SwitchError::Gone { pid });
    }
    let attr = MountAttr {
        attr_set: if writable { 0 } else { MOUNT_ATTR_RDONLY },
        attr_clr: if writable { MOUNT_ATTR_RDONLY } else { 0 },
        propagation: 0,
        userns_fd: 0,
    };
    let call = Call {
        ns: ns.as_raw_fd(),
        target: target.as_ptr(),
        attr: &attr,
    };
    // The child's own stack (it shares our memory; we are suspended while it runs).
    let mut stack = vec![0u8; CHILD_STACK];
    // SAFETY: `enter_and_switch` makes two system calls through glibc's wrappers (setns,
    // syscall; on error they write errno, this thread's, which nothing reads after) on
    // memory prepared before the clone, which stays alive and untouched until the child
    // has exited (CLONE_VFORK suspends this thread until then), and it never unwinds.
    // Every signal is blocked in this thread across the clone, so no handler of ours runs
    // on the child's stack; the child inherits that mask and needs no signal. Not a
    // `fork`: the supervisor's page tables are not copied (the fleet bench's profile: 17 %
    // of the supervisors' CPU went to copying them and to the copy-on-write faults after).
    // Never add CLONE_FS (setns into a mount namespace refuses a shared fs: EINVAL) or
    // CLONE_SIGHAND (a fault in the child would reset the supervisor's own handlers).
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        let mut old: libc::sigset_t = std::mem::zeroed();
        let rc = libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        if rc != 0 {
            return Err(SwitchError::Sys {
                what: "blocking signals",
                source: std::io::Error::from_raw_os_error(rc),
            });
        }
        // The stack grows down: its top, 16-byte aligned.
        let top = stack.as_mut_ptr().add(CHILD_STACK);
        let top = top.sub(top as usize % 16);
        let child = libc::clone(
            enter_and_switch,
            top.cast(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (&call as *const Call).cast_mut().cast(),
        );
        let cloned = std::io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        match child {
            -1 => Err(SwitchError::Sys {
                what: "clone",
                source: cloned,
            }),
            child => {
                let mut st: libc::c_int = 0;
                loop {
                    if libc::waitpid(child, &mut st, 0) == child {
                        break;
                    }
                    let e = std::io::Error::last_os_error();
                    if e.raw_os_error() != Some(libc::EINTR) {
                        return Err(SwitchError::Sys {
                            what: "waitpid",
                            source: e,
                        });
                    }
                }
                if !libc::WIFEXITED(st) {
                    return Err(SwitchError::Sys {
                        what: "workspace switch",
                        source: std::io::Error::other("its child was killed"),
                    });
                }
                match libc::WEXITSTATUS(st) {
                    0 => Ok(()),
                    c => Err(SwitchError::Sys {
                        what: if c & 0x80 == 0 {
                            "entering the generation's mount namespace"
                        } else {
                            "mount_setattr on the workspace"
                        },
                        source: std::io::Error::from_raw_os_error(c & 0x7f),
                    }),
                }
            }
        }
    }
}
