//! What a worker saw happen, most recent last: bots started, stopped, handed over and failed,
//! workers joining and leaving, self-fencing, draining, registry changes. Bounded (the oldest
//! entries go first), readable from a sequence number, and followable live. Entries never
//! carry a credential or a message's text.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
    time::{SystemTime, UNIX_EPOCH},
};

use serde::Serialize;
use tokio::sync::broadcast;

/// One thing that happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JournalEntry {
    /// Increasing within this worker's life, from 1.
    pub seq: u64,
    /// Unix milliseconds.
    pub at_ms: u64,
    /// The worker that saw it.
    pub worker: String,
    /// What happened: `bot_started`, `bot_stopped`, `bot_handed_over`, `bot_failed`,
    /// `worker_joined`, `worker_left`, `worker_leaving`, `self_fenced`, `draining`,
    /// `registry_changed`.
    pub kind: &'static str,
    /// The bot concerned, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bot: Option<String>,
    /// The other worker concerned (the one joining, leaving, or taking a bot), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    /// More, for people (a failure's reason).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// The bounded journal. Cheap to clone a handle of (`Arc`).
#[derive(Debug)]
pub struct Journal {
    cap: usize,
    inner: Mutex<Inner>,
    live: broadcast::Sender<JournalEntry>,
}

#[derive(Debug, Default)]
struct Inner {
    next: u64,
    entries: VecDeque<JournalEntry>,
}

/// Entries a worker keeps.
pub const JOURNAL_CAPACITY: usize = 1_000;

impl Journal {
    /// An empty journal keeping the last `cap` entries (workers of one process may share
    /// one).
    pub fn new(cap: usize) -> Arc<Self> {
        let (live, _) = broadcast::channel(128);
        Arc::new(Self {
            cap: cap.max(1),
            inner: Mutex::new(Inner {
                next: 1,
                entries: VecDeque::new(),
            }),
            live,
        })
    }

    /// Records something `worker` saw happen.
    pub fn record(
        &self,
        worker: &str,
        kind: &'static str,
        bot: Option<&str>,
        peer: Option<&str>,
        detail: Option<&str>,
    ) {
        let at_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let entry = {
            let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            let e = JournalEntry {
                seq: g.next,
                at_ms,
                worker: worker.to_owned(),
                kind,
                bot: bot.map(str::to_owned),
                peer: peer.map(str::to_owned),
                detail: detail.map(|d| d.chars().take(300).collect()),
            };
            g.next += 1;
            if g.entries.len() == self.cap {
                g.entries.pop_front();
            }
            g.entries.push_back(e.clone());
            e
        };
        // Nobody following is fine.
        let _ = self.live.send(entry);
    }

    /// Up to `limit` entries with a sequence number above `after`, oldest first (the most
    /// recent ones when more are kept).
    pub fn since(&self, after: u64, limit: usize) -> Vec<JournalEntry> {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let newer: Vec<&JournalEntry> = g.entries.iter().filter(|e| e.seq > after).collect();
        let skip = newer.len().saturating_sub(limit);
        newer.into_iter().skip(skip).cloned().collect()
    }

    /// Entries as they are recorded from now on (a slow follower misses some: it sees a
    /// gap in `seq` and can read [`Journal::since`]).
    pub fn follow(&self) -> broadcast::Receiver<JournalEntry> {
        self.live.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_and_reads_from_a_sequence_number() {
        let j = Journal::new(3);
        let mut live = j.follow();
        for i in 0..5 {
            j.record("w1", "bot_started", Some(&format!("b{i}")), None, None);
        }
        let all = j.since(0, 100);
        let seqs: Vec<u64> = all.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [3, 4, 5], "the oldest went first");
        assert_eq!(all[0].bot.as_deref(), Some("b2"));
        assert_eq!(j.since(4, 100).len(), 1);
        assert_eq!(
            j.since(0, 2).iter().map(|e| e.seq).collect::<Vec<_>>(),
            [4, 5]
        );
        assert_eq!(
            live.try_recv().map(|e| e.seq),
            Ok(1),
            "followers see every entry"
        );
    }
}
