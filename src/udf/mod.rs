//! The SQL functions batchinfer adds to DataFusion, one file each.

pub mod predict;

pub use predict::PredictUdf;
