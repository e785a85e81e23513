//! The rules batchinfer adds to DataFusion's planning, in one place: two analyzer rules, tables
//! whose lists claim too many values per row refused (`list_limits.rs`) and a file's name
//! passed to the model reading its content (`file_names.rs`); four logical rules, `ai_agg`
//! planned as `ai_reduce` over the group's texts (`ai_agg.rs`), each model call computed once
//! per row (`once.rs`), model calls made only on the rows a top-N or a
//! filter's other conditions keep (`late_calls.rs`) and files read at their ends alone for a
//! model that reads no more of them (`file_ends.rs`); and five physical ones, a filter's
//! conditions that call a model kept after its others and a moved top-N's order kept
//! (`late_calls.rs` too), `embed`'s input
//! gathered across batches and files (`embed_buffer.rs`, with the exec it places), local
//! Parquet read by batchinfer's streaming reader (`streaming_scan.rs`, [`crate::scan`]) and
//! video frames kept in the batches they are decoded in (`frame_batches.rs`). And what an
//! estimate of a statement reads: a model's condition keeps every row (`estimate_rows.rs`).

pub mod ai_agg;
pub mod embed_buffer;
pub mod estimate_rows;
pub mod file_ends;
pub mod file_names;
pub mod frame_batches;
pub mod late_calls;
pub mod list_limits;
pub mod once;
pub mod streaming_scan;

pub use ai_agg::AiAggAsReduce;
pub use embed_buffer::EmbedBufferRule;
pub use file_ends::FileEndsOnly;
pub use file_names::FileNamesBeside;
pub use frame_batches::FrameBatchesRule;
pub use late_calls::{ModelCallsLate, ModelFiltersLast, TopNOrderKept};
pub use list_limits::TableSchemaLimits;
pub use once::ModelCallsOnce;
pub use streaming_scan::StreamingParquetRule;
