//! The binary's surface: help, version, and clear usage errors.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::process::Command;

fn botfleet(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_botfleet"))
        .env("BOTFLEET_HOOKS_ADDR", "127.0.0.1:0")
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn help_lists_the_commands() {
    let out = botfleet(&["--help"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("Usage: botfleet"), "{text}");
    assert!(text.contains("version"), "{text}");
}

#[test]
fn version_names_the_release_and_backends() {
    let out = botfleet(&["version"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with(&format!("botfleet {}", env!("CARGO_PKG_VERSION"))),
        "{text}"
    );
    assert!(
        text.contains("telegram") && text.contains("sqlite"),
        "{text}"
    );
}

#[test]
fn unknown_commands_are_usage_errors() {
    let out = botfleet(&["frobnicate"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("unrecognized subcommand"), "{err}");
    assert!(out.stdout.is_empty());
}

/// What `botfleet ARGS --help` prints.
fn help(args: &[&str]) -> String {
    let mut a = args.to_vec();
    a.push("--help");
    String::from_utf8(botfleet(&a).stdout).unwrap()
}

/// The subcommands `botfleet ARGS --help` lists (its "Commands:" section, `help` aside).
fn subcommands(args: &[&str]) -> Vec<String> {
    help(args)
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_owned)
        .collect()
}

/// The long flags `botfleet ARGS --help` lists, `--help` and `--version` aside.
fn flags(args: &[&str]) -> Vec<String> {
    help(args)
        .lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let l = l
                .split_once(", ")
                .filter(|(s, _)| s.len() == 2)
                .map_or(l, |(_, r)| r);
            let name = l.strip_prefix("--")?;
            let end = name
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                .unwrap_or(name.len());
            Some(name[..end].to_owned())
        })
        .filter(|f| !f.is_empty() && f != "help" && f != "version")
        .collect()
}

/// Flags no test runs through the binary yet, by command. The list only shrinks: a flag that
/// a test comes to run must leave it (the test below fails until it does). A flag's text is
/// looked for in every test, so one that two commands share counts for both.
const NOT_YET_RUN: &[(&str, &str)] = &[];

/// Every flag of every command is run through the binary by some test of this crate (its
/// text `"--flag"` in a test file), or is listed in [`NOT_YET_RUN`]; a new flag without a test
/// fails here.
#[test]
fn every_flag_is_run_through_the_binary_by_some_test() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut tests = String::new();
    for e in std::fs::read_dir(&dir).unwrap() {
        let path = e.unwrap().path();
        // This file names the flags it lists; it runs none of them.
        if path.extension().is_some_and(|x| x == "rs") && !path.ends_with("cli.rs") {
            tests.push_str(&std::fs::read_to_string(&path).unwrap());
        }
    }
    let mut commands: Vec<Vec<String>> = Vec::new();
    for c in subcommands(&[]) {
        let inner = subcommands(&[&c]);
        if inner.is_empty() {
            commands.push(vec![c]);
        } else {
            commands.extend(inner.into_iter().map(|i| vec![c.clone(), i]));
        }
    }
    assert!(commands.len() > 10, "{commands:?}");
    let (mut missing, mut stale) = (Vec::new(), Vec::new());
    for cmd in &commands {
        let args: Vec<&str> = cmd.iter().map(String::as_str).collect();
        let name = cmd.join(" ");
        for flag in flags(&args) {
            let run = tests.contains(&format!("\"--{flag}\""));
            let listed = NOT_YET_RUN.contains(&(name.as_str(), flag.as_str()));
            if !run && !listed {
                missing.push(format!("{name} --{flag}"));
            }
            if run && listed {
                stale.push(format!("{name} --{flag}"));
            }
        }
    }
    assert!(missing.is_empty(), "flags no test runs: {missing:?}");
    assert!(
        stale.is_empty(),
        "run by a test now: take them off NOT_YET_RUN: {stale:?}"
    );
}
