//! A process a multi-process test started (a `botfleet worker`), its log in a file.

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
};

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

    /// The last 30 lines of its log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<_> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
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
