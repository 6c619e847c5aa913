//! Monotonic time, injectable so simulations run on a clock they drive.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

/// A monotonic clock in milliseconds since an arbitrary origin.
///
/// Leases are judged on a monotonic clock, never the wall clock: a process frozen by SIGSTOP
/// wakes with this clock far ahead and so knows its lease may be gone.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Milliseconds since this clock's origin. Never decreases.
    fn now_ms(&self) -> u64;
}

/// The process's monotonic clock (`CLOCK_MONOTONIC` through [`Instant`]).
#[derive(Debug, Clone, Copy)]
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// A clock that moves only when told to; for deterministic simulations and tests.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock at 0 ms.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        let ms = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        self.now.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let c = ManualClock::new();
        let shared = c.clone();
        assert_eq!(c.now_ms(), 0);
        c.advance(Duration::from_millis(1500));
        assert_eq!(shared.now_ms(), 1500);
    }

    #[test]
    fn system_clock_is_monotonic() {
        let c = SystemClock::new();
        let a = c.now_ms();
        let b = c.now_ms();
        assert!(b >= a);
    }
}
