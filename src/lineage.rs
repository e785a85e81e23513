//! What a write keeps of where its rows came from: the models a plan calls, named in each
//! Parquet file it writes (`batchinfer.models`: name, sha256, source), and the columns a CSV
//! file cannot hold.

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Schema};
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::logical_expr::{Expr, LogicalPlan};
use datafusion::scalar::ScalarValue;

use crate::error::{Error, Result};
use crate::llm::EndpointModel;
use crate::model::{Model, ModelRegistry};

/// JSON naming each model a plan calls (by literal name) with its file's sha256, and for a
/// quantized model the quantization and the sha256 of the model it was made from; an endpoint
/// model with its endpoint, its name there and its definition's sha256.
pub fn models_used(registry: &ModelRegistry, plan: &LogicalPlan) -> Result<String> {
    let names = called(plan);
    let mut models: Vec<serde_json::Value> = files_of(registry, &names)
        .iter()
        .map(|m| {
            let mut model = serde_json::json!({
                "name": m.name,
                "sha256": m.sha256,
                "source": m.source.to_string(),
            });
            if let Some(q) = &m.quantized {
                model["quantization"] = q.method.clone().into();
                model["quantized_from_sha256"] = q.from_sha256.clone().into();
            }
            model
        })
        .collect();
    for m in endpoints_of(registry, &names) {
        models.push(serde_json::json!({
            "name": m.name,
            "sha256": m.sha256,
            "source": m.endpoint.endpoint,
            "endpoint_model": m.endpoint.model,
        }));
    }
    Ok(serde_json::Value::Array(models).to_string())
}

/// The model files a plan calls by literal name.
pub fn models_in(registry: &ModelRegistry, plan: &LogicalPlan) -> Vec<Arc<Model>> {
    files_of(registry, &called(plan))
}

/// Each model a plan calls by literal name, file or endpoint, with the sha256 that says which
/// version it is (a file's, an endpoint model's definition's).
pub fn versions_in(registry: &ModelRegistry, plan: &LogicalPlan) -> Vec<(String, String)> {
    let names = called(plan);
    let files = files_of(registry, &names)
        .into_iter()
        .map(|m| (m.name.clone(), m.sha256.clone()));
    let endpoints = endpoints_of(registry, &names)
        .into_iter()
        .map(|m| (m.name.clone(), m.sha256.clone()));
    files.chain(endpoints).collect()
}

fn files_of(registry: &ModelRegistry, names: &BTreeSet<String>) -> Vec<Arc<Model>> {
    names
        .iter()
        .filter(|n| registry.endpoint_model(n).is_none())
        .filter_map(|n| registry.get(n).ok())
        .collect()
}

fn endpoints_of(registry: &ModelRegistry, names: &BTreeSet<String>) -> Vec<Arc<EndpointModel>> {
    names
        .iter()
        .filter_map(|n| registry.endpoint_model(n))
        .collect()
}

/// The names of the models a plan calls by literal name (`predict`, `embed`, `generate`).
fn called(plan: &LogicalPlan) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    // Nothing in the walk fails.
    let _ = plan.apply(|node| {
        node.apply_expressions(|expr| {
            expr.apply(|e| {
                if let Expr::ScalarFunction(f) = e
                    && matches!(f.name(), "predict" | "embed" | "generate")
                    && let Some(Expr::Literal(
                        ScalarValue::Utf8(Some(n)) | ScalarValue::Utf8View(Some(n)),
                        _,
                    )) = f.args.first()
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
