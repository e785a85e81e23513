//! `cosine_similarity(a, b)` and `dot_product(a, b)` over vector columns (`FixedSizeList` or
//! `List` of floats or integers), so that semantic search runs in SQL:
//!
//! ```sql
//! SELECT id, cosine_similarity(v, embed('minilm', 'how do I read a parquet file')) AS score
//! FROM doc_vectors ORDER BY score DESC LIMIT 10;
//! ```
//! Either side may be a constant vector. NULL on either side, or a zero vector for cosine, gives
//! NULL; vectors of different lengths are an error.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Float64Array};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Float64Type};
use datafusion::common::{exec_err, plan_err};
use datafusion::error::Result;
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDFImpl, Signature, Volatility,
};

/// Which similarity the function computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Similarity {
    Cosine,
    Dot,
}

/// `cosine_similarity` or `dot_product`.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct SimilarityUdf {
    kind: Similarity,
    signature: Signature,
}

impl SimilarityUdf {
    pub fn new(kind: Similarity) -> Self {
        SimilarityUdf {
            kind,
            signature: Signature::any(2, Volatility::Immutable),
        }
    }
}

/// One side's vectors: values as f64 and where each row's vector starts and ends.
struct Vectors {
    values: Vec<f64>,
    bounds: Vec<(usize, usize)>,
    array: ArrayRef,
}

fn vectors(array: ArrayRef, function: &str) -> Result<Vectors> {
    let (child, bounds): (ArrayRef, Vec<(usize, usize)>) = match array.data_type() {
        DataType::FixedSizeList(_, k) => {
            let k = *k as usize;
            let list = array.as_fixed_size_list();
            (
                list.values().clone(),
                (0..list.len()).map(|i| (i * k, (i + 1) * k)).collect(),
            )
        }
        // List offsets index the whole child array, also for a sliced list.
        DataType::List(_) => {
            let list = array.as_list::<i32>();
            (
                list.values().clone(),
                list.offsets()
                    .windows(2)
                    .map(|w| (w[0] as usize, w[1] as usize))
                    .collect(),
            )
        }
        DataType::LargeList(_) => {
            let list = array.as_list::<i64>();
            (
                list.values().clone(),
                list.offsets()
                    .windows(2)
                    .map(|w| (w[0] as usize, w[1] as usize))
                    .collect(),
            )
        }
        other => return exec_err!("{function}: expected vectors (lists of numbers), got {other}"),
    };
    let values = cast(&child, &DataType::Float64)?;
    Ok(Vectors {
        values: values.as_primitive::<Float64Type>().values().to_vec(),
        bounds,
        array,
    })
}

impl ScalarUDFImpl for SimilarityUdf {
    fn name(&self) -> &str {
        match self.kind {
            Similarity::Cosine => "cosine_similarity",
            Similarity::Dot => "dot_product",
        }
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

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let side = |i: usize| -> Result<(Vectors, bool)> {
            let is_scalar = matches!(args.args[i], ColumnarValue::Scalar(_));
            let array = args.args[i].to_array(if is_scalar { 1 } else { rows })?;
            Ok((vectors(array, self.name())?, is_scalar))
        };
        let ((a, a_scalar), (b, b_scalar)) = (side(0)?, side(1)?);
        let mut out = Vec::with_capacity(rows);
        for row in 0..rows {
            let (ia, ib) = (
                if a_scalar { 0 } else { row },
                if b_scalar { 0 } else { row },
            );
            if a.array.is_null(ia) || b.array.is_null(ib) {
                out.push(None);
                continue;
            }
            let (x, y) = (
                &a.values[a.bounds[ia].0..a.bounds[ia].1],
                &b.values[b.bounds[ib].0..b.bounds[ib].1],
            );
            if x.len() != y.len() {
                return exec_err!(
                    "{}: vectors of {} and {} values in row {row}",
                    self.name(),
                    x.len(),
                    y.len()
                );
            }
            let dot: f64 = x.iter().zip(y).map(|(p, q)| p * q).sum();
            out.push(match self.kind {
                Similarity::Dot => Some(dot),
                Similarity::Cosine => {
                    let norms = x.iter().map(|p| p * p).sum::<f64>().sqrt()
                        * y.iter().map(|q| q * q).sum::<f64>().sqrt();
                    (norms > 0.0).then(|| dot / norms)
                }
            });
        }
        let result = Float64Array::from(out);
        if a_scalar && b_scalar {
            return Ok(ColumnarValue::Scalar(
                datafusion::common::ScalarValue::try_from_array(&result, 0)?,
            ));
        }
        Ok(ColumnarValue::Array(Arc::new(result)))
    }
}
