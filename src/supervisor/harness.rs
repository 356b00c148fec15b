//! What a generation's harness is given besides its confinement: its private area (made
//! fresh, filled by its family's adapter), its credentials (placeholders for a confined
//! generation, the values for an unconfined one), and its provider gateway.
//!
//! **Never:** hands a confined generation a credential's value; reuses an area left by an
//! earlier attempt at the same generation number.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use super::generation::{harness_dir, harness_run_dir};
use super::state::GenRecord;
use super::Inner;
use crate::adapter::LaunchPlan;
use crate::shim::proto::SecretValue;
use crate::util::durable;

type Secrets = Vec<(String, SecretValue)>;

/// Splits the runtime's credentials for one generation: what the shim puts in the
/// harness's environment as secrets, and what the gateway replaces placeholders with. A
/// confined generation gets each variable's placeholder in `env` and no secret at all.
pub(crate) fn credentials(
    confinement: &crate::confine::Confinement,
    secret_env: &Secrets,
    env: &mut Vec<(String, String)>,
) -> (Secrets, Secrets) {
    match confinement {
        crate::confine::Confinement::Enforced { .. } => {
            env.extend(
                secret_env
                    .iter()
                    .map(|(k, _)| (k.clone(), super::gateway::placeholder(k))),
            );
            let secrets = secret_env
                .iter()
                .map(|(k, v)| (super::gateway::placeholder(k), v.clone()))
                .collect();
            (Vec::new(), secrets)
        }
        crate::confine::Confinement::None => (secret_env.clone(), Vec::new()),
    }
}

/// Serves the gateway of a generation whose shim (verified, behind `shim`) reported its
/// listener as descriptor `fd`.
pub(crate) fn serve_gateway(
    inner: &Arc<Inner>,
    shim: &OwnedFd,
    fd: Option<i32>,
    route: super::gateway::Route,
) -> Result<super::gateway::Gateway, String> {
    let fd = fd.ok_or("the shim reported no gateway listener")?;
    let listener =
        take_listener(shim, fd).map_err(|e| format!("taking the gateway listener: {e}"))?;
    super::gateway::serve(listener, route, inner.metrics.clone())
        .map_err(|e| format!("serving the gateway: {e}"))
}

/// A copy of descriptor `fd` of the verified shim behind `shim`: the gateway's listener it
/// bound in the generation's network namespace. Checked to be a listening TCP socket.
pub(crate) fn take_listener(shim: &OwnedFd, fd: i32) -> Result<std::net::TcpListener, String> {
    let got = rustix::process::pidfd_getfd(shim, fd, rustix::process::PidfdGetfdFlags::empty())
        .map_err(|e| format!("pidfd_getfd: {e}"))?;
    let listening = rustix::net::sockopt::socket_acceptconn(&got).map_err(|e| e.to_string())?;
    let ty = rustix::net::sockopt::socket_type(&got).map_err(|e| e.to_string())?;
    if !listening || ty != rustix::net::SocketType::STREAM {
        return Err(format!(
            "descriptor {fd} of the shim is not a listening stream socket"
        ));
    }
    let l = std::net::TcpListener::from(got);
    let at = l.local_addr().map_err(|e| e.to_string())?;
    let want = std::net::SocketAddr::from((
        std::net::Ipv4Addr::LOCALHOST,
        crate::confine::net::GATEWAY_PORT,
    ));
    if at != want {
        return Err(format!(
            "descriptor {fd} of the shim listens on {at}, not {want}"
        ));
    }
    Ok(l)
}

/// Creates the generation's private area and lets its family's adapter fill it.
pub(crate) fn prepare(
    inner: &Inner,
    plan: &LaunchPlan,
    rec: &GenRecord,
    provider: Option<&str>,
    workspace: Option<&std::path::Path>,
) -> Result<crate::adapter::Prepared, String> {
    let dir = harness_dir(inner, &rec.lane_incarnation_id, rec.generation);
    if let Some(parent) = dir.parent() {
        durable::ensure_dir(parent, 0o700).map_err(|e| e.to_string())?;
    }
    // Fresh: an area left by an earlier attempt at this number is never reused.
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("cannot clear {}: {e}", dir.display())),
    }
    durable::ensure_dir(&dir, 0o700).map_err(|e| e.to_string())?;
    let run = harness_run_dir(inner, &rec.lane_incarnation_id, rec.generation);
    let _ = std::fs::remove_dir_all(&run);
    durable::ensure_dir(&run, 0o700).map_err(|e| e.to_string())?;
    let prepared = plan
        .family
        .adapter()
        .prepare(&crate::adapter::PrepareCtx {
            plan,
            state_dir: &dir,
            run_dir: &run,
            mosaic_exe: &inner.cfg.mosaic_exe(),
            overlay: inner
                .cfg
                .harness_config
                .get(&plan.runtime.runtime)
                .map(|p| p.as_path()),
            confined: inner.cfg.confined(&rec.lane),
            provider,
            workspace,
        })
        .map_err(|e| e.to_string())?;
    if prepared.env.iter().any(|(k, _)| k == "MOSAIC_PROVIDER_URL") {
        return Err(format!(
            "the {} adapter sets MOSAIC_PROVIDER_URL, which is the supervisor's",
            plan.family.name()
        ));
    }
    if let Some((k, _)) = plan
        .secret_env
        .iter()
        .find(|(k, _)| prepared.env.iter().any(|(e, _)| e == k))
    {
        return Err(format!(
            "the credentials file sets {k}, which the {} adapter sets itself",
            plan.family.name()
        ));
    }
    Ok(prepared)
}

/// The proxy environment of a confined generation: every tool that honours the usual
/// variables reaches other hosts through the egress proxy (the broker's listener), and the
/// listener itself directly. A tool that ignores them has no route anywhere.
pub(crate) fn proxy_env() -> Vec<(String, String)> {
    let url = crate::confine::net::gateway_url();
    let mut env: Vec<(String, String)> = [
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "ALL_PROXY",
        "all_proxy",
    ]
    .into_iter()
    .map(|k| (k.to_string(), url.clone()))
    .collect();
    for k in ["NO_PROXY", "no_proxy"] {
        env.push((k.to_string(), "127.0.0.1,localhost".to_string()));
    }
    env
}

/// What a confined generation's pushes need: its area (bundles are read from beneath it),
/// the host's repositories, the supervisor's mirrors and the broker.
pub(crate) fn push_ctx(
    inner: &Inner,
    rec: &super::state::GenRecord,
    area: &std::path::Path,
) -> super::push::Shared {
    std::sync::Arc::new(super::push::PushCtx {
        lane_id: rec.lane_id.clone(),
        generation: rec.generation,
        area: area.to_path_buf(),
        repos: inner.cfg.repositories.clone(),
        mirrors: inner.cfg.state_dir.join("push"),
        broker: inner.broker.clone(),
    })
}
