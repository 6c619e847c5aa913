//! The README and the pages under docs/: the README stays short, and every relative link in
//! them resolves — to a file of the repository, and for `#anchor` to a heading of the page
//! it names (GitHub's anchors: the heading in lower case, spaces as `-`, punctuation dropped,
//! `-1`, `-2` … after repeats).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// README.md and every page under docs/.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("a docs folder")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// The page's text outside fenced code blocks, with line numbers.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

/// GitHub's anchor for a heading's text.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a page's headings.
fn anchors(text: &str) -> Vec<String> {
    let mut seen: Vec<String> = Vec::new();
    let mut out = Vec::new();
    for (_, line) in prose(text) {
        let t = line.trim_start();
        if !t.starts_with('#') {
            continue;
        }
        let base = slug(t.trim_start_matches('#'));
        let n = seen.iter().filter(|s| **s == base).count();
        seen.push(base.clone());
        out.push(if n == 0 { base } else { format!("{base}-{n}") });
    }
    out
}

/// The targets of a line's inline links and images: `[text](target)` and `![alt](target)`.
fn targets(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        let Some(end) = after.find(')') else { break };
        let target = after[..end].split_whitespace().next().unwrap_or("");
        out.push(target.to_owned());
        rest = &after[end..];
    }
    out
}

#[test]
fn every_relative_link_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let dir = page.parent().unwrap();
        for (n, line) in prose(&text) {
            for target in targets(line) {
                if target.contains("://") || target.starts_with("mailto:") || target.is_empty() {
                    continue;
                }
                checked += 1;
                let (file, anchor) = match target.split_once('#') {
                    Some((f, a)) => (f, Some(a)),
                    None => (target.as_str(), None),
                };
                let path = if file.is_empty() {
                    page.clone()
                } else {
                    dir.join(file)
                };
                let at = format!(
                    "{}:{n}: {target}",
                    page.strip_prefix(root()).unwrap_or(&page).display()
                );
                if !path.exists() {
                    broken.push(format!("{at} (no such file)"));
                    continue;
                }
                if let Some(anchor) = anchor {
                    let body = std::fs::read_to_string(&path).unwrap_or_default();
                    if !anchors(&body).iter().any(|a| a == anchor) {
                        broken.push(format!("{at} (no such heading)"));
                    }
                }
            }
        }
    }
    assert!(
        checked > 20,
        "the pages link to each other: {checked} links"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_is_short_and_links_every_page() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(lines <= 250, "README.md has {lines} lines (at most 250)");
    for page in pages().iter().skip(1) {
        let name = page.file_name().unwrap().to_string_lossy();
        assert!(
            readme.contains(&format!("(docs/{name})")),
            "README.md links docs/{name}"
        );
    }
}

#[test]
fn anchors_are_githubs() {
    assert_eq!(
        slug(" Redis behind Sentinel: a failover"),
        "redis-behind-sentinel-a-failover"
    );
    assert_eq!(
        slug("Long turns: timeouts, attempts and typing"),
        "long-turns-timeouts-attempts-and-typing"
    );
    assert_eq!(
        slug("`bots add` and `--shards auto`"),
        "bots-add-and---shards-auto"
    );
    assert_eq!(
        anchors("# A\n```\n# not a heading\n```\n## A\n"),
        ["a", "a-1"]
    );
    assert_eq!(
        targets("see [x](a.md#b) and ![p](docs/p.png \"t\")"),
        ["a.md#b", "docs/p.png"]
    );
}
