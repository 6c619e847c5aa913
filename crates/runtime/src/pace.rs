//! The platforms' send limits, kept by the whole fleet: before a platform call, a token from
//! every bucket the platform says the call counts against ([`Sender::buckets`]: the chat's,
//! the group's, the bot's…), taken in one round trip through the coordinator, so every
//! worker sending for a bot draws from the same buckets.
//!
//! ```text
//! a platform call of a turn (a send, an edit, a file, a stream's step…)
//!   no bucket (typing, an interaction's answer…) → goes now
//!   a token from each → goes now (waited 0)
//!   one is empty → the turn gives its slot back, waits what the coordinator says, asks again
//!     a wait past the send's retry window → the action fails, as a send failing that long would
//!   the coordinator is away → goes now (the platform's own 429s still pace it)
//! ```

use std::{fmt, str::FromStr, sync::Arc};

use botfleet_coord::{BucketTake, Coordinator, RateLimit};
use botfleet_core::{BotId, Platform};
use botfleet_platform::{Bucket, Limit};
use xxhash_rust::xxh3::xxh3_64;

/// Changes to the platforms' documented send limits (`--rate-limits`), for a platform with
/// other limits than its documented ones (a Telegram Bot API server of one's own has none; a
/// WhatsApp number with a higher tier sends more). Written as a comma-separated list:
/// `off` (no limit is kept), `PLATFORM=off`, `PLATFORM.SCOPE=off`, or
/// `PLATFORM.SCOPE=CALLS/SECONDS` with `:BURST` (default `CALLS`), e.g.
/// `whatsapp.number=250/1,telegram.group=off`. The empty list keeps every documented limit.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RateLimits {
    all_off: bool,
    off: Vec<Platform>,
    scopes: Vec<(Platform, &'static str, Option<Limit>)>,
}

impl RateLimits {
    /// The limit of `platform`'s `scope` after these changes (`None`: not kept), from its
    /// documented `limit`.
    pub fn apply(&self, platform: Platform, scope: &str, limit: Limit) -> Option<Limit> {
        self.said(platform, scope).unwrap_or(Some(limit))
    }

    /// What these changes say of `platform`'s `scope`: nothing (`None`), not kept
    /// (`Some(None)`), or its limit.
    fn said(&self, platform: Platform, scope: &str) -> Option<Option<Limit>> {
        if self.all_off || self.off.contains(&platform) {
            return Some(None);
        }
        self.scopes
            .iter()
            .find(|(p, s, _)| *p == platform && *s == scope)
            .map(|(_, _, l)| *l)
    }

    /// A bot's own changes (`rate_limits` in its spec): the same list with the bot's
    /// platform left out — `off`, `SCOPE=off`, `SCOPE=CALLS/SECONDS[:BURST]` — checked
    /// against `platform`'s scopes.
    ///
    /// # Errors
    /// What is wrong with an item, naming it.
    pub fn for_bot(platform: Platform, text: &str) -> Result<Self, String> {
        let mut items = Vec::new();
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            if item == "off" {
                items.push(format!("{platform}=off"));
                continue;
            }
            let name = item.split('=').next().unwrap_or_default();
            if name.contains('.') || !item.contains('=') {
                return Err(format!(
                    "`{item}`: expected off, SCOPE=off or SCOPE=CALLS/SECONDS[:BURST] (the bot's platform is implied)"
                ));
            }
            items.push(format!("{platform}.{item}"));
        }
        items
            .join(",")
            .parse()
            .map_err(|e: String| e.replace(&format!("`{platform}."), "`"))
    }
}

impl FromStr for RateLimits {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let mut out = RateLimits::default();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            if item == "off" {
                out.all_off = true;
                continue;
            }
            let (name, value) = item.split_once('=').ok_or_else(|| {
                format!(
                    "`{item}`: expected off, PLATFORM=off or PLATFORM.SCOPE=CALLS/SECONDS[:BURST]"
                )
            })?;
            let (platform, scope) = match name.split_once('.') {
                Some((p, s)) => (p, Some(s)),
                None => (name, None),
            };
            let platform: Platform = platform
                .parse()
                .map_err(|_| format!("`{item}`: unknown platform `{platform}`"))?;
            let Some(scope) = scope else {
                if value != "off" {
                    return Err(format!(
                        "`{item}`: a whole platform can only be turned off; give a scope (PLATFORM.SCOPE=CALLS/SECONDS)"
                    ));
                }
                out.off.push(platform);
                continue;
            };
            let known = crate::platforms::send_scopes(platform);
            let Some((scope, _)) = known.iter().find(|(k, _)| *k == scope) else {
                let names: Vec<&str> = known.iter().map(|(k, _)| *k).collect();
                return Err(format!(
                    "`{item}`: {platform} has no send limit `{scope}` (it has: {})",
                    if names.is_empty() {
                        "none in this build".to_owned()
                    } else {
                        names.join(", ")
                    }
                ));
            };
            let limit = if value == "off" {
                None
            } else {
                Some(parse_limit(value).map_err(|why| format!("`{item}`: {why}"))?)
            };
            out.scopes
                .retain(|(p, s, _)| !(*p == platform && s == scope));
            out.scopes.push((platform, scope, limit));
        }
        Ok(out)
    }
}

/// `CALLS/SECONDS[:BURST]`.
fn parse_limit(v: &str) -> Result<Limit, String> {
    let bad = || "expected off or CALLS/SECONDS[:BURST], e.g. 30/1 or 20/60:5".to_owned();
    let (rate, burst) = match v.split_once(':') {
        Some((r, b)) => (r, Some(b)),
        None => (v, None),
    };
    let (calls, seconds) = rate.split_once('/').ok_or_else(bad)?;
    let calls: u32 = calls.trim().parse().map_err(|_| bad())?;
    let seconds: u32 = seconds.trim().parse().map_err(|_| bad())?;
    let burst: u32 = match burst {
        Some(b) => b.trim().parse().map_err(|_| bad())?,
        None => calls,
    };
    if !(1..=1_000_000).contains(&calls) || !(1..=86_400).contains(&seconds) {
        return Err("CALLS must be 1-1000000 and SECONDS 1-86400".into());
    }
    if !(1..=1_000_000).contains(&burst) {
        return Err("BURST must be 1-1000000".into());
    }
    Ok(Limit::every(calls, seconds, burst))
}

/// The fleet's send buckets, through the coordinator, with the worker's changes to the
/// platforms' limits.
#[derive(Clone)]
pub(crate) struct Pace {
    coord: Arc<dyn Coordinator>,
    limits: Arc<RateLimits>,
    /// The bot's own changes ([`Pace::for_bot`]), over the worker's.
    bot: Option<Arc<RateLimits>>,
}

impl fmt::Debug for Pace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pace")
            .field("limits", &self.limits)
            .field("bot", &self.bot)
            .finish()
    }
}

impl Pace {
    pub(crate) fn new(coord: Arc<dyn Coordinator>, limits: RateLimits) -> Self {
        Self {
            coord,
            limits: Arc::new(limits),
            bot: None,
        }
    }

    /// The buckets of `spec`'s bot: its own `rate_limits` over the worker's. (Its spec was
    /// checked when it was stored; changes it cannot mean are left out, said here.)
    pub(crate) fn for_bot(&self, spec: &botfleet_core::BotSpec) -> Self {
        let bot = spec.options.rate_limits.as_deref().and_then(|text| {
            RateLimits::for_bot(spec.platform, text)
                .inspect_err(|why| {
                    tracing::warn!(bot = %spec.id, %why, "ignoring the bot's rate_limits");
                })
                .ok()
                .map(Arc::new)
        });
        Self {
            coord: self.coord.clone(),
            limits: self.limits.clone(),
            bot,
        }
    }

    /// `buckets` (a call's on `platform`) with the bot's and the worker's changes to their
    /// limits (the bot's first); those turned off left out.
    pub(crate) fn kept(&self, platform: Platform, mut buckets: Vec<Bucket>) -> Vec<Bucket> {
        buckets.retain_mut(|b| {
            let own = self.bot.as_ref().and_then(|l| l.said(platform, b.scope));
            match own.unwrap_or_else(|| self.limits.apply(platform, b.scope, b.limit)) {
                Some(l) => {
                    b.limit = l;
                    true
                }
                None => false,
            }
        });
        buckets
    }

    /// The coordinator's keys and limits of `buckets` (the call of `bot` on `platform`), for
    /// [`Pace::take`]: made once per call, asked with every try.
    pub(crate) fn scopes(
        platform: Platform,
        bot: &BotId,
        buckets: &[Bucket],
    ) -> Vec<(String, RateLimit)> {
        buckets
            .iter()
            .map(|b| {
                let limit = RateLimit::new(b.limit.per_second, b.limit.burst);
                (key(platform, bot, b), limit)
            })
            .collect()
    }

    /// Takes a token from every bucket of `scopes` ([`Pace::scopes`]), or says how long to
    /// wait and which bucket holds the call. A call that `yields` to others (an edit a newer
    /// one may make needless) leaves each bucket's reserve to the calls that do not.
    pub(crate) async fn take(
        &self,
        scopes: &[(String, RateLimit)],
        yields: bool,
    ) -> botfleet_coord::Result<BucketTake> {
        let scopes: Vec<(&str, RateLimit)> = scopes.iter().map(|(k, l)| (k.as_str(), *l)).collect();
        if yields {
            self.coord.take_buckets_yielding(&scopes).await
        } else {
            self.coord.take_buckets(&scopes).await
        }
    }

    /// Pauses `bucket` of `bot` on `platform` for `for_` (a 429's retry-after) for the whole
    /// fleet (clamped to 1 ms - 1 day).
    pub(crate) async fn pause(
        &self,
        platform: Platform,
        bot: &BotId,
        bucket: &Bucket,
        for_: std::time::Duration,
    ) -> botfleet_coord::Result<()> {
        let for_ = for_.clamp(
            std::time::Duration::from_millis(1),
            std::time::Duration::from_secs(86_400),
        );
        self.coord
            .pause_bucket(&key(platform, bot, bucket), for_)
            .await
    }
}

/// The fleet's guard against a platform's ban for refused calls ([`Sender::invalid_budget`]):
/// every refused call takes a token from the budget; when it is spent, the gate — a bucket
/// every call of the platform takes from, never short but when paused — is paused for every
/// worker until a tenth of the budget is back.
///
/// [`Sender::invalid_budget`]: botfleet_platform::Sender::invalid_budget
#[derive(Clone, Debug)]
pub(crate) struct Guard {
    /// The budget of refused calls.
    pub(crate) budget: Bucket,
    /// What every call of the platform takes a token from.
    pub(crate) gate: Bucket,
    /// How long the gate stays shut once the budget is spent.
    pub(crate) shut_for: std::time::Duration,
}

impl Pace {
    /// The guard of `budget` (a platform's [`Sender::invalid_budget`]), when its scope is kept.
    ///
    /// [`Sender::invalid_budget`]: botfleet_platform::Sender::invalid_budget
    pub(crate) fn guard(&self, platform: Platform, budget: Option<Bucket>) -> Option<Guard> {
        let budget = self.kept(platform, vec![budget?]).pop()?;
        let l = budget.limit;
        // A tenth of the budget back, within 2 s - 10 min.
        let tenth = f64::from(l.burst) / 10.0 / l.per_second.max(1e-6);
        let shut_for = std::time::Duration::from_secs_f64(tenth.clamp(2.0, 600.0));
        let open = Limit {
            per_second: 1e6,
            burst: 1_000_000,
        };
        let gate = Bucket::fleet(budget.scope, "gate", open);
        Some(Guard {
            budget,
            gate,
            shut_for,
        })
    }
}

/// The bucket of `buckets` a 429 of `scope` (as the platform said, else the call's
/// narrowest: its first) was for.
pub(crate) fn limited<'a>(buckets: &'a [Bucket], scope: Option<&str>) -> Option<&'a Bucket> {
    match scope {
        Some(s) => buckets.iter().find(|b| b.scope == s),
        None => buckets.first(),
    }
}

/// The coordinator's key of `bot`'s bucket `b`: the platform, the bot's own id (every slice
/// of a sharded bot draws from one bucket), the scope, and what it is of — as given when it
/// is short and plain, else its hash (a key has no spaces or braces, and a bounded length).
pub(crate) fn key(platform: Platform, bot: &BotId, b: &Bucket) -> String {
    // A fleet-wide bucket names no bot (a bot's id is never empty).
    let base = if b.fleet { "" } else { bot.base() };
    if b.of.is_empty() {
        return format!("send:{platform}:{base}:{}", b.scope);
    }
    let plain = b.of.len() <= 64
        && b.of
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"-_.:/@+=".contains(&c));
    if plain {
        format!("send:{platform}:{base}:{}:{}", b.scope, b.of)
    } else {
        format!(
            "send:{platform}:{base}:{}:#{:016x}",
            b.scope,
            xxh3_64(b.of.as_bytes())
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limits_change_documented_limits_and_refuse_what_they_cannot_mean() {
        let tg = botfleet_telegram::limits::BOT;
        let none: RateLimits = "".parse().unwrap();
        assert_eq!(none, RateLimits::default());
        assert_eq!(none.apply(Platform::Telegram, "bot", tg), Some(tg));
        let r: RateLimits = "telegram.bot=100/1, telegram.group=off,telegram.chat=3/2:1"
            .parse()
            .unwrap();
        assert_eq!(
            r.apply(Platform::Telegram, "bot", tg),
            Some(Limit::every(100, 1, 100))
        );
        assert_eq!(r.apply(Platform::Telegram, "group", tg), None);
        assert_eq!(
            r.apply(Platform::Telegram, "chat", tg),
            Some(Limit::every(3, 2, 1))
        );
        let off: RateLimits = "off".parse().unwrap();
        assert_eq!(off.apply(Platform::Telegram, "bot", tg), None);
        let one: RateLimits = "telegram=off".parse().unwrap();
        assert_eq!(one.apply(Platform::Telegram, "chat", tg), None);
        for (bad, says) in [
            (
                "telegram.nope=1/1",
                "telegram has no send limit `nope` (it has: chat, group, bot)",
            ),
            ("pigeon.bot=1/1", "unknown platform `pigeon`"),
            ("telegram.bot", "expected off"),
            ("telegram=1/1", "only be turned off"),
            ("telegram.bot=0/1", "CALLS must be 1-1000000"),
            ("telegram.bot=1/0", "SECONDS 1-86400"),
            ("telegram.bot=1/1:0", "BURST must be"),
            ("telegram.bot=fast", "expected off or CALLS/SECONDS"),
        ] {
            let e = bad.parse::<RateLimits>().unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn a_bots_own_limits_name_its_scopes_and_go_over_the_workers() {
        let tg = botfleet_telegram::limits::BOT;
        let bot = RateLimits::for_bot(Platform::Telegram, "bot=100/1, group=off").unwrap();
        assert_eq!(
            bot.said(Platform::Telegram, "bot"),
            Some(Some(Limit::every(100, 1, 100)))
        );
        assert_eq!(bot.said(Platform::Telegram, "group"), Some(None));
        assert_eq!(bot.said(Platform::Telegram, "chat"), None);
        let all = RateLimits::for_bot(Platform::Telegram, "off").unwrap();
        assert_eq!(all.apply(Platform::Telegram, "chat", tg), None);
        assert_eq!(
            RateLimits::for_bot(Platform::Telegram, " ").unwrap(),
            RateLimits::default()
        );
        for (bad, says) in [
            ("nope=1/1", "`nope=1/1`: telegram has no send limit `nope`"),
            ("telegram.bot=1/1", "the bot's platform is implied"),
            ("bot", "expected off, SCOPE=off"),
            ("bot=0/1", "`bot=0/1`: CALLS must be"),
        ] {
            let e = RateLimits::for_bot(Platform::Telegram, bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn a_429_pauses_the_scope_it_names_else_the_narrowest() {
        let l = Limit::every(1, 1, 1);
        let call = [Bucket::of("channel", "5", l), Bucket::bot("global", l)];
        assert_eq!(limited(&call, None).unwrap().scope, "channel");
        assert_eq!(limited(&call, Some("global")).unwrap().scope, "global");
        assert!(limited(&call, Some("other")).is_none());
        assert!(limited(&[], None).is_none());
    }

    #[test]
    fn a_guard_shuts_its_gate_until_a_tenth_of_its_budget_is_back() {
        let coord: Arc<dyn Coordinator> = Arc::new(botfleet_coord::MemoryHub::new().coordinator());
        let budget = || {
            Some(Bucket::fleet(
                "invalid",
                "budget",
                Limit::every(4000, 600, 4000),
            ))
        };
        let pace = Pace::new(coord.clone(), RateLimits::default());
        let g = pace.guard(Platform::Discord, budget()).unwrap();
        assert_eq!(g.shut_for, std::time::Duration::from_secs(60));
        assert!(g.gate.fleet && g.gate.of == "gate" && g.budget.of == "budget");
        // A changed budget: a tenth of 3 a 30 s comes back in 3 s; never under 2 s.
        let small = Pace::new(coord.clone(), "discord.invalid=3/30".parse().unwrap());
        let g = small.guard(Platform::Discord, budget()).unwrap();
        assert_eq!(g.shut_for, std::time::Duration::from_secs(3));
        assert_eq!(g.budget.limit.burst, 3);
        let tiny = Pace::new(coord.clone(), "discord.invalid=100/1".parse().unwrap());
        let g = tiny.guard(Platform::Discord, budget()).unwrap();
        assert_eq!(g.shut_for, std::time::Duration::from_secs(2));
        // Off: no guard; a platform without a budget: none.
        let off = Pace::new(coord, "discord.invalid=off".parse().unwrap());
        assert!(off.guard(Platform::Discord, budget()).is_none());
        assert!(pace.guard(Platform::Telegram, None).is_none());
    }

    #[test]
    fn keys_name_the_bot_not_its_slice_and_stay_valid() {
        let l = Limit::every(1, 1, 1);
        let bot = BotId::new("shop").unwrap();
        let slice = bot.slice(3);
        let chat = Bucket::of("chat", "-1001234", l);
        assert_eq!(
            key(Platform::Telegram, &bot, &chat),
            "send:telegram:shop:chat:-1001234"
        );
        assert_eq!(
            key(Platform::Discord, &slice, &Bucket::bot("global", l)),
            "send:discord:shop:global"
        );
        // A fleet-wide bucket: every bot's calls share it.
        let fleet = Bucket::fleet("invalid", "gate", l);
        assert_eq!(
            key(Platform::Discord, &bot, &fleet),
            "send:discord::invalid:gate"
        );
        // An odd id: hashed, one key per id.
        let odd = Bucket::of("chat", "a b{c}", l);
        let k = key(Platform::Slack, &bot, &odd);
        assert!(
            k.starts_with("send:slack:shop:chat:#") && !k.contains(' '),
            "{k}"
        );
        assert_ne!(
            k,
            key(Platform::Slack, &bot, &Bucket::of("chat", "a b{d}", l))
        );
        let long = Bucket::of("chat", &"9".repeat(300), l);
        assert!(key(Platform::Slack, &bot, &long).len() < 100);
    }
}
