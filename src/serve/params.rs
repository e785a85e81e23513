//! A prepared statement's parameters: its placeholders (`?` in order, or `$1`, `$2`, ...)
//! replaced by the values of one row of the parameters a client bound, as SQL literals of
//! their Arrow types, in the parsed statement (never in its text: a value is a value, not SQL).

use std::ops::ControlFlow;

use datafusion::arrow::array::RecordBatch;
use datafusion::common::ScalarValue;
use datafusion::logical_expr::Expr;
use datafusion::sql::sqlparser::ast::{self, Value, VisitorMut};
use datafusion::sql::unparser::Unparser;

use crate::error::{Error, Result};
use crate::statements::{Statement, visit_sql_mut};

/// The placeholders of `statement`: how many values it takes.
pub fn count(statement: &Statement) -> usize {
    let mut statement = statement.clone();
    let mut counter = Placeholders {
        values: None,
        next: 0,
        most: 0,
        error: None,
    };
    if let Statement::Sql(sql) = &mut statement {
        let _ = visit_sql_mut(sql, &mut counter);
    }
    counter.most
}

/// `statement` with its placeholders given the values of row `row` of `parameters`.
pub fn bind(statement: &Statement, parameters: &RecordBatch, row: usize) -> Result<Statement> {
    let values = (0..parameters.num_columns())
        .map(|c| ScalarValue::try_from_array(parameters.column(c), row))
        .collect::<datafusion::error::Result<Vec<_>>>()?;
    let mut bound = statement.clone();
    let Statement::Sql(sql) = &mut bound else {
        return Err(Error::Statement(
            "parameters are bound to SQL statements (queries, INSERT, CREATE TABLE ... AS, \
             COPY), not to statements about models, views or Delta tables"
                .to_string(),
        ));
    };
    let mut binder = Placeholders {
        values: Some(values),
        next: 0,
        most: 0,
        error: None,
    };
    let _ = visit_sql_mut(sql, &mut binder);
    if let Some(error) = binder.error {
        return Err(error);
    }
    let given = parameters.num_columns();
    if binder.most != given {
        return Err(Error::Statement(format!(
            "the statement has {} placeholder(s), and {given} parameter(s) were bound",
            binder.most
        )));
    }
    Ok(bound)
}

/// Counts placeholders, and replaces them with `values` where given.
struct Placeholders {
    values: Option<Vec<ScalarValue>>,
    /// The `?` seen so far.
    next: usize,
    /// The most values the placeholders seen take.
    most: usize,
    error: Option<Error>,
}

impl VisitorMut for Placeholders {
    type Break = ();

    fn post_visit_expr(&mut self, expr: &mut ast::Expr) -> ControlFlow<()> {
        let ast::Expr::Value(value) = expr else {
            return ControlFlow::Continue(());
        };
        let Value::Placeholder(name) = &value.value else {
            return ControlFlow::Continue(());
        };
        let index = if name == "?" {
            self.next += 1;
            self.next
        } else {
            match name.strip_prefix('$').and_then(|n| n.parse::<usize>().ok()) {
                Some(n) if n >= 1 => n,
                _ => {
                    self.error = Some(Error::Statement(format!(
                        "placeholder {name}: parameters are `?` or `$1`, `$2`, ..."
                    )));
                    return ControlFlow::Break(());
                }
            }
        };
        self.most = self.most.max(index);
        let Some(values) = &self.values else {
            return ControlFlow::Continue(());
        };
        let Some(scalar) = values.get(index - 1) else {
            // Counted: the error says how many were bound.
            return ControlFlow::Continue(());
        };
        match literal(scalar) {
            Ok(literal) => *expr = literal,
            Err(e) => {
                self.error = Some(e);
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    }
}

/// `value` as a SQL literal of its type (`CAST('2024-01-02' AS DATE)`, `'text'`, `1.5`).
fn literal(value: &ScalarValue) -> Result<ast::Expr> {
    let expr = Expr::Literal(value.clone(), None);
    let sql = Unparser::default().expr_to_sql(&expr).map_err(|e| {
        Error::Statement(format!(
            "a parameter of type {} cannot be bound: {e}",
            value.data_type()
        ))
    })?;
    // Floats keep their type (a bare `1.5` may be read as a decimal).
    Ok(match value {
        ScalarValue::Float32(Some(_)) | ScalarValue::Float64(Some(_)) => ast::Expr::Cast {
            kind: ast::CastKind::Cast,
            expr: Box::new(sql),
            data_type: if matches!(value, ScalarValue::Float32(_)) {
                ast::DataType::Real
            } else {
                ast::DataType::Double(ast::ExactNumberInfo::None)
            },
            array: false,
            format: None,
        },
        _ => sql,
    })
}
