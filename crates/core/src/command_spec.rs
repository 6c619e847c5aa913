//! A bot's commands as its spec declares them (`--commands FILE`, `commands` in import lines
//! and the API): what the unit's holder registers with the platform (Telegram's
//! `setMyCommands`, Discord's application commands).

use serde::{Deserialize, Serialize};

use crate::InvalidSpec;

/// The most commands a bot declares (Discord's and Telegram's limit).
pub const MAX_COMMANDS: usize = 100;

/// What an option of a command takes.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OptionKind {
    /// Text.
    #[default]
    String,
    /// A whole number.
    Integer,
    /// A number.
    Number,
    /// True or false.
    Boolean,
    /// A user of the platform.
    User,
    /// A channel.
    Channel,
    /// A role.
    Role,
}

/// One option of a command (Discord shows it as a field to fill; Telegram has none: the
/// user writes its value after the command).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct CommandOption {
    /// Its name (the rules of a command's name).
    pub name: String,
    /// What it is for, 1–100 characters.
    pub description: String,
    /// What it takes (`string` by default).
    #[serde(default, rename = "type")]
    pub kind: OptionKind,
    /// Whether it must be given.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub required: bool,
}

/// One command a bot offers.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct CommandSpec {
    /// Its name, without `/`: 1–32 of `a-z`, `0-9` and `_` (what both Telegram and Discord
    /// take).
    pub name: String,
    /// What it does, 1–100 characters (shown in the platform's command menu).
    pub description: String,
    /// Its options (at most 25, the required ones first).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<CommandOption>,
}

/// Whether `n` is a command or option name both platforms take.
fn name_ok(n: &str) -> bool {
    (1..=32).contains(&n.len())
        && n.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

fn description_ok(d: &str) -> bool {
    (1..=100).contains(&d.chars().count()) && !d.trim().is_empty()
}

/// Checks a bot's commands.
///
/// # Errors
/// [`InvalidSpec::Commands`] naming the command and what is wrong (never more than its name).
pub fn check_commands(commands: &[CommandSpec]) -> Result<(), InvalidSpec> {
    let bad = |what: String| Err(InvalidSpec::Commands(what));
    if commands.len() > MAX_COMMANDS {
        return bad(format!("at most {MAX_COMMANDS} commands"));
    }
    for (i, c) in commands.iter().enumerate() {
        if !name_ok(&c.name) {
            return bad(format!("command {i}: a name is 1-32 of a-z, 0-9 and _"));
        }
        if commands[..i].iter().any(|o| o.name == c.name) {
            return bad(format!("command {:?} is given twice", c.name));
        }
        if !description_ok(&c.description) {
            return bad(format!(
                "command {:?}: a description is 1-100 characters",
                c.name
            ));
        }
        if c.options.len() > 25 {
            return bad(format!("command {:?}: at most 25 options", c.name));
        }
        let mut optional_seen = false;
        for (j, o) in c.options.iter().enumerate() {
            if !name_ok(&o.name) || !description_ok(&o.description) {
                return bad(format!(
                    "command {:?}: option {j} needs a name (1-32 of a-z, 0-9, _) and a description (1-100 characters)",
                    c.name
                ));
            }
            if c.options[..j].iter().any(|p| p.name == o.name) {
                return bad(format!(
                    "command {:?}: option {:?} is given twice",
                    c.name, o.name
                ));
            }
            if o.required && optional_seen {
                return bad(format!(
                    "command {:?}: required options come before optional ones",
                    c.name
                ));
            }
            optional_seen |= !o.required;
        }
    }
    Ok(())
}

/// A digest of `commands` that changes when they do (what the unit's holder compares with
/// the one it registered last).
pub fn commands_digest(commands: &[CommandSpec]) -> String {
    // FNV-1a over the canonical JSON: stable across builds, no hasher seed.
    let json = serde_json::to_string(commands).unwrap_or_default();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in json.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}:{}", commands.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cmd(v: serde_json::Value) -> Vec<CommandSpec> {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn commands_follow_both_platforms_rules() {
        let ok = cmd(json!([
            {"name": "start", "description": "Begin"},
            {"name": "weather", "description": "The forecast", "options": [
                {"name": "city", "description": "Where", "required": true},
                {"name": "days", "description": "How many", "type": "integer"}]}
        ]));
        check_commands(&ok).unwrap();
        assert_eq!(ok[1].options[1].kind, OptionKind::Integer);
        assert_ne!(commands_digest(&ok), commands_digest(&ok[..1]));
        assert_eq!(commands_digest(&ok), commands_digest(&ok.clone()));
        for (bad, why) in [
            (json!([{"name": "Start", "description": "x"}]), "a-z"),
            (json!([{"name": "go-on", "description": "x"}]), "a-z"),
            (json!([{"name": "a", "description": ""}]), "description"),
            (
                json!([{"name": "a", "description": "x"}, {"name": "a", "description": "y"}]),
                "twice",
            ),
            (
                json!([{"name": "a", "description": "x", "options": [
                {"name": "o", "description": "x"}, {"name": "p", "description": "y", "required": true}]}]),
                "before",
            ),
        ] {
            let e = check_commands(&cmd(bad)).unwrap_err().to_string();
            assert!(e.contains(why), "{e}");
        }
        let many: Vec<CommandSpec> = (0..101)
            .map(|i| CommandSpec {
                name: format!("c{i}"),
                description: "x".into(),
                options: Vec::new(),
            })
            .collect();
        assert!(check_commands(&many).is_err());
        assert!(serde_json::from_value::<Vec<CommandSpec>>(json!([{"name": "a"}])).is_err());
    }
}
