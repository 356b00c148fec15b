//! The notifier: delivers the events the database records (`coordinator::notify`, migration
//! 0034) to the operator's sinks — a command run with the event as JSON on its stdin, and a
//! webhook the event is POSTed to — each event once per sink, retried with backoff until it
//! is taken.
//!
//! It runs beside the authority, never inside it: a transition only inserts a row (in its
//! own transaction); a slow, failing or hanging sink delays nothing but its own events.
//! Every coordinator runs it; a claim in the row keeps two from delivering one event at once.
//! A coordinator that dies between a sink taking an event and recording it delivers it
//! again after the claim lapses: sinks get at-least-once, each event carrying its
//! `event_key` to deduplicate by.
//!
//! **Never:** logs or stores the webhook's URL beyond its scheme and host (its path may be
//! a token); sends anything but the event's row (identifiers, codes, digests).

use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;

use super::Service;
use crate::coordinator::notify::Notification;

/// How long one sink may take with one event before the attempt counts as failed.
const SINK_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest wait between two attempts of one event.
const MAX_BACKOFF_MS: i64 = 300_000;

/// A webhook: where events are POSTed. Shown only as `scheme://host:port`.
#[derive(Clone)]
pub struct Webhook {
    https: bool,
    host: String,
    port: u16,
    /// Path and query (may hold a token: never shown).
    target: String,
    /// The `Host` header: the host (an IPv6 one in brackets), and its port unless the
    /// scheme's own.
    authority: String,
    pub shown: String,
}

impl std::fmt::Debug for Webhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Webhook({})", self.shown)
    }
}

impl Webhook {
    pub fn parse(url: &str) -> Result<Self, String> {
        let t = crate::util::http1::Target::parse(url)
            .map_err(|why| format!("notify_webhook: {why}"))?;
        let (https, host, port) = (t.https, t.host, t.port);
        let target = t
            .uri
            .path_and_query()
            .map(|p| p.as_str().to_string())
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| "/".into());
        let bracketed = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.clone()
        };
        let authority = if port == if https { 443 } else { 80 } {
            bracketed.clone()
        } else {
            format!("{bracketed}:{port}")
        };
        Ok(Self {
            shown: format!(
                "{}://{bracketed}:{port}",
                if https { "https" } else { "http" }
            ),
            authority,
            https,
            host,
            port,
            target,
        })
    }
}

/// The configured sinks.
#[derive(Debug, Clone, Default)]
pub struct Sinks {
    pub command: Option<std::path::PathBuf>,
    pub webhook: Option<Webhook>,
}

impl Sinks {
    /// From the configuration, checked (before the coordinator touches anything).
    pub fn configured(
        command: Option<&std::path::Path>,
        webhook: Option<&str>,
    ) -> Result<Self, String> {
        if let Some(c) = command {
            if !c.is_absolute() {
                return Err(format!(
                    "notify_command: {} must be an absolute path",
                    c.display()
                ));
            }
        }
        Ok(Self {
            command: command.map(|c| c.to_path_buf()),
            webhook: webhook.map(Webhook::parse).transpose()?,
        })
    }

    fn names(&self) -> Vec<&'static str> {
        let mut n = Vec::new();
        if self.command.is_some() {
            n.push("command");
        }
        if self.webhook.is_some() {
            n.push("webhook");
        }
        n
    }
}

/// Delivers due events until `stop`; wakes on this process's changes or once a second.
pub(crate) async fn run(
    svc: Arc<Service>,
    sinks: Sinks,
    mut stop: crate::util::shutdown::ShutdownSignal,
) {
    let names = sinks.names();
    if names.is_empty() {
        return;
    }
    tracing::info!(sinks = ?names, webhook = sinks.webhook.as_ref().map(|w| w.shown.as_str()),
        "notifier delivering operator events");
    let mut changed = svc.changed.subscribe();
    loop {
        let due = match svc.store.claim_notifications(1).await {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the notifications due; trying again");
                Vec::new()
            }
        };
        let idle = due.is_empty();
        for n in due {
            deliver(&svc, &sinks, &names, n).await;
        }
        if !idle {
            continue;
        }
        tokio::select! {
            _ = changed.changed() => {}
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = stop.triggered() => return,
        }
    }
}

/// One event to every sink that has not taken it yet.
async fn deliver(svc: &Service, sinks: &Sinks, names: &[&str], n: Notification) {
    let body = n.body.to_string();
    let mut failed = Vec::new();
    for &sink in names {
        if n.delivered_to.iter().any(|d| d == sink) {
            continue;
        }
        let r = match sink {
            "command" => match &sinks.command {
                Some(c) => run_command(c, &body).await,
                None => continue,
            },
            _ => match &sinks.webhook {
                Some(w) => post(w, &body).await,
                None => continue,
            },
        };
        match r {
            Ok(()) => {
                svc.metrics.notifications(sink, true);
                if let Err(e) = svc
                    .store
                    .notification_delivered(&n.event_key, n.attempts, sink, names)
                    .await
                {
                    // Taken but not recorded: delivered again after the claim lapses.
                    tracing::warn!(event_key = %n.event_key, sink, error = %e,
                        "a sink took the event but it cannot be recorded; it will be delivered again");
                }
            }
            Err(e) => {
                svc.metrics.notifications(sink, false);
                failed.push(format!("{sink}: {e}"));
            }
        }
    }
    if failed.is_empty() {
        tracing::info!(event_key = %n.event_key, kind = %n.kind, "operator notified");
        return;
    }
    let backoff = (1000i64 << (n.attempts.clamp(1, 20) - 1)).min(MAX_BACKOFF_MS);
    let error = failed.join("; ");
    tracing::warn!(event_key = %n.event_key, kind = %n.kind, attempts = n.attempts, backoff_ms = backoff,
        error = %error, "a notification sink did not take the event; trying again later");
    let kept: String = error.chars().take(500).collect();
    if let Err(e) = svc
        .store
        .notification_failed(&n.event_key, n.attempts, &kept, backoff)
        .await
    {
        tracing::warn!(event_key = %n.event_key, error = %e,
            "cannot record the failed delivery; the event is tried again when its claim lapses");
    }
}

/// Runs the operator's command with the event on stdin; taken when it exits 0.
async fn run_command(program: &std::path::Path, body: &str) -> Result<(), String> {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new(program)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", program.display()))?;
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| "no stdin for the command".to_string())?;
    let run = async {
        stdin
            .write_all(body.as_bytes())
            .await
            .map_err(|e| format!("writing the event: {e}"))?;
        drop(stdin);
        child
            .wait_with_output()
            .await
            .map_err(|e| format!("waiting for it: {e}"))
    };
    let out = tokio::time::timeout(SINK_TIMEOUT, run)
        .await
        .map_err(|_| format!("it ran longer than {} s", SINK_TIMEOUT.as_secs()))??;
    if out.status.success() {
        return Ok(());
    }
    let said: String = String::from_utf8_lossy(&out.stderr)
        .chars()
        .take(200)
        .collect();
    Err(format!("{}: {}", out.status, said.trim()))
}

/// POSTs the event to the webhook; taken on a 2xx answer.
async fn post(w: &Webhook, body: &str) -> Result<(), String> {
    let attempt = async {
        let mut sender =
            crate::util::http1::connect(w.https, &w.host, w.port, SINK_TIMEOUT).await?;
        let req = hyper::Request::post(w.target.as_str())
            .header(hyper::header::HOST, w.authority.as_str())
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .header(hyper::header::USER_AGENT, "mosaic-notifier")
            .body(Full::new(Bytes::from(body.to_string())))
            .map_err(|e| format!("request: {e}"))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| format!("request: {e}"))?;
        let status = resp.status();
        // Drained, so the connection ends cleanly; what it says is not kept.
        let _ = resp.into_body().collect().await;
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("answered {status}"))
        }
    };
    tokio::time::timeout(SINK_TIMEOUT, attempt)
        .await
        .map_err(|_| format!("no answer in {} s", SINK_TIMEOUT.as_secs()))?
        .map_err(|e| format!("{}: {e}", w.shown))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_webhook_url_is_never_shown_beyond_its_host() {
        let w = Webhook::parse("https://hooks.example.com/services/T0/B0/SECRET?x=1").unwrap();
        assert_eq!(w.shown, "https://hooks.example.com:443");
        assert_eq!(w.authority, "hooks.example.com");
        assert_eq!(
            Webhook::parse("http://[::1]:8080/x").unwrap().authority,
            "[::1]:8080"
        );
        assert_eq!(w.target, "/services/T0/B0/SECRET?x=1");
        assert!(!format!("{w:?}").contains("SECRET"));
        assert!(Webhook::parse("https://user:pw@example.com/x").is_err());
        assert!(Webhook::parse("ftp://example.com/x").is_err());
        assert!(Sinks::configured(Some(std::path::Path::new("notify.sh")), None).is_err());
        let e = Webhook::parse("http://").unwrap_err();
        assert!(!e.contains("SECRET"));
    }
}
