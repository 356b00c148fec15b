//! Operations benchmark. Prints; asserts nothing about speed. Run as root:
//! `cargo bench --bench ops`.
//!
//! 1. The cost of a coordinator `/metrics` scrape with 64 lanes and 10 000 termination
//!    receipts in its database (private PostgreSQL, fsync on), beside its anchor: one
//!    `SELECT count(*)` of those receipts on the same server over the same socket.
//! 2. A supervisor with 100 lanes (100 tmux servers), idle: its RSS, and its CPU over 20 s.

use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mosaic::pgcluster::{Cluster, Durability};

fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1000.0
}

fn scrape(addr: &str) -> usize {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    text.len()
}

fn free_port(from: u16) -> u16 {
    for p in from..from + 1000 {
        if std::net::TcpListener::bind(("127.0.0.1", p)).is_ok() {
            return p;
        }
    }
    panic!("no free port")
}

struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn main() {
    let dir = std::env::temp_dir().join(format!(
        "mosaic-bench-ops-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let cluster = Cluster::at(&dir.join("pg")).expect("PostgreSQL server binaries");
    cluster.init().expect("initdb");
    cluster.start(Durability::Durable).expect("start");
    let result = std::panic::catch_unwind(|| run(&dir, &cluster));
    let _ = cluster.stop();
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

fn run(dir: &std::path::Path, cluster: &Cluster) {
    cluster.psql("postgres", "CREATE DATABASE mosaic").unwrap();
    let url = cluster.url("mosaic");
    let listen = format!("127.0.0.1:{}", free_port(21000));
    let metrics = format!("127.0.0.1:{}", free_port(23000));
    let prov = mosaic::up::provision(dir, &["bench".to_string()], &url, &listen).unwrap();
    let c = &prov.coordinator;
    let cfg = dir.join("coordinator.toml");
    std::fs::write(
        &cfg,
        format!(
            "name = {:?}\ntrust_domain = {:?}\nlisten = {listen:?}\ndatabase_url = {:?}\nsecret_file = {:?}\nca = {:?}\ncert = {:?}\nkey = {:?}\n\
             trust_registry = {:?}\nsession_key = {:?}\nordinary_key = {:?}\noperator_socket = {:?}\nmetrics_listen = {metrics:?}\n",
            c.name, c.trust_domain, c.database_url, c.secret_file, c.ca, c.cert, c.key, c.trust_registry, c.session_key, c.ordinary_key,
            dir.join("run/coordinator.sock"),
        ),
    )
    .unwrap();
    let coord = Killed(
        Command::new(env!("CARGO_BIN_EXE_mosaic"))
            .args(["coordinator", "--config"])
            .arg(&cfg)
            .env("MOSAIC_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("coordinator.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(&metrics).is_err() {
        assert!(
            Instant::now() < deadline,
            "the coordinator never served metrics: {}",
            std::fs::read_to_string(dir.join("coordinator.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The data a fleet of 64 lanes accumulates: 64 incarnations, 10 000 receipts. Seeded
    // directly (as the database superuser, with triggers off for the seeding transaction
    // only) — the scrape reads them, it does not care how they came.
    cluster
        .psql(
            "mosaic",
            "BEGIN; SET LOCAL session_replication_role = replica; \
             INSERT INTO lanes (lane_id, host_id) SELECT 'bench:lane-' || i, 'bench' FROM generate_series(1, 64) i ON CONFLICT DO NOTHING; \
             INSERT INTO lane_incarnations (lane_incarnation_id, lane_id, created_epoch) \
               SELECT 'li-' || md5(i::text), 'bench:lane-' || i, 1 FROM generate_series(1, 64) i; \
             INSERT INTO termination_receipts (idempotency_key, lane_id, lane_incarnation_id, generation, body, body_digest, verified_empty, ingested_epoch, reconciliation) \
               SELECT 'tr-' || md5('r' || i), 'bench:lane-' || (1 + i % 64), 'li-' || md5((1 + i % 64)::text), 1 + i / 64, \
                      jsonb_build_object('observation_source', (ARRAY['shim','supervisor'])[1 + i % 2], 'termination_reason', (ARRAY['quit','sigkill','crash','timeout'])[1 + i % 4]), \
                      'sha256:x', true, 1, 'recovery' FROM generate_series(1, 10000) i; \
             COMMIT;",
        )
        .expect("seeding");
    let n = 100;
    let mut scrapes = Vec::with_capacity(n);
    let mut bytes = 0;
    for _ in 0..n {
        let t = Instant::now();
        bytes = scrape(&metrics);
        scrapes.push(t.elapsed());
    }
    // The anchor: one aggregate of the same receipts, same server, same kind of socket,
    // from a fresh psql each time is unfair; use one persistent client instead.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut anchor = Vec::with_capacity(n);
    rt.block_on(async {
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        for _ in 0..n {
            let t = Instant::now();
            let _ = client
                .query_one("SELECT count(*) FROM termination_receipts", &[])
                .await
                .unwrap();
            anchor.push(t.elapsed());
        }
    });
    drop(coord);

    // 2. A supervisor with 100 lanes, idle.
    let root = mosaic::cgroup::discover_mount().unwrap().path.join(format!(
        "mosaic-bench-ops-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    ));
    let lanes: Vec<String> = (1..=100).map(|i| format!("\"lane-{i}\"")).collect();
    let scfg = dir.join("supervisor.toml");
    std::fs::write(
        &scfg,
        format!(
            "host_id = \"bench\"\nstate_dir = {:?}\nruntime_dir = {:?}\ncgroup_root = {root:?}\nlanes = [{}]\n",
            dir.join("sup-state"),
            dir.join("rt"),
            lanes.join(", ")
        ),
    )
    .unwrap();
    let sup = Killed(
        Command::new(env!("CARGO_BIN_EXE_mosaic"))
            .args(["supervisor", "--config"])
            .arg(&scfg)
            .env("MOSAIC_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let sock = dir.join("rt/control.sock");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(st) =
            mosaic::supervisor::control::call(&sock, &mosaic::supervisor::control::Request::Status)
        {
            if st["lanes"].as_array().map_or(0, |l| l.len()) == 100 {
                break;
            }
        }
        assert!(Instant::now() < deadline, "100 lanes never came up");
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(5));
    let pid = sup.0.id();
    let ticks = || -> u64 {
        let st = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let f: Vec<&str> = st.rsplit(')').next().unwrap().split_whitespace().collect();
        f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
    };
    let rss = || -> u64 {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    };
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .unwrap()
        .unwrap() as f64;
    let (t0, c0) = (Instant::now(), ticks());
    std::thread::sleep(Duration::from_secs(20));
    let cpu = (ticks() - c0) as f64 / hz / t0.elapsed().as_secs_f64() * 100.0;
    let rss_kb = rss();
    // A bare tmux server's RSS, for scale (one of the 100 the lanes run).
    let tmux_rss = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ps -o rss= -p $(pgrep -f '{}' | head -1)",
            dir.join("rt/lanes/lane-1/tmux.sock").display()
        ))
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .trim()
                .parse::<u64>()
                .ok()
        })
        .unwrap_or(0);
    drop(sup);
    for i in 1..=100 {
        let _ = Command::new("tmux")
            .arg("-S")
            .arg(dir.join(format!("rt/lanes/lane-{i}/tmux.sock")))
            .arg("kill-server")
            .stderr(Stdio::null())
            .status();
    }
    if let Ok(tree) = mosaic::cgroup::CgroupTree::open(
        &mosaic::cgroup::discover_mount().unwrap(),
        Some(&root),
        "",
        false,
    ) {
        let _ = tree.destroy_all(Duration::from_secs(10));
    }

    let (s50, s99, a50, a99) = (
        pct(&mut scrapes.clone(), 0.5),
        pct(&mut scrapes, 0.99),
        pct(&mut anchor.clone(), 0.5),
        pct(&mut anchor, 0.99),
    );
    println!("Mosaic operations benchmark");
    println!("  coordinator /metrics with 64 lanes and 10 000 receipts (PostgreSQL fsync on), {n} scrapes of {bytes} bytes");
    println!("      scrape          p50 {s50:7.2} ms  p99 {s99:7.2} ms");
    println!("      anchor: SELECT count(*) of the receipts, same server: p50 {a50:7.2} ms  p99 {a99:7.2} ms  (scrape = {:.1}× the anchor)", s50 / a50);
    println!("  supervisor with 100 lanes, idle 20 s: RSS {:.1} MB, CPU {cpu:.2} % (one lane's tmux server: {:.1} MB)", rss_kb as f64 / 1024.0, tmux_rss as f64 / 1024.0);
}
