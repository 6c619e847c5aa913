//! Edits of one message coalesced to its platform's pace: a handler may change a message as
//! fast as it likes (an AI agent streaming its answer token by token); the platform sees at
//! most one edit per interval, always with the latest text, and the last text asked for is
//! always the one the message ends on.
//!
//! ```text
//! offer(text) → equal to what the message shows (or will, once the edit going out lands):
//!   skipped → else the latest, replacing one not sent yet (that one: coalesced)
//! take(now) → the latest, once the interval since the last edit passed → sent(now), or
//!   refused(now, wait) (a 429: the text goes again after the wait, unless a newer one came)
//! settled() → nothing left to send: the message shows the last text offered
//! ```
//!
//! A pure unit: time is given, nothing is sent here. What drives it waits until [`due`]
//! and sends what [`take`] gives.
//!
//! [`due`]: Coalescer::due
//! [`take`]: Coalescer::take

use std::time::{Duration, Instant};

/// What became of a text offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Offered {
    /// It is what the message shows (or is being edited to): nothing to send.
    Skipped,
    /// It is the latest, to be sent when due; `replaced` says whether it replaced a text
    /// not sent yet (that one is coalesced away).
    Pending { replaced: bool },
}

/// The edits of one message (see the module's description).
#[derive(Debug, Clone)]
pub(crate) struct Coalescer {
    /// The platform's interval between two edits of one message.
    every: Duration,
    /// What the message shows, as far as is known.
    shown: Option<String>,
    /// The edit going out now, taken and neither sent nor refused yet.
    sending: Option<String>,
    /// The latest text asked for, not taken yet.
    latest: Option<String>,
    /// No edit goes before this (the last edit's time plus the interval, or a 429's wait).
    not_before: Option<Instant>,
}

impl Coalescer {
    /// A message showing `shown` (its text when it was sent, if known), edited at most once
    /// per `every`.
    pub(crate) fn new(every: Duration, shown: Option<String>) -> Self {
        Self {
            every,
            shown,
            sending: None,
            latest: None,
            not_before: None,
        }
    }

    /// A message just sent with `text` at `at`: its first edit waits for the interval too.
    pub(crate) fn sent_at(every: Duration, text: String, at: Instant) -> Self {
        let mut c = Self::new(every, Some(text));
        c.not_before = Some(at + every);
        c
    }

    /// The message is to show `text`.
    pub(crate) fn offer(&mut self, text: String) -> Offered {
        // What the message will show once nothing else is sent.
        let ahead = self.sending.as_ref().or(self.shown.as_ref());
        if ahead == Some(&text) {
            let replaced = self.latest.take().is_some();
            return if replaced {
                // Back to what is shown: the pending text is dropped, and nothing is sent.
                Offered::Pending { replaced: true }
            } else {
                Offered::Skipped
            };
        }
        let replaced = self.latest.replace(text).is_some();
        Offered::Pending { replaced }
    }

    /// When the next edit may go (`now` when it may go at once), if one waits.
    pub(crate) fn due(&self, now: Instant) -> Option<Instant> {
        if self.latest.is_none() || self.sending.is_some() {
            return None;
        }
        Some(self.not_before.map_or(now, |t| t.max(now)))
    }

    /// The text to send now, if one is due (the caller reports how it went: [`sent`] or
    /// [`refused`]).
    ///
    /// [`sent`]: Coalescer::sent
    /// [`refused`]: Coalescer::refused
    pub(crate) fn take(&mut self, now: Instant) -> Option<String> {
        if self.due(now)? > now {
            return None;
        }
        let text = self.latest.take()?;
        self.sending = Some(text.clone());
        Some(text)
    }

    /// The edit taken last went out at `now`.
    pub(crate) fn sent(&mut self, now: Instant) {
        if let Some(text) = self.sending.take() {
            self.shown = Some(text);
        }
        self.not_before = Some(now + self.every);
    }

    /// The edit taken last was refused at `now`, to be tried again after `wait` (a 429's
    /// retry-after): it goes again then, unless a newer text came meanwhile (which goes
    /// instead). Never dropped for being refused.
    pub(crate) fn refused(&mut self, now: Instant, wait: Duration) {
        if let Some(text) = self.sending.take() {
            if self.latest.is_none() && self.shown.as_ref() != Some(&text) {
                self.latest = Some(text);
            }
        }
        self.not_before = Some(now + wait.max(self.every));
        self.forget_shown();
    }

    /// The edit taken last cannot be made at all (refused as it is): the message keeps what
    /// it shows; a newer text still goes.
    pub(crate) fn dropped(&mut self) {
        self.sending = None;
        self.forget_shown();
    }

    /// With nothing going out, a latest text equal to what is shown needs no edit.
    fn forget_shown(&mut self) {
        if self.sending.is_none() && self.latest.is_some() && self.latest == self.shown {
            self.latest = None;
        }
    }

    /// Nothing is left to send: the message shows the last text offered (or the last one
    /// that could be made).
    pub(crate) fn settled(&self) -> bool {
        self.latest.is_none() && self.sending.is_none()
    }

    /// What the message shows, as far as is known.
    pub(crate) fn shown(&self) -> Option<&str> {
        self.shown.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    #[test]
    fn fifty_edits_in_five_seconds_make_at_most_seven_ending_on_the_last() {
        let t0 = Instant::now();
        let mut c = Coalescer::sent_at(SEC, "".into(), t0);
        let mut sent = Vec::new();
        let mut offers = (0..50).map(|i| (t0 + Duration::from_millis(100 * i), i));
        let mut next = offers.next();
        let mut now = t0;
        loop {
            let due = c.due(now);
            now = match (next, due) {
                (Some((at, _)), Some(d)) => at.min(d),
                (Some((at, _)), None) => at,
                (None, Some(d)) => d,
                (None, None) => break,
            };
            while let Some((at, i)) = next.filter(|(at, _)| *at <= now) {
                let _ = at;
                c.offer(format!("part {i}"));
                next = offers.next();
            }
            if let Some(text) = c.take(now) {
                sent.push((now, text));
                c.sent(now);
            }
        }
        assert!(sent.len() <= 7, "{} edits: {sent:?}", sent.len());
        assert_eq!(sent.last().map(|(_, t)| t.as_str()), Some("part 49"));
        assert_eq!(c.shown(), Some("part 49"));
        for w in sent.windows(2) {
            assert!(w[1].0 - w[0].0 >= SEC, "two edits within the interval");
        }
    }

    #[test]
    fn an_edit_to_what_is_shown_is_not_sent() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(SEC, Some("hello".into()));
        assert_eq!(c.offer("hello".into()), Offered::Skipped);
        assert!(c.settled());
        assert_eq!(c.take(t0), None);
        // A text offered then taken back before it went: nothing goes.
        assert_eq!(
            c.offer("hello!".into()),
            Offered::Pending { replaced: false }
        );
        assert_eq!(c.offer("hello".into()), Offered::Pending { replaced: true });
        assert!(c.settled());
        assert_eq!(c.take(t0 + SEC), None);
    }

    #[test]
    fn a_refused_last_edit_goes_again_after_its_wait() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(SEC, Some("a".into()));
        c.offer("final".into());
        assert_eq!(c.take(t0).as_deref(), Some("final"));
        let wait = Duration::from_secs(3);
        c.refused(t0, wait);
        assert!(!c.settled(), "a refused final text is not dropped");
        assert_eq!(c.due(t0), Some(t0 + wait));
        assert_eq!(c.take(t0 + SEC), None, "not before the retry-after");
        assert_eq!(c.take(t0 + wait).as_deref(), Some("final"));
        c.sent(t0 + wait);
        assert!(c.settled());
        assert_eq!(c.shown(), Some("final"));
    }

    #[test]
    fn a_newer_text_replaces_a_refused_one() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(SEC, None);
        c.offer("one".into());
        assert_eq!(c.take(t0).as_deref(), Some("one"));
        // Offered while "one" is going out: pending behind it.
        assert_eq!(c.offer("two".into()), Offered::Pending { replaced: false });
        c.refused(t0, Duration::from_secs(2));
        assert_eq!(c.take(t0 + Duration::from_secs(2)).as_deref(), Some("two"));
    }

    #[test]
    fn an_edit_that_cannot_be_made_leaves_the_message_as_it_was() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(SEC, Some("a".into()));
        c.offer("b".into());
        assert_eq!(c.take(t0).as_deref(), Some("b"));
        // Offered back while "b" went out: it would undo "b", so it waits behind it.
        c.offer("a".into());
        c.dropped();
        assert!(c.settled(), "\"b\" was never shown: \"a\" needs no edit");
        assert_eq!(c.shown(), Some("a"));
        c.offer("c".into());
        assert_eq!(c.take(t0).as_deref(), Some("c"), "a newer text still goes");
    }

    /// A small deterministic generator (xorshift) for the property runs.
    struct Gen(u64);

    impl Gen {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// Random streams of offers (texts repeating at times), driven as a turn would drive
    /// them, the platform refusing some edits with a wait: the edits sent are in the order
    /// offered, one per interval at most (and none before a refusal's wait), none equal to
    /// what the message showed, and the message ends on the last text offered.
    #[test]
    fn property_ordered_paced_and_final() {
        for seed in 1..=500u64 {
            let mut g = Gen(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let t0 = Instant::now();
            let every = Duration::from_millis(200 + g.below(1_000));
            let mut c = Coalescer::new(every, Some("t0".into()));
            let n = 1 + g.below(80);
            let mut at = t0;
            let mut offers = Vec::new();
            for _ in 0..n {
                at += Duration::from_millis(g.below(400));
                // Few distinct texts, so repeats and returns to the shown text happen.
                offers.push((at, format!("t{}", g.below(6))));
            }
            let last = offers.last().map(|(_, t)| t.clone()).unwrap_or_default();
            let mut shown = "t0".to_owned();
            let mut sent: Vec<(Instant, String)> = Vec::new();
            let mut earliest = t0;
            let mut refusals = 0;
            let mut i = 0;
            let mut now = t0;
            loop {
                let due = c.due(now);
                let next_offer = offers.get(i).map(|(at, _)| *at);
                now = match (next_offer, due) {
                    (Some(a), Some(d)) => a.min(d),
                    (Some(a), None) => a,
                    (None, Some(d)) => d,
                    (None, None) => break,
                };
                while offers.get(i).is_some_and(|(at, _)| *at <= now) {
                    c.offer(offers[i].1.clone());
                    i += 1;
                }
                if let Some(text) = c.take(now) {
                    assert!(
                        now >= earliest,
                        "seed {seed}: an edit before its interval or wait"
                    );
                    assert_ne!(text, shown, "seed {seed}: an edit to what was shown");
                    if refusals < 5 && g.below(4) == 0 {
                        refusals += 1;
                        let wait = Duration::from_millis(g.below(3_000));
                        c.refused(now, wait);
                        earliest = now + wait.max(every);
                    } else {
                        c.sent(now);
                        shown = text.clone();
                        sent.push((now, text));
                        earliest = now + every;
                    }
                }
            }
            assert!(c.settled(), "seed {seed}");
            assert_eq!(
                shown, last,
                "seed {seed}: the message does not end on the last text"
            );
            assert_eq!(c.shown(), Some(last.as_str()), "seed {seed}");
            // In the order offered: each sent text is offered after the previous one's.
            let mut from = 0;
            for (_, text) in &sent {
                let k = offers[from..]
                    .iter()
                    .position(|(_, t)| t == text)
                    .unwrap_or_else(|| panic!("seed {seed}: {text} sent out of order"));
                from += k;
            }
            for w in sent.windows(2) {
                assert!(
                    w[1].0 - w[0].0 >= every,
                    "seed {seed}: two edits in one interval"
                );
            }
        }
    }
}
