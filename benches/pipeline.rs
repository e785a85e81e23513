//! End-to-end benchmarks: Parquet in, model, Parquet out, each contender in a process of its own
//! so that wall time and peak memory (RSS) are measured the same way for all.
//!
//! ```sh
//! pip install -r benches/requirements.txt      # for the Python baseline
//! cargo bench --bench pipeline                 # 10,000,000 rows (and 1,000,000 for memory)
//! cargo bench --bench pipeline -- --rows 2000000 --repeat 5
//! ```
//!
//! Contenders, all on the same file of `id: int64, f0..f9: float32`:
//! - (a) batchinfer: `COPY (SELECT id, predict('linear', f0..f9) ...) TO ...`
//! - (b) the same query with the model replaced by its arithmetic (`w0*f0 + ... + b`, in
//!   float32): the engine's own Parquet-to-Parquet ceiling;
//! - (c) `benches/python_baseline.py`: pyarrow batches -> numpy -> onnxruntime -> pyarrow writer;
//! - (d) ONNX Runtime alone on the same tensors already in memory (best of a few configurations);
//! - the `FixedSizeList<Float32, 10>` layout of the same features (the zero-copy path);
//! - one ONNX Runtime session shared by all partitions versus one per partition;
//! - (a) at 1,000,000 rows, for the memory ratio.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

mod common;

use batchinfer::{Engine, EngineConfig};
use common::run_measured;
use datafusion::arrow::array::{
    ArrayRef, FixedSizeListArray, Float32Array, Int64Array, RecordBatch,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::basic::Compression;
use datafusion::parquet::file::properties::WriterProperties;

const MODEL: &str = "data/models/linear.onnx";
const FEATURES: usize = 10;

struct Options {
    rows: usize,
    repeat: usize,
    python: String,
}

fn options() -> Options {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    Options {
        rows: value("--rows")
            .and_then(|v| v.parse().ok())
            .unwrap_or(10_000_000),
        repeat: value("--repeat").and_then(|v| v.parse().ok()).unwrap_or(3),
        python: value("--python").unwrap_or_else(|| "python3".to_string()),
    }
}

/// A splitmix64 stream: the same features on every machine, with no dependency.
struct Rng(u64);
impl Rng {
    fn next_f32(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
    }
}

/// pyarrow's default row group: 1,048,576 rows.
const PYARROW_ROW_GROUP: usize = 1 << 20;
/// Row groups that even a 1M-row file has enough of for every partition.
const SMALL_ROW_GROUP: usize = 1 << 17;

/// Writes `features_N.parquet` (f0..f9) and `vectors_N.parquet` (one FixedSizeList column) with
/// row groups of `row_group` rows, snappy, unless they exist.
fn make_data(dir: &Path, rows: usize, row_group: usize) -> (PathBuf, PathBuf) {
    let features = dir.join(format!("features_{rows}_rg{row_group}.parquet"));
    let vectors = dir.join(format!("vectors_{rows}_rg{row_group}.parquet"));
    if features.is_file() && vectors.is_file() {
        return (features, vectors);
    }
    std::fs::create_dir_all(dir).unwrap();
    let mut scalar_fields = vec![Field::new("id", DataType::Int64, false)];
    scalar_fields
        .extend((0..FEATURES).map(|j| Field::new(format!("f{j}"), DataType::Float32, false)));
    let scalar_schema = Arc::new(Schema::new(scalar_fields));
    let item = Arc::new(Field::new_list_field(DataType::Float32, false));
    let vector_schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new(
            "features",
            DataType::FixedSizeList(item.clone(), FEATURES as i32),
            false,
        ),
    ]));
    let props = || {
        WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_max_row_group_row_count(Some(row_group))
            .build()
    };
    let mut scalar_writer = ArrowWriter::try_new(
        std::fs::File::create(&features).unwrap(),
        scalar_schema.clone(),
        Some(props()),
    )
    .unwrap();
    let mut vector_writer = ArrowWriter::try_new(
        std::fs::File::create(&vectors).unwrap(),
        vector_schema.clone(),
        Some(props()),
    )
    .unwrap();
    let mut rng = Rng(20261130);
    let chunk = 65536;
    let mut start = 0;
    while start < rows {
        let n = chunk.min(rows - start);
        let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(
            start as i64..(start + n) as i64,
        ));
        let row_major: Vec<f32> = (0..n * FEATURES).map(|_| rng.next_f32()).collect();
        let mut columns = vec![ids.clone()];
        for j in 0..FEATURES {
            let column =
                Float32Array::from_iter_values((0..n).map(|i| row_major[i * FEATURES + j]));
            columns.push(Arc::new(column));
        }
        scalar_writer
            .write(&RecordBatch::try_new(scalar_schema.clone(), columns).unwrap())
            .unwrap();
        let list = FixedSizeListArray::new(
            item.clone(),
            FEATURES as i32,
            Arc::new(Float32Array::from(row_major)),
            None,
        );
        vector_writer
            .write(&RecordBatch::try_new(vector_schema.clone(), vec![ids, Arc::new(list)]).unwrap())
            .unwrap();
        start += n;
    }
    scalar_writer.close().unwrap();
    vector_writer.close().unwrap();
    (features, vectors)
}

/// The linear model's weights, read back through the model itself: w_j = f(e_j) - f(0), b = f(0).
fn linear_weights() -> (Vec<f64>, f64) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let engine = Engine::new(EngineConfig {
            models_dir: Some("data/models".into()),
            ..Default::default()
        })
        .unwrap();
        let call = |hot: Option<usize>| {
            let args: Vec<String> = (0..FEATURES)
                .map(|j| {
                    if Some(j) == hot {
                        "1.0".into()
                    } else {
                        "0.0".into()
                    }
                })
                .collect();
            format!("CAST(predict('linear', {}) AS DOUBLE)", args.join(", "))
        };
        let mut selects = vec![call(None)];
        selects.extend((0..FEATURES).map(|j| call(Some(j))));
        let batches = engine
            .sql(&format!("SELECT {}", selects.join(", ")))
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let value = |c: usize| {
            batches[0]
                .column(c)
                .as_any()
                .downcast_ref::<datafusion::arrow::array::Float64Array>()
                .unwrap()
                .value(0)
        };
        let bias = value(0);
        ((1..=FEATURES).map(|c| value(c) - bias).collect(), bias)
    })
}

/// One measured run: wall seconds and the peak resident memory of the process, in MiB.
#[derive(Clone, Copy)]
struct Run {
    seconds: f64,
    peak_mib: f64,
}

/// A contender's name and how to start one run of it.
type Contender<'a> = (&'a str, Box<dyn Fn() -> Command>);

/// Runs every contender `repeat` times, in rounds of one run each; per contender, the median
/// wall time and the largest peak RSS.
fn measure_rounds(contenders: &[Contender], repeat: usize) -> Vec<Run> {
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); contenders.len()];
    for _ in 0..repeat {
        for ((name, make), runs) in contenders.iter().zip(&mut runs) {
            let (seconds, peak_mib) = run_measured(name, make());
            runs.push(Run { seconds, peak_mib });
        }
    }
    runs.into_iter()
        .map(|mut runs| {
            runs.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
            Run {
                seconds: runs[runs.len() / 2].seconds,
                peak_mib: runs.iter().map(|r| r.peak_mib).fold(0.0, f64::max),
            }
        })
        .collect()
}

fn batchinfer(sql: String, extra: &[&str]) -> impl Fn() -> Command {
    let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    move || {
        let mut c = Command::new(env!("CARGO_BIN_EXE_batchinfer"));
        c.args(["query", "--models", "data/models"])
            .args(&extra)
            .args(["-e", &sql]);
        c
    }
}

/// (d): ONNX Runtime alone, tensors already in memory; the best of a few batch sizes and threads.
fn onnxruntime_alone(rows: usize) -> (f64, String) {
    use ort::session::Session;
    use ort::value::TensorRef;
    batchinfer::device::Target::Cpu.environment().unwrap();
    let mut rng = Rng(20261130);
    let data: Vec<f32> = (0..rows * FEATURES).map(|_| rng.next_f32()).collect();
    let cores = EngineConfig::cores();
    let mut best = (f64::MAX, String::new());
    for threads in [1, cores] {
        for batch in [8192usize, 65536] {
            let env = batchinfer::device::Target::Cpu.environment().unwrap();
            let mut session = Session::builder(env)
                .unwrap()
                .with_intra_threads(threads)
                .unwrap()
                .commit_from_file(MODEL)
                .unwrap();
            let start = Instant::now();
            for chunk in data.chunks(batch * FEATURES) {
                let n = chunk.len() / FEATURES;
                let input = TensorRef::from_array_view(([n, FEATURES], chunk)).unwrap();
                let out = session.run(ort::inputs![input]).unwrap();
                std::hint::black_box(out[0].try_extract_tensor::<f32>().unwrap().1[0]);
            }
            let seconds = start.elapsed().as_secs_f64();
            if seconds < best.0 {
                best = (seconds, format!("{batch} rows/call, {threads} thread(s)"));
            }
        }
    }
    best
}

fn main() {
    let opts = options();
    let dir = PathBuf::from("target/bench-data");
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    eprintln!(
        "preparing {} rows in {} (kept for later runs)",
        opts.rows,
        dir.display()
    );
    let (features, vectors) = make_data(&dir, opts.rows, PYARROW_ROW_GROUP);
    let (features_1m, _) = make_data(&dir, 1_000_000, PYARROW_ROW_GROUP);
    // The same sizes with row groups small enough that both files are read by every partition:
    // their peaks differ only by what would accumulate.
    let (features_small_rg, _) = make_data(&dir, opts.rows, SMALL_ROW_GROUP);
    let (features_1m_small_rg, _) = make_data(&dir, 1_000_000, SMALL_ROW_GROUP);
    let (weights, bias) = linear_weights();

    let cols: Vec<String> = (0..FEATURES).map(|j| format!("f{j}")).collect();
    let predict = format!("predict('linear', {})", cols.join(", "));
    // In float32, as the model computes, so that both write a Float32 score.
    let arithmetic = format!(
        "{} + CAST({bias:?} AS FLOAT)",
        weights
            .iter()
            .enumerate()
            .map(|(j, w)| format!("CAST({w:?} AS FLOAT) * f{j}"))
            .collect::<Vec<_>>()
            .join(" + ")
    );
    let copy = |expr: &str, from: &Path, to: &str| {
        format!(
            "COPY (SELECT id, {expr} AS score FROM '{}') TO '{}' STORED AS PARQUET",
            from.display(),
            out.join(to).display()
        )
    };
    let r = opts.repeat;
    let list_arithmetic = format!(
        "{} + CAST({bias:?} AS FLOAT)",
        weights
            .iter()
            .enumerate()
            .map(|(j, w)| format!("CAST({w:?} AS FLOAT) * features[{}]", j + 1))
            .collect::<Vec<_>>()
            .join(" + ")
    );
    let python_out = out.join("c.parquet");
    let python = opts.python.clone();
    let features_for_python = features.clone();
    let contenders: Vec<Contender> = vec![
        (
            "(a)",
            Box::new(batchinfer(copy(&predict, &features, "a.parquet"), &[])),
        ),
        (
            "(b)",
            Box::new(batchinfer(copy(&arithmetic, &features, "b.parquet"), &[])),
        ),
        (
            "(c)",
            Box::new(move || {
                let mut cmd = Command::new(&python);
                cmd.args(["benches/python_baseline.py", MODEL])
                    .arg(&features_for_python)
                    .arg(&python_out);
                cmd
            }),
        ),
        (
            "vectors",
            Box::new(batchinfer(
                copy("predict('linear', features)", &vectors, "v.parquet"),
                &[],
            )),
        ),
        (
            "vectors ceiling",
            Box::new(batchinfer(
                copy(&list_arithmetic, &vectors, "vb.parquet"),
                &[],
            )),
        ),
        (
            "shared",
            Box::new(batchinfer(
                copy(&predict, &features, "s.parquet"),
                &["--sessions", "1"],
            )),
        ),
        (
            "1M",
            Box::new(batchinfer(copy(&predict, &features_1m, "m.parquet"), &[])),
        ),
        (
            "(a) small row groups",
            Box::new(batchinfer(
                copy(&predict, &features_small_rg, "a_rg.parquet"),
                &[],
            )),
        ),
        (
            "1M small row groups",
            Box::new(batchinfer(
                copy(&predict, &features_1m_small_rg, "m_rg.parquet"),
                &[],
            )),
        ),
    ];
    eprintln!(
        "running each contender {r} times, in rounds (one run of each per round, so that a machine \
         slowing down mid-run weighs on all of them alike)"
    );
    let runs = measure_rounds(&contenders, r);
    let [
        a,
        b,
        c,
        v,
        v_ceiling,
        shared,
        small,
        a_small_rg,
        small_small_rg,
    ] = runs[..]
    else {
        unreachable!("one result per contender")
    };
    let (d_seconds, d_config) = onnxruntime_alone(opts.rows);

    let m = |rows: usize| format!("{:.0}M", rows as f64 / 1e6);
    let line = |name: &str, rows: usize, run: Run| {
        println!(
            "| {name:<58} | {:>5} | {:>7.3} | {:>8.0} | {:>9.2} |",
            m(rows),
            run.seconds,
            run.peak_mib,
            rows as f64 / run.seconds / 1e6
        )
    };
    println!(
        "\nmachine: {} cores; median of {r} runs; peak = max RSS of the process",
        EngineConfig::cores()
    );
    println!(
        "| {:<58} | {:>5} | {:>7} | {:>8} | {:>9} |",
        "contender", "rows", "wall s", "peak MiB", "M rows/s"
    );
    println!(
        "|{:-<60}|{:-<7}|{:-<9}|{:-<10}|{:-<11}|",
        "", "", "", "", ""
    );
    line("(a) batchinfer predict, 10 float columns", opts.rows, a);
    line(
        "(b) batchinfer, same query with arithmetic (I/O ceiling)",
        opts.rows,
        b,
    );
    line(
        "(c) Python: pyarrow + numpy + onnxruntime + pyarrow writer",
        opts.rows,
        c,
    );
    println!(
        "| {:<58} | {:>5} | {:>7.3} | {:>8} | {:>9.2} |",
        format!("(d) ONNX Runtime alone, in memory ({d_config})"),
        m(opts.rows),
        d_seconds,
        "-",
        opts.rows as f64 / d_seconds / 1e6
    );
    line(
        "(2) batchinfer predict, one FixedSizeList<Float32,10> column",
        opts.rows,
        v,
    );
    line(
        "(2b) the same file, arithmetic on the list elements (ceiling)",
        opts.rows,
        v_ceiling,
    );
    line(
        "    (a) with one session shared by all partitions",
        opts.rows,
        shared,
    );
    line("(4) (a) at 1M rows", 1_000_000, small);
    line(
        "(4') (a), row groups of 131,072 rows",
        opts.rows,
        a_small_rg,
    );
    line(
        "(4') (a) at 1M rows, row groups of 131,072 rows",
        1_000_000,
        small_small_rg,
    );

    let check = |ok: bool| if ok { "met" } else { "NOT met" };
    println!("\nratios (targets in brackets):");
    println!(
        "  (a)/(b) time       {:.2}x  [<= 1.2x]  {}",
        a.seconds / b.seconds,
        check(a.seconds <= 1.2 * b.seconds)
    );
    println!(
        "  (c)/(a) time       {:.2}x  [>= 2.2x]  {}",
        c.seconds / a.seconds,
        check(c.seconds >= 2.2 * a.seconds)
    );
    println!(
        "  (a)/(c) peak       {:.2}x  [< 0.5x]   {}",
        a.peak_mib / c.peak_mib,
        check(a.peak_mib < 0.5 * c.peak_mib)
    );
    println!(
        "  (2)/(a) time       {:.2}x  [<= 1.0x]  {}",
        v.seconds / a.seconds,
        check(v.seconds <= a.seconds)
    );
    println!(
        "  (2)/(2b) time      {:.2}x  (predict on the list column vs arithmetic on the same file)",
        v.seconds / v_ceiling.seconds
    );
    println!(
        "  shared/(a) time    {:.2}x  (one shared session vs one per partition)",
        shared.seconds / a.seconds
    );
    println!(
        "  (a) peak           {:.0} MiB [<= 1024] {}",
        a.peak_mib,
        check(a.peak_mib <= 1024.0)
    );
    println!(
        "  (a) peak 10M/1M    {:.2}x  [<= 1.2x]  {}",
        a.peak_mib / small.peak_mib,
        check(a.peak_mib <= 1.2 * small.peak_mib)
    );
    println!(
        "  (4') peak 10M/1M   {:.2}x  [<= 1.2x]  {}  (both files in row groups of 131,072 rows)",
        a_small_rg.peak_mib / small_small_rg.peak_mib,
        check(a_small_rg.peak_mib <= 1.2 * small_small_rg.peak_mib)
    );
    println!(
        "  (a)/(d) time       {:.2}x  (the model's own share of (a))",
        a.seconds / d_seconds
    );
}
