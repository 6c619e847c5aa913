//! `--config botfleet.toml`: every flag of a command as a key (`lease_ms = 15000` or
//! `lease-ms = 15000`), below the command line and the environment: flag > `BOTFLEET_*`
//! variable > file > default. The file is checked before anything starts: an unknown key or
//! a bad value is an error naming the file and the key.

use std::{ffi::OsString, path::Path};

use anyhow::{bail, Context};
use clap::CommandFactory;

/// Flags the file cannot set: they select the file or a command's identity.
pub(crate) const NOT_IN_FILE: &[&str] = &["config", "help", "version"];

/// `args` (the process's, program name first) with the keys of the config file they name
/// (`--config PATH`, `--config=PATH` or `BOTFLEET_CONFIG`) added as flags, unless the command
/// line or the environment sets them already. Without a config file, `args` unchanged.
pub(crate) fn apply(args: Vec<OsString>) -> anyhow::Result<Vec<OsString>> {
    let Some((path, sub)) = find(&args) else {
        return Ok(args);
    };
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading the config file {}", path.display()))?;
    let table: toml::Table = toml::from_str(&text).map_err(|e| {
        // The parser's message quotes the offending line, which may hold a secret: keep the
        // position and the kind only.
        let at = e
            .span()
            .map(|s| {
                let line = text[..s.start.min(text.len())].lines().count().max(1);
                format!(" at line {line}")
            })
            .unwrap_or_default();
        anyhow::anyhow!("{}: not valid TOML{at}", path.display())
    })?;
    let root = crate::Cli::command();
    let Some(cmd) = sub
        .iter()
        .try_fold(&root, |c, name| c.find_subcommand(name))
    else {
        return Ok(args);
    };
    let worker = root
        .find_subcommand("worker")
        .context("the worker command")?;
    let mut out = args.clone();
    for (key, value) in &table {
        let flag = key.replace('_', "-");
        let known_here = cmd
            .get_arguments()
            .find(|a| a.get_long() == Some(flag.as_str()));
        let known_anywhere = known_here.is_some()
            || worker
                .get_arguments()
                .any(|a| a.get_long() == Some(flag.as_str()));
        if !known_anywhere || NOT_IN_FILE.contains(&flag.as_str()) {
            bail!(
                "{}: unknown key {:?} (keys are `botfleet worker` flags without the dashes, e.g. lease_ms)",
                path.display(),
                key.chars().take(40).collect::<String>()
            );
        }
        // A key of another command (a worker flag in a `bots` command) is not for this one.
        let Some(arg) = known_here else { continue };
        let given = args.iter().any(|a| {
            let a = a.to_string_lossy();
            a == format!("--{flag}") || a.starts_with(&format!("--{flag}="))
        });
        let in_env = arg.get_env().is_some_and(|e| std::env::var_os(e).is_some());
        if given || in_env {
            continue;
        }
        let value = match value {
            toml::Value::String(s) => s.clone(),
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Float(f) => f.to_string(),
            toml::Value::Boolean(b) => {
                let takes_value = arg.get_action().takes_values();
                if !takes_value {
                    if *b {
                        out.push(format!("--{flag}").into());
                    }
                    continue;
                }
                b.to_string()
            }
            _ => bail!(
                "{}: key {key}: must be a string, a number or true/false",
                path.display()
            ),
        };
        // Check the value alone, so a bad one is reported against the file's key.
        let mut probe: Vec<OsString> = vec!["botfleet".into()];
        probe.extend(sub.iter().map(OsString::from));
        probe.push(format!("--{flag}={value}").into());
        if let Err(e) = crate::Cli::command()
            .ignore_errors(false)
            .try_get_matches_from_mut(probe)
        {
            if e.kind() == clap::error::ErrorKind::ValueValidation
                || e.kind() == clap::error::ErrorKind::InvalidValue
            {
                let why = e.to_string();
                let why = why.lines().next().unwrap_or_default();
                let shown = if arg.is_hide_env_values_set() {
                    "invalid value".to_owned()
                } else {
                    why.trim_start_matches("error: ").to_owned()
                };
                bail!("{}: key {key}: {shown}", path.display());
            }
        }
        out.push(format!("--{flag}={value}").into());
    }
    Ok(out)
}

/// The config file and the subcommand path (`["worker"]`, `["bots", "list"]`) of `args`.
fn find(args: &[OsString]) -> Option<(std::path::PathBuf, Vec<String>)> {
    let mut path = std::env::var_os("BOTFLEET_CONFIG").map(std::path::PathBuf::from);
    let mut sub = Vec::new();
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        let s = a.to_string_lossy();
        if s == "--config" {
            path = it.next().map(|p| Path::new(p).to_path_buf());
        } else if let Some(p) = s.strip_prefix("--config=") {
            path = Some(Path::new(p).to_path_buf());
        } else if !s.starts_with('-') && sub.len() < 2 && is_command(&sub, &s) {
            sub.push(s.into_owned());
        }
    }
    path.filter(|p| !p.as_os_str().is_empty()).map(|p| (p, sub))
}

fn is_command(parent: &[String], name: &str) -> bool {
    let root = crate::Cli::command();
    parent
        .iter()
        .try_fold(&root, |c, n| c.find_subcommand(n))
        .is_some_and(|c| c.find_subcommand(name).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    fn with_file(body: &str, a: &[&str]) -> anyhow::Result<Vec<String>> {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "botfleet-config-{}-{}.toml",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::write(&p, body)?;
        let mut full = args(a);
        full.push("--config".into());
        full.push(p.clone().into());
        let r = apply(full);
        let _ = std::fs::remove_file(&p);
        Ok(r?
            .into_iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect())
    }

    #[test]
    fn the_file_fills_in_what_flags_leave_out() {
        let out = with_file(
            "lease_ms = 5000\ncapacity = 300\nhttp-addr = \"127.0.0.1:0\"\n",
            &["botfleet", "worker", "--capacity", "7"],
        )
        .unwrap();
        assert!(out.contains(&"--lease-ms=5000".to_owned()), "{out:?}");
        assert!(
            out.contains(&"--http-addr=127.0.0.1:0".to_owned()),
            "{out:?}"
        );
        assert!(
            !out.iter().any(|a| a.starts_with("--capacity=")),
            "the flag wins: {out:?}"
        );
        // Keys of the worker that `bots list` lacks are not passed to it.
        let out = with_file(
            "lease_ms = 5000\ndatabase_url = \"memory://\"\n",
            &["botfleet", "bots", "list"],
        )
        .unwrap();
        assert!(
            out.contains(&"--database-url=memory://".to_owned()),
            "{out:?}"
        );
        assert!(!out.iter().any(|a| a.contains("lease")), "{out:?}");
    }

    #[test]
    fn bad_keys_and_values_name_the_key() {
        let e = with_file("lease_msec = 5000\n", &["botfleet", "worker"]).unwrap_err();
        assert!(e.to_string().contains("unknown key \"lease_msec\""), "{e}");
        let e = with_file("lease_ms = 5\n", &["botfleet", "worker"]).unwrap_err();
        assert!(e.to_string().contains("key lease_ms"), "{e}");
        let e = with_file("capacity = [1]\n", &["botfleet", "worker"]).unwrap_err();
        assert!(e.to_string().contains("key capacity"), "{e}");
        let e =
            with_file("redis_url = \"redis://:sekrit@x\n", &["botfleet", "worker"]).unwrap_err();
        assert!(e.to_string().contains("not valid TOML at line 1"), "{e}");
        assert!(!e.to_string().contains("sekrit"), "{e}");
    }
}
