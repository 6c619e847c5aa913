//! The example runs and shows a stale leader's write refused.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[test]
fn a_stale_leaders_write_is_refused() {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_example-leader-election"))
        .env_remove("BOTFLEET_REDIS_URL")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("late write under fence"), "{out}");
    assert!(out.contains("not the leader"), "{out}");
}
