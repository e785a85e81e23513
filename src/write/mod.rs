//! Writes whose files appear whole or not at all: COPY, INSERT and CREATE TABLE ... AS, in this
//! process or on a cluster ([`crate::cluster::Placement::write_to`]), committed as their store
//! commits ([`crate::storage`]).

use std::sync::Arc;

use datafusion::arrow::datatypes::Schema;
use datafusion::catalog::TableProvider;
use datafusion::common::config::TableParquetOptions;
use datafusion::dataframe::{DataFrame, DataFrameWriteOptions};
use datafusion::datasource::listing::{ListingTable, ListingTableConfig, ListingTableUrl};
use datafusion::logical_expr::LogicalPlan;
use datafusion::sql::parser::{ExplainStatement, Statement as DFStatement};
use datafusion::sql::sqlparser::ast::{
    CreateTable, Ident, ObjectName, Statement as SQLStatement, TableObject,
};

use crate::catalog::Catalog;
use crate::delta::{self, DeltaTableProvider};
use crate::error::{Error, Result};
use crate::lineage;
use crate::session::{Registered, Session, row_group_rows};
use crate::storage::CommittedWrite;
use crate::warehouse::Warehouse;
use crate::warehouse::table_name;

mod insert;

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
            Placed::Append(statement, table) => self.append(statement, table, explain).await,
            Placed::ItsOwn(statement) if explain.is_some() => {
                self.explain_analyzed(rewrap(statement)).await
            }
            Placed::ItsOwn(statement) => self.catalog.execute(self.session, statement).await,
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
            return Ok(Placed::ItsOwn(statement));
        };
        let SQLStatement::Insert(insert) = s.as_mut() else {
            return Ok(Placed::ItsOwn(statement));
        };
        let Some(table) = self.catalog.insert_target(insert, self.session).await else {
            return Ok(Placed::ItsOwn(statement));
        };
        if table.downcast_ref::<DeltaTableProvider>().is_some() {
            return Ok(Placed::Append(statement, table));
        }
        let Some(listing) = table.downcast_ref::<ListingTable>() else {
            return Ok(Placed::ItsOwn(statement));
        };
        // The folder an INSERT writes into: its table's first.
        let folder = listing.table_paths()[0].as_str().to_string();
        let TableObject::TableName(name) = &insert.table else {
            return Ok(Placed::ItsOwn(statement));
        };
        crate::confine::check_insert_target(
            &self.session.access(),
            self.catalog.warehouse(),
            name,
            &folder,
        )?;
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
        match self.run_to_end(statement, analyze, Some(&write)).await {
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

    /// Runs a write to its end (with `analyze`, its EXPLAIN ANALYZE) and checks the rejects
    /// budget: its result, nothing committed yet.
    async fn run_to_end(
        &self,
        statement: DFStatement,
        analyze: bool,
        write: Option<&CommittedWrite>,
    ) -> Result<Vec<datafusion::arrow::array::RecordBatch>> {
        let df = if analyze {
            self.explain_analyzed(statement).await?
        } else {
            self.copy_planned(self.catalog.execute(self.session, statement).await?, write)?
        };
        let batches = df.collect().await?;
        self.session.check_rejects_budget().await?;
        Ok(batches)
    }

    /// EXPLAIN ANALYZE of `statement`, with its rows per model ([`Session::explain_analyzed`]).
    async fn explain_analyzed(&self, statement: DFStatement) -> Result<DataFrame> {
        let df = self.catalog.execute(self.session, statement).await?;
        self.session.explain_analyzed(df).await
    }

    /// A COPY planned to write row groups sized for its rows ([`row_group_rows`]; what its
    /// statement's `OPTIONS` set still wins) and, into Parquet, the models that produced its
    /// rows in each file's metadata (`batchinfer.models`, as CREATE TABLE writes), with what
    /// its endpoint models did (`batchinfer.llm_usage`, filled at the commit of `write`). Any
    /// other statement as it is.
    fn copy_planned(&self, df: DataFrame, write: Option<&CommittedWrite>) -> Result<DataFrame> {
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
            let statement = self.session.statement();
            let usage = lineage::UsageRecord::of(self.session.registry(), &copy.input, &statement);
            // The session's Parquet options, and whether this COPY's encrypt its files.
            let parquet = self.session.ctx().state().default_table_options().parquet;
            let encrypted = copy.options.keys().any(|k| k.starts_with("format.crypto."));
            if let Some(placeholder) = usage
                .filter(|_| !encrypted)
                .zip(write)
                .and_then(|(u, w)| u.reserve(w, &parquet))
            {
                copy.options.insert(
                    format!("format.metadata::{}", lineage::LLM_USAGE_KEY),
                    placeholder,
                );
            }
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
                crate::say!(
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
        // The version the statement begins on, read before its query reads the table (it may):
        // a replace commits only on the next.
        let (url, store) = warehouse.table_folder(&name)?;
        let table = delta::write::TableWrite::begin(&name, &url, store).await?;
        let df = self.catalog.execute(self.session, query).await?;
        let models = lineage::models_used(self.session.registry(), df.logical_plan())?;
        let usage = lineage::UsageRecord::of(
            self.session.registry(),
            df.logical_plan(),
            &self.session.statement(),
        );
        // The columns as the query gives them (the table's), then as Delta keeps them.
        let schema = df.schema().inner().clone();
        let df = delta_typed(df, &name)?;
        // A folder of Parquet files (a table written before tables were Delta tables) that
        // this statement replaces: its files as they are now go once the commit is made.
        let old_files = match table.read_version() {
            None => warehouse.top_level_files(&name).await?,
            Some(_) => Vec::new(),
        };
        let written = self
            .write_files(df, &table.folder(), &models, usage.as_ref())
            .await;
        let written = match written {
            Ok(written) => written,
            Err(e) => {
                table.discard().await;
                return Err(e);
            }
        };
        let mode = match ct.or_replace {
            true => delta::write::Mode::Replace,
            false => delta::write::Mode::Create,
        };
        let lineage = self.lineage(models, usage.as_ref());
        // An INSERT into those files meanwhile: a conflict, as with a Delta table.
        if !old_files.is_empty() && warehouse.top_level_files(&name).await? != old_files {
            table.discard().await;
            return Err(table.conflict());
        }
        table.commit(mode, &schema, &lineage).await?;
        warehouse.remove_files(&name, &old_files).await?;
        if let Some(tables) = self.catalog.warehouse_tables() {
            tables.committed(&name);
        }
        self.session.rows_written(&written)
    }

    /// The rows of `df` written as Parquet files into the folder `folder`, with `models` (the
    /// models that produced them) and `usage` (what its endpoint models did, filled at commit)
    /// in each file's metadata, where the placement writes and committed as it commits; the
    /// rejects budget checked before they are.
    async fn write_files(
        &self,
        df: DataFrame,
        folder: &str,
        models: &str,
        usage: Option<&lineage::UsageRecord>,
    ) -> Result<Vec<datafusion::arrow::array::RecordBatch>> {
        let schema = df.schema().inner().clone();
        let stores = self.session.registry().stores();
        let (target, write) = self.session.placement().write_to(stores, folder)?;
        let options = self.lineage_options(&schema, models, usage, &write);
        let run = async {
            let written = df
                .write_parquet(&target, DataFrameWriteOptions::new(), Some(options))
                .await?;
            self.session.check_rejects_budget().await?;
            Ok::<_, Error>(written)
        };
        match run.await {
            Ok(written) => {
                write.commit().await?;
                Ok(written)
            }
            Err(e) => {
                write.abort().await;
                Err(e)
            }
        }
    }

    /// The Parquet options of a write's files (`write`'s, of columns `schema`), with `models`
    /// and `usage` in their metadata ([`lineage::MODELS_KEY`], [`lineage::LLM_USAGE_KEY`]).
    fn lineage_options(
        &self,
        schema: &datafusion::arrow::datatypes::Schema,
        models: &str,
        usage: Option<&lineage::UsageRecord>,
        write: &CommittedWrite,
    ) -> TableParquetOptions {
        let mut options = self.session.parquet_options(schema);
        options
            .key_value_metadata
            .insert(lineage::MODELS_KEY.to_string(), Some(models.to_string()));
        if let Some(placeholder) = usage.and_then(|u| u.reserve(write, &options)) {
            options
                .key_value_metadata
                .insert(lineage::LLM_USAGE_KEY.to_string(), Some(placeholder));
        }
        options
    }

    /// What a commit says of the statement at hand, the models it called and what its
    /// endpoint models did.
    fn lineage(
        &self,
        models: String,
        usage: Option<&lineage::UsageRecord>,
    ) -> delta::write::Lineage {
        delta::write::Lineage {
            statement: self.session.statement().text,
            models,
            llm_usage: usage.and_then(lineage::UsageRecord::committed),
        }
    }
}

/// `df` with each column Delta reads as another type cast to it
/// ([`delta::write::written_schema`]).
fn delta_typed(df: DataFrame, name: &str) -> Result<DataFrame> {
    use datafusion::logical_expr::{cast, col};
    let schema = df.schema().inner().clone();
    let written = delta::write::written_schema(name, &schema)?;
    if written.fields() == schema.fields() {
        return Ok(df);
    }
    let columns = schema
        .fields()
        .iter()
        .zip(written.fields())
        .map(|(field, to)| {
            let column = col(datafusion::common::Column::from_name(field.name()));
            match to.data_type() == field.data_type() {
                true => column,
                false => cast(column, to.data_type().clone()).alias(field.name()),
            }
        })
        .collect::<Vec<_>>();
    Ok(df.select(columns)?)
}

/// The Parquet files of the folder `location`, read and written with `schema`.
fn folder_table(
    location: &str,
    schema: datafusion::arrow::datatypes::SchemaRef,
    parquet: TableParquetOptions,
) -> Result<Arc<dyn TableProvider>> {
    use datafusion::datasource::file_format::parquet::ParquetFormat;
    use datafusion::datasource::listing::ListingOptions;
    let format = ParquetFormat::default().with_options(parquet);
    let options = ListingOptions::new(Arc::new(format)).with_file_extension(".parquet");
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
    /// An INSERT INTO a Delta table of the warehouse ([`Writes::append`]).
    Append(DFStatement, Arc<dyn TableProvider>),
    /// An INSERT into a table that commits its own rows (in memory, PostgreSQL, SQLite), or one
    /// DataFusion refuses (no such table): run as DataFusion runs it.
    ItsOwn(DFStatement),
}

struct PlacedWrite<'a> {
    statement: DFStatement,
    write: CommittedWrite,
    /// The copy of an INSERT's table it writes through, registered while it runs.
    _staged: Option<Registered<'a>>,
}
