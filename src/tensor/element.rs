//! ONNX element types and the Arrow types they correspond to: the one table batchinfer reads
//! both ways, and the names users know them by.

use datafusion::arrow::datatypes::DataType;
use ort::value::TensorElementType as E;

/// Each ONNX element type: its lower-case ONNX name, and the Arrow type batchinfer converts it
/// to and from (None: not converted).
/// Per process: a constant.
static ELEMENTS: [(E, &str, Option<DataType>); 16] = [
    (E::Float32, "float", Some(DataType::Float32)),
    (E::Float64, "double", Some(DataType::Float64)),
    (E::Int8, "int8", Some(DataType::Int8)),
    (E::Int16, "int16", Some(DataType::Int16)),
    (E::Int32, "int32", Some(DataType::Int32)),
    (E::Int64, "int64", Some(DataType::Int64)),
    (E::Uint8, "uint8", Some(DataType::UInt8)),
    (E::Uint16, "uint16", Some(DataType::UInt16)),
    (E::Uint32, "uint32", Some(DataType::UInt32)),
    (E::Uint64, "uint64", Some(DataType::UInt64)),
    (E::Bool, "bool", Some(DataType::Boolean)),
    (E::String, "string", Some(DataType::Utf8)),
    (E::Float16, "float16", None),
    (E::Bfloat16, "bfloat16", None),
    (E::Complex64, "complex64", None),
    (E::Complex128, "complex128", None),
];

/// The lower-case ONNX name of an element type, as users know them (`float`, `int64`, ...).
pub fn element_name(element: E) -> &'static str {
    ELEMENTS
        .iter()
        .find(|(e, _, _)| *e == element)
        .map_or("an unsupported element type", |(_, name, _)| name)
}

/// The Arrow type of one element, for the element types batchinfer converts.
pub fn element_arrow_type(element: E) -> Option<DataType> {
    ELEMENTS
        .iter()
        .find(|(e, _, _)| *e == element)
        .and_then(|(_, _, arrow)| arrow.clone())
}

/// The ONNX element type of a numeric Arrow type (the inverse of [`element_arrow_type`] for
/// numbers; booleans and strings are converted differently).
pub fn numeric_element_of(arrow: &DataType) -> Option<E> {
    if !arrow.is_numeric() {
        return None;
    }
    ELEMENTS
        .iter()
        .find(|(_, _, a)| a.as_ref() == Some(arrow))
        .map(|(e, _, _)| *e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_reads_both_ways() {
        for (element, _, arrow) in &ELEMENTS {
            assert_eq!(element_arrow_type(*element), arrow.clone());
            if let Some(arrow) = arrow.as_ref().filter(|a| a.is_numeric()) {
                assert_eq!(numeric_element_of(arrow), Some(*element));
            }
        }
        assert_eq!(element_name(E::Float32), "float");
        assert_eq!(numeric_element_of(&DataType::Utf8), None);
    }
}
