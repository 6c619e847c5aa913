//! A Redis Sentinel setup on loopback: a primary, a replica and three Sentinels, each a private
//! `redis-server` on a free port (`redis-server FILE --sentinel` for the Sentinels). Every
//! process is killed by its pid, and every directory removed, on drop.
//!
//! The Sentinels declare a primary down after 1 s without an answer, so a failover after a
//! kill -9 takes a few seconds.

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::RedisServer;

/// The name the Sentinels monitor the primary under.
pub const SENTINEL_MASTER: &str = "fleet";

/// A primary, a replica and three Sentinels watching them.
#[derive(Debug)]
pub struct SentinelSetup {
    /// The data servers: the primary first, the replica second (until a failover swaps them).
    servers: Vec<RedisServer>,
    sentinels: Vec<SentinelProc>,
    /// The data servers' password, if they have one.
    password: Option<String>,
    /// The Sentinels' own password, if they have one.
    sentinel_password: Option<String>,
    /// What every data server runs with (after [`RedisServer`]'s defaults).
    data_args: Vec<String>,
}

#[derive(Debug)]
struct SentinelProc {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl Drop for SentinelProc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `redis-cli -p PORT [-a PASSWORD]`.
fn redis_cli(port: u16, password: Option<&str>) -> Command {
    let mut cmd = Command::new("redis-cli");
    cmd.args(["-p", &port.to_string()]);
    if let Some(pw) = password {
        cmd.args(["-a", pw, "--no-auth-warning"]);
    }
    cmd.stderr(Stdio::null());
    cmd
}

/// An output's lines (none when the command could not run).
fn lines(out: std::io::Result<std::process::Output>) -> Vec<String> {
    out.map(|o| {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    })
    .unwrap_or_default()
}

/// `redis-cli -p PORT [-a PASSWORD] ARGS...`, its output's lines (empty when it cannot run).
fn cli_as(port: u16, password: Option<&str>, args: &[&str]) -> Vec<String> {
    lines(redis_cli(port, password).args(args).output())
}

/// `redis-cli -p PORT [-a PASSWORD]` fed `commands` (one per line) on one connection, its
/// output's lines (empty when it cannot run).
fn cli_stdin(port: u16, password: Option<&str>, commands: &str) -> Vec<String> {
    use std::io::Write;
    let Ok(mut child) = redis_cli(port, password)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
    else {
        return Vec::new();
    };
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(commands.as_bytes());
    }
    lines(child.wait_with_output())
}

/// Polls `cond` every 50 ms for up to `limit`.
fn wait_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) -> std::io::Result<()> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if cond() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("Sentinel setup: {what} within {limit:?}"),
    ))
}

impl SentinelSetup {
    /// Starts the five servers and waits until the replica acknowledges the primary's writes
    /// and every Sentinel names the primary ([`SentinelSetup::wait_ready_for_failover`] waits for more).
    ///
    /// # Errors
    /// When `redis-server` or `redis-cli` is missing, or the setup does not come up in 30 s.
    pub fn start() -> std::io::Result<Self> {
        Self::start_with_password(None)
    }

    /// [`SentinelSetup::start`] with `password` on the primary and the replica (`requirepass`,
    /// `masterauth`; the Sentinels get it as `auth-pass` and have none of their own).
    ///
    /// # Errors
    /// As [`SentinelSetup::start`].
    pub fn start_with_password(password: Option<&str>) -> std::io::Result<Self> {
        Self::start_with_passwords(password, None)
    }

    /// [`SentinelSetup::start_with_password`], the Sentinels requiring `sentinel_password`
    /// (`requirepass` in their configuration) as well.
    ///
    /// # Errors
    /// As [`SentinelSetup::start`].
    pub fn start_with_passwords(
        password: Option<&str>,
        sentinel_password: Option<&str>,
    ) -> std::io::Result<Self> {
        Self::launch(1, password, sentinel_password)
    }

    /// [`SentinelSetup::start`] with `replicas` replicas (at least 1): room for two failovers
    /// in a row.
    ///
    /// # Errors
    /// As [`SentinelSetup::start`].
    pub fn start_with_replicas(replicas: usize) -> std::io::Result<Self> {
        Self::launch(replicas.max(1), None, None)
    }

    fn launch(
        replicas: usize,
        password: Option<&str>,
        sentinel_password: Option<&str>,
    ) -> std::io::Result<Self> {
        // A replica's first sync starts at once (the default waits 5 s for more replicas).
        let mut data_args = vec!["--repl-diskless-sync-delay", "0"];
        if let Some(pw) = password {
            data_args.extend(["--requirepass", pw, "--masterauth", pw]);
        }
        let primary = RedisServer::start_with(&data_args)?;
        let primary_port = primary.port().to_string();
        let mut replica_args = vec!["--replicaof", "127.0.0.1", &primary_port];
        replica_args.extend(&data_args);
        let mut servers = vec![primary];
        for _ in 0..replicas {
            let replica = RedisServer::start_with(&replica_args)?;
            wait_until("a replica in sync", Duration::from_secs(30), || {
                cli_as(replica.port(), password, &["INFO", "replication"])
                    .iter()
                    .any(|l| l.trim() == "master_link_status:up")
            })?;
            servers.push(replica);
        }
        let primary = &servers[0];
        // In sync is not yet streaming: after a diskless sync the primary sends a replica its
        // writes only once the replica's first acknowledgement came (up to a second later).
        // Ready when a write reaches every replica (`WAIT`), as grants must (min-replicas).
        let want = replicas.to_string();
        wait_until(
            "every replica acknowledging writes",
            Duration::from_secs(30),
            || {
                // One connection: WAIT counts the replicas that have its client's writes.
                let script = format!("SET testkit:ready 1\nWAIT {want} 100\n");
                cli_stdin(primary.port(), password, &script)
                    .get(1)
                    .and_then(|n| n.trim().parse::<usize>().ok())
                    .is_some_and(|n| n >= replicas)
            },
        )?;
        cli_as(primary.port(), password, &["DEL", "testkit:ready"]);
        let mut sentinels = Vec::new();
        for _ in 0..3 {
            sentinels.push(Self::spawn_sentinel(
                primary.port(),
                password,
                sentinel_password,
            )?);
        }
        let setup = Self {
            servers,
            sentinels,
            password: password.map(str::to_owned),
            sentinel_password: sentinel_password.map(str::to_owned),
            data_args: data_args.iter().map(|a| (*a).to_owned()).collect(),
        };
        Ok(setup)
    }

    /// Waits until every Sentinel knows a replica in sync and the other two (they find each
    /// other through hello messages every 2 s), so a failover can happen at once.
    ///
    /// # Errors
    /// When that takes more than 30 s.
    pub fn wait_ready_for_failover(&self) -> std::io::Result<()> {
        for s in &self.sentinels {
            let port = s.port;
            wait_until(
                "each Sentinel knows a replica in sync and a quorum",
                Duration::from_secs(30),
                || {
                    let master = self.ask(port, &["SENTINEL", "MASTER", SENTINEL_MASTER]);
                    let field = |name: &str| {
                        master
                            .iter()
                            .position(|l| l == name)
                            .and_then(|i| master.get(i + 1))
                            .cloned()
                    };
                    // `SENTINEL REPLICAS`: key and value lines, each replica from `name` on.
                    let listed = self.ask(port, &["SENTINEL", "REPLICAS", SENTINEL_MASTER]);
                    let healthy = listed
                        .split(|l| l == "name")
                        .filter(|r| {
                            let get =
                                |k: &str| r.iter().position(|l| l == k).and_then(|i| r.get(i + 1));
                            get("flags").is_some_and(|f| f == "slave")
                                && get("master-link-status").is_some_and(|m| m == "ok")
                        })
                        .count();
                    healthy >= 1
                        && field("num-other-sentinels").as_deref() == Some("2")
                        && self
                            .ask(port, &["SENTINEL", "CKQUORUM", SENTINEL_MASTER])
                            .first()
                            .is_some_and(|l| l.starts_with("OK"))
                },
            )?;
        }
        Ok(())
    }

    fn spawn_sentinel(
        primary: u16,
        password: Option<&str>,
        own_password: Option<&str>,
    ) -> std::io::Result<SentinelProc> {
        let port = crate::free_port()?;
        let dir = std::env::temp_dir().join(format!(
            "botfleet-sentinel-{}-{}",
            std::process::id(),
            crate::nonce()
        ));
        std::fs::create_dir_all(&dir)?;
        let file = dir.join("sentinel.conf");
        std::fs::write(
            &file,
            format!(
                "port {port}\nbind 127.0.0.1\ndaemonize no\ndir {}\n\
                 sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {primary} 2\n\
                 sentinel down-after-milliseconds {SENTINEL_MASTER} 1000\n\
                 sentinel failover-timeout {SENTINEL_MASTER} 3000\n\
                 sentinel parallel-syncs {SENTINEL_MASTER} 1\n{}{}",
                dir.display(),
                password.map_or(String::new(), |pw| format!(
                    "sentinel auth-pass {SENTINEL_MASTER} {pw}\n"
                )),
                own_password.map_or(String::new(), |pw| format!("requirepass {pw}\n"))
            ),
        )?;
        let child = crate::redis_server::spawn_quiet(
            Command::new("redis-server").arg(&file).arg("--sentinel"),
        )?;
        let s = SentinelProc {
            port,
            dir,
            child: Some(child),
        };
        wait_until(
            "a Sentinel naming the primary",
            Duration::from_secs(10),
            || {
                cli_as(
                    port,
                    own_password,
                    &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SENTINEL_MASTER],
                )
                .get(1)
                    == Some(&primary.to_string())
            },
        )?;
        Ok(s)
    }

    /// `redis-cli` on the Sentinel at `port`.
    fn ask(&self, port: u16, args: &[&str]) -> Vec<String> {
        cli_as(port, self.sentinel_password.as_deref(), args)
    }

    /// `:password@` for URLs, or nothing.
    fn credentials(&self) -> String {
        self.password
            .as_ref()
            .map_or(String::new(), |pw| format!(":{pw}@"))
    }

    /// The Sentinels' URLs, comma-separated (what `--redis-url` takes in sentinel mode), with
    /// the data servers' password if they have one.
    pub fn urls(&self) -> String {
        self.sentinels
            .iter()
            .map(|s| format!("redis://{}127.0.0.1:{}", self.credentials(), s.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The port of the server the Sentinels name as the primary now.
    pub fn primary_port(&self) -> Option<u16> {
        self.sentinels.iter().find_map(|s| {
            self.ask(
                s.port,
                &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SENTINEL_MASTER],
            )
            .get(1)
            .and_then(|p| p.trim().parse().ok())
        })
    }

    /// The primary: the data server the Sentinels name (and that still runs).
    ///
    /// # Panics
    /// When no running server is the primary.
    pub fn primary(&self) -> &RedisServer {
        let port = self.primary_port();
        self.servers
            .iter()
            .find(|s| Some(s.port()) == port && s.pid().is_some())
            .expect("no running primary")
    }

    /// `redis://[:password@]127.0.0.1:<port>` of the primary now.
    pub fn primary_url(&self) -> String {
        format!(
            "redis://{}127.0.0.1:{}",
            self.credentials(),
            self.primary().port()
        )
    }

    /// Kills the primary (SIGKILL) and waits until the Sentinels have promoted a replica and
    /// it answers as a primary; answers how long that took. What the replica had not received
    /// yet is lost, as in a real failover. Then the killed server is started again, empty, as
    /// a replica of the promoted one (as its supervisor would restart it), so the set-up keeps
    /// its replicas.
    ///
    /// # Errors
    /// When no failover happens within 30 s, or the killed server does not start again.
    pub fn kill_primary_and_fail_over(&mut self) -> std::io::Result<Duration> {
        self.wait_ready_for_failover()?;
        let old = self.primary_port();
        let t = Instant::now();
        let killed = self.servers.iter().position(|s| Some(s.port()) == old);
        if let Some(i) = killed {
            self.servers[i].stop();
        }
        self.wait_promoted(old, "a failover")?;
        let took = t.elapsed();
        if let (Some(i), Some(now)) = (killed, self.primary_port()) {
            let mut args = vec![
                "--replicaof".to_owned(),
                "127.0.0.1".into(),
                now.to_string(),
            ];
            args.extend(self.data_args.iter().cloned());
            self.servers[i].restart_with(&args)?;
        }
        Ok(took)
    }

    /// A manual failover (`SENTINEL FAILOVER`): the replica is promoted and the old primary,
    /// still running, becomes its replica (a client still talking to it gets `READONLY` on
    /// writes). Waits until the promoted server answers as the primary; answers how long that
    /// took.
    ///
    /// # Errors
    /// When no failover happens within 30 s.
    pub fn fail_over(&mut self) -> std::io::Result<Duration> {
        self.wait_ready_for_failover()?;
        let old = self.primary_port();
        let t = Instant::now();
        let asked = self.ask(
            self.sentinels[0].port,
            &["SENTINEL", "FAILOVER", SENTINEL_MASTER],
        );
        if asked.first().is_none_or(|l| l != "OK") {
            return Err(std::io::Error::other(format!(
                "SENTINEL FAILOVER answered {asked:?}"
            )));
        }
        self.wait_promoted(old, "a manual failover")?;
        Ok(t.elapsed())
    }

    /// Waits (30 s at most) until the Sentinels name a primary other than `old` and it answers
    /// `ROLE` as one.
    fn wait_promoted(&self, old: Option<u16>, what: &str) -> std::io::Result<()> {
        wait_until(what, Duration::from_secs(30), || {
            let now = self.primary_port();
            now.is_some()
                && now != old
                && now.is_some_and(|p| {
                    cli_as(p, self.password.as_deref(), &["ROLE"])
                        .first()
                        .is_some_and(|l| l == "master")
                })
        })
    }

    /// Freezes every running replica (SIGSTOP; `false`: SIGCONT, it runs again): the primary
    /// keeps them attached but hears no acknowledgement of its writes, as from a replica on a
    /// hung link.
    ///
    /// # Errors
    /// When `kill` cannot be run or refuses.
    pub fn freeze_replicas(&self, frozen: bool) -> std::io::Result<()> {
        let primary = self.primary_port();
        let sig = if frozen { "-STOP" } else { "-CONT" };
        for s in &self.servers {
            let Some(pid) = s.pid().filter(|_| Some(s.port()) != primary) else {
                continue;
            };
            let ok = Command::new("kill")
                .args([sig, &pid.to_string()])
                .status()?
                .success();
            if !ok {
                return Err(std::io::Error::other(format!("kill {sig} {pid} failed")));
            }
        }
        Ok(())
    }

    /// Empties every running replica (`FLUSHALL` on each, made writable for that): they go on
    /// receiving new writes but lost everything before, as replicas that missed writes. The
    /// next failover promotes one of them.
    ///
    /// # Errors
    /// When there is no running replica or one refuses.
    pub fn empty_the_replicas(&self) -> std::io::Result<()> {
        let primary = self.primary_port();
        let replicas: Vec<&RedisServer> = self
            .servers
            .iter()
            .filter(|s| s.pid().is_some() && Some(s.port()) != primary)
            .collect();
        if replicas.is_empty() {
            return Err(std::io::Error::other("no running replica"));
        }
        let pw = self.password.as_deref();
        for replica in replicas {
            for args in [
                &["CONFIG", "SET", "replica-read-only", "no"][..],
                &["FLUSHALL"][..],
            ] {
                let out = cli_as(replica.port(), pw, args);
                if out.first().is_none_or(|l| l != "OK") {
                    return Err(std::io::Error::other(format!("{args:?} answered {out:?}")));
                }
            }
        }
        Ok(())
    }
}
