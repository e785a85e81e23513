//! batchinfer's streaming reader for local Parquet (src/scan.rs) against DataFusion's own reader
//! (`SET batchinfer.streaming_scan = false`): the same rows, column for column, for the layouts
//! the reader takes (one row group split across partitions, many row groups over several files,
//! lists read straight from their leaf) and those it leaves to arrow-rs (NULL lists, files
//! without statistics), with a real model on top; and a file gone between planning and reading
//! is an error naming it.

use std::path::Path;
use std::sync::Arc;

use batchinfer::message::display_error;
use batchinfer::{Engine, EngineConfig};
use datafusion::arrow::array::{
    ArrayRef, FixedSizeListArray, Float32Array, Float64Array, Int32Array, Int64Array, ListArray,
    RecordBatch, StringArray,
};
use datafusion::arrow::buffer::{NullBuffer, OffsetBuffer};
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};

fn schema() -> SchemaRef {
    let f32_item = Arc::new(Field::new_list_field(DataType::Float32, false));
    let f64_item = Arc::new(Field::new_list_field(DataType::Float64, true));
    let i32_item = Arc::new(Field::new_list_field(DataType::Int32, true));
    let i64_item = Arc::new(Field::new_list_field(DataType::Int64, true));
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("x", DataType::Float32, true),
        Field::new("s", DataType::Utf8, true),
        Field::new("v", DataType::FixedSizeList(f32_item, 4), false),
        Field::new("w", DataType::FixedSizeList(f64_item, 3), true),
        Field::new("l", DataType::List(i32_item), true),
        Field::new("k", DataType::FixedSizeList(i64_item, 3), true),
    ]))
}

/// Rows `start..start + n`: NULLs in `x`, `s` and whole `w` lists, lists of 0-3 items in `l`.
fn rows(start: usize, n: usize) -> RecordBatch {
    let ids: Vec<i64> = (start..start + n).map(|i| i as i64).collect();
    let x = Float32Array::from_iter(ids.iter().map(|&i| (i % 7 != 0).then_some(i as f32 * 0.5)));
    let s = StringArray::from_iter(
        ids.iter()
            .map(|&i| (i % 5 != 0).then(|| format!("row {i}"))),
    );
    let v_values = Float32Array::from_iter_values(
        ids.iter()
            .flat_map(|&i| (0..4).map(move |j| (i * 4 + j) as f32 / 3.0)),
    );
    let DataType::FixedSizeList(f32_item, _) = schema().field(3).data_type().clone() else {
        unreachable!()
    };
    let v = FixedSizeListArray::new(f32_item, 4, Arc::new(v_values), None);
    let DataType::FixedSizeList(f64_item, _) = schema().field(4).data_type().clone() else {
        unreachable!()
    };
    let w_values = Float64Array::from_iter_values(
        ids.iter()
            .flat_map(|&i| (0..3).map(move |j| (i - j) as f64)),
    );
    let w_nulls = NullBuffer::from_iter(ids.iter().map(|&i| i % 11 != 0));
    let w = FixedSizeListArray::new(f64_item, 3, Arc::new(w_values), Some(w_nulls));
    let DataType::List(i32_item) = schema().field(5).data_type().clone() else {
        unreachable!()
    };
    let lengths: Vec<usize> = ids.iter().map(|&i| (i % 4) as usize).collect();
    let l_values = Int32Array::from_iter_values(
        ids.iter()
            .zip(&lengths)
            .flat_map(|(&i, &len)| (0..len).map(move |j| (i as i32) * 10 + j as i32)),
    );
    let l = ListArray::new(
        i32_item,
        OffsetBuffer::from_lengths(lengths),
        Arc::new(l_values),
        None,
    );
    let DataType::FixedSizeList(i64_item, _) = schema().field(6).data_type().clone() else {
        unreachable!()
    };
    let k_values =
        Int64Array::from_iter_values(ids.iter().flat_map(|&i| (0..3).map(move |j| i * 1000 + j)));
    let k = FixedSizeListArray::new(i64_item, 3, Arc::new(k_values), None);
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(ids)),
        Arc::new(x),
        Arc::new(s),
        Arc::new(v),
        Arc::new(w),
        Arc::new(l),
        Arc::new(k),
    ];
    RecordBatch::try_new(schema(), columns).unwrap()
}

/// Writes rows `start..start + n` to `path` in row groups of `group` rows.
fn write(path: &Path, start: usize, n: usize, group: usize, statistics: bool) {
    write_with(
        path,
        start,
        n,
        group,
        statistics,
        WriterVersion::PARQUET_1_0,
    )
}

fn write_with(
    path: &Path,
    start: usize,
    n: usize,
    group: usize,
    statistics: bool,
    version: WriterVersion,
) {
    let props = WriterProperties::builder()
        .set_writer_version(version)
        // Small pages, so that lists and row ranges cross page boundaries.
        .set_data_page_row_count_limit(3_000)
        .set_write_batch_size(1_000)
        .set_max_row_group_row_count(Some(group))
        .set_statistics_enabled(if statistics {
            EnabledStatistics::Chunk
        } else {
            EnabledStatistics::None
        })
        .build();
    let mut writer =
        ArrowWriter::try_new(std::fs::File::create(path).unwrap(), schema(), Some(props)).unwrap();
    let mut done = 0;
    while done < n {
        let chunk = 10_000.min(n - done);
        writer.write(&rows(start + done, chunk)).unwrap();
        done += chunk;
    }
    writer.close().unwrap();
}

/// Every column, as written (DataFusion reads strings as views).
const ALL: &str = "id, x, arrow_cast(s, 'Utf8') AS s, v, w, l, k";

fn engine(partitions: usize) -> Engine {
    Engine::new(EngineConfig {
        models_dir: Some("data/models".into()),
        target_partitions: partitions,
        ..Default::default()
    })
    .unwrap()
}

async fn collect(engine: &Engine, sql: &str) -> Vec<RecordBatch> {
    match engine.sql(sql).await {
        Ok(frame) => frame.collect().await.unwrap(),
        Err(e) => panic!("{sql}: {}", display_error(&e)),
    }
}

async fn plan(engine: &Engine, sql: &str) -> String {
    let batches = collect(engine, &format!("EXPLAIN {sql}")).await;
    datafusion::arrow::util::pretty::pretty_format_batches(&batches)
        .unwrap()
        .to_string()
}

/// `sql` through both readers: the same rows, and the plans show which reader ran.
async fn same_both_ways(engine: &Engine, sql: &str, streams: bool) -> RecordBatch {
    let mut results = Vec::new();
    for streaming in [true, false] {
        collect(
            engine,
            &format!("SET batchinfer.streaming_scan = {streaming}"),
        )
        .await;
        let shown = plan(engine, sql).await;
        assert_eq!(
            shown.contains("StreamingParquetExec"),
            streaming && streams,
            "streaming = {streaming}:\n{shown}"
        );
        let batches = collect(engine, sql).await;
        let schema = batches[0].schema();
        results.push(concat_batches(&schema, &batches).unwrap());
    }
    assert_eq!(results[0], results[1], "{sql}");
    assert!(results[0].num_rows() > 0);
    results.remove(0)
}

/// Every column of `from` (a file or folder holding rows `0..n`), through both readers: the rows
/// written.
async fn reads_as_written(engine: &Engine, from: &str, n: usize) {
    let sql = format!("SELECT {ALL} FROM '{from}' ORDER BY id");
    let all = same_both_ways(engine, &sql, true).await;
    assert_eq!(all.columns(), rows(0, n).columns());
}

#[tokio::test]
async fn one_row_group_is_read_by_every_partition_with_the_same_rows() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("one.parquet");
    write(&file, 0, 50_000, 1_000_000, true);
    let engine = engine(4);
    let sql = format!("SELECT {ALL} FROM '{}' ORDER BY id", file.display());
    let shown = plan(&engine, &sql).await;
    assert!(
        shown.contains("row groups or ranges=4, partitions=4"),
        "{shown}"
    );
    reads_as_written(&engine, &file.display().to_string(), 50_000).await;
}

#[tokio::test]
async fn many_row_groups_over_several_files_read_the_same() {
    let dir = tempfile::tempdir().unwrap();
    write(&dir.path().join("a.parquet"), 0, 40_000, 7_000, true);
    write(&dir.path().join("b.parquet"), 40_000, 33_333, 4_096, true);
    let engine = engine(3);
    let table = format!("{}/", dir.path().display());
    reads_as_written(&engine, &table, 73_333).await;
    // Columns in another order, twice, and computed from (a projection DataFusion pushes into
    // the scan).
    same_both_ways(
        &engine,
        &format!(
            "SELECT l, id, v, id AS again, x * 2 AS twice, v[3] AS third FROM '{table}' ORDER BY id"
        ),
        true,
    )
    .await;
    // A pushed-down filter keeps DataFusion's reader.
    same_both_ways(
        &engine,
        &format!("SELECT id, w FROM '{table}' WHERE x > 100 ORDER BY id"),
        false,
    )
    .await;
}

#[tokio::test]
async fn data_pages_v2_read_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("v2.parquet");
    write_with(
        &file,
        0,
        30_000,
        1_000_000,
        true,
        WriterVersion::PARQUET_2_0,
    );
    let engine = engine(3);
    reads_as_written(&engine, &file.display().to_string(), 30_000).await;
}

#[tokio::test]
async fn files_without_statistics_read_their_lists_through_arrow_rs() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bare.parquet");
    write(&file, 0, 20_000, 6_000, false);
    let engine = engine(2);
    reads_as_written(&engine, &file.display().to_string(), 20_000).await;
}

#[tokio::test]
async fn a_model_over_a_list_column_scores_the_same() {
    let engine = engine(2);
    same_both_ways(
        &engine,
        "SELECT id, predict('linear', features) AS score FROM 'data/sample/vectors.parquet' ORDER BY id",
        true,
    )
    .await;
    same_both_ways(
        &engine,
        "SELECT id, predict('linear', f0, f1, f2, f3, f4, f5, f6, f7, f8, f9) AS score \
         FROM 'data/sample/features.parquet' ORDER BY id",
        true,
    )
    .await;
}

#[tokio::test]
async fn a_file_gone_after_planning_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gone.parquet");
    write(&file, 0, 1_000, 1_000, true);
    let engine = engine(2);
    let frame = engine
        .sql(&format!("SELECT * FROM '{}'", file.display()))
        .await
        .unwrap();
    let task = frame.task_ctx();
    let physical = frame.create_physical_plan().await.unwrap();
    std::fs::remove_file(&file).unwrap();
    let err = datafusion::physical_plan::collect(physical, Arc::new(task))
        .await
        .expect_err("the file is gone");
    let message = err.to_string();
    assert!(
        message.contains("gone.parquet") && message.contains("No such file"),
        "{message}"
    );
}

/// pyarrow's own aggregates of the files `data/make_edge_cases.py` wrote with it.
fn pyarrow_expected(file: &str) -> serde_json::Value {
    let text = std::fs::read_to_string("data/fixtures/scan/expected.json").unwrap();
    let all: serde_json::Value = serde_json::from_str(&text).unwrap();
    all[file].clone()
}

fn number(batch: &RecordBatch, column: &str) -> f64 {
    let array = batch.column_by_name(column).unwrap();
    let array = datafusion::arrow::compute::cast(array, &DataType::Float64).unwrap();
    array
        .as_any()
        .downcast_ref::<Float64Array>()
        .unwrap()
        .value(0)
}

#[tokio::test]
async fn every_valid_parquet_file_is_read_lists_with_empty_data_pages() {
    // pyarrow with tiny pages and one row per write ends some pages with no value in them.
    for file in ["empty_pages_v1", "empty_pages_v2", "empty_pages_int64"] {
        let engine = engine(2);
        let path = format!("data/fixtures/scan/{file}.parquet");
        let sums = same_both_ways(
            &engine,
            &format!("SELECT count(*) AS n, sum(id) AS s, sum(v[1]) AS v1 FROM '{path}'"),
            true,
        )
        .await;
        let want = pyarrow_expected(file);
        assert_eq!(number(&sums, "n"), want["rows"].as_f64().unwrap(), "{file}");
        assert_eq!(
            number(&sums, "s"),
            want["sum_id"].as_f64().unwrap(),
            "{file}"
        );
        assert_eq!(
            number(&sums, "v1"),
            want["sum_v1"].as_f64().unwrap(),
            "{file}"
        );
        // Row for row: v = [4 id, 4 id + 1, 4 id + 2, 4 id + 3], as written.
        let wrong = same_both_ways(
            &engine,
            &format!(
                "SELECT count(*) AS n FROM '{path}' WHERE v[1] <> id * 4 OR v[2] <> id * 4 + 1 \
                 OR v[3] <> id * 4 + 2 OR v[4] <> id * 4 + 3"
            ),
            true,
        )
        .await;
        assert_eq!(number(&wrong, "n"), 0.0, "{file}");
    }
}

#[tokio::test]
async fn every_valid_parquet_file_is_read_in_every_encoding_through_row_range_splits() {
    let engine = engine(4);
    // (file, the row-for-row check against the values pyarrow was given, ranges read)
    let cases = [
        (
            "encodings",
            "split <> id * 0.25 OR dict_text <> concat('city', id % 7) \
             OR plain_text <> concat('r', id % 1000) OR flag <> (id % 3 = 0) OR plain <> id * 3",
            // One row group split into a range per partition.
            "row groups or ranges=4",
        ),
        (
            "delta",
            "CAST(h AS BIGINT) <> (id * 2654435761) % 4294967296 OR d32 <> id * 7 - 3000000 \
             OR len_text <> concat('r', id % 1000) \
             OR prefix_text <> concat('prefix-', lpad(CAST(id / 100 AS VARCHAR), 6, '0'))",
            // Skipping into DELTA_BINARY_PACKED pages fails in arrow-rs: read whole.
            "row groups or ranges=1",
        ),
    ];
    for (file, wrong, ranges) in cases {
        let path = format!("data/fixtures/scan/{file}.parquet");
        let want = pyarrow_expected(file);
        let columns: Vec<String> = want["encodings"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        collect(&engine, "SET batchinfer.streaming_scan = true").await;
        let shown = plan(&engine, &format!("SELECT * FROM '{path}'")).await;
        assert!(shown.contains(ranges), "{file}:\n{shown}");
        let sums: Vec<String> = columns
            .iter()
            .filter(|c| want.get(format!("sum_{c}")).is_some())
            .map(|c| format!("sum(CAST({c} AS DOUBLE)) AS sum_{c}"))
            .chain(
                columns
                    .iter()
                    .filter(|c| want.get(format!("distinct_{c}")).is_some())
                    .map(|c| format!("count(DISTINCT {c}) AS distinct_{c}")),
            )
            .collect();
        let got = same_both_ways(
            &engine,
            &format!(
                "SELECT count(*) AS rows, {}, sum(CASE WHEN {wrong} THEN 1 ELSE 0 END) AS wrong \
                 FROM '{path}'",
                sums.join(", ")
            ),
            true,
        )
        .await;
        assert_eq!(
            number(&got, "rows"),
            want["rows"].as_f64().unwrap(),
            "{file}"
        );
        assert_eq!(
            number(&got, "wrong"),
            0.0,
            "{file}: rows differ from what was written"
        );
        for (key, value) in want.as_object().unwrap() {
            if key.starts_with("sum_") || key.starts_with("distinct_") {
                assert_eq!(number(&got, key), value.as_f64().unwrap(), "{file}: {key}");
            }
        }
        // Both readers give the same rows, every column.
        same_both_ways(
            &engine,
            &format!("SELECT * FROM '{path}' ORDER BY id"),
            true,
        )
        .await;
    }
}
