//! The SQL functions batchinfer adds to DataFusion, one file each.

pub mod embed;
pub mod predict;
pub mod vector;

pub use embed::EmbedUdf;
pub use predict::PredictUdf;
pub use vector::{Similarity, SimilarityUdf};
