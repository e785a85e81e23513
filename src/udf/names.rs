//! Short default names for model columns: `predict('late', ...)` unnamed in a select list is the
//! column `predict_late` (`embed('minilm', text)`: `embed_minilm`; a field read from the
//! prediction, `predict('late', ...)['label']`: `predict_late_label`), instead of DataFusion's
//! name spelling out every argument. A name that another column of the same select list has
//! (or would get), or in a select list with a `*`, is left to DataFusion, so names stay unique.

use std::ops::ControlFlow;

use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{
    AccessExpr, Expr as SqlExpr, FunctionArg, FunctionArgExpr, FunctionArguments, Ident, Query,
    SelectItem, SetExpr, Subscript, Value, VisitorMut,
};

/// Names the unnamed model columns of every select list in `statement`.
pub fn name_model_columns(statement: &mut DFStatement) {
    let _ = crate::statements::visit_sql_mut(statement, &mut Namer);
}

struct Namer;

impl VisitorMut for Namer {
    type Break = ();

    fn post_visit_query(&mut self, query: &mut Query) -> ControlFlow<()> {
        name_in(&mut query.body);
        ControlFlow::Continue(())
    }
}

fn name_in(body: &mut SetExpr) {
    match body {
        SetExpr::Select(select) => name_items(&mut select.projection),
        SetExpr::SetOperation { left, right, .. } => {
            name_in(left);
            name_in(right);
        }
        _ => {}
    }
}

fn name_items(items: &mut [SelectItem]) {
    // The columns a `*` brings are not known here: a short name could be one of them.
    if items.iter().any(|item| {
        matches!(
            item,
            SelectItem::Wildcard(_) | SelectItem::QualifiedWildcard(..)
        )
    }) {
        return;
    }
    let taken: Vec<String> = items
        .iter()
        .filter_map(|item| match item {
            SelectItem::ExprWithAlias { alias, .. } => Some(alias.value.to_ascii_lowercase()),
            SelectItem::UnnamedExpr(SqlExpr::Identifier(ident)) => {
                Some(ident.value.to_ascii_lowercase())
            }
            SelectItem::UnnamedExpr(SqlExpr::CompoundIdentifier(parts)) => {
                parts.last().map(|p| p.value.to_ascii_lowercase())
            }
            _ => None,
        })
        .collect();
    let names: Vec<Option<String>> = items
        .iter()
        .map(|item| match item {
            SelectItem::UnnamedExpr(expr) => short_name(expr),
            _ => None,
        })
        .collect();
    for (item, name) in items.iter_mut().zip(&names) {
        let Some(name) = name else { continue };
        let unique = names.iter().filter(|n| n.as_ref() == Some(name)).count() == 1;
        if !unique || taken.contains(&name.to_ascii_lowercase()) {
            continue;
        }
        if let SelectItem::UnnamedExpr(expr) = item {
            let expr = std::mem::replace(expr, SqlExpr::value(Value::Null));
            *item = SelectItem::ExprWithAlias {
                expr,
                alias: Ident::with_quote('"', name.as_str()),
            };
        }
    }
}

/// `predict_MODEL` for `predict('MODEL', ...)`, `embed_MODEL` for `embed('MODEL', ...)`, with
/// `_FIELD` for each field read from it (`['FIELD']`); None for anything else.
fn short_name(expr: &SqlExpr) -> Option<String> {
    match expr {
        SqlExpr::Function(function) => {
            let [part] = function.name.0.as_slice() else {
                return None;
            };
            let function_name = part.as_ident()?.value.to_ascii_lowercase();
            if function_name != "predict" && function_name != "embed" {
                return None;
            }
            let FunctionArguments::List(list) = &function.args else {
                return None;
            };
            let Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(SqlExpr::Value(model)))) =
                list.args.first()
            else {
                return None;
            };
            let Value::SingleQuotedString(model) = &model.value else {
                return None;
            };
            Some(format!("{function_name}_{model}"))
        }
        SqlExpr::CompoundFieldAccess { root, access_chain } => {
            let mut name = short_name(root)?;
            for access in access_chain {
                let AccessExpr::Subscript(Subscript::Index {
                    index: SqlExpr::Value(field),
                }) = access
                else {
                    return None;
                };
                let Value::SingleQuotedString(field) = &field.value else {
                    return None;
                };
                name = format!("{name}_{field}");
            }
            Some(name)
        }
        SqlExpr::Nested(inner) => short_name(inner),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::sql::parser::DFParser;

    fn named(sql: &str) -> String {
        let mut statements = DFParser::parse_sql(sql).unwrap();
        let mut statement = statements.pop_front().unwrap();
        name_model_columns(&mut statement);
        statement.to_string()
    }

    #[test]
    fn unnamed_model_columns_get_short_names_that_stay_unique() {
        assert_eq!(
            named("SELECT id, predict('late', a, b), predict('late', a, b)['label'] FROM t"),
            "SELECT id, predict('late', a, b) AS \"predict_late\", predict('late', a, b)['label'] AS \"predict_late_label\" FROM t"
        );
        // Two calls of one model, or a name taken: DataFusion's names.
        assert_eq!(
            named("SELECT predict('m', a), predict('m', b) FROM t"),
            "SELECT predict('m', a), predict('m', b) FROM t"
        );
        assert_eq!(
            named("SELECT predict('m', a), x AS predict_m FROM t"),
            "SELECT predict('m', a), x AS predict_m FROM t"
        );
        assert_eq!(
            named("SELECT *, predict('m', a) FROM t"),
            "SELECT *, predict('m', a) FROM t"
        );
        assert_eq!(
            named("COPY (SELECT embed('minilm', text) FROM t) TO 'o.parquet'"),
            "COPY (SELECT embed('minilm', text) AS \"embed_minilm\" FROM t) TO o.parquet"
        );
        assert_eq!(
            named("SELECT predict('m', a) AS p FROM (SELECT predict('m', a) FROM t)"),
            "SELECT predict('m', a) AS p FROM (SELECT predict('m', a) AS \"predict_m\" FROM t)"
        );
    }
}
