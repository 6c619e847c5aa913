//! The schema, as an ordered list of migrations shared by the SQL backends.

/// Migrations in order; a migration's version is its index + 1. Append only: never edit a
/// migration that has shipped.
pub(crate) const MIGRATIONS: &[&str] = &[
    // 1: bot registry and fenced per-bot state.
    "CREATE TABLE bots (
        id TEXT PRIMARY KEY,
        platform TEXT NOT NULL,
        token TEXT NOT NULL,
        api_url TEXT,
        handler TEXT NOT NULL,
        webhook_url TEXT,
        webhook_secret TEXT,
        enabled BOOLEAN NOT NULL,
        status TEXT NOT NULL,
        last_error TEXT,
        created_at_ms BIGINT NOT NULL,
        updated_at_ms BIGINT NOT NULL
    );
    CREATE INDEX bots_by_platform ON bots (platform, enabled);
    CREATE TABLE bot_fences (
        bot_id TEXT PRIMARY KEY,
        fence BIGINT NOT NULL,
        cursor TEXT
    );",
    // 2: which worker reported a bot's status last.
    "ALTER TABLE bots ADD COLUMN reported_by TEXT;",
    // 3: replies sent for messages above the cursor (cleared when the cursor moves).
    "CREATE TABLE sent_replies (
        bot_id TEXT NOT NULL,
        key TEXT NOT NULL,
        PRIMARY KEY (bot_id, key)
    );",
    // 4: a second credential (Slack's app token), and the inbox: every message recorded on
    // arrival, before the platform is told it was received, until it is answered.
    "ALTER TABLE bots ADD COLUMN app_token TEXT;
    CREATE TABLE inbox (
        bot_id TEXT NOT NULL,
        key TEXT NOT NULL,
        seq BIGINT NOT NULL,
        chat TEXT NOT NULL,
        message TEXT NOT NULL,
        state TEXT NOT NULL,
        error TEXT,
        received_at_ms BIGINT NOT NULL,
        finished_at_ms BIGINT,
        PRIMARY KEY (bot_id, key)
    );
    CREATE INDEX inbox_by_state ON inbox (bot_id, state, seq);
    CREATE INDEX inbox_by_finish ON inbox (state, finished_at_ms);",
    // 5: Discord's shard count (NULL: what Discord recommends).
    "ALTER TABLE bots ADD COLUMN shards BIGINT;",
    // 6: Discord shards per slice (NULL: the whole bot is one unit).
    "ALTER TABLE bots ADD COLUMN shards_per_slice BIGINT;",
    // 7: webhook bots: replies sent (the outbox, fenced by the chat's turn) and conversation
    // state per chat (compare-and-set on revision, fenced by the turn).
    "CREATE TABLE outbox (
        bot_id TEXT NOT NULL,
        key TEXT NOT NULL,
        fence BIGINT NOT NULL,
        sent_at_ms BIGINT NOT NULL,
        PRIMARY KEY (bot_id, key)
    );
    CREATE INDEX outbox_by_time ON outbox (sent_at_ms);
    CREATE TABLE chat_state (
        bot_id TEXT NOT NULL,
        chat TEXT NOT NULL,
        revision BIGINT NOT NULL,
        fence BIGINT NOT NULL,
        state TEXT,
        updated_at_ms BIGINT NOT NULL,
        PRIMARY KEY (bot_id, chat)
    );",
    // 8: how a bot receives (mode) and what verifies its webhook deliveries, sealed as one
    // JSON document (NULL: a polling or socket bot with no such settings).
    "ALTER TABLE bots ADD COLUMN hook TEXT;",
    // 9: a linked-device session's records (WhatsApp Web), sealed, written under the claim's
    // fence.
    "CREATE TABLE session_records (
        bot_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        key TEXT NOT NULL,
        value TEXT NOT NULL,
        updated_at_ms BIGINT NOT NULL,
        PRIMARY KEY (bot_id, kind, key)
    );",
    // 10: every bot's turns record their replies in the outbox (migration 7); the per-bot
    // sent marks of migration 3 were never read by a turn and go.
    "DROP TABLE IF EXISTS sent_replies;",
    // 11: a journal write numbers on from the bot's last entry (`MAX(seq)`), which no index
    // answered: it read every entry the bot keeps (answered ones an hour, undeliverable ones a
    // week), 11 ms per write at 100,000 entries on SQLite, inside the one writer.
    "CREATE INDEX inbox_by_seq ON inbox (bot_id, seq);",
    // 12: handlers' actions: how far a turn of several actions got (an outbox row per entry
    // with its progress), and the names turns give in a chat (a sent message's ref → its id,
    // a long button value's key → the value), kept 48 h.
    "ALTER TABLE outbox ADD COLUMN result TEXT;
    CREATE TABLE refs (
        bot_id TEXT NOT NULL,
        chat TEXT NOT NULL,
        name TEXT NOT NULL,
        value TEXT NOT NULL,
        expires_at_ms BIGINT NOT NULL,
        PRIMARY KEY (bot_id, chat, name)
    );
    CREATE INDEX refs_by_expiry ON refs (expires_at_ms);",
    // 13: sends from the backend counted per bot and state (`inbox_stats`) without reading
    // every answered message the inbox keeps.
    "CREATE INDEX inbox_sends ON inbox (bot_id, state) WHERE key >= 'send:' AND key < 'send;';",
    // 14: answers that come later. An entry's turn held open (`held_until_ms`: when the hold
    // expires), how many parts of its answer were posted (`posts`, what numbers the next one:
    // an update of the entry's row, so concurrent posts through many workers queue on it) and
    // whether the last one was (`posts_closed`); the parts themselves, under the client's key
    // (hashed) and a digest of the body (a repeat with another body is refused).
    "ALTER TABLE inbox ADD COLUMN held_until_ms BIGINT;
    ALTER TABLE inbox ADD COLUMN posts BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE inbox ADD COLUMN posts_closed BOOLEAN NOT NULL DEFAULT FALSE;
    CREATE INDEX inbox_held ON inbox (bot_id) WHERE state = 'pending' AND held_until_ms IS NOT NULL;
    CREATE TABLE replies (
        bot_id TEXT NOT NULL,
        entry TEXT NOT NULL,
        seq BIGINT NOT NULL,
        post_key TEXT NOT NULL,
        digest TEXT NOT NULL,
        body TEXT NOT NULL,
        is_final BOOLEAN NOT NULL,
        posted_at_ms BIGINT NOT NULL,
        PRIMARY KEY (bot_id, entry, seq),
        UNIQUE (bot_id, entry, post_key)
    );
    CREATE INDEX replies_by_time ON replies (posted_at_ms);",
    // 15: chats handed to a person. A chat's pause (the bot's own id: every slice of it;
    // `until_ms` NULL until it is lifted), read by every journal write and turn; the entries
    // recorded paused, found by chat to replay.
    "CREATE TABLE chat_pauses (
        bot_id TEXT NOT NULL,
        chat TEXT NOT NULL,
        until_ms BIGINT,
        reason TEXT,
        paused_at_ms BIGINT NOT NULL,
        PRIMARY KEY (bot_id, chat)
    );
    CREATE INDEX inbox_paused ON inbox (bot_id, chat, seq) WHERE state = 'paused';",
    // 16: a chat's log, read by a desk with a cursor. Each chat numbers what it records — its
    // entries (`inbox.n`) and what its turns said (`chat_said`) — from one counter per chat
    // (`chat_heads`, under the bot's own id: one count across its slices), taken in the
    // writing transaction: a number is taken only after the
    // chat's last one was committed, so a reader that has seen `n` never finds a lower number
    // committed later. Entries recorded before this version have no number (not listed).
    "ALTER TABLE inbox ADD COLUMN n BIGINT;
    CREATE INDEX inbox_by_chat_n ON inbox (bot_id, chat, n);
    CREATE TABLE chat_heads (
        bot_id TEXT NOT NULL,
        chat TEXT NOT NULL,
        n BIGINT NOT NULL,
        PRIMARY KEY (bot_id, chat)
    );
    CREATE TABLE chat_said (
        bot_id TEXT NOT NULL,
        chat TEXT NOT NULL,
        n BIGINT NOT NULL,
        entry TEXT NOT NULL,
        body TEXT NOT NULL,
        at_ms BIGINT NOT NULL,
        PRIMARY KEY (bot_id, chat, n)
    );
    CREATE INDEX chat_said_by_time ON chat_said (at_ms);",
    // 17: when each chat's user last wrote (unix ms; an event journaled, a send from the
    // backend not): what a platform's reply window counts from (WhatsApp Cloud lets a
    // business send more than templates for 24 hours after it).
    "ALTER TABLE chat_heads ADD COLUMN last_in_ms BIGINT;",
];

/// Whether the chat of an item (`$chat`, its key `$key`) is paused now, as an SQL literal:
/// `$bot` the bot's own id, `$now` now (unix ms). A send from the backend never is.
macro_rules! paused_now {
    ($bot:literal, $now:literal, $chat:literal, $key:literal) => {
        concat!(
            "(substr(",
            $key,
            ", 1, 5) <> 'send:' AND EXISTS (SELECT 1 FROM chat_pauses p ",
            "WHERE p.bot_id = ",
            $bot,
            " AND p.chat = ",
            $chat,
            " AND (p.until_ms IS NULL OR p.until_ms > ",
            $now,
            ")))"
        )
    };
}
pub(crate) use paused_now;

/// Takes `$3` numbers of a chat's log (`$1` the bot's own id: its slices share the count,
/// `$2` chat): answers the last one taken. The counter's row stays locked until the
/// transaction ends, so numbers commit in order.
pub(crate) const CHAT_HEAD_TAKE: &str =
    "INSERT INTO chat_heads (bot_id, chat, n) VALUES ($1, $2, $3) \
     ON CONFLICT (bot_id, chat) DO UPDATE SET n = chat_heads.n + excluded.n RETURNING n";

/// The later of a chat head's `last_in_ms` and the one an upsert brings (either may be NULL):
/// a worker whose clock lags never moves it back.
macro_rules! later_in {
    () => {
        "CASE WHEN excluded.last_in_ms IS NULL THEN chat_heads.last_in_ms \
         WHEN chat_heads.last_in_ms IS NULL OR excluded.last_in_ms > chat_heads.last_in_ms \
         THEN excluded.last_in_ms ELSE chat_heads.last_in_ms END"
    };
}
pub(crate) use later_in;

/// Takes `$3` numbers of a chat's log as [`CHAT_HEAD_TAKE`] does, and records `$4` (unix ms,
/// or NULL: nothing a user wrote) as when its user last wrote.
pub(crate) const CHAT_HEAD_JOURNAL: &str = concat!(
    "INSERT INTO chat_heads (bot_id, chat, n, last_in_ms) VALUES ($1, $2, $3, $4) \
     ON CONFLICT (bot_id, chat) DO UPDATE SET n = chat_heads.n + excluded.n, last_in_ms = ",
    later_in!(),
    " RETURNING n"
);

/// Forgets what turns said before `$1` whose entries are gone (pruned): what was said is
/// kept as long as the entry it answered.
pub(crate) const SAID_PRUNE: &str = "DELETE FROM chat_said WHERE at_ms < $1 AND NOT EXISTS \
     (SELECT 1 FROM inbox i WHERE i.bot_id = chat_said.bot_id AND i.key = chat_said.entry)";

/// A chat's log after a number (`$1` bot, `$2` chat, `$3` after, `$4` how many): its
/// entries and what its turns said, in order: `(n, said, key, body, state, at_ms)`.
pub(crate) const CHAT_EVENTS: &str = "SELECT n, said, k, body, st, at_ms FROM (\
     SELECT n, FALSE AS said, key AS k, message AS body, state AS st, received_at_ms AS at_ms \
     FROM inbox WHERE bot_id = $1 AND chat = $2 AND n > $3 \
     UNION ALL SELECT n, TRUE, entry, body, NULL, at_ms FROM chat_said \
     WHERE bot_id = $1 AND chat = $2 AND n > $3) AS l ORDER BY n LIMIT $4";

/// Pauses a chat (`$1` the bot's own id, `$2` chat, `$3` until, `$4` reason, `$5` now); paused
/// again while paused, it keeps the time it began.
pub(crate) const PAUSE_PUT: &str =
    "INSERT INTO chat_pauses (bot_id, chat, until_ms, reason, paused_at_ms) \
     VALUES ($1, $2, $3, $4, $5) \
     ON CONFLICT (bot_id, chat) DO UPDATE SET until_ms = excluded.until_ms, \
     reason = excluded.reason, paused_at_ms = CASE WHEN chat_pauses.until_ms IS NULL \
     OR chat_pauses.until_ms > excluded.paused_at_ms THEN chat_pauses.paused_at_ms \
     ELSE excluded.paused_at_ms END";

/// Lifts a chat's pause (`$1` the bot's own id, `$2` chat); answers the pause lifted.
pub(crate) const PAUSE_DELETE: &str = "DELETE FROM chat_pauses WHERE bot_id = $1 AND chat = $2 \
     RETURNING until_ms, reason, paused_at_ms";

/// Makes a chat's entries that ended paused since `$3` pending again (`$1` the bot's own id,
/// `$2` chat, `$4` how its slices' ids begin: `id#`); answers them.
pub(crate) const PAUSED_REPLAY: &str = "UPDATE inbox SET state = 'pending', finished_at_ms = NULL \
     WHERE (bot_id = $1 OR substr(bot_id, 1, length($4)) = $4) AND chat = $2 \
     AND state = 'paused' AND finished_at_ms >= $3 RETURNING bot_id, key, seq";

/// The bot's chats paused now (`$1` the bot's own id, `$2` now).
pub(crate) const PAUSES_LIST: &str = "SELECT chat, until_ms, reason, paused_at_ms \
     FROM chat_pauses WHERE bot_id = $1 AND (until_ms IS NULL OR until_ms > $2) ORDER BY chat";

/// Holds an entry's turn (`$1` bot, `$2` entry key, `$3` chat, `$4` fence, `$5` until, `$6`
/// whether the bot's claim holds the turn): the first hold's expiry stays. Answers the
/// expiry in effect; no row when the entry is not pending or the fence is stale.
pub(crate) const TURN_HOLD: &str = "UPDATE inbox SET held_until_ms = COALESCE(held_until_ms, $5) \
     WHERE bot_id = $1 AND key = $2 AND state = 'pending' AND CASE WHEN $6 \
     THEN COALESCE((SELECT fence FROM bot_fences WHERE bot_id = $1), 0) <= $4 \
     ELSE NOT EXISTS (SELECT 1 FROM chat_state WHERE bot_id = $1 AND chat = $3 AND fence > $4) END \
     RETURNING held_until_ms";

/// Numbers a posted part (`$1` bot, `$2` entry key, `$3` whether it is the last, `$4` now):
/// the entry's count of parts goes up while it takes parts. Answers the part's number; no row
/// when the entry takes no more.
pub(crate) const REPLY_NUMBER: &str = "UPDATE inbox SET posts = posts + 1, posts_closed = $3 \
     WHERE bot_id = $1 AND key = $2 AND state = 'pending' AND NOT posts_closed \
     AND (held_until_ms IS NULL OR held_until_ms > $4) RETURNING posts";

/// Keeps a numbered part (`$1` bot, `$2` entry key, `$3` number, `$4` hashed key, `$5` body
/// digest, `$6` body, `$7` last, `$8` now).
pub(crate) const REPLY_INSERT: &str =
    "INSERT INTO replies (bot_id, entry, seq, post_key, digest, body, is_final, posted_at_ms) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8)";

/// The parts of an entry after a number (`$1` bot, `$2` entry key, `$3` number), in order.
pub(crate) const REPLIES_AFTER: &str = "SELECT seq, body, is_final, posted_at_ms FROM replies \
     WHERE bot_id = $1 AND entry = $2 AND seq > $3 ORDER BY seq";

/// Entries with parts posted at or after `$1`, with their latest part's number.
pub(crate) const REPLIES_SINCE: &str =
    "SELECT bot_id, entry, MAX(seq) FROM replies WHERE posted_at_ms >= $1 GROUP BY bot_id, entry";

/// Forgets the parts of entries no longer pending, posted before `$1`.
pub(crate) const REPLIES_PRUNE: &str =
    "DELETE FROM replies WHERE posted_at_ms < $1 AND NOT EXISTS (SELECT 1 FROM inbox i \
     WHERE i.bot_id = replies.bot_id AND i.key = replies.entry AND i.state = 'pending')";

/// Per bot and state, `(bot, state, is_send, count)`: the pending and undeliverable entries
/// (`is_send` 0), the sends from the backend in every state (1, through `inbox_sends`), the
/// held turns (2, through `inbox_held`) and the chats paused at `$1` (3).
pub(crate) const INBOX_STATS: &str =
    "SELECT bot_id, state, 0, COUNT(*) FROM inbox WHERE state IN ('pending', 'undeliverable') \
     GROUP BY bot_id, state \
     UNION ALL \
     SELECT bot_id, state, 1, COUNT(*) FROM inbox WHERE key >= 'send:' AND key < 'send;' \
     GROUP BY bot_id, state \
     UNION ALL \
     SELECT bot_id, 'held', 2, COUNT(*) FROM inbox WHERE state = 'pending' \
     AND held_until_ms IS NOT NULL GROUP BY bot_id \
     UNION ALL \
     SELECT bot_id, 'paused', 3, COUNT(*) FROM chat_pauses \
     WHERE until_ms IS NULL OR until_ms > $1 GROUP BY bot_id";

/// Writes a turn's progress row (`$1` bot, `$2` progress key, `$3` fence, `$4` now, `$5` the
/// progress).
pub(crate) const PROGRESS_PUT: &str =
    "INSERT INTO outbox (bot_id, key, fence, sent_at_ms, result) VALUES ($1, $2, $3, $4, $5) \
     ON CONFLICT (bot_id, key) DO UPDATE SET fence = excluded.fence, \
     sent_at_ms = excluded.sent_at_ms, result = excluded.result";

/// Upserts a ref (`$1` bot, `$2` chat, `$3` name, `$4` value, `$5` expiry).
pub(crate) const REF_PUT: &str =
    "INSERT INTO refs (bot_id, chat, name, value, expires_at_ms) VALUES ($1, $2, $3, $4, $5) \
     ON CONFLICT (bot_id, chat, name) DO UPDATE SET value = excluded.value, \
     expires_at_ms = excluded.expires_at_ms";

/// The `hook` column's document: the receive settings and secrets, a Discord bot's counted
/// shards and the bot's commands (sealed as one).
#[derive(serde::Serialize, serde::Deserialize, Default, PartialEq)]
struct HookDoc {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_connections: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    phone_number_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    secret: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    verify_token: Option<String>,
    /// Discord auto-sliced bots: the count in use and the recommendation last read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    shards_in_use: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    shards_recommended: Option<u32>,
    /// The bot's commands.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    commands: Vec<botfleet_core::CommandSpec>,
    /// The bot's own handler timeout, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    handler_timeout_s: Option<u32>,
    /// Typing shown while turns run long (`None`: yes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    typing: Option<bool>,
    /// The bot's own time to live of a held turn, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    async_reply_ttl_s: Option<u32>,
    /// How its streamed answers go (`None`: natively where the platform can).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    stream: Option<botfleet_core::StreamMode>,
    /// The bot's own send limits (see `BotOptions::rate_limits`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rate_limits: Option<String>,
}

/// The conversation-state upsert shared by the SQL backends: `$1` bot, `$2` chat, `$3` the
/// revision the state was computed from, `$4` fence, `$5` state, `$6` now; `claim` names the
/// parameter that says the turn is held by the bot's claim ([`crate::TurnFence::Claim`]), and
/// `guard` is one more condition of the write. Writes only when the stored row is at `$3`
/// (or there is none and `$3` is 0) and, for a chat's turn, with a fence not above `$4`. A
/// claim's turn leaves the chat's fence as it was (0 for a new row): claims and chat turns
/// count fences apart, and a bot moved between modes must not be held up by the other count.
pub(crate) fn state_cas(claim: &str, guard: &str) -> String {
    format!(
        "INSERT INTO chat_state (bot_id, chat, revision, fence, state, updated_at_ms) \
         SELECT CAST($1 AS TEXT), CAST($2 AS TEXT), CAST($3 AS BIGINT) + 1, \
         CASE WHEN CAST({claim} AS BOOLEAN) THEN 0 ELSE CAST($4 AS BIGINT) END, \
         CAST($5 AS TEXT), CAST($6 AS BIGINT) \
         WHERE (CAST($3 AS BIGINT) = 0 OR EXISTS (SELECT 1 FROM chat_state WHERE bot_id = $1 AND chat = $2)) \
         AND {guard} \
         ON CONFLICT (bot_id, chat) DO UPDATE SET revision = excluded.revision, \
         fence = CASE WHEN CAST({claim} AS BOOLEAN) THEN chat_state.fence ELSE excluded.fence END, \
         state = excluded.state, updated_at_ms = excluded.updated_at_ms \
         WHERE chat_state.revision = CAST($3 AS BIGINT) \
         AND (CAST({claim} AS BOOLEAN) OR chat_state.fence <= CAST($4 AS BIGINT))"
    )
}

/// Records a turn of a chat under a fence (`$1` bot, `$2` chat, `$3` fence, `$4` now); no row
/// changes when a higher fence was recorded.
pub(crate) const TURN_ACCEPT: &str =
    "INSERT INTO chat_state (bot_id, chat, revision, fence, state, updated_at_ms) \
     VALUES ($1, $2, 0, $3, NULL, $4) \
     ON CONFLICT (bot_id, chat) DO UPDATE SET fence = excluded.fence \
     WHERE chat_state.fence <= excluded.fence";

/// What a turn starts from (`$1` bot, `$2` entry key, `$3` chat, `$4` reply key, `$5` the
/// bot's own id, `$6` now).
pub(crate) const TURN_VIEW: &str =
    "SELECT i.seq, i.chat, i.message, i.state, i.error, i.received_at_ms, \
     s.revision, s.state, EXISTS (SELECT 1 FROM outbox o WHERE o.bot_id = $1 AND o.key = $4), \
     i.held_until_ms, EXISTS (SELECT 1 FROM chat_pauses p WHERE p.bot_id = $5 AND p.chat = $3 \
     AND (p.until_ms IS NULL OR p.until_ms > $6)), \
     (SELECT h.last_in_ms FROM chat_heads h WHERE h.bot_id = $5 AND h.chat = $3) \
     FROM (SELECT 1 AS one) AS one \
     LEFT JOIN inbox i ON i.bot_id = $1 AND i.key = $2 \
     LEFT JOIN chat_state s ON s.bot_id = $1 AND s.chat = $3";

/// A row of `bots` as plain values, shared by the SQL backends.
pub(crate) struct BotRow {
    pub(crate) id: String,
    pub(crate) platform: String,
    pub(crate) token: String,
    pub(crate) app_token: Option<String>,
    pub(crate) shards: Option<i64>,
    pub(crate) shards_per_slice: Option<i64>,
    /// Sealed [`HookDoc`] JSON.
    pub(crate) hook: Option<String>,
    pub(crate) api_url: Option<String>,
    pub(crate) handler: String,
    pub(crate) webhook_url: Option<String>,
    pub(crate) webhook_secret: Option<String>,
    pub(crate) enabled: bool,
    pub(crate) status: String,
    pub(crate) last_error: Option<String>,
    pub(crate) reported_by: Option<String>,
    pub(crate) updated_at_ms: i64,
}

impl BotRow {
    /// The row of `spec`, its credentials sealed with `keys`.
    pub(crate) fn from_spec(
        spec: &botfleet_core::BotSpec,
        keys: &crate::Keyring,
    ) -> crate::Result<Self> {
        use botfleet_core::HandlerSpec;
        let id = spec.id.as_str();
        let (webhook_url, webhook_secret) = match &spec.handler {
            HandlerSpec::Echo | HandlerSpec::Named(_) => (None, None),
            HandlerSpec::Webhook { url, secret } => (
                Some(url.clone()),
                secret
                    .as_ref()
                    .map(|s| keys.seal(id, "webhook_secret", s.expose()))
                    .transpose()?,
            ),
        };
        let doc = HookDoc {
            mode: spec.options.mode.clone(),
            max_connections: spec.options.max_connections,
            phone_number_id: spec.options.phone_number_id.clone(),
            secret: spec.hook.secret.as_ref().map(|s| s.expose().to_owned()),
            verify_token: spec
                .hook
                .verify_token
                .as_ref()
                .map(|s| s.expose().to_owned()),
            shards_in_use: spec.options.shards_in_use,
            shards_recommended: spec.options.shards_recommended,
            commands: spec.options.commands.clone(),
            handler_timeout_s: spec.options.handler_timeout_s,
            typing: spec.options.typing,
            async_reply_ttl_s: spec.options.async_reply_ttl_s,
            stream: spec.options.stream,
            rate_limits: spec.options.rate_limits.clone(),
        };
        let hook = if doc == HookDoc::default() {
            None
        } else {
            let json = serde_json::to_string(&doc)
                .map_err(|e| crate::StoreError::Corrupt(e.to_string()))?;
            Some(keys.seal(id, "hook", &json)?)
        };
        Ok(Self {
            id: id.to_owned(),
            platform: spec.platform.as_str().to_owned(),
            hook,
            token: keys.seal(id, "token", spec.token.expose())?,
            app_token: spec
                .app_token
                .as_ref()
                .map(|t| keys.seal(id, "app_token", t.expose()))
                .transpose()?,
            api_url: spec.options.api_url.clone(),
            shards: spec.options.shards.map(i64::from),
            shards_per_slice: spec.options.shards_per_slice.map(i64::from),
            handler: spec.handler.kind().to_owned(),
            webhook_url,
            webhook_secret,
            enabled: spec.enabled,
            status: botfleet_core::BotStatus::Pending.as_str().to_owned(),
            last_error: None,
            reported_by: None,
            updated_at_ms: botfleet_core::unix_ms(),
        })
    }

    /// The record of this row, its credentials opened with `keys`.
    pub(crate) fn into_record(
        mut self,
        keys: &crate::Keyring,
    ) -> crate::Result<botfleet_core::BotRecord> {
        use botfleet_core::{BotId, BotOptions, BotRecord, BotSpec, HandlerSpec, Secret};
        let corrupt = |what: String| crate::StoreError::Corrupt(what);
        let id = BotId::new(self.id.clone()).map_err(|e| corrupt(e.to_string()))?;
        self.token = keys.open(&self.id, "token", &self.token)?;
        self.app_token = self
            .app_token
            .map(|t| keys.open(&self.id, "app_token", &t))
            .transpose()?;
        self.webhook_secret = self
            .webhook_secret
            .map(|t| keys.open(&self.id, "webhook_secret", &t))
            .transpose()?;
        let doc: HookDoc = match &self.hook {
            Some(h) => serde_json::from_str(&keys.open(&self.id, "hook", h)?)
                .map_err(|e| corrupt(format!("bot {id}: hook settings: {e}")))?,
            None => HookDoc::default(),
        };
        let platform = self
            .platform
            .parse()
            .map_err(|e: botfleet_core::UnknownPlatform| corrupt(format!("bot {id}: {e}")))?;
        let handler = HandlerSpec::from_parts(
            &self.handler,
            self.webhook_url,
            self.webhook_secret.map(Secret::new),
        )
        .map_err(|e| corrupt(format!("bot {id}: {e}")))?;
        let status = self
            .status
            .parse()
            .map_err(|e: String| corrupt(format!("bot {id}: {e}")))?;
        Ok(BotRecord {
            spec: BotSpec {
                id,
                platform,
                token: Secret::new(self.token),
                app_token: self.app_token.map(Secret::new),
                options: BotOptions {
                    api_url: self.api_url,
                    shards: self.shards.and_then(|n| u32::try_from(n).ok()),
                    shards_per_slice: self.shards_per_slice.and_then(|n| u32::try_from(n).ok()),
                    slice: None,
                    mode: doc.mode,
                    max_connections: doc.max_connections,
                    phone_number_id: doc.phone_number_id,
                    shards_in_use: doc.shards_in_use,
                    shards_recommended: doc.shards_recommended,
                    commands: doc.commands,
                    handler_timeout_s: doc.handler_timeout_s,
                    typing: doc.typing,
                    async_reply_ttl_s: doc.async_reply_ttl_s,
                    stream: doc.stream,
                    rate_limits: doc.rate_limits,
                },
                hook: botfleet_core::HookSecrets {
                    secret: doc.secret.map(Secret::new),
                    verify_token: doc.verify_token.map(Secret::new),
                },
                handler,
                enabled: self.enabled,
            },
            status,
            last_error: self.last_error,
            reported_by: self.reported_by,
            updated_at_ms: self.updated_at_ms,
        })
    }
}

/// The credentials of one row: (token, app token, webhook secret, hook settings).
pub(crate) type Sealed = (String, Option<String>, Option<String>, Option<String>);

/// `row`'s credentials as the first key seals them, or `None` when they are already so.
pub(crate) fn resealed(
    keys: &crate::Keyring,
    id: &str,
    row: &Sealed,
) -> crate::Result<Option<Sealed>> {
    let (token, app, hook, doc) = row;
    let current = keys.is_current(token)
        && app.as_deref().is_none_or(|a| keys.is_current(a))
        && hook.as_deref().is_none_or(|h| keys.is_current(h))
        && doc.as_deref().is_none_or(|d| keys.is_current(d));
    if current {
        return Ok(None);
    }
    let again = |field: &str, v: &str| -> crate::Result<String> {
        keys.seal(id, field, &keys.open(id, field, v)?)
    };
    Ok(Some((
        again("token", token)?,
        app.as_deref().map(|a| again("app_token", a)).transpose()?,
        hook.as_deref()
            .map(|h| again("webhook_secret", h))
            .transpose()?,
        doc.as_deref().map(|d| again("hook", d)).transpose()?,
    )))
}

/// A row of `inbox` as plain values, shared by the SQL backends.
pub(crate) struct InboxRow {
    pub(crate) key: String,
    pub(crate) seq: i64,
    pub(crate) chat: String,
    pub(crate) message: String,
    pub(crate) state: String,
    pub(crate) error: Option<String>,
    pub(crate) received_at_ms: i64,
}

impl InboxRow {
    pub(crate) fn into_entry(self, bot: &botfleet_core::BotId) -> crate::Result<crate::InboxEntry> {
        Ok(crate::InboxEntry {
            bot: bot.clone(),
            key: self.key,
            seq: self.seq.max(0).unsigned_abs(),
            chat: self.chat,
            message: self.message,
            state: self
                .state
                .parse()
                .map_err(|e: String| crate::StoreError::Corrupt(format!("bot {bot}: {e}")))?,
            error: self.error,
            received_at_ms: self.received_at_ms,
        })
    }
}

/// Per-bot inbox counts from the `(bot, state, is_send, count)` rows of [`INBOX_STATS`].
pub(crate) fn stats_from_rows(
    rows: Vec<(String, String, i64, i64)>,
) -> crate::Result<std::collections::HashMap<botfleet_core::BotId, crate::InboxStats>> {
    let mut out: std::collections::HashMap<botfleet_core::BotId, crate::InboxStats> =
        std::collections::HashMap::new();
    for (bot, state, is_send, n) in rows {
        let bot = botfleet_core::BotId::new(bot)
            .map_err(|e| crate::StoreError::Corrupt(e.to_string()))?;
        let s = out.entry(bot).or_default();
        let n = n.max(0).unsigned_abs();
        match (is_send, state.as_str()) {
            (0, "pending") => s.pending = n,
            (0, "undeliverable") => s.undeliverable = n,
            (1, "pending") => s.sends.queued = n,
            (1, "done") => s.sends.sent = n,
            (1, "undeliverable") => s.sends.failed = n,
            (2, _) => s.held = n,
            (3, _) => s.paused_chats = n,
            _ => {}
        }
    }
    Ok(out)
}

/// A database made by the schema before this one (migrations 1–9): its rows, as a store of
/// that release left them, and what upgrading it in place must keep.
#[cfg(test)]
pub(crate) mod previous {
    /// The last version of the previous schema.
    pub(crate) const VERSION: usize = 9;

    /// Rows the previous release wrote (`$`-numbered parameters are not used): a bot's fence
    /// and cursor, a pending and a done entry, sent marks, and a chat's state.
    pub(crate) const ROWS: &str =
        "INSERT INTO bot_fences (bot_id, fence, cursor) VALUES ('old', 7, '41');
        INSERT INTO inbox (bot_id, key, seq, chat, message, state, received_at_ms) VALUES
            ('old', 'u1', 1, 'c1', '{}', 'done', 1),
            ('old', 'u2', 2, 'c1', '{}', 'pending', 2);
        INSERT INTO sent_replies (bot_id, key) VALUES ('old', 'c1:1:reply');
        INSERT INTO chat_state (bot_id, chat, revision, fence, state, updated_at_ms)
            VALUES ('old', 'c1', 3, 0, '{\"n\":3}', 1);";

    /// Checks, through the store, that the upgraded database kept what the previous schema
    /// held and that every bot's turn now writes through it.
    pub(crate) async fn check_upgraded(s: &dyn crate::Store) {
        use botfleet_core::{BotId, Fence};
        let bot = BotId::new("old").unwrap_or_else(|e| panic!("{e}"));
        let (cursor, pending) = s
            .resume_point(&bot, 10)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let cursor = cursor.unwrap_or_else(|| panic!("the cursor survives"));
        assert_eq!((cursor.value.as_str(), cursor.fence), ("41", Fence(7)));
        let keys: Vec<&str> = pending.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(keys, ["u2"]);
        let rec = crate::TurnRecord {
            key: "u2".into(),
            chat: "c1".into(),
            fence: crate::TurnFence::Claim(Fence(7)),
            outcome: crate::InboxOutcome::Done,
            sent: true,
            state: Some((3, "{\"n\":4}".into())),
            refs: Vec::new(),
            notes: None,
            said: Vec::new(),
        };
        assert_eq!(
            s.turn_record(&bot, &rec)
                .await
                .unwrap_or_else(|e| panic!("{e}")),
            crate::StateWrite::Written(4)
        );
        let v = s
            .turn_view(&bot, "u2", "c1")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(v.entry.map(|e| e.state), Some(crate::InboxState::Done));
        assert_eq!(v.state.as_deref(), Some("{\"n\":4}"));
    }
}
