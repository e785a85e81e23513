//! `INSERT INTO` a warehouse table: rows appended as one Delta commit, the table's columns
//! checked, and whether the statement reads the table it appends to (a blind append or not).

use super::*;

impl Writes<'_> {
    /// INSERT INTO a Delta table of the warehouse: the rows written into a folder of the
    /// statement's own through a listing table over it (DataFusion places the columns, as into
    /// any table), then one commit that appends them. Columns that do not fit are refused first
    /// ([`delta::write::check_insert`]).
    pub(super) async fn append(
        &self,
        mut statement: DFStatement,
        table: Arc<dyn TableProvider>,
        analyze: Option<datafusion::common::format::ExplainStatementOptions>,
    ) -> Result<DataFrame> {
        let Some(delta) = table.downcast_ref::<DeltaTableProvider>() else {
            return Err(Error::Internal(
                "an append to a table that is not Delta".into(),
            ));
        };
        let name = delta.name().to_string();
        let DFStatement::Statement(s) = &mut statement else {
            return Err(Error::Internal("an append that is not an INSERT".into()));
        };
        let SQLStatement::Insert(insert) = s.as_mut() else {
            return Err(Error::Internal("an append that is not an INSERT".into()));
        };
        let (models, usage) = self.check_columns(&name, &table.schema(), insert).await?;
        let mut write = delta.begin_append().await?;
        if !self.reads_table(&insert.source, &name).await {
            write.reads_nothing_of_the_table();
        }
        let stores = self.session.registry().stores();
        let (target, files) = self.session.placement().write_to(stores, &write.folder())?;
        let written = delta::write::written_schema(&name, &table.schema())?;
        let options = self.lineage_options(&written, &models, usage.as_ref(), &files);
        let copy =
            Registered::hidden(self.session.ctx(), folder_table(&target, written, options)?)?;
        insert.table =
            TableObject::TableName(ObjectName::from(vec![Ident::with_quote('"', copy.name())]));
        let analyzed = analyze.is_some();
        let statement = match analyze {
            Some(options) => DFStatement::Explain(ExplainStatement {
                options,
                statement: Box::new(statement),
            }),
            None => statement,
        };
        let batches = match self.run_to_end(statement, analyzed, None).await {
            Ok(batches) => batches,
            Err(e) => {
                files.abort().await;
                write.discard().await;
                return Err(e);
            }
        };
        drop(copy);
        if let Err(e) = files.commit().await {
            write.discard().await;
            return Err(e);
        }
        let lineage = self.lineage(models, usage.as_ref());
        let schema = table.schema();
        write
            .commit(delta::write::Mode::Append, &schema, &lineage)
            .await?;
        self.session.results(batches)
    }

    /// Whether `source` (an INSERT's query) may read the warehouse table `name`: it names it,
    /// or a view (whose query is not looked into). A relation that is no table (a table
    /// function, a CTE's name) reads none.
    pub(super) async fn reads_table(
        &self,
        source: &Option<Box<datafusion::sql::sqlparser::ast::Query>>,
        name: &str,
    ) -> bool {
        let mut relations = Vec::new();
        let _ = datafusion::sql::sqlparser::ast::visit_relations(source, |relation| {
            relations.push(relation.to_string());
            std::ops::ControlFlow::<()>::Continue(())
        });
        for relation in relations {
            let Ok(provider) = self.session.ctx().table_provider(relation.as_str()).await else {
                continue;
            };
            let reads = match provider.downcast_ref::<DeltaTableProvider>() {
                Some(delta) => delta.name() == name,
                None => provider.table_type() == datafusion::datasource::TableType::View,
            };
            if reads {
                return true;
            }
        }
        false
    }

    /// Refuses an INSERT whose query's columns do not fit the table's (those it names, or all);
    /// the models its query calls ([`lineage::models_used`]) and the record of what its
    /// endpoint models do.
    pub(super) async fn check_columns(
        &self,
        name: &str,
        schema: &datafusion::arrow::datatypes::SchemaRef,
        insert: &datafusion::sql::sqlparser::ast::Insert,
    ) -> Result<(String, Option<lineage::UsageRecord>)> {
        let Some(source) = &insert.source else {
            return Ok(("[]".to_string(), None));
        };
        let query = DFStatement::Statement(Box::new(SQLStatement::Query(source.clone())));
        let plan = self.session.plan(query).await?;
        let models = lineage::models_used(self.session.registry(), &plan)?;
        let usage =
            lineage::UsageRecord::of(self.session.registry(), &plan, &self.session.statement());
        let fields: Vec<_> = if insert.columns.is_empty() {
            schema.fields().iter().map(|f| f.as_ref().clone()).collect()
        } else {
            let mut fields = Vec::new();
            for column in &insert.columns {
                let column = column.to_string();
                let column = column.trim_matches('"');
                let field = schema.field_with_name(column).map_err(|_| {
                    Error::table(
                        name,
                        format!(
                            "INSERT INTO {name}: the table has no column '{}' (its columns: {})",
                            column,
                            delta::columns(schema)
                        ),
                    )
                })?;
                fields.push(field.clone());
            }
            fields
        };
        delta::write::check_insert(name, &fields, plan.schema().as_arrow())?;
        Ok((models, usage))
    }
}
