//! The worker's metrics, rendered as Prometheus text. Names are constants here; labels never
//! carry tokens or message text.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    sync::{
        atomic::{AtomicI64, AtomicU64, Ordering},
        Mutex,
    },
};

use botfleet_core::Platform;

/// Bots running now, by platform.
pub const BOTS_RUNNING: &str = "botfleet_bots_running";
/// The worker's capacity.
pub const WORKER_CAPACITY: &str = "botfleet_worker_capacity";
/// Claims granted to this worker.
pub const CLAIMS_TOTAL: &str = "botfleet_claims_total";
/// Bots this worker handed over to another.
pub const HANDOFFS_TOTAL: &str = "botfleet_handoffs_total";
/// Bot starts (and runs) that failed, by platform and reason.
pub const START_FAILURES_TOTAL: &str = "botfleet_bot_start_failures_total";
/// Messages received from platforms.
pub const MESSAGES_RECEIVED_TOTAL: &str = "botfleet_messages_received_total";
/// Messages sent to platforms.
pub const MESSAGES_SENT_TOTAL: &str = "botfleet_messages_sent_total";
/// Platform errors while polling or sending, by platform and reason.
pub const PLATFORM_ERRORS_TOTAL: &str = "botfleet_platform_errors_total";
/// Sends from the backend taken by this worker's API, by platform and status (`accepted`,
/// `repeated`: a known key, `refused`).
pub const API_SENDS_TOTAL: &str = "botfleet_api_sends_total";
/// Edits of one message a handler asked for, by platform and outcome: `sent`, `coalesced`
/// (a later edit of the message went instead), `skipped` (it would show what the message
/// shows).
pub const STREAM_EDITS_TOTAL: &str = "botfleet_stream_edits_total";
/// Time a platform call waited for the fleet's send buckets (the platform's rate limits), by
/// platform: zero when every bucket had a token.
pub const SEND_WAIT_SECONDS: &str = "botfleet_send_wait_seconds";
/// Platform calls that found a send bucket empty and waited, by platform and the scope that
/// held them longest (`chat`, `group`, `bot`, `channel`…).
pub const RATE_BUCKET_WAITS_TOTAL: &str = "botfleet_rate_bucket_waits_total";
/// Rate limits (429s) platforms answered, by platform and the send limit's scope they paused
/// for the fleet (`none`: a call counted against no bucket).
pub const RATE_LIMITED_TOTAL: &str = "botfleet_rate_limited_total";
/// Bots that should run but no live worker has room for.
pub const BOTS_UNPLACED: &str = "botfleet_bots_unplaced";
/// Times this worker stopped all bots because its lease was not safe.
pub const SELF_FENCES_TOTAL: &str = "botfleet_self_fences_total";
/// Messages recorded as undeliverable, by platform.
pub const MESSAGES_UNDELIVERABLE_TOTAL: &str = "botfleet_messages_undeliverable_total";
/// Deliveries a platform made again of a message already recorded (handled once), by platform.
pub const MESSAGES_REDELIVERED_TOTAL: &str = "botfleet_messages_redelivered_total";
/// Handler calls retried after a transient failure, by platform.
pub const HANDLER_RETRIES_TOTAL: &str = "botfleet_handler_retries_total";
/// Time from taking a message off its chat's queue to its reply sent, by platform.
pub const REPLY_SECONDS: &str = "botfleet_reply_seconds";
/// Time from a batch received to its acknowledgement to the platform (recorded first), by
/// platform: a Slack envelope must be acknowledged within 3 s.
pub const ACK_SECONDS: &str = "botfleet_ack_seconds";
/// Deliveries the platform said it made before (e.g. Slack envelopes not acknowledged in
/// time), by platform.
pub const DELIVERIES_REDELIVERED_TOTAL: &str = "botfleet_deliveries_redelivered_total";
/// Connections a platform holds open now (Slack sockets), by platform.
pub const PLATFORM_CONNECTIONS: &str = "botfleet_platform_connections";
/// Times this worker registered (more than once: it came back after a freeze, a lost
/// liveness or a coordinator that lost its data).
pub const REGISTRATIONS_TOTAL: &str = "botfleet_registrations_total";
/// Seconds left in the fleet's grace window after a coordinator data loss, as this worker
/// last saw it (0 outside one): bots that had owners wait until it ends.
pub const GRACE_WINDOW_SECONDS: &str = "botfleet_grace_window_seconds";
/// Webhook requests refused before anything was stored (bad signature, secret or token), by
/// platform.
pub const HOOKS_REFUSED_TOTAL: &str = "botfleet_hooks_refused_total";
/// Webhook deliveries journaled (new), by platform.
pub const HOOKS_JOURNALED_TOTAL: &str = "botfleet_hooks_journaled_total";
/// Webhook deliveries of an update journaled before (acknowledged, handled once), by platform.
pub const HOOKS_DUPLICATES_TOTAL: &str = "botfleet_hooks_duplicates_total";
/// Webhook requests answered 503 (journal or coordinator unavailable; the platform retries).
pub const HOOKS_UNAVAILABLE_TOTAL: &str = "botfleet_hooks_unavailable_total";
/// Waits for a chat's turn longer than `--turn-wait-ms` (reported, then waited on), by platform.
pub const TURN_WAITS_EXCEEDED_TOTAL: &str = "botfleet_turn_waits_exceeded_total";
/// Turns taken over from a worker that died holding them (its entries replayed), by platform.
pub const TURN_TAKEOVERS_TOTAL: &str = "botfleet_turn_takeovers_total";
/// Entries served before a newer one of their chat because their tickets went with a
/// coordinator data loss, by platform.
pub const TURN_OLDER_FIRST_TOTAL: &str = "botfleet_turn_older_first_total";
/// Replies not sent because the outbox had them (a replay), by platform.
pub const OUTBOX_SKIPPED_TOTAL: &str = "botfleet_outbox_skipped_total";
/// Conversation-state writes refused (a newer turn wrote first; the result is dropped), by
/// platform.
pub const STATE_REFUSED_TOTAL: &str = "botfleet_state_refused_total";
/// Conversation states over the size bound (not stored; reported), by platform.
pub const STATE_TOO_LARGE_TOTAL: &str = "botfleet_state_too_large_total";
/// Actions of handlers' replies refused (unknown, beyond the platform's caps, naming an
/// unknown ref, or failing at the platform), by platform.
pub const ACTION_REFUSED_TOTAL: &str = "botfleet_action_refused_total";
/// Typing indicators the fleet showed while handlers ran long, per platform.
pub const TYPING_SHOWN_TOTAL: &str = "botfleet_typing_shown_total";
/// Typing indicators left out because a send bucket they count against was short, per
/// platform (typing is the first call to give way).
pub const TYPING_SKIPPED_TOTAL: &str = "botfleet_typing_skipped_total";
/// Platform calls the platform counts as refused towards banning the caller (Discord: 401,
/// 403, 429), per platform.
pub const INVALID_REQUESTS_TOTAL: &str = "botfleet_invalid_requests_total";
/// Times the fleet's budget of refused calls was spent and the platform's calls were stopped
/// short of its ban, per platform.
pub const INVALID_GUARD_SHUT_TOTAL: &str = "botfleet_invalid_guard_shut_total";
/// Handler calls cut off at the bot's handler timeout, per platform.
pub const HANDLER_TIMEOUTS_TOTAL: &str = "botfleet_handler_timeouts_total";
/// Files served through the fleet's file links, per platform.
pub const FILES_SERVED_TOTAL: &str = "botfleet_files_served_total";
/// Files handlers sent, per platform.
pub const FILES_SENT_TOTAL: &str = "botfleet_files_sent_total";
/// File-link requests refused (a bad or an expired signature): nothing reached a platform.
pub const FILE_LINKS_REFUSED_TOTAL: &str = "botfleet_file_links_refused_total";
/// Time from the platform accepting a reply (any bot's) to its record written: the window in
/// which a crash makes a replay send the reply again, by platform.
pub const OUTBOX_WINDOW_SECONDS: &str = "botfleet_outbox_window_seconds";
/// Time from a webhook request's arrival to its reply sent, by platform.
pub const HOOK_REPLY_SECONDS: &str = "botfleet_hook_reply_seconds";
/// Messages received by each of the busiest bots on this worker (bounded: the top N only).
pub const BOT_MESSAGES_RECEIVED_TOTAL: &str = "botfleet_bot_messages_received_total";
/// Turns held open on this worker for an answer that comes later (gauge).
pub const TURNS_HELD: &str = "botfleet_turns_held";
/// Held turns whose answer did not come within their time to live, per platform.
pub const ASYNC_EXPIRED_TOTAL: &str = "botfleet_async_expired_total";
/// Events recorded paused (their chat handed to a person): not handed to the handler, per
/// platform.
pub const EVENTS_PAUSED_TOTAL: &str = "botfleet_events_paused_total";
/// The worker process's resident memory.
pub const PROCESS_RESIDENT_MEMORY_BYTES: &str = "botfleet_process_resident_memory_bytes";
/// The worker process's open file descriptors (every connection is one).
pub const PROCESS_OPEN_FDS: &str = "botfleet_process_open_fds";

/// Counters and gauges of one worker.
#[derive(Debug, Default)]
pub struct Metrics {
    running: [AtomicI64; 4],
    capacity: AtomicU64,
    claims: AtomicU64,
    handoffs: AtomicU64,
    received: AtomicU64,
    sent: AtomicU64,
    unplaced: AtomicU64,
    self_fences: AtomicU64,
    registrations: AtomicU64,
    file_links_refused: AtomicU64,
    /// Turns held open for an answer that comes later.
    held: AtomicI64,
    /// Unix ms when the grace window the worker last saw ends (0: none).
    grace_until_ms: AtomicI64,
    /// Per coordination group in a grace window: unix ms when it ends.
    grace_groups: Mutex<Vec<(botfleet_coord::Group, i64)>>,
    // std Mutex: held for one map update, never across .await.
    failures: Mutex<BTreeMap<(Platform, &'static str), u64>>,
    /// Per platform: undeliverable, redelivered, handler retries.
    per_platform: Mutex<BTreeMap<(&'static str, Platform), u64>>,
    reply: Histograms,
    ack: Histograms,
    hook_reply: Histograms,
    outbox_window: Histograms,
    send_wait: Histograms,
    // std Mutex: held for one map update, never across .await.
    connections: Mutex<BTreeMap<Platform, u64>>,
    errors: Mutex<BTreeMap<(Platform, &'static str), u64>>,
    api_sends: Mutex<BTreeMap<(Platform, &'static str), u64>>,
    stream_edits: Mutex<BTreeMap<(Platform, &'static str), u64>>,
    bucket_waits: Mutex<BTreeMap<(Platform, &'static str), u64>>,
    rate_limited: Mutex<BTreeMap<(Platform, &'static str), u64>>,
    /// Messages received per bot id (only bots that received any).
    per_bot: Mutex<std::collections::HashMap<String, u64>>,
    /// How many of the busiest bots `render` shows (0: none).
    top_bots: AtomicU64,
    /// Figures platforms keep themselves (`Connector::stats`), by platform.
    platform_stats: Mutex<BTreeMap<Platform, Vec<botfleet_platform::Stat>>>,
}

fn idx(p: Platform) -> usize {
    Platform::ALL.iter().position(|x| *x == p).unwrap_or(0)
}

impl Metrics {
    /// A bot started (+1) or stopped (-1) running.
    pub fn running(&self, p: Platform, delta: i64) {
        self.running[idx(p)].fetch_add(delta, Ordering::Relaxed);
    }
    /// Bots of `p` running now.
    pub fn running_now(&self, p: Platform) -> i64 {
        self.running[idx(p)].load(Ordering::Relaxed)
    }
    /// A turn began (+1) or stopped (-1) being held open for an answer that comes later.
    pub fn turns_held(&self, delta: i64) {
        self.held.fetch_add(delta, Ordering::Relaxed);
    }
    /// Turns held open on this worker now.
    pub fn turns_held_now(&self) -> u64 {
        self.held.load(Ordering::Relaxed).max(0).unsigned_abs()
    }
    /// Sets the capacity gauge.
    pub fn set_capacity(&self, c: u32) {
        self.capacity.store(u64::from(c), Ordering::Relaxed);
    }
    /// A claim was granted.
    pub fn claim(&self) {
        self.claims.fetch_add(1, Ordering::Relaxed);
    }
    /// A bot was handed over.
    pub fn handoff(&self) {
        self.handoffs.fetch_add(1, Ordering::Relaxed);
    }
    /// A message was received.
    pub fn received(&self) {
        self.received.fetch_add(1, Ordering::Relaxed);
    }
    /// A message was received by `bot` (counts toward [`Metrics::received`] too).
    pub fn received_by(&self, bot: &str) {
        self.received();
        let mut m = lock(&self.per_bot);
        match m.get_mut(bot) {
            Some(n) => *n += 1,
            None => {
                m.insert(bot.to_owned(), 1);
            }
        }
    }
    /// Replaces the figures platform `p` keeps itself.
    pub fn set_platform_stats(&self, p: Platform, stats: Vec<botfleet_platform::Stat>) {
        lock(&self.platform_stats).insert(p, stats);
    }
    /// Shows the `n` busiest bots' message counts (a bounded label set; 0 shows none).
    pub fn set_top_bots(&self, n: u32) {
        self.top_bots.store(u64::from(n), Ordering::Relaxed);
    }
    /// A message was sent.
    pub fn sent(&self) {
        self.sent.fetch_add(1, Ordering::Relaxed);
    }
    /// Messages received so far.
    pub fn received_total(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }
    /// Messages sent so far.
    pub fn sent_total(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }
    /// Sets how many bots nobody has room for.
    pub fn set_unplaced(&self, n: usize) {
        self.unplaced.store(n as u64, Ordering::Relaxed);
    }
    /// The worker stopped its bots to fence itself.
    pub fn self_fence(&self) {
        self.self_fences.fetch_add(1, Ordering::Relaxed);
    }
    /// A file-link request was refused (bad or expired signature).
    pub fn file_link_refused(&self) {
        self.file_links_refused.fetch_add(1, Ordering::Relaxed);
    }
    /// The worker registered (again).
    pub fn registered(&self) {
        self.registrations.fetch_add(1, Ordering::Relaxed);
    }
    /// The fleet is in a grace window for `left` more (zero: not in one).
    pub fn set_grace(&self, left: std::time::Duration) {
        let until = if left.is_zero() { 0 } else { ends_at(left) };
        self.grace_until_ms.store(until, Ordering::Relaxed);
    }
    /// The coordination groups in a grace window, with the time left in each (the others are
    /// not): shown as [`GRACE_WINDOW_SECONDS`] with a `group` label, beside the fleet's.
    pub fn set_group_graces(&self, each: &[(botfleet_coord::Group, std::time::Duration)]) {
        let mut groups: Vec<_> = each
            .iter()
            .filter(|(_, left)| !left.is_zero())
            .map(|(g, left)| (*g, ends_at(*left)))
            .collect();
        groups.sort_unstable();
        *self.grace_groups.lock().unwrap_or_else(|e| e.into_inner()) = groups;
    }
    /// Seconds left in the grace window the worker last saw.
    pub fn grace_left_s(&self) -> f64 {
        seconds_until(self.grace_until_ms.load(Ordering::Relaxed))
    }
    /// A message was recorded as undeliverable.
    pub fn undeliverable(&self, p: Platform) {
        *lock(&self.per_platform)
            .entry((MESSAGES_UNDELIVERABLE_TOTAL, p))
            .or_default() += 1;
    }
    /// A platform delivered a message again that was recorded already.
    pub fn redelivered(&self, p: Platform) {
        *lock(&self.per_platform)
            .entry((MESSAGES_REDELIVERED_TOTAL, p))
            .or_default() += 1;
    }
    /// A handler call is retried.
    pub fn handler_retry(&self, p: Platform) {
        *lock(&self.per_platform)
            .entry((HANDLER_RETRIES_TOTAL, p))
            .or_default() += 1;
    }
    /// Adds `n` to the per-platform counter `name` (one of the webhook counters:
    /// [`HOOKS_REFUSED_TOTAL`] ... [`ACTION_REFUSED_TOTAL`]).
    pub fn count(&self, name: &'static str, p: Platform, n: u64) {
        if n > 0 {
            *lock(&self.per_platform).entry((name, p)).or_default() += n;
        }
    }
    /// A reply's record (its entry's end, and for a webhook turn its outbox row) was written
    /// `d` after the platform accepted it.
    pub fn outbox_window(&self, p: Platform, d: std::time::Duration) {
        self.outbox_window.observe(p, d);
    }
    /// A webhook reply went out `d` after its request arrived.
    pub fn hook_reply_latency(&self, p: Platform, d: std::time::Duration) {
        self.hook_reply.observe(p, d);
    }
    /// A count of [`Metrics::undeliverable`], [`Metrics::redelivered`] or
    /// [`Metrics::handler_retry`] by metric name.
    pub fn platform_count(&self, name: &str, p: Platform) -> u64 {
        lock(&self.per_platform)
            .iter()
            .find(|((n, q), _)| *n == name && *q == p)
            .map_or(0, |(_, v)| *v)
    }
    /// The platform said it delivered this before.
    pub fn delivery_redelivered(&self, p: Platform, n: usize) {
        if n > 0 {
            *lock(&self.per_platform)
                .entry((DELIVERIES_REDELIVERED_TOTAL, p))
                .or_default() += n as u64;
        }
    }
    /// A batch was acknowledged `d` after it was received.
    pub fn ack_latency(&self, p: Platform, d: std::time::Duration) {
        self.ack.observe(p, d);
    }
    /// Sets how many connections `p` holds open.
    pub fn set_connections(&self, p: Platform, n: u64) {
        lock(&self.connections).insert(p, n);
    }
    /// A reply went out `d` after its message was taken up.
    pub fn reply_latency(&self, p: Platform, d: std::time::Duration) {
        self.reply.observe(p, d);
    }
    /// A bot failed to start or run.
    pub fn start_failure(&self, p: Platform, reason: &'static str) {
        *lock(&self.failures).entry((p, reason)).or_default() += 1;
    }
    /// A platform call failed.
    pub fn platform_error(&self, p: Platform, reason: &'static str) {
        *lock(&self.errors).entry((p, reason)).or_default() += 1;
    }

    /// A send from the backend came to the API: `accepted`, `repeated` (its key was known)
    /// or `refused`.
    pub fn api_send(&self, p: Platform, status: &'static str) {
        *lock(&self.api_sends).entry((p, status)).or_default() += 1;
    }

    /// An edit a handler asked for was `sent`, `coalesced` or `skipped`
    /// ([`STREAM_EDITS_TOTAL`]).
    pub fn stream_edit(&self, p: Platform, outcome: &'static str) {
        *lock(&self.stream_edits).entry((p, outcome)).or_default() += 1;
    }

    /// A platform call waited `d` for its send buckets (zero: none was empty).
    pub fn send_wait(&self, p: Platform, d: std::time::Duration) {
        self.send_wait.observe(p, d);
    }

    /// A platform call found a send bucket empty; `scope` held it longest
    /// ([`RATE_BUCKET_WAITS_TOTAL`]).
    pub fn bucket_wait(&self, p: Platform, scope: &'static str) {
        *lock(&self.bucket_waits).entry((p, scope)).or_default() += 1;
    }

    /// A platform answered a rate limit (429) for its send limit `scope`
    /// ([`RATE_LIMITED_TOTAL`]).
    pub fn rate_limited(&self, p: Platform, scope: &'static str) {
        *lock(&self.rate_limited).entry((p, scope)).or_default() += 1;
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self, worker_id: &str) -> String {
        let mut out = String::new();
        let w = escape(worker_id);
        let mut gauge = |name: &str, help: &str, kind: &str| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        };
        gauge(BOTS_RUNNING, "Bots running on this worker.", "gauge");
        let mut lines = String::new();
        for p in Platform::ALL {
            let _ = writeln!(
                lines,
                "{BOTS_RUNNING}{{worker_id=\"{w}\",platform=\"{p}\"}} {}",
                self.running_now(p)
            );
        }
        out.push_str(&lines);
        let simple: [(&str, &str, &str, u64); 8] = [
            (
                WORKER_CAPACITY,
                "Most bots this worker accepts.",
                "gauge",
                self.capacity.load(Ordering::Relaxed),
            ),
            (
                CLAIMS_TOTAL,
                "Bot claims granted to this worker.",
                "counter",
                self.claims.load(Ordering::Relaxed),
            ),
            (
                HANDOFFS_TOTAL,
                "Bots handed over to another worker.",
                "counter",
                self.handoffs.load(Ordering::Relaxed),
            ),
            (
                MESSAGES_RECEIVED_TOTAL,
                "Messages received from platforms.",
                "counter",
                self.received_total(),
            ),
            (
                MESSAGES_SENT_TOTAL,
                "Messages sent to platforms.",
                "counter",
                self.sent_total(),
            ),
            (
                BOTS_UNPLACED,
                "Enabled bots no live worker has room for.",
                "gauge",
                self.unplaced.load(Ordering::Relaxed),
            ),
            (
                SELF_FENCES_TOTAL,
                "Times the worker stopped its bots because its lease was not safe.",
                "counter",
                self.self_fences.load(Ordering::Relaxed),
            ),
            (
                TURNS_HELD,
                "Turns held open for an answer that comes later (their handler answered 202).",
                "gauge",
                self.turns_held_now(),
            ),
        ];
        let extra: [(&str, &str, &str, u64); 2] = [
            (
                REGISTRATIONS_TOTAL,
                "Times this worker registered (again after a freeze or a lost liveness).",
                "counter",
                self.registrations.load(Ordering::Relaxed),
            ),
            (
                FILE_LINKS_REFUSED_TOTAL,
                "File-link requests refused for a bad or an expired signature.",
                "counter",
                self.file_links_refused.load(Ordering::Relaxed),
            ),
        ];
        for (name, help, kind, v) in simple.into_iter().chain(extra) {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            let _ = writeln!(out, "{name}{{worker_id=\"{w}\"}} {v}");
        }
        let _ = writeln!(
            out,
            "# HELP {GRACE_WINDOW_SECONDS} Seconds left in the fleet's grace window after a coordinator data loss.\n# TYPE {GRACE_WINDOW_SECONDS} gauge\n{GRACE_WINDOW_SECONDS}{{worker_id=\"{w}\"}} {:.3}",
            self.grace_left_s()
        );
        let now = botfleet_core::unix_ms();
        for (g, until) in self
            .grace_groups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, until)| *until > now)
        {
            let _ = writeln!(
                out,
                "{GRACE_WINDOW_SECONDS}{{worker_id=\"{w}\",group=\"{g}\"}} {:.3}",
                seconds_until(*until)
            );
        }
        for (name, help) in [
            (
                MESSAGES_UNDELIVERABLE_TOTAL,
                "Messages recorded as undeliverable.",
            ),
            (
                MESSAGES_REDELIVERED_TOTAL,
                "Deliveries of messages already recorded (handled once).",
            ),
            (
                HANDLER_RETRIES_TOTAL,
                "Handler calls retried after a transient failure.",
            ),
            (
                DELIVERIES_REDELIVERED_TOTAL,
                "Deliveries the platform said it made before.",
            ),
            (
                HOOKS_REFUSED_TOTAL,
                "Webhook requests refused before anything was stored.",
            ),
            (HOOKS_JOURNALED_TOTAL, "Webhook deliveries journaled."),
            (
                HOOKS_DUPLICATES_TOTAL,
                "Webhook deliveries of an update journaled before.",
            ),
            (
                HOOKS_UNAVAILABLE_TOTAL,
                "Webhook requests answered 503 (the platform retries).",
            ),
            (
                TURN_WAITS_EXCEEDED_TOTAL,
                "Waits for a chat's turn past --turn-wait-ms.",
            ),
            (
                TURN_TAKEOVERS_TOTAL,
                "Turns taken over from a worker that died holding them.",
            ),
            (
                TURN_OLDER_FIRST_TOTAL,
                "Entries whose tickets a coordinator data loss took, served first.",
            ),
            (
                OUTBOX_SKIPPED_TOTAL,
                "Replies not sent again because the outbox had them.",
            ),
            (
                STATE_REFUSED_TOTAL,
                "Conversation-state writes refused (a newer turn wrote first).",
            ),
            (
                STATE_TOO_LARGE_TOTAL,
                "Conversation states over the size bound (not stored).",
            ),
            (
                ACTION_REFUSED_TOTAL,
                "Actions of handlers' replies refused, each with a reason on its event.",
            ),
            (
                FILES_SERVED_TOTAL,
                "Files served through the fleet's file links.",
            ),
            (FILES_SENT_TOTAL, "Files handlers sent."),
            (
                TYPING_SHOWN_TOTAL,
                "Typing indicators shown while handlers ran long.",
            ),
            (
                TYPING_SKIPPED_TOTAL,
                "Typing indicators left out because a send bucket was short.",
            ),
            (
                INVALID_REQUESTS_TOTAL,
                "Platform calls the platform counts as refused towards banning the caller (Discord: 401, 403, 429).",
            ),
            (
                INVALID_GUARD_SHUT_TOTAL,
                "Times the fleet's budget of refused calls was spent and the platform's calls stopped short of its ban.",
            ),
            (
                HANDLER_TIMEOUTS_TOTAL,
                "Handler calls cut off at the handler timeout (tried again as the next attempt).",
            ),
            (
                ASYNC_EXPIRED_TOTAL,
                "Held turns whose answer did not come within their time to live (async reply expired).",
            ),
            (
                EVENTS_PAUSED_TOTAL,
                "Events recorded paused (their chat handed to a person), not handed to the handler.",
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for ((n, p), v) in lock(&self.per_platform).iter() {
                if *n == name {
                    let _ = writeln!(out, "{name}{{worker_id=\"{w}\",platform=\"{p}\"}} {v}");
                }
            }
        }
        self.reply.render(
            &mut out,
            REPLY_SECONDS,
            "Seconds from taking a message up to its reply sent (handler and send).",
            &w,
        );
        self.hook_reply.render(
            &mut out,
            HOOK_REPLY_SECONDS,
            "Seconds from a webhook request's arrival to its reply sent (journal, turn, handler, send).",
            &w,
        );
        self.outbox_window.render(
            &mut out,
            OUTBOX_WINDOW_SECONDS,
            "Seconds from the platform accepting a reply to its record in the store (a crash in between sends it again on replay), for every bot.",
            &w,
        );
        self.send_wait.render(
            &mut out,
            SEND_WAIT_SECONDS,
            "Seconds a platform call waited for the fleet's send buckets (the platform's rate limits).",
            &w,
        );
        self.ack.render(
            &mut out,
            ACK_SECONDS,
            "Seconds from a batch received to its acknowledgement (recorded first).",
            &w,
        );
        let _ = writeln!(
            out,
            "# HELP {PLATFORM_CONNECTIONS} Connections a platform holds open now.\n# TYPE {PLATFORM_CONNECTIONS} gauge"
        );
        for (p, n) in lock(&self.connections).iter() {
            let _ = writeln!(
                out,
                "{PLATFORM_CONNECTIONS}{{worker_id=\"{w}\",platform=\"{p}\"}} {n}"
            );
        }
        // Counters by platform and one label of their own.
        for (name, help, label, map) in [
            (
                START_FAILURES_TOTAL,
                "Bots that failed to start or run.",
                "reason",
                &self.failures,
            ),
            (
                PLATFORM_ERRORS_TOTAL,
                "Platform call failures.",
                "reason",
                &self.errors,
            ),
            (
                API_SENDS_TOTAL,
                "Sends from the backend taken by the API.",
                "status",
                &self.api_sends,
            ),
            (
                STREAM_EDITS_TOTAL,
                "Edits of one message asked for, by outcome.",
                "outcome",
                &self.stream_edits,
            ),
            (
                RATE_BUCKET_WAITS_TOTAL,
                "Platform calls that waited for an empty send bucket, by the scope that held them longest.",
                "scope",
                &self.bucket_waits,
            ),
            (
                RATE_LIMITED_TOTAL,
                "Rate limits (429) platforms answered, by the send limit's scope paused for the fleet.",
                "scope",
                &self.rate_limited,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for ((p, value), v) in lock(map).iter() {
                let _ = writeln!(
                    out,
                    "{name}{{worker_id=\"{w}\",platform=\"{p}\",{label}=\"{value}\"}} {v}"
                );
            }
        }
        let top = usize::try_from(self.top_bots.load(Ordering::Relaxed)).unwrap_or(0);
        if top > 0 {
            let mut busiest: Vec<(String, u64)> = lock(&self.per_bot)
                .iter()
                .map(|(b, n)| (b.clone(), *n))
                .collect();
            busiest.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            busiest.truncate(top);
            let _ = writeln!(
                out,
                "# HELP {BOT_MESSAGES_RECEIVED_TOTAL} Messages received by the busiest bots on this worker (the top {top}).\n# TYPE {BOT_MESSAGES_RECEIVED_TOTAL} counter"
            );
            for (b, n) in busiest {
                let _ = writeln!(
                    out,
                    "{BOT_MESSAGES_RECEIVED_TOTAL}{{worker_id=\"{w}\",bot_id=\"{}\"}} {n}",
                    escape(&b)
                );
            }
        }
        let mut named: BTreeMap<&str, Vec<(Platform, botfleet_platform::Stat)>> = BTreeMap::new();
        for (p, stats) in lock(&self.platform_stats).iter() {
            for st in stats {
                named.entry(st.name).or_default().push((*p, st.clone()));
            }
        }
        for (name, list) in named {
            let Some((_, first)) = list.first() else {
                continue;
            };
            let _ = writeln!(
                out,
                "# HELP botfleet_{name} {}\n# TYPE botfleet_{name} {}",
                first.help, first.kind
            );
            for (p, st) in list {
                let _ = writeln!(
                    out,
                    "botfleet_{name}{{worker_id=\"{w}\",platform=\"{p}\"}} {}",
                    st.value
                );
            }
        }
        let (rss, fds) = process_stats();
        for (name, help, v) in [
            (
                PROCESS_RESIDENT_MEMORY_BYTES,
                "Resident memory of the worker process.",
                rss,
            ),
            (
                PROCESS_OPEN_FDS,
                "Open file descriptors of the worker process (each connection is one).",
                fds,
            ),
        ] {
            if let Some(v) = v {
                let _ = writeln!(
                    out,
                    "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{worker_id=\"{w}\"}} {v}"
                );
            }
        }
        out
    }
}

/// Latency histograms per platform, with fixed buckets (seconds).
#[derive(Debug, Default)]
pub(crate) struct Histograms {
    // std Mutex: held for one update, never across .await.
    inner: Mutex<BTreeMap<Platform, Histogram>>,
}

const BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

#[derive(Debug, Default, Clone)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histograms {
    /// Records one observation.
    pub(crate) fn observe(&self, p: Platform, d: std::time::Duration) {
        let v = d.as_secs_f64();
        let mut g = lock(&self.inner);
        let h = g.entry(p).or_default();
        for (i, b) in BUCKETS.iter().enumerate() {
            if v <= *b {
                h.counts[i] += 1;
            }
        }
        h.count += 1;
        h.sum += v;
    }

    fn render(&self, out: &mut String, name: &str, help: &str, w: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (p, h) in lock(&self.inner).iter() {
            for (b, c) in BUCKETS.iter().zip(h.counts) {
                let _ = writeln!(
                    out,
                    "{name}_bucket{{worker_id=\"{w}\",platform=\"{p}\",le=\"{b}\"}} {c}"
                );
            }
            let _ = writeln!(
                out,
                "{name}_bucket{{worker_id=\"{w}\",platform=\"{p}\",le=\"+Inf\"}} {}\n{name}_sum{{worker_id=\"{w}\",platform=\"{p}\"}} {}\n{name}_count{{worker_id=\"{w}\",platform=\"{p}\"}} {}",
                h.count, h.sum, h.count
            );
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Resident bytes and open descriptors of this process (Linux `/proc`; `None` elsewhere).
fn process_stats() -> (Option<u64>, Option<u64>) {
    let rss = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map(|pages| pages.saturating_mul(4096));
    let fds = std::fs::read_dir("/proc/self/fd")
        .ok()
        .map(|d| d.count() as u64);
    (rss, fds)
}

/// Unix ms `left` from now (a grace window's end).
fn ends_at(left: std::time::Duration) -> i64 {
    botfleet_core::unix_ms() + i64::try_from(left.as_millis()).unwrap_or(i64::MAX / 2)
}

/// Seconds from now until unix ms `until` (0 once past).
fn seconds_until(until: i64) -> f64 {
    (until - botfleet_core::unix_ms()).max(0) as f64 / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text() {
        let m = Metrics::default();
        m.running(Platform::Telegram, 3);
        m.running(Platform::Telegram, -1);
        m.set_capacity(10);
        m.start_failure(Platform::Telegram, "unauthorized");
        m.sent();
        let text = m.render("w-1");
        assert!(
            text.contains("botfleet_bots_running{worker_id=\"w-1\",platform=\"telegram\"} 2"),
            "{text}"
        );
        assert!(text.contains("botfleet_worker_capacity{worker_id=\"w-1\"} 10"));
        assert!(text.contains(
            "botfleet_bot_start_failures_total{worker_id=\"w-1\",platform=\"telegram\",reason=\"unauthorized\"} 1"
        ));
        assert!(text.contains("botfleet_messages_sent_total{worker_id=\"w-1\"} 1"));
        assert!(text.contains("# TYPE botfleet_claims_total counter"));
        assert!(text.contains("botfleet_grace_window_seconds{worker_id=\"w-1\"} 0.000"));
        m.set_grace(std::time::Duration::from_secs(60));
        assert!(m.grace_left_s() > 50.0);
        assert!(!m
            .render("w-1")
            .contains("botfleet_grace_window_seconds{worker_id=\"w-1\"} 0.000"));
        // Only the groups in a window are shown, each with its own time left.
        assert!(!m.render("w-1").contains("group="));
        m.set_group_graces(&[
            (botfleet_coord::Group::ZERO, std::time::Duration::ZERO),
            (
                botfleet_coord::KeySpace::with_groups("p", 8)
                    .unwrap()
                    .all_groups()
                    .nth(3)
                    .unwrap(),
                std::time::Duration::from_secs(30),
            ),
        ]);
        let text = m.render("w-1");
        assert!(!text.contains("group=\"g0\""), "{text}");
        let line = text
            .lines()
            .find(|l| {
                l.starts_with("botfleet_grace_window_seconds{worker_id=\"w-1\",group=\"g3\"} ")
            })
            .unwrap_or_else(|| panic!("{text}"));
        let left: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(left > 20.0 && left <= 30.0, "{line}");
    }

    #[test]
    fn per_bot_counts_show_only_the_busiest_bots() {
        let m = Metrics::default();
        for (bot, n) in [("quiet", 1), ("busy", 5), ("busier", 9)] {
            for _ in 0..n {
                m.received_by(bot);
            }
        }
        assert!(
            !m.render("w").contains(BOT_MESSAGES_RECEIVED_TOTAL),
            "off by default"
        );
        m.set_top_bots(2);
        let text = m.render("w");
        assert!(text
            .contains("botfleet_bot_messages_received_total{worker_id=\"w\",bot_id=\"busier\"} 9"));
        assert!(text.contains("bot_id=\"busy\"} 5"));
        assert!(!text.contains("bot_id=\"quiet\""), "{text}");
        assert!(text.contains("botfleet_messages_received_total{worker_id=\"w\"} 15"));
        if cfg!(target_os = "linux") {
            assert!(text.contains("botfleet_process_resident_memory_bytes{worker_id=\"w\"} "));
            assert!(text.contains("botfleet_process_open_fds{worker_id=\"w\"} "));
        }
    }
}
