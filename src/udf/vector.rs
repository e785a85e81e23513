//! `cosine_similarity(a, b)` over vector columns (`FixedSizeList` or `List` of floats or
//! integers), so that semantic search runs in SQL:
//!
//! ```sql
//! SELECT id, cosine_similarity(v, embed('minilm', 'how do I read a parquet file')) AS score
//! FROM doc_vectors ORDER BY score DESC LIMIT 10;
//! ```
//! It is `1 - cosine_distance(a, b)`, DataFusion's own `cosine_distance` (faster than a loop of
//! ours: `benches/vectors.rs`), rewritten so in the plan where both sides have one fixed size;
//! `dot_product` is DataFusion's `inner_product` by its alias. Either side may be a constant vector. NULL on either side (or a NULL inside a vector),
//! or a zero vector, gives NULL; vectors of different lengths are an error.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Float64Array};
use datafusion::arrow::compute::kernels::numeric::sub;
use datafusion::arrow::datatypes::{DataType, Field};
use datafusion::common::{ScalarValue, exec_err, plan_err};
use datafusion::error::Result;
use datafusion::functions_nested::cosine_distance::cosine_distance_udf;
use datafusion::logical_expr::simplify::{ExprSimplifyResult, SimplifyContext};
use datafusion::logical_expr::{
    ColumnarValue, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility, cast,
    lit,
};

/// `cosine_similarity`: `1 - cosine_distance`.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct CosineSimilarity {
    signature: Signature,
    distance: Arc<ScalarUDF>,
}

impl Default for CosineSimilarity {
    fn default() -> Self {
        CosineSimilarity {
            signature: Signature::any(2, Volatility::Immutable),
            distance: cosine_distance_udf(),
        }
    }
}

/// The length of row `i`'s vector in `array`, or `None` where `array` is not a list.
fn length_at(array: &dyn Array, i: usize) -> Option<usize> {
    match array.data_type() {
        DataType::FixedSizeList(_, k) => Some(*k as usize),
        DataType::List(_) => Some(array.as_list::<i32>().value_length(i) as usize),
        DataType::LargeList(_) => Some(array.as_list::<i64>().value_length(i) as usize),
        _ => None,
    }
}

impl CosineSimilarity {
    /// Refuses rows whose two vectors differ in length, naming the first.
    fn check_lengths(&self, args: &ScalarFunctionArgs) -> Result<()> {
        let rows = args.number_rows;
        let side = |value: &ColumnarValue| -> Result<(ArrayRef, bool)> {
            let scalar = matches!(value, ColumnarValue::Scalar(_));
            Ok((value.to_array(if scalar { 1 } else { rows })?, scalar))
        };
        let ((a, a_scalar), (b, b_scalar)) = (side(&args.args[0])?, side(&args.args[1])?);
        for row in 0..rows {
            let (ia, ib) = (
                if a_scalar { 0 } else { row },
                if b_scalar { 0 } else { row },
            );
            if a.is_null(ia) || b.is_null(ib) {
                continue;
            }
            let (Some(x), Some(y)) = (length_at(&a, ia), length_at(&b, ib)) else {
                return Ok(());
            };
            if x != y {
                return exec_err!(
                    "{}: vectors of {x} and {y} values in one row (a pair of vectors must be of \
                     one length)",
                    self.name()
                );
            }
        }
        Ok(())
    }
}

impl ScalarUDFImpl for CosineSimilarity {
    fn name(&self) -> &str {
        "cosine_similarity"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        for t in arg_types {
            let item = match t {
                DataType::FixedSizeList(f, _) | DataType::List(f) | DataType::LargeList(f) => {
                    f.data_type()
                }
                DataType::Null => continue,
                other => {
                    return plan_err!(
                        "{}: expected two vectors (lists of numbers), got {other}",
                        self.name()
                    );
                }
            };
            if !item.is_numeric() {
                return plan_err!(
                    "{}: expected vectors of numbers, got a list of {item}",
                    self.name()
                );
            }
        }
        Ok(DataType::Float64)
    }

    /// Vectors of one fixed size on both sides (embeddings) cannot differ in length: the call is
    /// then `1 - cosine_distance(a, b)` in the plan itself, exactly DataFusion's function. Other
    /// lists are checked row by row when the function runs.
    fn simplify(&self, args: Vec<Expr>, info: &SimplifyContext) -> Result<ExprSimplifyResult> {
        let types = args
            .iter()
            .map(|e| info.get_data_type(e))
            .collect::<Result<Vec<_>>>()?;
        let size = |t: &DataType| match t {
            DataType::FixedSizeList(_, k) => Some(*k),
            _ => None,
        };
        match (size(&types[0]), size(&types[1])) {
            (Some(x), Some(y)) if x == y => {
                // Planned after type coercion: the casts DataFusion would have put in, put here.
                let coerced = self.distance.coerce_types(&types)?;
                let args = args
                    .into_iter()
                    .zip(coerced)
                    .map(|(e, t)| cast(e, t))
                    .collect();
                Ok(ExprSimplifyResult::Simplified(
                    lit(1.0_f64) - self.distance.call(args),
                ))
            }
            (Some(x), Some(y)) => plan_err!("{}: vectors of {x} and {y} values", self.name()),
            _ => Ok(ExprSimplifyResult::Original(args)),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        self.check_lengths(&args)?;
        let types: Vec<DataType> = args.args.iter().map(ColumnarValue::data_type).collect();
        let coerced = self.distance.coerce_types(&types)?;
        let values = args
            .args
            .iter()
            .zip(&coerced)
            .map(|(value, to)| value.cast_to(to, None))
            .collect::<Result<Vec<_>>>()?;
        let distance = self.distance.invoke_with_args(ScalarFunctionArgs {
            args: values,
            arg_fields: coerced
                .into_iter()
                .map(|t| Arc::new(Field::new("vector", t, true)))
                .collect(),
            number_rows: args.number_rows,
            return_field: args.return_field.clone(),
            config_options: args.config_options.clone(),
        })?;
        Ok(match distance {
            ColumnarValue::Array(distance) => {
                ColumnarValue::Array(sub(&Float64Array::new_scalar(1.0), &distance)?)
            }
            ColumnarValue::Scalar(ScalarValue::Float64(d)) => {
                ColumnarValue::Scalar(ScalarValue::Float64(d.map(|d| 1.0 - d)))
            }
            ColumnarValue::Scalar(other) => {
                return exec_err!("cosine_distance gave {other}, not a Float64");
            }
        })
    }
}
