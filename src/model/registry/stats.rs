//! What the registry's models did: rows, calls and time per model, loads, the rows that failed.

use super::*;

impl ModelRegistry {
    /// Per loaded model: (name, rows scored, nanoseconds inside ONNX Runtime, calls).
    pub fn stats_by_model(&self) -> Vec<(String, u64, u64, u64)> {
        self.read()
            .iter()
            .filter_map(|(name, e)| {
                let models = e.models();
                if models.is_empty() {
                    return None;
                }
                let sum = |f: fn(&Model) -> u64| models.iter().map(|m| f(m)).sum::<u64>();
                Some((
                    name.clone(),
                    sum(|m| m.stats.rows.load(Ordering::Relaxed)),
                    sum(|m| m.stats.nanos.load(Ordering::Relaxed)),
                    sum(|m| m.stats.calls.load(Ordering::Relaxed)),
                ))
            })
            .collect()
    }

    /// Rows scored, nanoseconds inside ONNX Runtime, calls, and nanoseconds during which a
    /// model was running, summed over the loaded models.
    pub fn totals(&self) -> Totals {
        let mut totals = Totals::default();
        for model in self.read().values().flat_map(|e| e.models()) {
            totals.rows += model.stats.rows.load(Ordering::Relaxed);
            totals.nanos += model.stats.nanos.load(Ordering::Relaxed);
            totals.calls += model.stats.calls.load(Ordering::Relaxed);
            totals.occupied_nanos += model.occupied_nanos();
        }
        totals
    }

    /// How many times a model file was loaded (each model once, unless re-registered).
    pub fn loads(&self) -> u64 {
        self.loads.load(Ordering::Relaxed)
    }
}

/// What the loaded models have done, summed: see [`ModelRegistry::totals`].
#[derive(Debug, Default, Clone, Copy)]
pub struct Totals {
    pub rows: u64,
    /// Time inside ONNX Runtime, summed over calls running at once.
    pub nanos: u64,
    pub calls: u64,
    /// Time during which at least one call of a model ran (`nanos / occupied_nanos`: how many
    /// ran at once, on average).
    pub occupied_nanos: u64,
}

impl Totals {
    /// The work done since `before`. A model dropped or replaced meanwhile takes its counts
    /// with it.
    pub fn since(&self, before: &Totals) -> Totals {
        Totals {
            rows: self.rows.saturating_sub(before.rows),
            nanos: self.nanos.saturating_sub(before.nanos),
            calls: self.calls.saturating_sub(before.calls),
            occupied_nanos: self.occupied_nanos.saturating_sub(before.occupied_nanos),
        }
    }
}
