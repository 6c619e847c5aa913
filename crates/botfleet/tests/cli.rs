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
