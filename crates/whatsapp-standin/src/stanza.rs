//! The shapes of what the stand-in says, and small readers for what the client says.

use wacore_binary::{builder::NodeBuilder, Node, NodeContent};

/// The server's JID, the `from` of everything it says.
const SERVER: &str = "s.whatsapp.net";

/// `<success>`: the login is accepted.
pub(crate) fn success(lid: &str, device: u16) -> Node {
    let now = super::unix_now().to_string();
    NodeBuilder::new("success")
        .attrs([
            ("t", now.clone()),
            ("creation", now),
            ("location", "standin".to_owned()),
            ("props", "1".to_owned()),
            ("abprops", "1".to_owned()),
            ("lid", format!("{lid}:{device}@lid")),
            ("display_name", String::new()),
        ])
        .build()
}

/// `<failure reason="401">`: what WhatsApp answers the login of a device it does not know.
pub(crate) fn failure() -> Node {
    NodeBuilder::new("failure")
        .attrs([("reason", "401"), ("location", "standin")])
        .build()
}

/// `<stream:error>` with an optional code and an optional `<conflict type=…>`.
pub(crate) fn stream_error(code: Option<&str>, conflict: Option<&str>) -> Node {
    let mut builder = NodeBuilder::new("stream:error");
    if let Some(code) = code {
        builder = builder.attr("code", code);
    }
    if let Some(kind) = conflict {
        builder = builder.children([NodeBuilder::new("conflict").attr("type", kind).build()]);
    }
    builder.build()
}

/// Another client took the session over.
pub(crate) fn replaced() -> Node {
    stream_error(None, Some("replaced"))
}

/// The phone removed this linked device.
pub(crate) fn removed() -> Node {
    stream_error(Some("401"), Some("device_removed"))
}

/// `<iq type="set" xmlns="md"><pair-device><ref>…</ref>…` — the refs the client shows as QR.
pub(crate) fn pair_device(iq_id: &str, refs: &[String]) -> Node {
    NodeBuilder::new("iq")
        .attrs([
            ("from", SERVER),
            ("type", "set"),
            ("id", iq_id),
            ("xmlns", "md"),
        ])
        .children([NodeBuilder::new("pair-device")
            .children(
                refs.iter()
                    .map(|r| NodeBuilder::new("ref").bytes(r.as_bytes()).build()),
            )
            .build()])
        .build()
}

/// `<iq type="set" xmlns="md"><pair-success>…` — the phone linked the client as `user:device`.
pub(crate) fn pair_success(
    iq_id: &str,
    user: &str,
    device: u16,
    lid: &str,
    identity: Vec<u8>,
) -> Node {
    NodeBuilder::new("iq")
        .attrs([
            ("from", SERVER.to_owned()),
            ("type", "set".to_owned()),
            ("id", iq_id.to_owned()),
            ("xmlns", "md".to_owned()),
            ("t", super::unix_now().to_string()),
        ])
        .children([NodeBuilder::new("pair-success")
            .children([
                NodeBuilder::new("device-identity").bytes(identity).build(),
                NodeBuilder::new("platform").attr("name", "android").build(),
                NodeBuilder::new("device")
                    .attrs([
                        ("jid", format!("{user}:{device}@{SERVER}")),
                        ("lid", format!("{lid}:{device}@lid")),
                    ])
                    .build(),
            ])
            .build()])
        .build()
}

/// `<iq type="result">` answering `request` (same id); add children to it.
pub(crate) fn result(request: &Node) -> NodeBuilder {
    NodeBuilder::new("iq").attrs([
        ("from", SERVER.to_owned()),
        ("type", "result".to_owned()),
        ("id", attr(request, "id").unwrap_or_default()),
    ])
}

/// `<iq type="error"><error code=… text=…/>` answering `request`.
pub(crate) fn error(request: &Node, code: u16, text: &str) -> Node {
    NodeBuilder::new("iq")
        .attrs([
            ("from", SERVER.to_owned()),
            ("type", "error".to_owned()),
            ("id", attr(request, "id").unwrap_or_default()),
        ])
        .children([NodeBuilder::new("error")
            .attrs([("code", code.to_string()), ("text", text.to_owned())])
            .build()])
        .build()
}

/// Everyone may see everything; read receipts on.
pub(crate) fn privacy() -> Node {
    let categories = [
        ("last", "all"),
        ("online", "all"),
        ("profile", "all"),
        ("status", "all"),
        ("readreceipts", "all"),
        ("groupadd", "all"),
        ("calladd", "all"),
    ];
    NodeBuilder::new("privacy")
        .children(categories.into_iter().map(|(name, value)| {
            NodeBuilder::new("category")
                .attrs([("name", name), ("value", value)])
                .build()
        }))
        .build()
}

/// A usync answer. Users that are accounts here are left out, which for the own-device-list
/// sync means "unchanged"; any other phone number is a contact with one device, its phone
/// (device 0), listed when the query asks for devices.
pub(crate) fn usync(query: Option<&Node>, is_account: impl Fn(&str) -> bool) -> Node {
    let sid = query.and_then(|q| attr(q, "sid")).unwrap_or_default();
    let wants_devices = query
        .and_then(|q| q.get_optional_child("query"))
        .is_some_and(|q| q.get_optional_child("devices").is_some());
    let contacts = query
        .and_then(|q| q.get_optional_child("list"))
        .into_iter()
        .flat_map(|l| l.get_children_by_tag("user"))
        .filter_map(|u| attr(u, "jid"))
        .filter(|jid| {
            jid.split_once('@').is_some_and(|(user, server)| {
                server == SERVER
                    && !user.contains(':')
                    && !user.is_empty()
                    && user.bytes().all(|b| b.is_ascii_digit())
                    && !is_account(user)
            })
        })
        .map(|jid| {
            let mut user = NodeBuilder::new("user").attr("jid", jid);
            if wants_devices {
                user = user.children([NodeBuilder::new("devices")
                    .children([NodeBuilder::new("device-list")
                        .children([NodeBuilder::new("device").attr("id", "0").build()])
                        .build()])
                    .build()]);
            }
            user.build()
        });
    NodeBuilder::new("usync")
        .attrs([
            ("sid", sid),
            ("index", "0".to_owned()),
            ("last", "true".to_owned()),
        ])
        .children([
            empty("result"),
            NodeBuilder::new("list").children(contacts).build(),
        ])
        .build()
}

/// `<message from=contact type="text"><enc v="2" type=pkmsg|msg>` — a contact's text for a
/// linked device; `offline` when it comes from the queue at login.
pub(crate) fn text_message(
    from: &str,
    id: &str,
    t: u64,
    kind: &str,
    ciphertext: &[u8],
    offline: bool,
) -> Node {
    let mut attrs = vec![
        ("from", format!("{from}@{SERVER}")),
        ("id", id.to_owned()),
        ("t", t.to_string()),
        ("type", "text".to_owned()),
    ];
    if offline {
        attrs.push(("offline", "1".to_owned()));
    }
    NodeBuilder::new("message")
        .attrs(attrs)
        .children([NodeBuilder::new("enc")
            .attrs([("v", "2"), ("type", kind)])
            .bytes(ciphertext.to_vec())
            .build()])
        .build()
}

/// `<ib><offline_preview count=N message=N …/>`: the size of the backlog about to come.
pub(crate) fn offline_preview(count: usize) -> Node {
    let count = count.to_string();
    NodeBuilder::new("ib")
        .children([NodeBuilder::new("offline_preview")
            .attrs([
                ("count", count.clone()),
                ("message", count),
                ("notification", "0".to_owned()),
                ("receipt", "0".to_owned()),
                ("call", "0".to_owned()),
                ("appdata", "0".to_owned()),
            ])
            .build()])
        .build()
}

/// `<ib><offline count=N/>`: the backlog is through.
pub(crate) fn offline_end(count: usize) -> Node {
    NodeBuilder::new("ib")
        .children([NodeBuilder::new("offline")
            .attr("count", count.to_string())
            .build()])
        .build()
}

/// `<ack class="message" id=… from=to t=…>`: the server took the client's message.
pub(crate) fn message_ack(id: &str, to: &str) -> Node {
    NodeBuilder::new("ack")
        .attrs([
            ("class", "message".to_owned()),
            ("id", id.to_owned()),
            ("from", to.to_owned()),
            ("t", super::unix_now().to_string()),
        ])
        .build()
}

/// Every collection asked for, empty (no snapshot, no patches): the account has no app state.
pub(crate) fn app_state(sync: Option<&Node>) -> Node {
    let collections = sync
        .into_iter()
        .flat_map(|s| s.get_children_by_tag("collection"))
        .map(|c| {
            NodeBuilder::new("collection")
                .attrs([
                    ("name", attr(c, "name").unwrap_or_default()),
                    ("version", "0".to_owned()),
                ])
                .build()
        });
    NodeBuilder::new("sync").children(collections).build()
}

pub(crate) fn empty(tag: &'static str) -> Node {
    NodeBuilder::new(tag).build()
}

pub(crate) fn attr(node: &Node, key: &str) -> Option<String> {
    node.attrs.get(key).map(|v| v.as_str().into_owned())
}

/// A node's content as bytes (the decoder may hand short ones over as a string).
pub(crate) fn content(node: &Node) -> &[u8] {
    match &node.content {
        Some(NodeContent::Bytes(bytes)) => bytes,
        Some(NodeContent::String(text)) => text.as_bytes(),
        _ => &[],
    }
}

pub(crate) fn child_content(node: &Node, tag: &str) -> Vec<u8> {
    node.get_optional_child(tag)
        .map(|c| content(c).to_vec())
        .unwrap_or_default()
}
