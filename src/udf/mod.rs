//! The SQL functions batchinfer adds to DataFusion, one file each.

pub mod embed;
pub mod predict;
pub mod predict_table;
pub mod vector;

pub use embed::EmbedUdf;
pub use predict::PredictUdf;
pub use predict_table::PredictTableFunction;
pub use vector::{Similarity, SimilarityUdf};
