//! Edits of one message coalesced to its platform's pace: a handler may change a message as
//! fast as it likes (an AI agent streaming its answer token by token, in one reply or in the
//! parts of a later answer); the platform sees at most one change of the message per
//! interval, always the latest, and the message ends on the last text asked for.
//!
//! ```text
//! the turn's next action, an edit of message M:
//!   a later edit of M follows among the turn's actions (not past a send that gives M's ref
//!     to another message, nor past a delete of M) → coalesced (the later one takes its text
//!     when it gives none)
//!   it would show what M shows → skipped
//!   M changed less than the pace ago → waits: until the pace is over (a reply, the last
//!     part), or until then or a newer part, whichever comes first (a held turn: the newer
//!     part may coalesce it)
//!   else → sent
//! a send with a ref, an edit done → M's mark: what it shows (hashed), when it changed
//! ```
//!
//! The marks are recorded with the turn's progress: the parts of a later answer, and a worker
//! that takes the turn over, keep the pace and know what each message shows. A 429 all the
//! same (another writer, a platform stricter than its pace) is waited out by the send's
//! retry: the last text is delayed, never dropped.

use std::time::Duration;

use botfleet_core::{Action, Button, Platform, Target};
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64;

/// Outcomes of an edit asked for ([`crate::metrics::STREAM_EDITS_TOTAL`]).
pub(crate) const SENT: &str = "sent";
/// See [`SENT`].
pub(crate) const COALESCED: &str = "coalesced";
/// See [`SENT`].
pub(crate) const SKIPPED: &str = "skipped";

/// The least time between two changes of one message (its send and edits) that `platform`
/// takes without a 429 over a stream of them: Telegram, Discord, Slack's `chat.update` and
/// WhatsApp all about one a second.
pub(crate) fn pace(platform: Platform) -> Duration {
    match platform {
        Platform::Telegram | Platform::Slack | Platform::Discord | Platform::Whatsapp => {
            Duration::from_secs(1)
        }
    }
}

/// What becomes of a turn's next action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// An edit a later edit of the same message goes instead of ([`COALESCED`]).
    Coalesced,
    /// An edit that would show what the message shows ([`SKIPPED`]).
    Skipped,
    /// An edit too soon after the message's last change: not before this wait.
    Wait(Duration),
    /// To be done now (anything but an edit, or an edit due).
    Go,
}

/// What one message of the turn shows and when it last changed.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
struct Mark {
    /// How later edits name it.
    target: Target,
    /// Its text's hash, when known (an edit of buttons alone, of a message sent before the
    /// turn, leaves it unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    text: Option<u64>,
    /// Its buttons' hash.
    buttons: u64,
    /// When it changed (unix ms, rounded up).
    at_ms: i64,
    /// While it is a native stream of the platform's, not ended yet: its whole text (an edit
    /// that extends it adds to the stream; a platform whose stream ends as a message of its
    /// own sends it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    stream: Option<String>,
}

/// The marks of the messages a turn sent or edited (recorded with its progress).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(transparent)]
pub(crate) struct Marks(Vec<Mark>);

fn text_hash(text: &str) -> u64 {
    xxh3_64(text.as_bytes())
}

fn buttons_hash(buttons: &[Vec<Button>]) -> u64 {
    xxh3_64(&serde_json::to_vec(buttons).unwrap_or_default())
}

impl Marks {
    fn get(&self, target: &Target) -> Option<&Mark> {
        self.0.iter().find(|m| m.target == *target)
    }

    /// What becomes of action `i` of `actions` at `now_ms`, each message changing at most
    /// once per `pace`. A coalesced edit without a text gives its text to the edit that goes
    /// instead (a message ends on what the last text asked for says).
    pub(crate) fn next(
        &self,
        actions: &mut [Action],
        i: usize,
        now_ms: i64,
        pace: Duration,
    ) -> Next {
        let Some(Action::Edit {
            target,
            text,
            buttons,
        }) = actions.get(i)
        else {
            return Next::Go;
        };
        if target.ref_name.is_some() == target.message_id.is_some() {
            return Next::Go; // refused with its reason when done
        }
        let later = actions[i + 1..]
            .iter()
            .take_while(|a| match a {
                Action::Send { ref_name, .. } => ref_name.is_none() || *ref_name != target.ref_name,
                Action::Delete { target: t } => t != target,
                _ => true,
            })
            .position(|a| matches!(a, Action::Edit { target: t, .. } if t == target));
        if let Some(k) = later {
            let text = text.clone();
            if let Some(Action::Edit { text: next, .. }) = actions.get_mut(i + 1 + k) {
                if next.is_none() {
                    *next = text;
                }
            }
            return Next::Coalesced;
        }
        let Some(mark) = self.get(target) else {
            return Next::Go;
        };
        let shows = text.as_deref().map(text_hash).or(mark.text);
        if shows.is_some() && shows == mark.text && buttons_hash(buttons) == mark.buttons {
            return Next::Skipped;
        }
        let pace_ms = i64::try_from(pace.as_millis()).unwrap_or(i64::MAX);
        let wait = mark.at_ms.saturating_add(pace_ms).saturating_sub(now_ms);
        if wait > 0 {
            return Next::Wait(Duration::from_millis(wait.unsigned_abs()));
        }
        Next::Go
    }

    /// Whether the message `target` is a native stream not ended yet.
    pub(crate) fn streaming(&self, target: &Target) -> bool {
        self.stream_text(target).is_some()
    }

    /// Notes that the message `target` began being a native stream showing `text` (`Some`),
    /// or ended being one (`None`).
    pub(crate) fn set_streaming(&mut self, target: &Target, text: Option<&str>) {
        if let Some(m) = self.0.iter_mut().find(|m| m.target == *target) {
            m.stream = text.map(str::to_owned);
        }
    }

    /// The whole text of the native stream `target`, while it streams.
    pub(crate) fn stream_text(&self, target: &Target) -> Option<&str> {
        self.get(target).and_then(|m| m.stream.as_deref())
    }

    /// The messages that are native streams not ended yet.
    pub(crate) fn streams(&self) -> Vec<Target> {
        self.0
            .iter()
            .filter(|m| m.stream.is_some())
            .map(|m| m.target.clone())
            .collect()
    }

    /// Where `text` goes on from what the native stream `target` shows (the byte offset of
    /// what it adds), when it starts with all of it and adds something.
    pub(crate) fn extends(&self, target: &Target, text: &str) -> Option<usize> {
        let shown = self.stream_text(target)?;
        (text.len() > shown.len() && text.starts_with(shown)).then_some(shown.len())
    }

    /// Notes what `action`, done when the clock read `now_ms`, made a message show.
    pub(crate) fn changed(&mut self, action: &Action, now_ms: i64) {
        let (target, text, buttons, stream) = match action {
            Action::Send {
                text,
                buttons,
                ref_name: Some(name),
                ..
            } => (
                Target {
                    ref_name: Some(name.clone()),
                    message_id: None,
                },
                Some(text_hash(text)),
                buttons,
                None,
            ),
            Action::Edit {
                target,
                text,
                buttons,
            } => {
                let before = self.get(target);
                // A stream goes on showing the new text (or, without one, what it showed).
                let stream = before
                    .and_then(|m| m.stream.as_ref())
                    .map(|shown| text.clone().unwrap_or_else(|| shown.clone()));
                (
                    target.clone(),
                    text.as_deref()
                        .map(text_hash)
                        .or(before.and_then(|m| m.text)),
                    buttons,
                    stream,
                )
            }
            Action::Delete { target } => {
                self.0.retain(|m| m.target != *target);
                return;
            }
            _ => return,
        };
        let mark = Mark {
            buttons: buttons_hash(buttons),
            target,
            text,
            stream,
            // From the end of the millisecond the clock read: the clock's rounding never cuts
            // a pace short (a platform counts from when it took the change, before that).
            at_ms: now_ms.saturating_add(1),
        };
        match self.0.iter_mut().find(|m| m.target == mark.target) {
            Some(m) => *m = mark,
            None => self.0.push(mark),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PACE: Duration = Duration::from_secs(1);

    fn send(text: &str) -> Action {
        Action::Send {
            text: text.into(),
            buttons: Vec::new(),
            thread: false,
            ref_name: Some("s".into()),
            attachments: Vec::new(),
            ephemeral: false,
        }
    }

    fn edit(text: Option<&str>, buttons: usize) -> Action {
        Action::Edit {
            target: Target {
                ref_name: Some("s".into()),
                message_id: None,
            },
            text: text.map(str::to_owned),
            buttons: (0..buttons)
                .map(|b| {
                    vec![Button {
                        text: format!("b{b}"),
                        value: Some(format!("v{b}")),
                        url: None,
                    }]
                })
                .collect(),
        }
    }

    /// The platform's side of message "s": what it shows, when it last changed, its edits.
    #[derive(Default)]
    struct Platform {
        text: String,
        buttons: usize,
        changed_ms: Option<i64>,
        edits: Vec<(i64, String)>,
    }

    /// Drives `posted` (actions appended at their times) as a held turn does: coalesced and
    /// skipped edits dropped, an edit not due waiting for its pace or the next part, an edit
    /// refused by `refuse` (its wait) done again after it. The platform's messages, checked:
    /// one change per pace, none to what is shown.
    fn drive(posted: &[(i64, Action)], mut refuse: impl FnMut() -> Option<i64>) -> Platform {
        let mut actions: Vec<Action> = Vec::new();
        let mut marks = Marks::default();
        let mut p = Platform::default();
        let (mut now, mut taken, mut done) = (0_i64, 0, 0);
        loop {
            while posted.get(taken).is_some_and(|(at, _)| *at <= now) {
                actions.push(posted[taken].1.clone());
                taken += 1;
            }
            let next_part = posted.get(taken).map(|(at, _)| *at);
            if done == actions.len() {
                match next_part {
                    Some(at) => now = at,
                    None => return p,
                }
                continue;
            }
            match marks.next(&mut actions, done, now, PACE) {
                Next::Coalesced | Next::Skipped => done += 1,
                Next::Wait(w) => {
                    let due = now + i64::try_from(w.as_millis()).unwrap();
                    now = next_part.map_or(due, |at| at.min(due));
                }
                Next::Go => {
                    let action = actions[done].clone();
                    let changes = matches!(action, Action::Send { .. } | Action::Edit { .. });
                    if let (Some(c), true) = (p.changed_ms, changes) {
                        assert!(now - c >= 1_000, "two changes within the pace at {now}");
                    }
                    if let Some(wait) = refuse() {
                        now += wait; // the send's retry waits it out, then goes again
                        continue;
                    }
                    match &action {
                        Action::Send { text, .. } => {
                            (p.text, p.buttons) = (text.clone(), 0);
                        }
                        Action::Edit { text, buttons, .. } => {
                            let t = text.clone().unwrap_or_else(|| p.text.clone());
                            assert!(
                                t != p.text || buttons.len() != p.buttons,
                                "an edit to what is shown at {now}"
                            );
                            (p.text, p.buttons) = (t.clone(), buttons.len());
                            p.edits.push((now, t));
                        }
                        _ => {}
                    }
                    if changes {
                        p.changed_ms = Some(now);
                    }
                    marks.changed(&action, now);
                    done += 1;
                }
            }
        }
    }

    #[test]
    fn fifty_edits_in_five_seconds_make_at_most_seven_ending_on_the_last() {
        let mut posted = vec![(0, send("…"))];
        for k in 1..=50 {
            posted.push((k * 100, edit(Some(&format!("part {k}")), 0)));
        }
        let p = drive(&posted, || None);
        assert!(p.edits.len() <= 7, "{:?}", p.edits);
        assert_eq!(p.text, "part 50");
        assert_eq!(p.edits.last().map(|e| e.1.as_str()), Some("part 50"));
    }

    #[test]
    fn an_edit_to_what_is_shown_is_not_sent() {
        let mut marks = Marks::default();
        marks.changed(&send("a"), 0);
        let mut actions = vec![edit(Some("a"), 0)];
        assert_eq!(marks.next(&mut actions, 0, 5_000, PACE), Next::Skipped);
        // The same text with a button: it changes something.
        let mut actions = vec![edit(Some("a"), 1)];
        assert_eq!(marks.next(&mut actions, 0, 5_000, PACE), Next::Go);
        marks.changed(&actions[0], 5_000);
        // Buttons alone, the text kept: the same as shown.
        let mut actions = vec![edit(None, 1)];
        assert_eq!(marks.next(&mut actions, 0, 9_000, PACE), Next::Skipped);
    }

    #[test]
    fn an_edit_waits_out_the_pace_of_its_message_only() {
        let mut marks = Marks::default();
        marks.changed(&send("a"), 10_000);
        let mut actions = vec![edit(Some("b"), 0)];
        assert_eq!(
            marks.next(&mut actions, 0, 10_400, PACE),
            Next::Wait(Duration::from_millis(601))
        );
        // A whole pace after the millisecond the change was seen in.
        assert_eq!(
            marks.next(&mut actions, 0, 11_000, PACE),
            Next::Wait(Duration::from_millis(1))
        );
        assert_eq!(marks.next(&mut actions, 0, 11_001, PACE), Next::Go);
        let mut other = vec![Action::Edit {
            target: Target {
                ref_name: Some("t".into()),
                message_id: None,
            },
            text: Some("x".into()),
            buttons: Vec::new(),
        }];
        assert_eq!(marks.next(&mut other, 0, 10_400, PACE), Next::Go);
        // Deleted: forgotten.
        marks.changed(
            &Action::Delete {
                target: Target {
                    ref_name: Some("s".into()),
                    message_id: None,
                },
            },
            10_500,
        );
        assert_eq!(marks, Marks::default());
    }

    #[test]
    fn a_coalesced_edit_gives_its_text_to_a_later_edit_of_buttons() {
        let marks = Marks::default();
        let mut actions = vec![edit(Some("new"), 0), send("other"), edit(None, 2)];
        // `send("other")` names "s" again: a new message, the first edit is not coalesced.
        assert_eq!(marks.next(&mut actions, 0, 0, PACE), Next::Go);
        let mut actions = vec![edit(Some("new"), 0), Action::Typing {}, edit(None, 2)];
        assert_eq!(marks.next(&mut actions, 0, 0, PACE), Next::Coalesced);
        assert_eq!(actions[2], edit(Some("new"), 2));
    }

    #[test]
    fn marks_read_back_from_a_recorded_progress() {
        let mut marks = Marks::default();
        marks.changed(&send("a"), 7);
        let text = serde_json::to_string(&marks).unwrap();
        let back: Marks = serde_json::from_str(&text).unwrap();
        assert_eq!(back, marks);
        assert_eq!(
            serde_json::from_str::<Marks>("[]").unwrap(),
            Marks::default()
        );
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
        fn below(&mut self, n: u64) -> i64 {
            i64::try_from(self.next() % n).unwrap()
        }
    }

    /// Random streams of edits of one message (texts repeating, edits of buttons alone,
    /// typing between), posted at random times, the platform refusing some changes with a
    /// wait: the platform sees at most one change per pace and none to what it shows (both
    /// checked in [`drive`]), and the message ends on the last text and buttons asked for.
    #[test]
    fn property_ordered_paced_and_final() {
        for seed in 1..=500u64 {
            let mut g = Gen(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let mut posted = vec![(0, send("t0"))];
            let mut at = 0;
            let (mut text, mut buttons) = ("t0".to_owned(), 0);
            for _ in 0..g.below(80) {
                at += g.below(400);
                let action = match g.below(8) {
                    0 => Action::Typing {},
                    1 => {
                        buttons = usize::try_from(g.below(3)).unwrap();
                        edit(None, buttons)
                    }
                    _ => {
                        // Few distinct texts, so repeats and returns to the shown text happen.
                        text = format!("t{}", g.below(6));
                        buttons = 0;
                        edit(Some(&text), 0)
                    }
                };
                posted.push((at, action));
            }
            let mut refusals = 0;
            let p = drive(&posted, || {
                (refusals < 5 && g.below(4) == 0).then(|| {
                    refusals += 1;
                    g.below(3_000)
                })
            });
            assert_eq!((&p.text, p.buttons), (&text, buttons), "seed {seed}");
        }
    }
}
