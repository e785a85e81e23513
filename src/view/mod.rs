//! Materialized views: a row-wise query's results kept in the warehouse and brought up to date by
//! input file, with their statements (CREATE, REFRESH, SHOW and DROP MATERIALIZED VIEW) run
//! through [`Views`], a handle on the session, the warehouse and the catalog.
//!
//! ```text
//! warehouse/views/NAME/
//!   manifest-<version>.json     what the view holds: the newest version is the view
//!   data/<generation>/<unit>/   the Parquet files of one commit's worth of input files
//! ```
//! A refresh lists the view's input files and compares them with the manifest ([`plan`]): files
//! not seen before are scored; a file whose size or version (ETag, or a local file's identity)
//! changed, and a file that is gone, take the unit of files they were committed with out of the
//! view, and the unit's other files are scored again. Each unit is committed as one new manifest
//! version ([`commit`], [`crate::storage::Manifests`]), so a refresh that is killed keeps the
//! units it committed and the next one scores only the rest. Readers read the files the newest
//! manifest lists, never a listing of the folder ([`files`]; the manifest's format is the
//! warehouse's, [`crate::warehouse::view_manifest`]).
//!
//! A view's rows come from one *generation*: the query and the sha256 of each model it used.
//! When either changes (CREATE OR REPLACE MODEL with other bytes, CREATE OR REPLACE MATERIALIZED
//! VIEW), the next refresh builds a new generation beside the current one, which stays what
//! readers read until the new one is complete.

pub mod check;
pub mod commit;
pub mod failed;
pub mod plan;
mod refresh;
mod registered;
pub mod schedule;
mod show;
mod statements;

use datafusion::dataframe::DataFrame;
use datafusion::sql::parser::Statement as DFStatement;

use crate::catalog::Catalog;
use crate::error::{Error, Result};
use crate::session::Session;
use crate::warehouse::Warehouse;

pub use crate::warehouse::view_files as files;
pub use crate::warehouse::view_manifest::*;
pub use refresh::Refreshed;

/// The materialized views of a session: what their statements need, and nothing more.
#[derive(Clone, Copy)]
pub struct Views<'a> {
    session: &'a Session,
    /// Where views are kept: none in an engine without a warehouse.
    warehouse: Option<&'a Warehouse>,
    catalog: &'a Catalog,
}

impl<'a> Views<'a> {
    pub fn new(
        session: &'a Session,
        warehouse: Option<&'a Warehouse>,
        catalog: &'a Catalog,
    ) -> Self {
        Views {
            session,
            warehouse,
            catalog,
        }
    }

    /// The warehouse views are kept in, or the error that there is none.
    fn warehouse(&self) -> Result<&'a Warehouse> {
        self.warehouse.ok_or_else(|| {
            Error::Statement(
                "materialized views are kept in a warehouse; this engine has none".into(),
            )
        })
    }

    /// Plans and runs a view's query, as the catalog runs statements.
    async fn execute(&self, statement: DFStatement) -> Result<DataFrame> {
        self.catalog.execute(self.session, statement).await
    }
}
