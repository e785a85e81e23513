//! The `batchinfer` command line: a thin layer over the library's [`Engine`].

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::str::FromStr;

use batchinfer::cluster::{self, Remote};
use batchinfer::config::{Device, GraphOptimization, parse_size};
use batchinfer::engine::{EngineOptions, MAX_BATCH_ROWS, MAX_PARALLEL, check_count};
use batchinfer::message::display_error;
use batchinfer::output::OutputFormat;
use batchinfer::runner::Runner;
use batchinfer::serve::{Credentials, ServeOptions};
use batchinfer::shell::{ShellOptions, run_shell};
use batchinfer::view::schedule::{Schedule, parse_duration};
use batchinfer::{Engine, EngineConfig, Error, Result};
use clap::{Args, Parser, Subcommand};

/// Batch inference in SQL: ONNX models over Parquet, with DataFusion and ONNX Runtime.
#[derive(Debug, Parser)]
#[command(name = "batchinfer", version, about, long_about = None)]
struct Cli {
    #[command(flatten)]
    engine: EngineArgs,

    #[command(subcommand)]
    command: Option<Command>,
}

/// Options that set up the engine; accepted before or after the subcommand.
#[derive(Debug, Args)]
struct EngineArgs {
    /// Folder (or s3://, gs://, az:// prefix) of ONNX models: NAME.onnx and NAME/model.onnx are
    /// the model NAME
    #[arg(long, global = true, env = "BATCHINFER_MODELS", value_name = "DIR")]
    models: Option<PathBuf>,

    /// How result rows are printed
    #[arg(long, global = true, value_enum, default_value_t = OutputFormat::Table)]
    format: OutputFormat,

    /// Partitions scored in parallel [default: the number of cores]
    #[arg(long, global = true, value_name = "N", value_parser = count(MAX_PARALLEL))]
    partitions: Option<usize>,

    /// Model calls that run at once, per model, on its one ONNX Runtime session [default: one per partition]
    #[arg(long, global = true, value_name = "N", value_parser = count(MAX_PARALLEL))]
    sessions: Option<usize>,

    /// ONNX Runtime threads inside each call [default: cores / sessions, at least 1]
    #[arg(long, global = true, value_name = "N", value_parser = count(MAX_PARALLEL))]
    threads: Option<usize>,

    /// Rows per record batch read from the input [default: 8192; 65536 on a GPU]
    #[arg(long, global = true, value_name = "ROWS", value_parser = count(MAX_BATCH_ROWS))]
    batch_rows: Option<usize>,

    /// ONNX Runtime graph optimizations applied when a model is loaded
    #[arg(long, global = true, value_enum, default_value_t = GraphOptimization::All)]
    graph_optimization: GraphOptimization,

    /// Memory for sorts, aggregations and joins before they spill to disk, e.g. 2G [default: no limit]
    #[arg(long, global = true, value_name = "SIZE", value_parser = parse_size)]
    memory_limit: Option<usize>,

    /// Where model definitions and CREATE TABLE ... AS tables persist (a folder, or an s3://,
    /// gs:// or az:// prefix)
    #[arg(
        long,
        global = true,
        env = "BATCHINFER_WAREHOUSE",
        value_name = "DIR",
        default_value = "warehouse"
    )]
    warehouse: PathBuf,

    /// After each statement, print rows, wall time and the time spent inside the model
    #[arg(long, global = true)]
    timing: bool,

    /// Where models run: cpu, cuda (GPU 0), cuda:N, or auto (CUDA where usable, else the CPU)
    #[arg(
        long,
        global = true,
        env = "BATCHINFER_DEVICE",
        default_value = "cpu",
        value_parser = Device::from_str
    )]
    device: Device,

    /// Run statements on a DataFusion Ballista cluster, whose scheduler is at df://HOST:PORT
    #[arg(long, global = true, env = "BATCHINFER_REMOTE", value_name = "URL", value_parser = Remote::from_str)]
    remote: Option<Remote>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run SQL statements from -e and -f (or standard input) and exit
    Query {
        /// SQL to run; several statements separated by ';'. May be repeated.
        #[arg(short = 'e', long = "execute", value_name = "SQL")]
        execute: Vec<String>,
        /// A file of SQL statements separated by ';' ('-' for standard input). May be repeated;
        /// files run before -e statements.
        #[arg(short = 'f', long = "file", value_name = "FILE")]
        file: Vec<PathBuf>,
    },
    /// Read statements from the terminal (or standard input), run each as it is completed by ';'
    Shell,
    /// Refresh a materialized view: once, every so often (--every), or as files arrive (--watch)
    Refresh {
        /// The view
        view: String,
        /// Refresh now, then every DURATION (e.g. 15m, 1h)
        #[arg(long, value_name = "DURATION", value_parser = parse_duration, conflicts_with = "watch")]
        every: Option<std::time::Duration>,
        /// Refresh as soon as input files are added, changed or removed
        #[arg(long)]
        watch: bool,
        /// With --watch: how often the input files are looked at
        #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "30s", requires = "watch")]
        poll: std::time::Duration,
        /// Endpoint models in batch mode: wait at most DURATION for their batches ('0s': submit
        /// them and come back later); past it the refresh writes nothing, the batches go on, and
        /// the next refresh takes their answers
        #[arg(long, value_name = "DURATION", value_parser = parse_wait)]
        batch_wait: Option<std::time::Duration>,
    },
    /// Serve SQL over Arrow Flight SQL (ADBC and other Flight SQL clients) until stopped. Clients show
    /// BATCHINFER_TOKEN as a bearer token, or log in as --user with BATCHINFER_PASSWORD
    Serve {
        /// Address to listen on; one not on this machine needs authentication
        #[arg(long, default_value = "127.0.0.1:32010", value_name = "HOST:PORT")]
        bind: SocketAddr,
        /// A file whose first line is the bearer token (instead of BATCHINFER_TOKEN)
        #[arg(long, value_name = "FILE")]
        token_file: Option<PathBuf>,
        /// The user that logs in with a password (BATCHINFER_PASSWORD or --password-file)
        #[arg(long, value_name = "NAME")]
        user: Option<String>,
        /// A file whose first line is --user's password (instead of BATCHINFER_PASSWORD)
        #[arg(long, value_name = "FILE")]
        password_file: Option<PathBuf>,
        /// Serve an address beyond this machine with no authentication
        #[arg(long)]
        insecure_no_auth: bool,
        /// TLS: the server's certificate chain, a PEM file
        #[arg(long, value_name = "FILE", requires = "tls_key")]
        tls_cert: Option<PathBuf>,
        /// TLS: the certificate's private key, a PEM file
        #[arg(long, value_name = "FILE", requires = "tls_cert")]
        tls_key: Option<PathBuf>,
        /// Statements that run at once, all clients together; the others wait
        #[arg(long, default_value_t = 8, value_name = "N", value_parser = count(MAX_PARALLEL))]
        max_statements: usize,
        /// Cancel a statement still running (or streaming its rows) after this long, e.g. 10m
        /// [default: none]
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        statement_timeout: Option<std::time::Duration>,
        /// End a client's session after this long with no call
        #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "8h")]
        idle_timeout: std::time::Duration,
        /// Clients read and write local files only under DIR (repeatable; links resolved).
        /// Default beyond loopback: no local file but the warehouse's
        #[arg(long = "allow-dir", value_name = "DIR")]
        allow_dirs: Vec<PathBuf>,
        /// Clients read and write no local file (the warehouse's tables and models still work)
        #[arg(long, conflicts_with = "allow_dirs")]
        no_local_files: bool,
        /// Clients read and write object stores only under PREFIX, e.g. s3://bucket/data/
        /// (repeatable)
        #[arg(long = "allow-url", value_name = "PREFIX")]
        allow_urls: Vec<String>,
        /// Clients run no statement that writes (COPY, CREATE, INSERT, DROP, ALTER, VACUUM ...)
        #[arg(long)]
        read_only: bool,
    },
    /// Run a cluster scheduler (DataFusion Ballista) until stopped
    Scheduler {
        /// Address to listen on
        #[arg(long, default_value = "127.0.0.1:50050", value_name = "HOST:PORT")]
        bind: SocketAddr,
        /// How long a query that comes when no executor is registered waits for one before it
        /// fails
        #[arg(long, default_value_t = 30, value_name = "SECONDS",
              value_parser = clap::value_parser!(u64).range(0..=batchinfer::cluster::MAX_EXECUTOR_WAIT_SECONDS))]
        executor_wait: u64,
    },
    /// Run a cluster executor, which runs the tasks a scheduler gives it, until stopped
    Executor {
        /// The scheduler
        #[arg(long, default_value = "localhost:50050", value_name = "HOST:PORT", value_parser = Remote::from_str)]
        scheduler: Remote,
        /// Address to listen on, as the scheduler and other executors reach it
        #[arg(long, default_value = "127.0.0.1", value_name = "HOST")]
        bind_host: String,
        /// Arrow Flight port for shuffle data; the executor's gRPC port is the next one
        #[arg(long, default_value_t = 50051)]
        port: u16,
        /// Tasks run at once (default: the cores)
        #[arg(long, value_name = "N", value_parser = count(MAX_PARALLEL))]
        concurrent_tasks: Option<usize>,
        /// Folder for shuffle files (default: a temporary folder)
        #[arg(long, value_name = "DIR")]
        work_dir: Option<PathBuf>,
    },
}

/// Allocations of 4 MiB and more (a run of prepared images, a batch of token embeddings) are
/// mapped, and given back, each time. glibc's own threshold rises to the largest block freed
/// (up to 32 MiB), after which such blocks come from its heaps, fragment them, and the process
/// grows with the number of batches: open_nsfw over 1,000 then 10,000 small photos peaked at
/// 903 then 1,125 MiB, and at 1,001 then 1,007 MiB with this. A lower threshold costs tabular
/// scoring time (1 MiB: 4% more; 128 KiB: 48%); this one none measurable.
/// glibc's own `MALLOC_MMAP_THRESHOLD_`, where set, is left as it is.
fn fixed_mmap_threshold() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
        // SAFETY: mallopt only sets a parameter of the allocator; no other thread exists yet.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 4 << 20);
        }
    }
}

/// The argument that makes this program a worker reading PDFs for another batchinfer.
const PDF_WORKER: &str = "__pdf-worker";

fn main() -> ExitCode {
    if std::env::args_os().nth(1).is_some_and(|a| a == PDF_WORKER) {
        return batchinfer::documents::worker::serve();
    }
    if let Ok(me) = std::env::current_exe() {
        batchinfer::documents::worker::started_by(vec![me.into(), PDF_WORKER.into()]);
    }
    batchinfer::error::record_panics();
    fixed_mmap_threshold();
    if std::env::var_os("ORT_DISABLE_TELEMETRY").is_none() {
        // SAFETY: no other thread exists yet. ONNX Runtime reads it when it is loaded.
        unsafe { std::env::set_var("ORT_DISABLE_TELEMETRY", "1") };
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // --help and --version print and succeed; a usage error is one message and status 1.
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            let text = e.render().to_string();
            eprint!("Error: {}", text.strip_prefix("error: ").unwrap_or(&text));
            return ExitCode::FAILURE;
        }
    };
    // Statements are planned on this thread and run on the runtime's: both with stacks deep
    // enough for expressions at the depth batchinfer accepts (limits::MAX_EXPRESSION_DEPTH).
    let main = std::thread::Builder::new()
        .name("batchinfer".into())
        .stack_size(STACK_BYTES)
        .spawn(move || run(cli));
    let ended = main.map(|thread| thread.join());
    batchinfer::documents::worker::stop();
    match ended {
        Ok(Ok(code)) => code,
        Ok(Err(panic)) => {
            let message = batchinfer::error::panic_message(panic.as_ref());
            eprintln!("Error: {}", Error::Internal(message));
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("Error: cannot start: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The stack of the threads that plan and run statements.
const STACK_BYTES: usize = 64 << 20;

fn run(cli: Cli) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(STACK_BYTES)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("Error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(main_inner(cli));
    // Work still running now has nothing left to deliver (a cancelled statement's discards are
    // done): a thread blocked for good (opening a FIFO) must not hold the process open.
    runtime.shutdown_timeout(std::time::Duration::from_secs(5));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // A reader that stopped reading (`batchinfer ... | head`) is not a failure.
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::BrokenPipe => {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("Error: {}", display_error(&e));
            ExitCode::FAILURE
        }
    }
}

/// The engine's options from the command line.
fn engine_options(args: &EngineArgs) -> EngineOptions {
    EngineOptions {
        models: args.models.clone(),
        partitions: args.partitions,
        sessions: args.sessions,
        threads: args.threads,
        batch_rows: args.batch_rows,
        graph_optimization: args.graph_optimization,
        memory_limit: args.memory_limit,
        warehouse: Some(args.warehouse.clone()),
        device: args.device,
        remote: args.remote.clone(),
    }
}

async fn main_inner(cli: Cli) -> Result<()> {
    let args = cli.engine;
    let config = engine_options(&args).config()?;
    match cli.command {
        Some(Command::Scheduler {
            bind,
            executor_wait,
        }) => {
            let wait = std::time::Duration::from_secs(executor_wait);
            return cluster::run_scheduler(bind, wait, &config).await;
        }
        Some(Command::Executor {
            scheduler,
            bind_host,
            port,
            concurrent_tasks,
            work_dir,
        }) => {
            let options = cluster::ExecutorOptions {
                scheduler,
                bind_host,
                port,
                concurrent_tasks: concurrent_tasks.unwrap_or_else(EngineConfig::cores),
                work_dir: work_dir.map(|d| d.display().to_string()),
            };
            return cluster::run_executor(options, &config).await;
        }
        _ => {}
    }
    if let Some(Command::Serve {
        bind,
        token_file,
        user,
        password_file,
        insecure_no_auth,
        tls_cert,
        tls_key,
        max_statements,
        statement_timeout,
        idle_timeout,
        allow_dirs,
        no_local_files,
        allow_urls,
        read_only,
    }) = cli.command
    {
        let credentials = Credentials::new(
            secret_variable("BATCHINFER_TOKEN")?,
            token_file.as_deref(),
            user,
            secret_variable("BATCHINFER_PASSWORD")?,
            password_file.as_deref(),
        )?;
        let options = ServeOptions {
            bind,
            credentials,
            insecure_no_auth,
            tls: tls_cert.zip(tls_key),
            max_statements,
            statement_timeout,
            idle_timeout,
            confinement: batchinfer::serve::Confinement {
                allow_dirs,
                no_local_files,
                allow_urls,
                read_only,
            },
        };
        let engine = Engine::open(config).await?;
        return batchinfer::serve::serve(engine, options).await;
    }
    batchinfer::runner::exit_on_unheeded_signals();
    let engine = Engine::open(config).await?;
    match cli.command {
        Some(Command::Query { execute, file }) => {
            let mut scripts = Vec::new();
            for path in &file {
                scripts.push(read_script(path)?);
            }
            scripts.extend(execute);
            if scripts.is_empty() {
                scripts.push(read_script(&PathBuf::from("-"))?);
            }
            let runner = Runner {
                engine: &engine,
                format: args.format,
                timing: args.timing,
            };
            for script in scripts {
                runner.run_script(&script).await?;
            }
            Ok(())
        }
        Some(Command::Refresh {
            view,
            every,
            watch,
            poll,
            batch_wait,
        }) => {
            if let Some(wait) = batch_wait {
                let millis = wait.as_millis();
                engine
                    .sql(&format!("SET batchinfer.llm_batch_wait = '{millis}ms'"))
                    .await?;
            }
            let schedule = match (every, watch) {
                (Some(period), _) => Schedule::Every(period),
                (None, true) => Schedule::Watch(poll),
                (None, false) => Schedule::Once,
            };
            batchinfer::runner::refresh_view(&engine, &view, schedule).await
        }
        Some(
            Command::Shell
            | Command::Scheduler { .. }
            | Command::Executor { .. }
            | Command::Serve { .. },
        )
        | None => shell(&engine, args.format, args.timing).await,
    }
}

/// A wait: a duration from 0 (`0s`) to a year.
fn parse_wait(text: &str) -> Result<std::time::Duration> {
    match humantime::parse_duration(text.trim()) {
        Ok(d) if d <= std::time::Duration::from_secs(366 * 86_400) => Ok(d),
        Ok(_) => Err(Error::Usage(format!("'{text}' is longer than a year"))),
        Err(e) => Err(Error::Usage(format!(
            "'{text}' is not a duration (as '0s', '10m', '2h'): {e}"
        ))),
    }
}

/// A secret from the environment variable `name` (None where unset or empty).
fn secret_variable(name: &str) -> Result<Option<String>> {
    match std::env::var(name) {
        Ok(value) if value.is_empty() => Ok(None),
        Ok(value) => Ok(Some(value)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => {
            Err(Error::Usage(format!("{name} is not UTF-8 text")))
        }
    }
}

/// A parser of a count from 1 to `max`.
fn count(max: usize) -> impl Fn(&str) -> Result<usize> + Clone {
    move |text| match text.parse::<usize>() {
        Ok(n) => check_count(n, max).map_err(|e| Error::Usage(e.to_string())),
        Err(e) => Err(Error::Usage(e.to_string())),
    }
}

/// The largest SQL script read (`-f`, or standard input).
const SCRIPT_CAP: u64 = 64 << 20;

/// A script's text: from a file (a pipe such as `<(...)` too), or standard input for `-`; at most
/// [`SCRIPT_CAP`] bytes, so that `-f /dev/zero` is an error, not all of memory.
fn read_script(path: &PathBuf) -> Result<String> {
    use std::io::Read;
    let (what, reader): (String, Box<dyn Read>) = if path.as_os_str() == "-" {
        ("standard input".into(), Box::new(std::io::stdin()))
    } else {
        let file = std::fs::File::open(path)
            .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
        (path.display().to_string(), Box::new(file))
    };
    let mut text = String::new();
    reader
        .take(SCRIPT_CAP + 1)
        .read_to_string(&mut text)
        .map_err(|e| Error::io(format!("reading {what}"), e))?;
    if text.len() as u64 > SCRIPT_CAP {
        return Err(Error::Usage(format!(
            "{what} holds more than {SCRIPT_CAP} bytes of SQL, the most a script may have"
        )));
    }
    Ok(text)
}

/// The shell: the interactive one on a terminal, else statements read from standard input and
/// run as each is completed by ';' (errors are reported and the rest still run).
async fn shell(engine: &Engine, format: OutputFormat, timing: bool) -> Result<()> {
    if std::io::stdin().is_terminal() {
        let options = ShellOptions {
            format,
            timing: true,
            color: true,
        };
        return run_shell(engine, options).await;
    }
    let mut runner = Runner {
        engine,
        format,
        timing,
    };
    runner.run_lines(std::io::stdin().lock()).await
}
