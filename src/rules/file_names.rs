//! A file's name beside its content: `predict('model', content)` over a table whose `filename`
//! names each row's file (as `read_blob`'s and `read_text`'s does, [`crate::blob::FILE_NAME`])
//! becomes `predict('model', content, filename)`, the column keeping its name, so that a file
//! the model cannot read is named in the error and kept by name in the rejects. `predict`
//! takes the name off its arguments before it binds the model's inputs.

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, DFSchema, Result};
use datafusion::config::ConfigOptions;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::{Expr, LogicalPlan};
use datafusion::optimizer::AnalyzerRule;

use crate::udf::PredictUdf;

/// The analyzer rule: see the module's documentation.
#[derive(Debug, Default)]
pub struct FileNamesBeside;

impl AnalyzerRule for FileNamesBeside {
    fn name(&self) -> &str {
        "batchinfer_file_names_beside"
    }

    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        plan.transform_up_with_subqueries(|node| {
            if !matches!(node, LogicalPlan::Projection(_) | LogicalPlan::Filter(_)) {
                return Ok(Transformed::no(node));
            }
            let schema = match node.inputs().as_slice() {
                [input] => input.schema().clone(),
                _ => return Ok(Transformed::no(node)),
            };
            let names = NamePreserver::new(&node);
            node.map_expressions(|expr| {
                let saved = names.save(&expr);
                let rewritten = expr.transform_up(|e| name_beside(e, &schema))?;
                Ok(rewritten.update_data(|e| saved.restore(e)))
            })
        })
        .map(|t| t.data)
    }
}

/// `predict('model', content)` with the name of `content`'s file added, where `schema` has it.
fn name_beside(expr: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    let Expr::ScalarFunction(call) = &expr else {
        return Ok(Transformed::no(expr));
    };
    if !call.func.inner().is::<PredictUdf>() {
        return Ok(Transformed::no(expr));
    }
    let [Expr::Literal(..), Expr::Column(content)] = call.args.as_slice() else {
        return Ok(Transformed::no(expr));
    };
    let Ok(index) = schema.index_of_column(content) else {
        return Ok(Transformed::no(expr));
    };
    let (relation, _) = schema.qualified_field(index);
    // The file name of the same table; else, for a column of no table (`content AS c` in a
    // subquery loses the table's name, `filename` keeps it), the one file name there is.
    let names: Vec<_> = schema
        .iter()
        .filter(|(_, f)| crate::blob::is_file_name(f))
        .collect();
    let name = match names.iter().find(|(q, _)| *q == relation) {
        Some(same) => Some(*same),
        None if relation.is_none() && names.len() == 1 => names.first().copied(),
        None => None,
    };
    let Some((q, field)) = name else {
        return Ok(Transformed::no(expr));
    };
    let mut args = call.args.clone();
    args.push(Expr::Column(Column::new(q.cloned(), field.name())));
    Ok(Transformed::yes(Expr::ScalarFunction(
        ScalarFunction::new_udf(call.func.clone(), args),
    )))
}
