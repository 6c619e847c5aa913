//! A process a multi-process test started (a `botfleet worker`), its log in a file.

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
};

/// `botfleet worker` (the binary `bin`) as a member of a test fleet: named `name`, on the
/// registry `db`, Redis `redis` and key prefix `prefix`, its HTTP and hooks addresses on ports
/// the OS picks, logging warnings and the worker loop's progress; add the test's own flags
/// (and `RUST_LOG`) to it.
pub fn fleet_worker(bin: &str, name: &str, db: &str, redis: &str, prefix: &str) -> Command {
    let mut cmd = Command::new(bin);
    cmd.args(["worker", "--worker-id", name])
        .args(["--http-addr", "127.0.0.1:0", "--hooks-addr", "127.0.0.1:0"])
        .args([
            "--database-url",
            db,
            "--redis-url",
            redis,
            "--prefix",
            prefix,
        ])
        .env("RUST_LOG", "warn,botfleet_runtime::worker=info")
        .env_remove("BOTFLEET_API_TOKEN");
    cmd
}

/// Resident memory of process `pid` in KiB (`VmRSS`), 0 when it cannot be read.
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// The last 30 lines of every `*.log` file in `dir` (the logs of the workers a test started
/// there), each under its file's name: what a test prints when a wait for the fleet fails.
pub fn log_tails(dir: &std::path::Path) -> String {
    let mut logs: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "log"))
                .collect()
        })
        .unwrap_or_default();
    logs.sort();
    let mut out = String::new();
    for log in logs {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        out.push_str(&format!("--- {}\n{}\n", log.display(), tail(&text, 30)));
    }
    out
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<_> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Whether a write transaction on the SQLite file `db` can begin now (none is held), without
/// waiting for one.
fn sqlite_write_free(db: &std::path::Path) -> bool {
    let Ok(conn) = rusqlite::Connection::open(db) else {
        return false;
    };
    conn.busy_timeout(std::time::Duration::ZERO).is_ok()
        && conn.execute_batch("BEGIN IMMEDIATE; ROLLBACK;").is_ok()
}

/// A child process, killed (after a SIGCONT, in case the test stopped it) when dropped.
#[derive(Debug)]
pub struct Proc {
    /// A name for messages.
    pub name: String,
    /// The process.
    pub child: Child,
    /// Where its standard error goes.
    pub log: PathBuf,
}

impl Proc {
    /// Starts `cmd` as `name`: standard output discarded, standard error into `{dir}/{name}.log`.
    ///
    /// # Panics
    /// When the log cannot be created or the process cannot start.
    pub fn spawn(name: &str, cmd: &mut Command, dir: &std::path::Path) -> Proc {
        let log = dir.join(format!("{name}.log"));
        let child = cmd
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("create the log"))
            .spawn()
            .expect("start the process");
        Proc {
            name: name.into(),
            child,
            log,
        }
    }

    /// Sends `sig` (`-KILL`, `-TERM`, `-STOP`, `-CONT`) to it by pid.
    ///
    /// # Panics
    /// When `kill` fails (the process is gone).
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .expect("run kill")
            .success();
        assert!(ok, "kill {sig} {}", self.name);
    }

    /// Freezes it (SIGSTOP) at a moment it holds no write lock on the SQLite registry `db`.
    ///
    /// Workers on one SQLite file share its one write lock, an OS file lock that a frozen
    /// process keeps: frozen inside a write, it would stall every other worker's writes (and
    /// so their claims) until it runs again, which no fleet logic can fence (see the README's
    /// note on SQLite fleets). A test of what the *fleet* does about a frozen worker freezes
    /// it between writes: stopped, the file is probed with a write transaction that does not
    /// wait; if the lock is taken, it runs on for a millisecond and is stopped again.
    ///
    /// # Panics
    /// When no such moment comes within 10 s, or `kill` fails.
    pub fn freeze_between_writes(&self, db: &std::path::Path) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            self.signal("-STOP");
            // `kill` returns once the signal is queued; a thread running on another core may
            // still take the lock before it stops. Probe only once every thread is stopped.
            if self.wait_stopped(deadline) && sqlite_write_free(db) {
                return;
            }
            self.signal("-CONT");
            assert!(
                std::time::Instant::now() < deadline,
                "{}: the SQLite write lock never free while it was stopped",
                self.name
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Whether every thread of the process is stopped (`T` in `/proc/PID/task/*/stat`),
    /// waiting for that until `deadline`.
    fn wait_stopped(&self, deadline: std::time::Instant) -> bool {
        let tasks = format!("/proc/{}/task", self.child.id());
        loop {
            let all = std::fs::read_dir(&tasks).is_ok_and(|d| {
                d.filter_map(Result::ok).all(|t| {
                    std::fs::read_to_string(t.path().join("stat")).is_ok_and(|s| {
                        // The state follows the command name, which is in parentheses.
                        s.rsplit_once(')').is_some_and(|(_, rest)| {
                            matches!(rest.trim_start().chars().next(), Some('T' | 't'))
                        })
                    })
                })
            });
            if all {
                return true;
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// A `botfleet worker`'s HTTP address (`http://…`), from its first lines (within 20 s).
    pub async fn api_url(&self) -> String {
        let log = self.log.clone();
        crate::wait_for(
            "the worker's address",
            std::time::Duration::from_secs(20),
            || {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                let url = text.lines().find_map(|l| {
                    l.split(" listening on ")
                        .nth(1)
                        .map(|u| u.trim().to_owned())
                });
                async move { url }
            },
        )
        .await
    }

    /// The last 30 lines of its log.
    pub fn log_tail(&self) -> String {
        tail(&std::fs::read_to_string(&self.log).unwrap_or_default(), 30)
    }

    /// The lines of its log that mention `what`.
    pub fn log_about(&self, what: &str) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines()
            .filter(|l| l.contains(what))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
