//! Arrow columns to model inputs.
//!
//! [`InputBinding::plan`] decides, from the model's inputs and the argument types, how columns
//! feed inputs (at planning time, so mistakes fail before any row is read). [`prepare`] then turns
//! one batch's arrays into row-major data of the model's element type: without copying where the
//! layout already is one (a primitive column, a `FixedSizeList` or `List` of the right type with no
//! nulls), with one copy where columns must be packed side by side. [`InputTensor::to_value`]
//! hands that data to ONNX Runtime, borrowing the Arrow buffer for numeric types.

use datafusion::arrow::compute::can_cast_types;
use datafusion::arrow::datatypes::DataType;
use ort::value::TensorElementType;

use super::element::{element_arrow_type, element_name};
use super::signature::{ModelSignature, TensorSpec};

pub use super::prepare::{InputTensor, prepare};

/// Where one model input takes its data from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputSource {
    /// One column: a scalar column for an [N] or [N, 1] input, a list column for [N, k, ...].
    Column(usize),
    /// k scalar columns packed side by side into an [N, k] input.
    Packed(Vec<usize>),
}

/// How the feature columns of a `predict` call feed the model's inputs, one source per input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputBinding {
    pub sources: Vec<InputSource>,
}

impl InputBinding {
    /// For each input of `signature`, the column (of those named `names`) that feeds it, where
    /// every column is named after a different input of a model of several inputs (in any order,
    /// case aside) and that order is another than given; None to bind by position. A column
    /// named after one input that would feed another by position is an error naming both.
    pub fn order_by_name(
        signature: &ModelSignature,
        names: &[&str],
    ) -> crate::error::Result<Option<Vec<usize>>> {
        Ok(named_order(signature, names)?
            .filter(|order| order.iter().enumerate().any(|(i, &c)| i != c)))
    }

    /// Binds `args` (the types of the feature columns, model name excluded) to the inputs of
    /// `signature`, or says why they do not fit.
    pub fn plan(signature: &ModelSignature, args: &[DataType]) -> crate::error::Result<Self> {
        let inputs = &signature.inputs;
        let mismatch = |why: String| crate::error::Error::Tensor(explained(signature, args, why));
        if args.is_empty() {
            return Err(mismatch("no feature columns were given".to_string()));
        }
        let sources = if inputs.len() == 1 && (args.len() > 1 || !is_list(&args[0])) {
            let input = &inputs[0];
            if args.len() > 1 || !input.is_scalar_per_row() {
                match input.row_elements() {
                    Some(k) if k != args.len() => {
                        return Err(mismatch(format!(
                            "input '{}' takes {k} values per row, {} columns were given",
                            input.name,
                            args.len()
                        )));
                    }
                    _ => {}
                }
                vec![InputSource::Packed((0..args.len()).collect())]
            } else {
                vec![InputSource::Column(0)]
            }
        } else if args.len() == inputs.len() {
            (0..args.len()).map(InputSource::Column).collect()
        } else {
            return Err(mismatch(format!(
                "the model takes {} inputs, {} columns were given",
                inputs.len(),
                args.len()
            )));
        };
        let binding = InputBinding { sources };
        for (input, source) in inputs.iter().zip(&binding.sources) {
            check_source(input, source, args).map_err(|e| mismatch(e.to_string()))?;
        }
        Ok(binding)
    }
}

/// Why `args` do not fit `signature`, with the model's inputs and the types given.
fn explained(signature: &ModelSignature, args: &[DataType], why: String) -> String {
    format!(
        "{why}\nThe model's inputs are:\n{}\nGiven: ({})",
        signature.describe_inputs(),
        args.iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// For each input of `signature`, the column named after it, when every column is named after
/// a different input of a model of several inputs; None to bind by position; an error where a
/// column named after one input would feed another by position.
fn named_order(
    signature: &ModelSignature,
    names: &[&str],
) -> crate::error::Result<Option<Vec<usize>>> {
    let inputs = &signature.inputs;
    // A model of one input, or a count that does not fit: positional binding says what is wrong.
    if inputs.len() < 2 || names.len() != inputs.len() {
        return Ok(None);
    }
    let input_named = |name: &str| {
        inputs.iter().position(|i| i.name == name).or_else(|| {
            inputs
                .iter()
                .position(|i| i.name.eq_ignore_ascii_case(name))
        })
    };
    let named: Vec<Option<usize>> = names.iter().map(|n| input_named(n)).collect();
    let mut order = vec![None; inputs.len()];
    for (column, input) in named.iter().enumerate() {
        if let Some(i) = *input
            && order[i].is_none()
        {
            order[i] = Some(column);
        }
    }
    if order.iter().all(Option::is_some) {
        return Ok(Some(order.into_iter().flatten().collect()));
    }
    for (column, input) in named.iter().enumerate() {
        if let Some(i) = *input
            && i != column
        {
            return Err(crate::error::Error::Tensor(format!(
                "column {} '{}' is named after input '{}' but would feed input '{}' by position; \
                 name every column after a different input to bind them by name (in any order), \
                 or give them in the model's order",
                column + 1,
                names[column],
                inputs[i].name,
                inputs[column].name
            )));
        }
    }
    Ok(None)
}

fn is_list(t: &DataType) -> bool {
    matches!(
        t,
        DataType::List(_) | DataType::LargeList(_) | DataType::FixedSizeList(_, _)
    )
}

fn list_item(t: &DataType) -> Option<(&DataType, Option<usize>)> {
    match t {
        DataType::List(f) | DataType::LargeList(f) => Some((f.data_type(), None)),
        DataType::FixedSizeList(f, k) => Some((f.data_type(), Some(*k as usize))),
        _ => None,
    }
}

/// Whether values of type `from` may feed an input of element type `to`.
fn castable(from: &DataType, to: TensorElementType) -> bool {
    let Some(target) = element_arrow_type(to) else {
        return false;
    };
    match to {
        // Binary columns are accepted as text and checked to be UTF-8 row by row.
        TensorElementType::String => {
            matches!(
                from,
                DataType::Utf8
                    | DataType::LargeUtf8
                    | DataType::Utf8View
                    | DataType::Binary
                    | DataType::LargeBinary
                    | DataType::BinaryView
                    | DataType::Null
            ) || matches!(from, DataType::Dictionary(_, v) if castable(v, to))
        }
        // Numbers are not parsed from text: that is a mistake more often than an intent.
        _ => {
            (from.is_numeric() || matches!(from, DataType::Boolean | DataType::Null))
                && can_cast_types(from, &target)
        }
    }
}

fn check_source(
    input: &TensorSpec,
    source: &InputSource,
    args: &[DataType],
) -> crate::error::Result<()> {
    let element = match input.element {
        Some(e) if element_arrow_type(e).is_some() => e,
        Some(e) => {
            return Err(crate::error::Error::Tensor(format!(
                "input '{}' has element type {}, which batchinfer does not support yet",
                input.name,
                element_name(e)
            )));
        }
        None => {
            return Err(crate::error::Error::Tensor(format!(
                "input '{}' is {}, not a tensor; batchinfer feeds tensors only",
                input.name, input.description
            )));
        }
    };
    let expect = |arg: usize, t: &DataType| {
        if castable(t, element) {
            Ok(())
        } else {
            Err(crate::error::Error::Tensor(format!(
                "column {} is {t}, which cannot be converted to input '{}' ({})",
                arg + 1,
                input.name,
                element_name(element)
            )))
        }
    };
    match source {
        InputSource::Packed(columns) => columns.iter().try_for_each(|&c| {
            if is_list(&args[c]) {
                Err(crate::error::Error::Tensor(format!(
                    "column {} is a list; pass either one list column or scalar columns",
                    c + 1
                )))
            } else {
                expect(c, &args[c])
            }
        }),
        InputSource::Column(c) => match list_item(&args[*c]) {
            Some((item, size)) => {
                expect(*c, item)?;
                match (size, input.row_elements()) {
                    (Some(k), Some(p)) if k != p => Err(crate::error::Error::Tensor(format!(
                        "column {} holds {k} values per row, input '{}' takes {p}",
                        c + 1,
                        input.name
                    ))),
                    _ => Ok(()),
                }
            }
            None if input.is_scalar_per_row() => expect(*c, &args[*c]),
            None => Err(crate::error::Error::Tensor(format!(
                "column {} is a single value per row, input '{}' takes {} per row: pass a list \
                 column or one column per value",
                c + 1,
                input.name,
                input
                    .row_elements()
                    .map_or("several".to_string(), |p| p.to_string())
            ))),
        },
    }
}
