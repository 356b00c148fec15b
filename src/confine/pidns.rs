//! A confined generation's PID namespace. The shim unshares it on itself just before it
//! forks (its next child is the namespace's PID 1, the supervisor's `harness_pid`) and
//! goes back to its own right after (the kernel gives it no thread before), and
//! that child, once its confinement is applied, forks the harness and stays as the
//! namespace's init (`mosaic-init`): it forwards to the harness every signal a process sent
//! it (the supervisor's graceful signal; a terminal's signals reach the harness directly
//! and are not forwarded; one a process sends to the whole process group reaches the
//! harness twice, directly and forwarded), reaps every orphan of the namespace, and when the harness ends
//! hands its wait status to the shim and exits — the kernel then kills whatever is left in
//! the namespace. Inside, pids are the generation's own: no process outside it exists.
//!
//! An init is needed because the kernel drops a signal to a namespace's PID 1 that has no
//! handler: a harness running as PID 1 would not die of its graceful signal. The init
//! waits for signals with them all blocked (a blocked signal is queued, never dropped).
//!
//! **Never** allocates or locks between fork and exec (raw system calls on stack memory).

use super::ConfineError;

/// The shim's own PID namespace, held while its next child is born in a new one.
#[must_use = "the shim must go back to its own namespace (`end`) before it starts a thread"]
pub struct Isolated(std::os::fd::OwnedFd);

/// Moves the calling process's next child into a new PID namespace, of which it is the
/// init. Until `Isolated::end`, the kernel refuses the process a new thread.
pub fn isolate() -> Result<Isolated, ConfineError> {
    let own = std::fs::File::open("/proc/self/ns/pid")
        .map_err(|e| ConfineError::Privilege(format!("opening /proc/self/ns/pid: {e}")))?;
    // SAFETY: unshare takes no pointer.
    if unsafe { libc::unshare(libc::CLONE_NEWPID) } != 0 {
        return Err(ConfineError::Privilege(format!(
            "unshare(CLONE_NEWPID): {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(Isolated(own.into()))
}

impl Isolated {
    /// After the fork: later children and threads of the caller are born in its own
    /// namespace again (a thread needs it: clone refuses CLONE_THREAD while the two differ).
    pub fn end(self) -> Result<(), ConfineError> {
        use std::os::fd::AsRawFd;
        // SAFETY: setns takes a descriptor this value owns and a flag.
        if unsafe { libc::setns(self.0.as_raw_fd(), libc::CLONE_NEWPID) } != 0 {
            return Err(ConfineError::Privilege(format!(
                "setns back to the shim's own PID namespace: {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(())
    }
}

/// The comm the namespace's init shows (`ps`, `/proc/<pid>/comm`).
pub const INIT_NAME: &str = "mosaic-init";

/// In the shim's child (the namespace's PID 1), its confinement applied: forks the harness.
/// Returns in the harness (which then execs, every signal unblocked); never returns in
/// the init, which writes the harness's raw wait status (4 bytes, native order) to
/// `status_fd` and exits when the harness ends.
///
/// # Safety
/// Call only between fork and exec of a single-threaded process: it forks, and the init
/// path never returns.
pub unsafe fn split(status_fd: libc::c_int) -> std::io::Result<()> {
    let mut all: libc::sigset_t = std::mem::zeroed();
    libc::sigfillset(&mut all);
    let mut none: libc::sigset_t = std::mem::zeroed();
    libc::sigemptyset(&mut none);
    // Blocked before the fork: nothing sent meanwhile is lost.
    if libc::sigprocmask(libc::SIG_SETMASK, &all, std::ptr::null_mut()) != 0 {
        return Err(std::io::Error::last_os_error());
    }
    match libc::fork() {
        -1 => Err(std::io::Error::last_os_error()),
        0 => {
            // The harness: a standard signal state, then exec. Handlers inherited from the
            // shim go back to the default first (exec would do it, but a signal the init
            // forwards before the exec would run the shim's no-op handler and be lost);
            // what is ignored stays ignored, as across exec.
            for sig in 1..32 {
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, std::ptr::null(), &mut old) == 0
                    && old.sa_sigaction != libc::SIG_DFL
                    && old.sa_sigaction != libc::SIG_IGN
                {
                    let mut dfl: libc::sigaction = std::mem::zeroed();
                    dfl.sa_sigaction = libc::SIG_DFL;
                    libc::sigaction(sig, &dfl, std::ptr::null_mut());
                }
            }
            if libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        }
        harness => init(harness, status_fd, &all),
    }
}

unsafe fn init(harness: libc::pid_t, status_fd: libc::c_int, all: &libc::sigset_t) -> ! {
    libc::prctl(libc::PR_SET_NAME, c"mosaic-init".as_ptr(), 0, 0, 0);
    // Not dumpable, whatever `fs.suid_dumpable` says: the harness (same uid) can neither
    // trace it nor see it in its `/proc` (`hidepid=invisible` hides what it may not trace).
    libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    // Nothing but stdio and the status pipe: the spawn's own error pipe must close here
    // (its reader waits for every copy of it to close).
    if status_fd < 3 {
        libc::_exit(127);
    }
    if status_fd > 3 {
        libc::syscall(libc::SYS_close_range, 3u32, (status_fd - 1) as u32, 0u32);
    }
    libc::syscall(
        libc::SYS_close_range,
        (status_fd + 1) as u32,
        u32::MAX,
        0u32,
    );
    loop {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let sig = libc::sigwaitinfo(all, &mut info);
        if sig < 0 {
            continue;
        }
        if sig == libc::SIGCHLD {
            loop {
                let mut st: libc::c_int = 0;
                let r = libc::waitpid(-1, &mut st, libc::WNOHANG);
                if r <= 0 {
                    break;
                }
                if r == harness {
                    let b = st.to_ne_bytes();
                    libc::write(status_fd, b.as_ptr().cast(), b.len());
                    let code = if libc::WIFEXITED(st) {
                        libc::WEXITSTATUS(st)
                    } else {
                        128 + libc::WTERMSIG(st)
                    };
                    libc::_exit(code);
                }
            }
        } else if info.si_code <= 0 {
            // Sent by a process (kill, a pidfd, sigqueue): for the harness. The kernel's
            // own (a terminal's, a fault's) are not forwarded.
            libc::kill(harness, sig);
        }
    }
}

/// The harness's exit, from the raw wait status the init handed over.
pub fn decode(raw: [u8; 4]) -> (Option<i32>, Option<i32>, bool) {
    let st = libc::c_int::from_ne_bytes(raw);
    if libc::WIFEXITED(st) {
        (Some(libc::WEXITSTATUS(st)), None, false)
    } else if libc::WIFSIGNALED(st) {
        (None, Some(libc::WTERMSIG(st)), libc::WCOREDUMP(st))
    } else {
        (None, None, false)
    }
}
