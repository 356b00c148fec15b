//! Per-runtime credentials: a `KEY=VALUE` file (one per line, `#` comments), readable by
//! the supervisor's user alone, named in the supervisor config for one runtime. Its values
//! go into an unconfined generation's environment, and to a confined generation's provider
//! gateway (the generation itself gets `placeholder`s), and nowhere else: never into a log,
//! record, receipt, status, error or envelope (errors name line numbers, never values).

use std::path::Path;

use crate::shim::proto::SecretValue;

use super::RegistryError;

/// The placeholder a confined generation sees in place of credential `name`: only its own
/// provider gateway replaces it with the value (`supervisor::gateway`).
pub fn placeholder(name: &str) -> String {
    format!("mosaic-credential-{name}")
}

fn key_ok(k: &str) -> bool {
    let mut b = k.bytes();
    b.next()
        .is_some_and(|c| c.is_ascii_uppercase() || c == b'_')
        && b.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == b'_')
}

/// Reads and checks `path`. Refused: a symlink or non-regular file, a file another user
/// owns or that group/others may read or write, a malformed line, a duplicate key, and
/// any `MOSAIC_*` key (those are the generation's own wiring).
pub fn load(runtime: &str, path: &Path) -> Result<Vec<(String, SecretValue)>, RegistryError> {
    use std::os::unix::fs::MetadataExt;
    let fail = |detail: String| RegistryError::Credentials {
        runtime: runtime.to_string(),
        path: path.to_path_buf(),
        detail,
    };
    // Opened without following a symlink, and checked on the open file: what is checked is
    // what is read.
    let file = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ELOOP) => fail("must be a regular file (not a symlink)".into()),
                _ => fail(e.to_string()),
            })?
    };
    let meta = file.metadata().map_err(|e| fail(e.to_string()))?;
    if !meta.file_type().is_file() {
        return Err(fail("must be a regular file (not a symlink)".into()));
    }
    if meta.uid() != nix::unistd::geteuid().as_raw() {
        return Err(fail(format!(
            "must be owned by the supervisor's user (uid {}), not uid {}",
            nix::unistd::geteuid(),
            meta.uid()
        )));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(fail(format!(
            "mode {:o} lets others read it; chmod 600",
            meta.mode() & 0o777
        )));
    }
    let text = zeroize::Zeroizing::new({
        use std::io::Read;
        let mut t = String::new();
        (&file)
            .take(1 << 20)
            .read_to_string(&mut t)
            .map_err(|e| fail(e.to_string()))?;
        t
    });
    let mut out: Vec<(String, SecretValue)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            return Err(fail(format!("line {}: expected KEY=VALUE", i + 1)));
        };
        let k = k.trim();
        if !key_ok(k) {
            return Err(fail(format!("line {}: malformed variable name", i + 1)));
        }
        if k.starts_with("MOSAIC_") {
            return Err(fail(format!(
                "line {}: MOSAIC_* variables are Mosaic's own",
                i + 1
            )));
        }
        if out.iter().any(|(o, _)| o == k) {
            return Err(fail(format!("line {}: {k} is set twice", i + 1)));
        }
        let v = v.trim();
        let v = v
            .strip_prefix('"')
            .and_then(|x| x.strip_suffix('"'))
            .unwrap_or(v);
        out.push((k.to_string(), SecretValue(v.to_string())));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn file(text: &str, mode: u32) -> (std::path::PathBuf, std::path::PathBuf) {
        let dir =
            std::env::temp_dir().join(format!("mosaic-cred-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("creds.env");
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        (dir, p)
    }

    #[test]
    fn reads_a_private_file_and_never_echoes_values() {
        let (d, p) = file(
            "# provider\nANTHROPIC_AUTH_TOKEN=\"s3cret-value\"\nANTHROPIC_BASE_URL=http://x\n",
            0o600,
        );
        let v = load("claude-code", &p).unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].1 .0, "s3cret-value");
        assert!(!format!("{v:?}").contains("s3cret"));
        for (text, mode, why) in [
            ("A=s3cret-value\n", 0o640, "group-readable"),
            ("a=s3cret-value\n", 0o600, "lower-case name"),
            ("A s3cret-value\n", 0o600, "no ="),
            ("A=1\nA=s3cret-value\n", 0o600, "duplicate"),
            ("MOSAIC_LANE_SOCKET=s3cret-value\n", 0o600, "Mosaic's own"),
        ] {
            std::fs::write(&p, text).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = load("claude-code", &p).expect_err(why).to_string();
            assert!(!e.contains("s3cret"), "{why}: {e}");
        }
        let link = d.join("link.env");
        std::os::unix::fs::symlink(&p, &link).unwrap();
        assert!(load("claude-code", &link).is_err(), "symlink accepted");
        std::fs::remove_dir_all(d).unwrap();
    }
}
