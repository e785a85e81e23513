//! The catalog's tables: what a name names (a table this process registered, a warehouse table
//! or view), CREATE EXTERNAL TABLE by the session's table factories, DROP TABLE, and the table
//! an INSERT writes into.

use std::sync::Arc;

use datafusion::common::TableReference;
use datafusion::dataframe::DataFrame;
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::Statement as SQLStatement;

use super::Catalog;
use crate::error::{Error, Result};
use crate::session::Session;
use crate::warehouse::schema::Kind;
use crate::warehouse::{Warehouse, table_name};

impl Catalog {
    /// What `name` names in the session's default schema now (a table this process
    /// registered, a warehouse table or view), if anything.
    pub async fn table_kind(&self, name: &str, session: &Session) -> Result<Option<Kind>> {
        match &self.tables {
            Some(schema) => schema.kind(name).await,
            None => {
                let exists = session.ctx().table_exist(TableReference::bare(name))?;
                Ok(exists.then_some(Kind::Registered))
            }
        }
    }

    /// Lists the warehouse's tables and views for a statement that asks for every name.
    pub async fn list_tables(&self) -> Result<()> {
        match &self.tables {
            Some(schema) => schema.list().await,
            None => Ok(()),
        }
    }

    /// The table an INSERT writes into, where it is a listing table (files in a folder) or a
    /// Delta table of the warehouse.
    pub async fn insert_target(
        &self,
        insert: &datafusion::sql::sqlparser::ast::Insert,
        session: &Session,
    ) -> Option<Arc<dyn datafusion::catalog::TableProvider>> {
        use datafusion::datasource::listing::ListingTable;
        use datafusion::sql::sqlparser::ast::TableObject;
        let TableObject::TableName(name) = &insert.table else {
            return None;
        };
        // A Delta table of the warehouse, opened as one whatever the placement reads it as.
        if let (Some(schema), Ok(bare)) = (&self.tables, table_name(name))
            && let Ok(Some(delta)) = schema.delta_table(&bare).await
        {
            return Some(delta);
        }
        let provider = session.ctx().table_provider(name.to_string()).await.ok()?;
        let listing = provider
            .downcast_ref::<ListingTable>()
            .is_some_and(|listing| !listing.table_paths().is_empty());
        let delta = provider
            .downcast_ref::<crate::delta::DeltaTableProvider>()
            .is_some_and(|delta| delta.is_warehouse_table());
        (listing || delta).then_some(provider)
    }

    /// CREATE EXTERNAL TABLE, of every kind (files, PostgreSQL, SQLite), by the session's table
    /// factories: the new table is made before the one it replaces (OR REPLACE) is
    /// deregistered, so that one that fails to connect or to read leaves the old one.
    pub async fn create_external_table(
        &self,
        session: &Session,
        create: &datafusion::logical_expr::CreateExternalTable,
    ) -> Result<DataFrame> {
        if let Some(database) = crate::database::Database::of(&create.file_type) {
            session
                .placement()
                .reads_in_process(&format!("a {} table", database.name()))?;
        }
        if crate::delta::STORED_AS.contains(&create.file_type.to_ascii_uppercase().as_str()) {
            let what = format!("the Delta table '{}'", create.name);
            session.placement().reads_in_process(&what)?;
        }
        let name = create.name.clone();
        if create.temporary {
            return Err(Error::table(&name, "temporary tables are not supported"));
        }
        let exists = match &name {
            TableReference::Bare { table } => self.table_kind(table, session).await?.is_some(),
            _ => session.ctx().table_exist(name.clone())?,
        };
        if exists {
            if create.if_not_exists {
                return Ok(session.ctx().read_empty()?.limit(0, Some(0))?);
            }
            if !create.or_replace {
                return Err(Error::table(
                    &name,
                    format!(
                        "table '{name}' exists already (CREATE OR REPLACE EXTERNAL TABLE replaces it)"
                    ),
                ));
            }
        }
        let state = session.ctx().state();
        let kind = create.file_type.to_ascii_uppercase();
        let Some(factory) = state.table_factories().get(&kind) else {
            return Err(Error::table(
                &name,
                format!("table '{name}': no table is STORED AS {}", create.file_type),
            ));
        };
        let provider = factory.create(&state, create).await?;
        session.ctx().deregister_table(name.clone())?;
        session.ctx().register_table(name, provider)?;
        Ok(session.ctx().read_empty()?.limit(0, Some(0))?)
    }

    /// DROP TABLE: refused for a materialized view; a warehouse table's files are removed (one
    /// that cannot be read too) once DataFusion dropped the others named, the tables this
    /// process registered (an external table, which deletes nothing, even where it reads the
    /// warehouse's files).
    pub async fn drop_tables(
        &self,
        session: &Session,
        warehouse: &Warehouse,
        names: Vec<datafusion::sql::sqlparser::ast::ObjectName>,
        mut statement: DFStatement,
    ) -> Result<DataFrame> {
        let (mut owned, mut others) = (Vec::new(), Vec::new());
        for object in names {
            let name = table_name(&object)?;
            match self.table_kind(&name, session).await? {
                Some(Kind::View) => {
                    return Err(Error::table(
                        &name,
                        format!("'{name}' is a materialized view: DROP MATERIALIZED VIEW {name}"),
                    ));
                }
                Some(Kind::Table) => owned.push(name),
                Some(Kind::Registered) | None => others.push(object),
            }
        }
        let df = match others.is_empty() {
            true => session.empty()?,
            false => {
                if let DFStatement::Statement(s) = &mut statement
                    && let SQLStatement::Drop { names, .. } = s.as_mut()
                {
                    *names = others;
                }
                session.run_plan(session.plan(statement).await?).await?
            }
        };
        for name in owned {
            if let Some(schema) = &self.tables {
                schema.forget(&name);
            }
            warehouse.remove_table(&name).await?;
        }
        Ok(df)
    }
}
