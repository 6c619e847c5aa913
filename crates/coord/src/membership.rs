//! Watching the set of live workers.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use botfleet_core::{Incarnation, WorkerId};
use tokio::sync::mpsc;
use tracing::debug;

use crate::{Coordinator, LiveWorker, MemberEvent};

/// Turns the coordinator's join/leave signal plus a periodic poll into a stream of
/// [`MemberEvent`]s. Joins and clean leaves arrive at once (signalled); expiries of crashed
/// workers within one poll period.
///
/// The background task is owned by the returned receiver: it ends when the receiver is
/// dropped.
#[derive(Debug)]
pub struct MemberWatch;

impl MemberWatch {
    /// Starts watching. The first batch of events lists every worker live now as `Joined`.
    pub fn spawn(coord: Arc<dyn Coordinator>, poll: Duration) -> mpsc::Receiver<MemberEvent> {
        let (tx, rx) = mpsc::channel(256);
        tokio::spawn(async move {
            let mut signal = coord.member_signal().await.ok();
            let mut known: BTreeMap<WorkerId, Incarnation> = BTreeMap::new();
            loop {
                match coord.live_workers().await {
                    Ok(live) => {
                        for ev in diff(&mut known, &live) {
                            if tx.send(ev).await.is_err() {
                                return;
                            }
                        }
                    }
                    Err(e) => debug!(error = %e, "member watch: listing failed"),
                }
                let signalled = async {
                    match signal.as_mut() {
                        Some(s) => s.recv().await.is_some(),
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    ok = signalled => if !ok { signal = coord.member_signal().await.ok(); },
                    () = tokio::time::sleep(poll) => {}
                    () = tx.closed() => return,
                }
            }
        });
        rx
    }
}

/// Events that turn `known` into `live`, and updates `known`.
pub(crate) fn diff(
    known: &mut BTreeMap<WorkerId, Incarnation>,
    live: &[LiveWorker],
) -> Vec<MemberEvent> {
    let mut out = Vec::new();
    let now: BTreeMap<WorkerId, Incarnation> = live
        .iter()
        .map(|w| (w.id.clone(), w.incarnation.clone()))
        .collect();
    for (id, inc) in known.iter() {
        match now.get(id) {
            None => out.push(MemberEvent::Left(id.clone())),
            // Same id, new life: the old one left, the new one joined.
            Some(i) if i != inc => out.push(MemberEvent::Left(id.clone())),
            _ => {}
        }
    }
    for (id, inc) in &now {
        if known.get(id) != Some(inc) {
            out.push(MemberEvent::Joined(id.clone()));
        }
    }
    *known = now;
    out
}
