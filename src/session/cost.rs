//! What `EXPLAIN COST` returns: a row per endpoint model the statement would ask
//! ([`crate::llm::estimate`]).

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Float64Array, RecordBatch, StringArray, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::dataframe::DataFrame;

use super::Session;
use crate::error::Result;
use crate::llm::estimate::Estimate;

impl Session {
    /// The estimates of a statement that would return `rows` rows: a row per endpoint model
    /// (rows reaching its calls, requests it would send, those answered already, tokens, cost
    /// and minutes at its limits), and a row `(all)` of the sums when there are several.
    pub fn cost_table(&self, estimates: &[Estimate], rows: u64) -> Result<DataFrame> {
        let mut shown: Vec<Estimate> = estimates.to_vec();
        // No endpoint model asked: a row that says so, with the statement's rows.
        if shown.is_empty() {
            shown.push(Estimate {
                model: "(none)".into(),
                rows: 0,
                requests: 0,
                cached: 0,
                prompt_tokens: 0,
                completion_tokens: 0,
                cost: 0.0,
                batch_cost: 0.0,
                batched: false,
                by_tokenizer: false,
                minutes: None,
                calibrated_on: 0,
            });
        }
        if shown.len() > 1 {
            let sum = |f: fn(&Estimate) -> u64| estimates.iter().map(f).sum::<u64>();
            shown.push(Estimate {
                model: "(all)".into(),
                rows: sum(|e| e.rows),
                requests: sum(|e| e.requests),
                cached: sum(|e| e.cached),
                prompt_tokens: sum(|e| e.prompt_tokens),
                completion_tokens: sum(|e| e.completion_tokens),
                cost: estimates.iter().map(|e| e.cost).sum(),
                batch_cost: estimates.iter().map(|e| e.batch_cost).sum(),
                batched: estimates.iter().all(|e| e.batched),
                by_tokenizer: false,
                // The models are asked at once: the slowest one's time.
                minutes: estimates.iter().filter_map(|e| e.minutes).reduce(f64::max),
                calibrated_on: estimates.iter().map(|e| e.calibrated_on).min().unwrap_or(0),
            });
        }
        let schema = Arc::new(Schema::new(vec![
            Field::new("model", DataType::Utf8, false),
            Field::new("rows", DataType::UInt64, false),
            Field::new("requests", DataType::UInt64, false),
            Field::new("answered_already", DataType::UInt64, false),
            Field::new("prompt_tokens_estimated", DataType::UInt64, false),
            Field::new("estimated_by", DataType::Utf8, false),
            Field::new("completion_tokens_at_most", DataType::UInt64, false),
            Field::new("cost_at_most", DataType::Float64, false),
            Field::new("batch_cost_at_most", DataType::Float64, false),
            Field::new("charged_at", DataType::Utf8, false),
            Field::new("minutes_at_limits", DataType::Float64, true),
            Field::new("statement_rows", DataType::UInt64, false),
        ]));
        let u = |f: fn(&Estimate) -> u64| -> ArrayRef {
            Arc::new(shown.iter().map(f).collect::<UInt64Array>())
        };
        let columns: Vec<ArrayRef> = vec![
            Arc::new(
                shown
                    .iter()
                    .map(|e| Some(e.model.as_str()))
                    .collect::<StringArray>(),
            ),
            u(|e| e.rows),
            u(|e| e.requests),
            u(|e| e.cached),
            u(|e| e.prompt_tokens),
            Arc::new(
                shown
                    .iter()
                    .map(|e| Some(estimated_by(e)))
                    .collect::<StringArray>(),
            ),
            u(|e| e.completion_tokens),
            Arc::new(shown.iter().map(|e| Some(e.cost)).collect::<Float64Array>()),
            Arc::new(
                shown
                    .iter()
                    .map(|e| Some(e.batch_cost))
                    .collect::<Float64Array>(),
            ),
            Arc::new(
                shown
                    .iter()
                    .map(|e| {
                        Some(match (e.model.as_str(), e.batched) {
                            ("(all)", _) => "each model's, above",
                            (_, true) => "batch prices",
                            (_, false) => "list prices",
                        })
                    })
                    .collect::<StringArray>(),
            ),
            Arc::new(shown.iter().map(|e| e.minutes).collect::<Float64Array>()),
            Arc::new(UInt64Array::from(vec![rows; shown.len()])),
        ];
        self.result(RecordBatch::try_new(schema, columns)?)
    }
}

/// How an estimate's prompt tokens were counted.
fn estimated_by(e: &Estimate) -> String {
    if e.model == "(all)" {
        return "each model's, above".to_string();
    }
    match (e.calibrated_on, e.by_tokenizer) {
        (0, _) if e.requests == 0 => "-".to_string(),
        (0, false) => "a token per 4 characters (no reply of the model's seen yet)".to_string(),
        (0, true) => {
            "the model's tokenizer without its chat template (no reply of the model's seen yet)"
                .to_string()
        }
        (n, by_tokenizer) => format!(
            "{}calibrated on {} of the model's replies",
            if by_tokenizer {
                "the model's tokenizer; "
            } else {
                ""
            },
            crate::message::thousands(n)
        ),
    }
}
