//! docs/configuration.md's table of every flag, environment variable and file key, made from
//! the CLI's own definitions: the test below fails when the page and the CLI drift apart, and
//! writes the table when `BOTFLEET_WRITE_DOCS` is set.

use clap::{Arg, Command, CommandFactory, Parser};

const BEGIN: &str = "<!-- config:begin -->\n";
const END: &str = "<!-- config:end -->";

/// The table: one row per flag of every command, global flags first.
fn table() -> String {
    let mut out = String::from(
        "| command | flag | environment | file key | default | what it sets |\n\
         |---|---|---|---|---|---|\n",
    );
    let root = crate::Cli::command();
    for arg in root.get_arguments() {
        row(&mut out, "every command", arg);
    }
    for sub in root.get_subcommands() {
        walk(&mut out, "botfleet", sub);
    }
    out
}

fn walk(out: &mut String, parent: &str, cmd: &Command) {
    if cmd.is_hide_set() {
        return;
    }
    let path = format!("{parent} {}", cmd.get_name());
    for arg in cmd.get_arguments() {
        row(out, &path, arg);
    }
    for sub in cmd.get_subcommands() {
        walk(out, &path, sub);
    }
}

fn row(out: &mut String, command: &str, arg: &Arg) {
    let Some(long) = arg.get_long() else {
        return; // a positional argument, not a flag
    };
    if arg.is_hide_set() || matches!(long, "help" | "version") {
        return;
    }
    let env = arg
        .get_env()
        .map(|e| format!("`{}`", e.to_string_lossy()))
        .unwrap_or_else(|| "—".into());
    let key = if crate::config::NOT_IN_FILE.contains(&long) {
        "—".into()
    } else {
        format!("`{}`", long.replace('-', "_"))
    };
    let defaults: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|v| format!("`{}`", v.to_string_lossy()))
        .collect();
    let default = if defaults.is_empty() {
        "—".into()
    } else {
        defaults.join(", ")
    };
    let mut what = arg
        .get_help()
        .map(|h| h.to_string())
        .unwrap_or_default()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    if arg.get_action().takes_values() {
        let values: Vec<String> = arg
            .get_possible_values()
            .iter()
            .filter(|v| !v.is_hide_set())
            .map(|v| format!("`{}`", v.get_name()))
            .collect();
        if !values.is_empty() {
            if !what.is_empty() && !what.ends_with('.') {
                what.push('.');
            }
            what.push_str(&format!(" One of {}.", values.join(", ")));
        }
    }
    let what = what.trim().replace('|', "\\|");
    out.push_str(&format!(
        "| `{command}` | `--{long}` | {env} | {key} | {default} | {what} |\n"
    ));
}

#[test]
fn the_configuration_page_lists_every_flag_as_the_cli_defines_it() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/configuration.md");
    let page = std::fs::read_to_string(path).expect("docs/configuration.md");
    let start = page
        .find(BEGIN)
        .expect("docs/configuration.md has the config table markers")
        + BEGIN.len();
    let stop = page[start..].find(END).expect("an end marker") + start;
    let want = table();
    if page[start..stop] == want {
        return;
    }
    if std::env::var_os("BOTFLEET_WRITE_DOCS").is_some() {
        let written = format!("{}{want}{}", &page[..start], &page[stop..]);
        std::fs::write(path, written).expect("docs/configuration.md written");
        return;
    }
    panic!(
        "docs/configuration.md's table differs from the CLI's definitions; write it with \
         `BOTFLEET_WRITE_DOCS=1 cargo test -p botfleet --bin botfleet configuration_page`"
    );
}

#[test]
fn the_table_names_each_flag_with_its_variable_and_key() {
    let t = table();
    assert!(t.contains(
        "| `botfleet worker` | `--lease-ms` | `BOTFLEET_LEASE_MS` | `lease_ms` | `15000` |"
    ));
    assert!(t.contains("| `every command` | `--config` | `BOTFLEET_CONFIG` | — | — |"));
    assert!(t.contains("| `botfleet bots add` | `--token` |"));
    assert!(!t.contains("`--help`"));
}

/// The `botfleet …` command lines of README.md's and docs/'s code blocks, as written (a
/// `\` continues a line; a `# comment` ends it).
fn documented_commands() -> Vec<(String, String)> {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let mut pages = vec![std::path::PathBuf::from(format!("{root}/README.md"))];
    let mut docs: Vec<_> = std::fs::read_dir(format!("{root}/docs"))
        .expect("docs/")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    let mut out = Vec::new();
    for page in pages {
        let text = std::fs::read_to_string(&page).expect("a page");
        let name = page.file_name().map(|n| n.to_string_lossy().into_owned());
        let mut fenced = false;
        let mut pending = String::new();
        for line in text.lines() {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                continue;
            }
            if !fenced {
                continue;
            }
            let line = match line.find(" #") {
                Some(i) => &line[..i],
                None => line,
            };
            let line = line.trim();
            if pending.is_empty() && !line.starts_with("botfleet ") {
                continue;
            }
            if let Some(head) = line.strip_suffix('\\') {
                pending.push_str(head);
                pending.push(' ');
                continue;
            }
            pending.push_str(line);
            out.push((
                name.clone().unwrap_or_default(),
                std::mem::take(&mut pending),
            ));
        }
    }
    out
}

/// A command line's words as a shell splits them (a quoted text is one word, its quotes
/// removed).
fn shell_words(line: &str) -> Vec<String> {
    let (mut out, mut word, mut quote, mut any) = (Vec::new(), String::new(), None, false);
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                any = true;
            }
            (None, c) if c.is_whitespace() => {
                if any || !word.is_empty() {
                    out.push(std::mem::take(&mut word));
                }
                any = false;
            }
            (None, c) => word.push(c),
        }
    }
    if any || !word.is_empty() {
        out.push(word);
    }
    out
}

/// A command line's words: quotes removed, a shell value (`"$TOKEN"`, `$(hostname)`) as
/// `value`, `a|b|c` alternatives as their first, `ID` as a bot id.
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    for w in shell_words(line) {
        let w = w.as_str();
        let w = if w.contains('$') {
            "value".to_owned()
        } else if w.contains('|') && !w.starts_with('-') {
            w.split('|').next().unwrap_or(w).to_owned()
        } else {
            w.to_owned()
        };
        out.push(w);
    }
    out
}

#[test]
fn every_documented_command_line_is_one_the_cli_takes() {
    let commands = documented_commands();
    assert!(commands.len() > 10, "{commands:?}");
    let mut refused = Vec::new();
    for (page, line) in &commands {
        // Placeholders a reader fills in (`…`) are not commands as written.
        if line.contains('…') || line.contains("...") {
            continue;
        }
        if let Err(e) = crate::Cli::try_parse_from(words(line)) {
            if matches!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
            ) {
                continue;
            }
            refused.push(format!(
                "{page}: {line}\n  {}",
                e.render().to_string().lines().next().unwrap_or("")
            ));
        }
    }
    assert!(
        refused.is_empty(),
        "documented commands the CLI refuses:\n{}",
        refused.join("\n")
    );
}
