//! What a model takes and gives: its inputs and outputs read from the ONNX graph, and the Arrow
//! types they correspond to. The output type of `predict` is fixed here, at planning time.

use crate::error::Error;
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Fields};
use ort::session::Session;
use ort::value::{Outlet, TensorElementType, ValueType};

use super::element::{element_arrow_type, element_name};

/// One input or output of a model.
#[derive(Debug, Clone)]
pub struct TensorSpec {
    pub name: String,
    /// The element type, or `None` for a value that is not a tensor (a sequence or a map).
    pub element: Option<TensorElementType>,
    /// The dimensions; `-1` where the graph leaves one open. The first is the batch dimension.
    pub shape: Vec<i64>,
    /// How ONNX Runtime describes the value, for messages.
    pub description: String,
}

impl TensorSpec {
    fn from_outlet(outlet: &Outlet) -> Self {
        let (element, shape) = match outlet.dtype() {
            ValueType::Tensor { ty, shape, .. } => (Some(*ty), shape.to_vec()),
            _ => (None, Vec::new()),
        };
        TensorSpec {
            name: outlet.name().to_string(),
            element,
            shape,
            description: outlet.dtype().to_string(),
        }
    }

    /// The batch dimension when the graph fixes it (a model exported for one row at a time).
    pub fn fixed_batch(&self) -> Option<usize> {
        match self.shape.first() {
            Some(&d) if d > 0 => Some(d as usize),
            _ => None,
        }
    }

    /// The dimensions of one row (all but the batch dimension).
    pub fn row_shape(&self) -> &[i64] {
        self.shape.get(1..).unwrap_or(&[])
    }

    /// Elements in one row, when every row dimension is fixed.
    pub fn row_elements(&self) -> Option<usize> {
        self.row_shape()
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(usize::try_from(d).ok()?))
    }

    /// The shape as users read it: `[N, 10]`, with `N` for an open batch dimension and `?` for
    /// other open dimensions.
    pub fn shape_text(&self) -> String {
        let dims: Vec<String> = self
            .shape
            .iter()
            .enumerate()
            .map(|(i, &d)| match (i, d) {
                (0, d) if d < 0 => "N".to_string(),
                (_, d) if d < 0 => "?".to_string(),
                (_, d) => d.to_string(),
            })
            .collect();
        format!("[{}]", dims.join(", "))
    }

    /// Whether one row is a single value ([N] or [N, 1]).
    pub fn is_scalar_per_row(&self) -> bool {
        matches!(self.row_shape(), [] | [1])
    }
}

impl fmt::Display for TensorSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.element {
            Some(element) => {
                write!(
                    f,
                    "{}: {} {}",
                    self.name,
                    element_name(element),
                    self.shape_text()
                )
            }
            None => write!(f, "{}: {}", self.name, self.description),
        }
    }
}

/// Inputs and outputs of a model, and the Arrow type `predict` returns for it.
#[derive(Debug, Clone)]
pub struct ModelSignature {
    pub inputs: Vec<TensorSpec>,
    pub outputs: Vec<TensorSpec>,
    /// The type of `predict`'s result: one output as is, several as a struct of them.
    pub output_type: DataType,
    /// The Arrow type of each output, in the model's order.
    pub output_types: Vec<DataType>,
}

impl ModelSignature {
    /// Reads the signature of a loaded session. Fails for outputs no Arrow type can hold.
    pub fn from_session(session: &Session) -> crate::error::Result<Self> {
        let inputs: Vec<TensorSpec> = session
            .inputs()
            .iter()
            .map(TensorSpec::from_outlet)
            .collect();
        let outputs: Vec<TensorSpec> = session
            .outputs()
            .iter()
            .map(TensorSpec::from_outlet)
            .collect();
        if inputs.is_empty() || outputs.is_empty() {
            return Err(crate::error::Error::Tensor(
                "the graph has no inputs or no outputs".to_string(),
            ));
        }
        let output_types = outputs
            .iter()
            .map(output_arrow_type)
            .collect::<Result<Vec<_>, _>>()?;
        let output_type = if outputs.len() == 1 {
            output_types[0].clone()
        } else {
            DataType::Struct(Fields::from(
                outputs
                    .iter()
                    .zip(&output_types)
                    .map(|(o, t)| Field::new(&o.name, t.clone(), true))
                    .collect::<Vec<_>>(),
            ))
        };
        Ok(ModelSignature {
            inputs,
            outputs,
            output_type,
            output_types,
        })
    }

    /// The batch size every call must have, when an input fixes it.
    pub fn fixed_batch(&self) -> Option<usize> {
        self.inputs.iter().find_map(TensorSpec::fixed_batch)
    }

    /// The inputs, one per line, for error messages.
    pub fn describe_inputs(&self) -> String {
        self.inputs
            .iter()
            .map(|i| format!("  {i}"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The outputs, on one line, for error messages.
    pub fn describe_outputs(&self) -> String {
        self.outputs
            .iter()
            .map(|o| o.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// [N] and [N, 1] become a scalar column; [N, k, ...] nested `FixedSizeList`s (`List` where a
/// dimension is open).
fn output_arrow_type(spec: &TensorSpec) -> crate::error::Result<DataType> {
    let element = spec.element.ok_or_else(|| {
        Error::Tensor(format!(
            "output '{}' is {}, not a tensor; batchinfer returns tensors only (export \
             scikit-learn classifiers with the option zipmap=False)",
            spec.name, spec.description
        ))
    })?;
    let mut ty = element_arrow_type(element).ok_or_else(|| {
        Error::Tensor(format!(
            "output '{}' has element type {}, which batchinfer does not convert",
            spec.name,
            element_name(element)
        ))
    })?;
    if spec.is_scalar_per_row() {
        return Ok(ty);
    }
    for &d in spec.row_shape().iter().rev() {
        let item = Arc::new(Field::new_list_field(ty, true));
        ty = if d > 0 {
            let d = i32::try_from(d).map_err(|_| {
                Error::Tensor(format!(
                    "output '{}' has a dimension of {d}, over the {} values an Arrow list holds",
                    spec.name,
                    i32::MAX
                ))
            })?;
            DataType::FixedSizeList(item, d)
        } else {
            DataType::List(item)
        };
    }
    Ok(ty)
}
