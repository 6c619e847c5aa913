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
/// Bots that should run but no live worker has room for.
pub const BOTS_UNPLACED: &str = "botfleet_bots_unplaced";
/// Times this worker stopped all bots because its lease was not safe.
pub const SELF_FENCES_TOTAL: &str = "botfleet_self_fences_total";
/// Times this worker registered (more than once: it came back after a freeze, a lost
/// liveness or a coordinator that lost its data).
pub const REGISTRATIONS_TOTAL: &str = "botfleet_registrations_total";
/// Seconds left in the fleet's grace window after a coordinator data loss, as this worker
/// last saw it (0 outside one): bots that had owners wait until it ends.
pub const GRACE_WINDOW_SECONDS: &str = "botfleet_grace_window_seconds";

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
    /// Unix ms when the grace window the worker last saw ends (0: none).
    grace_until_ms: AtomicI64,
    // std Mutex: held for one map update, never across .await.
    failures: Mutex<BTreeMap<(Platform, &'static str), u64>>,
    errors: Mutex<BTreeMap<(Platform, &'static str), u64>>,
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
    /// The worker registered (again).
    pub fn registered(&self) {
        self.registrations.fetch_add(1, Ordering::Relaxed);
    }
    /// The fleet is in a grace window for `left` more (zero: not in one).
    pub fn set_grace(&self, left: std::time::Duration) {
        let until = if left.is_zero() {
            0
        } else {
            botfleet_core::unix_ms() + i64::try_from(left.as_millis()).unwrap_or(i64::MAX / 2)
        };
        self.grace_until_ms.store(until, Ordering::Relaxed);
    }
    /// Seconds left in the grace window the worker last saw.
    pub fn grace_left_s(&self) -> f64 {
        let until = self.grace_until_ms.load(Ordering::Relaxed);
        (until - botfleet_core::unix_ms()).max(0) as f64 / 1000.0
    }
    /// A bot failed to start or run.
    pub fn start_failure(&self, p: Platform, reason: &'static str) {
        *lock(&self.failures).entry((p, reason)).or_default() += 1;
    }
    /// A platform call failed.
    pub fn platform_error(&self, p: Platform, reason: &'static str) {
        *lock(&self.errors).entry((p, reason)).or_default() += 1;
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
        let simple: [(&str, &str, &str, u64); 7] = [
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
        ];
        let extra: [(&str, &str, &str, u64); 1] = [(
            REGISTRATIONS_TOTAL,
            "Times this worker registered (again after a freeze or a lost liveness).",
            "counter",
            self.registrations.load(Ordering::Relaxed),
        )];
        for (name, help, kind, v) in simple.into_iter().chain(extra) {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            let _ = writeln!(out, "{name}{{worker_id=\"{w}\"}} {v}");
        }
        let _ = writeln!(
            out,
            "# HELP {GRACE_WINDOW_SECONDS} Seconds left in the fleet's grace window after a coordinator data loss.\n# TYPE {GRACE_WINDOW_SECONDS} gauge\n{GRACE_WINDOW_SECONDS}{{worker_id=\"{w}\"}} {:.3}",
            self.grace_left_s()
        );
        for (name, help, map) in [
            (
                START_FAILURES_TOTAL,
                "Bots that failed to start or run.",
                &self.failures,
            ),
            (
                PLATFORM_ERRORS_TOTAL,
                "Platform call failures.",
                &self.errors,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for ((p, reason), v) in lock(map).iter() {
                let _ = writeln!(
                    out,
                    "{name}{{worker_id=\"{w}\",platform=\"{p}\",reason=\"{reason}\"}} {v}"
                );
            }
        }
        out
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
    }
}
