//! What an endpoint model's server counts of its prompts against batchinfer's estimate (a token
//! per four characters of the messages): each answered chat request adds its pair, and an
//! estimate (`EXPLAIN COST`, `max_cost` before a statement runs) is corrected by the line that
//! fits the pairs best, once there are [`LEAST`] of them. The chat template a server wraps
//! around each prompt (a system message, role markers) and its tokenizer's rate are what the
//! correction learns. The pairs' sums are kept in the warehouse beside the cache
//! (`llm-calibration/`, by the endpoint and the endpoint's name of the model), so that a later
//! process's estimate starts from them: each write adds this process's new pairs to what the
//! file holds then (two processes writing at the same moment can lose one's latest pairs).
//! A count far off its estimate (more than four times it and 4,096 tokens) is not learned
//! from, and no correction goes further.

use std::sync::Arc;

use object_store::ObjectStore;
use object_store::path::Path;
use serde::{Deserialize, Serialize};

/// The pairs an estimate needs before it is corrected.
pub const LEAST: u64 = 10;

/// The most a server's count may be past its estimate's, times and plus: a pair further off
/// (a server that says nonsense of its usage) is not learned from, and no correction goes past
/// it.
const TIMES: f64 = 4.0;
const PLUS: f64 = 4096.0;

/// Whether the server's count `reported` of a prompt estimated at `estimated` is one to learn
/// from: within [`TIMES`] and [`PLUS`] of the estimate either way.
pub fn plausible(estimated: u64, reported: u64) -> bool {
    let (x, y) = (estimated as f64, reported as f64);
    y <= TIMES * x + PLUS && x <= TIMES * y + PLUS
}

/// The warehouse's folder of calibrations.
pub const FOLDER: &str = "llm-calibration";

/// The sums of the pairs (estimated, reported) of a model's prompts.
#[derive(Debug, Default, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    pub n: u64,
    x: f64,
    y: f64,
    xx: f64,
    xy: f64,
}

impl Calibration {
    /// Adds a prompt estimated at `estimated` tokens that the server counted as `reported`
    /// (where [`plausible`]).
    pub fn add(&mut self, estimated: u64, reported: u64) {
        if !plausible(estimated, reported) {
            return;
        }
        let (x, y) = (estimated as f64, reported as f64);
        self.n += 1;
        self.x += x;
        self.y += y;
        self.xx += x * x;
        self.xy += x * y;
    }

    /// The pairs of `self` not in `earlier` (a part of them).
    pub fn since(&self, earlier: &Calibration) -> Calibration {
        Calibration {
            n: self.n.saturating_sub(earlier.n),
            x: (self.x - earlier.x).max(0.0),
            y: (self.y - earlier.y).max(0.0),
            xx: (self.xx - earlier.xx).max(0.0),
            xy: (self.xy - earlier.xy).max(0.0),
        }
    }

    /// Both sets of pairs.
    pub fn merged(&self, other: &Calibration) -> Calibration {
        Calibration {
            n: self.n.saturating_add(other.n),
            x: self.x + other.x,
            y: self.y + other.y,
            xx: self.xx + other.xx,
            xy: self.xy + other.xy,
        }
    }

    /// The tokens a prompt estimated at `estimated` is likely to count: the least-squares line
    /// through the pairs (its slope within 0.25 and 4; where the prompts were all of about one
    /// length, their mean difference added); None under [`LEAST`] pairs.
    pub fn tokens(&self, estimated: u64) -> Option<u64> {
        if self.n < LEAST || !self.usable() {
            return None;
        }
        let n = self.n as f64;
        let (mx, my) = (self.x / n, self.y / n);
        let variance = self.xx / n - mx * mx;
        let slope = if variance > 1.0 {
            ((self.xy / n - mx * my) / variance).clamp(0.25, 4.0)
        } else {
            1.0
        };
        let intercept = my - slope * mx;
        let x = estimated as f64;
        let tokens = (intercept + slope * x).clamp((x - PLUS) / TIMES, TIMES * x + PLUS);
        Some(tokens.round().max(0.0) as u64)
    }

    /// Whether the sums can be pairs [`Calibration::add`] learned from (a file edited by hand
    /// is not trusted).
    fn usable(&self) -> bool {
        let n = self.n as f64;
        [self.x, self.y, self.xx, self.xy]
            .iter()
            .all(|v| v.is_finite() && *v >= 0.0)
            && self.y <= TIMES * self.x + PLUS * n
            && self.x <= TIMES * self.y + PLUS * n
    }
}

/// Where a warehouse keeps the calibration of one model.
#[derive(Debug, Clone)]
pub struct Kept {
    store: Arc<dyn ObjectStore>,
    path: Path,
}

impl Kept {
    /// The calibration of the model `model` at `endpoint`, in the folder beside the cache
    /// `cache_prefix` (the warehouse's `llm-cache`) of `store`.
    pub fn beside(
        store: Arc<dyn ObjectStore>,
        cache_prefix: &Path,
        endpoint: &str,
        model: &str,
    ) -> Kept {
        let (folder, name) = super::cache::beside(cache_prefix, FOLDER, endpoint, model);
        Kept {
            store,
            path: folder.join(format!("{name}.json").as_str()),
        }
    }

    /// The calibration kept (none where there is none, or it cannot be read).
    pub async fn read(&self) -> Calibration {
        crate::storage::read_small_json(&self.store, &self.path, 4096)
            .await
            .filter(Calibration::usable)
            .unwrap_or_default()
    }

    /// Keeps `calibration`; whether the store took it (one that refuses leaves the one kept
    /// before).
    pub async fn write(&self, calibration: &Calibration) -> bool {
        crate::storage::write_small_json(&self.store, &self.path, calibration).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_template_of_fixed_size_and_a_tokenizer_rate_are_learned() {
        let mut c = Calibration::default();
        // The server counts 30 tokens of template and 1.2 tokens per estimated token.
        for x in (10..200).step_by(10) {
            c.add(x, (30.0 + 1.2 * x as f64) as u64);
        }
        let t = c.tokens(100).unwrap();
        assert!((149..=151).contains(&t), "{t}");
        // Prompts all of one length: their mean difference is added.
        let mut same = Calibration::default();
        for _ in 0..20 {
            same.add(15, 42);
        }
        assert_eq!(same.tokens(15), Some(42));
        assert_eq!(same.tokens(25), Some(52));
        assert_eq!(Calibration::default().tokens(10), None);
        // A server that says nonsense of its usage is not learned from.
        let mut wild = same;
        wild.add(15, 1 << 40);
        assert_eq!(wild, same);
        assert_eq!(wild.since(&Calibration::default()), same);
    }
}
