//! The daemons' test world: one database (a database of the test binary's PostgreSQL
//! server), a provisioned PKI and trust registry, N coordinator processes and M supervisor
//! processes, each a real `mosaic` daemon with its own config and log — with the SQL and
//! operator helpers every daemon test needs, and an orderly drop: every process killed,
//! every tmux server, cgroup and directory removed, and the logs kept (and named on stderr)
//! when the test failed.
//!
//! Included by the test files that run the daemons as separate processes (`mod world;`,
//! beside `mod common;` and `mod pg;`).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mosaic::coordinator::service::{operator_call, OpError, OperatorRequest};
use serde_json::Value;

use crate::common::{self, free_port, Daemon};

pub mod split;
use crate::pg;

/// What a world is made of.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Hosts provisioned (certificates and keys); the first `supervisors` of them run one.
    pub hosts: usize,
    pub supervisors: usize,
    /// Coordinators sharing the database (the first leads; the others stand by).
    pub coordinators: usize,
    /// Lanes `lane-1` … of each supervisor.
    pub lanes: usize,
    pub lease_ms: u64,
    pub reservation_ttl_ms: Option<u64>,
    pub heartbeat_ms: Option<u64>,
    pub reattach_timeout_ms: Option<u64>,
    /// Whether coordinator 0 also serves operators over TCP (`operator_addr`).
    pub operator_listen: bool,
    /// A name for the world's directory, so a kept log says which test it came from.
    pub tag: &'static str,
    /// Appended to every supervisor's config (tables such as `[providers]`).
    pub supervisor_extra: String,
    /// Top-level keys of every supervisor's config (`unconfined_lanes = [...]`).
    pub supervisor_top: String,
    /// Appended to every coordinator's config (`checkpoint_store_max_bytes = …`).
    pub coordinator_extra: String,
    /// Harness artifacts encrypted to the world's recovery identity (`mosaic up`'s
    /// default); `false`: no `recovery_recipients`, so none is captured.
    pub recovery: bool,
}

impl Default for Spec {
    fn default() -> Self {
        Self {
            hosts: 1,
            supervisors: 1,
            coordinators: 1,
            lanes: 2,
            lease_ms: 2000,
            reservation_ttl_ms: None,
            heartbeat_ms: None,
            reattach_timeout_ms: None,
            operator_listen: false,
            tag: "world",
            supervisor_extra: String::new(),
            supervisor_top: String::new(),
            coordinator_extra: String::new(),
            recovery: true,
        }
    }
}

pub struct World {
    pub dir: PathBuf,
    pub db: pg::TestDb,
    pub hosts: Vec<String>,
    pub prov: mosaic::up::Provisioned,
    /// Each coordinator's listen address.
    pub listen: Vec<String>,
    pub operator_addr: Option<String>,
    /// One cgroup root per supervisor.
    pub cgroup_roots: Vec<PathBuf>,
    pub spec: Spec,
    pub coord: Vec<Daemon>,
    pub sup: Vec<Daemon>,
}

impl World {
    /// Provisions the world and writes every daemon's config; starts nothing.
    pub fn new(spec: Spec) -> Self {
        common::require_host();
        assert!(spec.supervisors <= spec.hosts && spec.coordinators >= 1);
        let db = pg::TestDb::new();
        let id = uuid::Uuid::new_v4().simple().to_string()[..10].to_string();
        let dir = std::env::temp_dir().join(format!("mosaic-{}-{id}", spec.tag));
        std::fs::create_dir_all(&dir).unwrap();
        let hosts: Vec<String> = (0..spec.hosts)
            .map(|i| format!("{}-{id}", (b'a' + i as u8) as char))
            .collect();
        let listen: Vec<String> = (0..spec.coordinators)
            .map(|_| format!("127.0.0.1:{}", free_port()))
            .collect();
        let prov = mosaic::up::provision(&dir, &hosts, &db.url, &listen[0]).unwrap();
        let operator_addr = spec
            .operator_listen
            .then(|| format!("127.0.0.1:{}", free_port()));
        let mount = mosaic::cgroup::discover_mount().unwrap().path;
        let cgroup_roots = (0..spec.supervisors)
            .map(|h| mount.join(format!("mosaic-test-{id}-{h}")))
            .collect();
        let mut w = Self {
            dir,
            db,
            hosts,
            prov,
            listen,
            operator_addr,
            cgroup_roots,
            coord: vec![],
            sup: vec![],
            spec,
        };
        w.coord = (0..w.spec.coordinators)
            .map(|i| Daemon::new("coordinator", w.coordinator_config(i), w.coordinator_log(i)))
            .collect();
        w.sup = (0..w.spec.supervisors)
            .map(|h| Daemon::new("supervisor", w.supervisor_config(h), w.supervisor_log(h)))
            .collect();
        for i in 0..w.spec.coordinators {
            w.write_coordinator_config(i);
        }
        for h in 0..w.spec.supervisors {
            w.write_supervisor_config(h, &w.listen.clone());
        }
        w
    }

    /// Provisions, starts coordinator 0 and every supervisor, and waits until coordinator 0
    /// leads and every supervisor's lanes are registered.
    pub fn started(spec: Spec) -> Self {
        let mut w = Self::new(spec);
        w.start_coordinator(0, None);
        w.wait_leading(0);
        for h in 0..w.spec.supervisors {
            w.start_supervisor(h);
        }
        w.wait_lanes(w.spec.supervisors * w.spec.lanes);
        w
    }

    fn write_coordinator_config(&self, i: usize) {
        let c = &self.prov.coordinator;
        let s = &self.spec;
        let mut extra = String::new();
        if let Some(t) = s.reservation_ttl_ms {
            extra.push_str(&format!("reservation_ttl_ms = {t}\n"));
        }
        if let Some(h) = s.heartbeat_ms {
            extra.push_str(&format!("heartbeat_ms = {h}\n"));
        }
        if let (0, Some(a)) = (i, &self.operator_addr) {
            extra.push_str(&format!("operator_listen = {a:?}\n"));
        }
        if s.recovery {
            let list: Vec<String> = c
                .recovery_recipients
                .iter()
                .map(|r| format!("{r:?}"))
                .collect();
            extra.push_str(&format!("recovery_recipients = [{}]\n", list.join(", ")));
        }
        if let Some(k) = &c.recovery_key {
            extra.push_str(&format!("recovery_key = {k:?}\n"));
        }
        extra.push_str(&s.coordinator_extra);
        std::fs::write(
            self.coordinator_config(i),
            format!(
                "name = {:?}\ntrust_domain = {:?}\nlisten = {:?}\ndatabase_url = {:?}\nsecret_file = {:?}\nca = {:?}\ncert = {:?}\nkey = {:?}\n\
                 trust_registry = {:?}\nsession_key = {:?}\nordinary_key = {:?}\noperator_socket = {:?}\nlease_ms = {}\nstate_dir = {:?}\n{extra}",
                c.name, c.trust_domain, self.listen[i], c.database_url, c.secret_file, c.ca, c.cert, c.key, c.trust_registry,
                c.session_key, c.ordinary_key, self.socket(i), s.lease_ms, self.coordinator_state_dir(i),
            ),
        )
        .unwrap();
    }

    /// Writes supervisor `h`'s config, reaching the coordinators at `addresses` (the first,
    /// then the others as fallbacks): a test may put a proxy in between.
    pub fn write_supervisor_config(&self, h: usize, addresses: &[String]) {
        let l = &self.prov.links[h];
        let s = &self.spec;
        let lanes: Vec<String> = (1..=s.lanes).map(|i| format!("\"lane-{i}\"")).collect();
        let fallbacks: Vec<String> = addresses[1..].iter().map(|a| format!("{a:?}")).collect();
        let reattach = s
            .reattach_timeout_ms
            .map(|t| format!("reattach_timeout_ms = {t}\n"))
            .unwrap_or_default();
        let mut hb = s
            .heartbeat_ms
            .map(|t| format!("heartbeat_ms = {t}\n"))
            .unwrap_or_default();
        if let Some(k) = &l.recovery_key {
            hb.push_str(&format!("recovery_key = {k:?}\n"));
        }
        std::fs::write(
            self.supervisor_config(h),
            format!(
                "host_id = {:?}\nstate_dir = {:?}\nruntime_dir = {:?}\ncgroup_root = {:?}\nbin_dir = {:?}\nlanes = [{}]\n{reattach}{}\n\
                 [coordinator]\naddress = {:?}\nfallback_addresses = [{}]\nserver_name = {:?}\nprincipal = {:?}\ntrust_domain = {:?}\nca = {:?}\ncert = {:?}\nkey = {:?}\ntrust_registry = {:?}\nsession_key = {:?}\nordinary_key = {:?}\n{hb}\n{}",
                self.hosts[h],
                self.state_dir(h),
                self.runtime_dir(h),
                self.cgroup_roots[h],
                Path::new(common::MOSAIC).parent().unwrap(),
                lanes.join(", "),
                s.supervisor_top,
                addresses[0],
                fallbacks.join(", "),
                l.server_name, l.principal, l.trust_domain, l.ca, l.cert, l.key, l.trust_registry, l.session_key, l.ordinary_key,
                s.supervisor_extra,
            ),
        )
        .unwrap();
    }

    /// Coordinator `i`'s own state directory (its audit spool).
    /// The recovery identity harness artifacts are encrypted to (`mosaic up`'s).
    pub fn recovery_identity(&self) -> PathBuf {
        mosaic::up::recovery_identity(&self.dir)
    }

    pub fn coordinator_state_dir(&self, i: usize) -> PathBuf {
        self.dir.join(format!("coordinator-{i}-state"))
    }

    pub fn coordinator_config(&self, i: usize) -> PathBuf {
        self.dir.join(format!("coordinator-{i}.toml"))
    }
    pub fn supervisor_config(&self, h: usize) -> PathBuf {
        self.dir.join(format!("supervisor-{h}.toml"))
    }
    /// Coordinator `i`'s operator socket.
    pub fn socket(&self, i: usize) -> PathBuf {
        self.dir.join(format!("run/coordinator-{i}.sock"))
    }
    pub fn coordinator_log(&self, i: usize) -> PathBuf {
        self.dir.join(format!("coordinator-{i}.log"))
    }
    pub fn supervisor_log(&self, h: usize) -> PathBuf {
        self.dir.join(format!("supervisor-{h}.log"))
    }
    /// Supervisor `h`'s state dir (generation records, `outbox/`, `acked/`).
    pub fn state_dir(&self, h: usize) -> PathBuf {
        self.dir.join(format!("state-{h}"))
    }
    /// Supervisor `h`'s runtime dir (`control.sock`, `lanes/<lane>/tmux.sock`).
    pub fn runtime_dir(&self, h: usize) -> PathBuf {
        self.dir.join(format!("rt-{h}"))
    }

    pub fn start_coordinator(&mut self, i: usize, failpoints: Option<&str>) {
        self.coord[i].start(failpoints);
        let sock = self.socket(i);
        common::wait_until("coordinator serving", || {
            operator_call(&sock, &OperatorRequest::Status).ok()
        });
    }

    /// SIGKILLs coordinator `i` (if it runs) and reaps it.
    pub fn crash_coordinator(&mut self, i: usize) {
        self.coord[i].crash();
    }

    pub fn coordinator_pid(&self, i: usize) -> i32 {
        self.coord[i].pid().expect("coordinator runs") as i32
    }

    /// Waits for coordinator `i` to lead; its epoch.
    pub fn wait_leading(&self, i: usize) -> i64 {
        let sock = self.socket(i);
        common::wait_until(&format!("coordinator {i} leading"), || {
            let st = operator_call(&sock, &OperatorRequest::Status).ok()?;
            (st["leadership"]["state"] == "leading").then(|| st["coordinator_epoch"].as_i64())?
        })
    }

    /// Waits for coordinator `i` to end by itself (a failpoint, a refusal to start).
    pub fn wait_coordinator_died(&mut self, i: usize, what: &str) {
        assert!(self.coord[i].running(), "coordinator {i} runs");
        let start = Instant::now();
        loop {
            if self.coord[i].exited().is_some() {
                return;
            }
            assert!(
                start.elapsed() < common::PATIENCE,
                "the coordinator never reached {what}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn start_supervisor(&mut self, h: usize) {
        self.sup[h].start(None);
    }

    /// SIGKILLs supervisor `h` (if it runs) and reaps it; its generations live on.
    pub fn crash_supervisor(&mut self, h: usize) {
        self.sup[h].crash();
    }

    /// Waits until the coordinators know `n` lanes.
    pub fn wait_lanes(&self, n: usize) {
        common::wait_until("lanes registered", || {
            (self.op(&OperatorRequest::Lanes).ok()?.as_array()?.len() == n).then_some(())
        });
    }

    /// An operator request to whichever coordinator leads.
    pub fn op(&self, r: &OperatorRequest) -> Result<Value, OpError> {
        let mut last = None;
        for i in 0..self.coord.len() {
            if !self.coord[i].running() {
                continue;
            }
            match operator_call(&self.socket(i), r) {
                Err(e)
                    if e.category == mosaic::coordinator::Category::NotLeader
                        || e.category == mosaic::coordinator::Category::Unavailable =>
                {
                    last = Some(e)
                }
                other => return other,
            }
        }
        Err(last.unwrap_or_else(|| {
            OpError::new(
                mosaic::coordinator::Category::Unavailable,
                "no coordinator running",
            )
        }))
    }

    pub fn status(&self) -> Value {
        self.op(&OperatorRequest::Status).unwrap()
    }

    /// Lane `name` of host `h`, as the coordinator names it.
    pub fn lane_of(&self, h: usize, name: &str) -> String {
        format!("{}:{name}", self.hosts[h])
    }

    pub fn assign_to(&self, lane: &str, task: &str, wait: bool) -> Result<Value, OpError> {
        self.op(&assign_request(lane, task, None, wait))
    }

    /// Audit rows whose detail mentions `needle`.
    pub fn audited(&self, needle: &str) -> usize {
        self.op(&OperatorRequest::Audit { since: 0 })
            .unwrap()
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["detail"].as_str().unwrap_or("").contains(needle))
            .count()
    }

    /// Cuts every connection of this world's database, leaving it closed to new ones
    /// (`closed`) or open (a reset; also how a closed one is opened again).
    pub fn close_database(&self, closed: bool) {
        let db = &self.db.name;
        pg::server().psql(
            "postgres",
            &format!(
                "ALTER DATABASE \"{db}\" WITH ALLOW_CONNECTIONS {}; \
                 SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{db}';",
                !closed
            ),
        );
    }

    pub async fn sql(&self) -> tokio_postgres::Client {
        let (c, conn) = tokio_postgres::connect(&self.db.url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        c
    }

    pub async fn count(&self, q: &str) -> i64 {
        self.sql().await.query_one(q, &[]).await.unwrap().get(0)
    }

    /// Waits until the count `q` satisfies `done`, on one connection.
    pub async fn wait_count(&self, q: &str, done: impl Fn(i64) -> bool, what: &str) {
        let c = self.sql().await;
        let start = Instant::now();
        loop {
            let n: i64 = c.query_one(q, &[]).await.unwrap().get(0);
            if done(n) {
                return;
            }
            assert!(
                start.elapsed() < common::PATIENCE,
                "timed out waiting for {what} ({n})"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl World {
    /// Supervisor `h`'s own status (`mosaic host status`), from its control socket.
    pub fn host_status(&self, h: usize) -> Value {
        mosaic::supervisor::control::call(
            &self.runtime_dir(h).join("control.sock"),
            &mosaic::supervisor::control::Request::Status,
        )
        .unwrap()
    }

    /// The current incarnation of lane `name` of host `h`.
    pub fn incarnation_of(&self, h: usize, name: &str) -> String {
        let lane = self.lane_of(h, name);
        self.op(&OperatorRequest::Lanes)
            .unwrap()
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["lane_id"] == lane.as_str())
            .and_then(|l| l["lane_incarnation_id"].as_str().map(String::from))
            .unwrap_or_else(|| panic!("no lane {lane}"))
    }

    /// Generation `generation` of lane `name` of host `h`'s private area (its `home/` is the
    /// fake harness's `$HOME`).
    pub fn area(&self, h: usize, lane_incarnation_id: &str, generation: u64) -> PathBuf {
        self.state_dir(h)
            .join("harness")
            .join(lane_incarnation_id)
            .join(format!("gen-{generation}"))
    }
}

/// An `assign` of the fake harness on `lane`.
pub fn assign_request(lane: &str, task: &str, resume: Option<&str>, wait: bool) -> OperatorRequest {
    OperatorRequest::Assign {
        lane_id: lane.into(),
        runtime: "fake@1.0.0".into(),
        task: task.into(),
        scope: vec![],
        holds: vec![],
        completion_policy: None,
        wait,
        resume: resume.map(String::from),
        request_id: None,
        inactivity_policy: None,
        repo: None,
        base: None,
        replace_task: false,
        from_checkpoint: None,
        grant_within_s: None,
        place: None,
    }
}

impl Drop for World {
    fn drop(&mut self) {
        for h in 0..self.sup.len() {
            self.crash_supervisor(h);
        }
        for i in 0..self.coord.len() {
            self.crash_coordinator(i);
        }
        let mut logs: Vec<String> = (0..self.coord.len())
            .map(|i| format!("coordinator-{i}.log"))
            .collect();
        logs.extend((0..self.sup.len()).map(|h| format!("supervisor-{h}.log")));
        let logs: Vec<&str> = logs.iter().map(String::as_str).collect();
        let lanes: Vec<PathBuf> = (0..self.sup.len())
            .map(|h| self.runtime_dir(h).join("lanes"))
            .collect();
        let lanes: Vec<&Path> = lanes.iter().map(PathBuf::as_path).collect();
        let roots: Vec<&Path> = self.cgroup_roots.iter().map(PathBuf::as_path).collect();
        common::teardown_all(&self.dir, &lanes, &roots, &logs);
    }
}
