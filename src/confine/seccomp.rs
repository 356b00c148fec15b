//! The seccomp programs of a confined generation: a deny list (everything else allowed),
//! as two stacked filters because one filter has one return value: `EPERM` for calls that
//! must fail, `ENOSYS` for calls a runtime probes and falls back from (libuv's io_uring,
//! glibc's clone3, whose flags a filter cannot read).

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use super::ConfineError;

/// How many filters `programs` returns (the supervisor checks `Seccomp_filters` for at
/// least this many).
pub const FILTERS: u32 = 2;

/// Calls that fail with `EPERM`, whatever their arguments.
const DENIED: &[libc::c_long] = &[
    // Reaching into other processes.
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_pidfd_getfd,
    libc::SYS_kcmp,
    // Kernel programmability and surfaces a tool never needs.
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    // The filesystem view and namespaces.
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_fsopen,
    libc::SYS_fsmount,
    libc::SYS_fsconfig,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_unshare,
    libc::SYS_setns,
    // Handles bypass path-based checks.
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    // The host itself.
    libc::SYS_reboot,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_iopl,
    libc::SYS_ioperm,
    libc::SYS_acct,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_sethostname,
    libc::SYS_setdomainname,
    libc::SYS_quotactl,
    libc::SYS_syslog,
    libc::SYS_vhangup,
];

/// Calls that fail with `ENOSYS` (the caller falls back to an older call).
const ABSENT: &[libc::c_long] = &[
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_clone3,
];

/// Namespace flags `clone` may not carry.
const CLONE_NEW: &[u64] = &[
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWCGROUP as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
];

/// Socket families a harness uses: local, IPv4, IPv6, and netlink (interface listing).
const FAMILIES: &[u64] = &[
    libc::AF_UNIX as u64,
    libc::AF_INET as u64,
    libc::AF_INET6 as u64,
    libc::AF_NETLINK as u64,
];

fn sc(e: impl std::fmt::Display) -> ConfineError {
    ConfineError::Seccomp(e.to_string())
}

fn cond(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, ConfineError> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Qword, op, value).map_err(sc)
}

fn arch() -> Result<TargetArch, ConfineError> {
    TargetArch::try_from(std::env::consts::ARCH).map_err(sc)
}

/// Both programs, compiled.
pub fn programs() -> Result<Vec<BpfProgram>, ConfineError> {
    let mut denied: BTreeMap<i64, Vec<SeccompRule>> = DENIED.iter().map(|&n| (n, vec![])).collect();
    // clone into a new namespace.
    let clone_rules = CLONE_NEW
        .iter()
        .map(|&f| SeccompRule::new(vec![cond(0, SeccompCmpOp::MaskedEq(f), f)?]).map_err(sc))
        .collect::<Result<Vec<_>, _>>()?;
    denied.insert(libc::SYS_clone, clone_rules);
    // socket(): any other family, or a raw or packet socket of an allowed one.
    let other_family = SeccompRule::new(
        FAMILIES
            .iter()
            .map(|&f| cond(0, SeccompCmpOp::Ne, f))
            .collect::<Result<Vec<_>, _>>()?,
    )
    .map_err(sc)?;
    // A raw or packet socket of IPv4 or IPv6 (netlink's raw sockets stay: interface
    // listing uses them).
    let raw = |family: libc::c_int, t: u64| -> Result<SeccompRule, ConfineError> {
        SeccompRule::new(vec![
            cond(0, SeccompCmpOp::Eq, family as u64)?,
            cond(1, SeccompCmpOp::MaskedEq(0xf), t)?,
        ])
        .map_err(sc)
    };
    denied.insert(
        libc::SYS_socket,
        vec![
            other_family,
            raw(libc::AF_INET, libc::SOCK_RAW as u64)?,
            raw(libc::AF_INET6, libc::SOCK_RAW as u64)?,
            // SOCK_PACKET (10), the obsolete packet socket type.
            raw(libc::AF_INET, 10)?,
            raw(libc::AF_INET6, 10)?,
        ],
    );
    // Scheduling, priorities and limits reach any process of the same uid (the kernel's
    // only check, and landlock has none): the harness may set its own only (pid 0, or
    // `PRIO_PROCESS`/`IOPRIO_WHO_PROCESS` with who 0).
    let not_zero = |arg: u8| -> Result<SeccompRule, ConfineError> {
        SeccompRule::new(vec![cond(arg, SeccompCmpOp::Ne, 0)?]).map_err(sc)
    };
    let not = |arg: u8, v: u64| -> Result<SeccompRule, ConfineError> {
        SeccompRule::new(vec![cond(arg, SeccompCmpOp::Ne, v)?]).map_err(sc)
    };
    for call in [
        libc::SYS_prlimit64,
        libc::SYS_sched_setscheduler,
        libc::SYS_sched_setparam,
        libc::SYS_sched_setattr,
        libc::SYS_sched_setaffinity,
        libc::SYS_migrate_pages,
        libc::SYS_move_pages,
    ] {
        denied.insert(call, vec![not_zero(0)?]);
    }
    // setpriority(which, who, prio): PRIO_PROCESS is 0.
    denied.insert(libc::SYS_setpriority, vec![not_zero(0)?, not_zero(1)?]);
    // ioprio_set(which, who, prio): IOPRIO_WHO_PROCESS is 1.
    denied.insert(libc::SYS_ioprio_set, vec![not(0, 1)?, not_zero(1)?]);
    let absent: BTreeMap<i64, Vec<SeccompRule>> = ABSENT.iter().map(|&n| (n, vec![])).collect();
    let compile = |rules, errno: i32| -> Result<BpfProgram, ConfineError> {
        let f = SeccompFilter::new(
            rules,
            SeccompAction::Allow,
            SeccompAction::Errno(errno as u32),
            arch()?,
        )
        .map_err(sc)?;
        BpfProgram::try_from(f).map_err(sc)
    };
    Ok(vec![
        compile(denied, libc::EPERM)?,
        compile(absent, libc::ENOSYS)?,
    ])
}

#[cfg(test)]
mod tests {
    /// The supervisor checks `Seccomp_filters` against `FILTERS`: it must be what
    /// `programs` installs, not a number written beside it.
    #[test]
    fn filters_counts_what_programs_installs() {
        assert_eq!(super::programs().unwrap().len() as u32, super::FILTERS);
    }
}
