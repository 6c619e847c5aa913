//! Interactions: application commands and message components (`INTERACTION_CREATE`) in, and
//! their answers out (the interaction response within Discord's 3 s, deferred when the handler
//! takes longer, then edits of the original response or follow-ups).
//!
//! ```text
//! type 2 (command)   → kind `command`: {name, args, options}
//! type 3 (component) → kind `action`: {id: custom_id, value: custom_id, message_id}
//! answer             → callback 4 (ephemeral: flags 64); after a deferral: the original
//!                      response edited (command; ephemeral: deleted, then a follow-up) or
//!                      a follow-up (component); after an answer: a follow-up
//! defer              → callback 5 (command: "thinking…") or 6 (component: nothing shown)
//! acknowledge        → component: callback 6; command: callback 5, then the original deleted
//! ```
//!
//! The interaction's token (what answers it, for 15 minutes) travels in the event's
//! `answer_handle`: journaled, never shown to a handler.

use botfleet_core::{ActionEvent, BotId, ChatKey, Command, EventKind, Inbound, Platform};
use botfleet_platform::Received;
use serde_json::{json, Map, Value};

use crate::{DiscordApi, DiscordClient, DiscordError};

/// An interaction response's flag: only the user who acted sees it.
const EPHEMERAL: u64 = 1 << 6;

/// Discord's code for an interaction answered before.
const ALREADY_ACKNOWLEDGED: u64 = 40060;

/// What answers an interaction: its kind, the application, its id and its token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Handle<'a> {
    /// A command (`c`) or a component (`m`).
    command: bool,
    app: &'a str,
    id: &'a str,
    token: &'a str,
}

impl<'a> Handle<'a> {
    /// [`Handle::parse`], refusing what does not parse.
    fn read(s: &'a str) -> Result<Self, DiscordError> {
        Self::parse(s).ok_or(DiscordError::Rejected {
            what: "interaction",
            status: 400,
            code: 0,
        })
    }

    /// Reads an event's `answer_handle` (`{c|m}:{application}:{id}:{token}`).
    pub(crate) fn parse(s: &'a str) -> Option<Self> {
        let mut parts = s.splitn(4, ':');
        let kind = parts.next()?;
        let (app, id, token) = (parts.next()?, parts.next()?, parts.next()?);
        let digits = |x: &str| !x.is_empty() && x.bytes().all(|b| b.is_ascii_digit());
        let token_ok = !token.is_empty()
            && token
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        (matches!(kind, "c" | "m") && digits(app) && digits(id) && token_ok).then_some(Self {
            command: kind == "c",
            app,
            id,
            token,
        })
    }
}

/// An `INTERACTION_CREATE` dispatch's `d` as an event: `Ok(None)` for interactions the bot
/// does not answer (pings, autocomplete, modals, a bot's), `Err` for one that cannot be read.
pub fn parse_interaction(bot: &BotId, d: &Value) -> Result<Option<Received>, String> {
    let kind = d["type"].as_u64().ok_or("interaction without type")?;
    if kind != 2 && kind != 3 {
        return Ok(None);
    }
    let field = |v: &Value, what: &str| -> Result<String, String> {
        v.as_str()
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| format!("interaction without {what}"))
    };
    let id = field(&d["id"], "id")?;
    let token = field(&d["token"], "token")?;
    let app = field(&d["application_id"], "application_id")?;
    let channel = d["channel_id"]
        .as_str()
        .or_else(|| d["channel"]["id"].as_str())
        .filter(|c| !c.is_empty())
        .ok_or("interaction without a channel")?
        .to_owned();
    let user = d["member"]["user"]
        .get("id")
        .or_else(|| d["user"].get("id"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    if d["member"]["user"]["bot"] == true || d["user"]["bot"] == true {
        return Ok(None);
    }
    let handle = format!("{}:{app}:{id}:{token}", if kind == 2 { "c" } else { "m" });
    if Handle::parse(&handle).is_none() {
        return Err("interaction with an unusable id or token".into());
    }
    let sent_at_ms = id
        .parse::<u64>()
        .ok()
        .map(|s| i64::try_from((s >> 22) + 1_420_070_400_000).unwrap_or(0));
    let data = &d["data"];
    let mut ev = Inbound::message(
        Platform::Discord,
        ChatKey::new(bot.clone(), channel),
        id.clone(),
        user,
        String::new(),
        sent_at_ms,
    );
    if kind == 2 {
        let name = field(&data["name"], "a command name")?;
        let (args, options) = options_of(data);
        ev.text = format!("/{name} {args}").trim_end().to_owned();
        ev.kind = EventKind::Command;
        ev.command = Some(Box::new(Command {
            name,
            args,
            options,
        }));
    } else {
        let custom_id = field(&data["custom_id"], "a custom_id")?;
        let message = field(&d["message"]["id"], "its message")?;
        // A select's choice, or the button's own id.
        let value = data["values"][0]
            .as_str()
            .map_or_else(|| custom_id.clone(), str::to_owned);
        ev.kind = EventKind::Action;
        ev.action = Some(Box::new(ActionEvent {
            id: custom_id,
            value,
            message_ref: None,
            message_id: Some(message),
        }));
    }
    ev.answer_handle = Some(handle.into());
    Ok(Some(Received {
        key: format!("int:{id}"),
        message: ev,
    }))
}

/// A command's arguments (a subcommand's and its group's names, then the values given, as
/// text) and its options by name (a subcommand's own).
fn options_of(data: &Value) -> (String, Map<String, Value>) {
    let mut path = Vec::new();
    let mut options = &data["options"];
    // Subcommand groups (2) hold subcommands (1), which hold the values.
    for _ in 0..2 {
        match options[0]["type"].as_u64() {
            Some(1 | 2) => {
                if let Some(n) = options[0]["name"].as_str() {
                    path.push(n.to_owned());
                }
                options = &options[0]["options"];
            }
            _ => break,
        }
    }
    let mut map = Map::new();
    for o in options.as_array().into_iter().flatten() {
        if let (Some(n), Some(v)) = (o["name"].as_str(), o.get("value")) {
            map.insert(n.to_owned(), v.clone());
        }
    }
    if let Some(t) = data["target_id"].as_str() {
        // A context-menu command: what it was used on.
        map.insert("target_id".into(), json!(t));
    }
    let values = map.values().map(|v| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    });
    let args: Vec<String> = path.into_iter().chain(values).collect();
    (args.join(" "), map)
}

/// Whether `e` says the interaction was answered before.
fn already(e: &DiscordError) -> bool {
    matches!(e, DiscordError::Rejected { code, .. } if *code == ALREADY_ACKNOWLEDGED)
}

/// What an answer says.
pub(crate) struct Reply<'a> {
    /// Its text (none: an acknowledgement that shows nothing).
    pub(crate) text: Option<&'a str>,
    /// Only the user who acted sees it.
    pub(crate) ephemeral: bool,
    /// Its buttons, as message components.
    pub(crate) components: Option<Value>,
    /// Files shown with its text.
    pub(crate) files: &'a [botfleet_core::Upload],
}

/// The id of the message in a webhook's answer (a follow-up or an edit of one).
fn message_id(v: &Value) -> Option<String> {
    v["id"].as_str().map(str::to_owned)
}

/// The message body of an answer: `text` (cut to 2,000 characters) with the reply's
/// components, ephemeral when asked (`ephemeral` here: an edit keeps what the response was).
fn message(text: &str, r: &Reply<'_>, ephemeral: bool) -> Value {
    let mut data = json!({ "content": text.chars().take(2000).collect::<String>() });
    if ephemeral {
        data["flags"] = json!(EPHEMERAL);
    }
    if let Some(c) = &r.components {
        data["components"] = c.clone();
    }
    data
}

/// Answers the interaction of `handle`: `text` as its response (or, once deferred, as the
/// edit of the original response to a command, a follow-up to a component); without a
/// text, acknowledges it and leaves nothing shown. Once `answered`, a text is a follow-up.
/// Answers the id of the message that shows the text (none for an acknowledgement).
///
/// An ephemeral text after a command was deferred (its "thinking…" shown to everyone, which
/// an edit cannot hide) replaces the "thinking…": the original is deleted, and the text
/// follows up to the user alone.
///
/// # Errors
/// As [`DiscordClient::create_message`]; `Rejected` for a handle that does not parse.
pub(crate) async fn answer(
    client: &DiscordClient,
    api: &DiscordApi,
    handle: &str,
    reply: &Reply<'_>,
    deferred: bool,
    answered: bool,
) -> Result<Option<String>, DiscordError> {
    let h = Handle::read(handle)?;
    let files = reply.files;
    // Something to show: a text, or files alone.
    let text = reply.text.filter(|t| !t.is_empty() || !files.is_empty());
    let ephemeral = reply.ephemeral;
    let hook = (h.app, h.token, "");
    let original = (h.app, h.token, "/messages/@original");
    let webhook = |method, to, body| async move {
        client
            .interaction_webhook(api, method, to, Some(body), files)
            .await
            .map(|v| message_id(&v))
    };
    if answered {
        // After the first answer, a text is one more message under it.
        return match text {
            Some(t) => webhook(reqwest::Method::POST, hook, message(t, reply, ephemeral)).await,
            None => Ok(None),
        };
    }
    if !deferred {
        let (body, shown) = match (text, h.command) {
            (Some(t), _) => (
                json!({ "type": 4, "data": message(t, reply, ephemeral) }),
                files,
            ),
            (None, false) => (json!({ "type": 6 }), &[][..]),
            (None, true) => (json!({ "type": 5 }), &[][..]),
        };
        match client
            .interaction_callback(api, h.id, h.token, body, shown)
            .await
        {
            Ok(v) if text.is_some() => {
                return Ok(v["resource"]["message"]["id"].as_str().map(str::to_owned))
            }
            Ok(_) if !h.command => return Ok(None),
            // A command acknowledged with nothing to say: its "thinking…" goes, below.
            Ok(_) => {}
            // Answered before (a deferral by a worker that died): follow up instead.
            Err(e) if already(&e) => {}
            Err(e) => return Err(e),
        }
    }
    let delete_original = || async {
        match client
            .interaction_webhook(api, reqwest::Method::DELETE, original, None, &[])
            .await
        {
            Err(DiscordError::Rejected { status: 404, .. }) => Ok(()),
            r => r.map(|_| ()),
        }
    };
    match (text, h.command) {
        (Some(t), true) if ephemeral => {
            // Deleted first: the first follow-up after a deferral would edit the
            // "thinking…" and keep it visible to everyone.
            delete_original().await?;
            webhook(reqwest::Method::POST, hook, message(t, reply, true)).await
        }
        (Some(t), true) => {
            webhook(reqwest::Method::PATCH, original, message(t, reply, false)).await
        }
        (Some(t), false) => {
            webhook(reqwest::Method::POST, hook, message(t, reply, ephemeral)).await
        }
        // A command acknowledged with nothing to say: its "thinking…" goes.
        (None, true) => delete_original().await.map(|()| None),
        (None, false) => Ok(None),
    }
}

/// Edits (a `content` and `components` body) or deletes (`None`) message `id`, an answer to
/// the interaction of `handle`, through the interaction's webhook: the one way to change an
/// ephemeral answer, or one in a channel the bot may not post in. `Ok(false)` when the
/// interaction's token no longer answers (15 minutes on): the caller goes through the
/// channel instead.
///
/// # Errors
/// As [`answer`]; a message gone is `Rejected` with status 404.
pub(crate) async fn change(
    client: &DiscordClient,
    api: &DiscordApi,
    handle: &str,
    id: &str,
    body: Option<Value>,
) -> Result<bool, DiscordError> {
    let (Some(h), true) = (
        Handle::parse(handle),
        !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()),
    ) else {
        return Ok(false);
    };
    let path = format!("/messages/{id}");
    let method = if body.is_some() {
        reqwest::Method::PATCH
    } else {
        reqwest::Method::DELETE
    };
    match client
        .interaction_webhook(api, method, (h.app, h.token, &path), body, &[])
        .await
    {
        Ok(_) => Ok(true),
        // The token is gone (401 50027) or unknown (404 10015): not the message.
        Err(DiscordError::Rejected { status, code, .. })
            if status == 401 || (status == 404 && code == UNKNOWN_WEBHOOK) =>
        {
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// Discord's code for a webhook (an interaction's token) it does not know.
const UNKNOWN_WEBHOOK: u64 = 10015;

/// Acknowledges the interaction of `handle` before its answer (callback 5 for a command:
/// Discord shows the bot thinking; 6 for a component: nothing shown). One answered before
/// is fine.
///
/// # Errors
/// As [`answer`].
pub(crate) async fn defer(
    client: &DiscordClient,
    api: &DiscordApi,
    handle: &str,
) -> Result<(), DiscordError> {
    let h = Handle::read(handle)?;
    let body = json!({ "type": if h.command { 5 } else { 6 } });
    match client
        .interaction_callback(api, h.id, h.token, body, &[])
        .await
    {
        Err(e) if already(&e) => Ok(()),
        r => r.map(|_| ()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bot() -> BotId {
        BotId::new("d").unwrap()
    }

    #[test]
    fn commands_and_components_become_events_with_their_token_kept_apart() {
        let cmd = json!({"id": "1200000000000000001", "application_id": "77", "type": 2,
            "token": "tok-abc_1.x", "channel_id": "42", "member": {"user": {"id": "9"}},
            "data": {"id": "5", "name": "weather", "type": 1, "options": [
                {"name": "city", "type": 3, "value": "Oslo"}, {"name": "days", "type": 4, "value": 3}]}});
        let r = parse_interaction(&bot(), &cmd).unwrap().unwrap();
        assert_eq!(r.key, "int:1200000000000000001");
        let m = r.message;
        assert_eq!(m.kind, EventKind::Command);
        let c = m.command.as_deref().unwrap();
        assert_eq!((c.name.as_str(), c.args.as_str()), ("weather", "Oslo 3"));
        assert_eq!(c.options["days"], 3);
        assert_eq!(m.text, "/weather Oslo 3");
        assert_eq!(
            m.answer_handle.as_deref(),
            Some("c:77:1200000000000000001:tok-abc_1.x")
        );
        assert!(!serde_json::to_string(&m.command)
            .unwrap()
            .contains("tok-abc"));
        let sub = json!({"id": "2", "application_id": "77", "type": 2, "token": "t",
            "channel": {"id": "43"}, "user": {"id": "9"},
            "data": {"name": "admin", "options": [{"name": "ban", "type": 1, "options": [
                {"name": "who", "type": 6, "value": "555"}]}]}});
        let c = parse_interaction(&bot(), &sub).unwrap().unwrap().message;
        let cmd = c.command.as_deref().unwrap();
        assert_eq!((cmd.args.as_str(), c.chat.chat.as_str()), ("ban 555", "43"));
        let press = json!({"id": "3", "application_id": "77", "type": 3, "token": "t",
            "channel_id": "42", "member": {"user": {"id": "9"}},
            "message": {"id": "888"}, "data": {"custom_id": "buy:3", "component_type": 2}});
        let p = parse_interaction(&bot(), &press).unwrap().unwrap().message;
        let a = p.action.as_deref().unwrap();
        assert_eq!(
            (p.kind, a.value.as_str(), a.message_id.as_deref()),
            (EventKind::Action, "buy:3", Some("888"))
        );
        assert_eq!(p.answer_handle.as_deref(), Some("m:77:3:t"));
        let ping = json!({"id": "4", "type": 1, "token": "t", "application_id": "77"});
        assert_eq!(parse_interaction(&bot(), &ping).unwrap(), None);
        for bad in [
            json!({"type": 2}),
            json!({"id": "5", "application_id": "77", "type": 2, "token": "t/../x",
                "channel_id": "42", "data": {"name": "x"}}),
            json!({"id": "6", "application_id": "77", "type": 3, "token": "t", "channel_id": "42",
                "data": {"custom_id": "x"}}),
        ] {
            assert!(parse_interaction(&bot(), &bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn handles_read_back_and_refuse_junk() {
        let h = Handle::parse("m:77:3:tok").unwrap();
        assert!(!h.command && h.app == "77" && h.id == "3" && h.token == "tok");
        for bad in ["", "x:1:2:t", "c:a:2:t", "c:1:2:", "c:1:2:t?x", "c:1"] {
            assert!(Handle::parse(bad).is_none(), "{bad}");
        }
    }
}
