//! Columns bound to a model's inputs by name: `predict('late', dest, carrier, ...)`, where every
//! column is named after a different input of the model, is rewritten into the model's order
//! before the statement is planned, so that each feeds the input of its name (and `EXPLAIN`
//! shows where each binds). A column named after one input in the place of another, with the
//! others not all named, is an error naming both.
//!
//! This is decided on the statement as written: the names a user sees are the columns and
//! aliases the query's text gives, and planning renames columns (merged projections read a
//! subquery's `wind_speed AS temp` as `wind_speed`). From the plan on, columns bind by position.

use std::ops::ControlFlow;

use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{
    Expr as SqlExpr, FunctionArg, FunctionArgExpr, FunctionArguments, Value, VisitorMut,
};

use crate::error::{Error, Result};
use crate::model::ModelRegistry;
use crate::tensor::input::InputBinding;

/// Puts the columns of each `predict` call of `statement` that are named after its model's
/// inputs in the model's order.
pub fn bind_by_name(statement: &mut DFStatement, registry: &ModelRegistry) -> Result<()> {
    let mut binder = Binder { registry };
    match crate::statements::visit_sql_mut(statement, &mut binder) {
        ControlFlow::Break(e) => Err(e),
        ControlFlow::Continue(()) => Ok(()),
    }
}

struct Binder<'a> {
    registry: &'a ModelRegistry,
}

impl VisitorMut for Binder<'_> {
    type Break = Error;

    fn post_visit_expr(&mut self, expr: &mut SqlExpr) -> ControlFlow<Error> {
        match reorder(expr, self.registry) {
            Ok(()) => ControlFlow::Continue(()),
            Err(e) => ControlFlow::Break(e),
        }
    }
}

fn reorder(expr: &mut SqlExpr, registry: &ModelRegistry) -> Result<()> {
    let SqlExpr::Function(function) = expr else {
        return Ok(());
    };
    let is_predict = matches!(function.name.0.as_slice(), [part]
        if part.as_ident().is_some_and(|i| i.value.eq_ignore_ascii_case("predict")));
    let FunctionArguments::List(list) = &mut function.args else {
        return Ok(());
    };
    let Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(SqlExpr::Value(model)))) =
        list.args.first()
    else {
        return Ok(());
    };
    let Value::SingleQuotedString(model) = &model.value else {
        return Ok(());
    };
    if !is_predict {
        return Ok(());
    }
    // An unknown model is planning's to report.
    let Ok(loaded) = registry.get(model) else {
        return Ok(());
    };
    let names: Vec<Option<String>> = list.args[1..].iter().map(column_name).collect();
    let named: Vec<&str> = names.iter().map(|n| n.as_deref().unwrap_or("")).collect();
    let order = InputBinding::order_by_name(&loaded.signature, &named).map_err(|message| {
        Error::Binding {
            model: model.clone(),
            message: format!(
                "{message}\nThe model's inputs are:\n{}",
                loaded.signature.describe_inputs()
            ),
        }
    })?;
    if let Some(order) = order {
        let columns: Vec<FunctionArg> = list.args.drain(1..).collect();
        list.args
            .extend(order.iter().map(|&column| columns[column].clone()));
    }
    Ok(())
}

/// The name of a column argument as the query writes it (`temp`, `f.temp`, `"Temp"`); None for
/// anything else.
fn column_name(arg: &FunctionArg) -> Option<String> {
    let FunctionArg::Unnamed(FunctionArgExpr::Expr(expr)) = arg else {
        return None;
    };
    let ident = match expr {
        SqlExpr::Identifier(ident) => ident,
        SqlExpr::CompoundIdentifier(parts) => parts.last()?,
        _ => return None,
    };
    // As DataFusion normalizes identifiers: lower case unless quoted.
    Some(match ident.quote_style {
        Some(_) => ident.value.clone(),
        None => ident.value.to_ascii_lowercase(),
    })
}
