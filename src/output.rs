//! Printing query results for a person or a script: an aligned table, CSV, or JSON.

use std::io::Write;

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::json::WriterBuilder;
use datafusion::arrow::json::writer::{JsonArray, JsonFormat, LineDelimited};
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion_cli::print_format::PrintFormat;
use datafusion_cli::print_options::MaxRows;

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
    /// One block per row, a line per column (`name | value`), for rows too wide for a table
    /// (as psql's expanded display, `\x` in the shell).
    Vertical,
}

/// Prints the result of one statement. Statements that return no columns print nothing. The
/// table is datafusion-cli's printing (its cells cut first); CSV with lists and structs in it,
/// JSON with every key (NULL as `null`), and the vertical display, are this module's.
pub fn print_batches(
    out: &mut dyn Write,
    format: OutputFormat,
    schema: &SchemaRef,
    batches: &[RecordBatch],
) -> Result<()> {
    if schema.fields().is_empty() {
        return Ok(());
    }
    let datafusion = |out: &mut dyn Write, format: PrintFormat, batches: &[RecordBatch]| {
        let options = datafusion::config::FormatOptions {
            null: "NULL".to_string(),
            ..Default::default()
        };
        format.print_batches(
            &mut &mut *out,
            schema.clone(),
            batches,
            MaxRows::Unlimited,
            true,
            &options,
        )
    };
    match format {
        OutputFormat::Table => {
            let options = FormatOptions::default().with_null("NULL");
            let shown = (batches.iter())
                .map(|batch| cut_cells(batch, &options))
                .collect::<Result<Vec<_>>>()?;
            datafusion(out, PrintFormat::Table, &shown)?;
        }
        OutputFormat::Csv => write_csv(out, schema, batches)?,
        OutputFormat::Vertical => write_vertical(out, schema, batches)?,
        OutputFormat::Json => write_json::<JsonArray>(out, batches, true)?,
        OutputFormat::Ndjson => write_json::<LineDelimited>(out, batches, false)?,
    }
    Ok(())
}

/// JSON objects, one a row, every column's key in each: a NULL is `null`, never a key left out
/// (a script reading them finds every column). As one array (`array`), `[]` for no rows; else
/// one object a line.
fn write_json<F: JsonFormat>(
    out: &mut dyn Write,
    batches: &[RecordBatch],
    array: bool,
) -> Result<()> {
    let io = |e: std::io::Error| Error::io("writing results", e);
    if batches.iter().all(|b| b.num_rows() == 0) {
        if array {
            writeln!(out, "[]").map_err(io)?;
        }
        return Ok(());
    }
    let mut writer = WriterBuilder::new()
        .with_explicit_nulls(true)
        .build::<_, F>(&mut *out);
    for batch in batches {
        writer.write(batch)?;
    }
    writer.finish()?;
    drop(writer);
    if array {
        writeln!(out).map_err(io)?;
    }
    Ok(())
}

/// The most characters of a value an aligned table shows: a longer one ends in '…' (a cell
/// megabytes long is no use to a reader, and laying it out takes long). The other formats
/// print every value whole.
pub const TABLE_CELL_CHARS: usize = 1_000;

/// A batch as the text of its cells, each (and each column name) cut to [`TABLE_CELL_CHARS`].
fn cut_cells(batch: &RecordBatch, options: &FormatOptions) -> Result<RecordBatch> {
    let mut fields = Vec::with_capacity(batch.num_columns());
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(batch.num_columns());
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        let formatter = ArrayFormatter::try_new(column.as_ref(), options)?;
        let cells: StringArray = (0..column.len())
            .map(|row| Some(cut(formatter.value(row).to_string())))
            .collect();
        fields.push(Field::new(cut(field.name().clone()), DataType::Utf8, false));
        columns.push(Arc::new(cells));
    }
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns,
    )?)
}

/// `text` cut to [`TABLE_CELL_CHARS`] characters, ending in '…' where it was cut.
fn cut(text: String) -> String {
    match text.char_indices().nth(TABLE_CELL_CHARS) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text,
    }
}

/// Each row as a block: `-[ RECORD n ]`, then `name | value` per column, names aligned and
/// values cut as a table's are.
fn write_vertical(out: &mut dyn Write, schema: &SchemaRef, batches: &[RecordBatch]) -> Result<()> {
    let io = |e: std::io::Error| Error::io("writing results", e);
    let names: Vec<String> = schema
        .fields()
        .iter()
        .map(|f| cut(f.name().clone()))
        .collect();
    let width = names.iter().map(|n| n.chars().count()).max().unwrap_or(0);
    let options = FormatOptions::default().with_null("NULL");
    let mut record = 0;
    for batch in batches {
        let formatters = formatters(batch, &options)?;
        for row in 0..batch.num_rows() {
            record += 1;
            writeln!(out, "-[ RECORD {record} ]").map_err(io)?;
            for (name, formatter) in names.iter().zip(&formatters) {
                let value = cut(formatter.value(row).to_string());
                writeln!(out, "{name:<width$} | {value}").map_err(io)?;
            }
        }
    }
    if record == 0 {
        writeln!(out, "(0 rows)").map_err(io)?;
    }
    Ok(())
}

/// A formatter for each column of `batch`.
fn formatters<'a>(
    batch: &'a RecordBatch,
    options: &'a FormatOptions,
) -> Result<Vec<ArrayFormatter<'a>>> {
    Ok(batch
        .columns()
        .iter()
        .map(|c| ArrayFormatter::try_new(c.as_ref(), options))
        .collect::<std::result::Result<Vec<_>, _>>()?)
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
        let formatters = formatters(batch, &options)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_cut_long_values_and_other_formats_do_not() {
        let long = "é".repeat(TABLE_CELL_CHARS + 5);
        let schema = Arc::new(Schema::new(vec![Field::new("s", DataType::Utf8, true)]));
        let column = StringArray::from(vec![Some(long.as_str()), Some("short"), None]);
        let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(column)]).unwrap();
        let print = |format| {
            let mut out = Vec::new();
            print_batches(&mut out, format, &schema, std::slice::from_ref(&batch)).unwrap();
            String::from_utf8(out).unwrap()
        };
        let table = print(OutputFormat::Table);
        assert!(table.contains(&format!("{}…", "é".repeat(TABLE_CELL_CHARS))));
        assert!(!table.contains(&"é".repeat(TABLE_CELL_CHARS + 1)));
        assert!(
            table.contains("| short") && table.contains("| NULL"),
            "{table}"
        );
        assert!(print(OutputFormat::Csv).contains(&long));
        let vertical = print(OutputFormat::Vertical);
        assert!(vertical.starts_with("-[ RECORD 1 ]\ns | "), "{vertical}");
        assert!(vertical.contains("-[ RECORD 2 ]\ns | short\n-[ RECORD 3 ]\ns | NULL\n"));
        assert!(!vertical.contains(&"é".repeat(TABLE_CELL_CHARS + 1)));
    }
}
