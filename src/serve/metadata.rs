//! What a client's catalog browser asks: the catalogs, schemas, tables (with their columns) and
//! table types of a session, and what the server is (`GetSqlInfo`).

use std::sync::LazyLock;

use arrow_flight::sql::metadata::{SqlInfoData, SqlInfoDataBuilder};
use arrow_flight::sql::{
    CommandGetCatalogs, CommandGetDbSchemas, CommandGetTableTypes, CommandGetTables, SqlInfo,
    SqlSupportedTransaction,
};
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::Schema;
use datafusion::datasource::TableType;

use crate::engine::Engine;
use crate::error::{Error, Result};

/// The table types a session has.
const TABLE_TYPES: [&str; 3] = ["TABLE", "VIEW", "LOCAL TEMPORARY"];

/// What the server is, as `GetSqlInfo` answers.
pub fn sql_info() -> &'static SqlInfoData {
    // Per process: a constant.
    static INFO: LazyLock<SqlInfoData> = LazyLock::new(|| {
        let mut info = SqlInfoDataBuilder::new();
        info.append(SqlInfo::FlightSqlServerName, "batchinfer");
        info.append(SqlInfo::FlightSqlServerVersion, env!("CARGO_PKG_VERSION"));
        info.append(SqlInfo::FlightSqlServerArrowVersion, "1.5");
        info.append(SqlInfo::FlightSqlServerReadOnly, false);
        info.append(SqlInfo::FlightSqlServerSql, true);
        info.append(SqlInfo::FlightSqlServerSubstrait, false);
        info.append(
            SqlInfo::FlightSqlServerTransaction,
            SqlSupportedTransaction::None as i32,
        );
        info.append(SqlInfo::FlightSqlServerCancel, true);
        info.append(SqlInfo::SqlDdlCatalog, false);
        info.append(SqlInfo::SqlDdlSchema, false);
        info.append(SqlInfo::SqlDdlTable, true);
        info.append(SqlInfo::SqlIdentifierQuoteChar, "\"");
        info.append(SqlInfo::SqlQuotedIdentifierCase, 3_i32);
        info.build().expect("the server's fixed SqlInfo builds")
    });
    &INFO
}

/// `GetCatalogs`.
pub fn catalogs(engine: &Engine, command: CommandGetCatalogs) -> Result<RecordBatch> {
    let mut builder = command.into_builder();
    let mut names = engine.context().catalog_names();
    names.sort();
    for name in names {
        builder.append(name);
    }
    builder.build().map_err(built)
}

/// `GetDbSchemas`.
pub fn schemas(engine: &Engine, command: CommandGetDbSchemas) -> Result<RecordBatch> {
    let mut builder = command.into_builder();
    for (catalog, schema) in schema_names(engine) {
        builder.append(catalog, schema);
    }
    builder.build().map_err(built)
}

/// `GetTables`: the warehouse's tables and views listed as they are now, and those the session
/// registered; with their columns where asked.
pub async fn tables(engine: &Engine, command: CommandGetTables) -> Result<RecordBatch> {
    engine.list_tables().await?;
    let include_schema = command.include_schema;
    let mut builder = command.into_builder();
    let ctx = engine.context();
    for (catalog_name, schema_name) in schema_names(engine) {
        let Some(schema) = ctx
            .catalog(&catalog_name)
            .and_then(|c| c.schema(&schema_name))
        else {
            continue;
        };
        let mut tables = schema.table_names();
        tables.sort();
        for table in tables {
            // A table that cannot be opened now is listed, with no columns.
            let provider = schema.table(&table).await.ok().flatten();
            let table_type = match provider.as_ref().map(|p| p.table_type()) {
                Some(TableType::View) => "VIEW",
                Some(TableType::Temporary) => "LOCAL TEMPORARY",
                _ => "TABLE",
            };
            let columns = match (&provider, include_schema) {
                (Some(provider), true) => provider.schema().as_ref().clone(),
                _ => Schema::empty(),
            };
            builder
                .append(&catalog_name, &schema_name, &table, table_type, &columns)
                .map_err(built)?;
        }
    }
    builder.build().map_err(built)
}

/// `GetTableTypes`.
pub fn table_types(command: CommandGetTableTypes) -> Result<RecordBatch> {
    let mut builder = command.into_builder();
    for table_type in TABLE_TYPES {
        builder.append(table_type);
    }
    builder.build().map_err(built)
}

/// A metadata answer that could not be built (a bug: they are built of strings).
pub fn built(e: arrow_flight::error::FlightError) -> Error {
    Error::Internal(format!("a metadata answer cannot be built: {e}"))
}

/// Every (catalog, schema) of the session, in order.
fn schema_names(engine: &Engine) -> Vec<(String, String)> {
    let ctx = engine.context();
    let mut names = Vec::new();
    for catalog_name in ctx.catalog_names() {
        if let Some(catalog) = ctx.catalog(&catalog_name) {
            for schema in catalog.schema_names() {
                names.push((catalog_name.clone(), schema));
            }
        }
    }
    names.sort();
    names
}
