//! Writes whose files appear whole or not at all: COPY, INSERT and CREATE TABLE ... AS, in this
//! process or on a cluster ([`crate::cluster::Placement::write_to`]), committed as their store
//! commits ([`crate::storage`]).

use std::sync::Arc;

use datafusion::arrow::datatypes::Schema;
use datafusion::catalog::TableProvider;
use datafusion::dataframe::{DataFrame, DataFrameWriteOptions};
use datafusion::datasource::listing::{ListingTable, ListingTableConfig, ListingTableUrl};
use datafusion::logical_expr::LogicalPlan;
use datafusion::sql::parser::{ExplainStatement, Statement as DFStatement};
use datafusion::sql::sqlparser::ast::{
    CreateTable, Ident, ObjectName, Statement as SQLStatement, TableObject,
};

use crate::catalog::Catalog;
use crate::error::{Error, Result};
use crate::lineage;
use crate::session::{Registered, Session, row_group_rows};
use crate::storage::CommittedWrite;
use crate::warehouse::Warehouse;
use crate::warehouse::table_name;

/// The writes of a session: what they need, and nothing more.
#[derive(Clone, Copy)]
pub struct Writes<'a> {
    session: &'a Session,
    catalog: &'a Catalog,
}

impl<'a> Writes<'a> {
    pub fn new(session: &'a Session, catalog: &'a Catalog) -> Self {
        Writes { session, catalog }
    }

    /// COPY, or INSERT INTO a listing table, whose files appear all at once when it succeeds,
    /// or not at all, wherever it runs ([`crate::cluster::Placement::write_to`]). An EXPLAIN
    /// ANALYZE runs the statement it explains: a write it explains is committed the same way.
    pub async fn write_committed(&self, statement: DFStatement) -> Result<DataFrame> {
        let (explain, statement) = match statement {
            DFStatement::Explain(ExplainStatement { options, statement }) if options.analyze => {
                (Some(options), *statement)
            }
            statement => (None, statement),
        };
        let placed = self.place_write(statement).await?;
        let rewrap = |statement: DFStatement| match &explain {
            Some(options) => DFStatement::Explain(ExplainStatement {
                options: options.clone(),
                statement: Box::new(statement),
            }),
            None => statement,
        };
        match placed {
            Placed::Write(mut placed) => {
                placed.statement = rewrap(placed.statement);
                self.run_then_commit(placed, explain.is_some()).await
            }
            Placed::NotAWrite(statement) if explain.is_some() => {
                self.explain_analyzed(rewrap(statement)).await
            }
            Placed::NotAWrite(statement) => self.catalog.execute(self.session, statement).await,
        }
    }

    /// Where a write goes and how it commits. A COPY is pointed at where the placement says. An
    /// INSERT INTO a listing table writes into its folder; where the placement writes elsewhere
    /// (a cluster's executors: into a staging folder), into a copy of the table over that
    /// place, moved into the table's folder at commit.
    async fn place_write(&self, statement: DFStatement) -> Result<Placed<'a>> {
        let stores = self.session.registry().stores();
        let mut statement = match statement {
            DFStatement::CopyTo(mut copy) => {
                let (write_to, write) = self.session.placement().write_to(stores, &copy.target)?;
                copy.target = write_to;
                let statement = DFStatement::CopyTo(copy);
                return Ok(Placed::Write(PlacedWrite {
                    statement,
                    write,
                    _staged: None,
                }));
            }
            statement => statement,
        };
        let DFStatement::Statement(s) = &mut statement else {
            return Ok(Placed::NotAWrite(statement));
        };
        let SQLStatement::Insert(insert) = s.as_mut() else {
            return Ok(Placed::NotAWrite(statement));
        };
        let Some(table) = self.catalog.insert_target(insert, self.session).await else {
            return Ok(Placed::NotAWrite(statement));
        };
        let Some(listing) = table.downcast_ref::<ListingTable>() else {
            return Ok(Placed::NotAWrite(statement));
        };
        // The folder an INSERT writes into: its table's first.
        let folder = listing.table_paths()[0].as_str().to_string();
        let (write_to, write) = self.session.placement().write_to(stores, &folder)?;
        let mut staged = None;
        if write_to != folder {
            let copy = Registered::hidden(
                self.session.ctx(),
                staged_table(listing, table.as_ref(), &write_to)?,
            )?;
            insert.table =
                TableObject::TableName(ObjectName::from(vec![Ident::with_quote('"', copy.name())]));
            staged = Some(copy);
        }
        Ok(Placed::Write(PlacedWrite {
            statement,
            write,
            _staged: staged,
        }))
    }

    /// Runs a placed write to the end (with `analyze`, its EXPLAIN ANALYZE), then commits it; on
    /// failure (or when the future is dropped: cancellation) it is discarded.
    async fn run_then_commit(&self, placed: PlacedWrite<'a>, analyze: bool) -> Result<DataFrame> {
        let PlacedWrite {
            statement, write, ..
        } = placed;
        let run = async {
            let df = if analyze {
                self.explain_analyzed(statement).await?
            } else {
                self.copy_planned(self.catalog.execute(self.session, statement).await?)?
            };
            let batches = df.collect().await?;
            self.session.check_rejects_budget().await?;
            Ok::<_, Error>(batches)
        };
        match run.await {
            Ok(batches) => {
                write.commit().await?;
                self.session.results(batches)
            }
            Err(e) => {
                write.abort().await;
                Err(e)
            }
        }
    }

    /// EXPLAIN ANALYZE of `statement`, with its rows per model ([`Session::explain_analyzed`]).
    async fn explain_analyzed(&self, statement: DFStatement) -> Result<DataFrame> {
        let df = self.catalog.execute(self.session, statement).await?;
        self.session.explain_analyzed(df).await
    }

    /// A COPY planned to write row groups sized for its rows ([`row_group_rows`]; what its
    /// statement's `OPTIONS` set still wins) and, into Parquet, the models that produced its
    /// rows in each file's metadata (`batchinfer.models`, as CREATE TABLE writes). Any other
    /// statement as it is.
    fn copy_planned(&self, df: DataFrame) -> Result<DataFrame> {
        let LogicalPlan::Copy(copy) = df.logical_plan() else {
            return Ok(df);
        };
        let mut copy = copy.clone();
        if copy.file_type.get_ext().eq_ignore_ascii_case("csv") {
            lineage::csv_columns(copy.input.schema().as_arrow())?;
        }
        if copy.file_type.get_ext().eq_ignore_ascii_case("parquet") {
            copy.options.insert(
                format!("format.metadata::{}", lineage::MODELS_KEY),
                lineage::models_used(self.session.registry(), &copy.input)?,
            );
        }
        let configured = self
            .session
            .ctx()
            .state_ref()
            .read()
            .config()
            .options()
            .execution
            .parquet
            .max_row_group_size;
        let rows = row_group_rows(copy.input.schema().as_arrow(), configured);
        let mut state = self.session.ctx().state();
        state
            .config_mut()
            .options_mut()
            .execution
            .parquet
            .max_row_group_size = rows;
        Ok(DataFrame::new(state, LogicalPlan::Copy(copy)))
    }

    /// CREATE TABLE name AS query, into the warehouse, with the models and model hashes that
    /// produced it in each file's metadata: the table appears when the statement succeeds
    /// ([`crate::storage::Tables`]), or not at all.
    pub async fn create_table_as(
        &self,
        warehouse: &Warehouse,
        ct: &CreateTable,
    ) -> Result<DataFrame> {
        let name = table_name(&ct.name)?;
        if self.catalog.is_view(&name).await? {
            // IF NOT EXISTS asks for nothing where the name is taken, by a view too.
            if ct.if_not_exists {
                eprintln!(
                    "a materialized view named '{name}' exists: CREATE TABLE IF NOT EXISTS {name} \
                     created nothing"
                );
                return self.session.empty();
            }
            return Err(Error::table(
                &name,
                format!("'{name}' is a materialized view; a table needs a name of its own"),
            ));
        }
        if self
            .catalog
            .table_kind(&name, self.session)
            .await?
            .is_some()
        {
            if ct.if_not_exists {
                return self.session.empty();
            }
            if !ct.or_replace {
                return Err(Error::table(
                    &name,
                    format!("table '{name}' already exists (use CREATE OR REPLACE TABLE)"),
                ));
            }
        }
        let query = ct
            .query
            .clone()
            .ok_or_else(|| Error::Statement("CREATE TABLE AS needs a query".into()))?;
        let query = DFStatement::Statement(Box::new(SQLStatement::Query(query)));
        let df = self.catalog.execute(self.session, query).await?;
        let models = lineage::models_used(self.session.registry(), df.logical_plan())?;
        let schema = df.schema().inner().clone();
        let mut options = self.session.parquet_options(&schema);
        options
            .key_value_metadata
            .insert(lineage::MODELS_KEY.to_string(), Some(models.clone()));
        let empty_file = empty_table_file(schema.clone(), &models)?;
        let stores = self.session.registry().stores();
        let table = warehouse.begin_table(&name, ct.or_replace, |target| {
            self.session.placement().write_to(stores, target)
        })?;
        let written = match df
            .write_parquet(table.target(), DataFrameWriteOptions::new(), Some(options))
            .await
            .map_err(Error::from)
        {
            Ok(written) => written,
            Err(e) => {
                table.abort().await;
                return Err(e);
            }
        };
        if let Err(e) = self.session.check_rejects_budget().await {
            table.abort().await;
            return Err(e);
        }
        table.commit(empty_file).await?;
        let table = listing_table(&warehouse.table_location(&name)?, schema)?;
        let version = warehouse.table_version(&name).await?;
        if let Some(tables) = self.catalog.warehouse_tables() {
            tables.written(&name, version, table);
        }
        self.session.rows_written(&written)
    }
}

/// An empty result writes no file; a table needs one to carry its schema: this one, with no rows.
fn empty_table_file(
    schema: datafusion::arrow::datatypes::SchemaRef,
    models: &str,
) -> Result<Vec<u8>> {
    use datafusion::parquet::arrow::ArrowWriter;
    use datafusion::parquet::file::metadata::KeyValue;
    use datafusion::parquet::file::properties::WriterProperties;
    let props = WriterProperties::builder()
        .set_key_value_metadata(Some(vec![KeyValue::new(
            lineage::MODELS_KEY.to_string(),
            models.to_string(),
        )]))
        .build();
    let mut bytes = Vec::new();
    let writer = ArrowWriter::try_new(&mut bytes, schema, Some(props))?;
    writer.close()?;
    Ok(bytes)
}

/// The Parquet files of the folder `location`, read with `schema`.
fn listing_table(
    location: &str,
    schema: datafusion::arrow::datatypes::SchemaRef,
) -> Result<Arc<dyn TableProvider>> {
    use datafusion::datasource::file_format::parquet::ParquetFormat;
    use datafusion::datasource::listing::ListingOptions;
    let options =
        ListingOptions::new(Arc::new(ParquetFormat::default())).with_file_extension(".parquet");
    let config = ListingTableConfig::new(ListingTableUrl::parse(location)?)
        .with_listing_options(options)
        .with_schema(schema);
    Ok(Arc::new(ListingTable::try_new(config)?))
}

/// A copy of the listing table `listing` (the provider `table`: its columns, partitioning, file
/// format, defaults and constraints) whose folder is `location`.
fn staged_table(
    listing: &ListingTable,
    table: &dyn TableProvider,
    location: &str,
) -> Result<Arc<dyn TableProvider>> {
    let options = listing.options().clone();
    let schema = table.schema();
    let partitioned = |name: &str| options.table_partition_cols.iter().any(|(c, _)| c == name);
    let file_fields: Vec<_> = schema
        .fields()
        .iter()
        .filter(|f| !partitioned(f.name()))
        .cloned()
        .collect();
    let file_schema = Schema::new(file_fields).with_metadata(schema.metadata().clone());
    let defaults = schema
        .fields()
        .iter()
        .filter_map(|f| {
            Some((
                f.name().clone(),
                table.get_column_default(f.name())?.clone(),
            ))
        })
        .collect();
    let config = ListingTableConfig::new(ListingTableUrl::parse(location)?)
        .with_listing_options(options)
        .with_schema(Arc::new(file_schema));
    let mut staged = ListingTable::try_new(config)?.with_column_defaults(defaults);
    if let Some(constraints) = table.constraints() {
        staged = staged.with_constraints(constraints.clone());
    }
    Ok(Arc::new(staged))
}

/// A statement that writes, and where it was pointed ([`Writes::place_write`]).
enum Placed<'a> {
    Write(PlacedWrite<'a>),
    NotAWrite(DFStatement),
}

struct PlacedWrite<'a> {
    statement: DFStatement,
    write: CommittedWrite,
    /// The copy of an INSERT's table it writes through, registered while it runs.
    _staged: Option<Registered<'a>>,
}
