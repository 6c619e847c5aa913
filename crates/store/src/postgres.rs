//! The Postgres backend, for fleets that already run one.

use std::{collections::HashMap, sync::Arc};

use async_trait::async_trait;
use botfleet_core::{BotId, BotRecord, BotSpec, BotStatus, Fence};
use tokio::sync::RwLock;
use tokio_postgres::{Client, NoTls, Row};
use tracing::warn;

use crate::{
    schema::{resealed, stats_from_rows, BotRow, InboxRow, Sealed, MIGRATIONS},
    BotFilter, Cursor, InboxEntry, InboxItem, InboxState, InboxStats, Keyring, Result, StateWrite,
    StatusReport, Store, StoreError, TurnRecord, TurnView,
};

/// Connections each store keeps: statements of concurrent turns run side by side, and their
/// commits share the server's WAL flushes (one connection would serialize every commit).
pub(crate) const POOL_SIZE: usize = 4;

/// The items of a journal write not recorded before (`u`: UNNEST's key, chat, message, ord,
/// `paused`, and each item's place among its chat's: `cnt`, `rn`) and the numbers taken in
/// each chat's log (`h`: chat, its last number; the bot's own id's heads, shared by its
/// slices, locked in chat order; an event sets when its chat's user last wrote). `$1` the bot, `$own` its own id, `$now` now.
///
/// A redelivery is left out before any head is locked: its insert would wait for a turn
/// ending its entry (an update of the row), and that turn takes the chat's head after the
/// row, so the two would deadlock. (Two deliveries of one new key at once take numbers both;
/// the second waits for the first's head, then its insert does nothing: a gap.)
///
/// The pauses in effect for the items' chats are read `FOR SHARE`: a resume lifting one waits
/// until this write commits, so its replay, a statement after, sees the entries this write
/// recorded paused. An entry recorded paused ends no earlier than its pause began (by the
/// pausing worker's clock), so a replay since then finds it whatever this worker's clock says.
macro_rules! journal_items {
    ($own:literal, $now:literal) => {
        concat!(
            "pz AS (SELECT p.chat, p.paused_at_ms FROM chat_pauses p WHERE p.bot_id = ",
            $own,
            " AND p.chat = ANY($3::TEXT[]) AND (p.until_ms IS NULL OR p.until_ms > ",
            $now,
            ") FOR SHARE), u AS (SELECT t.*, (substr(t.key, 1, 5) <> 'send:' AND pz.chat IS NOT NULL) \
             AS paused, pz.paused_at_ms AS paused_at, COUNT(*) OVER (PARTITION BY t.chat) AS cnt, \
             ROW_NUMBER() OVER (PARTITION BY t.chat ORDER BY t.ord) AS rn \
             FROM UNNEST($2::TEXT[], $3::TEXT[], $4::TEXT[]) WITH ORDINALITY AS t(key, chat, message, ord) \
             LEFT JOIN pz ON pz.chat = t.chat \
             WHERE NOT EXISTS (SELECT 1 FROM inbox i WHERE i.bot_id = $1 AND i.key = t.key)), \
             h AS (INSERT INTO chat_heads (bot_id, chat, n, last_in_ms) SELECT ",
            $own,
            ", chat, COUNT(*), MAX(CASE WHEN substr(key, 1, 5) <> 'send:' THEN ",
            $now,
            "::BIGINT END) FROM u GROUP BY chat ORDER BY chat ON CONFLICT (bot_id, chat) \
             DO UPDATE SET n = chat_heads.n + excluded.n, last_in_ms = ",
            crate::schema::later_in!(),
            " RETURNING chat, n) "
        )
    };
}

/// Inserts the items of [`journal_items`] numbered from `$seq` (in their order) and in their
/// chats' logs, `$now` now; the rows inserted are `key, state`.
macro_rules! journal_insert {
    ($seq:literal, $now:literal, $where:literal) => {
        concat!(
            "INSERT INTO inbox (bot_id, key, seq, chat, message, state, received_at_ms, \
             finished_at_ms, n) SELECT $1, u.key, ",
            $seq,
            " + u.ord, u.chat, u.message, CASE WHEN u.paused THEN 'paused' ELSE 'pending' END, ",
            $now,
            ", CASE WHEN u.paused THEN GREATEST(",
            $now,
            ", u.paused_at) END, h.n - u.cnt + u.rn FROM u JOIN h ON h.chat = u.chat ",
            $where,
            " ON CONFLICT DO NOTHING RETURNING key, state"
        )
    };
}

/// Journals webhook deliveries (`$1` bot, `$2..$4` keys, chats, messages, `$5` base
/// sequence, `$6` now, `$7` the bot's own id).
const JOURNAL_PUT: &str = concat!(
    "WITH ",
    journal_items!("$7", "$6"),
    journal_insert!("$5", "$6", "")
);

/// [`JOURNAL_PUT`] and the turn view of one of the items at once (`$7` its key, `$8` its
/// chat, `$9` its reply key; `$10` the bot's own id). The view's reads see the table as before the insert: a new
/// entry shows as absent, and the caller knows it is pending.
const JOURNAL_PUT_VIEW: &str = concat!(
    "WITH ",
    journal_items!("$10", "$6"),
    ", ins AS (",
    journal_insert!("$5", "$6", ""),
    ") SELECT ARRAY(SELECT key FROM ins), i.seq, i.chat, i.message, i.state, i.error, i.received_at_ms, \
     s.revision, s.state, EXISTS (SELECT 1 FROM outbox o WHERE o.bot_id = $1 AND o.key = $9), \
     i.held_until_ms, ARRAY(SELECT key FROM ins WHERE state = 'paused'), \
     EXISTS (SELECT 1 FROM pz WHERE pz.chat = $8), \
     (SELECT h.last_in_ms FROM chat_heads h WHERE h.bot_id = $10 AND h.chat = $8) \
     FROM (SELECT 1 AS one) AS one \
     LEFT JOIN inbox i ON i.bot_id = $1 AND i.key = $7 \
     LEFT JOIN chat_state s ON s.bot_id = $1 AND s.chat = $8"
);

/// What a turn leaves, in one statement (so one transaction): `$1` bot, `$2` chat, `$3`
/// revision the state came from, `$4` fence, `$5` state, `$6` now, `$7` reply key, `$8` sent,
/// `$9` entry state, `$10` error, `$11` entry key, `$13`/`$14` the refs' names and values and
/// `$15` how long they are kept (ms), `$16` what the turn said (logged in the chat's log
/// when the entry ends here, numbered by the head of `$17`, the bot's own id), `$12` whether the bot's claim holds the
/// turn (then nothing is written unless `$4` is not below the bot's accepted fence, and the
/// seventh column says whether it was not; and no outbox row: the entry's end, in the same
/// statement, is its record). A `paused` end is written only while the chat's pause holds
/// (read `FOR SHARE`, so a resume's replay after it sees the entry); the last column says
/// when it did not hold.
fn turn_record_sql(cas: &str) -> String {
    format!(
        "WITH ok AS (SELECT (NOT $12 OR COALESCE((SELECT fence FROM bot_fences \
           WHERE bot_id = $1), 0) <= $4) AS go), \
         pz AS (SELECT p.paused_at_ms FROM chat_pauses p WHERE $9 = 'paused' AND p.bot_id = $17 \
           AND p.chat = $2 AND (p.until_ms IS NULL OR p.until_ms > $6) FOR SHARE), \
         sup AS (SELECT NOT $12 AND EXISTS (SELECT 1 FROM chat_state c WHERE c.bot_id = $1 \
           AND c.chat = $2 AND c.fence > $4) AS yes), \
         ob AS (INSERT INTO outbox (bot_id, key, fence, sent_at_ms) \
           SELECT $1, $7, $4, $6 WHERE $8 AND NOT $12 AND (SELECT go FROM ok) ON CONFLICT DO NOTHING RETURNING 1), \
         fin AS (UPDATE inbox SET state = $9, error = $10, \
           finished_at_ms = GREATEST($6, (SELECT paused_at_ms FROM pz)) \
           WHERE bot_id = $1 AND key = $11 AND state = 'pending' AND (SELECT go FROM ok) \
           AND NOT (SELECT yes FROM sup) AND ($9 <> 'paused' OR EXISTS (SELECT 1 FROM pz)) \
           RETURNING 1), \
         rf AS (INSERT INTO refs (bot_id, chat, name, value, expires_at_ms) \
           SELECT $1, $2, n, v, $6 + $15 FROM UNNEST($13::TEXT[], $14::TEXT[]) AS t(n, v) \
           WHERE (SELECT go FROM ok) AND ($12 OR NOT EXISTS (SELECT 1 FROM chat_state c \
           WHERE c.bot_id = $1 AND c.chat = $2 AND c.fence > $4)) \
           ON CONFLICT (bot_id, chat, name) DO UPDATE SET value = excluded.value, \
           expires_at_ms = excluded.expires_at_ms RETURNING 1), \
         hs AS (INSERT INTO chat_heads (bot_id, chat, n) SELECT $17, $2, cardinality($16::TEXT[]) \
           WHERE cardinality($16::TEXT[]) > 0 AND EXISTS (SELECT 1 FROM fin) \
           ON CONFLICT (bot_id, chat) DO UPDATE SET n = chat_heads.n + excluded.n RETURNING n), \
         sd AS (INSERT INTO chat_said (bot_id, chat, n, entry, body, at_ms) \
           SELECT $1, $2, hs.n - cardinality($16::TEXT[]) + t.ord, $11, t.body, $6 \
           FROM hs, UNNEST($16::TEXT[]) WITH ORDINALITY AS t(body, ord) RETURNING 1), \
         st AS ({cas}) \
         SELECT (SELECT revision FROM st), (SELECT COUNT(*) FROM ob), (SELECT COUNT(*) FROM fin), \
           CAST($2 AS TEXT), CAST($3 AS BIGINT), CAST($5 AS TEXT), (SELECT go FROM ok), \
           ($9 = 'paused' AND NOT EXISTS (SELECT 1 FROM pz) AND NOT (SELECT yes FROM sup))"
    )
}

/// [`turn_record_sql`] without a state to write.
static TURN_RECORD: std::sync::LazyLock<&'static str> = std::sync::LazyLock::new(|| {
    Box::leak(turn_record_sql("SELECT 0::BIGINT AS revision WHERE false").into_boxed_str())
});

/// [`turn_record_sql`] with the state's compare-and-set.
static TURN_RECORD_STATE: std::sync::LazyLock<&'static str> = std::sync::LazyLock::new(|| {
    Box::leak(
        turn_record_sql(&format!(
            "{} RETURNING revision",
            crate::schema::state_cas("$12", "(SELECT go FROM ok)")
        ))
        .into_boxed_str(),
    )
});

/// A [`Store`] in Postgres, over 4 connections used in turn. A connection that
/// drops is opened again on its next use.
#[derive(Clone)]
pub struct PostgresStore {
    config: tokio_postgres::Config,
    clients: Arc<[RwLock<Arc<Conn>>]>,
    next: Arc<std::sync::atomic::AtomicUsize>,
    keys: Arc<Keyring>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the config: it may hold a password.
        f.debug_struct("PostgresStore")
            .field("dbname", &self.config.get_dbname())
            .finish_non_exhaustive()
    }
}

/// One connection and the statements prepared on it (the hot ones: parsed and planned once).
struct Conn {
    client: Client,
    // std Mutex: held for one map operation, never across .await.
    prepared: std::sync::Mutex<HashMap<&'static str, tokio_postgres::Statement>>,
}

impl std::ops::Deref for Conn {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.client
    }
}

impl Conn {
    fn new(client: Client) -> Self {
        Self {
            client,
            prepared: std::sync::Mutex::default(),
        }
    }

    /// `sql` prepared on this connection (once).
    async fn statement(
        &self,
        sql: &'static str,
        op: &'static str,
    ) -> Result<tokio_postgres::Statement> {
        if let Some(s) = self
            .prepared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(sql)
        {
            return Ok(s.clone());
        }
        let s = self.client.prepare(sql).await.map_err(db(op))?;
        self.prepared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(sql, s.clone());
        Ok(s)
    }
}

async fn connect(config: &tokio_postgres::Config) -> Result<Client> {
    let (client, conn) = config.connect(NoTls).await.map_err(|e| StoreError::Open {
        backend: "postgres",
        reason: e.to_string(),
        source: Some(Box::new(e)),
    })?;
    // Owned by the client: ends when the client is dropped or the server goes away.
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            warn!(error = %e, "postgres connection ended");
        }
    });
    Ok(client)
}

impl PostgresStore {
    /// Connects to `url` (`postgres://user[:password]@host[:port]/db[?options=...]`) and runs
    /// pending migrations.
    ///
    /// # Errors
    /// [`StoreError::InvalidUrl`] when the URL does not parse, [`StoreError::Open`] when the
    /// server cannot be reached or refuses, or migrating fails.
    pub async fn open(url: &str) -> Result<Self> {
        let config: tokio_postgres::Config =
            url.parse()
                .map_err(|e: tokio_postgres::Error| StoreError::InvalidUrl {
                    reason: e.to_string(),
                })?;
        let mut client = connect(&config).await?;
        migrate(&mut client).await?;
        let mut clients = vec![RwLock::new(Arc::new(Conn::new(client)))];
        for _ in 1..POOL_SIZE {
            clients.push(RwLock::new(Arc::new(Conn::new(connect(&config).await?))));
        }
        Ok(Self {
            config,
            clients: clients.into(),
            next: Arc::default(),
            keys: Keyring::none(),
        })
    }

    /// This store, sealing credentials with `keys` (see [`Keyring`]).
    #[must_use]
    pub fn with_keyring(mut self, keys: Arc<Keyring>) -> Self {
        self.keys = keys;
        self
    }

    async fn client(&self) -> Result<Arc<Conn>> {
        let i = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % self.clients.len();
        let slot = &self.clients[i];
        {
            let c = slot.read().await;
            if !c.is_closed() {
                return Ok(c.clone());
            }
        }
        let mut w = slot.write().await;
        if w.is_closed() {
            *w = Arc::new(Conn::new(connect(&self.config).await?));
        }
        Ok(w.clone())
    }
}

async fn migrate(client: &mut Client) -> Result<()> {
    let fail = |e: tokio_postgres::Error| StoreError::Open {
        backend: "postgres",
        reason: format!("migration failed: {e}"),
        source: Some(Box::new(e)),
    };
    let tx = client.transaction().await.map_err(fail)?;
    // Serialise concurrent migrators (several workers starting at once).
    tx.execute("SELECT pg_advisory_xact_lock(727366110)", &[])
        .await
        .map_err(fail)?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS botfleet_migrations (
            version BIGINT PRIMARY KEY, applied_at_ms BIGINT NOT NULL)",
    )
    .await
    .map_err(fail)?;
    let done: i64 = tx
        .query_one(
            "SELECT COALESCE(MAX(version), 0)::BIGINT FROM botfleet_migrations",
            &[],
        )
        .await
        .map_err(fail)?
        .get(0);
    for (i, sql) in MIGRATIONS.iter().enumerate() {
        let version = i as i64 + 1;
        if version > done {
            tx.batch_execute(sql).await.map_err(fail)?;
            tx.execute(
                "INSERT INTO botfleet_migrations (version, applied_at_ms) VALUES ($1, $2)",
                &[&version, &botfleet_core::unix_ms()],
            )
            .await
            .map_err(fail)?;
        }
    }
    tx.commit().await.map_err(fail)
}

const SELECT_BOT: &str = "SELECT id, platform, token, api_url, handler, webhook_url, \
    webhook_secret, enabled, status, last_error, updated_at_ms, reported_by, app_token, shards, \
    shards_per_slice, hook FROM bots";

fn row_to_bot(r: &Row) -> Result<BotRow> {
    let get = |e: tokio_postgres::Error| StoreError::Corrupt(e.to_string());
    Ok(BotRow {
        id: r.try_get(0).map_err(get)?,
        platform: r.try_get(1).map_err(get)?,
        token: r.try_get(2).map_err(get)?,
        api_url: r.try_get(3).map_err(get)?,
        handler: r.try_get(4).map_err(get)?,
        webhook_url: r.try_get(5).map_err(get)?,
        webhook_secret: r.try_get(6).map_err(get)?,
        enabled: r.try_get(7).map_err(get)?,
        status: r.try_get(8).map_err(get)?,
        last_error: r.try_get(9).map_err(get)?,
        updated_at_ms: r.try_get(10).map_err(get)?,
        reported_by: r.try_get(11).map_err(get)?,
        app_token: r.try_get(12).map_err(get)?,
        shards: r.try_get(13).map_err(get)?,
        shards_per_slice: r.try_get(14).map_err(get)?,
        hook: r.try_get(15).map_err(get)?,
    })
}

/// A bot row as SQL parameters, in the order both INSERT and UPDATE use: $1 id … $9
/// updated_at_ms, $10 app_token, $11 shards, $12 shards_per_slice, $13 hook, $14 status.
fn row_params(r: &BotRow) -> [&(dyn tokio_postgres::types::ToSql + Sync); 14] {
    [
        &r.id,
        &r.platform,
        &r.token,
        &r.api_url,
        &r.handler,
        &r.webhook_url,
        &r.webhook_secret,
        &r.enabled,
        &r.updated_at_ms,
        &r.app_token,
        &r.shards,
        &r.shards_per_slice,
        &r.hook,
        &r.status,
    ]
}

/// The items' keys, chats and messages, as the arrays the journal statements take.
fn columns(items: &[InboxItem]) -> (Vec<&str>, Vec<&str>, Vec<&str>) {
    (
        items.iter().map(|i| i.key.as_str()).collect(),
        items.iter().map(|i| i.chat.as_str()).collect(),
        items.iter().map(|i| i.message.as_str()).collect(),
    )
}

fn fence_i64(f: Fence) -> i64 {
    i64::try_from(f.0).unwrap_or(i64::MAX)
}

/// What became of each of `keys`, from the `(key, state)` rows a journal insert returned: a
/// key twice in one batch is new once.
fn journaled(keys: &[&str], rows: &[tokio_postgres::Row]) -> Vec<crate::Journaled> {
    let states: HashMap<String, String> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    let mut seen = std::collections::HashSet::new();
    keys.iter()
        .map(|k| match states.get(*k) {
            Some(_) if !seen.insert(*k) => crate::Journaled::Known,
            Some(st) if st == "paused" => crate::Journaled::Paused,
            Some(_) => crate::Journaled::New,
            None => crate::Journaled::Known,
        })
        .collect()
}

fn db(op: &'static str) -> impl Fn(tokio_postgres::Error) -> StoreError {
    move |e| StoreError::backend(op, e)
}

impl PostgresStore {
    async fn current_fence(&self, c: &Client, bot: &str) -> Result<Fence> {
        let r = c
            .query_opt("SELECT fence FROM bot_fences WHERE bot_id = $1", &[&bot])
            .await
            .map_err(db("read fence"))?;
        let f: i64 = r.map(|r| r.get(0)).unwrap_or(0);
        Ok(Fence(f.max(0).unsigned_abs()))
    }

    async fn inbox_query(
        &self,
        bot: &BotId,
        state: &str,
        order: &str,
        limit: usize,
        chat: Option<&str>,
    ) -> Result<Vec<InboxEntry>> {
        let c = self.client().await?;
        let rows = c
            .query(
                &format!(
                    "SELECT key, seq, chat, message, state, error, received_at_ms FROM inbox \
                     WHERE bot_id = $1 AND state = $2 AND ($4::TEXT IS NULL OR chat = $4) \
                     ORDER BY {order} LIMIT $3"
                ),
                &[
                    &bot.as_str(),
                    &state,
                    &i64::try_from(limit).unwrap_or(i64::MAX),
                    &chat,
                ],
            )
            .await
            .map_err(db("read inbox"))?;
        rows.iter()
            .map(|r| {
                InboxRow {
                    key: r.get(0),
                    seq: r.get(1),
                    chat: r.get(2),
                    message: r.get(3),
                    state: r.get(4),
                    error: r.get(5),
                    received_at_ms: r.get(6),
                }
                .into_entry(bot)
            })
            .collect()
    }

    /// Journals under a unit's claim: one writer, numbered by arrival above the bot's last entry.
    async fn journal_fenced(
        &self,
        bot: &BotId,
        items: &[InboxItem],
        fence: Fence,
    ) -> Result<Vec<crate::Journaled>> {
        let c = self.client().await?;
        if self.current_fence(&c, bot.as_str()).await? > fence {
            return Err(self.stale(&c, bot, fence).await);
        }
        let (keys, chats, messages) = columns(items);
        // One statement: the fence is checked again where the rows are written, and seq is the
        // arrival time in µs, above the bot's last entry (one writer), growing in the items'
        // order (gaps where an item was a redelivery).
        let rows = c
            .query(
                concat!(
                    "WITH base AS (SELECT GREATEST(COALESCE(MAX(seq), 0), $7) AS s FROM inbox \
                     WHERE bot_id = $1), ",
                    journal_items!("$8", "$5"),
                    journal_insert!(
                        "(SELECT s FROM base)",
                        "$5",
                        "WHERE COALESCE((SELECT fence FROM bot_fences WHERE bot_id = $1), 0) <= $6"
                    )
                ),
                &[
                    &bot.as_str(),
                    &keys,
                    &chats,
                    &messages,
                    &botfleet_core::unix_ms(),
                    &fence_i64(fence),
                    &(crate::turns::arrival_seq() - 1),
                    &bot.base(),
                ],
            )
            .await
            .map_err(db("record inbox"))?;
        if rows.is_empty()
            && !items.is_empty()
            && self.current_fence(&c, bot.as_str()).await? > fence
        {
            return Err(self.stale(&c, bot, fence).await);
        }
        Ok(journaled(&keys, &rows))
    }

    /// Journals a webhook delivery (any worker, numbered by arrival time).
    async fn journal_plain(
        &self,
        bot: &BotId,
        items: &[InboxItem],
    ) -> Result<Vec<crate::Journaled>> {
        let c = self.client().await?;
        let (keys, chats, messages) = columns(items);
        let st = c.statement(JOURNAL_PUT, "journal").await?;
        let rows = c
            .query(
                &st,
                &[
                    &bot.as_str(),
                    &keys,
                    &chats,
                    &messages,
                    &crate::turns::arrival_seq(),
                    &botfleet_core::unix_ms(),
                    &bot.base(),
                ],
            )
            .await
            .map_err(db("journal"))?;
        Ok(journaled(&keys, &rows))
    }

    /// [`Self::journal_plain`], and the turn view of `items[view]` in the same statement.
    async fn journal_unfenced(
        &self,
        bot: &BotId,
        items: &[InboxItem],
        view: Option<usize>,
    ) -> Result<(Vec<crate::Journaled>, Option<TurnView>)> {
        let Some(item) = view.and_then(|i| items.get(i)) else {
            return Ok((self.journal_plain(bot, items).await?, None));
        };
        let c = self.client().await?;
        let (keys, chats, messages) = columns(items);
        let (seq, now) = (crate::turns::arrival_seq(), botfleet_core::unix_ms());
        let reply = crate::reply_key(&item.key);
        let st = c.statement(JOURNAL_PUT_VIEW, "journal").await?;
        let r = c
            .query_one(
                &st,
                &[
                    &bot.as_str(),
                    &keys,
                    &chats,
                    &messages,
                    &seq,
                    &now,
                    &item.key,
                    &item.chat,
                    &reply,
                    &bot.base(),
                ],
            )
            .await
            .map_err(db("journal"))?;
        let inserted: Vec<String> = r.get(0);
        let paused: Vec<String> = r.get(11);
        let mut seen = std::collections::HashSet::new();
        let new: Vec<crate::Journaled> = keys
            .iter()
            .map(
                |k| match inserted.iter().any(|i| i == k) && seen.insert(*k) {
                    false => crate::Journaled::Known,
                    true if paused.iter().any(|p| p == k) => crate::Journaled::Paused,
                    true => crate::Journaled::New,
                },
            )
            .collect();
        let entry = match r.get::<_, Option<i64>>(1) {
            Some(seq) => Some(
                InboxRow {
                    key: item.key.clone(),
                    seq,
                    chat: r.get(2),
                    message: r.get(3),
                    state: r.get(4),
                    error: r.get(5),
                    received_at_ms: r.get(6),
                }
                .into_entry(bot)?,
            ),
            // Inserted by this very call: as it was recorded.
            None if inserted.contains(&item.key) => {
                let ord = items.iter().position(|i| i.key == item.key).unwrap_or(0) as i64 + 1;
                Some(InboxEntry {
                    bot: bot.clone(),
                    key: item.key.clone(),
                    seq: (seq + ord).max(0).unsigned_abs(),
                    chat: item.chat.clone(),
                    message: item.message.clone(),
                    state: if paused.contains(&item.key) {
                        InboxState::Paused
                    } else {
                        InboxState::Pending
                    },
                    error: None,
                    received_at_ms: now,
                })
            }
            None => None,
        };
        let view = TurnView {
            entry,
            revision: r
                .get::<_, Option<i64>>(7)
                .unwrap_or(0)
                .max(0)
                .unsigned_abs(),
            state: r.get(8),
            sent: r.get(9),
            held_until_ms: r.get(10),
            paused: r.get(12),
            // (Read as before this call: an event journaled now is its user's last word.)
            last_in_ms: if inserted.contains(&item.key)
                && InboxEntry::kind_of(&item.key) == crate::EntryKind::Event
            {
                Some(now)
            } else {
                r.get(13)
            },
        };
        Ok((new, Some(view)))
    }

    async fn stale(&self, c: &Client, bot: &BotId, offered: Fence) -> StoreError {
        match self.current_fence(c, bot.as_str()).await {
            Ok(current) => StoreError::StaleFence {
                bot: bot.clone(),
                offered,
                current,
            },
            Err(e) => e,
        }
    }
}

impl PostgresStore {
    /// Replaces a bot's spec (status kept), only over version `expected` when given
    /// (`Ok(false)` when it changed since). The change time is the spec's version: strictly
    /// later than the one replaced, even within one millisecond.
    async fn replace_spec(&self, spec: &BotSpec, expected: Option<i64>) -> Result<bool> {
        spec.validate_shared()?;
        let r = BotRow::from_spec(spec, &self.keys)?;
        let c = self.client().await?;
        let mut params = row_params(&r)[..13].to_vec();
        params.push(&expected);
        let n = c
            .execute(
                "UPDATE bots SET platform = $2, token = $3, api_url = $4, handler = $5, \
                 webhook_url = $6, webhook_secret = $7, enabled = $8, \
                 updated_at_ms = GREATEST($9, bots.updated_at_ms + 1), \
                 app_token = $10, shards = $11, shards_per_slice = $12, hook = $13 \
                 WHERE id = $1 AND ($14::BIGINT IS NULL OR updated_at_ms = $14)",
                // Everything but the status (the last of the row): updates keep it.
                &params[..],
            )
            .await
            .map_err(db("update bot"))?;
        if n == 1 {
            return Ok(true);
        }
        let exists = expected.is_some()
            && c.query_opt("SELECT 1 FROM bots WHERE id = $1", &[&spec.id.as_str()])
                .await
                .map_err(db("update bot"))?
                .is_some();
        if exists {
            Ok(false)
        } else {
            Err(StoreError::NotFound(spec.id.clone()))
        }
    }
}

#[async_trait]
impl Store for PostgresStore {
    async fn add_bot(&self, spec: &BotSpec) -> Result<()> {
        spec.validate_shared()?;
        let r = BotRow::from_spec(spec, &self.keys)?;
        let c = self.client().await?;
        let n = c
            .execute(
                "INSERT INTO bots (id, platform, token, api_url, handler, webhook_url, \
                 webhook_secret, enabled, updated_at_ms, app_token, shards, \
                 shards_per_slice, hook, status, last_error, created_at_ms) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, NULL, $9) \
                 ON CONFLICT (id) DO NOTHING",
                &row_params(&r)[..],
            )
            .await
            .map_err(db("add bot"))?;
        if n == 0 {
            return Err(StoreError::AlreadyExists(spec.id.clone()));
        }
        Ok(())
    }

    async fn get_bot(&self, id: &BotId) -> Result<Option<BotRecord>> {
        let c = self.client().await?;
        let row = c
            .query_opt(&format!("{SELECT_BOT} WHERE id = $1"), &[&id.as_str()])
            .await
            .map_err(db("get bot"))?;
        row.map(|r| row_to_bot(&r).and_then(|b| b.into_record(&self.keys)))
            .transpose()
    }

    async fn list_bots(&self, filter: &BotFilter) -> Result<Vec<BotRecord>> {
        let c = self.client().await?;
        let platform = filter.platform.map(|p| p.as_str());
        let rows = c
            .query(
                &format!(
                    "{SELECT_BOT} WHERE ($1::TEXT IS NULL OR platform = $1) \
                     AND ($2::BOOLEAN IS NULL OR enabled = $2) ORDER BY id"
                ),
                &[&platform, &filter.enabled],
            )
            .await
            .map_err(db("list bots"))?;
        rows.iter()
            .map(|r| row_to_bot(r).and_then(|b| b.into_record(&self.keys)))
            .collect()
    }

    async fn update_bot(&self, spec: &BotSpec) -> Result<()> {
        self.replace_spec(spec, None).await.map(|_| ())
    }

    async fn update_bot_if(&self, spec: &BotSpec, expected_at_ms: i64) -> Result<bool> {
        self.replace_spec(spec, Some(expected_at_ms)).await
    }

    async fn reseal_secrets(&self) -> Result<u64> {
        let c = self.client().await?;
        let rows = c
            .query(
                "SELECT id, token, app_token, webhook_secret, hook FROM bots ORDER BY id",
                &[],
            )
            .await
            .map_err(db("reseal secrets"))?;
        let mut n = 0;
        for r in rows {
            let id: String = r.get(0);
            let old: Sealed = (r.get(1), r.get(2), r.get(3), r.get(4));
            let Some(new) = resealed(&self.keys, &id, &old)? else {
                continue;
            };
            n += c
                .execute(
                    "UPDATE bots SET token = $2, app_token = $3, webhook_secret = $4, hook = $5 \
                     WHERE id = $1 AND token = $6 AND app_token IS NOT DISTINCT FROM $7 \
                     AND webhook_secret IS NOT DISTINCT FROM $8 AND hook IS NOT DISTINCT FROM $9",
                    &[
                        &id, &new.0, &new.1, &new.2, &new.3, &old.0, &old.1, &old.2, &old.3,
                    ],
                )
                .await
                .map_err(db("reseal secrets"))?;
        }
        // Linked-device sessions are sealed too (a value written meanwhile is left as is).
        let recs = c
            .query("SELECT bot_id, kind, key, value FROM session_records", &[])
            .await
            .map_err(db("reseal secrets"))?;
        for r in recs {
            let (bot, kind, key, value): (String, String, String, String) =
                (r.get(0), r.get(1), r.get(2), r.get(3));
            if let Some(new) = crate::session::resealed(&self.keys, &bot, &kind, &value)? {
                c.execute(
                    "UPDATE session_records SET value = $5 \
                     WHERE bot_id = $1 AND kind = $2 AND key = $3 AND value = $4",
                    &[&bot, &kind, &key, &value, &new],
                )
                .await
                .map_err(db("reseal secrets"))?;
            }
        }
        Ok(n)
    }

    async fn remove_bot(&self, id: &BotId) -> Result<bool> {
        let c = self.client().await?;
        let n = c
            .execute(
                "WITH s AS (DELETE FROM session_records WHERE bot_id = $1) \
                 DELETE FROM bots WHERE id = $1",
                &[&id.as_str()],
            )
            .await
            .map_err(db("remove bot"))?;
        Ok(n > 0)
    }

    async fn set_status(
        &self,
        id: &BotId,
        status: BotStatus,
        last_error: Option<&str>,
        reported_by: Option<&str>,
    ) -> Result<()> {
        let c = self.client().await?;
        let n = c
            .execute(
                "UPDATE bots SET status = $2, last_error = $3, reported_by = $4 WHERE id = $1",
                &[&id.as_str(), &status.as_str(), &last_error, &reported_by],
            )
            .await
            .map_err(db("set status"))?;
        if n == 0 {
            return Err(StoreError::NotFound(id.clone()));
        }
        Ok(())
    }

    async fn set_statuses(&self, reports: &[StatusReport]) -> Result<Vec<Result<()>>> {
        let c = self.client().await?;
        let mut out = Vec::with_capacity(reports.len());
        for r in reports {
            // One conditional update: a report made under an older spec than the registered
            // one (`spec_at_ms` below `updated_at_ms`) changes nothing.
            let n = c
                .execute(
                    "UPDATE bots SET status = $2, last_error = $3, reported_by = $4 \
                     WHERE id = $1 AND ($5::BIGINT IS NULL OR updated_at_ms <= $5)",
                    &[
                        &r.id.as_str(),
                        &r.status.as_str(),
                        &r.last_error,
                        &r.reported_by,
                        &r.spec_at_ms,
                    ],
                )
                .await
                .map_err(db("set statuses"))?;
            let gone = n == 0
                && (r.spec_at_ms.is_none()
                    || c.query_opt("SELECT 1 FROM bots WHERE id = $1", &[&r.id.as_str()])
                        .await
                        .map_err(db("set statuses"))?
                        .is_none());
            out.push(if gone {
                Err(StoreError::NotFound(r.id.clone()))
            } else {
                Ok(())
            });
        }
        Ok(out)
    }

    async fn cursor(&self, id: &BotId) -> Result<Option<Cursor>> {
        let c = self.client().await?;
        let r = c
            .query_opt(
                "SELECT fence, cursor FROM bot_fences WHERE bot_id = $1",
                &[&id.as_str()],
            )
            .await
            .map_err(db("read cursor"))?;
        Ok(r.and_then(|r| {
            let f: i64 = r.get(0);
            let v: Option<String> = r.get(1);
            v.map(|value| Cursor {
                value,
                fence: Fence(f.max(0).unsigned_abs()),
            })
        }))
    }

    async fn put_cursor(&self, id: &BotId, value: &str, fence: Fence) -> Result<()> {
        let c = self.client().await?;
        let moved = c
            .execute(
                "INSERT INTO bot_fences (bot_id, fence, cursor) VALUES ($1, $2, $3) \
                 ON CONFLICT (bot_id) DO UPDATE SET fence = EXCLUDED.fence, \
                 cursor = EXCLUDED.cursor WHERE bot_fences.fence <= EXCLUDED.fence",
                &[&id.as_str(), &fence_i64(fence), &value],
            )
            .await
            .map_err(db("write cursor"))?;
        if moved > 0 {
            return Ok(());
        }
        Err(self.stale(&c, id, fence).await)
    }

    async fn accept_fence(&self, id: &BotId, fence: Fence) -> Result<()> {
        let c = self.client().await?;
        let n = c
            .execute(
                "INSERT INTO bot_fences (bot_id, fence, cursor) VALUES ($1, $2, NULL) \
                 ON CONFLICT (bot_id) DO UPDATE SET fence = EXCLUDED.fence \
                 WHERE bot_fences.fence <= EXCLUDED.fence",
                &[&id.as_str(), &fence_i64(fence)],
            )
            .await
            .map_err(db("accept fence"))?;
        if n > 0 {
            return Ok(());
        }
        Err(self.stale(&c, id, fence).await)
    }

    async fn journal_put(
        &self,
        bot: &BotId,
        items: &[InboxItem],
        fence: Option<Fence>,
        view: Option<usize>,
    ) -> Result<(Vec<crate::Journaled>, Option<TurnView>)> {
        let Some(fence) = fence else {
            return self.journal_unfenced(bot, items, view).await;
        };
        let new = self.journal_fenced(bot, items, fence).await?;
        let view = match view.and_then(|i| items.get(i)) {
            Some(it) => Some(self.turn_view(bot, &it.key, &it.chat).await?),
            None => None,
        };
        Ok((new, view))
    }

    async fn inbox_pending(&self, bot: &BotId, limit: usize) -> Result<Vec<InboxEntry>> {
        self.inbox_query(bot, "pending", "seq ASC", limit, None)
            .await
    }

    async fn inbox_pending_chat(
        &self,
        bot: &BotId,
        chat: &str,
        limit: usize,
    ) -> Result<Vec<InboxEntry>> {
        self.inbox_query(bot, "pending", "seq ASC", limit, Some(chat))
            .await
    }

    async fn inbox_undeliverable(&self, bot: &BotId, limit: usize) -> Result<Vec<InboxEntry>> {
        self.inbox_query(bot, "undeliverable", "seq DESC", limit, None)
            .await
    }

    async fn inbox_stats(&self) -> Result<HashMap<BotId, InboxStats>> {
        let c = self.client().await?;
        let rows = c
            .query(crate::schema::INBOX_STATS, &[&botfleet_core::unix_ms()])
            .await
            .map_err(db("inbox stats"))?;
        stats_from_rows(
            rows.iter()
                .map(|r| (r.get(0), r.get(1), r.get::<_, i32>(2).into(), r.get(3)))
                .collect(),
        )
    }

    async fn inbox_prune(&self, done_before_ms: i64, undeliverable_before_ms: i64) -> Result<u64> {
        let c = self.client().await?;
        let gone = c
            .execute(
                "WITH sent AS (DELETE FROM outbox WHERE sent_at_ms < $1), \
             old_refs AS (DELETE FROM refs WHERE expires_at_ms <= $3) \
             DELETE FROM inbox WHERE ((state = 'done' AND finished_at_ms < $1) \
             OR (state IN ('undeliverable', 'paused') AND finished_at_ms < $2)) \
             AND (substr(key, 1, 5) <> 'send:' OR finished_at_ms < $4)",
                &[
                    &done_before_ms,
                    &undeliverable_before_ms,
                    &botfleet_core::unix_ms(),
                    &(botfleet_core::unix_ms() - crate::SEND_KEEP_MS),
                ],
            )
            .await
            .map_err(db("prune inbox"))?;
        c.execute(crate::schema::REPLIES_PRUNE, &[&done_before_ms])
            .await
            .map_err(db("prune inbox"))?;
        c.execute(crate::schema::SAID_PRUNE, &[&done_before_ms])
            .await
            .map_err(db("prune inbox"))?;
        Ok(gone)
    }

    async fn session_write(
        &self,
        bot: &BotId,
        writes: &[crate::SessionWrite],
        fence: Fence,
    ) -> Result<()> {
        let (puts, dels) = crate::session::net(writes);
        let mut kinds = Vec::new();
        let mut keys = Vec::new();
        let mut values = Vec::new();
        for (kind, key, v) in &puts {
            values.push(self.keys.seal(
                bot.as_str(),
                &crate::session::field(kind),
                &crate::session::to_hex(v),
            )?);
            kinds.push(kind.as_str());
            keys.push(key.as_str());
        }
        let del_kinds: Vec<&str> = dels.iter().map(|(k, _)| k.as_str()).collect();
        let del_keys: Vec<&str> = dels.iter().map(|(_, k)| k.as_str()).collect();
        let c = self.client().await?;
        // One statement, so all or none, and only under a fence not below the store's.
        let r = c
            .query_one(
                "WITH ok AS (SELECT COALESCE((SELECT fence FROM bot_fences WHERE bot_id = $1), 0) <= $2 AS yes), \
                 del AS (DELETE FROM session_records WHERE bot_id = $1 AND (SELECT yes FROM ok) \
                   AND (kind, key) IN (SELECT * FROM UNNEST($3::TEXT[], $4::TEXT[]))), \
                 ins AS (INSERT INTO session_records (bot_id, kind, key, value, updated_at_ms) \
                   SELECT $1, k, key, v, $8 FROM UNNEST($5::TEXT[], $6::TEXT[], $7::TEXT[]) AS t(k, key, v) \
                   WHERE (SELECT yes FROM ok) \
                   ON CONFLICT (bot_id, kind, key) DO UPDATE SET value = excluded.value, \
                   updated_at_ms = excluded.updated_at_ms) \
                 SELECT yes FROM ok",
                &[
                    &bot.as_str(),
                    &fence_i64(fence),
                    &del_kinds,
                    &del_keys,
                    &kinds,
                    &keys,
                    &values,
                    &botfleet_core::unix_ms(),
                ],
            )
            .await
            .map_err(db("write a session"))?;
        if r.get::<_, bool>(0) {
            Ok(())
        } else {
            Err(self.stale(&c, bot, fence).await)
        }
    }

    async fn session_records(&self, bot: &BotId, kind: &str) -> Result<Vec<(String, Vec<u8>)>> {
        let c = self.client().await?;
        let rows = c
            .query(
                "SELECT key, value FROM session_records WHERE bot_id = $1 AND kind = $2 ORDER BY key",
                &[&bot.as_str(), &kind],
            )
            .await
            .map_err(db("read a session"))?;
        let rows = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        crate::session::open_session_rows(&self.keys, bot, kind, rows)
    }

    async fn fleet_secret(&self, name: &str, fresh: &[u8]) -> Result<Vec<u8>> {
        use crate::session::{FLEET, FLEET_SECRET};
        let sealed = crate::session::seal_fleet_secret(&self.keys, fresh)?;
        let c = self.client().await?;
        // One statement: the insert when absent, then whichever value stands.
        let row = c
            .query_opt(
                "WITH ins AS (INSERT INTO session_records (bot_id, kind, key, value, updated_at_ms) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (bot_id, kind, key) DO NOTHING \
                 RETURNING value) \
                 SELECT value FROM ins UNION ALL \
                 SELECT value FROM session_records WHERE bot_id = $1 AND kind = $2 AND key = $3 \
                 LIMIT 1",
                &[&FLEET, &FLEET_SECRET, &name, &sealed, &botfleet_core::unix_ms()],
            )
            .await
            .map_err(db("fleet secret"))?;
        let stored: String = match row {
            Some(r) => r.get(0),
            // Another writer's insert committed after this statement's snapshot: read it now.
            None => c
                .query_one(
                    "SELECT value FROM session_records WHERE bot_id = $1 AND kind = $2 AND key = $3",
                    &[&FLEET, &FLEET_SECRET, &name],
                )
                .await
                .map_err(db("fleet secret"))?
                .get(0),
        };
        crate::session::open_fleet_secret(&self.keys, name, &stored)
    }

    async fn session_record(&self, bot: &BotId, kind: &str, key: &str) -> Result<Option<Vec<u8>>> {
        let c = self.client().await?;
        let row = c
            .query_opt(
                "SELECT value FROM session_records WHERE bot_id = $1 AND kind = $2 AND key = $3",
                &[&bot.as_str(), &kind, &key],
            )
            .await
            .map_err(db("read a session"))?;
        let rows = row
            .map(|r| vec![(key.to_owned(), r.get(0))])
            .unwrap_or_default();
        Ok(
            crate::session::open_session_rows(&self.keys, bot, kind, rows)?
                .pop()
                .map(|(_, v)| v),
        )
    }

    async fn session_clear(&self, bot: &BotId, fence: Fence) -> Result<()> {
        let c = self.client().await?;
        let r = c
            .query_one(
                "WITH ok AS (SELECT COALESCE((SELECT fence FROM bot_fences WHERE bot_id = $1), 0) <= $2 AS yes), \
                 del AS (DELETE FROM session_records WHERE bot_id = $1 AND (SELECT yes FROM ok)) \
                 SELECT yes FROM ok",
                &[&bot.as_str(), &fence_i64(fence)],
            )
            .await
            .map_err(db("clear a session"))?;
        if r.get::<_, bool>(0) {
            Ok(())
        } else {
            Err(self.stale(&c, bot, fence).await)
        }
    }

    async fn chat_events(
        &self,
        bot: &BotId,
        chat: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<crate::ChatEvent>> {
        let c = self.client().await?;
        let after = i64::try_from(after).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit.min(crate::MAX_CHAT_EVENTS)).unwrap_or(0);
        let st = c
            .statement(crate::schema::CHAT_EVENTS, "read a chat's log")
            .await?;
        let rows = c
            .query(&st, &[&bot.as_str(), &chat, &after, &limit])
            .await
            .map_err(db("read a chat's log"))?;
        rows.into_iter()
            .map(|r| {
                crate::chatlog::event(
                    r.get(0),
                    r.get(1),
                    r.get(2),
                    r.get(3),
                    r.get::<_, Option<&str>>(4),
                    r.get(5),
                )
            })
            .collect()
    }

    async fn turn_view(&self, bot: &BotId, key: &str, chat: &str) -> Result<TurnView> {
        let c = self.client().await?;
        let reply = crate::reply_key(key);
        let r = c
            .query_one(
                crate::schema::TURN_VIEW,
                &[
                    &bot.as_str(),
                    &key,
                    &chat,
                    &reply,
                    &bot.base(),
                    &botfleet_core::unix_ms(),
                ],
            )
            .await
            .map_err(db("read a turn"))?;
        let entry = match r.get::<_, Option<i64>>(0) {
            Some(seq) => Some(
                InboxRow {
                    key: key.to_owned(),
                    seq,
                    chat: r.get(1),
                    message: r.get(2),
                    state: r.get(3),
                    error: r.get(4),
                    received_at_ms: r.get(5),
                }
                .into_entry(bot)?,
            ),
            None => None,
        };
        Ok(TurnView {
            entry,
            revision: r
                .get::<_, Option<i64>>(6)
                .unwrap_or(0)
                .max(0)
                .unsigned_abs(),
            state: r.get(7),
            sent: r.get(8),
            held_until_ms: r.get(9),
            paused: r.get(10),
            last_in_ms: r.get(11),
        })
    }

    async fn turn_hold(&self, bot: &BotId, hold: &crate::TurnHold) -> Result<Option<i64>> {
        let c = self.client().await?;
        let fence = hold.fence.fence();
        let claim = hold.fence.claim().is_some();
        let row = c
            .query_opt(
                crate::schema::TURN_HOLD,
                &[
                    &bot.as_str(),
                    &hold.key,
                    &hold.chat,
                    &fence_i64(fence),
                    &hold.until_ms,
                    &claim,
                ],
            )
            .await
            .map_err(db("hold a turn"))?;
        if let Some(r) = row {
            return Ok(Some(r.get(0)));
        }
        // Not written: a stale fence, or an entry that is not pending.
        if claim {
            let current = self.current_fence(&c, bot.as_str()).await?;
            if current > fence {
                return Err(StoreError::StaleFence {
                    bot: bot.clone(),
                    offered: fence,
                    current,
                });
            }
            return Ok(None);
        }
        let current: i64 = c
            .query_opt(
                "SELECT fence FROM chat_state WHERE bot_id = $1 AND chat = $2",
                &[&bot.as_str(), &hold.chat],
            )
            .await
            .map_err(db("hold a turn"))?
            .map_or(0, |r| r.get(0));
        if current > fence_i64(fence) {
            return Err(StoreError::StaleFence {
                bot: bot.clone(),
                offered: fence,
                current: Fence(current.max(0).unsigned_abs()),
            });
        }
        Ok(None)
    }

    async fn reply_post(&self, bot: &BotId, post: &crate::ReplyPost) -> Result<crate::PostAnswer> {
        use crate::PostAnswer;
        let c = self.client().await?;
        let (key, digest) = (
            crate::held::digest(&post.idempotency_key),
            crate::held::digest(&post.body),
        );
        // One statement: the entry's row is updated to number the part, so concurrent posts
        // (many workers) queue on it and each sees the one before. Two posts of one key at
        // once: the second's insert does nothing (and leaves a gap in the numbers), and it is
        // answered as a repeat on the next round (a client posting one key with two bodies at
        // once, one of them final, may so close the entry with no last part kept: it then
        // expires).
        for _ in 0..3 {
            let r = c
                .query_one(
                    "WITH prior AS (SELECT seq, digest FROM replies \
                       WHERE bot_id = $1 AND entry = $2 AND post_key = $3), \
                     num AS (UPDATE inbox SET posts = posts + 1, posts_closed = $6 \
                       WHERE bot_id = $1 AND key = $2 AND state = 'pending' AND NOT posts_closed \
                       AND (held_until_ms IS NULL OR held_until_ms > $7) \
                       AND NOT EXISTS (SELECT 1 FROM prior) RETURNING posts), \
                     ins AS (INSERT INTO replies (bot_id, entry, seq, post_key, digest, body, \
                       is_final, posted_at_ms) SELECT $1, $2, posts, $3, $4, $5, $6, $7 FROM num \
                       ON CONFLICT DO NOTHING RETURNING seq) \
                     SELECT (SELECT seq FROM prior), (SELECT digest FROM prior), \
                       (SELECT seq FROM ins), (SELECT posts FROM num), \
                       EXISTS (SELECT 1 FROM inbox WHERE bot_id = $1 AND key = $2)",
                    &[
                        &bot.as_str(),
                        &post.key,
                        &key,
                        &digest,
                        &post.body,
                        &post.last,
                        &botfleet_core::unix_ms(),
                    ],
                )
                .await
                .map_err(db("keep a posted reply"))?;
            let seq = |v: i64| v.max(0).unsigned_abs();
            match (
                r.get::<_, Option<i64>>(0),
                r.get::<_, Option<String>>(1),
                r.get::<_, Option<i64>>(2),
                r.get::<_, Option<i64>>(3),
                r.get::<_, bool>(4),
            ) {
                (Some(s), Some(d), ..) => {
                    return Ok(crate::held::answer_again(seq(s), &d, &digest))
                }
                (_, _, Some(s), ..) => return Ok(PostAnswer::Accepted(seq(s))),
                (_, _, None, Some(_), _) => {} // the same key, posted at the same moment
                (_, _, None, None, true) => return Ok(PostAnswer::Ended),
                (_, _, None, None, false) => return Ok(PostAnswer::Unknown),
            }
        }
        Err(StoreError::backend(
            "keep a posted reply",
            std::io::Error::other("the same key kept being posted at once"),
        ))
    }

    async fn replies_since(&self, since_ms: i64) -> Result<Vec<(BotId, String, u64)>> {
        let c = self.client().await?;
        let rows = c
            .query(crate::schema::REPLIES_SINCE, &[&since_ms])
            .await
            .map_err(db("read posted replies"))?;
        crate::held::since_rows(
            rows.iter()
                .map(|r| (r.get(0), r.get(1), r.get(2)))
                .collect(),
        )
    }

    async fn posted_replies(
        &self,
        bot: &BotId,
        key: &str,
        after_seq: u64,
    ) -> Result<Vec<crate::PostedReply>> {
        let c = self.client().await?;
        let after = i64::try_from(after_seq).unwrap_or(i64::MAX);
        let rows = c
            .query(crate::schema::REPLIES_AFTER, &[&bot.as_str(), &key, &after])
            .await
            .map_err(db("read posted replies"))?;
        Ok(rows
            .iter()
            .map(|r| crate::PostedReply {
                seq: r.get::<_, i64>(0).max(0).unsigned_abs(),
                body: r.get(1),
                last: r.get(2),
                posted_at_ms: r.get(3),
            })
            .collect())
    }

    async fn chat_seen(&self, bot: &BotId, seen: &[(String, i64)]) -> Result<()> {
        // Each upsert on its own (a row locked for a moment, nothing waited for while held).
        let c = self.client().await?;
        for (chat, at_ms) in seen {
            c.execute(
                crate::schema::CHAT_HEAD_JOURNAL,
                &[&bot.base(), chat, &0i64, at_ms],
            )
            .await
            .map_err(db("record a chat's user seen"))?;
        }
        Ok(())
    }

    async fn chat_pause(&self, bot: &BotId, pause: &crate::ChatPause) -> Result<()> {
        let c = self.client().await?;
        c.execute(
            crate::schema::PAUSE_PUT,
            &[
                &bot.base(),
                &pause.chat,
                &pause.until_ms,
                &pause.reason,
                &pause.paused_at_ms,
            ],
        )
        .await
        .map_err(db("pause a chat"))?;
        Ok(())
    }

    async fn chat_resume(&self, bot: &BotId, chat: &str, replay: bool) -> Result<crate::Resumed> {
        let c = self.client().await?;
        let base = bot.base();
        let now = botfleet_core::unix_ms();
        // First the pause is ended (its row kept, `until_ms` 0: in effect for no clock): a
        // write that read it paused holds it (`FOR SHARE`) to its commit, so this waits for
        // that write, and a write after reads it ended, so it holds nothing the next
        // statement would wait for: that statement's snapshot, taken after this one ended,
        // has every entry recorded paused. Then, in one statement, the row goes and its
        // entries come back: a resume tried again after a failure between the two finds the
        // ended pause and replays it all the same.
        let lifted = c
            .query_opt(
                "WITH o AS (SELECT until_ms FROM chat_pauses WHERE bot_id = $1 AND chat = $2 \
                   FOR UPDATE) \
                 UPDATE chat_pauses p SET until_ms = 0 FROM o \
                 WHERE p.bot_id = $1 AND p.chat = $2 AND (p.until_ms IS NULL OR p.until_ms > $3) \
                 RETURNING o.until_ms, p.reason, p.paused_at_ms",
                &[&base, &chat, &now],
            )
            .await
            .map_err(db("resume a chat"))?;
        let r = c
            .query_one(
                "WITH d AS (DELETE FROM chat_pauses WHERE bot_id = $1 AND chat = $2 \
                   AND until_ms IS NOT NULL AND until_ms <= $3 RETURNING paused_at_ms), \
                 r AS (UPDATE inbox SET state = 'pending', finished_at_ms = NULL \
                   WHERE $4 AND (bot_id = $1 OR substr(bot_id, 1, length($5)) = $5) AND chat = $2 \
                   AND state = 'paused' AND finished_at_ms >= (SELECT paused_at_ms FROM d) \
                   RETURNING bot_id, key, seq) \
                 SELECT ARRAY(SELECT bot_id FROM r ORDER BY seq, bot_id, key), \
                 ARRAY(SELECT key FROM r ORDER BY seq, bot_id, key)",
                &[&base, &chat, &now, &replay, &format!("{base}#")],
            )
            .await
            .map_err(db("resume a chat"))?;
        let pause = lifted.map(|r| crate::ChatPause {
            chat: chat.to_owned(),
            until_ms: r.get(0),
            reason: r.get(1),
            paused_at_ms: r.get(2),
        });
        let units: Vec<String> = r.get(0);
        let keys: Vec<String> = r.get(1);
        let replayed = units
            .into_iter()
            .zip(keys)
            .map(|(u, k)| BotId::new(u).map(|u| (u, k)))
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| StoreError::backend("resume a chat", e))?;
        Ok(crate::Resumed { pause, replayed })
    }

    async fn chat_pauses(&self, bot: &BotId) -> Result<Vec<crate::ChatPause>> {
        let c = self.client().await?;
        let rows = c
            .query(
                crate::schema::PAUSES_LIST,
                &[&bot.base(), &botfleet_core::unix_ms()],
            )
            .await
            .map_err(db("read paused chats"))?;
        Ok(rows
            .iter()
            .map(|r| crate::ChatPause {
                chat: r.get(0),
                until_ms: r.get(1),
                reason: r.get(2),
                paused_at_ms: r.get(3),
            })
            .collect())
    }

    async fn turn_accept(&self, bot: &BotId, chat: &str, fence: Fence) -> Result<()> {
        let c = self.client().await?;
        let n = c
            .execute(
                crate::schema::TURN_ACCEPT,
                &[
                    &bot.as_str(),
                    &chat,
                    &fence_i64(fence),
                    &botfleet_core::unix_ms(),
                ],
            )
            .await
            .map_err(db("accept a turn"))?;
        if n > 0 {
            return Ok(());
        }
        let current: i64 = c
            .query_opt(
                "SELECT fence FROM chat_state WHERE bot_id = $1 AND chat = $2",
                &[&bot.as_str(), &chat],
            )
            .await
            .map_err(db("accept a turn"))?
            .map_or(0, |r| r.get(0));
        Err(StoreError::StaleFence {
            bot: bot.clone(),
            offered: fence,
            current: Fence(current.max(0).unsigned_abs()),
        })
    }

    async fn turn_record(&self, bot: &BotId, rec: &TurnRecord) -> Result<StateWrite> {
        let c = self.client().await?;
        let (state, _) = crate::turns::outcome_parts(&rec.outcome);
        let error = rec.error();
        let now = botfleet_core::unix_ms();
        let reply = crate::reply_key(&rec.key);
        // One row per name (the last given wins): an upsert may not touch a row twice.
        let mut refs: Vec<&(String, String)> = Vec::with_capacity(rec.refs.len());
        for r in rec.refs.iter().rev() {
            if !refs.iter().any(|x| x.0 == r.0) {
                refs.push(r);
            }
        }
        let ref_names: Vec<&str> = refs.iter().map(|r| r.0.as_str()).collect();
        let ref_values: Vec<&str> = refs.iter().map(|r| r.1.as_str()).collect();
        let (expected, new_state) = match &rec.state {
            Some((r, s)) => (i64::try_from(*r).unwrap_or(i64::MAX), Some(s.as_str())),
            None => (0, None),
        };
        let (fence, claim) = (rec.fence.fence(), rec.fence.claim().is_some());
        // One statement, so one transaction: outbox, state and the entry's end together.
        let sql = if rec.state.is_some() {
            &*TURN_RECORD_STATE
        } else {
            &*TURN_RECORD
        };
        let st = c.statement(sql, "record a turn").await?;
        let r = c
            .query_one(
                &st,
                &[
                    &bot.as_str(),
                    &rec.chat,
                    &expected,
                    &fence_i64(fence),
                    &new_state,
                    &now,
                    &reply,
                    &rec.sent,
                    &state,
                    &error,
                    &rec.key,
                    &claim,
                    &ref_names,
                    &ref_values,
                    &crate::REFS_TTL_MS,
                    &rec.said,
                    &bot.base(),
                ],
            )
            .await
            .map_err(db("record a turn"))?;
        if !r.get::<_, bool>(6) {
            return Err(self.stale(&c, bot, fence).await);
        }
        if r.get::<_, bool>(7) {
            return Ok(StateWrite::Unpaused);
        }
        Ok(match (rec.state.is_some(), r.get::<_, Option<i64>>(0)) {
            (false, _) => StateWrite::Unchanged,
            (true, Some(rev)) => StateWrite::Written(rev.max(0).unsigned_abs()),
            (true, None) => StateWrite::Stale,
        })
    }

    async fn turn_step(&self, bot: &BotId, step: &crate::TurnStep) -> Result<()> {
        let c = self.client().await?;
        let fence = step.fence.fence();
        let claim = step.fence.claim().is_some();
        // Written only while the turn's fence holds: the bot's accepted fence for a claim's
        // turn, the chat's for a chat's turn.
        let n = c
            .execute(
                "INSERT INTO outbox (bot_id, key, fence, sent_at_ms, result) \
                 SELECT $1, $2, $3, $4, $5 WHERE \
                 CASE WHEN $6 THEN COALESCE((SELECT fence FROM bot_fences WHERE bot_id = $1), 0) <= $3 \
                 ELSE NOT EXISTS (SELECT 1 FROM chat_state WHERE bot_id = $1 AND chat = $7 AND fence > $3) END \
                 ON CONFLICT (bot_id, key) DO UPDATE SET fence = excluded.fence, \
                 sent_at_ms = excluded.sent_at_ms, result = excluded.result",
                &[
                    &bot.as_str(),
                    &crate::progress_key(&step.key),
                    &fence_i64(fence),
                    &botfleet_core::unix_ms(),
                    &step.progress,
                    &claim,
                    &step.chat,
                ],
            )
            .await
            .map_err(db("record a turn's step"))?;
        if n > 0 {
            return Ok(());
        }
        if claim {
            return Err(self.stale(&c, bot, fence).await);
        }
        let current: i64 = c
            .query_opt(
                "SELECT fence FROM chat_state WHERE bot_id = $1 AND chat = $2",
                &[&bot.as_str(), &step.chat],
            )
            .await
            .map_err(db("record a turn's step"))?
            .map_or(0, |r| r.get(0));
        Err(StoreError::StaleFence {
            bot: bot.clone(),
            offered: fence,
            current: Fence(current.max(0).unsigned_abs()),
        })
    }

    async fn turn_progress(&self, bot: &BotId, key: &str) -> Result<Option<String>> {
        let c = self.client().await?;
        Ok(c.query_opt(
            "SELECT result FROM outbox WHERE bot_id = $1 AND key = $2",
            &[&bot.as_str(), &crate::progress_key(key)],
        )
        .await
        .map_err(db("read a turn's progress"))?
        .and_then(|r| r.get::<_, Option<String>>(0)))
    }

    async fn refs_get(
        &self,
        bot: &BotId,
        chat: &str,
        names: &[String],
    ) -> Result<Vec<Option<String>>> {
        let c = self.client().await?;
        let rows = c
            .query(
                "SELECT name, value FROM refs WHERE bot_id = $1 AND chat = $2 \
                 AND name = ANY($3) AND expires_at_ms > $4",
                &[&bot.as_str(), &chat, &names, &botfleet_core::unix_ms()],
            )
            .await
            .map_err(db("read refs"))?;
        let found: HashMap<String, String> = rows
            .into_iter()
            .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)))
            .collect();
        Ok(names.iter().map(|n| found.get(n).cloned()).collect())
    }

    async fn registry_stamp(&self) -> Result<(u64, i64)> {
        let c = self.client().await?;
        let r = c
            .query_one(
                "SELECT COUNT(*)::BIGINT, COALESCE(MAX(updated_at_ms), 0)::BIGINT FROM bots",
                &[],
            )
            .await
            .map_err(db("registry stamp"))?;
        let n: i64 = r.get(0);
        Ok((n.max(0).unsigned_abs(), r.get(1)))
    }

    async fn highest_fence(&self, id: &BotId) -> Result<Fence> {
        let c = self.client().await?;
        self.current_fence(&c, id.as_str()).await
    }

    async fn highest_fences(&self, ids: &[BotId]) -> Result<Vec<Fence>> {
        let c = self.client().await?;
        let names: Vec<&str> = ids.iter().map(BotId::as_str).collect();
        let rows = c
            .query(
                "SELECT bot_id, fence FROM bot_fences WHERE bot_id = ANY($1)",
                &[&names],
            )
            .await
            .map_err(db("read fences"))?;
        let found: std::collections::HashMap<String, i64> =
            rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        Ok(names
            .iter()
            .map(|n| Fence(found.get(*n).copied().unwrap_or(0).max(0).unsigned_abs()))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_database_of_the_previous_schema_upgrades_in_place() {
        if std::env::var("BOTFLEET_TEST_POSTGRES_URL").is_err() {
            eprintln!("BOTFLEET_TEST_POSTGRES_URL unset: Postgres upgrade test skipped");
            return;
        }
        let schema = botfleet_testkit::PgSchema::create().await;
        let config: tokio_postgres::Config = schema.url().parse().unwrap_or_else(|e| panic!("{e}"));
        {
            let c = connect(&config).await.unwrap_or_else(|e| panic!("{e}"));
            c.batch_execute(
                "CREATE TABLE botfleet_migrations (version BIGINT PRIMARY KEY, applied_at_ms BIGINT NOT NULL)",
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"));
            for (i, sql) in MIGRATIONS[..crate::schema::previous::VERSION]
                .iter()
                .enumerate()
            {
                c.batch_execute(sql).await.unwrap_or_else(|e| panic!("{e}"));
                c.execute(
                    "INSERT INTO botfleet_migrations (version, applied_at_ms) VALUES ($1, 0)",
                    &[&(i as i64 + 1)],
                )
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            }
            c.batch_execute(crate::schema::previous::ROWS)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let s = PostgresStore::open(&schema.url())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        crate::schema::previous::check_upgraded(&s).await;
        let c = s.client().await.unwrap_or_else(|e| panic!("{e}"));
        let version: i64 = c
            .query_one("SELECT MAX(version) FROM botfleet_migrations", &[])
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .get(0);
        assert_eq!(version as usize, MIGRATIONS.len());
        let gone: i64 = c
            .query_one(
                "SELECT COUNT(*) FROM information_schema.tables \
                 WHERE table_name = 'sent_replies' AND table_schema = current_schema()",
                &[],
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .get(0);
        assert_eq!(gone, 0, "the sent marks' table is dropped");
    }
}
