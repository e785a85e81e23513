//! What the shell's `\?` and `\h` say: its commands, and batchinfer's functions and statements,
//! each with an example. DataFusion's own functions are listed by `SHOW FUNCTIONS`.

/// `\?`: the shell's commands.
pub const COMMANDS: &str = "\
\\?              this list
\\h              batchinfer's functions and statements
\\h NAME         one of them (DataFusion's functions: SHOW FUNCTIONS LIKE 'abs')
\\d              the tables
\\d NAME         the columns of table NAME
\\timing         the summary line after each statement (rows, time, rows scored), on or off
\\x              one line per column (for wide rows), on or off
\\pset format F  how results print: table, csv, json, ndjson, vertical
\\q              quit (or Ctrl-D)

Statements end with ';'. Ctrl-C stops the running statement; what it wrote is discarded.";

/// One topic of `\h`: the names it answers to, and its text.
struct Topic {
    names: &'static [&'static str],
    text: &'static str,
}

const TOPICS: &[Topic] = &[
    Topic {
        names: &["predict"],
        text: "\
predict('model', column, ...): the model's output for each row
  One column per model input (bound by name when every column is named after an input), or
  scalar columns packed into one input. A model of several outputs returns a struct: read its
  fields with ['label'], ['probabilities'][2]. A row with a NULL feature gets NULL
  (SET batchinfer.nulls = 'nan' feeds NaN to float inputs instead).
  SELECT id, predict('churn', city, age, spend)['label'] AS churns FROM 'customers.parquet';",
    },
    Topic {
        names: &["embed"],
        text: "\
embed('model', text): a text model's embedding of each row (a list of floats)
  The model is a folder with model.onnx and tokenizer.json.
  SELECT id, embed('minilm', sentence) AS v FROM 'sentences.parquet';",
    },
    Topic {
        names: &["chunk"],
        text: "\
chunk(text, 'model', max_tokens [, overlap]): the text cut into chunks that each fit the text
  model (its tokenizer counts, its special tokens included), ending at paragraphs, then
  sentences, then lines; a list of {text, char_start, char_end, tokens}, a row each with unnest.
  SELECT page, c.text AS text, c.char_start AS char_start
  FROM (SELECT page, unnest(chunk(text, 'minilm', 256, 32)) AS c FROM read_document('docs/'));",
    },
    Topic {
        names: &["read_blob", "read_text", "read_document", "read_frames"],
        text: "\
read_blob('folder/ or glob'), read_text(...): a row per file (filename, content, size,
  last_modified), local or in any store; content read only where it is used.
read_document('folder/ or glob'): a row per PDF page, and per DOCX, HTML, Markdown or text file
  (filename, page, pages, text, size, last_modified, has_text, error); a file that cannot be
  read is a row whose error says why.
  SELECT filename, page, text FROM read_document('s3://bucket/contracts/') WHERE error IS NULL;
read_frames('folder/ or glob' [, 'fps=N' | 'every_n_frames=N' | 'keyframes_only']): a row per
  sampled frame of each video (filename, frame, pts, width, height, image, size, last_modified,
  error); image is what predict over an image model takes.
  SELECT filename, pts, predict('nsfw', image) FROM read_frames('videos/', 'fps=1');",
    },
    Topic {
        names: &["predict_table"],
        text: "\
predict_table('model', 'table or path'): every column of the table plus one per model output,
  each model input bound to the column of its name.
  SELECT id, label, probabilities FROM predict_table('churn', 'customers.parquet');",
    },
    Topic {
        names: &["cosine_similarity"],
        text: "\
cosine_similarity(a, b): the cosine of two vectors (lists of floats) of one length
  SELECT cosine_similarity(embed('minilm', q), embed('minilm', d)) AS s FROM 'pairs.parquet';",
    },
    Topic {
        names: &["models"],
        text: "\
models(): one row per model (as SHOW MODELS), to query
  SELECT name, sha256 FROM models() WHERE name LIKE 'churn%';",
    },
    Topic {
        names: &["batchinfer_rejects"],
        text: "\
batchinfer_rejects(): the rows models failed on with SET batchinfer.on_error = 'reject'
  SELECT model, error, inputs FROM batchinfer_rejects();",
    },
    Topic {
        names: &["create model", "model", "create or replace model"],
        text: "\
CREATE [OR REPLACE] MODEL name FROM 'path or URL' [OPTIONS ('quantize' 'int8')]
  Defines a model in the warehouse, its files kept there as they were registered: a file
  rewritten since changes nothing. OR REPLACE adds a version (the newest) and keeps the others.
  CREATE MODEL late FROM 'models/late.onnx';
CREATE [OR REPLACE] MODEL name OPTIONS ('endpoint' 'URL', 'model' 'NAME', ...)
  Defines an endpoint model: an LLM behind an OpenAI-compatible API, called by generate.
  Options: api_key_env (the NAME of the variable holding the key), max_concurrency,
  requests_per_minute, tokens_per_minute, max_tokens, temperature, seed, system,
  input_price_per_million, output_price_per_million, max_retries, timeout;
  'kind' 'embedding' with 'dimensions' N for an embedding endpoint, called by embed.",
    },
    Topic {
        names: &["generate", "generate_details"],
        text: "\
generate('model', prompt [, 'col TYPE, ...']): one request per row to an endpoint model; the
  reply's text (cut where max_tokens cut it), or a struct of the columns given (sent as a
  strict JSON schema, checked here).
generate_details(...): the same request; a struct of reply, finish_reason ('stop', or
  'length' where max_tokens cut it), prompt_tokens, completion_tokens.
  SELECT id, generate('writer', 'Summarize: ' || body) FROM docs;
  SET batchinfer.max_llm_tokens = '100000'; SET batchinfer.max_cost = '2.50';
  SET batchinfer.cache = 'on' | 'read' | 'off'; SHOW LLM CACHE; CLEAR LLM CACHE
Batch mode: OPTIONS ('batch' 'on') (or SET batchinfer.llm_batch = 'on') sends the requests to
  the provider's Batch API at its batch prices; SET batchinfer.llm_batch_wait = '10m' (or
  batchinfer refresh VIEW --batch-wait 0s) stops waiting, writing nothing: run it again later.",
    },
    Topic {
        names: &["ai_filter", "ai_filter_score", "ai_classify"],
        text: "\
ai_filter('model', 'question', expr, ...): whether an endpoint model's probability of yes is
  over one half, read from the log-probabilities of its reply's first token.
ai_filter_score(...): that probability.
ai_classify('model', text, ['label', ...] | MAP {'label': 'what it means', ...}): a struct of
  the likeliest label and its score, each label's probability normalized over the labels.
  SELECT id FROM reviews WHERE stars < 3 AND ai_filter('judge', 'Is it about shipping?', body);
  SELECT id, ai_classify('judge', body, ['praise', 'complaint', 'question']) FROM reviews;
A cascade: the model's option 'proxy' names a local text model or classifier that answers the
  rows it is sure of (thresholds set on a sample sent to the model, agreeing at 'target'); the
  rest are sent. SET batchinfer.llm_proxy = 'none' | 'model'; SET batchinfer.llm_proxy_target = '0.95';",
    },
    Topic {
        names: &["ai_agg", "ai_reduce"],
        text:
            "\
ai_agg('model', 'instruction', text): an aggregate; the instruction carried out over all of a
  group's texts, by map-reduce within the model's context_window (its definition's option).
ai_reduce('model', 'instruction', list): the same over a list of texts in one row.
  SELECT product, ai_agg('writer', 'Summarize the complaints', body) FROM reviews GROUP BY product;",
    },
    Topic {
        names: &["explain cost"],
        text: "\
EXPLAIN COST statement: a query, COPY, INSERT, CREATE TABLE ... AS or REFRESH MATERIALIZED
  VIEW run without sending a request or writing: a row per endpoint model with the rows reaching
  it, the requests it would send (not those the cache answers; a view's new files alone), tokens,
  cost at its list and batch prices and minutes at its limits.
  SET batchinfer.max_cost = '2.50' refuses a statement whose estimate is over it.
  EXPLAIN COST CREATE TABLE summaries AS SELECT id, generate('writer', body) FROM docs;
  EXPLAIN COST REFRESH MATERIALIZED VIEW summaries;",
    },
    Topic {
        names: &[
            "alter model",
            "model versions",
            "show model versions",
            "alias",
        ],
        text: "\
ALTER MODEL name ADD VERSION FROM 'path or URL' [OPTIONS (...)] | SET ALIAS a TO VERSION n |
  DROP ALIAS a | DROP VERSION n; SHOW MODEL VERSIONS name
  predict('name', ...) is the alias default where it is set, else the newest version;
  predict('name@2', ...) version 2; predict('name@champion', ...) the version the alias names.
  ALTER MODEL churn SET ALIAS champion TO VERSION 2;",
    },
    Topic {
        names: &["drop model"],
        text: "DROP MODEL [IF EXISTS] name: removes a model, with all its versions, from the warehouse.",
    },
    Topic {
        names: &["show models"],
        text: "SHOW MODELS: each model, its source, inputs, outputs, size, sha256, version and aliases.",
    },
    Topic {
        names: &["describe model", "describe"],
        text: "\
DESCRIBE MODEL name: the model's inputs and outputs, what predict returns, its class labels,
  producer, operator sets and doc string.",
    },
    Topic {
        names: &["create materialized view", "materialized view", "view"],
        text: "\
CREATE [OR REPLACE] MATERIALIZED VIEW name AS query
  A query over files kept scored in the warehouse; REFRESH scores only the files that are new.
  CREATE MATERIALIZED VIEW scores AS SELECT id, predict('churn', city, age, spend)['label'] AS l
  FROM 'customers/';",
    },
    Topic {
        names: &["refresh materialized view", "refresh"],
        text: "\
REFRESH MATERIALIZED VIEW name: scores the view's new input files (all of them when its query
  or a model it uses changed), and takes out the rows of files that are gone.",
    },
    Topic {
        names: &["show materialized views"],
        text: "SHOW MATERIALIZED VIEWS: each view, its inputs, rows and state (current, model changed, ...).",
    },
    Topic {
        names: &["drop materialized view"],
        text: "DROP MATERIALIZED VIEW [IF EXISTS] name: removes the view and its files.",
    },
    Topic {
        names: &["set", "settings"],
        // Followed by each setting (`topic`), from their declarations.
        text: "SET batchinfer.NAME = 'value': a setting of this session (SHOW ALL lists them).",
    },
];

/// `\h NAME`'s text for one of batchinfer's functions or statements; None for another name.
pub fn topic(name: &str) -> Option<String> {
    let name = name.trim().trim_end_matches(';').to_ascii_lowercase();
    let name = name.split_whitespace().collect::<Vec<_>>().join(" ");
    if name == "set" || name == "settings" {
        return Some(crate::config::settings_help());
    }
    TOPICS
        .iter()
        .find(|t| t.names.contains(&name.as_str()))
        .map(|t| t.text.to_string())
}

/// `\h`: batchinfer's functions and statements, one line each.
pub fn index() -> String {
    let mut text = String::from("batchinfer's functions and statements (\\h NAME for one):\n");
    for topic in TOPICS {
        // The form of each, before what it does.
        let line = topic.text.lines().next().unwrap_or_default();
        let first = line.split_once(": ").map_or(line, |(form, _)| form);
        text.push_str("  ");
        text.push_str(first);
        text.push('\n');
    }
    text.push_str("DataFusion's SQL functions: SHOW FUNCTIONS, or SHOW FUNCTIONS LIKE 'abs'.");
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_function_and_statement_has_a_topic() {
        for name in [
            "predict",
            "PREDICT",
            "embed",
            "chunk",
            "ai_filter",
            "ai_classify",
            "generate_details",
            "explain cost",
            "ai_agg",
            "ai_reduce",
            "read_document",
            "read_frames",
            "predict_table",
            "create model",
            "Describe  Model",
            "refresh materialized view",
            "set",
        ] {
            assert!(topic(name).is_some(), "{name}");
        }
        assert!(topic("abs").is_none());
        assert!(index().contains("predict('model', column, ...)"));
    }
}
