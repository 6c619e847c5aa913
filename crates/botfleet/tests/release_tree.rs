//! The release binary can never link the WhatsApp Web stand-in, which turns off the client's
//! check of WhatsApp's server certificate: `botfleet`'s normal and build dependencies (every
//! feature on) hold no stand-in and no `danger-*` feature. The benchmark, which does link it,
//! shows both in the same listing, so the check is seen to see them.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::process::Command;

fn tree(package: &str, all_features: bool) -> String {
    listing(Some(package), all_features)
}

/// `cargo tree` of `package`, or (`None`) of what a plain command at the workspace's root
/// selects: its default members, with their features resolved together as a build does.
fn listing(package: Option<&str>, all_features: bool) -> String {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .args(["tree", "--offline", "-e", "normal,build,features"]);
    if let Some(p) = package {
        cmd.args(["-p", p]);
    }
    if all_features {
        cmd.arg("--all-features");
    }
    let out = cmd.output().expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree {package:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn unsafe_lines(tree: &str) -> Vec<&str> {
    tree.lines()
        .filter(|l| l.contains("standin") || l.contains("danger-"))
        .collect()
}

#[test]
fn the_release_binary_links_no_stand_in_and_no_danger_feature() {
    for all in [false, true] {
        let t = tree("botfleet", all);
        assert!(
            t.contains("botfleet-whatsapp v") && t.contains("botfleet-runtime v"),
            "the listing names the dependencies: {t}"
        );
        if all {
            assert!(t.contains("wacore v"), "device-link is in it: {t}");
        }
        assert_eq!(unsafe_lines(&t), Vec::<&str>::new(), "all features: {all}");
    }
    let bench = tree("botfleet-bench", false);
    let seen = unsafe_lines(&bench);
    assert!(
        seen.iter().any(|l| l.contains("botfleet-whatsapp-standin"))
            && seen
                .iter()
                .any(|l| l.contains("danger-skip-cert-chain-verify")),
        "the benchmark links the stand-in, and the listing shows it: {seen:?}"
    );
}

/// `cargo build --release` at the root, as a newcomer builds, builds the product: the root
/// selects the worker alone, whose features resolve without the stand-in (a build of every
/// member would take the benchmark's features into the worker too).
#[test]
fn a_plain_build_at_the_root_is_the_product() {
    let t = listing(None, false);
    assert!(
        t.lines()
            .next()
            .is_some_and(|l| l.starts_with("botfleet v")),
        "the root builds the worker: {}",
        t.lines().next().unwrap_or("")
    );
    assert!(
        !t.lines().any(|l| l.starts_with("botfleet-bench v")),
        "and not the benchmark"
    );
    assert_eq!(unsafe_lines(&t), Vec::<&str>::new());
}
