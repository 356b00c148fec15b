//! `mosaic doctor`: can this host run the supervisor? Every check says what it saw and,
//! when it fails, what to do. Exit status is non-zero when a required check fails.

use serde::Serialize;

use crate::cgroup;
use crate::sysdeps;

#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub ok: bool,
    /// A failing required check means the supervisor cannot run here.
    pub required: bool,
    pub detail: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub can_run_supervisor: bool,
    pub checks: Vec<Check>,
}

fn check(name: &'static str, required: bool, r: Result<String, String>) -> Check {
    match r {
        Ok(detail) => Check {
            name,
            ok: true,
            required,
            detail,
        },
        Err(detail) => Check {
            name,
            ok: false,
            required,
            detail,
        },
    }
}

/// Runs every check. `cgroup_root` is the root the supervisor would be configured with.
pub fn run(cgroup_root: Option<&std::path::Path>) -> Report {
    let mut checks = Vec::new();
    let mount = cgroup::discover_mount();
    checks.push(check(
        "cgroup-v2",
        true,
        mount
            .as_ref()
            .map(|m| {
                format!(
                    "{} ({})",
                    m.path.display(),
                    if m.hybrid { "hybrid" } else { "unified" }
                )
            })
            .map_err(|e| e.to_string()),
    ));
    if let Ok(m) = &mount {
        checks.push(check(
            "cgroup-favordynmods",
            false,
            // Informational: on some kernels a move into a cgroup waits an RCU grace
            // period unless the mount favours dynamic changes. The shim's move is one per
            // start; `benches/supervisor.rs` prints the mode beside the start figures.
            Ok(format!(
                "cgroup2 favordynmods {}",
                if m.favordynmods { "on" } else { "off" }
            )),
        ));
        let own = cgroup::cgroup_of(None).unwrap_or_default();
        let probe_root = match cgroup_root {
            Some(p) => Some(p.to_path_buf()),
            None if nix::unistd::geteuid().is_root() => Some(
                m.path
                    .join(format!("mosaic-doctor-{}", uuid::Uuid::new_v4().simple())),
            ),
            None => None,
        };
        let created_probe = probe_root.as_ref().is_some_and(|p| !p.exists());
        match cgroup::CgroupTree::open(m, probe_root.as_deref(), &own, false) {
            Ok(tree) => {
                let child = tree.at(&format!("doctor-{}", uuid::Uuid::new_v4().simple()));
                let res = child.create_fresh().map_err(|e| e.to_string());
                checks.push(check(
                    "cgroup-delegation",
                    true,
                    res.clone()
                        .map(|()| format!("can create cgroups under {}", tree.root().display())),
                ));
                if res.is_ok() {
                    let kill = child.path().join("cgroup.kill").exists();
                    checks.push(check("cgroup-kill", false, if kill { Ok("cgroup.kill present".into()) } else { Err("cgroup.kill missing (Linux < 5.14): the freeze + SIGKILL fallback will be used".into()) }));
                    let freeze = child.path().join("cgroup.freeze").exists();
                    checks.push(check("cgroup-freeze", !kill, if freeze { Ok("cgroup.freeze present".into()) } else { Err("cgroup.freeze missing: no way to stop a cgroup from forking during cleanup".into()) }));
                    let _ = child.remove();
                }
                if created_probe {
                    let _ = std::fs::remove_dir(tree.root());
                }
            }
            Err(e) => checks.push(check("cgroup-delegation", true, Err(e.to_string()))),
        }
    }
    if let Some(c) = systemd_delegation(cgroup_root) {
        checks.push(c);
    }
    let pidfd = rustix::process::pidfd_open(
        rustix::process::getpid(),
        rustix::process::PidfdFlags::empty(),
    );
    checks.push(check(
        "pidfd",
        true,
        pidfd
            .map(|_| "pidfd_open works".to_string())
            .map_err(|e| format!("pidfd_open failed ({e}): Linux 5.3+ required")),
    ));
    let tmux = sysdeps::which("tmux")
        .ok_or_else(|| "tmux not found: apt-get install tmux".to_string())
        .and_then(|p| crate::sysdeps::tmux_version(&p).map_err(|e| format!("tmux -V: {e}")))
        .and_then(|v| {
            let num: f32 = v
                .trim_start_matches("tmux ")
                .trim_end_matches(|c: char| c.is_ascii_alphabetic())
                .parse()
                .unwrap_or(0.0);
            // 3.2: control-mode clients take flags (no-output, ignore-size), which the
            // supervisor's per-lane control client attaches with.
            if num >= 3.2 {
                Ok(v)
            } else {
                Err(format!("{v}: tmux 3.2 or newer is needed"))
            }
        });
    checks.push(check("tmux", true, tmux));
    // Not required to run the supervisor: without it, confined lanes refuse every start
    // (and say so); only lanes listed in `unconfined_lanes` run.
    checks.push(check(
        "confinement",
        false,
        crate::confine::probe()
            .map(|s| {
                format!(
                    "landlock ABI {} (needs {}), seccomp filtering: generations run confined",
                    s.landlock_abi,
                    crate::confine::REQUIRED_ABI as i32
                )
            })
            .map_err(|e| {
                format!(
                    "{e}: confined lanes refuse to start here; only lanes in unconfined_lanes run"
                )
            }),
    ));
    let pg = match (sysdeps::pg_bin("initdb"), sysdeps::pg_bin("pg_ctl"), sysdeps::pg_bin("postgres")) {
        (Some(i), Some(_), Some(_)) => Ok(format!("PostgreSQL server binaries in {}", i.parent().map(|p| p.display().to_string()).unwrap_or_default())),
        _ => Err("PostgreSQL server binaries not found (needed by the coordinator and the test suite): apt-get install postgresql".into()),
    };
    checks.push(check("postgresql", false, pg));
    checks.push(check("clock", false, clock_sync()));
    let can = checks.iter().all(|c| c.ok || !c.required);
    Report {
        can_run_supervisor: can,
        checks,
    }
}

/// Whether the kernel says the system clock is synchronized (the NTP state `adjtimex`
/// reads, as `timedatectl` shows it). A host whose clock drifts beyond the transport
/// tolerance from the coordinator's database time opens no session; the offset a running
/// supervisor measured is in `mosaic host status` (`coordinator_clock`).
fn clock_sync() -> Result<String, String> {
    // SAFETY: with `modes` 0, adjtimex only reads the kernel's clock state into `t`, a
    // zeroed plain-data struct it is allowed to fill.
    let mut t: nix::libc::timex = unsafe { std::mem::zeroed() };
    let state = unsafe { nix::libc::adjtimex(&mut t) };
    let tolerance = crate::protocol::transport::ClockSkew::DEFAULT_TOLERANCE_MS / 1000;
    if state < 0 {
        return Err(format!(
            "cannot read the clock state: {}",
            std::io::Error::last_os_error()
        ));
    }
    if state == nix::libc::TIME_ERROR || t.status & nix::libc::STA_UNSYNC != 0 {
        return Err(format!(
            "the system clock is not synchronized (no NTP): a host more than {tolerance} s from the coordinator's database time opens no session (install chrony or systemd-timesyncd); `mosaic host status` shows the offset the supervisor measured"
        ));
    }
    Ok(format!(
        "synchronized (estimated error {} µs); sessions need it within {tolerance} s of the coordinator's database time",
        t.esterror
    ))
}

/// Under systemd (`INVOCATION_ID` set): the unit must have `Delegate=yes` when the
/// supervisor is to use its own cgroup (no `cgroup_root` configured), or systemd may
/// rearrange the subtree under it.
fn systemd_delegation(cgroup_root: Option<&std::path::Path>) -> Option<Check> {
    std::env::var_os("INVOCATION_ID")?;
    let own = cgroup::cgroup_of(None).unwrap_or_default();
    let unit = own
        .rsplit('/')
        .find(|s| s.ends_with(".service") || s.ends_with(".scope"))
        .map(String::from);
    let Some(unit) = unit else {
        return Some(check(
            "systemd-delegation",
            cgroup_root.is_none(),
            Err(format!(
                "running under systemd, but cgroup {own} names no unit"
            )),
        ));
    };
    let out = std::process::Command::new("systemctl")
        .args(["show", "--property=Delegate", "--value", &unit])
        .output();
    let r = match out {
        Ok(o) if o.status.success() => {
            let v = String::from_utf8_lossy(&o.stdout).trim().to_string();
            if v == "yes" {
                Ok(format!("{unit} has Delegate=yes; cgroup subtree {own}"))
            } else {
                Err(format!(
                    "{unit} has Delegate={v}: add Delegate=yes to the unit (systemd/mosaic-supervisor.service does)"
                ))
            }
        }
        Ok(o) => Err(format!(
            "systemctl show {unit} failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Err(format!("cannot run systemctl: {e}")),
    };
    Some(check("systemd-delegation", cgroup_root.is_none(), r))
}

/// The report as lines for a person (`ok`, `FAIL` or `warn` per check, then the verdict);
/// the caller prints them (the CLI through its EPIPE-safe output).
pub fn render_human(r: &Report) -> String {
    let mut out = String::new();
    for c in &r.checks {
        let mark = if c.ok {
            "ok  "
        } else if c.required {
            "FAIL"
        } else {
            "warn"
        };
        out.push_str(&format!("{mark} {:<18} {}\n", c.name, c.detail));
    }
    out.push_str(if r.can_run_supervisor {
        "this host can run the Mosaic supervisor"
    } else {
        "this host cannot run the Mosaic supervisor (see FAIL lines)"
    });
    out
}

/// What `mosaic doctor --coordinator-config` found.
#[derive(Debug, Clone, Serialize)]
pub struct CoordinatorReport {
    pub config: std::path::PathBuf,
    pub checks: Vec<Check>,
}

/// Can the coordinator configured in `path` start: its files and their modes, its own keys
/// in its trust registry, its certificate (principal, validity, names), its database.
pub async fn coordinator(path: &std::path::Path) -> CoordinatorReport {
    use crate::coordinator::service::{self, CoordinatorConfig};
    let mut checks = vec![];
    let cfg: Result<CoordinatorConfig, String> = std::fs::read_to_string(path)
        .map_err(|e| format!("{}: {e}", path.display()))
        .and_then(|t| toml::from_str(&t).map_err(|e| format!("{}: {e}", path.display())));
    let cfg = match cfg {
        Ok(c) => {
            checks.push(check("config", true, Ok(format!("coordinator:{}", c.name))));
            c
        }
        Err(e) => {
            checks.push(check("config", true, Err(e)));
            return CoordinatorReport {
                config: path.into(),
                checks,
            };
        }
    };
    checks.push(check(
        "files",
        true,
        service::preflight(&cfg)
            .map(|()| "secret, keys and certificate present; private files 0600".into())
            .map_err(|e| e.to_string()),
    ));
    let principal = format!("coordinator:{}", cfg.name);
    let own = |p: &std::path::Path, purpose, name: &str| {
        service::read_seed(p)
            .map(|seed| {
                let k = ed25519_dalek::SigningKey::from_bytes(&seed).verifying_key();
                (format!("{principal}/{name}"), purpose, k)
            })
            .map_err(|e| e.to_string())
    };
    use crate::protocol::schema::Purpose;
    checks.push(check(
        "trust-registry",
        true,
        (|| {
            let keys = vec![
                own(&cfg.session_key, Purpose::Session, "session")?,
                own(&cfg.ordinary_key, Purpose::Ordinary, "ordinary")?,
            ];
            let text = std::fs::read_to_string(&cfg.trust_registry)
                .map_err(|e| format!("{}: {e}", cfg.trust_registry.display()))?;
            let reg = service::trust::effective(&text, &principal, &keys, &Default::default())?;
            let hosts = reg
                .entries()
                .filter(|e| e.principal.starts_with("host:"))
                .map(|e| e.principal.as_str())
                .collect::<std::collections::BTreeSet<_>>();
            Ok(format!(
                "{} keys, this coordinator's own among them; {} hosts enrolled",
                reg.entries().count(),
                hosts.len()
            ))
        })(),
    ));
    checks.push(check(
        "certificate",
        true,
        (|| {
            let pem = std::fs::read_to_string(&cfg.cert)
                .map_err(|e| format!("{}: {e}", cfg.cert.display()))?;
            let der = x509_parser::pem::parse_x509_pem(pem.as_bytes())
                .map_err(|e| format!("{}: {e}", cfg.cert.display()))?
                .1;
            let named = crate::pki::principal_of(&der.contents);
            if named.as_deref() != Some(principal.as_str()) {
                return Err(format!(
                    "{} names {named:?}, not {principal}",
                    cfg.cert.display()
                ));
            }
            let x = der.parse_x509().map_err(|e| e.to_string())?;
            if !x.validity().is_valid() {
                return Err(format!(
                    "{} is not valid now ({} to {})",
                    cfg.cert.display(),
                    x.validity().not_before,
                    x.validity().not_after
                ));
            }
            let (dns, ips) = crate::pki::server_names_of(&pem).unwrap_or_default();
            Ok(format!(
                "{principal}, valid until {}; hosts may dial it as: {}",
                x.validity().not_after,
                dns.iter()
                    .map(String::from)
                    .chain(ips.iter().map(|i| i.to_string()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })(),
    ));
    let db = async {
        let text = std::fs::read_to_string(&cfg.secret_file)
            .map_err(|e| format!("{}: {e}", cfg.secret_file.display()))?;
        let secret = crate::coordinator::secret::CoordinatorSecret::from_hex(&text)
            .map_err(|e| format!("{}: {e}", cfg.secret_file.display()))?;
        let store = crate::coordinator::store::Store::connect_with(
            &cfg.database_url,
            cfg.allow_insecure_database,
            secret,
        )
        .await
        .map_err(|e| e.to_string())?;
        let v = store.schema_found().await.map_err(|e| e.to_string())?;
        let known = crate::coordinator::store::SCHEMA_VERSION;
        match v {
            0 => Ok(format!("a writable primary, no schema yet (the coordinator creates version {known} at start)")),
            v if v > known => Err(format!("schema version {v} is newer than this build's {known}: upgrade mosaic")),
            v if v < known => Ok(format!("a writable primary at schema version {v} (migrated to {known} at start)")),
            v => Ok(format!("a writable primary at schema version {v}")),
        }
    };
    let db = tokio::time::timeout(std::time::Duration::from_secs(15), db)
        .await
        .unwrap_or_else(|_| Err("no answer within 15 s".into()));
    checks.push(check("database", true, db));
    CoordinatorReport {
        config: path.into(),
        checks,
    }
}
