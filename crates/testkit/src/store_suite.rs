//! The [`Store`] conformance suite, written once and run against every backend through
//! [`store_conformance!`](crate::store_conformance).

use std::{future::Future, sync::Arc};

use botfleet_core::{BotId, BotSpec, BotStatus, Fence, HandlerSpec, Platform, Secret};
use botfleet_store::{
    BotFilter, ChatPause, InboxItem, InboxOutcome, InboxState, InboxStats, Journaled, StatusReport,
    Store, StoreError,
};

use crate::coord_suite::bid;

/// Makes fresh, empty stores of one backend.
pub trait StoreFixture: Send + Sync {
    /// A new empty store (its own file, schema or map).
    fn store(&self) -> impl Future<Output = Arc<dyn Store>> + Send;
}

fn spec(id: &str, platform: Platform) -> BotSpec {
    if platform == Platform::Slack {
        let mut s = BotSpec::new(bid(id), platform, format!("xoxb-{id}-SECRET"));
        s.app_token = Some(Secret::new(format!("xapp-{id}-SECRET")));
        return s;
    }
    BotSpec::new(bid(id), platform, format!("{id}-token:SECRET"))
}

/// A bot comes back exactly as added, with status `pending`.
pub async fn bots_round_trip(s: Arc<dyn Store>) {
    let mut b = spec("b1", Platform::Telegram);
    b.options.api_url = Some("http://127.0.0.1:9/api".into());
    // The commands round-trip with the spec, options and all.
    b.options.commands = serde_json::from_value(serde_json::json!([
        {"name": "start", "description": "Begin"},
        {"name": "find", "description": "Search", "options": [
            {"name": "what", "description": "Words", "required": true},
            {"name": "max", "description": "Results", "type": "integer"}]}
    ]))
    .unwrap();
    // And so do the long-turn settings.
    b.options.handler_timeout_s = Some(600);
    b.options.typing = Some(false);
    b.options.async_reply_ttl_s = Some(60);
    b.options.stream = Some(botfleet_core::StreamMode::Edits);
    // And the bot's own send limits.
    b.options.rate_limits = Some("bot=100/1,group=off".into());
    b.handler = HandlerSpec::Webhook {
        url: "http://127.0.0.1:9/hook".into(),
        secret: Some(Secret::new("hmac-key")),
    };
    s.add_bot(&b).await.unwrap();
    let r = s.get_bot(&bid("b1")).await.unwrap().unwrap();
    assert_eq!(r.spec, b);
    assert_eq!(r.status, BotStatus::Pending);
    assert_eq!(r.last_error, None);
    assert_eq!(r.reported_by, None);
    assert!(r.updated_at_ms > 0);
    assert!(s.get_bot(&bid("nope")).await.unwrap().is_none());
    // A Discord bot's shard count round-trips, and so does going back to `auto`.
    let mut d = spec("d1", Platform::Discord);
    d.options.shards = Some(16);
    d.options.shards_per_slice = Some(4);
    s.add_bot(&d).await.unwrap();
    assert_eq!(s.get_bot(&bid("d1")).await.unwrap().unwrap().spec, d);
    d.options.shards = None;
    d.options.shards_per_slice = None;
    s.update_bot(&d).await.unwrap();
    assert_eq!(
        s.get_bot(&bid("d1"))
            .await
            .unwrap()
            .unwrap()
            .spec
            .options
            .shards,
        None
    );
    let debug = format!("{r:?} {s:?}");
    assert!(
        !debug.contains("SECRET") && !debug.contains("hmac-key"),
        "{debug}"
    );
}

/// Adding an id twice, or an invalid spec, is refused with a clear error.
pub async fn add_refuses_duplicates_and_bad_specs(s: Arc<dyn Store>) {
    s.add_bot(&spec("b1", Platform::Telegram)).await.unwrap();
    match s.add_bot(&spec("b1", Platform::Slack)).await {
        Err(StoreError::AlreadyExists(id)) => assert_eq!(id, bid("b1")),
        other => panic!("expected AlreadyExists, got {other:?}"),
    }
    // The store keeps the rules every platform shares (each platform's own are its
    // descriptor's, checked by the registry before a spec gets here).
    let mut bad = spec("b2", Platform::Telegram);
    bad.token = Secret::new("1:has space");
    let e = s.add_bot(&bad).await.unwrap_err();
    assert!(matches!(e, StoreError::InvalidSpec(_)), "{e:?}");
    assert_eq!(
        e.to_string(),
        "invalid token: contains white space or control characters"
    );
    assert!(s.get_bot(&bid("b2")).await.unwrap().is_none());
}

/// Listing filters by platform and enabled flag, sorted by id.
pub async fn list_filters(s: Arc<dyn Store>) {
    for (id, p, enabled) in [
        ("c", Platform::Telegram, true),
        ("a", Platform::Telegram, false),
        ("b", Platform::Slack, true),
        ("d", Platform::Discord, true),
    ] {
        let mut b = spec(id, p);
        b.enabled = enabled;
        s.add_bot(&b).await.unwrap();
    }
    let ids = |v: Vec<botfleet_core::BotRecord>| -> Vec<String> {
        v.into_iter().map(|r| r.spec.id.to_string()).collect()
    };
    assert_eq!(
        ids(s.list_bots(&BotFilter::default()).await.unwrap()),
        ["a", "b", "c", "d"]
    );
    let tg = BotFilter {
        platform: Some(Platform::Telegram),
        enabled: None,
    };
    assert_eq!(ids(s.list_bots(&tg).await.unwrap()), ["a", "c"]);
    let on = BotFilter {
        platform: Some(Platform::Telegram),
        enabled: Some(true),
    };
    assert_eq!(ids(s.list_bots(&on).await.unwrap()), ["c"]);
    let off = BotFilter {
        platform: None,
        enabled: Some(false),
    };
    assert_eq!(ids(s.list_bots(&off).await.unwrap()), ["a"]);
}

/// Updates replace the spec but keep status and last error; unknown ids are `NotFound`.
pub async fn update_keeps_status(s: Arc<dyn Store>) {
    let mut b = spec("b1", Platform::Telegram);
    s.add_bot(&b).await.unwrap();
    s.set_status(
        &b.id,
        BotStatus::Failed,
        Some("401 Unauthorized"),
        Some("w-1"),
    )
    .await
    .unwrap();
    b.token = Secret::new("new:token");
    b.enabled = false;
    s.update_bot(&b).await.unwrap();
    let r = s.get_bot(&b.id).await.unwrap().unwrap();
    assert_eq!(r.spec, b);
    assert_eq!(r.status, BotStatus::Failed);
    assert_eq!(r.last_error.as_deref(), Some("401 Unauthorized"));
    let ghost = spec("ghost", Platform::Telegram);
    assert!(matches!(
        s.update_bot(&ghost).await,
        Err(StoreError::NotFound(_))
    ));
}

/// Status and last error are recorded and cleared.
pub async fn status_is_recorded(s: Arc<dyn Store>) {
    let b = spec("b1", Platform::Telegram);
    s.add_bot(&b).await.unwrap();
    s.set_status(&b.id, BotStatus::Running, None, Some("w-2"))
        .await
        .unwrap();
    let r = s.get_bot(&b.id).await.unwrap().unwrap();
    assert_eq!((r.status, r.last_error), (BotStatus::Running, None));
    assert_eq!(r.reported_by.as_deref(), Some("w-2"));
    s.set_status(&b.id, BotStatus::Failed, Some("bad token"), None)
        .await
        .unwrap();
    let r = s.get_bot(&b.id).await.unwrap().unwrap();
    assert_eq!(r.last_error.as_deref(), Some("bad token"));
    assert!(matches!(
        s.set_status(&bid("ghost"), BotStatus::Running, None, None)
            .await,
        Err(StoreError::NotFound(_))
    ));
}

/// Removing answers whether the bot existed.
pub async fn remove_bots(s: Arc<dyn Store>) {
    s.add_bot(&spec("b1", Platform::Telegram)).await.unwrap();
    assert!(s.remove_bot(&bid("b1")).await.unwrap());
    assert!(!s.remove_bot(&bid("b1")).await.unwrap());
    assert!(s.get_bot(&bid("b1")).await.unwrap().is_none());
    // The id is free again.
    s.add_bot(&spec("b1", Platform::Slack)).await.unwrap();
}

/// Cursor writes carry fences; an older fence is refused and changes nothing.
pub async fn cursor_writes_are_fenced(s: Arc<dyn Store>) {
    let bot = bid("b1");
    assert!(s.cursor(&bot).await.unwrap().is_none());
    assert_eq!(s.highest_fence(&bot).await.unwrap(), Fence::ZERO);
    s.put_cursor(&bot, "100", Fence(1)).await.unwrap();
    s.put_cursor(&bot, "101", Fence(1)).await.unwrap();
    s.put_cursor(&bot, "200", Fence(3)).await.unwrap();
    match s.put_cursor(&bot, "150", Fence(2)).await {
        Err(StoreError::StaleFence {
            bot: b,
            offered,
            current,
        }) => {
            assert_eq!((b, offered, current), (bot.clone(), Fence(2), Fence(3)));
        }
        other => panic!("expected StaleFence, got {other:?}"),
    }
    let c = s.cursor(&bot).await.unwrap().unwrap();
    assert_eq!((c.value.as_str(), c.fence), ("200", Fence(3)));
    assert_eq!(s.highest_fence(&bot).await.unwrap(), Fence(3));
}

/// Accepting a fence raises the floor before any cursor is written.
pub async fn accept_fence_raises_the_floor(s: Arc<dyn Store>) {
    let bot = bid("b1");
    s.put_cursor(&bot, "7", Fence(2)).await.unwrap();
    s.accept_fence(&bot, Fence(5)).await.unwrap();
    assert_eq!(s.highest_fence(&bot).await.unwrap(), Fence(5));
    assert!(matches!(
        s.put_cursor(&bot, "8", Fence(4)).await,
        Err(StoreError::StaleFence { .. })
    ));
    assert!(matches!(
        s.accept_fence(&bot, Fence(3)).await,
        Err(StoreError::StaleFence { .. })
    ));
    // The cursor value is kept by accept_fence.
    assert_eq!(s.cursor(&bot).await.unwrap().unwrap().value, "7");
    s.accept_fence(&bot, Fence(5)).await.unwrap();
    s.put_cursor(&bot, "9", Fence(6)).await.unwrap();
}

/// Fences outlive the bot: a re-added bot still refuses the old holder's writes.
pub async fn fences_survive_removal(s: Arc<dyn Store>) {
    let b = spec("b1", Platform::Telegram);
    s.add_bot(&b).await.unwrap();
    s.accept_fence(&b.id, Fence(9)).await.unwrap();
    s.remove_bot(&b.id).await.unwrap();
    s.add_bot(&b).await.unwrap();
    assert_eq!(s.highest_fence(&b.id).await.unwrap(), Fence(9));
    assert!(s.put_cursor(&b.id, "x", Fence(8)).await.is_err());
}

/// Concurrent fenced writers: the highest fence wins, whatever the interleaving.
pub async fn concurrent_fenced_writes(s: Arc<dyn Store>) {
    let bot = bid("b1");
    let mut tasks = Vec::new();
    for f in [5u64, 17, 3, 11, 20, 1, 14, 8, 19, 2, 16, 7] {
        let (s, bot) = (s.clone(), bot.clone());
        tasks.push(tokio::spawn(async move {
            let _ = s.put_cursor(&bot, &format!("v{f}"), Fence(f)).await;
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let c = s.cursor(&bot).await.unwrap().unwrap();
    assert_eq!((c.value.as_str(), c.fence), ("v20", Fence(20)));
}

/// Turns held by a unit's claim (polling, socket, gateway, linked-device bots) write the
/// outbox, the state and the entry's end at once like webhook turns, fenced by the bot's
/// claim instead of the chat's fence: a stale holder writes nothing, and a chat's own fence
/// (from webhook turns before a mode change) neither holds a claim's turn up nor is moved.
pub async fn claim_turns_are_fenced_by_the_bot(s: Arc<dyn Store>) {
    use botfleet_store::{StateWrite, TurnFence};
    let bot = bid("poll1");
    s.accept_fence(&bot, Fence(3)).await.unwrap();
    put(&s, &bot, &[item("p1", "c1"), item("p2", "c1")], 3).await;
    let rec = |key: &str, fence: u64, state: Option<(u64, &str)>| {
        replied(key, TurnFence::Claim(Fence(fence)), state)
    };
    // The chat had webhook turns up to fence 50 before the bot went back to polling.
    s.turn_accept(&bot, "c1", Fence(50)).await.unwrap();
    assert_eq!(
        s.turn_record(&bot, &rec("p1", 3, Some((0, r#"{"n":1}"#))))
            .await
            .unwrap(),
        StateWrite::Written(1)
    );
    let v = s.turn_view(&bot, "p1", "c1").await.unwrap();
    // The entry's end is the record of its reply (no outbox row is kept for it).
    assert_eq!(v.entry.map(|e| e.state), Some(InboxState::Done));
    assert_eq!(
        (v.revision, v.state.as_deref(), v.sent),
        (1, Some(r#"{"n":1}"#), false)
    );
    // The chat's fence did not move: a webhook turn under 50 still writes.
    assert!(s.turn_accept(&bot, "c1", Fence(50)).await.is_ok());
    // The bot moved on to fence 4: the old holder writes nothing at all.
    s.accept_fence(&bot, Fence(4)).await.unwrap();
    assert!(matches!(
        s.turn_record(&bot, &rec("p2", 3, Some((1, r#"{"n":2}"#)))).await,
        Err(StoreError::StaleFence { current, .. }) if current == Fence(4)
    ));
    let v = s.turn_view(&bot, "p2", "c1").await.unwrap();
    assert_eq!(v.entry.map(|e| e.state), Some(InboxState::Pending));
    assert_eq!(v.revision, 1, "no state written");
    // The new holder replays it: it sees what its predecessor left and writes on.
    assert_eq!(
        s.turn_record(&bot, &rec("p2", 4, Some((1, r#"{"n":2}"#))))
            .await
            .unwrap(),
        StateWrite::Written(2)
    );
    // A claim's state write is still a compare-and-set on the revision.
    put(&s, &bot, &[item("p3", "c1")], 4).await;
    assert_eq!(
        s.turn_record(&bot, &rec("p3", 4, Some((1, r#"{"n":9}"#))))
            .await
            .unwrap(),
        StateWrite::Stale
    );
    assert_eq!(
        s.turn_view(&bot, "p3", "c1")
            .await
            .unwrap()
            .state
            .as_deref(),
        Some(r#"{"n":2}"#)
    );
}

/// The registry stamp changes on add, update and remove, not on status reports.
pub async fn registry_stamp_tracks_spec_changes(s: Arc<dyn Store>) {
    let empty = s.registry_stamp().await.unwrap();
    assert_eq!(empty.0, 0);
    let mut b = spec("b1", Platform::Telegram);
    s.add_bot(&b).await.unwrap();
    let added = s.registry_stamp().await.unwrap();
    assert_eq!(added.0, 1);
    assert_ne!(added, empty);
    s.set_status(&b.id, BotStatus::Running, None, None)
        .await
        .unwrap();
    assert_eq!(
        s.registry_stamp().await.unwrap(),
        added,
        "status reports do not count"
    );
    // Updates within the same millisecond must still show: wait for the clock to move.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    b.enabled = false;
    s.update_bot(&b).await.unwrap();
    let updated = s.registry_stamp().await.unwrap();
    assert!(updated.1 > added.1, "{updated:?} after {added:?}");
    s.remove_bot(&b.id).await.unwrap();
    assert_eq!(s.registry_stamp().await.unwrap().0, 0);
}

/// The batch calls answer as the single calls would, in order, one answer per item.
pub async fn batch_calls_answer_like_single_calls(s: Arc<dyn Store>) {
    for id in ["b1", "b2", "b3"] {
        s.add_bot(&spec(id, Platform::Telegram)).await.unwrap();
    }
    s.accept_fence(&bid("b2"), Fence(7)).await.unwrap();
    assert_eq!(
        s.highest_fences(&[bid("b1"), bid("b2"), bid("never")])
            .await
            .unwrap(),
        [Fence::ZERO, Fence(7), Fence::ZERO]
    );
    let answers = s
        .accept_fences(&[
            (bid("b1"), Fence(3)),
            (bid("b2"), Fence(5)),
            (bid("b3"), Fence(9)),
        ])
        .await
        .unwrap();
    assert!(answers[0].is_ok() && answers[2].is_ok(), "{answers:?}");
    assert!(
        matches!(&answers[1], Err(StoreError::StaleFence { current, .. }) if *current == Fence(7)),
        "{answers:?}"
    );
    assert_eq!(
        s.highest_fences(&[bid("b1"), bid("b2"), bid("b3")])
            .await
            .unwrap(),
        [Fence(3), Fence(7), Fence(9)]
    );
    let report = |id: &str, status, err: Option<&str>| StatusReport {
        id: bid(id),
        status,
        last_error: err.map(str::to_owned),
        reported_by: Some("w-1".into()),
        spec_at_ms: None,
    };
    let answers = s
        .set_statuses(&[
            report("b1", BotStatus::Running, None),
            report("gone", BotStatus::Running, None),
            report("b3", BotStatus::Failed, Some("401")),
            report("b3", BotStatus::Running, None),
        ])
        .await
        .unwrap();
    assert!(
        matches!(answers[1], Err(StoreError::NotFound(_))),
        "{answers:?}"
    );
    assert!(answers[0].is_ok() && answers[2].is_ok() && answers[3].is_ok());
    let b1 = s.get_bot(&bid("b1")).await.unwrap().unwrap();
    assert_eq!(
        (b1.status, b1.reported_by.as_deref()),
        (BotStatus::Running, Some("w-1"))
    );
    // Applied in order: the last report of b3 wins.
    let b3 = s.get_bot(&bid("b3")).await.unwrap().unwrap();
    assert_eq!((b3.status, b3.last_error), (BotStatus::Running, None));
    // A report made under an older spec (a turn that used the token an operator has since
    // replaced) changes nothing; one made under the current spec applies.
    let at = b3.updated_at_ms;
    let under = |at: i64, status, err: Option<&str>| StatusReport {
        spec_at_ms: Some(at),
        ..report("b3", status, err)
    };
    let answers = s
        .set_statuses(&[
            under(at - 1, BotStatus::Failed, Some("401 with the old token")),
            StatusReport {
                spec_at_ms: Some(at),
                ..report("gone", BotStatus::Failed, None)
            },
        ])
        .await
        .unwrap();
    assert!(answers[0].is_ok(), "stale is not an error: {answers:?}");
    assert!(
        matches!(answers[1], Err(StoreError::NotFound(_))),
        "{answers:?}"
    );
    let b3 = s.get_bot(&bid("b3")).await.unwrap().unwrap();
    assert_eq!((b3.status, b3.last_error), (BotStatus::Running, None));
    s.set_statuses(&[under(at, BotStatus::Failed, Some("401"))])
        .await
        .unwrap();
    let b3 = s.get_bot(&bid("b3")).await.unwrap().unwrap();
    assert_eq!(
        (b3.status, b3.last_error.as_deref()),
        (BotStatus::Failed, Some("401"))
    );
    assert!(s.highest_fences(&[]).await.unwrap().is_empty());
    assert!(s.accept_fences(&[]).await.unwrap().is_empty());
}

/// Journals `items` under a unit's claim `fence`; answers which were new.
async fn put(s: &Arc<dyn Store>, bot: &BotId, items: &[InboxItem], fence: u64) -> Vec<bool> {
    s.journal_put(bot, items, Some(Fence(fence)), None)
        .await
        .unwrap()
        .0
        .iter()
        .map(|j| j.is_new())
        .collect()
}

/// Journals `items` as a webhook delivery (unfenced); answers which were new.
async fn hook_put(s: &Arc<dyn Store>, bot: &BotId, items: &[InboxItem]) -> Vec<bool> {
    s.journal_put(bot, items, None, None)
        .await
        .unwrap()
        .0
        .iter()
        .map(|j| j.is_new())
        .collect()
}

/// Ends the entry `key` under the unit's claim `fence`.
async fn end(
    s: &Arc<dyn Store>,
    bot: &BotId,
    key: &str,
    outcome: InboxOutcome,
    fence: u64,
) -> botfleet_store::Result<botfleet_store::StateWrite> {
    end_in(s, bot, key, "", outcome, fence).await
}

/// [`end`] of an entry of `chat` (a paused end is recorded only while its chat is paused).
async fn end_in(
    s: &Arc<dyn Store>,
    bot: &BotId,
    key: &str,
    chat: &str,
    outcome: InboxOutcome,
    fence: u64,
) -> botfleet_store::Result<botfleet_store::StateWrite> {
    s.turn_record(
        bot,
        &botfleet_store::TurnRecord {
            key: key.to_owned(),
            chat: chat.to_owned(),
            fence: botfleet_store::TurnFence::Claim(Fence(fence)),
            outcome,
            sent: false,
            state: None,
            refs: Vec::new(),
            notes: None,
            said: Vec::new(),
        },
    )
    .await
}

/// A turn of chat `c1` on the entry `key` that sent its reply, with the new `state` (and the
/// revision it came from), if any.
fn replied(
    key: &str,
    fence: botfleet_store::TurnFence,
    state: Option<(u64, &str)>,
) -> botfleet_store::TurnRecord {
    botfleet_store::TurnRecord {
        key: key.to_owned(),
        chat: "c1".to_owned(),
        fence,
        outcome: InboxOutcome::Done,
        sent: true,
        state: state.map(|(r, s)| (r, s.to_owned())),
        refs: Vec::new(),
        notes: None,
        said: Vec::new(),
    }
}

fn item(key: &str, chat: &str) -> InboxItem {
    InboxItem {
        key: key.into(),
        chat: chat.into(),
        message: format!("{{\"text\":\"{key}\"}}"),
    }
}

/// The inbox records each delivery once, in arrival order, and gives back what is pending
/// until it is finished; redeliveries are recognised by key.
pub async fn inbox_records_once_in_order(s: Arc<dyn Store>) {
    let bot = bid("b1");
    s.accept_fence(&bot, Fence(3)).await.unwrap();
    let new = put(
        &s,
        &bot,
        &[item("u1", "c1"), item("u2", "c2"), item("u3", "c1")],
        3,
    )
    .await;
    assert_eq!(new, [true, true, true]);
    let new = put(
        &s,
        &bot,
        &[item("u2", "c2"), item("u4", "c1"), item("u4", "c1")],
        3,
    )
    .await;
    assert_eq!(
        new,
        [false, true, false],
        "redeliveries are not recorded again"
    );
    let pending = s.inbox_pending(&bot, 100).await.unwrap();
    let keys: Vec<_> = pending.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, ["u1", "u2", "u3", "u4"]);
    assert!(pending.windows(2).all(|w| w[0].seq < w[1].seq));
    assert_eq!(pending[2].chat, "c1");
    assert_eq!(pending[2].message, "{\"text\":\"u3\"}");
    // The resume point answers the checkpoint and the same entries, in one call.
    s.put_cursor(&bot, "offset-9", Fence(3)).await.unwrap();
    let (cursor, again) = s.resume_point(&bot, 100).await.unwrap();
    assert_eq!(cursor.map(|c| c.value).as_deref(), Some("offset-9"));
    assert_eq!(again, pending);
    let (none, nothing) = s.resume_point(&bid("never"), 100).await.unwrap();
    assert!(none.is_none() && nothing.is_empty());
    assert_eq!(pending[0].state, InboxState::Pending);
    assert!(pending[0].received_at_ms > 0);
    assert_eq!(s.inbox_pending(&bot, 2).await.unwrap().len(), 2);
    end(&s, &bot, "u2", InboxOutcome::Done, 3).await.unwrap();
    end(
        &s,
        &bot,
        "u3",
        InboxOutcome::Undeliverable("handler answered 400".into()),
        3,
    )
    .await
    .unwrap();
    let keys: Vec<_> = s
        .inbox_pending(&bot, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.key)
        .collect();
    assert_eq!(keys, ["u1", "u4"]);
    let stats = s.inbox_stats().await.unwrap();
    assert_eq!(
        stats.get(&bot),
        Some(&InboxStats {
            pending: 2,
            undeliverable: 1,
            ..InboxStats::default()
        })
    );
    let bad = s.inbox_undeliverable(&bot, 10).await.unwrap();
    assert_eq!(bad.len(), 1);
    assert_eq!(
        (bad[0].key.as_str(), bad[0].error.as_deref()),
        ("u3", Some("handler answered 400"))
    );
    // A finished key is still known: its redelivery is not recorded again.
    assert_eq!(put(&s, &bot, &[item("u2", "c2")], 3).await, [false]);
    // Another bot's inbox is its own.
    assert!(s.inbox_pending(&bid("b2"), 10).await.unwrap().is_empty());
    assert_eq!(put(&s, &bid("b2"), &[item("u1", "c1")], 1).await, [true]);
}

/// An entry's sequence means one thing whoever journals it: its arrival, in µs since the
/// Unix epoch, growing for each bot — entries journaled under a unit's claim (numbered on
/// from the bot's last) and by any worker (a webhook delivery) interleave in the order they
/// came, as a bot that moves between the two ways keeps its order.
pub async fn entry_sequences_are_arrival_times(s: Arc<dyn Store>) {
    let bot = bid("seq");
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    assert_eq!(
        put(&s, &bot, &[item("p1", "c1"), item("p2", "c2")], 1).await,
        [true, true]
    );
    assert_eq!(hook_put(&s, &bot, &[item("h1", "c1")]).await, [true]);
    assert_eq!(put(&s, &bot, &[item("p3", "c1")], 1).await, [true]);
    assert_eq!(
        hook_put(&s, &bot, &[item("h2", "c2"), item("h3", "c1")]).await,
        [true, true]
    );
    let pending = s.inbox_pending(&bot, 100).await.unwrap();
    let keys: Vec<_> = pending.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(
        keys,
        ["p1", "p2", "h1", "p3", "h2", "h3"],
        "in the order they came"
    );
    assert!(
        pending.windows(2).all(|w| w[0].seq < w[1].seq),
        "growing: {:?}",
        pending.iter().map(|e| e.seq).collect::<Vec<_>>()
    );
    assert!(
        pending[0].seq >= before,
        "an arrival time in µs: {} journaled after {before}",
        pending[0].seq
    );
}

/// A backend send is an entry of its chat like an event, under a key made from the client's
/// `Idempotency-Key`: a repeat is not journaled again and finds the first (its message, to
/// tell a repeat from another body under the same key), also after it ended; it outlives the
/// hour an answered event is kept.
pub async fn backend_sends_are_entries_found_again_by_their_key(s: Arc<dyn Store>) {
    let bot = bid("snd");
    let key = botfleet_store::send_key("order-42 reminder");
    assert!(key.starts_with(botfleet_store::SEND_KEY_PREFIX));
    assert!(
        !key.contains("order-42"),
        "the client's key is not stored as it is"
    );
    assert_eq!(key, botfleet_store::send_key("order-42 reminder"));
    assert_ne!(key, botfleet_store::send_key("order-43 reminder"));
    s.accept_fence(&bot, Fence(1)).await.unwrap();
    let send = InboxItem {
        key: key.clone(),
        chat: "c1".into(),
        message: r#"{"text":"your order shipped"}"#.into(),
    };
    assert_eq!(put(&s, &bot, &[item("e1", "c1")], 1).await, [true]);
    assert_eq!(
        hook_put(&s, &bot, std::slice::from_ref(&send)).await,
        [true]
    );
    assert_eq!(
        hook_put(&s, &bot, std::slice::from_ref(&send)).await,
        [false],
        "a repeat"
    );
    let first = s.turn_view(&bot, &key, "c1").await.unwrap().entry.unwrap();
    assert_eq!(
        first.message, send.message,
        "the repeat finds the first body"
    );
    let by_key = s.inbox_entry(&bot, &key).await.unwrap().unwrap();
    assert_eq!(
        (by_key.chat.as_str(), by_key.message.as_str()),
        ("c1", send.message.as_str()),
        "found by its key alone"
    );
    assert!(s.inbox_entry(&bot, "send:none").await.unwrap().is_none());
    let pending = s.inbox_pending(&bot, 10).await.unwrap();
    let kinds: Vec<_> = pending.iter().map(|e| (e.key.as_str(), e.kind())).collect();
    assert_eq!(
        kinds,
        [
            ("e1", botfleet_store::EntryKind::Event),
            (key.as_str(), botfleet_store::EntryKind::Send)
        ],
        "in its chat's order"
    );
    end(&s, &bot, "e1", InboxOutcome::Done, 1).await.unwrap();
    end(&s, &bot, &key, InboxOutcome::Done, 1).await.unwrap();
    // Everything answered before a moment from now is due to go: the event goes, the send
    // stays its day.
    let later = botfleet_core::unix_ms() + 1_000;
    assert_eq!(s.inbox_prune(later, later).await.unwrap(), 1);
    assert!(s.turn_view(&bot, "e1", "c1").await.unwrap().entry.is_none());
    let kept = s.turn_view(&bot, &key, "c1").await.unwrap().entry.unwrap();
    assert_eq!(kept.state, InboxState::Done);
    assert_eq!(hook_put(&s, &bot, &[send]).await, [false], "still known");
}

/// Sends from the backend are counted per bot by how they stand, beside the pending and
/// undeliverable entries (a queued send counts among the pending); a bot with neither is not
/// listed.
pub async fn sends_are_counted_per_bot_by_state(s: Arc<dyn Store>) {
    let bot = bid("cnt");
    s.accept_fence(&bot, Fence(1)).await.unwrap();
    let sends: Vec<InboxItem> = ["a", "b", "c"]
        .iter()
        .map(|k| InboxItem {
            key: botfleet_store::send_key(k),
            chat: "c1".into(),
            message: r#"{"text":"x"}"#.into(),
        })
        .collect();
    put(&s, &bot, &[item("e1", "c1"), item("e2", "c1")], 1).await;
    hook_put(&s, &bot, &sends).await;
    end(&s, &bot, "e1", InboxOutcome::Done, 1).await.unwrap();
    end(&s, &bot, &sends[0].key, InboxOutcome::Done, 1)
        .await
        .unwrap();
    let refused = InboxOutcome::Undeliverable("refused".into());
    end(&s, &bot, &sends[1].key, refused, 1).await.unwrap();
    let quiet = bid("quiet");
    s.accept_fence(&quiet, Fence(1)).await.unwrap();
    put(&s, &quiet, &[item("e9", "c1")], 1).await;
    end(&s, &quiet, "e9", InboxOutcome::Done, 1).await.unwrap();
    let stats = s.inbox_stats().await.unwrap();
    let want = InboxStats {
        pending: 2,
        undeliverable: 1,
        sends: botfleet_store::SendCounts {
            queued: 1,
            sent: 1,
            failed: 1,
        },
        held: 0,
        paused_chats: 0,
    };
    assert_eq!(stats.get(&bot), Some(&want));
    assert_eq!(stats.get(&quiet), None);
}

fn hold(key: &str, fence: botfleet_store::TurnFence, until_ms: i64) -> botfleet_store::TurnHold {
    botfleet_store::TurnHold {
        key: key.into(),
        chat: "c1".into(),
        fence,
        until_ms,
    }
}

fn part(key: &str, idem: &str, body: &str, last: bool) -> botfleet_store::ReplyPost {
    botfleet_store::ReplyPost {
        key: key.into(),
        idempotency_key: idem.into(),
        body: body.into(),
        last,
    }
}

/// A held turn takes the parts of its answer in the order posted, each key once (a repeat
/// answers as the first post did, another body under it is refused), until its last part;
/// then, and once the entry ended or the hold expired, nothing more. The hold is written
/// under the turn's fence, keeps its first expiry, and is counted per bot.
pub async fn held_turns_take_posted_parts_once_in_order(s: Arc<dyn Store>) {
    use botfleet_store::{PostAnswer, TurnFence};
    let bot = bid("held");
    s.accept_fence(&bot, Fence(2)).await.unwrap();
    put(
        &s,
        &bot,
        &[item("e1", "c1"), item("e2", "c1"), item("e3", "c1")],
        2,
    )
    .await;
    let soon = botfleet_core::unix_ms() + 60_000;
    // A part may come before the hold is written (the client was quicker than the 202).
    assert_eq!(
        s.reply_post(&bot, &part("e1", "k1", r#"{"n":1}"#, false))
            .await
            .unwrap(),
        PostAnswer::Accepted(1)
    );
    assert!(matches!(
        s.turn_hold(&bot, &hold("e1", TurnFence::Claim(Fence(1)), soon))
            .await,
        Err(StoreError::StaleFence { .. })
    ));
    assert_eq!(
        s.turn_view(&bot, "e1", "c1").await.unwrap().held_until_ms,
        None
    );
    let held = hold("e1", TurnFence::Claim(Fence(2)), soon);
    assert_eq!(s.turn_hold(&bot, &held).await.unwrap(), Some(soon));
    // A worker taking the turn over keeps the first expiry.
    let again = hold("e1", TurnFence::Claim(Fence(2)), soon + 5_000);
    assert_eq!(s.turn_hold(&bot, &again).await.unwrap(), Some(soon));
    assert_eq!(
        s.turn_view(&bot, "e1", "c1").await.unwrap().held_until_ms,
        Some(soon)
    );
    assert_eq!(s.inbox_stats().await.unwrap()[&bot].held, 1);
    // A repeat answers as the first post; another body under the key is refused.
    assert_eq!(
        s.reply_post(&bot, &part("e1", "k1", r#"{"n":1}"#, false))
            .await
            .unwrap(),
        PostAnswer::Repeat(1)
    );
    assert_eq!(
        s.reply_post(&bot, &part("e1", "k1", r#"{"n":9}"#, false))
            .await
            .unwrap(),
        PostAnswer::Conflict
    );
    assert_eq!(
        s.reply_post(&bot, &part("e1", "k2", r#"{"n":2}"#, false))
            .await
            .unwrap(),
        PostAnswer::Accepted(2)
    );
    assert_eq!(
        s.reply_post(&bot, &part("e1", "k3", r#"{"n":3}"#, true))
            .await
            .unwrap(),
        PostAnswer::Accepted(3)
    );
    // After the last part, no more (a repeat still answers as before).
    assert_eq!(
        s.reply_post(&bot, &part("e1", "k4", r#"{"n":4}"#, false))
            .await
            .unwrap(),
        PostAnswer::Ended
    );
    assert_eq!(
        s.reply_post(&bot, &part("e1", "k3", r#"{"n":3}"#, true))
            .await
            .unwrap(),
        PostAnswer::Repeat(3)
    );
    let parts = s.posted_replies(&bot, "e1", 0).await.unwrap();
    let got: Vec<(u64, &str, bool)> = parts
        .iter()
        .map(|p| (p.seq, p.body.as_str(), p.last))
        .collect();
    assert_eq!(
        got,
        vec![
            (1, r#"{"n":1}"#, false),
            (2, r#"{"n":2}"#, false),
            (3, r#"{"n":3}"#, true)
        ]
    );
    let rest = s.posted_replies(&bot, "e1", 2).await.unwrap();
    assert_eq!(rest.iter().map(|p| p.seq).collect::<Vec<_>>(), vec![3]);
    // What wakes the turns held elsewhere: the entries with parts since a time, and the last.
    let since = parts[0].posted_at_ms;
    assert_eq!(
        s.replies_since(since).await.unwrap(),
        vec![(bot.clone(), "e1".to_owned(), 3)]
    );
    let later = parts.iter().map(|p| p.posted_at_ms).max().unwrap_or(since) + 1;
    assert!(s.replies_since(later).await.unwrap().is_empty());
    // Parts are the entry's own; an unknown entry takes none.
    assert!(s.posted_replies(&bot, "e2", 0).await.unwrap().is_empty());
    assert_eq!(
        s.reply_post(&bot, &part("nope", "k1", "{}", false))
            .await
            .unwrap(),
        PostAnswer::Unknown
    );
    assert_eq!(
        s.reply_post(&bid("other"), &part("e1", "k9", "{}", false))
            .await
            .unwrap(),
        PostAnswer::Unknown
    );
    // The entry ends: nothing more is taken, repeats still answer, the count goes.
    end(&s, &bot, "e1", InboxOutcome::Done, 2).await.unwrap();
    assert_eq!(
        s.reply_post(&bot, &part("e1", "k2", r#"{"n":2}"#, false))
            .await
            .unwrap(),
        PostAnswer::Repeat(2)
    );
    assert_eq!(
        s.turn_hold(&bot, &hold("e1", TurnFence::Claim(Fence(2)), soon))
            .await
            .unwrap(),
        None
    );
    assert_eq!(s.inbox_stats().await.unwrap()[&bot].held, 0);
    // An expired hold takes nothing.
    let past = botfleet_core::unix_ms() - 1;
    let h = hold("e2", TurnFence::Claim(Fence(2)), past);
    assert_eq!(s.turn_hold(&bot, &h).await.unwrap(), Some(past));
    assert_eq!(
        s.reply_post(&bot, &part("e2", "k1", "{}", true))
            .await
            .unwrap(),
        PostAnswer::Ended
    );
    // A chat's turn (webhook bots) is fenced by the chat.
    s.turn_accept(&bot, "c1", Fence(7)).await.unwrap();
    assert!(matches!(
        s.turn_hold(&bot, &hold("e3", TurnFence::Chat(Fence(6)), soon))
            .await,
        Err(StoreError::StaleFence { .. })
    ));
    let h = hold("e3", TurnFence::Chat(Fence(7)), soon);
    assert_eq!(s.turn_hold(&bot, &h).await.unwrap(), Some(soon));
    // Pruned with their entry, once it ended.
    assert_eq!(s.inbox_prune(i64::MAX, i64::MAX).await.unwrap(), 1);
    assert!(s.posted_replies(&bot, "e1", 0).await.unwrap().is_empty());
    assert_eq!(
        s.reply_post(&bot, &part("e1", "k1", r#"{"n":1}"#, false))
            .await
            .unwrap(),
        PostAnswer::Unknown
    );
    assert_eq!(
        s.reply_post(&bot, &part("e3", "k1", "{}", false))
            .await
            .unwrap(),
        PostAnswer::Accepted(1)
    );
    assert_eq!(s.posted_replies(&bot, "e3", 0).await.unwrap().len(), 1);
}

/// Parts posted at once through many workers are each kept once, numbered apart, and the
/// turn reads them all; a key posted at once by several is kept once.
pub async fn parts_posted_at_once_are_each_kept_once(s: Arc<dyn Store>) {
    use botfleet_store::PostAnswer;
    let bot = bid("heldmany");
    s.accept_fence(&bot, Fence(1)).await.unwrap();
    put(&s, &bot, &[item("e1", "c1")], 1).await;
    let posts = (0..24).map(|i| {
        let s = s.clone();
        let bot = bot.clone();
        // Keys 0..16, the first eight twice.
        let k = format!("k{}", i % 16);
        tokio::spawn(async move {
            s.reply_post(&bot, &part("e1", &k, &format!("{{\"k\":\"{k}\"}}"), false))
                .await
                .unwrap()
        })
    });
    let mut accepted = Vec::new();
    let mut repeats = 0;
    for p in posts.collect::<Vec<_>>() {
        match p.await.unwrap() {
            PostAnswer::Accepted(n) => accepted.push(n),
            PostAnswer::Repeat(_) => repeats += 1,
            other => panic!("a part was answered {other:?}"),
        }
    }
    assert_eq!((accepted.len(), repeats), (16, 8));
    accepted.sort_unstable();
    accepted.dedup();
    assert_eq!(accepted.len(), 16, "two parts got one number");
    let kept = s.posted_replies(&bot, "e1", 0).await.unwrap();
    let mut keys: Vec<&str> = kept.iter().map(|p| p.body.as_str()).collect();
    keys.sort_unstable();
    keys.dedup();
    assert_eq!((kept.len(), keys.len()), (16, 16));
    assert!(kept.windows(2).all(|w| w[0].seq < w[1].seq));
}

/// A worker that lost the bot can neither record nor end entries.
pub async fn inbox_writes_are_fenced(s: Arc<dyn Store>) {
    let bot = bid("b1");
    s.accept_fence(&bot, Fence(5)).await.unwrap();
    assert!(matches!(
        s.journal_put(&bot, &[item("u1", "c")], Some(Fence(4)), None).await,
        Err(StoreError::StaleFence { current, .. }) if current == Fence(5)
    ));
    assert!(s.inbox_pending(&bot, 10).await.unwrap().is_empty());
    put(&s, &bot, &[item("u1", "c")], 5).await;
    assert!(matches!(
        end(&s, &bot, "u1", InboxOutcome::Done, 4).await,
        Err(StoreError::StaleFence { .. })
    ));
    assert_eq!(s.inbox_pending(&bot, 10).await.unwrap().len(), 1);
    // An entry that is not there (pruned, never recorded) ends as nothing.
    end(&s, &bot, "nope", InboxOutcome::Done, 5).await.unwrap();
    end(&s, &bot, "u1", InboxOutcome::Done, 6).await.unwrap();
    assert!(s.inbox_pending(&bot, 10).await.unwrap().is_empty());
    // An ended entry stays as it ended.
    end(
        &s,
        &bot,
        "u1",
        InboxOutcome::Undeliverable("late".into()),
        6,
    )
    .await
    .unwrap();
    assert_eq!(s.inbox_stats().await.unwrap().get(&bot), None);
}

/// Pruning forgets finished entries by age, never pending ones.
pub async fn inbox_prune_forgets_finished_entries(s: Arc<dyn Store>) {
    let bot = bid("b1");
    put(
        &s,
        &bot,
        &[item("a", "c"), item("b", "c"), item("c", "c")],
        1,
    )
    .await;
    end(&s, &bot, "a", InboxOutcome::Done, 1).await.unwrap();
    end(&s, &bot, "b", InboxOutcome::Undeliverable("x".into()), 1)
        .await
        .unwrap();
    let future = botfleet_core::unix_ms() + 60_000;
    assert_eq!(s.inbox_prune(0, 0).await.unwrap(), 0, "nothing that old");
    assert_eq!(s.inbox_prune(future, 0).await.unwrap(), 1, "the done one");
    let stats = s.inbox_stats().await.unwrap();
    assert_eq!(
        stats[&bot],
        InboxStats {
            pending: 1,
            undeliverable: 1,
            ..InboxStats::default()
        }
    );
    assert_eq!(s.inbox_prune(future, future).await.unwrap(), 1);
    assert_eq!(s.inbox_pending(&bot, 10).await.unwrap().len(), 1);
    // A pruned key is forgotten: it would be recorded again (the platform's cursor, not the
    // inbox, guards old deliveries by then).
    assert_eq!(put(&s, &bot, &[item("a", "c")], 1).await, [true]);
}

/// A second credential (Slack's app token) is stored, read back and never shown.
pub async fn app_tokens_round_trip_and_stay_secret(s: Arc<dyn Store>) {
    let mut b = BotSpec::new(bid("sl"), Platform::Slack, "xoxb-bot-SECRET1");
    b.app_token = Some(Secret::new("xapp-app-SECRET2"));
    s.add_bot(&b).await.unwrap();
    let r = s.get_bot(&bid("sl")).await.unwrap().unwrap();
    assert_eq!(r.spec, b);
    assert_eq!(
        r.spec.app_token.as_ref().map(Secret::expose),
        Some("xapp-app-SECRET2")
    );
    let debug = format!("{r:?}");
    assert!(!debug.contains("SECRET"), "{debug}");
    b.app_token = Some(Secret::new("xapp-rotated"));
    s.update_bot(&b).await.unwrap();
    let r = s.get_bot(&bid("sl")).await.unwrap().unwrap();
    assert_eq!(
        r.spec.app_token.as_ref().map(Secret::expose),
        Some("xapp-rotated")
    );
    // A malformed second credential is refused by the store too.
    let mut bad_app = BotSpec::new(bid("sl2"), Platform::Slack, "xoxb-x");
    bad_app.app_token = Some(Secret::new("xapp- split"));
    assert!(matches!(
        s.add_bot(&bad_app).await,
        Err(StoreError::InvalidSpec(_))
    ));
}

/// Journaling with the view of one item: a new entry shows pending with its message, a
/// redelivery shows the entry as it is, and the chat's state and outbox are read too.
pub async fn journal_and_view_in_one_call(s: Arc<dyn Store>) {
    use botfleet_store::StateWrite;
    let bot = bid("hook3");
    let (new, v) = s
        .journal_put(&bot, &[item("a1", "c1")], None, Some(0))
        .await
        .unwrap();
    assert_eq!(new, [Journaled::New]);
    let v = v.unwrap();
    let e = v.entry.unwrap();
    assert_eq!(
        (e.key.as_str(), e.chat.as_str(), e.state),
        ("a1", "c1", InboxState::Pending)
    );
    assert_eq!(e.message, item("a1", "c1").message);
    assert_eq!((v.revision, v.state, v.sent), (0, None, false));
    let rec = replied(
        "a1",
        botfleet_store::TurnFence::Chat(Fence(5)),
        Some((0, "{\"n\":1}")),
    );
    assert_eq!(
        s.turn_record(&bot, &rec).await.unwrap(),
        StateWrite::Written(1)
    );
    // A redelivery: not new, the entry as it is now.
    let (new, v) = s
        .journal_put(&bot, &[item("a1", "c1")], None, Some(0))
        .await
        .unwrap();
    assert_eq!(new, [Journaled::Known]);
    let v = v.unwrap();
    assert_eq!(v.entry.map(|e| e.state), Some(InboxState::Done));
    assert_eq!(
        (v.revision, v.state.as_deref(), v.sent),
        (1, Some("{\"n\":1}"), true)
    );
    // A new entry of the same chat sees the chat's state.
    let (new, v) = s
        .journal_put(&bot, &[item("a2", "c1"), item("a3", "c2")], None, Some(0))
        .await
        .unwrap();
    assert_eq!(new, [Journaled::New, Journaled::New]);
    let v = v.unwrap();
    assert_eq!(v.entry.map(|e| e.state), Some(InboxState::Pending));
    assert_eq!((v.revision, v.sent), (1, false));
    // Without a view, no view; under a claim, the view as well.
    let (new, v) = s
        .journal_put(&bot, &[item("a4", "c1")], None, None)
        .await
        .unwrap();
    assert_eq!((new, v), (vec![Journaled::New], None));
    let (new, v) = s
        .journal_put(&bot, &[item("a5", "c1")], Some(Fence(1)), Some(0))
        .await
        .unwrap();
    assert_eq!(new, [Journaled::New]);
    let v = v.unwrap();
    assert_eq!(v.entry.map(|e| e.state), Some(InboxState::Pending));
    assert_eq!(v.revision, 1);
    let keys: Vec<String> = s
        .inbox_pending(&bot, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.key)
        .collect();
    assert_eq!(keys, ["a2", "a3", "a4", "a5"]);
}

/// A linked-device session's records round-trip by kind, change all or none under the
/// claim's fence (a stale writer changes nothing), are read whole by the next owner, and go
/// with a clear or the bot's removal.
pub async fn session_records_are_fenced_and_move_whole(s: Arc<dyn Store>) {
    use botfleet_store::SessionWrite;
    let bot = bid("wa-web");
    s.add_bot(&spec("wa-web", Platform::Telegram))
        .await
        .unwrap();
    let put = |kind: &str, key: &str, v: &[u8]| SessionWrite::Put {
        kind: kind.into(),
        key: key.into(),
        value: v.to_vec(),
    };
    // The first owner (fence 3) writes a whole session: every kind of record.
    s.accept_fence(&bot, Fence(3)).await.unwrap();
    let all_bytes: Vec<u8> = (0..=255).collect();
    s.session_write(
        &bot,
        &[
            put("device", "self", b"{\"jid\":\"1@s.whatsapp.net\"}"),
            put("identity", "4917:1", &[7; 32]),
            put("session", "4917:1", &all_bytes),
            put("prekey", "00000001", &[1, 2, 3]),
            put("prekey", "00000002", &[4, 5, 6]),
            put("signed_prekey", "1", &[9; 64]),
            put("sender_key", "group@g.us:4917", &[5; 10]),
            put("sync_key", "a1b2", b"key"),
            put("app_state_version", "regular", b"{\"version\":3}"),
        ],
        Fence(3),
    )
    .await
    .unwrap();
    // Deletes and puts apply in order, the last write of a record winning.
    s.session_write(
        &bot,
        &[
            SessionWrite::Delete {
                kind: "prekey".into(),
                key: "00000001".into(),
            },
            put("prekey", "00000003", &[7]),
            SessionWrite::Delete {
                kind: "prekey".into(),
                key: "00000003".into(),
            },
            put("prekey", "00000003", &[8]),
        ],
        Fence(3),
    )
    .await
    .unwrap();
    // The next owner (fence 4) reads it whole.
    s.accept_fence(&bot, Fence(4)).await.unwrap();
    assert_eq!(
        s.session_records(&bot, "prekey").await.unwrap(),
        [
            ("00000002".to_owned(), vec![4, 5, 6]),
            ("00000003".to_owned(), vec![8])
        ]
    );
    assert_eq!(
        s.session_records(&bot, "session").await.unwrap(),
        [("4917:1".to_owned(), all_bytes.clone())]
    );
    assert_eq!(s.session_records(&bot, "device").await.unwrap().len(), 1);
    assert!(s.session_records(&bot, "nothing").await.unwrap().is_empty());
    // One record at a time (what a client reads on demand).
    assert_eq!(
        s.session_record(&bot, "session", "4917:1").await.unwrap(),
        Some(all_bytes.clone())
    );
    assert_eq!(
        s.session_record(&bot, "prekey", "00000003").await.unwrap(),
        Some(vec![8])
    );
    assert_eq!(
        s.session_record(&bot, "prekey", "00000001").await.unwrap(),
        None
    );
    assert_eq!(
        s.session_record(&bot, "session", "other").await.unwrap(),
        None
    );
    // The old owner, stale, changes nothing, not even part of a batch.
    let stale = s
        .session_write(
            &bot,
            &[
                put("session", "4917:1", b"corrupt"),
                put("prekey", "9", b"x"),
            ],
            Fence(3),
        )
        .await;
    assert!(
        matches!(stale, Err(StoreError::StaleFence { .. })),
        "{stale:?}"
    );
    assert!(matches!(
        s.session_clear(&bot, Fence(3)).await,
        Err(StoreError::StaleFence { .. })
    ));
    assert_eq!(
        s.session_records(&bot, "session").await.unwrap(),
        [("4917:1".to_owned(), all_bytes)]
    );
    assert_eq!(s.session_records(&bot, "prekey").await.unwrap().len(), 2);
    // Another bot's session is its own.
    assert!(s
        .session_records(&bid("other"), "session")
        .await
        .unwrap()
        .is_empty());
    // Logged out: the owner forgets it; a removed bot's session goes with it.
    s.session_clear(&bot, Fence(4)).await.unwrap();
    assert!(s.session_records(&bot, "device").await.unwrap().is_empty());
    s.session_write(&bot, &[put("device", "self", b"again")], Fence(4))
        .await
        .unwrap();
    assert!(s.remove_bot(&bot).await.unwrap());
    assert!(s.session_records(&bot, "device").await.unwrap().is_empty());
}

/// A webhook bot's mode and secrets round trip, stay out of `Debug`, and are checked.
/// `update_bot_if` writes only over the version it read (what the fleet writes into a spec
/// never overwrites an operator's change), and a Discord bot's counted shards round-trip.
pub async fn conditional_updates_never_overwrite_a_change(s: Arc<dyn Store>) {
    let mut b = BotSpec::new(bid("dc"), Platform::Discord, "DISCORD-SECRET");
    b.options.shards_per_slice = Some(2);
    s.add_bot(&b).await.unwrap();
    let read = s.get_bot(&bid("dc")).await.unwrap().unwrap();
    assert!(read.spec.is_counting());
    // The fleet counts the shards while an operator rotates the token.
    let mut counted = read.spec.clone();
    counted.options.shards_in_use = Some(6);
    counted.options.shards_recommended = Some(6);
    let mut rotated = read.spec.clone();
    rotated.token = Secret::new("DISCORD-ROTATED");
    s.update_bot(&rotated).await.unwrap();
    assert!(
        !s.update_bot_if(&counted, read.updated_at_ms).await.unwrap(),
        "written over a version that changed"
    );
    let now = s.get_bot(&bid("dc")).await.unwrap().unwrap();
    assert_eq!(
        now.spec.token.expose(),
        "DISCORD-ROTATED",
        "the rotation stands"
    );
    assert!(now.spec.is_counting());
    // Over the version it read, it is written, and the counted shards come back.
    let mut counted = now.spec.clone();
    counted.options.shards_in_use = Some(6);
    counted.options.shards_recommended = Some(6);
    assert!(s.update_bot_if(&counted, now.updated_at_ms).await.unwrap());
    let after = s.get_bot(&bid("dc")).await.unwrap().unwrap();
    assert_eq!(after.spec, counted);
    assert!(after.updated_at_ms > now.updated_at_ms, "a later version");
    assert_eq!(after.spec.units().len(), 3);
    let debug = format!("{after:?}");
    assert!(
        !debug.contains("SECRET") && !debug.contains("ROTATED"),
        "{debug}"
    );
    assert!(matches!(
        s.update_bot_if(&BotSpec::new(bid("nope"), Platform::Discord, "t"), 0)
            .await,
        Err(StoreError::NotFound(_))
    ));
}

pub async fn webhook_settings_round_trip_and_stay_secret(s: Arc<dyn Store>) {
    let mut b = BotSpec::new(bid("tgw"), Platform::Telegram, "1:tok-SECRET1");
    b.options.mode = Some("webhook".into());
    b.options.max_connections = Some(7);
    b.hook.secret = Some(Secret::new("hookSECRET2"));
    s.add_bot(&b).await.unwrap();
    let r = s.get_bot(&bid("tgw")).await.unwrap().unwrap();
    assert_eq!(r.spec, b);
    assert_eq!(r.spec.options.mode.as_deref(), Some("webhook"));
    let debug = format!("{r:?}");
    assert!(!debug.contains("SECRET"), "{debug}");
    let mut w = BotSpec::new(bid("wa"), Platform::Whatsapp, "EAAG-SECRET3");
    w.options.phone_number_id = Some("1234567".into());
    w.hook.secret = Some(Secret::new("appSECRET4"));
    w.hook.verify_token = Some(Secret::new("verifySECRET5"));
    s.add_bot(&w).await.unwrap();
    assert_eq!(s.get_bot(&bid("wa")).await.unwrap().unwrap().spec, w);
    // Back to polling: the settings go with an update.
    b.options.mode = None;
    b.hook.secret = None;
    b.options.max_connections = None;
    s.update_bot(&b).await.unwrap();
    let r = s.get_bot(&bid("tgw")).await.unwrap().unwrap();
    assert_eq!(r.spec.options.mode, None);
    assert_eq!(r.spec, b);
    // A slice larger than any bot's shard count is refused by the store too.
    let mut bad = BotSpec::new(bid("dx"), Platform::Discord, "d");
    bad.options.shards_per_slice = Some(5000);
    assert!(matches!(
        s.add_bot(&bad).await,
        Err(StoreError::InvalidSpec(_))
    ));
}

/// Webhook deliveries are journaled by any worker (not fenced per bot), once per key, even
/// when several journal the same key at once.
pub async fn journal_takes_each_delivery_once(s: Arc<dyn Store>) {
    let bot = bid("hook1");
    // A unit holder's high fence does not keep other workers from journaling.
    s.accept_fence(&bot, Fence(1_000)).await.unwrap();
    assert_eq!(
        hook_put(&s, &bot, &[item("u1", "c1"), item("u2", "c2")]).await,
        [true, true]
    );
    let mut racers = Vec::new();
    for _ in 0..4 {
        let s = s.clone();
        let bot = bot.clone();
        racers.push(tokio::spawn(async move {
            hook_put(&s, &bot, &[item("u3", "c1")]).await[0]
        }));
    }
    let mut firsts = 0;
    for r in racers {
        firsts += usize::from(r.await.unwrap());
    }
    assert_eq!(firsts, 1, "one of four concurrent deliveries is new");
    assert_eq!(hook_put(&s, &bot, &[item("u1", "c1")]).await, [false]);
    let pending = s.inbox_pending(&bot, 10).await.unwrap();
    let keys: Vec<&str> = pending.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, ["u1", "u2", "u3"], "in arrival order");
}

/// A turn reads its entry, the chat's state and whether the reply went out; it writes the
/// outbox record, the state (compare-and-set on revision and fence) and the entry's end at once.
pub async fn turns_read_and_write_state_outbox_and_entry(s: Arc<dyn Store>) {
    use botfleet_store::StateWrite;
    let bot = bid("hook2");
    hook_put(
        &s,
        &bot,
        &[item("m1", "c1"), item("m2", "c1"), item("m3", "c1")],
    )
    .await;
    let v = s.turn_view(&bot, "m1", "c1").await.unwrap();
    assert_eq!(v.entry.as_ref().map(|e| e.state), Some(InboxState::Pending));
    assert_eq!((v.revision, v.state.as_deref(), v.sent), (0, None, false));
    assert!(s
        .turn_view(&bot, "nope", "c1")
        .await
        .unwrap()
        .entry
        .is_none());
    let rec = |key: &str, fence: u64, state: Option<(u64, &str)>| {
        replied(key, botfleet_store::TurnFence::Chat(Fence(fence)), state)
    };
    assert_eq!(
        s.turn_record(&bot, &rec("m1", 10, Some((0, r#"{"n":1}"#))))
            .await
            .unwrap(),
        StateWrite::Written(1)
    );
    let v = s.turn_view(&bot, "m1", "c1").await.unwrap();
    assert_eq!(v.entry.map(|e| e.state), Some(InboxState::Done));
    assert_eq!(
        (v.revision, v.state.as_deref(), v.sent),
        (1, Some(r#"{"n":1}"#), true)
    );
    // Another chat's state is its own.
    assert_eq!(s.turn_view(&bot, "m1", "c2").await.unwrap().revision, 0);
    // A write computed from an old revision is refused, but the entry still ends.
    assert_eq!(
        s.turn_record(&bot, &rec("m2", 11, Some((0, r#"{"n":9}"#))))
            .await
            .unwrap(),
        StateWrite::Stale
    );
    let v = s.turn_view(&bot, "m2", "c1").await.unwrap();
    assert_eq!(v.state.as_deref(), Some(r#"{"n":1}"#));
    assert_eq!(v.entry.map(|e| e.state), Some(InboxState::Done));
    // A turn taken over under fence 20: the frozen holder's (fence 12) write is refused even at
    // the right revision, and so is its accept.
    s.turn_accept(&bot, "c1", Fence(20)).await.unwrap();
    assert!(matches!(
        s.turn_accept(&bot, "c1", Fence(12)).await,
        Err(StoreError::StaleFence { .. })
    ));
    assert_eq!(
        s.turn_record(&bot, &rec("m3", 12, Some((1, r#"{"n":2}"#))))
            .await
            .unwrap(),
        StateWrite::Stale
    );
    // ... and the superseded turn leaves the entry to the newer one, recording only that it
    // sent a reply (so the newer one does not send it again).
    let v = s.turn_view(&bot, "m3", "c1").await.unwrap();
    assert_eq!(v.entry.map(|e| e.state), Some(InboxState::Pending));
    assert!(v.sent);
    assert_eq!(
        s.turn_record(&bot, &rec("m3", 20, Some((1, r#"{"n":2}"#))))
            .await
            .unwrap(),
        StateWrite::Written(2)
    );
    // A finished entry stays finished; no state given leaves the state alone.
    let mut r = rec("m3", 21, None);
    r.outcome = InboxOutcome::Undeliverable("late".into());
    assert_eq!(
        s.turn_record(&bot, &r).await.unwrap(),
        StateWrite::Unchanged
    );
    let v = s.turn_view(&bot, "m3", "c1").await.unwrap();
    assert_eq!(v.entry.map(|e| e.state), Some(InboxState::Done));
    assert_eq!(v.revision, 2);
    // Records of replies go with pruning, as done entries do.
    s.inbox_prune(botfleet_core::unix_ms() + 1, 0)
        .await
        .unwrap();
    assert!(!s.turn_view(&bot, "m1", "c1").await.unwrap().sent);
}

/// A turn of several actions records its progress under its fence, and the names it gives
/// in its chat (refs) with its end; a done entry keeps the notes of what was refused.
pub async fn action_progress_and_refs_are_fenced(s: Arc<dyn Store>) {
    use botfleet_store::{TurnFence, TurnStep};
    let bot = bid("b1");
    s.add_bot(&spec("b1", Platform::Telegram)).await.unwrap();
    s.accept_fence(&bot, Fence(5)).await.unwrap();
    put(&s, &bot, &[item("u1", "c1")], 5).await;
    assert_eq!(s.turn_progress(&bot, "u1").await.unwrap(), None);
    let step = |fence: TurnFence, p: &str| TurnStep {
        key: "u1".into(),
        chat: "c1".into(),
        fence,
        progress: p.into(),
    };
    s.turn_step(&bot, &step(TurnFence::Claim(Fence(5)), r#"{"done":1}"#))
        .await
        .unwrap();
    s.turn_step(&bot, &step(TurnFence::Claim(Fence(5)), r#"{"done":2}"#))
        .await
        .unwrap();
    assert_eq!(
        s.turn_progress(&bot, "u1").await.unwrap().as_deref(),
        Some(r#"{"done":2}"#)
    );
    // A claim below the bot's accepted fence writes nothing.
    assert!(matches!(
        s.turn_step(&bot, &step(TurnFence::Claim(Fence(4)), r#"{"done":9}"#))
            .await,
        Err(StoreError::StaleFence { .. })
    ));
    // A chat's turn superseded by a higher fence of the chat writes nothing either.
    s.turn_accept(&bot, "c2", Fence(30)).await.unwrap();
    let mut late = step(TurnFence::Chat(Fence(29)), "x");
    late.chat = "c2".into();
    assert!(matches!(
        s.turn_step(&bot, &late).await,
        Err(StoreError::StaleFence { .. })
    ));
    late.fence = TurnFence::Chat(Fence(30));
    s.turn_step(&bot, &late).await.unwrap();
    assert_eq!(
        s.turn_progress(&bot, "u1").await.unwrap().as_deref(),
        Some("x")
    );
    // The end records the refs and keeps the notes.
    let mut rec = botfleet_store::TurnRecord::new(
        "u1",
        "c1",
        TurnFence::Claim(Fence(5)),
        InboxOutcome::Done,
        true,
        None,
    );
    rec.refs = vec![
        ("r:menu".into(), "1001".into()),
        ("r:menu".into(), "1002".into()),
        ("v:k1".into(), "a long value".into()),
    ];
    rec.notes = Some("action 2: typing refused".into());
    let names = |n: &[&str]| n.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
    // Fenced: a stale claim's end writes no refs.
    let mut stale = rec.clone();
    stale.fence = TurnFence::Claim(Fence(4));
    assert!(s.turn_record(&bot, &stale).await.is_err());
    assert_eq!(
        s.refs_get(&bot, "c1", &names(&["r:menu"])).await.unwrap(),
        [None]
    );
    s.turn_record(&bot, &rec).await.unwrap();
    assert_eq!(
        s.refs_get(&bot, "c1", &names(&["r:menu", "v:k1", "r:none"]))
            .await
            .unwrap(),
        [
            Some("1002".to_owned()),
            Some("a long value".to_owned()),
            None
        ],
        "the last value given for a name wins"
    );
    assert_eq!(
        s.refs_get(&bot, "c2", &names(&["r:menu"])).await.unwrap(),
        [None],
        "refs are per chat"
    );
    let v = s.turn_view(&bot, "u1", "c1").await.unwrap();
    let e = v.entry.unwrap();
    assert_eq!(e.state, InboxState::Done);
    assert_eq!(e.error.as_deref(), Some("action 2: typing refused"));
    // A later turn replaces a name.
    put(&s, &bot, &[item("u2", "c1")], 5).await;
    let mut rec2 = botfleet_store::TurnRecord::new(
        "u2",
        "c1",
        TurnFence::Claim(Fence(5)),
        InboxOutcome::Done,
        true,
        None,
    );
    rec2.refs = vec![("r:menu".into(), "1003".into())];
    s.turn_record(&bot, &rec2).await.unwrap();
    assert_eq!(
        s.refs_get(&bot, "c1", &names(&["r:menu"])).await.unwrap(),
        [Some("1003".to_owned())]
    );
    // Progress goes with pruning, as the outbox does; refs live 48 h.
    s.inbox_prune(botfleet_core::unix_ms() + 1, 0)
        .await
        .unwrap();
    assert_eq!(s.turn_progress(&bot, "u1").await.unwrap(), None);
    assert_eq!(
        s.refs_get(&bot, "c1", &names(&["r:menu"])).await.unwrap(),
        [Some("1003".to_owned())]
    );
}

/// One chat's pending entries, oldest first, whatever the other chats and bots hold.
pub async fn pending_entries_of_one_chat(s: Arc<dyn Store>) {
    let (b1, b2) = (bid("b1"), bid("b2"));
    s.add_bot(&spec("b1", Platform::Telegram)).await.unwrap();
    s.add_bot(&spec("b2", Platform::Telegram)).await.unwrap();
    let items: Vec<InboxItem> = [
        ("u1", "c1"),
        ("u2", "c2"),
        ("u3", "c1"),
        ("u4", "c2"),
        ("u5", "c1"),
    ]
    .iter()
    .map(|(k, c)| item(k, c))
    .collect();
    put(&s, &b1, &items, 1).await;
    put(&s, &b2, &[item("x1", "c1")], 1).await;
    end(&s, &b1, "u3", InboxOutcome::Done, 1).await.unwrap();
    let keys =
        |v: Vec<botfleet_store::InboxEntry>| v.into_iter().map(|e| e.key).collect::<Vec<_>>();
    assert_eq!(
        keys(s.inbox_pending_chat(&b1, "c1", 10).await.unwrap()),
        ["u1", "u5"]
    );
    assert_eq!(
        keys(s.inbox_pending_chat(&b1, "c2", 10).await.unwrap()),
        ["u2", "u4"]
    );
    assert_eq!(
        keys(s.inbox_pending_chat(&b1, "c1", 1).await.unwrap()),
        ["u1"]
    );
    assert!(s
        .inbox_pending_chat(&b1, "c9", 10)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        keys(s.inbox_pending_chat(&b2, "c1", 10).await.unwrap()),
        ["x1"]
    );
}

/// A fleet secret is made once: callers at once, each with a fresh candidate, all get the
/// first stored; later callers get it too; names are apart; resealing keeps it.
pub async fn fleet_secrets_are_made_once_and_shared(s: Arc<dyn Store>) {
    let mut tasks = Vec::new();
    for i in 0..8u8 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            s.fleet_secret("file-links", &[i; 32]).await.unwrap()
        }));
    }
    let mut got = Vec::new();
    for t in tasks {
        got.push(t.await.unwrap());
    }
    assert_eq!(got[0].len(), 32);
    assert!(got.iter().all(|g| *g == got[0]), "one secret: {got:?}");
    assert!((0..8u8).any(|i| got[0] == [i; 32]), "one of the candidates");
    assert_eq!(
        s.fleet_secret("file-links", &[99; 32]).await.unwrap(),
        got[0]
    );
    let other = s.fleet_secret("other", &[42; 16]).await.unwrap();
    assert_eq!(other, [42; 16]);
    s.reseal_secrets().await.unwrap();
    assert_eq!(
        s.fleet_secret("file-links", &[1; 32]).await.unwrap(),
        got[0]
    );
}

/// A pause of a chat, from `paused_at_ms`, until it is lifted or `until_ms`.
fn pause(chat: &str, until_ms: Option<i64>, reason: &str, paused_at_ms: i64) -> ChatPause {
    ChatPause {
        chat: chat.into(),
        until_ms,
        reason: Some(reason.into()),
        paused_at_ms,
    }
}

/// The keys of the bot's pending entries, oldest first.
async fn pending_keys(s: &Arc<dyn Store>, bot: &BotId) -> Vec<String> {
    s.inbox_pending(bot, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.key)
        .collect()
}

/// A paused chat's events are journaled paused (under a claim, as webhook deliveries, on
/// every slice of the bot) and sends from the backend are not; a turn reads the chat paused
/// and may end an earlier entry so; a pause given again keeps when it began; a timed pause
/// ends by itself; a resume with a replay makes what ended paused during the pause pending
/// again in order, one without leaves it; paused entries are kept as long as undeliverable
/// ones.
pub async fn paused_chats_are_recorded_not_answered(s: Arc<dyn Store>) {
    use Journaled::{Known, New, Paused};
    let bot = bid("desk");
    let unit = bot.slice(1);
    let journal = |items: Vec<InboxItem>, fence: Option<u64>| {
        let (s, bot) = (s.clone(), bot.clone());
        async move {
            s.journal_put(&bot, &items, fence.map(Fence), None)
                .await
                .unwrap()
                .0
        }
    };
    assert_eq!(journal(vec![item("e0", "c1")], Some(1)).await, [New]);
    let began = botfleet_core::unix_ms();
    s.chat_pause(&bot, &pause("c1", None, "a person answers", began))
        .await
        .unwrap();
    let send = InboxItem {
        key: botfleet_store::send_key("desk-1"),
        ..item("s1", "c1")
    };
    assert_eq!(
        journal(
            vec![
                item("e1", "c1"),
                item("e2", "c2"),
                send.clone(),
                item("e0", "c1")
            ],
            Some(1)
        )
        .await,
        [Paused, New, New, Known]
    );
    // A webhook delivery, with its view read in the same call.
    let (got, v) = s
        .journal_put(&bot, &[item("e3", "c1")], None, Some(0))
        .await
        .unwrap();
    assert_eq!(got, [Paused]);
    let v = v.unwrap();
    assert!(v.paused);
    assert_eq!(v.entry.map(|e| e.state), Some(InboxState::Paused));
    // A slice of the bot: its chats are the bot's.
    let (got, _) = s
        .journal_put(&unit, &[item("e4", "c1")], None, None)
        .await
        .unwrap();
    assert_eq!(got, [Paused]);
    // The entry recorded before the pause: a turn reads the chat paused and ends it so.
    let v = s.turn_view(&bot, "e0", "c1").await.unwrap();
    assert!(v.paused);
    assert_eq!(v.entry.map(|e| e.state), Some(InboxState::Pending));
    assert!(!s.turn_view(&bot, "e2", "c2").await.unwrap().paused);
    end_in(&s, &bot, "e0", "c1", InboxOutcome::Paused, 1)
        .await
        .unwrap();
    let e0 = s.inbox_entry(&bot, "e0").await.unwrap().unwrap();
    assert_eq!((e0.state, e0.error), (InboxState::Paused, None));
    assert_eq!(
        pending_keys(&s, &bot).await,
        ["e2".to_owned(), send.key.clone()]
    );
    assert!(pending_keys(&s, &unit).await.is_empty());
    // Listed for the bot and its slices alike; paused again, it keeps when it began.
    s.chat_pause(&bot, &pause("c1", None, "still", began + 5))
        .await
        .unwrap();
    let listed = s.chat_pauses(&unit).await.unwrap();
    assert_eq!(listed, [pause("c1", None, "still", began)]);
    let paused_chats = |st: std::collections::HashMap<BotId, InboxStats>| {
        st.get(&bot).map_or(0, |x| x.paused_chats)
    };
    assert_eq!(paused_chats(s.inbox_stats().await.unwrap()), 1);
    // A pause whose time is up is over: not listed, its chat's events are answered.
    s.chat_pause(&bot, &pause("c3", Some(began - 1), "over", began - 10))
        .await
        .unwrap();
    assert_eq!(journal(vec![item("e5", "c3")], Some(1)).await, [New]);
    assert_eq!(s.chat_pauses(&bot).await.unwrap().len(), 1);
    assert_eq!(paused_chats(s.inbox_stats().await.unwrap()), 1);
    // A chat never paused: nothing to resume.
    let r = s.chat_resume(&bot, "c2", true).await.unwrap();
    assert_eq!((r.pause, r.replayed.len()), (None, 0));
    // Resumed with a replay: what ended paused comes back pending, in the order it came.
    let r = s.chat_resume(&bot, "c1", true).await.unwrap();
    assert_eq!(r.pause, Some(pause("c1", None, "still", began)));
    assert_eq!(
        r.replayed,
        [
            (bot.clone(), "e0".to_owned()),
            (bot.clone(), "e1".to_owned()),
            (bot.clone(), "e3".to_owned()),
            (unit.clone(), "e4".to_owned()),
        ]
    );
    let pending = pending_keys(&s, &bot).await;
    assert!(
        ["e0", "e1", "e3"]
            .iter()
            .all(|k| pending.iter().any(|p| p == k)),
        "{pending:?}"
    );
    assert_eq!(pending_keys(&s, &unit).await, ["e4"]);
    assert!(s.chat_pauses(&bot).await.unwrap().is_empty());
    assert_eq!(paused_chats(s.inbox_stats().await.unwrap()), 0);
    assert_eq!(journal(vec![item("e6", "c1")], Some(1)).await, [New]);
    assert!(!s.turn_view(&bot, "e6", "c1").await.unwrap().paused);
    // Resumed without a replay: what was recorded paused stays so.
    let again = botfleet_core::unix_ms();
    s.chat_pause(&bot, &pause("c1", Some(again + 3_600_000), "later", again))
        .await
        .unwrap();
    assert_eq!(journal(vec![item("e7", "c1")], Some(1)).await, [Paused]);
    let r = s.chat_resume(&bot, "c1", false).await.unwrap();
    assert_eq!(r.pause.map(|p| p.until_ms), Some(Some(again + 3_600_000)));
    assert!(r.replayed.is_empty());
    assert_eq!(
        s.inbox_entry(&bot, "e7").await.unwrap().map(|e| e.state),
        Some(InboxState::Paused)
    );
    // Kept as long as undeliverable entries, not as done ones.
    s.inbox_prune(i64::MAX, 0).await.unwrap();
    assert!(s.inbox_entry(&bot, "e7").await.unwrap().is_some());
    s.inbox_prune(i64::MAX, i64::MAX).await.unwrap();
    assert!(s.inbox_entry(&bot, "e7").await.unwrap().is_none());
}

/// A chat's log numbers its entries (each delivery once, whichever way it was journaled) and
/// what its turns said (only with the turn that ends the entry), in order, per chat; a reader
/// after a cursor gets what came after; pruning drops what the inbox forgets, numbers go on;
/// a reader tailing a chat while many writers journal into it at once misses nothing.
pub async fn chat_log_numbers_entries_and_what_was_said(s: Arc<dyn Store>) {
    use botfleet_store::{ChatEventKind, TurnFence, TurnRecord};
    let a = bid("log-a");
    let b = bid("log-b");
    let log = |bot: &BotId, chat: &str, after: u64, limit: usize| {
        let (s, bot, chat) = (s.clone(), bot.clone(), chat.to_owned());
        async move { s.chat_events(&bot, &chat, after, limit).await.unwrap() }
    };
    let keys = |events: &[botfleet_store::ChatEvent]| -> Vec<(ChatEventKind, String)> {
        events.iter().map(|e| (e.kind, e.entry.clone())).collect()
    };
    // A unit's journal under its claim, a redelivery among them.
    let send = InboxItem {
        key: botfleet_store::send_key("desk-1"),
        ..item("s", "c1")
    };
    s.journal_put(
        &a,
        &[item("e1", "c1"), item("e2", "c2"), item("e3", "c1")],
        Some(Fence(1)),
        None,
    )
    .await
    .unwrap();
    s.journal_put(&a, &[item("e1", "c1"), send.clone()], Some(Fence(1)), None)
        .await
        .unwrap();
    let c1 = log(&a, "c1", 0, 100).await;
    assert_eq!(
        keys(&c1),
        [
            (ChatEventKind::Received, "e1".to_owned()),
            (ChatEventKind::Received, "e3".to_owned()),
            (ChatEventKind::Send, send.key.clone()),
        ]
    );
    assert!(
        c1.windows(2).all(|w| w[0].n + 1 == w[1].n),
        "numbers grow, a redelivery takes none: {c1:?}"
    );
    assert_eq!(c1[0].body, item("e1", "c1").message);
    assert_eq!(c1[0].state, Some(InboxState::Pending));
    assert_eq!(
        keys(&log(&a, "c2", 0, 100).await),
        [(ChatEventKind::Received, "e2".to_owned())]
    );
    assert!(log(&a, "c3", 0, 100).await.is_empty());
    assert!(log(&b, "c1", 0, 100).await.is_empty(), "per bot");
    // The turn that ends e1 logs what it said, after what was recorded before.
    let said = vec![
        r#"{"type":"send","text":"one"}"#.to_owned(),
        r#"{"type":"send","text":"two"}"#.to_owned(),
    ];
    let mut rec = TurnRecord::new(
        "e1",
        "c1",
        TurnFence::Claim(Fence(1)),
        InboxOutcome::Done,
        true,
        None,
    );
    rec.said = said.clone();
    s.turn_record(&a, &rec).await.unwrap();
    // Recorded again (the entry ended already): nothing logged twice.
    s.turn_record(&a, &rec).await.unwrap();
    let after = c1[2].n;
    let next = log(&a, "c1", after, 100).await;
    assert_eq!(
        keys(&next),
        [
            (ChatEventKind::Said, "e1".to_owned()),
            (ChatEventKind::Said, "e1".to_owned()),
        ]
    );
    assert_eq!(
        next.iter().map(|e| e.body.clone()).collect::<Vec<_>>(),
        said
    );
    assert!(next.iter().all(|e| e.n > after && e.state.is_none()));
    assert_eq!(next[0].n + 1, next[1].n);
    let all = log(&a, "c1", 0, 100).await;
    assert_eq!(
        all[0].state,
        Some(InboxState::Done),
        "the entry's state as it is now"
    );
    assert_eq!(log(&a, "c1", 0, 2).await, all[..2], "a limit");
    assert_eq!(log(&a, "c1", c1[0].n, 1).await, all[1..2], "after a cursor");
    // A stale claim's record logs nothing.
    s.accept_fence(&a, Fence(2)).await.unwrap();
    let mut stale = TurnRecord::new(
        "e3",
        "c1",
        TurnFence::Claim(Fence(1)),
        InboxOutcome::Done,
        true,
        None,
    );
    stale.said = vec![r#"{"type":"send","text":"stale"}"#.to_owned()];
    assert!(s.turn_record(&a, &stale).await.is_err());
    assert_eq!(log(&a, "c1", 0, 100).await.len(), 5);
    // Journaled without a claim (webhook deliveries), with and without a view; a chat turn's
    // record logs what it said.
    s.journal_put(&b, &[item("w1", "c1"), item("w2", "c1")], None, None)
        .await
        .unwrap();
    s.journal_put(&b, &[item("w3", "c1"), item("w1", "c1")], None, Some(0))
        .await
        .unwrap();
    let mut rec = TurnRecord::new(
        "w1",
        "c1",
        TurnFence::Chat(Fence(1)),
        InboxOutcome::Done,
        true,
        None,
    );
    rec.said = vec![r#"{"type":"send","text":"w"}"#.to_owned()];
    s.turn_record(&b, &rec).await.unwrap();
    assert_eq!(
        keys(&log(&b, "c1", 0, 100).await),
        [
            (ChatEventKind::Received, "w1".to_owned()),
            (ChatEventKind::Received, "w2".to_owned()),
            (ChatEventKind::Received, "w3".to_owned()),
            (ChatEventKind::Said, "w1".to_owned()),
        ]
    );
    // Pruned with the inbox: the answered entry and what was said go; numbers go on.
    let last = log(&a, "c1", 0, 100).await.last().unwrap().n;
    s.inbox_prune(botfleet_core::unix_ms() + 1, 0)
        .await
        .unwrap();
    let kept = log(&a, "c1", 0, 100).await;
    assert!(
        !kept.iter().any(|e| e.entry == "e1"),
        "the answered entry and what its turn said are pruned: {kept:?}"
    );
    assert!(
        kept.iter().any(|e| e.entry == "e3"),
        "the pending one stays"
    );
    s.journal_put(&a, &[item("e4", "c1")], Some(Fence(2)), None)
        .await
        .unwrap();
    let e4 = log(&a, "c1", last, 100).await;
    assert_eq!(keys(&e4), [(ChatEventKind::Received, "e4".to_owned())]);
    // The slices of a bot share one count per chat.
    let (s1, s2) = (a.slice(1), a.slice(2));
    s.journal_put(&s1, &[item("x1", "sl")], None, None)
        .await
        .unwrap();
    s.journal_put(&s2, &[item("x2", "sl")], None, None)
        .await
        .unwrap();
    let (x1, x2) = (log(&s1, "sl", 0, 10).await, log(&s2, "sl", 0, 10).await);
    assert_eq!((x1.len(), x2.len()), (1, 1));
    assert!(x2[0].n > x1[0].n, "{x1:?} {x2:?}");
    // What was said is kept as long as its entry (an undeliverable one: days).
    let mut rec = TurnRecord::new(
        "x1",
        "sl",
        TurnFence::Chat(Fence(1)),
        InboxOutcome::Undeliverable("given up".into()),
        true,
        None,
    );
    rec.said = vec![r#"{"type":"send","text":"part"}"#.to_owned()];
    s.turn_record(&s1, &rec).await.unwrap();
    s.inbox_prune(botfleet_core::unix_ms() + 1, 0)
        .await
        .unwrap();
    assert_eq!(
        keys(&log(&s1, "sl", 0, 10).await),
        [
            (ChatEventKind::Received, "x1".to_owned()),
            (ChatEventKind::Said, "x1".to_owned())
        ]
    );
    s.inbox_prune(botfleet_core::unix_ms() + 1, botfleet_core::unix_ms() + 1)
        .await
        .unwrap();
    assert!(log(&s1, "sl", 0, 10).await.is_empty());
    // Many writers at once, one reader tailing with its cursor: nothing is skipped.
    let writers: Vec<_> = (0..24)
        .map(|i| {
            let (s, b) = (s.clone(), b.clone());
            tokio::spawn(async move {
                s.journal_put(&b, &[item(&format!("t{i}"), "busy")], None, None)
                    .await
                    .unwrap();
            })
        })
        .collect();
    let mut seen = Vec::new();
    let mut cursor = 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while seen.len() < 24 {
        assert!(std::time::Instant::now() < deadline, "seen only {seen:?}");
        for e in log(&b, "busy", cursor, 5).await {
            assert!(e.n > cursor);
            cursor = e.n;
            seen.push(e.entry);
        }
        tokio::task::yield_now().await;
    }
    for w in writers {
        w.await.unwrap();
    }
    seen.sort();
    let mut all: Vec<String> = (0..24).map(|i| format!("t{i}")).collect();
    all.sort();
    assert_eq!(seen, all, "each once, none skipped");
}

/// A chat remembers when its user last wrote (an event journaled, whichever way; a send from
/// the backend is not the user's), for every slice of its bot, and the turn's view says it.
pub async fn chats_remember_when_their_user_last_wrote(s: Arc<dyn Store>) {
    let bot = bid("last-in");
    let view = |key: &str, chat: &str| {
        let (s, bot, key, chat) = (s.clone(), bot.clone(), key.to_owned(), chat.to_owned());
        async move { s.turn_view(&bot, &key, &chat).await.unwrap().last_in_ms }
    };
    let send = |k: &str, chat: &str| InboxItem {
        key: botfleet_store::send_key(k),
        ..item(k, chat)
    };
    let before = botfleet_core::unix_ms();
    s.journal_put(
        &bot,
        &[item("e1", "c1"), send("s1", "c2")],
        Some(Fence(1)),
        None,
    )
    .await
    .unwrap();
    let after = botfleet_core::unix_ms();
    let t = view("e1", "c1").await.expect("the event's time");
    assert!((before..=after).contains(&t), "{before} <= {t} <= {after}");
    assert_eq!(view("x", "c2").await, None, "a send is not the user's");
    assert_eq!(view("x", "c3").await, None, "nothing written");
    s.journal_put(&bot, &[send("s2", "c1")], None, None)
        .await
        .unwrap();
    assert_eq!(view("x", "c1").await, Some(t), "a send leaves it");
    // Journaled with the view of the item: the view says it at once.
    let (_, v) = s
        .journal_put(&bot, &[item("e2", "c4")], None, Some(0))
        .await
        .unwrap();
    let t4 = v.unwrap().last_in_ms.expect("said at once");
    assert!(t4 >= t);
    assert_eq!(view("e2", "c4").await, Some(t4));
    let (_, v) = s
        .journal_put(&bot, &[send("s3", "c5")], None, Some(0))
        .await
        .unwrap();
    assert_eq!(v.unwrap().last_in_ms, None);
    // One record across the bot's slices.
    s.journal_put(&bot.slice(1), &[item("x1", "sl")], None, None)
        .await
        .unwrap();
    let on_other = s
        .turn_view(&bot.slice(2), "none", "sl")
        .await
        .unwrap()
        .last_in_ms;
    assert!(on_other.is_some_and(|x| x >= t), "{on_other:?}");
    // What a user wrote that the bot does not handle (not journaled) is recorded as seen:
    // for a chat never written, as given; never moved back; for any unit of the bot.
    let day_ago = botfleet_core::unix_ms() - 86_400_000;
    let seen = |chat: &str, at: i64| (chat.to_owned(), at);
    s.chat_seen(
        &bot.slice(3),
        &[
            seen("seen1", day_ago),
            seen("seen2", day_ago),
            seen("seen1", day_ago - 5),
        ],
    )
    .await
    .unwrap();
    assert_eq!(view("x", "seen1").await, Some(day_ago));
    assert_eq!(view("x", "seen2").await, Some(day_ago));
    s.chat_seen(&bot, &[seen("seen1", day_ago - 1_000)])
        .await
        .unwrap();
    assert_eq!(view("x", "seen1").await, Some(day_ago), "not moved back");
    s.chat_seen(&bot, &[seen("c1", t + 5)]).await.unwrap();
    assert_eq!(view("x", "c1").await, Some(t + 5), "moved on");
    s.chat_seen(&bot, &[]).await.unwrap();
    // Seen takes no number of the chat's log: the next entry is its first item.
    let (_, v) = s
        .journal_put(&bot, &[item("e3", "seen2")], None, Some(0))
        .await
        .unwrap();
    assert!(v.unwrap().last_in_ms.is_some_and(|x| x > day_ago));
    let log = s.chat_events(&bot, "seen2", 0, 10).await.unwrap();
    assert_eq!(log.iter().map(|e| e.n).collect::<Vec<_>>(), [1], "{log:?}");
}

/// A resume with replay racing writes that record entries paused — journal writes of the
/// chat, turns ending an entry read paused — leaves none paused: each entry ends pending
/// (written after the pause was lifted, or recorded paused and replayed), or the turn is told
/// [`StateWrite::Unpaused`](botfleet_store::StateWrite::Unpaused) (a write that read the pause
/// and commits after the replay read the entries would leave it paused for good).
pub async fn resumes_race_no_write_that_pauses(s: Arc<dyn Store>) {
    use botfleet_store::StateWrite;
    let bot = bid("race");
    // A turn that read the chat paused, recording after the resume: told, nothing written.
    s.journal_put(&bot, &[item("t0", "tc")], None, None)
        .await
        .unwrap();
    let began = botfleet_core::unix_ms();
    s.chat_pause(&bot, &pause("tc", None, "desk", began))
        .await
        .unwrap();
    s.chat_resume(&bot, "tc", false).await.unwrap();
    let w = end_in(&s, &bot, "t0", "tc", InboxOutcome::Paused, 1).await;
    assert_eq!(w.unwrap(), StateWrite::Unpaused);
    let t0 = s.inbox_entry(&bot, "t0").await.unwrap().unwrap();
    assert_eq!(t0.state, InboxState::Pending, "left for the turn to answer");
    // Racing: a turn's paused end against a resume with replay.
    for round in 0..40 {
        let (chat, key) = (format!("tc{round}"), format!("tr{round}"));
        s.journal_put(&bot, &[item(&key, &chat)], None, None)
            .await
            .unwrap();
        s.chat_pause(&bot, &pause(&chat, None, "desk", botfleet_core::unix_ms()))
            .await
            .unwrap();
        let turn = {
            let (s, bot, chat, key) = (s.clone(), bot.clone(), chat.clone(), key.clone());
            tokio::spawn(async move {
                end_in(&s, &bot, &key, &chat, InboxOutcome::Paused, 1)
                    .await
                    .unwrap()
            })
        };
        tokio::task::yield_now().await;
        let resumed = s.chat_resume(&bot, &chat, true).await.unwrap();
        let w = turn.await.unwrap();
        let e = s.inbox_entry(&bot, &key).await.unwrap().unwrap();
        assert_eq!(
            e.state,
            InboxState::Pending,
            "round {round}: the turn was told {w:?}, {} replayed",
            resumed.replayed.len()
        );
        assert!(
            (w == StateWrite::Unpaused) != (resumed.replayed.len() == 1),
            "round {round}: answered by the turn ({w:?}) or replayed ({:?}), once",
            resumed.replayed
        );
    }
    // Racing: journal writes against a resume with replay.
    for round in 0..25 {
        let chat = format!("c{round}");
        let began = botfleet_core::unix_ms();
        s.chat_pause(&bot, &pause(&chat, None, "desk", began))
            .await
            .unwrap();
        let mut writers = Vec::new();
        for w in 0..6 {
            let (s, bot, chat) = (s.clone(), bot.clone(), chat.clone());
            writers.push(tokio::spawn(async move {
                let mut keys = Vec::new();
                for i in 0..4 {
                    let key = format!("r{chat}-{w}-{i}");
                    s.journal_put(&bot, &[item(&key, &chat)], None, None)
                        .await
                        .unwrap();
                    keys.push(key);
                }
                keys
            }));
        }
        let resume = {
            let (s, bot, chat) = (s.clone(), bot.clone(), chat.clone());
            tokio::spawn(async move {
                tokio::task::yield_now().await;
                s.chat_resume(&bot, &chat, true).await.unwrap()
            })
        };
        let mut keys = Vec::new();
        for w in writers {
            keys.extend(w.await.unwrap());
        }
        let resumed = resume.await.unwrap();
        for key in &keys {
            let e = s.inbox_entry(&bot, key).await.unwrap().expect("journaled");
            assert_eq!(
                e.state,
                InboxState::Pending,
                "round {round}: {key} left {:?} by a resume with replay ({} replayed)",
                e.state,
                resumed.replayed.len()
            );
        }
    }
}

/// Generates a module `conformance_store` with one `#[tokio::test]` per suite case, each on a
/// fresh store from `$fixture` (an async expression yielding a
/// [`StoreFixture`](crate::store_suite::StoreFixture)).
#[macro_export]
macro_rules! store_conformance {
    ($fixture:expr) => {
        $crate::store_conformance!(@cases $fixture;
            bots_round_trip,
            add_refuses_duplicates_and_bad_specs,
            list_filters,
            update_keeps_status,
            status_is_recorded,
            remove_bots,
            cursor_writes_are_fenced,
            accept_fence_raises_the_floor,
            fences_survive_removal,
            concurrent_fenced_writes,
            registry_stamp_tracks_spec_changes,
            claim_turns_are_fenced_by_the_bot,
            batch_calls_answer_like_single_calls,
            inbox_records_once_in_order,
            entry_sequences_are_arrival_times,
            backend_sends_are_entries_found_again_by_their_key,
            sends_are_counted_per_bot_by_state,
            inbox_writes_are_fenced,
            inbox_prune_forgets_finished_entries,
            app_tokens_round_trip_and_stay_secret,
            journal_takes_each_delivery_once,
            journal_and_view_in_one_call,
            session_records_are_fenced_and_move_whole,
            webhook_settings_round_trip_and_stay_secret,
            conditional_updates_never_overwrite_a_change,
            turns_read_and_write_state_outbox_and_entry,
            action_progress_and_refs_are_fenced,
            pending_entries_of_one_chat,
            fleet_secrets_are_made_once_and_shared,
            held_turns_take_posted_parts_once_in_order,
            parts_posted_at_once_are_each_kept_once,
            paused_chats_are_recorded_not_answered,
            chat_log_numbers_entries_and_what_was_said,
            chats_remember_when_their_user_last_wrote,
            resumes_race_no_write_that_pauses,
        );
    };
    (@cases $fixture:expr; $($case:ident),* $(,)?) => {
        mod conformance_store {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let fixture = $fixture;
                    let Some(fixture) = fixture else { return };
                    let store = $crate::store_suite::StoreFixture::store(&fixture).await;
                    $crate::store_suite::$case(store).await;
                }
            )*
        }
    };
}
