//! Checkpoint benchmarks, each beside its anchor, in one run, on a workspace of 10 000
//! files with 100 of them changed (60 modified, 40 new and untracked):
//!
//! (a) a checkpoint (every file not ignored, as a synthetic commit in the host's checkpoint
//!     repository, with its kept index) vs `git stash create` on the same tree;
//! (b) the bytes a checkpoint adds to the coordinator's store (its bundle relative to the
//!     base) vs the base's own bundle;
//! (c) a restore into a fresh directory (a repository at the base, the checkpoint's files,
//!     checked by writing the tree again) vs `git worktree add` of the same commit.
//!
//! `cargo bench --bench checkpoint`. Prints; asserts nothing about speed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use mosaic::supervisor::checkpoints::{commit_workspace, init_store, materialize};

const FILES: usize = 10_000;
const CHANGED: usize = 100;
const ROUNDS: usize = 15;

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .expect("git runs");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn p90(v: &mut [Duration]) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * 0.9).round() as usize]
}

struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn main() {
    let root = Dir(std::env::temp_dir().join(format!(
        "mosaic-bench-checkpoint-{}",
        uuid::Uuid::new_v4().simple()
    )));
    let src = root.0.join("src");
    std::fs::create_dir_all(&src).unwrap();
    git(&src, &["init", "-q", "-b", "main"]);
    for i in 0..FILES {
        let d = src.join(format!("d{:03}", i / 100));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join(format!("f{i:05}.txt")),
            format!("file {i}\n{}\n", "x".repeat(200 + i % 300)),
        )
        .unwrap();
    }
    std::fs::write(src.join(".gitignore"), "*.log\n").unwrap();
    git(&src, &["add", "-A"]);
    git(
        &src,
        &[
            "-c",
            "user.name=b",
            "-c",
            "user.email=b@b",
            "commit",
            "-q",
            "-m",
            "base",
        ],
    );
    let base = git(&src, &["rev-parse", "HEAD"]);

    // The workspace (a clone, as the supervisor makes it) and the checkpoint repository
    // holding the base, its index seeded from the fresh checkout.
    let ws = root.0.join("ws");
    let out = Command::new("git")
        .args(["clone", "-q", "--no-hardlinks"])
        .arg(&src)
        .arg(&ws)
        .output()
        .unwrap();
    assert!(out.status.success());
    let store = root.0.join("store.git");
    init_store(&store).unwrap();
    git(
        &store,
        &[
            "fetch",
            "-q",
            ws.to_str().unwrap(),
            &format!("+{base}:refs/mosaic/bases/{base}"),
        ],
    );
    let keep = store.join("mosaic-index").join("bench");
    std::fs::create_dir_all(keep.parent().unwrap()).unwrap();
    std::fs::copy(ws.join(".git/index"), &keep).unwrap();
    for i in 0..CHANGED {
        if i < 60 {
            let f = ws.join(format!("d{:03}/f{:05}.txt", i, i * 100));
            std::fs::write(&f, format!("changed {i}\n")).unwrap();
        } else {
            std::fs::write(
                ws.join(format!("d{:03}/new{i}.txt", i)),
                format!("new {i}\n"),
            )
            .unwrap();
        }
    }
    std::fs::write(ws.join("scratch.log"), "ignored\n").unwrap();
    // A first checkpoint and stash settle both indexes (each reads what changed once).
    commit_workspace(
        &store,
        &ws,
        Some(&keep),
        Some(&base),
        "warm",
        "refs/mosaic/checkpoints/warm",
    )
    .unwrap();
    git(&ws, &["stash", "create"]);

    let (mut ours, mut stash, mut cold) = (vec![], vec![], vec![]);
    let mut bundle_bytes = vec![];
    let mut last = String::new();
    for r in 0..ROUNDS {
        // Each round changes one more file: every checkpoint has something new to record.
        std::fs::write(ws.join("d000/f00000.txt"), format!("round {r}\n")).unwrap();
        let reference = format!("refs/mosaic/checkpoints/r{r}");
        let t = Instant::now();
        let (commit, _tree) =
            commit_workspace(&store, &ws, Some(&keep), Some(&base), "bench", &reference).unwrap();
        ours.push(t.elapsed());
        let t = Instant::now();
        let s = git(&ws, &["stash", "create"]);
        stash.push(t.elapsed());
        assert!(!s.is_empty());
        // Without a kept index: every file read.
        let t = Instant::now();
        commit_workspace(
            &store,
            &ws,
            None,
            Some(&base),
            "bench",
            &format!("refs/mosaic/checkpoints/cold{r}"),
        )
        .unwrap();
        cold.push(t.elapsed());
        let f = root.0.join(format!("b{r}.bundle"));
        git(
            &store,
            &[
                "bundle",
                "create",
                "-q",
                f.to_str().unwrap(),
                &reference,
                &format!("^{base}"),
            ],
        );
        bundle_bytes.push(std::fs::metadata(&f).unwrap().len());
        last = commit;
    }
    let base_bundle = root.0.join("base.bundle");
    git(
        &store,
        &[
            "bundle",
            "create",
            "-q",
            base_bundle.to_str().unwrap(),
            &format!("refs/mosaic/bases/{base}"),
        ],
    );
    let base_bytes = std::fs::metadata(&base_bundle).unwrap().len();

    // Restores of the last checkpoint into fresh directories, vs `git worktree add`.
    let tree = git(&store, &["rev-parse", &format!("{last}^{{tree}}")]);
    let (mut restore, mut worktree) = (vec![], vec![]);
    for r in 0..5 {
        let dir = root.0.join(format!("restore{r}"));
        let t = Instant::now();
        materialize(&store, &dir, "mosaic/bench", Some(&base), &tree, None).unwrap();
        restore.push(t.elapsed());
        let wt = root.0.join(format!("wt{r}"));
        let t = Instant::now();
        git(
            &store,
            &[
                "worktree",
                "add",
                "-q",
                "--detach",
                wt.to_str().unwrap(),
                &last,
            ],
        );
        worktree.push(t.elapsed());
    }

    let (o, s, c) = (median(&mut ours), median(&mut stash), median(&mut cold));
    println!(
        "checkpoint of {FILES} files, {CHANGED} changed (median of {ROUNDS}; p90 in brackets):"
    );
    println!(
        "  mosaic checkpoint (kept index)   {:8.1} ms [{:.1}]",
        ms(o),
        ms(p90(&mut ours))
    );
    println!(
        "  git stash create (anchor)        {:8.1} ms [{:.1}]   ratio {:.2}x",
        ms(s),
        ms(p90(&mut stash)),
        o.as_secs_f64() / s.as_secs_f64()
    );
    println!(
        "  mosaic checkpoint (no index)     {:8.1} ms             ratio {:.2}x",
        ms(c),
        c.as_secs_f64() / s.as_secs_f64()
    );
    bundle_bytes.sort();
    println!(
        "bytes a checkpoint adds to the store: {} (median bundle relative to the base); the base's own bundle: {} ({:.2}%)",
        bundle_bytes[bundle_bytes.len() / 2],
        base_bytes,
        100.0 * bundle_bytes[bundle_bytes.len() / 2] as f64 / base_bytes as f64
    );
    let (r, w) = (median(&mut restore), median(&mut worktree));
    println!(
        "restore into a fresh directory (median of 5): {:.1} ms; git worktree add of the same commit: {:.1} ms; ratio {:.2}x",
        ms(r),
        ms(w),
        r.as_secs_f64() / w.as_secs_f64()
    );
}
