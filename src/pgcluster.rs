//! A private PostgreSQL cluster from the local server binaries, for `mosaic up` and the
//! test suite. Runs as the `postgres` user when we are root (initdb refuses root), and is
//! stopped by its owner.
//!
//! Private means nobody else on the machine can open it: no TCP listener; the socket in a
//! directory (`<root>/sock`, mode 0700) only the cluster's owner — and root — can enter;
//! and `peer` authentication with a map that admits only root, the cluster's owner and
//! the account that created it (`pg_ident.conf`, rewritten at every start, so a cluster
//! made by an older version loses its old `trust` rules). Any other local account is
//! refused twice: by the directory, and by the server.
//!
//! **Never:** listens on TCP, authenticates anyone by `trust`, or touches any cluster it
//! did not create.

use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("PostgreSQL server binaries not found (initdb, pg_ctl); install them: apt-get install postgresql")]
    NoBinaries,
    #[error("running as root, but there is no `postgres` user to run the server as")]
    NoPostgresUser,
    #[error("{what} failed: {detail}")]
    Command { what: &'static str, detail: String },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

#[derive(Debug, Clone)]
pub struct Cluster {
    root: PathBuf,
    bin: PathBuf,
    owner: Option<(u32, u32)>,
    port: u16,
}

/// Tuning for a throwaway test cluster vs a durable one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// fsync on: the only honest setting for authority data and for benchmarks.
    Durable,
    /// fsync off: for throwaway test clusters only.
    Throwaway,
}

fn postgres_user() -> Option<(u32, u32)> {
    nix::unistd::User::from_name("postgres")
        .ok()
        .flatten()
        .map(|u| (u.uid.as_raw(), u.gid.as_raw()))
}

impl Cluster {
    /// Describes a cluster rooted at `root` (data in `root/data`, socket in `root`).
    pub fn at(root: &Path) -> Result<Self, ClusterError> {
        // Resolve symlinks (some images link initdb into /usr/local/bin but not psql or
        // pgbench): the real directory holds the whole matching set.
        let initdb = crate::sysdeps::pg_bin("initdb").ok_or(ClusterError::NoBinaries)?;
        let initdb = std::fs::canonicalize(&initdb).unwrap_or(initdb);
        let bin = initdb
            .parent()
            .map(Path::to_path_buf)
            .ok_or(ClusterError::NoBinaries)?;

        let owner = if nix::unistd::geteuid().is_root() {
            Some(postgres_user().ok_or(ClusterError::NoPostgresUser)?)
        } else {
            None
        };
        Ok(Self {
            root: root.to_path_buf(),
            bin,
            owner,
            port: 5432,
        })
    }

    pub fn data_dir(&self) -> PathBuf {
        self.root.join("data")
    }

    /// The directory holding the server's socket (mode 0700).
    pub fn socket_dir(&self) -> PathBuf {
        self.root.join("sock")
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn bin(&self, name: &str) -> PathBuf {
        self.bin.join(name)
    }

    /// A libpq-style connection string for `dbname` over the Unix socket.
    pub fn url(&self, dbname: &str) -> String {
        format!(
            "host={} port={} user=postgres dbname={dbname}",
            self.socket_dir().display(),
            self.port
        )
    }

    fn run(&self, what: &'static str, mut c: Command) -> Result<(), ClusterError> {
        use std::os::unix::process::CommandExt;
        if let Some((uid, gid)) = self.owner {
            c.uid(uid).gid(gid);
        }
        c.env_remove("PGDATA").current_dir(&self.root);
        let out = c.output().map_err(|e| ClusterError::Command {
            what,
            detail: e.to_string(),
        })?;
        if !out.status.success() {
            return Err(ClusterError::Command {
                what,
                detail: format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            });
        }
        Ok(())
    }

    /// Creates the cluster if `root/data` does not exist yet. Idempotent.
    pub fn init(&self) -> Result<(), ClusterError> {
        self.init_dir()?;
        if self.data_dir().join("PG_VERSION").exists() {
            return Ok(());
        }
        let mut c = Command::new(self.bin("initdb"));
        c.arg("-D").arg(self.data_dir()).args([
            "--auth-local=peer",
            "--auth-host=reject",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-instructions",
        ]);
        self.run("initdb", c)
    }

    /// Who may connect: root, the server's owner, and the account that made the cluster —
    /// each as the database superuser, over the private socket only.
    fn write_access_rules(&self) -> Result<(), ClusterError> {
        let me = nix::unistd::User::from_uid(nix::unistd::geteuid())
            .ok()
            .flatten()
            .map(|u| u.name);
        let owner = match self.owner {
            Some((uid, _)) => nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
                .ok()
                .flatten()
                .map(|u| u.name),
            None => me.clone(),
        };
        let mut users: Vec<String> = ["root".to_string()]
            .into_iter()
            .chain(owner)
            .chain(me)
            .collect();
        users.sort();
        users.dedup();
        let mut ident = String::from(
            "# Written by Mosaic at every start: the only OS accounts that may connect.\n",
        );
        for u in &users {
            ident.push_str(&format!("mosaic {u} postgres\n"));
        }
        let hba = "# Written by Mosaic at every start: the private socket, peer authentication, the mosaic map.\nlocal all all peer map=mosaic\nlocal replication all peer map=mosaic\n";
        for (name, text) in [("pg_hba.conf", hba.to_string()), ("pg_ident.conf", ident)] {
            let path = self.data_dir().join(name);
            std::fs::write(&path, text)?;
            self.give_to_owner(&path)?;
        }
        Ok(())
    }

    /// Hands `path` to the server's account (when we run as root).
    fn give_to_owner(&self, path: &Path) -> Result<(), ClusterError> {
        let Some((uid, gid)) = self.owner else {
            return Ok(());
        };
        nix::unistd::chown(
            path,
            Some(nix::unistd::Uid::from_raw(uid)),
            Some(nix::unistd::Gid::from_raw(gid)),
        )
        .map_err(|e| ClusterError::Command {
            what: "chown",
            detail: e.to_string(),
        })
    }

    pub fn start(&self, d: Durability) -> Result<(), ClusterError> {
        self.init_dir()?;
        self.write_access_rules()?;
        let mut opts = format!(
            "-k {} -p {} -c listen_addresses='' -c unix_socket_permissions=0700 -c max_connections=200",
            self.socket_dir().display(),
            self.port
        );
        if d == Durability::Throwaway {
            opts.push_str(" -c fsync=off -c synchronous_commit=off -c full_page_writes=off");
        }
        let mut c = Command::new(self.bin("pg_ctl"));
        c.arg("-D")
            .arg(self.data_dir())
            .arg("-o")
            .arg(opts)
            .arg("-l")
            .arg(self.root.join("server.log"))
            .args(["-w", "-t", "60", "start"]);
        self.run("pg_ctl start", c)
    }

    /// Whether the cluster's postmaster runs: the pid its `postmaster.pid` names is alive
    /// (not a zombie). A missing or unreadable pid file: not running.
    pub fn running(&self) -> bool {
        let Ok(text) = std::fs::read_to_string(self.data_dir().join("postmaster.pid")) else {
            return false;
        };
        let Some(pid) = text
            .lines()
            .next()
            .and_then(|l| l.trim().parse::<i32>().ok())
        else {
            return false;
        };
        pid > 0 && !crate::confine::is_dead(pid)
    }

    pub fn stop(&self) -> Result<(), ClusterError> {
        let mut c = Command::new(self.bin("pg_ctl"));
        c.arg("-D")
            .arg(self.data_dir())
            .args(["-m", "fast", "-w", "stop"]);
        self.run("pg_ctl stop", c)
    }

    /// Runs `psql -c sql` against `dbname` as the superuser.
    pub fn psql(&self, dbname: &str, sql: &str) -> Result<(), ClusterError> {
        let mut c = Command::new(self.bin("psql"));
        c.args([
            "-X",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            &self.url(dbname),
            "-c",
            sql,
        ]);
        self.run("psql", c)
    }
}

impl Cluster {
    /// The same cluster description on another port (for a second cluster beside one).
    pub fn with_port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }

    /// Creates the root and socket directories, owned by the server user, without initdb.
    pub fn init_dir(&self) -> Result<(), ClusterError> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(self.socket_dir())?;
        std::fs::set_permissions(self.socket_dir(), std::fs::Permissions::from_mode(0o700))?;
        self.give_to_owner(&self.root)?;
        self.give_to_owner(&self.socket_dir())
    }

    /// Makes this cluster a streaming standby of `primary` (pg_basebackup -R).
    pub fn base_backup_from(&self, primary: &Cluster) -> Result<(), ClusterError> {
        let mut c = Command::new(self.bin("pg_basebackup"));
        c.arg("-D").arg(self.data_dir()).args([
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
            "-d",
            &primary.url("postgres"),
        ]);
        self.run("pg_basebackup", c)
    }
}
