use super::*;

struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn dir() -> Dir {
    let d = std::env::temp_dir().join(format!("mosaic-progress-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(d.join("work")).unwrap();
    Dir(d)
}

fn kinds(e: &[Evidence]) -> Vec<&'static str> {
    e.iter().map(|e| e.kind).collect()
}

fn git(work: &Path, args: &[&str]) {
    let ok = std::process::Command::new("git")
        .args([
            "-c",
            "user.email=t@t",
            "-c",
            "user.name=t",
            "-c",
            "init.defaultBranch=main",
        ])
        .args(args)
        .current_dir(work)
        .status()
        .expect("this test needs git");
    assert!(ok.success(), "git {args:?}");
}

/// Changed files are evidence once; output alone, an unchanged tree and an undone change
/// are not; a change survives a restart of the observer (its baseline is kept).
#[test]
fn only_changed_files_are_evidence_and_each_listing_once() {
    let d = dir();
    let (work, kept) = (d.0.join("work"), d.0.join("kept.json"));
    std::fs::write(work.join("before.txt"), "baseline").unwrap();
    let mut o = Observer::start(&work, &kept).unwrap();
    assert!(
        o.observe().unwrap().is_empty(),
        "the baseline is not progress"
    );
    std::fs::write(work.join("a.rs"), "fn main() {}").unwrap();
    let e = o.observe().unwrap();
    assert_eq!(kinds(&e), ["file-set"]);
    let listing: Vec<(String, Option<String>)> = serde_json::from_slice(&e[0].bytes).unwrap();
    assert_eq!(listing.len(), 1);
    assert_eq!(listing[0].0, "a.rs");
    assert_eq!(
        listing[0].1.as_deref(),
        Some(hex::encode(<sha2::Sha256 as sha2::Digest>::digest(b"fn main() {}")).as_str())
    );
    assert!(o.observe().unwrap().is_empty(), "the same listing twice");
    // A restarted observer keeps the baseline and what it reported.
    let mut o = Observer::start(&work, &kept).unwrap();
    assert!(o.observe().unwrap().is_empty());
    std::fs::remove_file(work.join("before.txt")).unwrap();
    let e = o.observe().unwrap();
    let listing: Vec<(String, Option<String>)> = serde_json::from_slice(&e[0].bytes).unwrap();
    assert_eq!(
        listing,
        vec![
            ("a.rs".into(), listing[0].1.clone()),
            ("before.txt".into(), None)
        ]
    );
}

/// A link (to a file outside, or a directory), a FIFO and a socket are never read, and a
/// FIFO never blocks an observation.
#[test]
fn links_fifos_and_sockets_are_never_followed_or_read() {
    let d = dir();
    let (work, kept) = (d.0.join("work"), d.0.join("kept.json"));
    let mut o = Observer::start(&work, &kept).unwrap();
    std::fs::write(d.0.join("secret"), "outside").unwrap();
    std::os::unix::fs::symlink(d.0.join("secret"), work.join("link")).unwrap();
    std::os::unix::fs::symlink(&d.0, work.join("dirlink")).unwrap();
    nix::unistd::mkfifo(
        &work.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let _sock = std::os::unix::net::UnixListener::bind(work.join("sock")).unwrap();
    assert!(
        o.observe().unwrap().is_empty(),
        "a link, FIFO or socket counted"
    );
    // The declared test result as a link to a file outside: not read.
    std::fs::create_dir_all(work.join(".mosaic")).unwrap();
    std::os::unix::fs::symlink(d.0.join("secret"), work.join(TEST_RESULT)).unwrap();
    assert!(o.observe().unwrap().is_empty());
}

/// The declared test result is evidence of its own kind whenever its bytes change.
#[test]
fn a_new_test_result_is_evidence() {
    let d = dir();
    let (work, kept) = (d.0.join("work"), d.0.join("kept.json"));
    let mut o = Observer::start(&work, &kept).unwrap();
    std::fs::create_dir_all(work.join(".mosaic")).unwrap();
    std::fs::write(work.join(TEST_RESULT), "ok 1 - parses\n").unwrap();
    let e = o.observe().unwrap();
    assert_eq!(
        kinds(&e),
        ["test-result"],
        "the test result is not a changed file"
    );
    assert_eq!(e[0].bytes, b"ok 1 - parses\n");
    assert!(o.observe().unwrap().is_empty());
    std::fs::write(work.join(TEST_RESULT), "ok 1 - parses\nok 2 - runs\n").unwrap();
    assert_eq!(kinds(&o.observe().unwrap()), ["test-result"]);
}

/// A commit is evidence only when its object is there and hashes to the id HEAD names: a
/// ref written by hand names nothing.
#[test]
fn a_commit_counts_only_with_its_object() {
    let d = dir();
    let (work, kept) = (d.0.join("work"), d.0.join("kept.json"));
    git(&work, &["init", "-q"]);
    std::fs::write(work.join("f"), "1").unwrap();
    git(&work, &["add", "f"]);
    git(&work, &["commit", "-qm", "one"]);
    let mut o = Observer::start(&work, &kept).unwrap();
    assert!(
        o.observe().unwrap().is_empty(),
        "the baseline's commit counted"
    );
    git(&work, &["commit", "-q", "--allow-empty", "-m", "two"]);
    let e = o.observe().unwrap();
    assert_eq!(kinds(&e), ["commit"]);
    let head = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(&work)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&e[0].bytes),
        String::from_utf8_lossy(&head.stdout).trim()
    );
    // A forged ref: an id with no object behind it.
    std::fs::write(
        work.join(".git/refs/heads/main"),
        format!("{}\n", "ab".repeat(20)),
    )
    .unwrap();
    assert!(
        o.observe().unwrap().is_empty(),
        "a ref without its object counted"
    );
}
