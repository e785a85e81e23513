//! The SQL functions batchinfer adds to DataFusion, one file each.

pub mod ai;
mod ai_cascade;
pub mod ai_reduce;
pub mod by_name;
pub mod chunk;
pub mod embed;
mod embed_endpoint;
pub mod generate;
pub mod models;
pub mod names;
pub mod predict;
pub mod predict_table;
pub mod rejects;
pub mod vector;

pub use ai::{AiUdf, Question};
pub use ai_reduce::{AiAggUdf, AiReduceUdf};
pub use chunk::ChunkUdf;
pub use embed::EmbedUdf;
pub use generate::GenerateUdf;
pub use models::ModelsFunction;
pub use predict::PredictUdf;
pub use predict_table::PredictTableFunction;
pub use rejects::RejectsFunction;
pub use vector::CosineSimilarity;

use datafusion::common::{ScalarValue, plan_err};

/// The text of a non-NULL string literal argument, if the argument is one.
pub(crate) fn string_literal(arg: Option<&ScalarValue>) -> Option<String> {
    match arg {
        Some(
            ScalarValue::Utf8(Some(s))
            | ScalarValue::LargeUtf8(Some(s))
            | ScalarValue::Utf8View(Some(s)),
        ) => Some(s.clone()),
        _ => None,
    }
}

/// The model name of a call: a non-NULL string literal, else a planning error showing `usage`.
pub(crate) fn model_name(
    arg: Option<&ScalarValue>,
    usage: &str,
) -> datafusion::error::Result<String> {
    match string_literal(arg) {
        Some(name) => Ok(name),
        None => plan_err!("{usage}"),
    }
}

/// Functions over a model registry are equal when they read the same registry.
macro_rules! same_registry_identity {
    ($t:ty) => {
        impl PartialEq for $t {
            fn eq(&self, other: &Self) -> bool {
                std::sync::Arc::ptr_eq(&self.registry, &other.registry)
            }
        }
        impl Eq for $t {}
        impl std::hash::Hash for $t {
            fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
                std::ptr::hash(std::sync::Arc::as_ptr(&self.registry), state);
            }
        }
    };
}
pub(crate) use same_registry_identity;

/// The device a query's session asks models to run on (`SET batchinfer.device`), if any.
pub(crate) fn device_of(
    config: Option<&datafusion::config::ConfigOptions>,
) -> Option<crate::device::Target> {
    config?
        .extensions
        .get::<crate::config::BatchInferOptions>()?
        .device
        .map(crate::device::Device::resolve)
}
