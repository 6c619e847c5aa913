//! Mutated wire payloads, for the parsers' property tests: a platform's inbound parser is fed
//! thousands of variants of each event kind's real shape (keys removed, values of the wrong
//! type, huge or odd strings, numbers at the edges) and must read each or count it malformed,
//! never panic.

use serde_json::{json, Value};

use crate::SeededRng;

/// `n` variants of `base`, drawn from `seed` (the same on every machine): each a copy with one
/// to four mutations at random places.
pub fn mutations(base: &Value, seed: u64, n: usize) -> Vec<Value> {
    let mut rng = SeededRng::new(seed);
    (0..n)
        .map(|_| {
            let mut v = base.clone();
            for _ in 0..=rng.below(4) {
                mutate(&mut v, &mut rng);
            }
            v
        })
        .collect()
}

/// One mutation somewhere in `v`: descends into a random member or element (more often than
/// not), then removes it or replaces it.
fn mutate(v: &mut Value, rng: &mut SeededRng) {
    match v {
        Value::Object(m) if !m.is_empty() && rng.chance(750) => {
            let i = usize::try_from(rng.below(m.len() as u64)).unwrap_or(0);
            let key = m.keys().nth(i).cloned().unwrap_or_default();
            if rng.chance(200) {
                m.remove(&key);
            } else if let Some(child) = m.get_mut(&key) {
                mutate(child, rng);
            }
        }
        Value::Array(a) if !a.is_empty() && rng.chance(750) => {
            let i = usize::try_from(rng.below(a.len() as u64)).unwrap_or(0);
            if rng.chance(200) {
                a.remove(i);
            } else {
                mutate(&mut a[i], rng);
            }
        }
        Value::String(s) if rng.chance(300) => {
            let edits = [
                "/", "@", "{", "}", " ", "\n", "\u{0}", "é", "😀", "%", "+", ".",
            ];
            let e = edits[usize::try_from(rng.below(edits.len() as u64)).unwrap_or(0)];
            if rng.chance(500) {
                s.insert_str(0, e);
            } else {
                s.push_str(e);
            }
        }
        _ => *v = odd_value(rng),
    }
}

/// A value a parser may not expect where it finds it.
fn odd_value(rng: &mut SeededRng) -> Value {
    match rng.below(16) {
        0 => Value::Null,
        1 => json!(true),
        2 => json!(0),
        3 => json!(-1),
        4 => json!(i64::MAX),
        5 => json!(u64::MAX),
        6 => json!(1.5e300),
        7 => json!(""),
        8 => json!("x".repeat(10_000)),
        9 => json!("/start@bot\u{0}😀 é"),
        10 => json!({}),
        11 => json!([]),
        12 => json!([[[[[[[[[[1]]]]]]]]]]),
        13 => json!({"id": "1", "chat": {"id": 1}}),
        14 => json!("1700000000.000100"),
        _ => json!(rng.next_u64().to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_are_many_different_and_replayable() {
        let base = json!({"a": {"b": [1, "two", {"c": null}]}, "d": "text"});
        let one = mutations(&base, 7, 500);
        assert_eq!(
            one,
            mutations(&base, 7, 500),
            "the same seed, the same cases"
        );
        let distinct: std::collections::HashSet<String> =
            one.iter().map(Value::to_string).collect();
        assert!(distinct.len() > 200, "only {} distinct", distinct.len());
        assert!(
            one.iter()
                .any(|v| v["a"]["b"].as_array().is_some_and(|a| a.len() < 3)),
            "removals happen"
        );
    }
}
