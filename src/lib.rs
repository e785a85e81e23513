//! batchinfer: batch inference in SQL. ONNX models run over Parquet tables through DataFusion,
//! with ONNX Runtime.
//!
//! ```sql
//! COPY (SELECT id, predict('linear', f0, f1, f2, f3, f4, f5, f6, f7, f8, f9) AS score
//!       FROM 'data/sample/features.parquet')
//! TO 'out/scores.parquet' STORED AS PARQUET;
//! ```
//!
//! # Layout
//! The modules in the order a statement's data flows through them (what each one's files hold:
//! [Each module](#each-module), below). No module imports another that imports it back,
//! directly or through others (`.ci/run` fails on such a cycle: `scripts/module_cycles.py`), and
//! no statement keeps its state in a static ([`statement_context`]).
//!
//! - **Where statements come from**: the command line (`main.rs`, the options made an
//!   [`EngineConfig`] in `engine/options.rs`), [`shell`] (the interactive shell), [`runner`]
//!   (runs statements and prints what they return, for `-e`, `-f`, standard input, the shell and
//!   `batchinfer refresh VIEW`), [`serve`] (the Arrow Flight SQL server, a session per client),
//!   the Python package (`python/`, the workspace's second member); [`commands`] and [`help`]
//!   (the shell's backslash commands), [`signals`] and [`stop`] (Ctrl-C and SIGTERM).
//! - **Parsed and routed**: [`statements`] (DataFusion's parser, with batchinfer's own
//!   statements, limits on what a statement may hold, secrets blanked) → [`engine`] ([`Engine`]:
//!   each statement routed to the feature that runs it) → [`confine`] (what the session may
//!   reach).
//! - **Planned**: [`session`] (every feature's handle on the SQL session), [`context`]
//!   (DataFusion's sessions of every role), [`config`] (settings, a leaf), [`statement_context`]
//!   (the statement at hand and the ledger of what it spends, fails on and keeps), [`catalog`]
//!   (the models and tables a session knows), [`udf`] (the SQL functions), [`rules`] (the
//!   planner's rules), [`cluster`] (one process or a Ballista cluster, [`Placement`]).
//! - **Read**: [`scan`] (local Parquet, streamed), [`blob`] (files as rows), [`documents`]
//!   (PDF, DOCX, HTML and text as pages of text), [`video`] (frames as images), [`database`]
//!   (PostgreSQL and SQLite), [`delta`] (Delta Lake tables), [`storage`] (every path and store,
//!   and the commit of what is written), [`warehouse`] (the models, tables and views that
//!   persist).
//! - **Scored**: [`model`] (the registry, versions and aliases, loaded models, a batch scored),
//!   [`tensor`] (Arrow columns to ONNX Runtime's tensors and back), [`images`] and
//!   [`file_bytes`] (files as a model's input), [`onnx`] (ONNX files as bytes), [`quantize`] and
//!   [`quantized`] (INT8 models), [`runtime`] and [`device`] (ONNX Runtime's library, the CPU or
//!   a GPU), [`llm`] (endpoint models: LLMs and embeddings behind an HTTP API), [`rejects`] (the
//!   rows a model fails on: kept, counted, bounded).
//! - **Kept**: [`write`] (COPY, INSERT, CREATE TABLE ... AS, whole or not at all), [`lineage`]
//!   (the models a write names in its files), [`view`] (materialized views, refreshed).
//! - **Told**: [`output`] (a table, CSV or JSON), [`progress`] (the progress line and a
//!   statement's summary), [`message`] (errors and warnings as a person reads them), [`error`]
//!   (the one error type, naming no feature).
//!
//! ## Each module
//! - [`engine`]: [`Engine`], the library entry point. It parses statements and routes each to the
//!   feature that runs it ([`catalog`], [`view`], [`write`]; a statement DataFusion parsed is
//!   routed once, by what it does, in `route.rs`), each given narrow handles over one
//!   [`session::Session`]; it holds the session, the configuration, the warehouse and the catalog,
//!   nothing more; [`Engine::session`] opens another over the same models, warehouse and memory
//!   pool, with settings of its own (a server's clients). `options.rs`: the engine's options as a
//!   person gives them (the command line's flags, Python's `connect()`), made into its
//!   [`EngineConfig`].
//! - The Python package is the workspace's second member, `python/`: its extension module
//!   (`python/src/`: connections, Arrow C streams in and out, statements run with the GIL released)
//!   over this crate's [`Engine`], [`runner`] and [`progress`], and the Python code around it
//!   (`python/batchinfer/`).
//! - [`session`]: the handle every feature gets on the SQL session: DataFusion's context, the model
//!   registry, where statements run; statements planned and run (`mod.rs`), the `batchinfer.*`
//!   options and the statement at hand (`settings.rs`), the statement tagged for its rejects
//!   (`tag.rs`), the stores a statement's `OPTIONS` connect and its text with secrets blanked
//!   (`stores.rs`), what writes register and report (`tables.rs`), EXPLAIN ANALYZE's rows per model
//!   (`explain.rs`).
//! - [`catalog`]: the models and tables a session knows: the model statements (CREATE, ALTER with
//!   versions and aliases, DROP, SHOW: `models.rs`; endpoint models: `endpoint_models.rs`; DROP
//!   MODEL: `drop_model.rs`; SHOW and CLEAR LLM CACHE: `llm_cache.rs`) and the models brought up
//!   to the warehouse's definitions, every name of a version registered pinned to its sha256
//!   (`definitions.rs`); what
//!   a table name names, CREATE EXTERNAL TABLE by the session's table factories, DROP TABLE, an
//!   INSERT's table (`tables.rs`); statements run with a missing table explained (a view without a
//!   complete refresh, a path the store says why it cannot open: `names.rs`).
//! - [`write`]: the writes that appear whole or not at all (COPY, INSERT: `insert.rs`, CREATE TABLE
//!   ... AS), in this process or on a cluster; a warehouse table's written as one Delta commit
//!   ([`delta::write`]).
//! - [`lineage`]: the models a write names in its files, what its endpoint models did for them
//!   (filled in at commit), and the columns CSV cannot hold.
//! - [`cluster`]: one process or a Ballista cluster, answered once: the engine's [`Placement`]
//!   (`client.rs`), the scheduler and executor processes (`scheduler.rs`, `executor.rs`), what each
//!   holds of stores and models (`node.rs`), and Ballista's codecs with batchinfer's own plan nodes
//!   added (`codec.rs`).
//! - [`context`]: builds the DataFusion sessions of every role (configuration, runtime, functions,
//!   and batchinfer's plan rules, added in one place: `with_rules`).
//! - [`scan`]: the streaming reader for local Parquet: the exec (`exec.rs`), the files (`file.rs`),
//!   the dealing of row groups (`units.rs`), the list columns read from their leaf (`list.rs`) and
//!   the check of their levels (`levels.rs`).
//! - [`database`]: PostgreSQL and SQLite tables (`CREATE EXTERNAL TABLE ... STORED AS POSTGRES |
//!   SQLITE`): where to connect, the providers of datafusion-table-providers, and SQLite's INSERT
//!   in one transaction of its own (`sqlite_insert.rs`).
//! - [`delta`]: Delta Lake tables, through delta-rs over batchinfer's stores: read (`CREATE
//!   EXTERNAL TABLE ... STORED AS DELTATABLE`, the warehouse's tables) at the newest version when a
//!   query is planned or at one pinned (`OPTIONS`, `VERSION AS OF`), `DESCRIBE HISTORY` (`mod.rs`;
//!   the version pinned: `at.rs`; the log: `log.rs`; a version's files checked: `checked.rs`;
//!   `history.rs`); a statement's files made one commit of a table, with its lineage
//!   (`write/mod.rs`), appends raced by another writer (`write/races.rs`), conflicts
//!   (`write/conflicts.rs`) and the columns Delta keeps (`write/columns.rs`); `VACUUM` and
//!   `OPTIMIZE` (`maintenance.rs`).
//! - [`confine`]: a statement checked against what its session may reach before it runs (a
//!   read-only session, the folders and locations it may read and write: `SET
//!   batchinfer.read_only`, `allowed_directories`, `allowed_urls`, or `serve --read-only
//!   --allow-dir --allow-url --no-local-files`), and no write but the catalog's into the
//!   warehouse's folders; every path read or written through a session's stores is checked again
//!   there (`storage/access.rs`, `storage/session_stores.rs`).
//! - [`config`]: plain settings, a leaf that imports nothing of batchinfer: [`EngineConfig`] (fixed
//!   at start), the `SET batchinfer.*` settings, each declared once with its type, default, text
//!   and how a session may change it (`settings.rs`: SET, SHOW, `\h set` and docs/settings.md
//!   are made from it), and the values they take (`values.rs`).
//! - [`statement_context`]: the statement at hand (its id, text, rejects folder, the models a
//!   cluster client sends), set through the session for each statement; no `SET` changes it; its
//!   ledger (the spend, token budget, error tally, rows given NULL and writes a cancellation came
//!   too late for: what it owns, kept as long as it runs).
//! - [`model`]: the registry (name -> model; what each name of a version picks:
//!   `registry/picks.rs`), a model's versions and aliases and the names that reach them
//!   (`versions.rs`: `churn`, `churn@2`, `churn@champion`, parsed, never made into paths), model
//!   sources (URLs), loaded models, a model's one session run by parallel calls, text models'
//!   tokenizers, a classifier's class names (`labels.rs`), what a file says of itself without a
//!   session (`header.rs`: its inputs and outputs, producer, class labels), and the scoring of one
//!   record batch.
//! - [`tensor`]: Arrow arrays to ONNX Runtime tensors and back; the one table of element types
//!   (`element.rs`), a model's inputs and outputs (`signature.rs`), how columns bind to them, by
//!   name or position (`input.rs`), and NULLs as NaN (`nulls.rs`).
//! - [`udf`]: the SQL functions, in one place: `predict`, `embed`, `chunk` (text cut to fit a
//!   model, at its tokenizer), `generate` and `generate_details`, `ai_filter`,
//!   `ai_filter_score` and `ai_classify` (`ai.rs`: questions answered with probabilities; through
//!   a cascade's local proxy first: `ai_cascade.rs`),
//!   `ai_reduce` and `ai_agg` (`ai_reduce.rs`: an instruction over many texts, map-reduced),
//!   `cosine_similarity`, `predict_table`, `models()` and `batchinfer_rejects()`; columns bound
//!   to inputs by name on the statement as written (`by_name.rs`), and the short default names
//!   of model columns (`names.rs`).
//! - [`rules`]: the rules added to DataFusion's planning, in one place: tables whose lists claim
//!   too many values per row refused (`list_limits.rs`), `ai_agg` planned as `ai_reduce` over
//!   the group's texts (`ai_agg.rs`), a file's name passed to the model that reads its content,
//!   for its errors and rejects (`file_names.rs`), each model call once per row
//!   (`once.rs`), model calls only on the rows a top-N or a filter's other conditions keep
//!   (`late_calls.rs`), files read at their ends alone for a model that reads no more of them
//!   (`file_ends.rs`), `embed`'s input gathered across batches and files (`embed_buffer.rs`),
//!   local Parquet read by the streaming reader (`streaming_scan.rs`), video frames kept in the
//!   batches they are decoded in (`frame_batches.rs`), and a model's condition keeping every
//!   row in an estimate (`estimate_rows.rs`).
//! - [`onnx`]: ONNX files as bytes: ONNX's protobuf messages (`proto.rs`, generated), the subsets
//!   of them read of a model without its weights (`outline.rs`: its interface, metadata, class
//!   labels and where its tensors keep their data) and the external data files a model names
//!   (`external.rs`).
//! - [`quantize`]: INT8 dynamic quantization of an ONNX model, its graph rewritten as ONNX
//!   Runtime's own quantizer does it, and the provenance a quantized model carries; [`quantized`]:
//!   the quantized models a warehouse keeps, by content (given the warehouse and the model
//!   registry, not the engine).
//! - [`runtime`]: finding, fetching and loading the ONNX Runtime library (CPU or CUDA build).
//! - [`device`]: `--device cpu | cuda[:N] | auto`, resolved at start-up into the one
//!   [`device::Target`] asked everything that depends on the device; the GPU, the CUDA libraries.
//! - [`output`]: printing results as a table, CSV or JSON.
//! - [`progress`]: the progress line on long statements (on a terminal, or handed to a function)
//!   and the per-statement summary.
//! - [`runner`]: runs statements and prints their results: the one runner behind `-e`, `-f`, piped
//!   standard input, the shell and `batchinfer refresh VIEW`.
//! - [`signals`]: SIGINT and SIGTERM as the process answers them: statements count themselves
//!   running and say when they stopped for one; a signal none answers ends the process.
//! - [`shell`]: the interactive shell (datafusion-cli's line editor helper around the runner).
//! - [`serve`]: `batchinfer serve`, the feature whole: an Arrow Flight SQL server (arrow-flight's
//!   `FlightSqlService`, over tonic) whose clients each get an engine session of their own
//!   ([`Engine::session`]: their `SET` options, over the models, warehouse and memory pool of the
//!   one engine); how clients are let in (`auth.rs`; failed attempts slowed: `throttle.rs`), their
//!   sessions (`sessions.rs`), the protocol's calls (`service.rs`), a client's statements run
//!   (`statement.rs`) on a runtime of their own until their deadline (`running.rs`), what is sent
//!   back (`replies.rs`), bound parameters (`params.rs`) and the catalog browser's calls
//!   (`metadata.rs`).
//! - [`commands`]: the backslash commands and the settings they change, for the shell and for
//!   statements piped to it; [`help`]: what `\?` and `\h` say.
//! - [`statements`]: DataFusion's parser wrapped to read batchinfer's own statements too (the model
//!   statements: `models.rs`), and what is refused before it is tried (`limits.rs`: expressions too
//!   deep, and the most values per row a list may claim), so that no input can crash batchinfer or
//!   exhaust its memory; which names hold secrets, and a statement's text with them blanked
//!   (`secrets.rs`); `VERSION AS OF` and `TIMESTAMP AS OF` read as names of a table's version
//!   (`time_travel.rs`).
//! - [`stop`]: stop signals: the model calls in flight are ended, and the scoring loops look for
//!   one between micro-batches.
//! - [`storage`]: every path, local or in an object store, answered here: where a location points
//!   (`location.rs`), which store a URL is in and the clients of Google Cloud Storage, Azure and
//!   HTTP(S) servers (`cloud.rs`), S3 clients (`s3.rs`) and credentials from the AWS SDK's chain
//!   (`credentials.rs`), the commit of writes per store kind (`commit.rs`, `deferred.rs`,
//!   `deferred_upload.rs`, `staging.rs`) and a value filled into a write's files at its commit
//!   (`fill.rs`), the tables of a warehouse: their names, folders, removal and the older layout's
//!   files (`table.rs`; what killed writes left in a local folder, removed in `folder.rs`), whole
//!   files read for models (`files.rs`), a Parquet footer checked before it is trusted
//!   (`footer.rs`), a session's own limits on what its stores read (`session_stores.rs`), local
//!   deletes that never follow a link or leave their folder (`beneath.rs`), and what an object
//!   store's error means for a person (`hints.rs`).
//! - [`view`]: materialized views, the feature whole, given the session, the warehouse and the
//!   catalog ([`view::Views`]): their statements (`statements.rs`, `show.rs`), a refresh
//!   (`refresh/`: units scored and committed, what it repairs), what a refresh has to do
//!   (`plan.rs`), its commits (`commit.rs`), the queries a view may have and the files they read
//!   (Parquet and other tables of files, or `read_blob`'s: `check.rs`), a view read only while
//!   whole (`registered.rs`), and `batchinfer refresh VIEW` once, `--every` so often or
//!   `--watch`ing for new files (`schedule.rs`).
//! - [`warehouse`]: model definitions (`models.rs`: each model's versions and aliases, one manifest
//!   a change, and each version's files kept by content), tables (Delta Lake tables) and views that
//!   persist, over one object store and prefix (a folder or a prefix in S3, Google Cloud Storage or
//!   Azure); the session's default schema over it (`schema.rs`: tables and views looked up by name
//!   when a statement names them, the tables a process registers itself first); a view's manifest,
//!   its format (`view_manifest.rs`), and the files a view may read (its own, of their recorded
//!   sizes: `view_files.rs`, which also makes a view's table).
//! - [`error`]: the crate's error type, its kinds (what a caller branches on), and panics reported
//!   as errors; it imports no feature (a feature's own error converts itself into it, as
//!   `Error::Feature` with its kind); [`message`]: an error as a person reads it, what the engine
//!   says as it works (`say!`: stderr, or where Python sends it), and warnings said once.
//! - [`llm`]: endpoint models (LLMs behind an OpenAI-compatible API) and what `generate` needs of
//!   them: the feature's errors (`mod.rs`), the definition (`definition.rs`), one model at run time
//!   with its requests at once and identical requests sent once (`client/mod.rs`), a request sent
//!   until answered with retries (`client/http.rs`), a reply read (`client/reply.rs`), texts made
//!   vectors (`client/embeddings.rs`), pacing (`pace.rs`), typed output (`output.rs`), questions
//!   answered with probabilities from a reply's log-probabilities (`judge.rs`), the
//!   warehouse's cache of answers (`cache/mod.rs`; its signing secret: `cache/secret.rs`; requests
//!   in flight claimed across processes: `cache/claims.rs`), a statement's spending against its
//!   budget (`spend.rs`), the key blanked in every encoding a reply may echo it in (`redact.rs`);
//!   the registry keeps them beside the model files, and a cluster client's definitions by content
//!   (`model/registry/endpoints.rs`); `embed` of an embedding endpoint is `udf/embed_endpoint.rs`.
//! - [`blob`]: files as rows, `read_blob`, `read_text`, `read_document` and `read_frames`: the
//!   function and its table (`mod.rs`: names, sizes and times listed, a materialized view's files
//!   one unit at a time), their bytes read only when a query uses them (`files.rs`) by the exec
//!   (`exec.rs`), a document's pages as rows (`document.rs`), a video's frames as rows, decoded
//!   ahead of the query a partition at a time (`frames.rs`), and the table and exec as a cluster
//!   sends them (`wire.rs`).
//! - [`documents`]: a document's pages of text, by what its content is (`mod.rs`): a PDF's by
//!   pdfium, fetched from PyPI as ONNX Runtime is (`pdfium.rs`) and run in worker processes, one
//!   per core, each under a memory limit (`worker.rs`: the command line and Python start them), a
//!   Word document's body (`docx.rs`), a web page's text without its boilerplate (`html.rs`).
//! - [`video`]: a video's frames, sampled (`mod.rs`: every frame, every n-th, so many a second or
//!   the key frames), decoded by ffmpeg in a process of its own under a memory limit
//!   (`decoder.rs`), ffmpeg fetched from PyPI as ONNX Runtime is (`ffmpeg.rs`); each frame a PPM
//!   image that [`images`] reads as it reads a photo.
//! - [`images`]: images as model inputs: the preprocessing a model folder declares (`mod.rs`), one
//!   image decoded, oriented, resized as Pillow does (`resample.rs`), cropped and normalized
//!   (`decode.rs`), a BLOB column of them prepared on every core (`column.rs`); `predict` runs them
//!   ahead of the model; [`file_bytes`]: a file's first and last bytes as a model's input (a
//!   content-type model's, as magika's), declared in `batchinfer.json`.
//! - [`rejects`]: the rows a model fails on, kept (`on_error = 'reject'`), counted and bounded
//!   (`max_errors`).

pub mod blob;
pub mod catalog;
pub mod cluster;
pub mod commands;
pub mod config;
pub mod confine;
pub mod context;
pub mod database;
pub mod delta;
pub mod device;
pub mod documents;
pub mod engine;
pub mod error;
pub mod file_bytes;
pub mod help;
pub mod images;
pub mod lineage;
pub mod llm;
pub mod message;
pub mod model;
pub mod onnx;
pub mod output;
pub mod progress;
pub mod quantize;
pub mod quantized;
pub mod rejects;
pub mod rules;
pub mod runner;
pub mod runtime;
pub mod scan;
pub mod serve;
pub mod session;
pub mod shell;
pub mod signals;
pub mod statement_context;
pub mod statements;
pub mod stop;
pub mod storage;
pub mod tensor;
pub mod udf;
pub mod video;
pub mod view;
pub mod warehouse;
pub mod write;

pub use cluster::Placement;
pub use config::EngineConfig;
pub use engine::Engine;
pub use error::{Error, Result};
