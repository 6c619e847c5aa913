//! Starts a private `redis-server` on a free loopback port, isolated from any system Redis, so
//! tests can stop, restart and freeze it.

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

/// A `redis-server` child process. Killed (by its pid) and its directory removed on drop.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
    /// Arguments after the defaults (`--replicaof HOST PORT`, say).
    extra: Vec<String>,
}

/// A free TCP port on 127.0.0.1 (bound, then released; a race with another process is
/// possible but unlikely, and start-up fails loudly if it happens).
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Spawns `cmd` (a `redis-server`) with its output discarded; a missing binary is an error
/// that says so.
pub(crate) fn spawn_quiet(cmd: &mut Command) -> std::io::Result<Child> {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("cannot start redis-server (is it installed?): {e}"),
            )
        })
}

impl RedisServer {
    /// Starts a server with no persistence on a free port and waits until it answers PING.
    ///
    /// # Errors
    /// When `redis-server` is not installed or does not come up within 10 s.
    pub fn start() -> std::io::Result<Self> {
        Self::start_with(&[])
    }

    /// [`RedisServer::start`] with `args` after the defaults (e.g. `--replicaof 127.0.0.1 P`).
    ///
    /// # Errors
    /// As [`RedisServer::start`].
    pub fn start_with(args: &[&str]) -> std::io::Result<Self> {
        let port = free_port()?;
        let dir = std::env::temp_dir().join(format!(
            "botfleet-redis-{}-{}",
            std::process::id(),
            crate::nonce()
        ));
        std::fs::create_dir_all(&dir)?;
        let mut s = Self {
            port,
            dir,
            child: None,
            extra: args.iter().map(|a| (*a).to_owned()).collect(),
        };
        s.spawn()?;
        Ok(s)
    }

    fn spawn(&mut self) -> std::io::Result<()> {
        let child = spawn_quiet(
            Command::new("redis-server")
                .args(["--port", &self.port.to_string()])
                .args(["--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(&self.dir)
                .args(&self.extra),
        )?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.ping() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("redis-server on port {} did not answer PING", self.port),
        ))
    }

    fn ping(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        if s.write_all(b"PING\r\n").is_err() {
            return false;
        }
        // A server with a password answers NOAUTH: it is up all the same.
        let mut buf = [0u8; 7];
        s.read_exact(&mut buf).is_ok() && (&buf == b"+PONG\r\n" || &buf == b"-NOAUTH")
    }

    /// `FLUSHALL`: every key is lost while the server and its connections stay up, as after
    /// a failover to an empty replica or an operator's mistake.
    ///
    /// # Errors
    /// When the server does not answer `+OK`.
    pub fn flushall(&self) -> std::io::Result<()> {
        match self.command(&["FLUSHALL"])?.as_str() {
            "+OK" => Ok(()),
            other => Err(std::io::Error::other(format!(
                "FLUSHALL answered {other:?}"
            ))),
        }
    }

    /// Sends one command (`args`, as a RESP array) and answers the first line of its reply
    /// (`+OK`, `:1`, `-WRONGTYPE …`, `$5` for a bulk string): for a test to set a key up as a
    /// fault (say, a string where a list is expected).
    ///
    /// # Errors
    /// When the server cannot be reached or does not answer within 5 s.
    pub fn command(&self, args: &[&str]) -> std::io::Result<String> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut req = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            req.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            req.extend_from_slice(a.as_bytes());
            req.extend_from_slice(b"\r\n");
        }
        s.write_all(&req)?;
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        while !line.ends_with(b"\r\n") {
            s.read_exact(&mut byte)?;
            line.push(byte[0]);
        }
        line.truncate(line.len() - 2);
        Ok(String::from_utf8_lossy(&line).into_owned())
    }

    /// Deletes every key matching `pattern` (a `KEYS` glob) in one script, as the node holding
    /// them would lose them on a restart with no data: `{prefix:gK}*` loses one coordination
    /// group's. Answers how many there were.
    ///
    /// # Errors
    /// When the server cannot be reached or does not answer a count.
    pub fn delete_keys(&self, pattern: &str) -> std::io::Result<u64> {
        let said = self.command(&[
            "EVAL",
            "local n = 0 for _, k in ipairs(redis.call('KEYS', ARGV[1])) do redis.call('DEL', k) n = n + 1 end return n",
            "0",
            pattern,
        ])?;
        said.strip_prefix(':')
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("deleting keys answered {said:?}")))
    }

    /// A coordinator on this server with the default key prefix and its keys in `groups`
    /// coordination groups.
    ///
    /// # Errors
    /// When it cannot connect.
    pub async fn coordinator_in_groups(
        &self,
        groups: u16,
    ) -> botfleet_coord::Result<std::sync::Arc<botfleet_coord::RedisCoordinator>> {
        let config = botfleet_coord::RedisConfig::new(self.url()).groups(groups);
        Ok(std::sync::Arc::new(
            botfleet_coord::RedisCoordinator::connect(config).await?,
        ))
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Commands clients have sent so far (`INFO commandstats`), counting an EVALSHA once and not
    /// the commands its Lua script runs inside; `total_commands_processed` counts those too.
    /// Reads it with `redis-cli`; 0 if that is missing.
    pub fn client_round_trips(&self) -> f64 {
        let Ok(out) = Command::new("redis-cli")
            .args(["-p", &self.port.to_string(), "INFO", "commandstats"])
            .output()
        else {
            return 0.0;
        };
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("cmdstat_"))
            .filter_map(|l| l.split_once(":calls="))
            .filter(|(cmd, _)| {
                matches!(
                    *cmd,
                    "evalsha"
                        | "eval"
                        | "script|load"
                        | "xadd"
                        | "xrevrange"
                        | "xread"
                        | "lpop"
                        | "blpop"
                        | "multi"
                        | "ping"
                        | "subscribe"
                )
            })
            .filter_map(|(_, rest)| rest.split(',').next()?.parse::<f64>().ok())
            .sum()
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the server (SIGKILL): every key is lost, clients see connection errors.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Kills the server (if it runs) and starts an empty one on the same port with `args`
    /// after the defaults instead of the ones it had (e.g. `--replicaof` a new primary).
    ///
    /// # Errors
    /// When the new server does not come up.
    pub fn restart_with(&mut self, args: &[String]) -> std::io::Result<()> {
        self.stop();
        self.extra = args.to_vec();
        self.spawn()
    }

    /// Kills the server and starts an empty one on the same port (a restart that lost data).
    ///
    /// # Errors
    /// When the new server does not come up.
    pub fn restart(&mut self) -> std::io::Result<()> {
        self.stop();
        self.spawn()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
