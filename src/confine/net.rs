//! A confined generation's network: a namespace of its own with loopback alone, and in it
//! the broker's listener (the provider gateway) as the only endpoint that is not the
//! harness's own.
//!
//! The shim calls [`isolate`] on itself just before it forks the harness, so the harness is
//! born in the namespace (and seccomp keeps it from `setns` or `unshare` back out). The
//! shim binds the gateway's listener there and keeps it for the generation's life; the
//! supervisor takes a copy of that descriptor from the verified shim (`pidfd_getfd`) and
//! serves it from outside. Connections made while no supervisor serves (a restart) wait in
//! the listener's backlog rather than fail.
//!
//! **Never:** gives the namespace a route or an interface but `lo`; binds anything but the
//! loopback address; lets the listener cross exec (it is close-on-exec).

use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};

use super::ConfineError;

/// The loopback port the provider gateway listens on inside every confined generation.
/// Fixed, as each generation's namespace is its own: nothing else can hold it.
pub const GATEWAY_PORT: u16 = 4741;

/// The provider gateway's base URL as a confined harness reaches it.
pub fn gateway_url() -> String {
    format!("http://127.0.0.1:{GATEWAY_PORT}")
}

/// Moves the calling thread (the shim's only one) into a new network namespace, brings its
/// loopback interface up, and, when `gateway` is set, binds and listens on
/// `127.0.0.1:gateway`. Any failure leaves nothing to undo for the caller: it is a failed
/// start, and the harness never runs.
pub fn isolate(gateway: Option<u16>) -> Result<Option<TcpListener>, ConfineError> {
    let sys = |what: &str| {
        ConfineError::Privilege(format!("{what}: {}", std::io::Error::last_os_error()))
    };
    // SAFETY: unshare takes no pointer.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(sys("unshare(CLONE_NEWNET)"));
    }
    loopback_up()?;
    let Some(port) = gateway else {
        return Ok(None);
    };
    let l = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)).map_err(|e| {
        ConfineError::Privilege(format!("binding the gateway on 127.0.0.1:{port}: {e}"))
    })?;
    Ok(Some(l))
}

/// `ip link set lo up`, by ioctl: a fresh namespace's loopback is down.
fn loopback_up() -> Result<(), ConfineError> {
    let err = |what: &str| {
        ConfineError::Privilege(format!(
            "bringing lo up ({what}): {}",
            std::io::Error::last_os_error()
        ))
    };
    // SAFETY: plain socket(2); the descriptor is closed below on every path.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(err("socket"));
    }
    // SAFETY: `ifreq` is plain old data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *d = *s as libc::c_char;
    }
    // SAFETY: `req` is a valid ifreq naming "lo"; the ioctls read and write only it.
    let r = unsafe {
        if libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req) != 0 {
            -1
        } else {
            req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            libc::ioctl(fd, libc::SIOCSIFFLAGS, &req)
        }
    };
    let e = (r != 0).then(|| err("SIOCSIFFLAGS"));
    // SAFETY: `fd` is ours and closed once.
    unsafe { libc::close(fd) };
    e.map_or(Ok(()), Err)
}
