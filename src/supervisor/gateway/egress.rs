//! The egress proxy: `CONNECT host:port`, the one way a confined generation's tools reach
//! another host (`HTTPS_PROXY` points them here). Each tunnel is one effect: admitted by the
//! coordinator for a host the assignment's scope names (`egress:HOST[:PORT]`), then
//! connected by the supervisor, never to an address of the host itself (loopback,
//! unspecified, link-local, multicast), and observed until it closes — by either side, or
//! because its generation ended (aborted).

use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

use super::settle::Settle;
use super::{denied, Body, Shared, CONNECT_TIMEOUT};
use crate::protocol::effects::{self, Executor, Outcome, Target};
use crate::supervisor::broker::{Admitted, Claim, Denied, Phase};

/// How long a host name may take to resolve.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);

/// An address a tunnel never reaches: the host's own, or no single host's.
pub fn forbidden(ip: IpAddr) -> bool {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    };
    match ip {
        IpAddr::V4(v) => {
            v.is_loopback()
                || v.is_unspecified()
                || v.is_link_local()
                || v.is_multicast()
                || v.is_broadcast()
        }
        IpAddr::V6(v) => {
            v.is_loopback()
                || v.is_unspecified()
                || v.is_multicast()
                || (v.segments()[0] & 0xffc0) == 0xfe80
        }
    }
}

pub(super) async fn tunnel(shared: &Arc<Shared>, mut req: Request<Incoming>) -> Response<Body> {
    let route = &shared.route;
    let Some((host, port)) = req
        .uri()
        .authority()
        .and_then(|a| Some((a.host().to_ascii_lowercase(), a.port_u16()?)))
    else {
        return shared.refuse(StatusCode::BAD_REQUEST, "CONNECT names host:port");
    };
    let target = match Target::parse(Executor::Egress, &format!("egress:{host}:{port}")) {
        Ok(t) => t,
        Err(e) => return shared.refuse(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    // A supervisor restarting waits (bounded) for its coordinator link's broker.
    let ready = route
        .broker
        .ready(crate::supervisor::coordinated::ADMIT_TIMEOUT)
        .await;
    let broker = match (
        ready.as_ref().map_or(Phase::NoAuthority, |b| {
            b.phase(&route.lane_id, route.generation)
        }),
        ready,
    ) {
        (Phase::Active, Some(b)) => b,
        (Phase::Staging, _) => return denied(shared, &Denied::NotActive),
        _ => return denied(shared, &Denied::NoAuthority),
    };
    let Ok(permit) = shared.tunnels.clone().try_acquire_owned() else {
        return shared.refuse(
            StatusCode::TOO_MANY_REQUESTS,
            "the generation holds as many tunnels as it may",
        );
    };
    let claim = Claim {
        idempotency_key: format!("eg-{}", uuid::Uuid::new_v4().simple()),
        operation_digest: effects::operation_digest(&target, &[b"CONNECT"]),
        target,
    };
    let effect_id = match broker.admit(&route.lane_id, route.generation, claim).await {
        Ok(Admitted::Fresh { effect_id }) => effect_id,
        Ok(Admitted::Settled { .. }) => {
            return shared.refuse(
                StatusCode::CONFLICT,
                "this tunnel's claim was admitted before",
            )
        }
        Err(d) => return denied(shared, &d),
    };
    let settle = Settle::begin(
        &shared.inflight,
        &effect_id,
        &route.lane_id,
        route.generation,
        broker.clone(),
        false,
    );
    let addrs: Vec<std::net::SocketAddr> = match tokio::time::timeout(
        RESOLVE_TIMEOUT,
        tokio::net::lookup_host((host.as_str(), port)),
    )
    .await
    {
        Ok(Ok(a)) => a.collect(),
        _ => vec![],
    };
    let Some(addr) = addrs.iter().find(|a| !forbidden(a.ip())).copied() else {
        settle.finish(Outcome::Failed);
        return shared.refuse(
            StatusCode::BAD_GATEWAY,
            "the host does not resolve, or only to addresses a tunnel never reaches",
        );
    };
    crate::supervisor::broker::hold("effect:pre-dispatch").await;
    if !broker.may_dispatch(&route.lane_id, route.generation) {
        settle.finish(Outcome::NotDispatched);
        return denied(shared, &Denied::Fenced);
    }
    settle.dispatching();
    let tcp =
        match tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(addr)).await {
            Ok(Ok(t)) => t,
            _ => {
                settle.finish(Outcome::Failed);
                return shared.refuse(
                    StatusCode::BAD_GATEWAY,
                    "the host did not accept the connection",
                );
            }
        };
    let _ = tcp.set_nodelay(true);
    shared.stats.tunnels.fetch_add(1, Ordering::Relaxed);
    let upgrade = hyper::upgrade::on(&mut req);
    let mut closed = shared.closed.subscribe();
    tokio::spawn(async move {
        let _permit = permit;
        let mut tcp = tcp;
        let upgraded = tokio::select! {
            u = upgrade => u,
            _ = closed.wait_for(|c| *c) => { settle.cut(); return; }
        };
        let Ok(upgraded) = upgraded else {
            settle.finish(Outcome::Aborted);
            return;
        };
        let mut io = TokioIo::new(upgraded);
        let outcome = tokio::select! {
            r = tokio::io::copy_bidirectional(&mut io, &mut tcp) => match r {
                Ok((up, down)) => {
                    settle.up.store(up, Ordering::SeqCst);
                    settle.down.store(down, Ordering::SeqCst);
                    Outcome::Completed
                }
                Err(_) => Outcome::Aborted,
            },
            _ = closed.wait_for(|c| *c) => Outcome::Aborted,
        };
        settle.finish(outcome);
    });
    Response::new(
        Empty::<Bytes>::new()
            .map_err(|never| match never {})
            .boxed(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tunnel_never_reaches_the_host_itself() {
        for a in [
            "127.0.0.1",
            "127.8.9.1",
            "0.0.0.0",
            "169.254.169.254",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fe80::1",
            "::ffff:127.0.0.1",
            "ff02::1",
        ] {
            assert!(forbidden(a.parse().unwrap()), "{a} reachable");
        }
        for a in [
            "93.184.216.34",
            "10.0.0.7",
            "192.168.1.2",
            "2606:4700::1111",
        ] {
            assert!(!forbidden(a.parse().unwrap()), "{a} refused");
        }
    }
}
