//! Discord's per-route rate limits as its answers announce them: every REST answer names
//! the route's bucket (`X-RateLimit-Bucket`, a hash that routes sharing a limit share), its
//! size (`X-RateLimit-Limit`), what is left of it (`-Remaining`) and when it refills
//! (`-Reset-After`, seconds). A bot learns them here; the runtime keeps them for the whole
//! fleet (the learnt bucket is one of the call's [`Bucket`]s, and a bucket Discord says is
//! empty is paused for every worker until it refills — so no worker meets the 429).
//!
//! ```text
//! an answer on a channel's route (a message made, edited, deleted; typing)
//!   with the four headers → the route's bucket learnt (its hash, its size, its window)
//!     nothing left → that bucket of the channel empty until its reset
//!   without them → nothing learnt (the documented limits only)
//! a later call on a learnt route → its bucket, "route" `{hash}:{channel}`, taken first
//! ```

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use botfleet_platform::{Bucket, Limit};
use reqwest::header::HeaderMap;

/// The scope of a learnt route's bucket (`--rate-limits discord.route=off` turns learning off).
pub(crate) const ROUTE: &str = "route";

/// Waited past a reset Discord announced: it gives it to the millisecond, and a call landing
/// on the edge of the window would meet the 429 it was kept from.
const MARGIN: Duration = Duration::from_millis(20);

/// What one answer said of its route's bucket.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Announced {
    /// The bucket's hash.
    pub(crate) bucket: String,
    /// Calls a window.
    pub(crate) limit: u32,
    /// Calls left in this window.
    pub(crate) remaining: u32,
    /// Until the window ends.
    pub(crate) reset_after: Duration,
}

impl Announced {
    /// The headers of an answer, when all four are there and make sense (a hash of up to 64
    /// letters and digits, a limit of 1–10,000, a reset within an hour).
    pub(crate) fn read(headers: &HeaderMap) -> Option<Self> {
        let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let bucket = text("x-ratelimit-bucket")?;
        let sane = !bucket.is_empty()
            && bucket.len() <= 64
            && bucket.bytes().all(|c| c.is_ascii_alphanumeric());
        if !sane {
            return None;
        }
        let limit: u32 = text("x-ratelimit-limit")?.parse().ok()?;
        let remaining: u32 = text("x-ratelimit-remaining")?.parse().ok()?;
        let reset: f64 = text("x-ratelimit-reset-after")?.parse().ok()?;
        if !(1..=10_000).contains(&limit) || !(0.0..=3600.0).contains(&reset) {
            return None;
        }
        Some(Self {
            bucket: bucket.to_owned(),
            limit,
            remaining: remaining.min(limit),
            reset_after: Duration::from_secs_f64(reset),
        })
    }
}

/// A route's bucket as learnt.
#[derive(Clone, Debug)]
struct Learnt {
    bucket: String,
    limit: u32,
    /// The longest reset seen: the window (a window's first call sees all of it).
    window: Duration,
}

#[derive(Debug, Default)]
struct Table {
    /// Route (what the call does) → its bucket.
    learnt: HashMap<&'static str, Learnt>,
    /// `(bucket, channel)` → when it refills, for buckets Discord said are empty.
    empty: HashMap<(String, String), Instant>,
}

/// One bot's learnt routes (per process: each worker learns them from its own answers, and
/// since Discord names a bucket the same for everyone, the fleet's keys agree).
#[derive(Debug, Default)]
pub(crate) struct Routes(Mutex<Table>);

impl Routes {
    /// Takes in what an answer on `route` in `channel` announced.
    pub(crate) fn heard(&self, route: &'static str, channel: &str, a: Announced) {
        let mut t = crate::lock(&self.0);
        let window = t
            .learnt
            .get(route)
            .filter(|l| l.bucket == a.bucket)
            .map_or(a.reset_after, |l| l.window.max(a.reset_after));
        let now = Instant::now();
        // Buckets whose windows ended are forgotten (what is kept stays as small as the
        // channels written to within a window).
        t.empty.retain(|_, until| *until > now);
        if a.remaining == 0 {
            t.empty.insert(
                (a.bucket.clone(), channel.to_owned()),
                now + a.reset_after + MARGIN,
            );
        }
        t.learnt.insert(
            route,
            Learnt {
                bucket: a.bucket,
                limit: a.limit,
                window,
            },
        );
    }

    /// The bucket of `route` in `channel`, once learnt.
    pub(crate) fn bucket(&self, route: &'static str, channel: &str) -> Option<Bucket> {
        crate::lock(&self.0)
            .learnt
            .get(route)
            .map(|l| l.bucket(channel))
    }

    /// The bucket of `route` in `channel` when Discord said it is empty, and until it
    /// refills. Asked after every call: the bucket is made only when it is empty.
    pub(crate) fn empty(&self, route: &'static str, channel: &str) -> Option<(Bucket, Duration)> {
        let t = crate::lock(&self.0);
        let l = t.learnt.get(route)?;
        let until = t.empty.get(&(l.bucket.clone(), channel.to_owned()))?;
        let left = until.checked_duration_since(Instant::now())?;
        (!left.is_zero()).then(|| (l.bucket(channel), left))
    }
}

impl Learnt {
    /// Its bucket in `channel`: its limit a window, the window as learnt.
    fn bucket(&self, channel: &str) -> Bucket {
        let secs = self.window.as_secs_f64().max(0.001);
        let limit = Limit {
            per_second: f64::from(self.limit) / secs,
            burst: self.limit,
        };
        Bucket::of(ROUTE, &format!("{}:{channel}", self.bucket), limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    fn announced(remaining: &str, reset: &str) -> HeaderMap {
        headers(&[
            ("x-ratelimit-bucket", "abcd1234"),
            ("x-ratelimit-limit", "5"),
            ("x-ratelimit-remaining", remaining),
            ("x-ratelimit-reset-after", reset),
        ])
    }

    #[test]
    fn headers_are_read_only_whole_and_sane() {
        let a = Announced::read(&announced("4", "5.0")).unwrap();
        assert_eq!(a.bucket, "abcd1234");
        assert_eq!((a.limit, a.remaining), (5, 4));
        assert_eq!(a.reset_after, Duration::from_secs(5));
        assert!(Announced::read(&headers(&[("x-ratelimit-limit", "5")])).is_none());
        let mut odd = announced("0", "1");
        odd.insert("x-ratelimit-bucket", "no spaces allowed".parse().unwrap());
        assert!(Announced::read(&odd).is_none());
        let mut long = announced("0", "1");
        long.insert("x-ratelimit-reset-after", "99999".parse().unwrap());
        assert!(Announced::read(&long).is_none());
        let mut zero = announced("0", "1");
        zero.insert("x-ratelimit-limit", "0".parse().unwrap());
        assert!(Announced::read(&zero).is_none());
    }

    #[test]
    fn a_learnt_route_has_a_bucket_per_channel_and_says_when_it_is_empty() {
        let r = Routes::default();
        assert!(r.bucket("create message", "5").is_none());
        r.heard(
            "create message",
            "5",
            Announced::read(&announced("4", "5.0")).unwrap(),
        );
        let b = r.bucket("create message", "5").unwrap();
        assert_eq!((b.scope, b.of.as_str()), (ROUTE, "abcd1234:5"));
        assert_eq!(b.limit.burst, 5);
        assert!((b.limit.per_second - 1.0).abs() < 1e-9);
        assert!(r.empty("create message", "5").is_none());
        // The window stays the longest reset seen.
        r.heard(
            "create message",
            "5",
            Announced::read(&announced("0", "2.5")).unwrap(),
        );
        let (b, left) = r.empty("create message", "5").unwrap();
        assert_eq!(b.of, "abcd1234:5");
        assert!(left <= Duration::from_millis(2520) && left > Duration::from_secs(1));
        assert!((b.limit.per_second - 1.0).abs() < 1e-9);
        // Another channel of the same route is not empty; another route is not learnt.
        assert!(r.empty("create message", "6").is_none());
        assert!(r.bucket("typing", "5").is_none());
        // Remaining calls: not empty.
        r.heard(
            "create message",
            "7",
            Announced::read(&announced("3", "1")).unwrap(),
        );
        assert!(r.empty("create message", "7").is_none());
    }
}
