//! Cascades: a local model (the proxy) answers the rows of `ai_filter` and `ai_classify` it is
//! sure of, and the endpoint model only the rest.
//!
//! The proxy is a local text model: it scores a row by the similarity of the row's text to the
//! question (`ai_filter`), or picks the label whose text is likeliest and scores the margin over
//! the next (`ai_classify`). A statement first sends a sample of its rows to the endpoint model
//! (chosen by a hash of each row's prompt, so that the same rows are the sample again and their
//! answers come from the cache), then sets thresholds on the proxy's score so that, on the
//! sample, the proxy's answers above them agree with the model's at the target rate: the lower
//! bound of the agreement's one-sided 95% Wilson interval is at least the target, for each kind
//! of answer the proxy gives (yes, no, a label). Rows past the thresholds get the proxy's
//! answer; the rest are sent. Rows the cache already answers are never the proxy's: they cost
//! nothing.
//!
//! The thresholds are the statement's: each statement sets its own on the first of its batches
//! that fill the sample; a materialized view keeps those its first refresh set for the next
//! ([`crate::udf`]'s cascade, in the folder the refresh names).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// The one-sided 95% normal quantile of the agreement's lower bound.
const Z: f64 = 1.645;

/// What the proxy says of a row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Says {
    /// `ai_filter`: the similarity of the row to the question.
    Score(f64),
    /// `ai_classify`: the likeliest label and its margin over the next.
    Label { label: usize, margin: f64 },
}

/// What the model answered a row of the sample: yes (1) or no (0), or a label's index.
pub type Answer = usize;

/// Thresholds set on a sample, and how the proxy did on it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Thresholds {
    /// `ai_filter`: yes at a score at or above this one.
    pub yes: Option<f64>,
    /// `ai_filter`: no at a score at or below this one.
    pub no: Option<f64>,
    /// `ai_classify`: the proxy's label at a margin at or above this one.
    pub margin: Option<f64>,
    /// The sample's rows with an answer of the model's.
    pub sample: u64,
    /// Of those, the ones past the thresholds, and the ones where the proxy agreed.
    pub sure: u64,
    pub agreed: u64,
    /// The agreement's rate and lower bound in each region: (yes, no) for a filter; the label
    /// region's in `yes` for a classification.
    pub yes_rate: f64,
    pub no_rate: f64,
}

impl Thresholds {
    /// Whether these can be thresholds [`fit_filter`] or [`fit_classify`] set (a file edited by
    /// hand is not trusted): scores of a cosine similarity, a margin of two, a sample whose
    /// counts add up, and rates of agreement over one half where the proxy answers.
    pub fn usable(&self) -> bool {
        let similarity =
            |t: Option<f64>| t.is_none_or(|t| t.is_finite() && (-1.0..=1.0).contains(&t));
        let rate = |t: Option<f64>, r: f64| t.is_none() || (r.is_finite() && r > 0.5 && r <= 1.0);
        let kinds = match self.margin {
            Some(m) => {
                self.yes.is_none()
                    && self.no.is_none()
                    && m.is_finite()
                    && (0.0..=2.0).contains(&m)
                    && rate(self.margin, self.yes_rate)
            }
            None => {
                similarity(self.yes)
                    && similarity(self.no)
                    && rate(self.yes, self.yes_rate)
                    && rate(self.no, self.no_rate)
            }
        };
        kinds && self.agreed <= self.sure && self.sure <= self.sample && self.sample >= 20
    }

    /// The proxy's answer for a row it says `says` of, if it is sure of it, with the rate at
    /// which its answers there agreed with the model's on the sample.
    pub fn answer(&self, says: Says) -> Option<(Answer, f64)> {
        match says {
            Says::Score(s) => {
                let yes = self.yes.is_some_and(|t| s >= t);
                let no = self.no.is_some_and(|t| s <= t);
                match (yes, no) {
                    (true, false) => Some((1, self.yes_rate)),
                    (false, true) => Some((0, self.no_rate)),
                    _ => None,
                }
            }
            Says::Label { label, margin } => self
                .margin
                .filter(|m| margin >= *m)
                .map(|_| (label, self.yes_rate)),
        }
    }
}

/// The lower bound of the one-sided 95% Wilson interval of `agreed` in `n`.
pub fn wilson_lower(agreed: u64, n: u64) -> f64 {
    if n == 0 {
        return 0.0;
    }
    let n = n as f64;
    let p = agreed as f64 / n;
    let z2 = Z * Z;
    let centre = p + z2 / (2.0 * n);
    let spread = Z * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    ((centre - spread) / (1.0 + z2 / n)).max(0.0)
}

/// The widest region of the sample, by threshold, whose agreement's lower bound reaches
/// `target`: rows are `(score, agrees)` in the order the threshold widens the region (the
/// region is each prefix); the threshold is the score of the prefix's last row, with the
/// prefix's agreement rate.
fn widest(rows: &[(f64, bool)], target: f64) -> Option<(f64, f64)> {
    let mut agreed = 0u64;
    let mut best = None;
    for (i, (score, agrees)) in rows.iter().enumerate() {
        agreed += u64::from(*agrees);
        let n = i as u64 + 1;
        // A threshold falls between distinct scores only.
        let last_of_its_score = rows.get(i + 1).is_none_or(|next| next.0 != *score);
        if last_of_its_score && wilson_lower(agreed, n) >= target {
            best = Some((*score, agreed as f64 / n as f64));
        }
    }
    best
}

/// `ai_filter`'s thresholds on a sample of (the proxy's score, the model's yes).
pub fn fit_filter(sample: &[(f64, bool)], target: f64) -> Thresholds {
    let mut by_score: Vec<(f64, bool)> = sample.to_vec();
    by_score.sort_by(|a, b| b.0.total_cmp(&a.0));
    let yes = widest(&by_score, target);
    let low: Vec<(f64, bool)> = by_score.iter().rev().map(|(s, yes)| (*s, !*yes)).collect();
    let no = widest(&low, target);
    let mut fitted = Thresholds {
        yes: yes.map(|y| y.0),
        no: no.map(|n| n.0),
        margin: None,
        sample: sample.len() as u64,
        sure: 0,
        agreed: 0,
        yes_rate: yes.map_or(0.0, |y| y.1),
        no_rate: no.map_or(0.0, |n| n.1),
    };
    for (score, model_yes) in sample {
        if let Some((answer, _)) = fitted.answer(Says::Score(*score)) {
            fitted.sure += 1;
            fitted.agreed += u64::from((answer == 1) == *model_yes);
        }
    }
    fitted
}

/// `ai_classify`'s threshold on a sample of (the proxy's label and margin, the model's label).
pub fn fit_classify(sample: &[(usize, f64, usize)], target: f64) -> Thresholds {
    let mut by_margin: Vec<(f64, bool)> = sample
        .iter()
        .map(|(label, margin, model)| (*margin, label == model))
        .collect();
    by_margin.sort_by(|a, b| b.0.total_cmp(&a.0));
    let region = widest(&by_margin, target);
    let mut fitted = Thresholds {
        yes: None,
        no: None,
        margin: region.map(|r| r.0),
        sample: sample.len() as u64,
        sure: 0,
        agreed: 0,
        yes_rate: region.map_or(0.0, |r| r.1),
        no_rate: 0.0,
    };
    for (label, margin, model) in sample {
        if fitted
            .answer(Says::Label {
                label: *label,
                margin: *margin,
            })
            .is_some()
        {
            fitted.sure += 1;
            fitted.agreed += u64::from(label == model);
        }
    }
    fitted
}

/// One cascade of a statement (a model, a question or labels, a proxy): its sample while it
/// fills, then its thresholds.
#[derive(Debug, Default)]
pub struct Fit {
    /// The requests (by cache key) taken into the sample: each counts once.
    pub seen: std::collections::HashSet<String>,
    /// The sample's rows the model answered: what the proxy said, and the model's answer.
    pub observed: Vec<(Says, Answer)>,
    pub thresholds: Option<Thresholds>,
}

impl Fit {
    /// Sets the thresholds on the sample observed.
    pub fn set(&mut self, target: f64) -> &Thresholds {
        let scores: Vec<(f64, bool)> = self
            .observed
            .iter()
            .filter_map(|(says, answer)| match says {
                Says::Score(s) => Some((*s, *answer == 1)),
                Says::Label { .. } => None,
            })
            .collect();
        let labels: Vec<(usize, f64, usize)> = self
            .observed
            .iter()
            .filter_map(|(says, answer)| match says {
                Says::Label { label, margin } => Some((*label, *margin, *answer)),
                Says::Score(_) => None,
            })
            .collect();
        let fitted = if labels.is_empty() {
            fit_filter(&scores, target)
        } else {
            fit_classify(&labels, target)
        };
        self.thresholds.insert(fitted)
    }
}

/// A statement's cascades, by what each asks (kept in its ledger).
#[derive(Debug, Default)]
pub struct Cascades {
    by: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Fit>>>>,
}

impl Cascades {
    /// The cascade `key` names (made the first time).
    pub fn fit(&self, key: &str) -> Arc<tokio::sync::Mutex<Fit>> {
        self.by.lock().entry(key.to_string()).or_default().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wilson_bound_is_its_formula() {
        // 95 of 100 agree: 0.95 with a one-sided 95% lower bound of about 0.9;
        let b = wilson_lower(95, 100);
        assert!((b - 0.9003).abs() < 1e-3, "{b}");
        assert_eq!(wilson_lower(0, 0), 0.0);
        // all of 25 agreeing bounds the rate at 0.9; all of 20 does not.
        assert!(wilson_lower(25, 25) >= 0.9 && wilson_lower(20, 20) < 0.9);
    }

    #[test]
    fn a_filter_answers_where_the_sample_agrees_and_sends_the_middle() {
        // Scores 0..100: the model says yes above 70, no below 30, and either between.
        let sample: Vec<(f64, bool)> = (0..100)
            .map(|i| {
                (
                    i as f64,
                    if (30..70).contains(&i) {
                        i % 2 == 0
                    } else {
                        i >= 70
                    },
                )
            })
            .collect();
        let t = fit_filter(&sample, 0.9);
        let (yes, no) = (t.yes.unwrap(), t.no.unwrap());
        assert!(
            (60.0..=70.0).contains(&yes) && (29.0..=40.0).contains(&no),
            "{t:?}"
        );
        assert_eq!(t.answer(Says::Score(95.0)).map(|a| a.0), Some(1));
        assert_eq!(t.answer(Says::Score(5.0)).map(|a| a.0), Some(0));
        assert_eq!(t.answer(Says::Score(50.0)), None);
        assert!(
            t.sure >= 55 && t.agreed as f64 / t.sure as f64 >= 0.9,
            "{t:?}"
        );
        // A proxy that says nothing of the answers is sure of nothing.
        let noise: Vec<(f64, bool)> = (0..100).map(|i| (i as f64, i % 2 == 0)).collect();
        let t = fit_filter(&noise, 0.9);
        assert_eq!((t.yes, t.no, t.sure), (None, None, 0), "{t:?}");
    }

    #[test]
    fn a_classification_answers_above_the_margin_where_labels_agree() {
        // Margins 0..1: the proxy's label is the model's above 0.5, wrong one time in two below.
        let sample: Vec<(usize, f64, usize)> = (0..100)
            .map(|i| {
                let margin = i as f64 / 100.0;
                let model = if i >= 50 || i % 2 == 0 { 1 } else { 2 };
                (1, margin, model)
            })
            .collect();
        let t = fit_classify(&sample, 0.9);
        let m = t.margin.unwrap();
        assert!((0.3..=0.5).contains(&m), "{t:?}");
        assert_eq!(
            t.answer(Says::Label {
                label: 1,
                margin: 0.9
            })
            .map(|a| a.0),
            Some(1)
        );
        assert_eq!(
            t.answer(Says::Label {
                label: 1,
                margin: 0.1
            }),
            None
        );
    }
}
