//! What a write keeps of where its rows came from: the models a plan calls, named in each
//! Parquet file it writes (`batchinfer.models`: name, sha256, source), what its endpoint models
//! did for them (`batchinfer.llm_usage`: requests, tokens, cost, filled in at commit), and the
//! columns a CSV file cannot hold.

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Schema};
use datafusion::common::config::TableParquetOptions;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::logical_expr::{Expr, LogicalPlan};
use datafusion::scalar::ScalarValue;

use crate::error::{Error, Result};
use crate::llm::EndpointModel;
use crate::model::{Model, ModelRegistry};

/// JSON naming each model a plan calls (by literal name) with its file's sha256 (and that of the
/// files beside it that change what it computes, where it has any), and for a
/// quantized model the quantization and the sha256 of the model it was made from; an endpoint
/// model with its endpoint, its name there and its definition's sha256. A name of a warehouse
/// model's version (`churn`, `churn@2`, `churn@champion`) adds the model, the version and the
/// alias it was reached through; its source is where the version was registered from, `kept`
/// where its bytes are.
pub fn models_used(registry: &ModelRegistry, plan: &LogicalPlan) -> Result<String> {
    let names = called(plan);
    let mut models: Vec<serde_json::Value> = files_of(registry, &names)
        .iter()
        .map(|(name, m)| {
            let mut model = serde_json::json!({
                "name": name,
                "sha256": m.sha256,
                "source": m.source.to_string(),
            });
            if let Some(q) = &m.quantized {
                model["quantization"] = q.method.clone().into();
                model["quantized_from_sha256"] = q.from_sha256.clone().into();
            }
            if let Some(beside) = &m.beside_sha256 {
                model["beside_sha256"] = beside.clone().into();
            }
            picked(registry, name, &mut model);
            model
        })
        .collect();
    for (name, m) in endpoints_of(registry, &names) {
        let mut model = serde_json::json!({
            "name": name,
            "sha256": m.sha256,
            "source": m.endpoint.endpoint,
            "endpoint_model": m.endpoint.model,
        });
        picked(registry, &name, &mut model);
        models.push(model);
    }
    Ok(serde_json::Value::Array(models).to_string())
}

/// Adds to `model` what the name `name` picks of a warehouse model's versions, if it does.
fn picked(registry: &ModelRegistry, name: &str, model: &mut serde_json::Value) {
    let Some(picked) = registry.picked(name) else {
        return;
    };
    model["model"] = picked.model.into();
    model["version"] = picked.version.into();
    if let Some(alias) = picked.alias {
        model["alias"] = alias.into();
    }
    if model["source"] != serde_json::Value::String(picked.origin.clone()) {
        model["kept"] = model["source"].clone();
        model["source"] = picked.origin.into();
    }
}

/// The model files a plan calls by literal name.
pub fn models_in(registry: &ModelRegistry, plan: &LogicalPlan) -> Vec<Arc<Model>> {
    files_of(registry, &called(plan))
        .into_iter()
        .map(|(_, m)| m)
        .collect()
}

/// Each model a plan calls by literal name, file or endpoint, with what says which version it
/// is (a file's sha256 and that of the files beside it, [`Model::version`]; an endpoint model's
/// definition's).
pub fn versions_in(registry: &ModelRegistry, plan: &LogicalPlan) -> Vec<(String, String)> {
    let names = called(plan);
    let files = files_of(registry, &names)
        .into_iter()
        .map(|(name, m)| (name, m.version()));
    let endpoints = endpoints_of(registry, &names)
        .into_iter()
        .map(|(name, m)| (name, m.sha256.clone()));
    files.chain(endpoints).collect()
}

fn files_of(registry: &ModelRegistry, names: &BTreeSet<String>) -> Vec<(String, Arc<Model>)> {
    names
        .iter()
        .filter(|n| registry.endpoint_model(n).is_none())
        .filter_map(|n| Some((n.clone(), registry.get(n).ok()?)))
        .collect()
}

/// Whether `plan` calls an endpoint model.
pub fn calls_endpoints(registry: &ModelRegistry, plan: &LogicalPlan) -> bool {
    !endpoints_of(registry, &called(plan)).is_empty()
}

fn endpoints_of(
    registry: &ModelRegistry,
    names: &BTreeSet<String>,
) -> Vec<(String, Arc<EndpointModel>)> {
    names
        .iter()
        .filter_map(|n| Some((n.clone(), registry.endpoint_model(n)?)))
        .collect()
}

/// The names of the models a plan calls by literal name ([`crate::model::MODEL_FUNCTIONS`]).
fn called(plan: &LogicalPlan) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    // Nothing in the walk fails.
    // Subqueries too: a call in `WHERE x IN (SELECT generate(...))` is the plan's.
    let _ = plan.apply_with_subqueries(|node| {
        node.apply_expressions(|expr| {
            expr.apply(|e| {
                let (name, args) = match e {
                    Expr::ScalarFunction(f) => (f.name(), &f.args),
                    Expr::AggregateFunction(f) => (f.func.name(), &f.params.args),
                    _ => return Ok(TreeNodeRecursion::Continue),
                };
                if crate::model::MODEL_FUNCTIONS.contains(&name)
                    && let Some(Expr::Literal(
                        ScalarValue::Utf8(Some(n)) | ScalarValue::Utf8View(Some(n)),
                        _,
                    )) = args.first()
                {
                    names.insert(n.clone());
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })
    });
    names
}

/// Refuses a column CSV cannot hold (a struct, as `predict` returns for a model of several
/// outputs, or a list), saying how to write it.
pub fn csv_columns(schema: &Schema) -> Result<()> {
    for field in schema.fields() {
        let name = field.name();
        match field.data_type() {
            DataType::Struct(fields) => {
                let select: Vec<String> = fields
                    .iter()
                    .map(|f| format!("{name}['{}'] AS {}", f.name(), f.name()))
                    .collect();
                return Err(Error::Statement(format!(
                    "COPY ... STORED AS CSV: column '{name}' is a struct ({}), which CSV cannot \
                     hold; select its fields as columns ({}), or write Parquet or JSON",
                    fields
                        .iter()
                        .map(|f| format!("{}: {}", f.name(), f.data_type()))
                        .collect::<Vec<_>>()
                        .join(", "),
                    select.join(", ")
                )));
            }
            t if t.is_nested() => {
                return Err(Error::Statement(format!(
                    "COPY ... STORED AS CSV: column '{name}' is a {t}, which CSV cannot hold; \
                     select its elements as columns ({name}[1], {name}[2], ...), or write \
                     Parquet or JSON"
                )));
            }
            _ => {}
        }
    }
    Ok(())
}

/// The Parquet metadata key naming the models that produced a file's rows.
pub const MODELS_KEY: &str = "batchinfer.models";

/// The Parquet metadata key saying what endpoint models did for the statement (or the view
/// refresh's unit) that wrote a file: by model, requests (each try), retries, answers from the
/// cache, prompt and completion tokens, cost.
pub const LLM_USAGE_KEY: &str = "batchinfer.llm_usage";

/// What endpoint models do for a write, recorded in its files ([`LLM_USAGE_KEY`]) and its
/// commit: a placeholder of fixed length is written with each file, and filled when the write
/// commits ([`crate::storage::fill`]), once all is known.
#[derive(Debug, Clone)]
pub struct UsageRecord {
    /// The statement's ledger, where its spending is counted.
    ledger: crate::statement_context::Ledger,
    part: String,
    models: Vec<String>,
    placeholder: String,
    /// Whether a write's files are filled with it: where they are, its commit records it too.
    reserved: Arc<std::sync::atomic::AtomicBool>,
}

impl UsageRecord {
    /// The record of the endpoint models `plan` calls, for the statement `statement` (its
    /// `part`: a view refresh's unit); None where it calls none.
    pub fn of(
        registry: &ModelRegistry,
        plan: &LogicalPlan,
        statement: &crate::statement_context::StatementContext,
    ) -> Option<UsageRecord> {
        let models: Vec<String> = endpoints_of(registry, &called(plan))
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        if models.is_empty() {
            return None;
        }
        // Room for any counts: each model's name (escaped at worst six bytes a byte) and six
        // numbers with their keys.
        let room = 64 + models.iter().map(|m| 6 * m.len() + 256).sum::<usize>();
        let mut placeholder = format!(
            r#"{{"batchinfer":"counted when the write commits","id":"{}"}}"#,
            uuid::Uuid::new_v4().simple()
        );
        let room = room.max(placeholder.len());
        placeholder.push_str(&" ".repeat(room - placeholder.len()));
        Some(UsageRecord {
            ledger: statement.ledger.clone(),
            part: statement.part.clone(),
            models,
            placeholder,
            reserved: Arc::default(),
        })
    }

    /// `{"writer": {"requests": 20, "retries": 1, "cache_hits": 5, "prompt_tokens": 900,
    /// "completion_tokens": 300, "cost": 0.00032}}`: what each model did so far.
    pub fn json(&self) -> String {
        let usage = crate::llm::spend::usage(&self.ledger, Some(&self.part));
        let models: serde_json::Map<String, serde_json::Value> = self
            .models
            .iter()
            .map(|name| {
                let u = usage.get(name).copied().unwrap_or_default();
                let counts = serde_json::json!({
                    "requests": u.requests,
                    "retries": u.retries,
                    "cache_hits": u.cache_hits,
                    "prompt_tokens": u.prompt_tokens,
                    "completion_tokens": u.completion_tokens,
                    "cost": u.cost,
                    "proxy_answered": u.proxy_answered,
                });
                (name.clone(), counts)
            })
            .collect();
        serde_json::Value::Object(models).to_string()
    }

    /// Has `write`'s files, written with the Parquet options `parquet`, filled with
    /// [`Self::json`] at its commit: the placeholder to write in them as [`LLM_USAGE_KEY`], or
    /// None where they cannot be filled: written by a cluster's executors (which count their
    /// own), or encrypted (a footer that is, or is signed, cannot change).
    pub fn reserve(
        &self,
        write: &crate::storage::CommittedWrite,
        parquet: &TableParquetOptions,
    ) -> Option<String> {
        let crypto = &parquet.crypto;
        if crypto.file_encryption.is_some() || crypto.factory_id.is_some() {
            return None;
        }
        let record = self.clone();
        let fill = crate::storage::Fill::new(&self.placeholder, move || record.json().into_bytes());
        let filled = write.fill_at_commit(fill);
        self.reserved
            .store(filled, std::sync::atomic::Ordering::SeqCst);
        filled.then(|| self.placeholder.clone())
    }

    /// [`Self::json`] for a commit, where the write's files were filled with it (a cluster's
    /// executors count their own).
    pub fn committed(&self) -> Option<String> {
        self.reserved
            .load(std::sync::atomic::Ordering::SeqCst)
            .then(|| self.json())
    }
}
