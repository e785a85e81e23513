//! `OPTIONS (...)` of COPY and CREATE EXTERNAL TABLE: the buckets they name are connected with
//! them, and the secrets among them blanked once used.

use std::ops::ControlFlow;

use datafusion::sql::parser::{CopyToSource, Statement as DFStatement};
use datafusion::sql::sqlparser::ast::{
    ObjectNamePart, Value as SqlValue, VisitMut, visit_relations_mut,
};

use super::Session;
use crate::error::Result;
use crate::storage::{StoreOptions, blank_passwords};

impl Session {
    /// Connects the buckets a statement names with its `OPTIONS`, then blanks the values of the
    /// options that are secrets (keys, tokens, passwords) in the statement, so that no plan,
    /// table definition or error printed from it shows them. The stores it connected for the
    /// first time are returned, so that a statement that fails leaves no settings behind ([`crate::storage::StoreRegistry::forget`]).
    pub fn connect_stores(&self, statement: &mut DFStatement) -> Result<Vec<String>> {
        let mut connected = Vec::new();
        match statement {
            DFStatement::CopyTo(copy) => {
                connected.extend(self.connect_with_options(&copy.target, &copy.options)?);
                redact(&mut copy.options);
                copy.target = blank_passwords(&copy.target);
                if let CopyToSource::Query(query) = &mut copy.source {
                    blank_table_passwords(query.as_mut());
                }
            }
            // A database table's options are for its factory: the password connects it
            // (the statement's text and an EXPLAIN of it show it blanked: [`shown`]).
            DFStatement::CreateExternalTable(table)
                if crate::database::Database::of(&table.file_type).is_some() => {}
            DFStatement::CreateExternalTable(table) => {
                for location in &table.locations {
                    connected.extend(self.connect_with_options(location, &table.options)?);
                }
                redact(&mut table.options);
                for location in &mut table.locations {
                    *location = blank_passwords(location);
                }
            }
            DFStatement::Explain(explain) => {
                connected.extend(self.connect_stores(&mut explain.statement)?);
                if let DFStatement::CreateExternalTable(table) = explain.statement.as_mut() {
                    redact(&mut table.options);
                }
            }
            DFStatement::Statement(s) => blank_table_passwords(s.as_mut()),
            _ => {}
        }
        Ok(connected)
    }

    /// `OPTIONS ('aws.region' '...')`, `('gcp.service_account_key' '...')` or
    /// `('azure.account_name' '...')` on a location in an object store: its bucket or container
    /// is connected with them (over the environment's settings); its key where this connected it
    /// first.
    fn connect_with_options(
        &self,
        location: &str,
        options: &[(String, SqlValue)],
    ) -> Result<Option<String>> {
        let mut store = StoreOptions::default();
        let mut given = false;
        for (key, value) in options {
            given |= store.set(key, &option_text(value))?;
        }
        if !given {
            return Ok(None);
        }
        self.registry.stores().connect_with(location, &store)
    }
}

/// The text of `statement` as it may be shown (kept with its rejects and in a Delta table's
/// commits, in progress lines and messages): with the secrets of a table definition's options
/// blanked, and every other secret its text holds ([`crate::statements::blank_secrets`]: a value
/// after a name that says it is one, a URL's password and query).
pub fn shown(statement: &DFStatement) -> String {
    let text = options_blanked(statement);
    crate::statements::blank_secrets(
        &text,
        &datafusion::sql::sqlparser::dialect::GenericDialect {},
    )
}

fn options_blanked(statement: &DFStatement) -> String {
    match statement {
        DFStatement::CreateExternalTable(table) => {
            let mut table = table.clone();
            redact(&mut table.options);
            DFStatement::CreateExternalTable(table).to_string()
        }
        other => other.to_string(),
    }
}

/// Blanks the password of every table named by a URL (`FROM 's3://user:pw@bucket/x'`), so that
/// no plan or error printed from the statement shows it (no store takes a password in a URL).
fn blank_table_passwords<V: VisitMut>(node: &mut V) {
    let _ = visit_relations_mut(node, |name| {
        for part in name.0.iter_mut() {
            if let ObjectNamePart::Identifier(ident) = part
                && ident.value.contains('@')
            {
                ident.value = blank_passwords(&ident.value);
            }
        }
        ControlFlow::<()>::Continue(())
    });
}

/// What a secret option's value reads as once the statement has used it.
const REDACTED: &str = "<redacted>";

/// Blanks the values of the options whose name says they are secret, and the password of any
/// URL in the others.
fn redact(options: &mut [(String, SqlValue)]) {
    for (key, value) in options {
        if crate::statements::is_secret_name(key) {
            *value = SqlValue::SingleQuotedString(REDACTED.to_string());
        } else if let SqlValue::SingleQuotedString(text) | SqlValue::DoubleQuotedString(text) =
            value
        {
            // A URL's password, in any option (an endpoint): blanked too.
            *text = blank_passwords(text);
        }
    }
}

/// The text of a SQL option's value (`'us-east-1'`, `true`, `9000`).
fn option_text(value: &SqlValue) -> String {
    match value {
        SqlValue::SingleQuotedString(s) | SqlValue::DoubleQuotedString(s) => s.clone(),
        other => other.to_string(),
    }
}
