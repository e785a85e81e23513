//! Printing query results for a person or a script: an aligned table, CSV, or JSON.

use std::io::Write;

use datafusion::arrow::array::{Array, RecordBatch};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::arrow::util::pretty::pretty_format_batches_with_options;

use crate::error::{Error, Result};

/// How result rows are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OutputFormat {
    /// An aligned table with a header (the default).
    #[default]
    Table,
    /// Comma-separated values with a header row; lists and structs as their text form.
    Csv,
    /// One JSON array of objects per statement.
    Json,
    /// One JSON object per line.
    Ndjson,
}

/// Prints the result of one statement. Statements that return no columns print nothing.
pub fn print_batches(
    out: &mut dyn Write,
    format: OutputFormat,
    schema: &SchemaRef,
    batches: &[RecordBatch],
) -> Result<()> {
    if schema.fields().is_empty() {
        return Ok(());
    }
    let io = |e: std::io::Error| Error::io("writing results", e);
    match format {
        OutputFormat::Table => {
            let options = FormatOptions::default().with_null("NULL");
            let table = if batches.is_empty() {
                pretty_format_batches_with_options(
                    &[RecordBatch::new_empty(schema.clone())],
                    &options,
                )?
            } else {
                pretty_format_batches_with_options(batches, &options)?
            };
            writeln!(out, "{table}").map_err(io)?;
        }
        OutputFormat::Csv => write_csv(out, schema, batches)?,
        OutputFormat::Json => {
            let mut writer = datafusion::arrow::json::ArrayWriter::new(&mut *out);
            for batch in batches {
                writer.write(batch)?;
            }
            writer.finish()?;
            if batches.iter().all(|b| b.num_rows() == 0) {
                write!(out, "[]").map_err(io)?;
            }
            writeln!(out).map_err(io)?;
        }
        OutputFormat::Ndjson => {
            let mut writer = datafusion::arrow::json::LineDelimitedWriter::new(&mut *out);
            for batch in batches {
                writer.write(batch)?;
            }
            writer.finish()?;
        }
    }
    Ok(())
}

/// CSV by hand over Arrow's display formatting, so that list and struct columns (which Arrow's
/// CSV writer refuses) print too.
fn write_csv(out: &mut dyn Write, schema: &SchemaRef, batches: &[RecordBatch]) -> Result<()> {
    let io = |e: std::io::Error| Error::io("writing results", e);
    let header: Vec<String> = schema
        .fields()
        .iter()
        .map(|f| csv_field(f.name()))
        .collect();
    writeln!(out, "{}", header.join(",")).map_err(io)?;
    let options = FormatOptions::default();
    for batch in batches {
        let formatters = batch
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        for row in 0..batch.num_rows() {
            let cells: Vec<String> = formatters
                .iter()
                .zip(batch.columns())
                .map(|(f, c)| {
                    if c.is_null(row) {
                        String::new()
                    } else {
                        csv_field(&f.value(row).to_string())
                    }
                })
                .collect();
            writeln!(out, "{}", cells.join(",")).map_err(io)?;
        }
    }
    Ok(())
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}
