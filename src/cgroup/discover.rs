//! Finding the cgroup v2 hierarchy and the process's own place in it.
//!
//! Pure parsing over values handed in (mountinfo text, `/proc/<pid>/cgroup` text) so the
//! rules can be unit-tested on fixtures; the callers read the real files. This module
//! never writes anything.

use std::path::{Path, PathBuf};

use super::CgroupError;

/// Where the unified (v2) hierarchy is mounted, and whether it is the only hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct V2Mount {
    pub path: PathBuf,
    /// `true` when v1 controllers are mounted beside it (systemd's "hybrid" layout).
    pub hybrid: bool,
    /// Mounted with `favordynmods` (Linux ≥ 6.0): moving a process between cgroups then
    /// costs no RCU grace period. Without it each generation start waits one (7–24 ms
    /// measured here) when its shim joins the fresh cgroup.
    pub favordynmods: bool,
}

/// Picks the cgroup2 mount out of `/proc/self/mountinfo` text.
///
/// Preference order: `/sys/fs/cgroup` (pure v2), `/sys/fs/cgroup/unified` (hybrid), then any
/// other cgroup2 mount point. A host with only v1 controllers has no usable hierarchy: that
/// is an error, never a silent fallback to v1 semantics.
pub fn find_v2_mount(mountinfo: &str) -> Result<V2Mount, CgroupError> {
    let mut v2: Vec<(PathBuf, bool)> = Vec::new();
    let mut has_v1 = false;
    for line in mountinfo.lines() {
        // mountinfo: id parent major:minor root mount_point options [optional...] - fstype source super
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let mount_point = match left.split(' ').nth(4) {
            Some(m) => unescape_mountinfo(m),
            None => continue,
        };
        let mut fields = right.split(' ');
        match fields.next() {
            Some("cgroup2") => {
                let dynmods = fields
                    .nth(1)
                    .is_some_and(|o| o.split(',').any(|x| x == "favordynmods"));
                v2.push((PathBuf::from(mount_point), dynmods))
            }
            Some("cgroup") => has_v1 = true,
            _ => {}
        }
    }
    let preferred = [
        Path::new("/sys/fs/cgroup"),
        Path::new("/sys/fs/cgroup/unified"),
    ];
    let chosen = preferred
        .iter()
        .find_map(|p| v2.iter().find(|(m, _)| m.as_path() == *p))
        .or_else(|| v2.first())
        .cloned();
    match chosen {
        Some((path, favordynmods)) => Ok(V2Mount {
            path,
            hybrid: has_v1,
            favordynmods,
        }),
        None => Err(CgroupError::NoV2 {
            detail: if has_v1 {
                "only cgroup v1 hierarchies are mounted; Mosaic needs the unified (v2) hierarchy \
                 (boot with systemd.unified_cgroup_hierarchy=1, or mount cgroup2)"
                    .to_string()
            } else {
                "no cgroup2 filesystem is mounted (try: mount -t cgroup2 none /sys/fs/cgroup)"
                    .to_string()
            },
        }),
    }
}

/// mountinfo escapes space, tab, newline and backslash as octal `\ooo`.
fn unescape_mountinfo(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() {
            if let Some(v) = s
                .get(i + 1..i + 4)
                .and_then(|oct| u8::from_str_radix(oct, 8).ok())
            {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The v2 path (relative to the mount, starting with `/`) from `/proc/<pid>/cgroup` text.
pub fn v2_path_of(proc_cgroup: &str) -> Result<String, CgroupError> {
    proc_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim_end().to_string())
        .ok_or_else(|| CgroupError::Malformed {
            file: "/proc/<pid>/cgroup".into(),
            detail: "no unified (0::) entry".into(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
30 23 0:26 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
40 30 0:36 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const PURE: &str =
        "35 24 0:30 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate\n";
    const V1_ONLY: &str = "31 30 0:27 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n";

    #[test]
    fn hybrid_layout_finds_unified() {
        let m = find_v2_mount(HYBRID).unwrap();
        assert_eq!(m.path, PathBuf::from("/sys/fs/cgroup/unified"));
        assert!(m.hybrid);
    }

    #[test]
    fn pure_v2_prefers_sys_fs_cgroup() {
        let m = find_v2_mount(PURE).unwrap();
        assert_eq!(m.path, PathBuf::from("/sys/fs/cgroup"));
        assert!(!m.hybrid);
    }

    #[test]
    fn v1_only_fails_closed_with_reason() {
        let e = find_v2_mount(V1_ONLY).unwrap_err();
        assert!(e.to_string().contains("only cgroup v1"), "{e}");
        let e = find_v2_mount("").unwrap_err();
        assert!(e.to_string().contains("no cgroup2"), "{e}");
    }

    #[test]
    fn favordynmods_is_read_from_the_super_options() {
        let on = "41 31 0:38 / /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw,nsdelegate,favordynmods\n";
        assert!(find_v2_mount(on).unwrap().favordynmods);
        // In the per-mount options (left of " - ") it means nothing.
        let off = "41 31 0:38 / /sys/fs/cgroup rw,favordynmods - cgroup2 cgroup2 rw,nsdelegate\n";
        assert!(!find_v2_mount(off).unwrap().favordynmods);
    }

    #[test]
    fn escaped_mount_points_are_decoded() {
        let m = find_v2_mount("1 2 0:1 / /mnt/cg\\040two rw - cgroup2 cgroup2 rw\n").unwrap();
        assert_eq!(m.path, PathBuf::from("/mnt/cg two"));
    }

    #[test]
    fn own_path_parsing() {
        assert_eq!(v2_path_of("4:memory:/x\n0::/a/b\n").unwrap(), "/a/b");
        assert!(v2_path_of("4:memory:/x\n").is_err());
    }
}
