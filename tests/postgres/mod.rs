//! A real PostgreSQL server for the tests and the benchmark: Debian's `postgresql` package
//! (installed with apt-get when it is missing and this runs as root), a cluster made by `initdb`
//! in a temporary folder, run by the unprivileged `postgres` user (or the current one) on a free
//! loopback port, with password authentication over TCP. `psql` is the independent reader.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

pub const PASSWORD: &str = "batchinfer-pg-secret";

/// The churn model's inputs over `rows` customers (ids 0..rows), as a batchinfer query: the rows
/// the tests and the benchmark score from PostgreSQL and from Parquet alike.
pub fn customers_query(rows: u64) -> String {
    format!(
        "SELECT value AS id,
           CASE value % 3 WHEN 0 THEN 'paris' WHEN 1 THEN 'berlin' ELSE 'rome' END AS city,
           CAST(18 + value % 60 AS FLOAT) AS age,
           CAST((value * 7919) % 5000 AS FLOAT) / 10 AS spend
         FROM range({rows})"
    )
}

pub struct Postgres {
    bin: PathBuf,
    dir: tempfile::TempDir,
    pub port: u16,
    as_postgres: bool,
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The folder of `initdb`, `pg_ctl` and `postgres`, installing Debian's package if needed.
fn binaries() -> Option<PathBuf> {
    let find = || {
        let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .flatten()
            .map(|e| e.path().join("bin"))
            .filter(|bin| bin.join("initdb").exists())
            .collect();
        versions.sort();
        versions.pop()
    };
    if let Some(bin) = find() {
        return Some(bin);
    }
    if is_root() {
        let _ = Command::new("apt-get")
            .args(["install", "-y", "-qq", "postgresql"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(Stdio::null())
            .status();
    }
    find()
}

impl Postgres {
    /// A running server, or `None` (with the reason printed) where PostgreSQL cannot be
    /// installed.
    pub fn start() -> Option<Postgres> {
        let Some(bin) = binaries() else {
            eprintln!(
                "SKIPPED: no PostgreSQL server here and it cannot be installed (apt-get install \
                 postgresql needs root and Debian's archive)"
            );
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        let as_postgres = is_root();
        let password_file = dir.path().join("password");
        std::fs::write(&password_file, PASSWORD).unwrap();
        if as_postgres {
            let status = Command::new("chown")
                .args(["-R", "postgres"])
                .arg(dir.path())
                .status()
                .unwrap();
            assert!(status.success());
        }
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let server = Postgres {
            bin,
            dir,
            port,
            as_postgres,
        };
        let data = server.dir.path().join("data");
        let out = server
            .tool("initdb")
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                "postgres",
                "--auth-host=scram-sha-256",
                "--auth-local=trust",
            ])
            .arg(format!("--pwfile={}", password_file.display()))
            .output()
            .unwrap();
        assert!(out.status.success(), "initdb: {}", text(&out));
        let options = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c \
             synchronous_commit=off -c full_page_writes=off",
            server.dir.path().display()
        );
        let out = server
            .tool("pg_ctl")
            .arg("-D")
            .arg(&data)
            .args(["-o", &options, "-w", "-t", "60", "-l"])
            .arg(server.dir.path().join("log"))
            .arg("start")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pg_ctl start: {} {}",
            text(&out),
            std::fs::read_to_string(server.dir.path().join("log")).unwrap_or_default()
        );
        Some(server)
    }

    /// A command of the server's, run as the user that owns its files.
    fn tool(&self, name: &str) -> Command {
        if self.as_postgres {
            let mut command = Command::new("runuser");
            command
                .args(["-u", "postgres", "--"])
                .arg(self.bin.join(name));
            command
        } else {
            Command::new(self.bin.join(name))
        }
    }

    /// `postgres://` URL of the server's `postgres` database.
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres:{PASSWORD}@127.0.0.1:{}/postgres?sslmode=disable",
            self.port
        )
    }

    /// The `OPTIONS` of a table on this server.
    pub fn options(&self) -> String {
        format!(
            "OPTIONS ('host' '127.0.0.1', 'port' '{}', 'db' 'postgres', 'user' 'postgres', \
             'pass' '{PASSWORD}', 'sslmode' 'disable')",
            self.port
        )
    }

    /// Runs `sql` with psql over TCP with the password; its output, unaligned, tuples only,
    /// comma-separated.
    pub fn psql(&self, sql: &str) -> String {
        self.psql_with_input(sql, None)
    }

    /// [`Postgres::psql`] with `input` on its standard input (for `\copy ... FROM STDIN`).
    pub fn psql_with_input(&self, sql: &str, input: Option<&Path>) -> String {
        let mut command = Command::new(self.bin.join("psql"));
        command
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "postgres", "-d", "postgres", "-v", "ON_ERROR_STOP=1"])
            .args(["-A", "-t", "-F", ","])
            .args(["-c", sql])
            .env("PGPASSWORD", PASSWORD);
        if let Some(input) = input {
            command.stdin(std::fs::File::open(input).unwrap());
        }
        let out = command.output().unwrap();
        assert!(out.status.success(), "psql {sql}: {}", text(&out));
        String::from_utf8(out.stdout).unwrap()
    }
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = self
            .tool("pg_ctl")
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-m", "immediate", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}
