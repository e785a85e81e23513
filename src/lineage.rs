//! What a write keeps of where its rows came from: the models a plan calls, named in each
//! Parquet file it writes (`batchinfer.models`: name, sha256, source), and the columns a CSV
//! file cannot hold.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Schema};
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::logical_expr::{Expr, LogicalPlan};
use datafusion::scalar::ScalarValue;

use crate::error::{Error, Result};
use crate::model::{Model, ModelRegistry};

/// JSON naming each model a plan calls (by literal name) with its file's sha256, and for a
/// quantized model the quantization and the sha256 of the model it was made from.
pub fn models_used(registry: &ModelRegistry, plan: &LogicalPlan) -> Result<String> {
    let models: Vec<serde_json::Value> = models_in(registry, plan)
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
    Ok(serde_json::Value::Array(models).to_string())
}

/// The models a plan calls by literal name.
pub fn models_in(registry: &ModelRegistry, plan: &LogicalPlan) -> Vec<Arc<Model>> {
    let mut names = BTreeMap::new();
    // Nothing in the walk fails.
    let _ = plan.apply(|node| {
        node.apply_expressions(|expr| {
            expr.apply(|e| {
                if let Expr::ScalarFunction(f) = e
                    && matches!(f.name(), "predict" | "embed")
                    && let Some(Expr::Literal(
                        ScalarValue::Utf8(Some(n)) | ScalarValue::Utf8View(Some(n)),
                        _,
                    )) = f.args.first()
                {
                    names.insert(n.clone(), ());
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })
    });
    names.keys().filter_map(|n| registry.get(n).ok()).collect()
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
