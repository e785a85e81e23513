//! Arrow arrays to ONNX Runtime tensors and back: the element types ([`element`]), a model's
//! inputs and outputs ([`signature`]), and pure functions over arrays and signatures
//! ([`input`], [`output`]); scoring (`model::score`) strings them together. Nothing here knows
//! of the model registry.

pub mod element;
pub mod input;
pub mod nulls;
pub mod output;
pub mod prepare;
pub mod signature;

/// Calls `$body` with `$t` bound to the Arrow primitive type of a numeric ONNX element type, or
/// evaluates `$other` for the rest (bool, string, float16, ...).
macro_rules! with_arrow_primitive {
    ($element:expr, $t:ident => $body:expr, _ => $other:expr) => {{
        use datafusion::arrow::datatypes as adt;
        use ort::value::TensorElementType as E;
        match $element {
            E::Float32 => {
                type $t = adt::Float32Type;
                $body
            }
            E::Float64 => {
                type $t = adt::Float64Type;
                $body
            }
            E::Int8 => {
                type $t = adt::Int8Type;
                $body
            }
            E::Int16 => {
                type $t = adt::Int16Type;
                $body
            }
            E::Int32 => {
                type $t = adt::Int32Type;
                $body
            }
            E::Int64 => {
                type $t = adt::Int64Type;
                $body
            }
            E::Uint8 => {
                type $t = adt::UInt8Type;
                $body
            }
            E::Uint16 => {
                type $t = adt::UInt16Type;
                $body
            }
            E::Uint32 => {
                type $t = adt::UInt32Type;
                $body
            }
            E::Uint64 => {
                type $t = adt::UInt64Type;
                $body
            }
            _ => $other,
        }
    }};
}
pub(crate) use with_arrow_primitive;

#[cfg(test)]
mod tests;
