//! batchinfer's reader for local Parquet files.
//!
//! DataFusion's Parquet reader is asynchronous: for each row group it fetches every projected
//! column chunk whole before decoding (a 1M-row group of ten float columns is 44 MB), so each
//! partition holds a row group in memory, and a file of one row group is read by one partition
//! while the others idle. For local files batchinfer reads with arrow-rs's synchronous reader
//! instead, which streams each column chunk page by page from the file, on a blocking thread
//! per partition that keeps up to two batches ready ahead of the query (decoding overlaps the
//! model). Row groups are dealt to the partitions by rows; when there are fewer row groups than
//! partitions, row groups are split into row ranges (pages before a range are skipped unread).
//!
//! `FixedSizeList` columns of numbers whose statistics count no NULLs are read as flat columns of
//! their values ([`FullListPages`]): their levels are checked page by page, never decoded.
//!
//! The plan rule swaps a `DataSourceExec` over Parquet for this scan only when the result is the
//! same by construction: local files, no pushed-down predicate, limit, declared ordering,
//! partition columns or per-file access plans, and every file readable with the table's column
//! types. A projection the scan carries (DataFusion pushes `predict(...)` into it) is evaluated
//! on the query's thread. Anything else keeps DataFusion's reader (`SET
//! batchinfer.streaming_scan = false` keeps it always).

mod exec;
pub(crate) mod file;
mod levels;
pub(crate) mod list;
pub(crate) mod units;

pub use exec::StreamingParquetExec;
