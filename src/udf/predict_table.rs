//! `predict_table('model', 'table or path')`: every column of a table plus one column per model
//! output, each model input bound to the column of the same name (case-insensitive), as
//! BigQuery's `ML.PREDICT` and T-SQL's `PREDICT` do.
//!
//! ```sql
//! SELECT id, label, probabilities FROM predict_table('churn', 'data/sample/customers.parquet');
//! ```

use std::sync::Arc;

use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{ScalarValue, TableReference, plan_datafusion_err, plan_err};
use datafusion::datasource::{ViewTable, provider_as_source};
use datafusion::error::Result;
use datafusion::execution::context::SessionState;
use datafusion::functions::core::expr_fn::get_field;
use datafusion::logical_expr::{Expr, LogicalPlanBuilder, col, lit};

use crate::model::ModelRegistry;

/// The `predict_table` table function over a [`ModelRegistry`].
#[derive(Debug)]
pub struct PredictTableFunction {
    pub registry: Arc<ModelRegistry>,
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

fn resolve(session: &dyn Session, table: &str) -> Result<Arc<dyn TableProvider>> {
    let state = session
        .as_any()
        .downcast_ref::<SessionState>()
        .ok_or_else(|| plan_datafusion_err!("predict_table needs a DataFusion session"))?;
    let reference = TableReference::bare(table);
    let schema = state.schema_for_ref(reference.clone())?;
    // Catalog look-ups are async; for registered tables and local paths they finish without
    // waiting on anything this thread would have to drive.
    futures::executor::block_on(schema.table(reference.table()))?
        .ok_or_else(|| plan_datafusion_err!("predict_table: no table or file '{table}'"))
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
        let provider = resolve(args.session(), &table)?;
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
        for output in outputs {
            let value = if outputs.len() == 1 {
                call.clone()
            } else {
                get_field(call.clone(), output.name.as_str())
            };
            let column = if taken(&output.name) {
                format!("predicted_{}", output.name)
            } else {
                output.name.clone()
            };
            exprs.push(value.alias(column));
        }
        let plan = LogicalPlanBuilder::scan(table.as_str(), provider_as_source(provider), None)?
            .project(exprs)?
            .build()?;
        Ok(Arc::new(ViewTable::new(plan, None)))
    }
}
