//! git as Mosaic runs it (the supervisor's workspaces and checkpoints, the coordinator's
//! view of a stored checkpoint): without the host's configuration (system, root's global,
//! XDG), without a prompt, and killed past a deadline.

use std::path::Path;
use std::process::Command;

pub(crate) fn git(args: &[&str], dir: Option<&Path>) -> Result<String, String> {
    git_with(args, dir, &[])
}

/// How long one git command may take (a clone of a large repository, the capture of a
/// large workspace) before it is killed and the step fails.
pub(crate) const GIT_DEADLINE: std::time::Duration = std::time::Duration::from_secs(300);

pub(crate) fn git_with(
    args: &[&str],
    dir: Option<&Path>,
    env: &[(&str, &Path)],
) -> Result<String, String> {
    let mut c = Command::new("git");
    if let Some(d) = dir {
        c.arg("-C").arg(d);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    // Nothing of the host's git configuration (system, root's global, XDG), no prompt (a
    // remote that asks for a password fails instead of hanging the start).
    c.args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("XDG_CONFIG_HOME", "/nonexistent")
        .env("GIT_TERMINAL_PROMPT", "0")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let what = args
        .iter()
        .find(|a| !a.starts_with('-') && !a.contains('='))
        .copied()
        .unwrap_or("");
    let child = c
        .spawn()
        .map_err(|e| format!("running git (is it installed?): {e}"))?;
    // Waited for with a deadline, killed past it: nothing git reads may hold a start or a
    // receipt forever.
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(GIT_DEADLINE) {
        Ok(r) => r.map_err(|e| format!("waiting for git {what}: {e}"))?,
        Err(_) => {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            let _ = waiter.join();
            return Err(format!(
                "git {what} took longer than {} s: killed",
                GIT_DEADLINE.as_secs()
            ));
        }
    };
    let _ = waiter.join();
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "git {what} failed: {}",
            err.trim().chars().take(400).collect::<String>()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Fetches `refspec` from `source` (a bundle file or a repository) into `repo`, git checking
/// every object it receives (`transfer.fsckObjects`): how a bundle another party made is
/// read.
pub(crate) fn fetch_checked(repo: &Path, source: &str, refspec: &str) -> Result<String, String> {
    git(
        &[
            "-c",
            "transfer.fsckObjects=true",
            "fetch",
            "--quiet",
            "--no-tags",
            source,
            refspec,
        ],
        Some(repo),
    )
}
