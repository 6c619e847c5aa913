//! The SQLite backend: the embedded default.
//!
//! One connection for writes and one for reads (a file database in WAL mode lets readers go on
//! while a writer writes), each behind a mutex and used from blocking threads: a worker starting
//! thousands of bots reads their cursors without queueing behind the replies other bots are
//! recording. WAL mode and a busy timeout make it safe for several processes on one machine
//! (the CLI writing while a worker runs).

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use async_trait::async_trait;
use botfleet_core::{BotId, BotRecord, BotSpec, BotStatus, Fence};
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use crate::{
    schema::{resealed, stats_from_rows, BotRow, InboxRow, Sealed, MIGRATIONS},
    BotFilter, Cursor, InboxEntry, InboxItem, InboxStats, Keyring, Result, StateWrite,
    StatusReport, Store, StoreError, TurnRecord, TurnView,
};

/// A [`Store`] in a SQLite file.
#[derive(Clone)]
pub struct SqliteStore {
    // std Mutex: only locked inside spawn_blocking, never across .await.
    conn: Arc<Mutex<Connection>>,
    /// Reads only; the same connection as `conn` for an in-memory database.
    reader: Arc<Mutex<Connection>>,
    path: Option<PathBuf>,
    keys: Arc<Keyring>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish()
    }
}

fn open_err(reason: String, e: rusqlite::Error) -> StoreError {
    StoreError::Open {
        backend: "sqlite",
        reason,
        source: Some(Box::new(e)),
    }
}

impl SqliteStore {
    /// Opens (creating if missing) the database file at `path` and runs pending migrations.
    ///
    /// # Errors
    /// [`StoreError::Open`] when the file cannot be opened or is not a SQLite database, or
    /// its directory does not exist.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let p = path.clone();
        let conn = tokio::task::spawn_blocking(move || -> Result<(Connection, Connection)> {
            if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
                if !dir.is_dir() {
                    return Err(StoreError::Open {
                        backend: "sqlite",
                        reason: format!("directory {} does not exist", dir.display()),
                        source: None,
                    });
                }
            }
            let shown = p.display().to_string();
            let open = || Connection::open(&p).map_err(|e| open_err(format!("{shown}: {e}"), e));
            let conn = setup(open()?, &shown)?;
            // After the writer ran the migrations: the reader needs only the busy timeout.
            let reader = open()?;
            reader
                .busy_timeout(Duration::from_secs(5))
                .map_err(|e| open_err(format!("{shown}: {e}"), e))?;
            reader
                .execute_batch(&format!("PRAGMA cache_size = -{READER_CACHE_KIB}"))
                .map_err(|e| open_err(format!("{shown}: {e}"), e))?;
            Ok((conn, reader))
        })
        .await
        .map_err(|e| StoreError::backend("open", e))??;
        let (conn, reader) = conn;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
            reader: Arc::new(Mutex::new(reader)),
            path: Some(path),
            keys: Keyring::none(),
        })
    }

    /// A private in-memory database (gone when the store is dropped); for tests.
    ///
    /// # Errors
    /// Only if SQLite itself fails.
    pub async fn open_in_memory() -> Result<Self> {
        let conn = tokio::task::spawn_blocking(|| {
            let conn =
                Connection::open_in_memory().map_err(|e| open_err(format!("in-memory: {e}"), e))?;
            setup(conn, ":memory:")
        })
        .await
        .map_err(|e| StoreError::backend("open", e))??;
        let conn = Arc::new(Mutex::new(conn));
        Ok(Self {
            reader: conn.clone(),
            conn,
            path: None,
            keys: Keyring::none(),
        })
    }

    /// This store, sealing credentials with `keys` (see [`Keyring`]).
    #[must_use]
    pub fn with_keyring(mut self, keys: Arc<Keyring>) -> Self {
        self.keys = keys;
        self
    }

    /// Runs `f` on the writing connection.
    async fn with<T: Send + 'static>(
        &self,
        op: &'static str,
        f: impl FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        Self::on(self.conn.clone(), op, f).await
    }

    /// Runs `f`, which only reads, on the reading connection.
    async fn read<T: Send + 'static>(
        &self,
        op: &'static str,
        f: impl FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        Self::on(self.reader.clone(), op, f).await
    }

    async fn on<T: Send + 'static>(
        conn: Arc<Mutex<Connection>>,
        op: &'static str,
        f: impl FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        tokio::task::spawn_blocking(move || {
            let mut c = conn.lock().unwrap_or_else(|e| e.into_inner());
            f(&mut c)
        })
        .await
        .map_err(|e| StoreError::backend(op, e))?
    }
}

/// Page cache of the writing connection, KiB (SQLite's default is 2,000). Every query of
/// the hot paths is answered by an index, so a cache holding their pages is enough; the rest
/// of the file sits in the OS's cache. A worker's resident memory after a burst of traffic
/// is what this bounds: at 2,000 idle Slack bots after 35 messages each, the default caches
/// cost about 1 KiB per bot more (measured with `botfleet-bench --only slack-idle`), and
/// SQLite webhook latency at 1,000/s was the same either way.
const WRITER_CACHE_KIB: u32 = 1_024;

/// Page cache of the reading connection, KiB: it serves lookups of single bots and
/// listings read once.
const READER_CACHE_KIB: u32 = 512;

fn setup(mut conn: Connection, shown: &str) -> Result<Connection> {
    let fail = |e: rusqlite::Error| open_err(format!("{shown}: {e}"), e);
    conn.busy_timeout(Duration::from_secs(5)).map_err(fail)?;
    // journal_mode answers a row; WAL lets readers and one writer of several processes
    // coexist. (An in-memory database answers "memory", which is fine.)
    // Switching a fresh file to WAL takes a lock SQLite does not wait for with the busy
    // handler: two processes opening one new file at once retry here instead of failing.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        match conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get::<_, String>(0)) {
            Ok(_) => break,
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::DatabaseBusy
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(fail(e)),
        }
    }
    conn.execute_batch(&format!(
        "PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON; PRAGMA cache_size = -{WRITER_CACHE_KIB};"
    ))
    .map_err(fail)?;
    migrate(&mut conn).map_err(fail)?;
    Ok(conn)
}

fn migrate(conn: &mut Connection) -> rusqlite::Result<()> {
    // IMMEDIATE: two processes opening a fresh file at once must not both migrate.
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS botfleet_migrations (
            version INTEGER PRIMARY KEY, applied_at_ms INTEGER NOT NULL)",
    )?;
    let done: i64 = tx.query_row(
        "SELECT COALESCE(MAX(version), 0) FROM botfleet_migrations",
        [],
        |r| r.get(0),
    )?;
    for (i, sql) in MIGRATIONS.iter().enumerate() {
        let version = i as i64 + 1;
        if version > done {
            tx.execute_batch(sql)?;
            tx.execute(
                "INSERT INTO botfleet_migrations (version, applied_at_ms) VALUES (?1, ?2)",
                params![version, botfleet_core::unix_ms()],
            )?;
        }
    }
    tx.commit()
}

const SELECT_BOT: &str = "SELECT id, platform, token, api_url, handler, webhook_url, \
    webhook_secret, enabled, status, last_error, updated_at_ms, reported_by, app_token, shards, \
    shards_per_slice, hook FROM bots";

fn row_to_bot(r: &rusqlite::Row<'_>) -> rusqlite::Result<BotRow> {
    Ok(BotRow {
        id: r.get(0)?,
        platform: r.get(1)?,
        token: r.get(2)?,
        api_url: r.get(3)?,
        handler: r.get(4)?,
        webhook_url: r.get(5)?,
        webhook_secret: r.get(6)?,
        enabled: r.get(7)?,
        status: r.get(8)?,
        last_error: r.get(9)?,
        updated_at_ms: r.get(10)?,
        reported_by: r.get(11)?,
        app_token: r.get(12)?,
        shards: r.get(13)?,
        shards_per_slice: r.get(14)?,
        hook: r.get(15)?,
    })
}

/// A bot row as SQL parameters, in the order both INSERT and UPDATE use: ?1 id … ?9
/// updated_at_ms, ?10 app_token, ?11 shards, ?12 shards_per_slice, ?13 hook, ?14 status.
fn row_params(r: &BotRow) -> [&dyn rusqlite::ToSql; 14] {
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

fn fence_i64(f: Fence) -> i64 {
    i64::try_from(f.0).unwrap_or(i64::MAX)
}

fn current_fence(c: &Connection, bot: &str) -> rusqlite::Result<Fence> {
    let f: Option<i64> = c
        .query_row(
            "SELECT fence FROM bot_fences WHERE bot_id = ?1",
            [bot],
            |r| r.get(0),
        )
        .optional()?;
    Ok(Fence(f.unwrap_or(0).max(0).unsigned_abs()))
}

impl SqliteStore {
    /// Replaces a bot's spec (status kept), only over version `expected` when given
    /// (`Ok(false)` when it changed since). The change time is the spec's version: strictly
    /// later than the one replaced, even within one millisecond.
    async fn replace_spec(&self, spec: &BotSpec, expected: Option<i64>) -> Result<bool> {
        spec.validate_shared()?;
        let row = BotRow::from_spec(spec, &self.keys)?;
        let id = spec.id.clone();
        self.with("update bot", move |c| {
            let mut params = row_params(&row)[..13].to_vec();
            params.push(&expected);
            let n = c
                .execute(
                    "UPDATE bots SET platform = ?2, token = ?3, api_url = ?4, handler = ?5, \
                     webhook_url = ?6, webhook_secret = ?7, enabled = ?8, \
                     updated_at_ms = MAX(?9, updated_at_ms + 1), \
                     app_token = ?10, shards = ?11, shards_per_slice = ?12, hook = ?13 \
                     WHERE id = ?1 AND (?14 IS NULL OR updated_at_ms = ?14)",
                    // Everything but the status (the last of the row): updates keep it.
                    &params[..],
                )
                .map_err(|e| StoreError::backend("update bot", e))?;
            if n == 1 {
                return Ok(true);
            }
            let exists = expected.is_some()
                && c.prepare_cached("SELECT 1 FROM bots WHERE id = ?1")
                    .and_then(|mut st| st.exists(params![id.as_str()]))
                    .map_err(|e| StoreError::backend("update bot", e))?;
            if exists {
                Ok(false)
            } else {
                Err(StoreError::NotFound(id))
            }
        })
        .await
    }
}

#[async_trait]
impl Store for SqliteStore {
    async fn add_bot(&self, spec: &BotSpec) -> Result<()> {
        spec.validate_shared()?;
        let row = BotRow::from_spec(spec, &self.keys)?;
        let id = spec.id.clone();
        self.with("add bot", move |c| {
            let n = c
                .execute(
                    "INSERT INTO bots (id, platform, token, api_url, handler, webhook_url, \
                     webhook_secret, enabled, updated_at_ms, app_token, shards, \
                     shards_per_slice, hook, status, last_error, created_at_ms) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, NULL, ?9) \
                     ON CONFLICT (id) DO NOTHING",
                    &row_params(&row)[..],
                )
                .map_err(|e| StoreError::backend("add bot", e))?;
            if n == 0 {
                return Err(StoreError::AlreadyExists(id));
            }
            Ok(())
        })
        .await
    }

    async fn get_bot(&self, id: &BotId) -> Result<Option<BotRecord>> {
        let id = id.as_str().to_owned();
        let row = self
            .read("get bot", move |c| {
                c.query_row(&format!("{SELECT_BOT} WHERE id = ?1"), [id], row_to_bot)
                    .optional()
                    .map_err(|e| StoreError::backend("get bot", e))
            })
            .await?;
        row.map(|r| r.into_record(&self.keys)).transpose()
    }

    async fn list_bots(&self, filter: &BotFilter) -> Result<Vec<BotRecord>> {
        let platform = filter.platform.map(|p| p.as_str().to_owned());
        let enabled = filter.enabled;
        let rows = self
            .read("list bots", move |c| {
                let mut st = c
                    .prepare(&format!(
                        "{SELECT_BOT} WHERE (?1 IS NULL OR platform = ?1) \
                         AND (?2 IS NULL OR enabled = ?2) ORDER BY id"
                    ))
                    .map_err(|e| StoreError::backend("list bots", e))?;
                let rows = st
                    .query_map(params![platform, enabled], row_to_bot)
                    .map_err(|e| StoreError::backend("list bots", e))?
                    .collect::<rusqlite::Result<Vec<_>>>()
                    .map_err(|e| StoreError::backend("list bots", e))?;
                Ok(rows)
            })
            .await?;
        rows.into_iter()
            .map(|r| r.into_record(&self.keys))
            .collect()
    }

    async fn update_bot(&self, spec: &BotSpec) -> Result<()> {
        self.replace_spec(spec, None).await.map(|_| ())
    }

    async fn update_bot_if(&self, spec: &BotSpec, expected_at_ms: i64) -> Result<bool> {
        self.replace_spec(spec, Some(expected_at_ms)).await
    }

    async fn reseal_secrets(&self) -> Result<u64> {
        let keys = self.keys.clone();
        self.with("reseal secrets", move |c| {
            let rows: Vec<(String, Sealed)> = {
                let mut st = c
                    .prepare("SELECT id, token, app_token, webhook_secret, hook FROM bots ORDER BY id")
                    .map_err(|e| StoreError::backend("reseal secrets", e))?;
                let rows = st
                    .query_map([], |r| {
                        Ok((r.get(0)?, (r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))
                    })
                    .map_err(|e| StoreError::backend("reseal secrets", e))?
                    .collect::<rusqlite::Result<Vec<_>>>()
                    .map_err(|e| StoreError::backend("reseal secrets", e))?;
                rows
            };
            let mut n = 0;
            for (id, old) in rows {
                let Some(new) = resealed(&keys, &id, &old)? else {
                    continue;
                };
                n += c
                    .execute(
                        "UPDATE bots SET token = ?2, app_token = ?3, webhook_secret = ?4, hook = ?5 \
                         WHERE id = ?1 AND token = ?6 AND app_token IS ?7 \
                         AND webhook_secret IS ?8 AND hook IS ?9",
                        params![id, new.0, new.1, new.2, new.3, old.0, old.1, old.2, old.3],
                    )
                    .map_err(|e| StoreError::backend("reseal secrets", e))?
                    as u64;
            }
            // Linked-device sessions are sealed too (a value written meanwhile is left as is).
            let fail = |e| StoreError::backend("reseal secrets", e);
            let recs: Vec<(String, String, String, String)> = {
                let mut st = c
                    .prepare("SELECT bot_id, kind, key, value FROM session_records")
                    .map_err(fail)?;
                let rows = st
                    .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
                    .map_err(fail)?
                    .collect::<rusqlite::Result<Vec<_>>>()
                    .map_err(fail)?;
                rows
            };
            for (bot, kind, key, value) in recs {
                if let Some(new) = crate::session::resealed(&keys, &bot, &kind, &value)? {
                    c.execute(
                        "UPDATE session_records SET value = ?5 \
                         WHERE bot_id = ?1 AND kind = ?2 AND key = ?3 AND value = ?4",
                        params![bot, kind, key, value, new],
                    )
                    .map_err(fail)?;
                }
            }
            Ok(n)
        })
        .await
    }

    async fn remove_bot(&self, id: &BotId) -> Result<bool> {
        let id = id.as_str().to_owned();
        self.with("remove bot", move |c| {
            // A removed bot's linked session (its keys) goes with it.
            c.execute("DELETE FROM session_records WHERE bot_id = ?1", [&id])
                .map_err(|e| StoreError::backend("remove bot", e))?;
            c.execute("DELETE FROM bots WHERE id = ?1", [id])
                .map(|n| n > 0)
                .map_err(|e| StoreError::backend("remove bot", e))
        })
        .await
    }

    async fn set_status(
        &self,
        id: &BotId,
        status: BotStatus,
        last_error: Option<&str>,
        reported_by: Option<&str>,
    ) -> Result<()> {
        let bot = id.clone();
        let err = last_error.map(str::to_owned);
        let by = reported_by.map(str::to_owned);
        self.with("set status", move |c| {
            let n = c
                .execute(
                    "UPDATE bots SET status = ?2, last_error = ?3, reported_by = ?4 WHERE id = ?1",
                    params![bot.as_str(), status.as_str(), err, by],
                )
                .map_err(|e| StoreError::backend("set status", e))?;
            if n == 0 {
                return Err(StoreError::NotFound(bot));
            }
            Ok(())
        })
        .await
    }

    async fn cursor(&self, id: &BotId) -> Result<Option<Cursor>> {
        let id = id.as_str().to_owned();
        self.read("read cursor", move |c| {
            let r: Option<(i64, Option<String>)> = c
                .query_row(
                    "SELECT fence, cursor FROM bot_fences WHERE bot_id = ?1",
                    [id],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()
                .map_err(|e| StoreError::backend("read cursor", e))?;
            Ok(r.and_then(|(f, v)| {
                v.map(|value| Cursor {
                    value,
                    fence: Fence(f.max(0).unsigned_abs()),
                })
            }))
        })
        .await
    }

    async fn put_cursor(&self, id: &BotId, value: &str, fence: Fence) -> Result<()> {
        let bot = id.clone();
        let value = value.to_owned();
        self.with("write cursor", move |c| {
            let fail = |e| StoreError::backend("write cursor", e);
            let n = c
                .execute(
                    "INSERT INTO bot_fences (bot_id, fence, cursor) VALUES (?1, ?2, ?3) \
                     ON CONFLICT (bot_id) DO UPDATE SET fence = excluded.fence, \
                     cursor = excluded.cursor WHERE bot_fences.fence <= excluded.fence",
                    params![bot.as_str(), fence_i64(fence), value],
                )
                .map_err(fail)?;
            stale_unless_written(c, n, bot, fence)
        })
        .await
    }

    async fn accept_fence(&self, id: &BotId, fence: Fence) -> Result<()> {
        let bot = id.clone();
        self.with("accept fence", move |c| {
            let n = c
                .execute(
                    "INSERT INTO bot_fences (bot_id, fence, cursor) VALUES (?1, ?2, NULL) \
                     ON CONFLICT (bot_id) DO UPDATE SET fence = excluded.fence \
                     WHERE bot_fences.fence <= excluded.fence",
                    params![bot.as_str(), fence_i64(fence)],
                )
                .map_err(|e| StoreError::backend("accept fence", e))?;
            stale_unless_written(c, n, bot, fence)
        })
        .await
    }

    async fn highest_fences(&self, ids: &[BotId]) -> Result<Vec<Fence>> {
        let ids: Vec<String> = ids.iter().map(|b| b.as_str().to_owned()).collect();
        self.read("read fences", move |c| {
            ids.iter()
                .map(|id| current_fence(c, id).map_err(|e| StoreError::backend("read fences", e)))
                .collect()
        })
        .await
    }

    async fn accept_fences(&self, grants: &[(BotId, Fence)]) -> Result<Vec<Result<()>>> {
        let grants = grants.to_vec();
        self.with("accept fences", move |c| {
            let fail = |e| StoreError::backend("accept fences", e);
            // IMMEDIATE: take the write lock first. A deferred transaction that reads and then
            // writes fails at once (no busy wait) when another process wrote in between.
            let tx = c
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(fail)?;
            let mut out = Vec::with_capacity(grants.len());
            {
                let mut st = tx
                    .prepare_cached(
                        "INSERT INTO bot_fences (bot_id, fence, cursor) VALUES (?1, ?2, NULL) \
                         ON CONFLICT (bot_id) DO UPDATE SET fence = excluded.fence \
                         WHERE bot_fences.fence <= excluded.fence",
                    )
                    .map_err(fail)?;
                for (bot, fence) in grants {
                    let n = st
                        .execute(params![bot.as_str(), fence_i64(fence)])
                        .map_err(fail)?;
                    out.push(stale_unless_written(&tx, n, bot, fence));
                }
            }
            tx.commit().map_err(fail)?;
            Ok(out)
        })
        .await
    }

    async fn set_statuses(&self, reports: &[StatusReport]) -> Result<Vec<Result<()>>> {
        let reports = reports.to_vec();
        self.with("set statuses", move |c| {
            let fail = |e| StoreError::backend("set statuses", e);
            // IMMEDIATE: take the write lock first. A deferred transaction that reads and then
            // writes fails at once (no busy wait) when another process wrote in between.
            let tx = c
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(fail)?;
            let mut out = Vec::with_capacity(reports.len());
            {
                let mut st = tx
                    .prepare_cached(
                        "UPDATE bots SET status = ?2, last_error = ?3, reported_by = ?4 \
                         WHERE id = ?1 AND (?5 IS NULL OR updated_at_ms <= ?5)",
                    )
                    .map_err(fail)?;
                let mut exists = tx
                    .prepare_cached("SELECT 1 FROM bots WHERE id = ?1")
                    .map_err(fail)?;
                for r in reports {
                    let n = st
                        .execute(params![
                            r.id.as_str(),
                            r.status.as_str(),
                            r.last_error,
                            r.reported_by,
                            r.spec_at_ms
                        ])
                        .map_err(fail)?;
                    // Nothing changed: a removed bot, or a report made under an older spec.
                    let gone = n == 0
                        && (r.spec_at_ms.is_none()
                            || !exists.exists(params![r.id.as_str()]).map_err(fail)?);
                    out.push(if gone {
                        Err(StoreError::NotFound(r.id))
                    } else {
                        Ok(())
                    });
                }
            }
            tx.commit().map_err(fail)?;
            Ok(out)
        })
        .await
    }

    async fn inbox_pending(&self, bot: &BotId, limit: usize) -> Result<Vec<InboxEntry>> {
        inbox_query(self, bot, "pending", "seq ASC", limit, None).await
    }

    async fn inbox_pending_chat(
        &self,
        bot: &BotId,
        chat: &str,
        limit: usize,
    ) -> Result<Vec<InboxEntry>> {
        inbox_query(self, bot, "pending", "seq ASC", limit, Some(chat)).await
    }

    async fn resume_point(
        &self,
        bot: &BotId,
        limit: usize,
    ) -> Result<(Option<Cursor>, Vec<InboxEntry>)> {
        let id = bot.as_str().to_owned();
        // One trip to the reading thread for both.
        let (cursor, rows) = self
            .read("read the resume point", move |c| {
                let r: Option<(i64, Option<String>)> = c
                    .query_row(
                        "SELECT fence, cursor FROM bot_fences WHERE bot_id = ?1",
                        [&id],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .optional()
                    .map_err(|e| StoreError::backend("read cursor", e))?;
                let cursor = r.and_then(|(f, v)| {
                    v.map(|value| Cursor {
                        value,
                        fence: Fence(f.max(0).unsigned_abs()),
                    })
                });
                Ok((
                    cursor,
                    inbox_rows(c, &id, "pending", "seq ASC", limit, None)?,
                ))
            })
            .await?;
        let entries = rows
            .into_iter()
            .map(|r| r.into_entry(bot))
            .collect::<Result<Vec<_>>>()?;
        Ok((cursor, entries))
    }

    async fn session_write(
        &self,
        bot: &BotId,
        writes: &[crate::SessionWrite],
        fence: Fence,
    ) -> Result<()> {
        // Sealed before the transaction: the writer connection does no crypto.
        let mut sealed = Vec::with_capacity(writes.len());
        for w in writes {
            sealed.push(match w {
                crate::SessionWrite::Put { kind, key, value } => (
                    kind.clone(),
                    key.clone(),
                    Some(self.keys.seal(
                        bot.as_str(),
                        &crate::session::field(kind),
                        &crate::session::to_hex(value),
                    )?),
                ),
                crate::SessionWrite::Delete { kind, key } => (kind.clone(), key.clone(), None),
            });
        }
        let bot = bot.clone();
        self.with("write a session", move |c| {
            let fail = |e| StoreError::backend("write a session", e);
            let tx = write_tx(c, &bot, Some(fence), "write a session")?;
            let now = botfleet_core::unix_ms();
            for (kind, key, value) in &sealed {
                match value {
                    Some(v) => tx.execute(
                        "INSERT INTO session_records (bot_id, kind, key, value, updated_at_ms) \
                         VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (bot_id, kind, key) \
                         DO UPDATE SET value = excluded.value, updated_at_ms = excluded.updated_at_ms",
                        params![bot.as_str(), kind, key, v, now],
                    ),
                    None => tx.execute(
                        "DELETE FROM session_records WHERE bot_id = ?1 AND kind = ?2 AND key = ?3",
                        params![bot.as_str(), kind, key],
                    ),
                }
                .map_err(fail)?;
            }
            tx.commit().map_err(fail)
        })
        .await
    }

    async fn session_records(&self, bot: &BotId, kind: &str) -> Result<Vec<(String, Vec<u8>)>> {
        let (b, k) = (bot.as_str().to_owned(), kind.to_owned());
        let rows: Vec<(String, String)> = self
            .read("read a session", move |c| {
                let fail = |e| StoreError::backend("read a session", e);
                let mut st = c
                    .prepare_cached(
                        "SELECT key, value FROM session_records WHERE bot_id = ?1 AND kind = ?2 \
                         ORDER BY key",
                    )
                    .map_err(fail)?;
                let rows = st
                    .query_map(params![b, k], |r| Ok((r.get(0)?, r.get(1)?)))
                    .map_err(fail)?
                    .collect::<rusqlite::Result<Vec<_>>>()
                    .map_err(fail)?;
                Ok(rows)
            })
            .await?;
        crate::session::open_session_rows(&self.keys, bot, kind, rows)
    }

    async fn fleet_secret(&self, name: &str, fresh: &[u8]) -> Result<Vec<u8>> {
        use crate::session::{FLEET, FLEET_SECRET};
        let sealed = crate::session::seal_fleet_secret(&self.keys, fresh)?;
        let key = name.to_owned();
        let stored: String = self
            .with("fleet secret", move |c| {
                let fail = |e| StoreError::backend("fleet secret", e);
                c.execute(
                    "INSERT INTO session_records (bot_id, kind, key, value, updated_at_ms) \
                     VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (bot_id, kind, key) DO NOTHING",
                    params![FLEET, FLEET_SECRET, key, sealed, botfleet_core::unix_ms()],
                )
                .map_err(fail)?;
                c.query_row(
                    "SELECT value FROM session_records WHERE bot_id = ?1 AND kind = ?2 AND key = ?3",
                    params![FLEET, FLEET_SECRET, key],
                    |r| r.get(0),
                )
                .map_err(fail)
            })
            .await?;
        crate::session::open_fleet_secret(&self.keys, name, &stored)
    }

    async fn session_record(&self, bot: &BotId, kind: &str, key: &str) -> Result<Option<Vec<u8>>> {
        let (b, k, y) = (bot.as_str().to_owned(), kind.to_owned(), key.to_owned());
        let row: Option<String> = self
            .read("read a session", move |c| {
                let fail = |e| StoreError::backend("read a session", e);
                c.prepare_cached(
                    "SELECT value FROM session_records WHERE bot_id = ?1 AND kind = ?2 AND key = ?3",
                )
                .map_err(fail)?
                .query_row(params![b, k, y], |r| r.get(0))
                .optional()
                .map_err(fail)
            })
            .await?;
        let rows = row.map(|v| vec![(key.to_owned(), v)]).unwrap_or_default();
        Ok(
            crate::session::open_session_rows(&self.keys, bot, kind, rows)?
                .pop()
                .map(|(_, v)| v),
        )
    }

    async fn session_clear(&self, bot: &BotId, fence: Fence) -> Result<()> {
        let bot = bot.clone();
        self.with("clear a session", move |c| {
            let fail = |e| StoreError::backend("clear a session", e);
            let tx = write_tx(c, &bot, Some(fence), "clear a session")?;
            tx.execute(
                "DELETE FROM session_records WHERE bot_id = ?1",
                [bot.as_str()],
            )
            .map_err(fail)?;
            tx.commit().map_err(fail)
        })
        .await
    }

    async fn journal_put(
        &self,
        bot: &BotId,
        items: &[InboxItem],
        fence: Option<Fence>,
        view: Option<usize>,
    ) -> Result<(Vec<crate::Journaled>, Option<TurnView>)> {
        let (bot, items) = (bot.clone(), items.to_vec());
        self.with("journal", move |c| {
            let fail = |e| StoreError::backend("journal", e);
            let tx = write_tx(c, &bot, fence, "journal")?;
            // Numbered by arrival time in µs, above the bot's last entry (the write lock
            // makes every writer here the one writer), without gaps for redeliveries.
            let last: i64 = tx
                .query_row(
                    "SELECT COALESCE(MAX(seq), 0) FROM inbox WHERE bot_id = ?1",
                    [bot.as_str()],
                    |r| r.get(0),
                )
                .map_err(fail)?;
            let first = (last + 1).max(crate::turns::arrival_seq());
            let out = insert_inbox(&tx, &bot, &items, first, "journal")?;
            tx.commit().map_err(fail)?;
            // Read on the writing connection, right after: no second trip to a thread.
            let view = match view.and_then(|i| items.get(i)) {
                Some(it) => Some(turn_view_on(c, &bot, &it.key, &it.chat)?),
                None => None,
            };
            Ok((out, view))
        })
        .await
    }

    async fn chat_events(
        &self,
        bot: &BotId,
        chat: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<crate::ChatEvent>> {
        let (bot, chat) = (bot.clone(), chat.to_owned());
        let after = i64::try_from(after).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit.min(crate::MAX_CHAT_EVENTS)).unwrap_or(0);
        self.read("read a chat's log", move |c| {
            let fail = |e| StoreError::backend("read a chat's log", e);
            let mut st = c
                .prepare_cached(&crate::schema::CHAT_EVENTS.replace('$', "?"))
                .map_err(fail)?;
            let rows = st
                .query_map(params![bot.as_str(), chat, after, limit], |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, bool>(1)?,
                        r.get::<_, String>(2)?,
                        r.get::<_, String>(3)?,
                        r.get::<_, Option<String>>(4)?,
                        r.get::<_, i64>(5)?,
                    ))
                })
                .map_err(fail)?;
            let mut out = Vec::new();
            for r in rows {
                let (n, said, entry, body, state, at_ms) = r.map_err(fail)?;
                out.push(crate::chatlog::event(
                    n,
                    said,
                    entry,
                    body,
                    state.as_deref(),
                    at_ms,
                )?);
            }
            Ok(out)
        })
        .await
    }

    async fn turn_view(&self, bot: &BotId, key: &str, chat: &str) -> Result<TurnView> {
        let (bot, key, chat) = (bot.clone(), key.to_owned(), chat.to_owned());
        self.read("read a turn", move |c| turn_view_on(c, &bot, &key, &chat))
            .await
    }

    async fn chat_seen(&self, bot: &BotId, seen: &[(String, i64)]) -> Result<()> {
        let (bot, seen) = (bot.base().to_owned(), seen.to_vec());
        self.with("record a chat's user seen", move |c| {
            let fail = |e| StoreError::backend("record a chat's user seen", e);
            let tx = c
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(fail)?;
            {
                let mut st = tx
                    .prepare_cached(&crate::schema::CHAT_HEAD_JOURNAL.replace('$', "?"))
                    .map_err(fail)?;
                for (chat, at_ms) in &seen {
                    st.query_row(params![bot, chat, 0i64, at_ms], |_| Ok(()))
                        .map_err(fail)?;
                }
            }
            tx.commit().map_err(fail)
        })
        .await
    }

    async fn chat_pause(&self, bot: &BotId, pause: &crate::ChatPause) -> Result<()> {
        let (bot, p) = (bot.base().to_owned(), pause.clone());
        self.with("pause a chat", move |c| {
            c.execute(
                &crate::schema::PAUSE_PUT.replace('$', "?"),
                params![bot, p.chat, p.until_ms, p.reason, p.paused_at_ms],
            )
            .map_err(|e| StoreError::backend("pause a chat", e))?;
            Ok(())
        })
        .await
    }

    async fn chat_resume(&self, bot: &BotId, chat: &str, replay: bool) -> Result<crate::Resumed> {
        let (bot, chat) = (bot.base().to_owned(), chat.to_owned());
        self.with("resume a chat", move |c| {
            let fail = |e| StoreError::backend("resume a chat", e);
            let tx = c
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(fail)?;
            let pause = tx
                .query_row(
                    &crate::schema::PAUSE_DELETE.replace('$', "?"),
                    params![bot, chat],
                    |r| {
                        Ok(crate::ChatPause {
                            chat: chat.clone(),
                            until_ms: r.get(0)?,
                            reason: r.get(1)?,
                            paused_at_ms: r.get(2)?,
                        })
                    },
                )
                .optional()
                .map_err(fail)?;
            let mut replayed = Vec::new();
            if let Some(p) = pause.as_ref().filter(|_| replay) {
                let mut st = tx
                    .prepare(&crate::schema::PAUSED_REPLAY.replace('$', "?"))
                    .map_err(fail)?;
                let rows = st
                    .query_map(params![bot, chat, p.paused_at_ms, format!("{bot}#")], |r| {
                        Ok((
                            r.get::<_, i64>(2)?,
                            r.get::<_, String>(0)?,
                            r.get::<_, String>(1)?,
                        ))
                    })
                    .map_err(fail)?;
                for r in rows {
                    replayed.push(r.map_err(fail)?);
                }
            }
            tx.commit().map_err(fail)?;
            replayed.sort();
            let now = botfleet_core::unix_ms();
            Ok(crate::Resumed {
                pause: pause.filter(|p| p.in_effect(now)),
                replayed: replayed
                    .into_iter()
                    .map(|(_, u, k)| BotId::new(u).map(|u| (u, k)))
                    .collect::<std::result::Result<_, _>>()
                    .map_err(|e| StoreError::backend("resume a chat", e))?,
            })
        })
        .await
    }

    async fn chat_pauses(&self, bot: &BotId) -> Result<Vec<crate::ChatPause>> {
        let bot = bot.base().to_owned();
        self.read("read paused chats", move |c| {
            let fail = |e| StoreError::backend("read paused chats", e);
            let mut st = c
                .prepare_cached(&crate::schema::PAUSES_LIST.replace('$', "?"))
                .map_err(fail)?;
            let rows = st
                .query_map(params![bot, botfleet_core::unix_ms()], |r| {
                    Ok(crate::ChatPause {
                        chat: r.get(0)?,
                        until_ms: r.get(1)?,
                        reason: r.get(2)?,
                        paused_at_ms: r.get(3)?,
                    })
                })
                .map_err(fail)?;
            rows.collect::<rusqlite::Result<Vec<_>>>().map_err(fail)
        })
        .await
    }

    async fn turn_accept(&self, bot: &BotId, chat: &str, fence: Fence) -> Result<()> {
        let (bot, chat) = (bot.clone(), chat.to_owned());
        self.with("accept a turn", move |c| {
            let fail = |e| StoreError::backend("accept a turn", e);
            let n = c
                .execute(
                    &crate::schema::TURN_ACCEPT.replace('$', "?"),
                    params![
                        bot.as_str(),
                        chat,
                        fence_i64(fence),
                        botfleet_core::unix_ms()
                    ],
                )
                .map_err(fail)?;
            if n > 0 {
                return Ok(());
            }
            let current: i64 = c
                .query_row(
                    "SELECT fence FROM chat_state WHERE bot_id = ?1 AND chat = ?2",
                    params![bot.as_str(), chat],
                    |r| r.get(0),
                )
                .map_err(fail)?;
            Err(StoreError::StaleFence {
                bot,
                offered: fence,
                current: Fence(current.max(0).unsigned_abs()),
            })
        })
        .await
    }

    async fn turn_record(&self, bot: &BotId, rec: &TurnRecord) -> Result<StateWrite> {
        let (bot, rec) = (bot.clone(), rec.clone());
        self.with("record a turn", move |c| {
            let fail = |e| StoreError::backend("record a turn", e);
            let (fence, claim) = (rec.fence.fence(), rec.fence.claim().is_some());
            let tx = write_tx(c, &bot, rec.fence.claim(), "record a turn")?;
            let now = botfleet_core::unix_ms();
            if rec.outcome == crate::InboxOutcome::Paused {
                // Recorded paused only while the pause holds (a resume's replay, a write of
                // its own, would not see it after).
                let (paused, superseded) = tx
                    .query_row(
                        concat!(
                            "SELECT ",
                            crate::schema::paused_now!("?1", "?2", "?3", "?4"),
                            ", EXISTS (SELECT 1 FROM chat_state WHERE bot_id = ?5 AND chat = ?3 \
                             AND fence > ?6)"
                        ),
                        params![
                            bot.base(),
                            now,
                            rec.chat,
                            rec.key,
                            bot.as_str(),
                            fence_i64(fence)
                        ],
                        |r| Ok((r.get::<_, bool>(0)?, r.get::<_, bool>(1)?)),
                    )
                    .map_err(fail)?;
                if !paused && (claim || !superseded) {
                    return Ok(StateWrite::Unpaused);
                }
            }
            // A claim's turn ends its entry in this same all-or-nothing write: the entry's end
            // is its outbox record. Only a chat's turn can send and leave its entry pending
            // (superseded), so only it needs the row.
            if rec.sent && !claim {
                tx.execute(
                    "INSERT INTO outbox (bot_id, key, fence, sent_at_ms) VALUES (?1, ?2, ?3, ?4) \
                     ON CONFLICT DO NOTHING",
                    params![
                        bot.as_str(),
                        crate::reply_key(&rec.key),
                        fence_i64(fence),
                        now
                    ],
                )
                .map_err(fail)?;
            }
            let mut written = StateWrite::Unchanged;
            if let Some((expected, state)) = &rec.state {
                let expected = i64::try_from(*expected).unwrap_or(i64::MAX);
                let n = tx
                    .execute(
                        &crate::schema::state_cas("$7", "1").replace('$', "?"),
                        params![
                            bot.as_str(),
                            rec.chat,
                            expected,
                            fence_i64(fence),
                            state,
                            now,
                            claim
                        ],
                    )
                    .map_err(fail)?;
                written = if n > 0 {
                    StateWrite::Written(expected.max(0).unsigned_abs() + 1)
                } else {
                    StateWrite::Stale
                };
            }
            let (state, _) = crate::turns::outcome_parts(&rec.outcome);
            let error = rec.error();
            // A chat turn superseded by a newer one (a higher fence on the chat) leaves the
            // entry to that one: it ends it with its own result.
            let superseded = !claim
                && !rec.refs.is_empty()
                && tx
                    .query_row(
                        "SELECT EXISTS (SELECT 1 FROM chat_state WHERE bot_id = ?1 AND chat = ?2 AND fence > ?3)",
                        params![bot.as_str(), rec.chat, fence_i64(fence)],
                        |r| r.get::<_, bool>(0),
                    )
                    .map_err(fail)?;
            if !superseded && !rec.refs.is_empty() {
                let mut put = tx
                    .prepare_cached(&crate::schema::REF_PUT.replace('$', "?"))
                    .map_err(fail)?;
                for (name, value) in &rec.refs {
                    put.execute(params![
                        bot.as_str(),
                        rec.chat,
                        name,
                        value,
                        now + crate::REFS_TTL_MS
                    ])
                    .map_err(fail)?;
                }
            }
            let ended = tx
                .execute(
                    "UPDATE inbox SET state = ?3, error = ?4, finished_at_ms = ?5 \
                 WHERE bot_id = ?1 AND key = ?2 AND state = 'pending' \
                 AND (?8 OR NOT EXISTS (SELECT 1 FROM chat_state c WHERE c.bot_id = ?1 \
                 AND c.chat = ?6 AND c.fence > ?7))",
                    params![
                        bot.as_str(),
                        rec.key,
                        state,
                        error,
                        now,
                        rec.chat,
                        fence_i64(fence),
                        claim
                    ],
                )
                .map_err(fail)?;
            if ended > 0 && !rec.said.is_empty() {
                log_said(&tx, &bot, &rec, now).map_err(fail)?;
            }
            tx.commit().map_err(fail)?;
            Ok(written)
        })
        .await
    }

    async fn turn_step(&self, bot: &BotId, step: &crate::TurnStep) -> Result<()> {
        let (bot, step) = (bot.clone(), step.clone());
        self.with("record a turn's step", move |c| {
            let fail = |e| StoreError::backend("record a turn's step", e);
            let fence = step.fence.fence();
            let tx = write_tx(c, &bot, step.fence.claim(), "record a turn's step")?;
            if step.fence.claim().is_none() {
                chat_fence_holds(&tx, &bot, &step.chat, fence, "record a turn's step")?;
            }
            tx.execute(
                &crate::schema::PROGRESS_PUT.replace('$', "?"),
                params![
                    bot.as_str(),
                    crate::progress_key(&step.key),
                    fence_i64(fence),
                    botfleet_core::unix_ms(),
                    step.progress
                ],
            )
            .map_err(fail)?;
            tx.commit().map_err(fail)?;
            Ok(())
        })
        .await
    }

    async fn turn_hold(&self, bot: &BotId, hold: &crate::TurnHold) -> Result<Option<i64>> {
        let (bot, hold) = (bot.clone(), hold.clone());
        self.with("hold a turn", move |c| {
            let fail = |e| StoreError::backend("hold a turn", e);
            let fence = hold.fence.fence();
            let tx = write_tx(c, &bot, hold.fence.claim(), "hold a turn")?;
            if hold.fence.claim().is_none() {
                chat_fence_holds(&tx, &bot, &hold.chat, fence, "hold a turn")?;
            }
            let until = tx
                .query_row(
                    &crate::schema::TURN_HOLD.replace('$', "?"),
                    params![
                        bot.as_str(),
                        hold.key,
                        hold.chat,
                        fence_i64(fence),
                        hold.until_ms,
                        hold.fence.claim().is_some()
                    ],
                    |r| r.get::<_, i64>(0),
                )
                .optional()
                .map_err(fail)?;
            tx.commit().map_err(fail)?;
            Ok(until)
        })
        .await
    }

    async fn reply_post(&self, bot: &BotId, post: &crate::ReplyPost) -> Result<crate::PostAnswer> {
        use crate::PostAnswer;
        let (bot, post) = (bot.clone(), post.clone());
        self.with("keep a posted reply", move |c| {
            let fail = |e| StoreError::backend("keep a posted reply", e);
            let tx = write_tx(c, &bot, None, "keep a posted reply")?;
            let now = botfleet_core::unix_ms();
            let (key, digest) = (
                crate::held::digest(&post.idempotency_key),
                crate::held::digest(&post.body),
            );
            let known: bool = tx
                .query_row(
                    "SELECT EXISTS (SELECT 1 FROM inbox WHERE bot_id = ?1 AND key = ?2)",
                    params![bot.as_str(), post.key],
                    |r| r.get(0),
                )
                .map_err(fail)?;
            if !known {
                return Ok(PostAnswer::Unknown);
            }
            let before: Option<(i64, String)> = tx
                .query_row(
                    "SELECT seq, digest FROM replies WHERE bot_id = ?1 AND entry = ?2 \
                     AND post_key = ?3",
                    params![bot.as_str(), post.key, key],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()
                .map_err(fail)?;
            if let Some((seq, d)) = before {
                return Ok(crate::held::answer_again(
                    seq.max(0).unsigned_abs(),
                    &d,
                    &digest,
                ));
            }
            let seq: Option<i64> = tx
                .query_row(
                    &crate::schema::REPLY_NUMBER.replace('$', "?"),
                    params![bot.as_str(), post.key, post.last, now],
                    |r| r.get(0),
                )
                .optional()
                .map_err(fail)?;
            let Some(seq) = seq else {
                return Ok(PostAnswer::Ended);
            };
            tx.execute(
                &crate::schema::REPLY_INSERT.replace('$', "?"),
                params![
                    bot.as_str(),
                    post.key,
                    seq,
                    key,
                    digest,
                    post.body,
                    post.last,
                    now
                ],
            )
            .map_err(fail)?;
            tx.commit().map_err(fail)?;
            Ok(PostAnswer::Accepted(seq.max(0).unsigned_abs()))
        })
        .await
    }

    async fn replies_since(&self, since_ms: i64) -> Result<Vec<(BotId, String, u64)>> {
        let rows: Vec<(String, String, i64)> = self
            .read("read posted replies", move |c| {
                let fail = |e| StoreError::backend("read posted replies", e);
                let mut st = c
                    .prepare_cached(&crate::schema::REPLIES_SINCE.replace('$', "?"))
                    .map_err(fail)?;
                let rows = st
                    .query_map([since_ms], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                    .map_err(fail)?
                    .collect::<rusqlite::Result<Vec<_>>>()
                    .map_err(fail)?;
                Ok(rows)
            })
            .await?;
        crate::held::since_rows(rows)
    }

    async fn posted_replies(
        &self,
        bot: &BotId,
        key: &str,
        after_seq: u64,
    ) -> Result<Vec<crate::PostedReply>> {
        let (bot, key) = (bot.as_str().to_owned(), key.to_owned());
        let after = i64::try_from(after_seq).unwrap_or(i64::MAX);
        self.read("read posted replies", move |c| {
            let fail = |e| StoreError::backend("read posted replies", e);
            let mut st = c
                .prepare_cached(&crate::schema::REPLIES_AFTER.replace('$', "?"))
                .map_err(fail)?;
            let rows = st
                .query_map(params![bot, key, after], |r| {
                    Ok(crate::PostedReply {
                        seq: r.get::<_, i64>(0)?.max(0).unsigned_abs(),
                        body: r.get(1)?,
                        last: r.get(2)?,
                        posted_at_ms: r.get(3)?,
                    })
                })
                .map_err(fail)?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(fail)?;
            Ok(rows)
        })
        .await
    }

    async fn turn_progress(&self, bot: &BotId, key: &str) -> Result<Option<String>> {
        let (bot, key) = (bot.as_str().to_owned(), crate::progress_key(key));
        self.read("read a turn's progress", move |c| {
            c.query_row(
                "SELECT result FROM outbox WHERE bot_id = ?1 AND key = ?2",
                params![bot, key],
                |r| r.get::<_, Option<String>>(0),
            )
            .optional()
            .map(Option::flatten)
            .map_err(|e| StoreError::backend("read a turn's progress", e))
        })
        .await
    }

    async fn refs_get(
        &self,
        bot: &BotId,
        chat: &str,
        names: &[String],
    ) -> Result<Vec<Option<String>>> {
        let (bot, chat, names) = (bot.as_str().to_owned(), chat.to_owned(), names.to_vec());
        self.read("read refs", move |c| {
            let fail = |e| StoreError::backend("read refs", e);
            let now = botfleet_core::unix_ms();
            let mut st = c
                .prepare_cached(
                    "SELECT value FROM refs WHERE bot_id = ?1 AND chat = ?2 AND name = ?3 \
                     AND expires_at_ms > ?4",
                )
                .map_err(fail)?;
            names
                .iter()
                .map(|n| {
                    st.query_row(params![bot, chat, n, now], |r| r.get::<_, String>(0))
                        .optional()
                        .map_err(fail)
                })
                .collect()
        })
        .await
    }

    async fn inbox_undeliverable(&self, bot: &BotId, limit: usize) -> Result<Vec<InboxEntry>> {
        inbox_query(self, bot, "undeliverable", "seq DESC", limit, None).await
    }

    async fn inbox_stats(&self) -> Result<HashMap<BotId, InboxStats>> {
        let rows: Vec<(String, String, i64, i64)> = self
            .read("inbox stats", |c| {
                let mut st = c
                    .prepare(&crate::schema::INBOX_STATS.replace('$', "?"))
                    .map_err(|e| StoreError::backend("inbox stats", e))?;
                let rows = st
                    .query_map([botfleet_core::unix_ms()], |r| {
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
                    })
                    .map_err(|e| StoreError::backend("inbox stats", e))?
                    .collect::<rusqlite::Result<Vec<_>>>()
                    .map_err(|e| StoreError::backend("inbox stats", e))?;
                Ok(rows)
            })
            .await?;
        stats_from_rows(rows)
    }

    async fn inbox_prune(&self, done_before_ms: i64, undeliverable_before_ms: i64) -> Result<u64> {
        self.with("prune inbox", move |c| {
            c.execute(
                "DELETE FROM inbox WHERE ((state = 'done' AND finished_at_ms < ?1) \
                 OR (state IN ('undeliverable', 'paused') AND finished_at_ms < ?2)) \
                 AND (substr(key, 1, 5) <> 'send:' OR finished_at_ms < ?3)",
                params![
                    done_before_ms,
                    undeliverable_before_ms,
                    botfleet_core::unix_ms() - crate::SEND_KEEP_MS
                ],
            )
            .and_then(|n| {
                c.execute("DELETE FROM outbox WHERE sent_at_ms < ?1", [done_before_ms])?;
                c.execute(
                    "DELETE FROM refs WHERE expires_at_ms <= ?1",
                    [botfleet_core::unix_ms()],
                )?;
                c.execute(
                    &crate::schema::REPLIES_PRUNE.replace('$', "?"),
                    [done_before_ms],
                )?;
                c.execute(
                    &crate::schema::SAID_PRUNE.replace('$', "?"),
                    [done_before_ms],
                )?;
                Ok(n as u64)
            })
            .map_err(|e| StoreError::backend("prune inbox", e))
        })
        .await
    }

    async fn registry_stamp(&self) -> Result<(u64, i64)> {
        self.read("registry stamp", |c| {
            c.query_row(
                "SELECT COUNT(*), COALESCE(MAX(updated_at_ms), 0) FROM bots",
                [],
                |r| Ok((r.get::<_, i64>(0)?.max(0).unsigned_abs(), r.get(1)?)),
            )
            .map_err(|e| StoreError::backend("registry stamp", e))
        })
        .await
    }

    async fn highest_fence(&self, id: &BotId) -> Result<Fence> {
        let id = id.as_str().to_owned();
        self.read("read fence", move |c| {
            current_fence(c, &id).map_err(|e| StoreError::backend("read fence", e))
        })
        .await
    }
}

async fn inbox_query(
    s: &SqliteStore,
    bot: &BotId,
    state: &'static str,
    order: &'static str,
    limit: usize,
    chat: Option<&str>,
) -> Result<Vec<InboxEntry>> {
    let bot_s = bot.as_str().to_owned();
    let chat = chat.map(str::to_owned);
    let rows: Vec<InboxRow> = s
        .read("read inbox", move |c| {
            inbox_rows(c, &bot_s, state, order, limit, chat.as_deref())
        })
        .await?;
    rows.into_iter().map(|r| r.into_entry(bot)).collect()
}

/// The inbox rows of `bot` in `state`, on one connection.
fn inbox_rows(
    c: &Connection,
    bot: &str,
    state: &'static str,
    order: &'static str,
    limit: usize,
    chat: Option<&str>,
) -> Result<Vec<InboxRow>> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut st = c
        .prepare(&format!(
            "SELECT key, seq, chat, message, state, error, received_at_ms FROM inbox \
             WHERE bot_id = ?1 AND state = ?2 AND (?4 IS NULL OR chat = ?4) \
             ORDER BY {order} LIMIT ?3"
        ))
        .map_err(|e| StoreError::backend("read inbox", e))?;
    let rows = st
        .query_map(params![bot, state, limit, chat], |r| {
            Ok(InboxRow {
                key: r.get(0)?,
                seq: r.get(1)?,
                chat: r.get(2)?,
                message: r.get(3)?,
                state: r.get(4)?,
                error: r.get(5)?,
                received_at_ms: r.get(6)?,
            })
        })
        .map_err(|e| StoreError::backend("read inbox", e))?
        .collect::<rusqlite::Result<Vec<_>>>()
        .map_err(|e| StoreError::backend("read inbox", e))?;
    Ok(rows)
}

/// What a turn on the entry `key` of `chat` starts from, read on `c`.
fn turn_view_on(c: &Connection, bot: &BotId, key: &str, chat: &str) -> Result<TurnView> {
    let fail = |e| StoreError::backend("read a turn", e);
    let reply = crate::reply_key(key);
    let mut st = c
        .prepare_cached(&crate::schema::TURN_VIEW.replace('$', "?"))
        .map_err(fail)?;
    let now = botfleet_core::unix_ms();
    let (row, revision, state, sent, held_until_ms, paused, last_in_ms) = st
        .query_row(
            params![bot.as_str(), key, chat, reply, bot.base(), now],
            |r| {
                let row = match r.get::<_, Option<i64>>(0)? {
                    Some(seq) => Some(InboxRow {
                        key: key.to_owned(),
                        seq,
                        chat: r.get(1)?,
                        message: r.get(2)?,
                        state: r.get(3)?,
                        error: r.get(4)?,
                        received_at_ms: r.get(5)?,
                    }),
                    None => None,
                };
                Ok((
                    row,
                    r.get::<_, Option<i64>>(6)?,
                    r.get::<_, Option<String>>(7)?,
                    r.get::<_, bool>(8)?,
                    r.get::<_, Option<i64>>(9)?,
                    r.get::<_, bool>(10)?,
                    r.get::<_, Option<i64>>(11)?,
                ))
            },
        )
        .map_err(fail)?;
    Ok(TurnView {
        entry: row.map(|r| r.into_entry(bot)).transpose()?,
        state,
        revision: revision.unwrap_or(0).max(0).unsigned_abs(),
        sent,
        held_until_ms,
        paused,
        last_in_ms,
    })
}

/// Inserts the items not recorded before, the first at `seq`, the next one up after each
/// new one, an event of a paused chat as paused; answers what became of each.
fn insert_inbox(
    tx: &rusqlite::Transaction<'_>,
    bot: &BotId,
    items: &[InboxItem],
    mut seq: i64,
    op: &'static str,
) -> Result<Vec<crate::Journaled>> {
    let fail = |e| StoreError::backend(op, e);
    let now = botfleet_core::unix_ms();
    // (`WHERE true`: an INSERT … SELECT with an upsert clause needs a WHERE to parse.)
    let mut st = tx
        .prepare_cached(concat!(
            "INSERT INTO inbox (bot_id, key, seq, chat, message, state, received_at_ms, finished_at_ms, n) \
             SELECT ?1, ?2, ?3, ?4, ?5, CASE WHEN p THEN 'paused' ELSE 'pending' END, ?6, \
             CASE WHEN p THEN ?6 END, COALESCE((SELECT n FROM chat_heads \
             WHERE bot_id = ?7 AND chat = ?4), 0) + 1 FROM (SELECT ",
            crate::schema::paused_now!("?7", "?6", "?4", "?2"),
            " AS p) WHERE true ON CONFLICT DO NOTHING RETURNING state"
        ))
        .map_err(fail)?;
    // The number the entry took (one writer: read in the insert, taken here), and when its
    // chat's user last wrote.
    let mut head = tx
        .prepare_cached(&crate::schema::CHAT_HEAD_JOURNAL.replace('$', "?"))
        .map_err(fail)?;
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let mut rows = st
            .query(params![
                bot.as_str(),
                item.key,
                seq,
                item.chat,
                item.message,
                now,
                bot.base()
            ])
            .map_err(fail)?;
        let state: Option<String> = match rows.next().map_err(fail)? {
            Some(r) => Some(r.get(0).map_err(fail)?),
            None => None,
        };
        let done = match state.as_deref() {
            None => crate::Journaled::Known,
            Some("paused") => crate::Journaled::Paused,
            Some(_) => crate::Journaled::New,
        };
        if done != crate::Journaled::Known {
            seq += 1;
            let wrote =
                (crate::InboxEntry::kind_of(&item.key) == crate::EntryKind::Event).then_some(now);
            head.query_row(params![bot.base(), item.chat, 1, wrote], |_| Ok(()))
                .map_err(fail)?;
        }
        out.push(done);
    }
    Ok(out)
}

/// Logs what a turn said in its chat, numbered after the chat's last item.
fn log_said(
    tx: &rusqlite::Transaction<'_>,
    bot: &BotId,
    rec: &TurnRecord,
    now: i64,
) -> rusqlite::Result<()> {
    let count = i64::try_from(rec.said.len()).unwrap_or(i64::MAX);
    let last: i64 = tx.query_row(
        &crate::schema::CHAT_HEAD_TAKE.replace('$', "?"),
        params![bot.base(), rec.chat, count],
        |r| r.get(0),
    )?;
    let mut put = tx.prepare_cached(
        "INSERT INTO chat_said (bot_id, chat, n, entry, body, at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?;
    for (i, body) in (last - count + 1..).zip(&rec.said) {
        put.execute(params![bot.as_str(), rec.chat, i, rec.key, body, now])?;
    }
    Ok(())
}

/// An IMMEDIATE transaction (the write lock first: a deferred one that reads and then writes
/// fails at once, with no busy wait, when another process wrote in between); with a `fence`,
/// one in which `bot`'s accepted fence is not above it (a stale writer is refused).
/// `Ok` while no fence above `fence` was accepted for the chat's turn.
fn chat_fence_holds(
    c: &Connection,
    bot: &BotId,
    chat: &str,
    fence: Fence,
    op: &'static str,
) -> Result<()> {
    let current: Option<i64> = c
        .query_row(
            "SELECT fence FROM chat_state WHERE bot_id = ?1 AND chat = ?2",
            params![bot.as_str(), chat],
            |r| r.get(0),
        )
        .optional()
        .map_err(|e| StoreError::backend(op, e))?;
    match current.filter(|c| *c > fence_i64(fence)) {
        Some(cur) => Err(StoreError::StaleFence {
            bot: bot.clone(),
            offered: fence,
            current: Fence(cur.max(0).unsigned_abs()),
        }),
        None => Ok(()),
    }
}

fn write_tx<'c>(
    c: &'c mut Connection,
    bot: &BotId,
    fence: Option<Fence>,
    op: &'static str,
) -> Result<rusqlite::Transaction<'c>> {
    let tx = c
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|e| StoreError::backend(op, e))?;
    let Some(fence) = fence else {
        return Ok(tx);
    };
    let current = current_fence(&tx, bot.as_str()).map_err(|e| StoreError::backend(op, e))?;
    if current > fence {
        return Err(StoreError::StaleFence {
            bot: bot.clone(),
            offered: fence,
            current,
        });
    }
    Ok(tx)
}

fn stale_unless_written(c: &Connection, changed: usize, bot: BotId, offered: Fence) -> Result<()> {
    if changed > 0 {
        return Ok(());
    }
    let current =
        current_fence(c, bot.as_str()).map_err(|e| StoreError::backend("read fence", e))?;
    Err(StoreError::StaleFence {
        bot,
        offered,
        current,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both connections keep their page caches at the bounds the worker's memory was measured
    /// with, and the hot path's query uses its index rather than reading a bot's every entry.
    #[tokio::test]
    async fn page_caches_are_bounded_and_the_journal_reads_by_index() {
        let dir = botfleet_testkit::TempDir::new("botfleet-cache");
        let store = SqliteStore::open(dir.0.join("s.db"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let cache = |c: &Arc<Mutex<Connection>>| -> i64 {
            let c = c.lock().unwrap_or_else(|e| e.into_inner());
            c.query_row("PRAGMA cache_size", [], |r| r.get(0))
                .unwrap_or_else(|e| panic!("{e}"))
        };
        assert_eq!(cache(&store.conn), -i64::from(WRITER_CACHE_KIB));
        assert_eq!(cache(&store.reader), -i64::from(READER_CACHE_KIB));
        let plan: String = {
            let c = store.conn.lock().unwrap_or_else(|e| e.into_inner());
            c.query_row(
                "EXPLAIN QUERY PLAN SELECT MAX(seq) FROM inbox WHERE bot_id = 'b'",
                [],
                |r| r.get(3),
            )
            .unwrap_or_else(|e| panic!("{e}"))
        };
        assert!(plan.contains("inbox_by_seq"), "{plan}");
    }

    #[tokio::test]
    async fn a_database_of_the_previous_schema_upgrades_in_place() {
        let dir =
            std::env::temp_dir().join(format!("botfleet-upgrade-{}", botfleet_testkit::nonce()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let path = dir.join("old.db");
        {
            let c = Connection::open(&path).unwrap_or_else(|e| panic!("{e}"));
            c.execute_batch(
                "CREATE TABLE botfleet_migrations (version INTEGER PRIMARY KEY, applied_at_ms INTEGER NOT NULL)",
            )
            .unwrap_or_else(|e| panic!("{e}"));
            for (i, sql) in MIGRATIONS[..crate::schema::previous::VERSION]
                .iter()
                .enumerate()
            {
                c.execute_batch(sql).unwrap_or_else(|e| panic!("{e}"));
                c.execute(
                    "INSERT INTO botfleet_migrations (version, applied_at_ms) VALUES (?1, 0)",
                    [i as i64 + 1],
                )
                .unwrap_or_else(|e| panic!("{e}"));
            }
            c.execute_batch(crate::schema::previous::ROWS)
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let s = SqliteStore::open(&path)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        crate::schema::previous::check_upgraded(&s).await;
        let c = Connection::open(&path).unwrap_or_else(|e| panic!("{e}"));
        let version: i64 = c
            .query_row("SELECT MAX(version) FROM botfleet_migrations", [], |r| {
                r.get(0)
            })
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(version as usize, MIGRATIONS.len());
        let gone: i64 = c
            .query_row(
                "SELECT COUNT(*) FROM sqlite_master WHERE name = 'sent_replies'",
                [],
                |r| r.get(0),
            )
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(gone, 0, "the sent marks' table is dropped");
        drop((c, s));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
