//! `predict_table('model', 'table or path')`: every column of a table plus one column per model
//! output, each model input bound to the column of the same name (case-insensitive), as
//! BigQuery's `ML.PREDICT` and T-SQL's `PREDICT` do.
//!
//! ```sql
//! SELECT id, label, probabilities FROM predict_table('churn', 'data/sample/customers.parquet');
//! ```

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{ScalarValue, TableReference, plan_datafusion_err, plan_err};
use datafusion::datasource::{ViewTable, provider_as_source};
use datafusion::error::Result;
use datafusion::execution::context::SessionState;
use datafusion::functions::core::expr_fn::get_field;
use datafusion::logical_expr::{Expr, LogicalPlanBuilder, col, lit};
use parking_lot::Mutex;

use crate::model::ModelRegistry;

/// The `predict_table` table function over a [`ModelRegistry`].
#[derive(Debug)]
pub struct PredictTableFunction {
    pub registry: Arc<ModelRegistry>,
    pub tables: Arc<ResolvedTables>,
}

/// Tables a statement's `predict_table` calls name, resolved before the statement is planned:
/// a table function is called synchronously, and finding a path's files (in S3: requests) is
/// asynchronous work that planning should not block on ([`Engine`](crate::Engine) fills it).
#[derive(Debug, Default)]
pub struct ResolvedTables(Mutex<HashMap<String, Arc<dyn TableProvider>>>);

impl ResolvedTables {
    /// Keeps `provider` as what `table` names, until it is resolved again.
    pub fn insert(&self, table: &str, provider: Arc<dyn TableProvider>) {
        self.0.lock().insert(table.to_string(), provider);
    }

    fn get(&self, table: &str) -> Option<Arc<dyn TableProvider>> {
        self.0.lock().get(table).cloned()
    }
}

/// The table (second) argument of each `predict_table` call in `statement` that is a string
/// literal: what [`ResolvedTables`] should hold before it is planned.
pub fn tables_named(statement: &datafusion::sql::parser::Statement) -> Vec<String> {
    crate::statements::table_function_literals(statement, "predict_table", 1..usize::MAX)
}

/// Whether `predict` of `model` is one value (one output, no labels) rather than a struct.
fn names_one_value(model: &crate::model::Model) -> bool {
    model.signature.outputs.len() == 1 && model.labels.is_none()
}

fn literal(expr: &Expr, what: &str) -> Result<String> {
    match expr {
        Expr::Literal(
            ScalarValue::Utf8(Some(s))
            | ScalarValue::Utf8View(Some(s))
            | ScalarValue::LargeUtf8(Some(s)),
            _,
        ) => Ok(s.clone()),
        _ => plan_err!(
            "predict_table: the {what} must be a string literal, as in predict_table('churn', 'customers')"
        ),
    }
}

fn resolve(
    session: &dyn Session,
    table: &str,
    resolved: &ResolvedTables,
) -> Result<Arc<dyn TableProvider>> {
    if let Some(provider) = resolved.get(table) {
        return Ok(provider);
    }
    let state = session
        .as_any()
        .downcast_ref::<SessionState>()
        .ok_or_else(|| plan_datafusion_err!("predict_table needs a DataFusion session"))?;
    let reference = TableReference::bare(table);
    let schema = state.schema_for_ref(reference.clone())?;
    wait_for(schema.table(reference.table()))??
        .ok_or_else(|| plan_datafusion_err!("predict_table: no table or file '{table}'"))
}

/// Waits for a catalog look-up that was not resolved beforehand (planning outside
/// [`Engine::run`](crate::Engine::run)). A path in S3 is read over the network, and a runtime has
/// to drive the request while this thread waits: on a multi-threaded runtime the engine's own,
/// which this thread lets run; otherwise one on a thread of its own.
fn wait_for<F>(lookup: F) -> Result<F::Output>
where
    F: std::future::Future + Send,
    F::Output: Send,
{
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == RuntimeFlavor::MultiThread => {
            Ok(tokio::task::block_in_place(|| handle.block_on(lookup)))
        }
        _ => Ok(crate::storage::block_on_io(lookup)?),
    }
}

impl TableFunctionImpl for PredictTableFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let [model_arg, table_arg] = args.exprs() else {
            return plan_err!(
                "predict_table takes two arguments: predict_table('model', 'table or path')"
            );
        };
        let (name, table) = (
            literal(model_arg, "model name")?,
            literal(table_arg, "table")?,
        );
        let model = self.registry.get(&name)?;
        let provider = resolve(args.session(), &table, &self.tables)?;
        let schema = provider.schema();
        let mut inputs = Vec::new();
        for input in &model.signature.inputs {
            let Some(field) = schema
                .fields()
                .iter()
                .find(|f| f.name().eq_ignore_ascii_case(&input.name))
            else {
                let columns: Vec<&str> =
                    schema.fields().iter().map(|f| f.name().as_str()).collect();
                return plan_err!(
                    "predict_table: model '{name}' has an input '{}' ({input}), and table '{table}' has no column of that name; its columns are: {}",
                    input.name,
                    columns.join(", ")
                );
            };
            inputs.push(col(format!("\"{}\"", field.name())));
        }
        let predict = args
            .session()
            .scalar_functions()
            .get("predict")
            .cloned()
            .ok_or_else(|| plan_datafusion_err!("predict is not registered"))?;
        let mut call_args = vec![lit(name.clone())];
        call_args.extend(inputs);
        let call = predict.call(call_args);
        let mut exprs: Vec<Expr> = schema
            .fields()
            .iter()
            .map(|f| col(format!("\"{}\"", f.name())))
            .collect();
        let taken = |n: &str| {
            schema
                .fields()
                .iter()
                .any(|f| f.name().eq_ignore_ascii_case(n))
        };
        let outputs = &model.signature.outputs;
        let mut names: Vec<&str> = outputs.iter().map(|o| o.name.as_str()).collect();
        // A classifier whose labels are named: its top class and score too.
        if model.labels.is_some() {
            names.extend(crate::model::labels::field_names(&model.signature));
        }
        for name in names {
            let value = if names_one_value(&model) {
                call.clone()
            } else {
                get_field(call.clone(), name)
            };
            let column = if taken(name) {
                format!("predicted_{name}")
            } else {
                name.to_string()
            };
            exprs.push(value.alias(column));
        }
        let plan = LogicalPlanBuilder::scan(table.as_str(), provider_as_source(provider), None)?
            .project(exprs)?
            .build()?;
        Ok(Arc::new(ViewTable::new(plan, None)))
    }
}
