//! The materialized-view statements: CREATE, REFRESH, SHOW and DROP MATERIALIZED VIEW.

use std::collections::BTreeMap;

use datafusion::sql::sqlparser::ast::{Query, Statement as SQLStatement};

use super::show::refreshed_batch;
use super::*;
use crate::message::display_error;
use crate::statements::ViewStatement;
use crate::warehouse::object_name;
use crate::warehouse::schema::Kind;

impl Views<'_> {
    pub async fn run(&self, statement: ViewStatement) -> Result<DataFrame> {
        match statement {
            ViewStatement::Create {
                name,
                query,
                or_replace,
                if_not_exists,
            } => {
                let name = object_name("view", &name)?;
                self.create_view(&name, &query, or_replace, if_not_exists)
                    .await
            }
            ViewStatement::Refresh { name } => {
                let refreshed = self.refresh_view(&object_name("view", &name)?).await?;
                self.session.result(refreshed_batch(&refreshed)?)
            }
            ViewStatement::Show => self.show_views().await,
            ViewStatement::Drop { name, if_exists } => {
                let name = object_name("view", &name)?;
                self.drop_view(&name, if_exists).await
            }
        }
    }

    /// DROP MATERIALIZED VIEW: a version saying so is created on top of the newest (so no
    /// statement that read an older one can commit after it), then the files the dropped view's
    /// last manifest names are removed, generation folder by generation folder: a view created
    /// again meanwhile writes into folders of its own.
    async fn drop_view(&self, name: &str, if_exists: bool) -> Result<DataFrame> {
        let warehouse = self.warehouse()?;
        let manifests = warehouse.view_manifests(name)?;
        let (version, dropped) = loop {
            let Some((version, bytes)) = live(manifests.latest().await?) else {
                if if_exists {
                    return self.session.empty();
                }
                return Err(Error::view(
                    name,
                    format!("there is no materialized view '{name}'"),
                ));
            };
            let tombstone = Manifest::dropped(name).to_bytes()?;
            if manifests.create(version + 1, tombstone).await? {
                break (
                    version + 1,
                    Manifest::from_bytes(&bytes, "the view's manifest").ok(),
                );
            }
        };
        warehouse
            .remove_view_data(name, version, dropped.as_ref())
            .await?;
        self.session.empty()
    }

    /// CREATE MATERIALIZED VIEW: the definition kept, then the first refresh. When that fails,
    /// the view is as it was before the statement (none, or the former definition).
    async fn create_view(
        &self,
        name: &str,
        query: &Query,
        or_replace: bool,
        if_not_exists: bool,
    ) -> Result<DataFrame> {
        let warehouse = self.warehouse()?;
        let manifests = warehouse.view_manifests(name)?;
        let latest = manifests.latest().await?;
        let exists = live(latest.clone()).is_some();
        if !self
            .check_view_name(name, exists, or_replace, if_not_exists)
            .await?
        {
            return self.session.empty();
        }
        let (query, literals) = with_absolute_paths(name, query)?;
        let query = &query;
        // Refused now, before anything is kept, if it cannot be a view.
        let df = self
            .execute(DFStatement::Statement(Box::new(SQLStatement::Query(
                Box::new(query.clone()),
            ))))
            .await?;
        let source = crate::view::check::row_wise_source(df.logical_plan(), name)?;
        crate::view::check::without_credentials(name, &source.shown())?;
        let text = query.to_string();
        let source_table = source.as_table(&literals)?;
        let definition = Manifest {
            dropped: false,
            settings: self.view_settings_now()?,
            format: crate::view::FORMAT,
            name: name.to_string(),
            source: source.shown(),
            source_table,
            created_ms: now_ms(),
            refreshed_ms: None,
            current: None,
            pending: None,
            query: text.clone(),
            retired: Vec::new(),
        };
        // Kept on top of whatever is there now: a refresh committing meanwhile is not undone.
        let mut latest = latest;
        let before = loop {
            // A manifest that cannot be read is replaced as if there were none, as is a drop.
            let before = latest
                .as_ref()
                .and_then(|(_, bytes)| Manifest::from_bytes(bytes, "the view's manifest").ok())
                .filter(|m| !m.dropped);
            let manifest =
                replacing(definition.clone(), before.as_ref(), exists, &manifests).await?;
            let version = latest.as_ref().map_or(1, |(v, _)| v + 1);
            if manifests.create(version, manifest.to_bytes()?).await? {
                break before;
            }
            latest = manifests.latest().await?;
            if live(latest.clone()).is_none() || !or_replace {
                return Err(Error::view(
                    name,
                    format!(
                        "materialized view '{name}' was created or dropped by another statement \
                     meanwhile"
                    ),
                ));
            }
        };
        match self.refresh_view(name).await {
            Ok(refreshed) => self.session.rows_result(refreshed.rows_scored),
            Err(e) => {
                self.undo_create(name, &text, before).await;
                Err(e)
            }
        }
    }

    /// Whether a CREATE makes view `name`: it is new, or replaced (`or_replace`), and no table
    /// has the name. IF NOT EXISTS asks for nothing where the name is taken, by a table too (as
    /// PostgreSQL): false, and said.
    async fn check_view_name(
        &self,
        name: &str,
        exists: bool,
        or_replace: bool,
        if_not_exists: bool,
    ) -> Result<bool> {
        if exists && if_not_exists {
            return Ok(false);
        }
        if exists && !or_replace {
            return Err(Error::view(
                name,
                format!(
                    "materialized view '{name}' already exists (use CREATE OR REPLACE MATERIALIZED \
                 VIEW, or REFRESH MATERIALIZED VIEW {name})"
                ),
            ));
        }
        if exists {
            return Ok(true);
        }
        let kind = self.catalog.table_kind(name, self.session).await?;
        if !kind.is_some_and(|kind| kind != Kind::View) {
            return Ok(true);
        }
        if if_not_exists {
            crate::say!(
                "a table named '{name}' exists: CREATE MATERIALIZED VIEW IF NOT EXISTS {name} \
                 created nothing"
            );
            return Ok(false);
        }
        Err(Error::view(
            name,
            format!("a table named '{name}' exists; a materialized view needs a name of its own"),
        ))
    }

    /// After a CREATE of `query` whose first refresh failed: no view, or the one there was (its
    /// definition put back; what it held was never taken away). Unless another statement
    /// redefined the view meanwhile: then it is left as that one made it.
    async fn undo_create(&self, name: &str, query: &str, before: Option<Manifest>) {
        let Ok(warehouse) = self.warehouse() else {
            return;
        };
        let undone = async {
            let manifests = warehouse.view_manifests(name)?;
            // Tried again over what other statements commit meanwhile, as a refresh's commits.
            for _ in 0..64 {
                let Some((version, bytes)) = manifests.latest().await? else {
                    return Ok(());
                };
                let mut now = Manifest::from_bytes(&bytes, "the view's manifest")?;
                if now.query != query || now.dropped {
                    return Ok(());
                }
                let Some(before) = &before else {
                    return self.drop_view(name, true).await.map(|_| ());
                };
                now.query = before.query.clone();
                now.source = before.source.clone();
                now.source_table = before.source_table.clone();
                now.pending = before.pending.clone();
                now.settings = before.settings.clone();
                if manifests.create(version + 1, now.to_bytes()?).await? {
                    return Ok(());
                }
            }
            Err(Error::view(name, "its manifest kept changing"))
        }
        .await;
        if let Err(e) = undone {
            crate::say!(
                "warning: materialized view '{name}' could not be put back as it was: {}",
                display_error(&e)
            );
        }
    }

    /// The session's settings a view keeps ([`crate::view::VIEW_SETTINGS`]), a rejects folder
    /// made absolute (so that any later refresh writes where this one would).
    fn view_settings_now(&self) -> Result<BTreeMap<String, String>> {
        let options = self.session.batchinfer_options();
        let mut settings = BTreeMap::new();
        for entry in datafusion::config::ExtensionOptions::entries(&options) {
            let Some(key) = entry.key.strip_prefix("batchinfer.") else {
                continue;
            };
            // Unset is kept too (as ''), so that no refreshing session's setting stands in.
            let value = entry.value.or_else(|| Some(String::new()));
            if let (true, Some(value)) = (crate::view::VIEW_SETTINGS.contains(&key), value) {
                let value = match key {
                    "rejects" if !value.is_empty() => crate::storage::absolute_location(&value)?,
                    _ => value,
                };
                settings.insert(key.to_string(), value);
            }
        }
        Ok(settings)
    }
}

/// The files `before` retired, and those of its pending generation when a new query abandons it.
fn retire_abandoned(before: &Manifest, query: &str) -> Vec<crate::view::Retired> {
    let mut retired = before.retired.clone();
    let at_ms = now_ms();
    let abandoned = before.pending.iter().filter(|p| p.query != query);
    retired.extend(abandoned.flat_map(|p| {
        p.files().map(move |f| crate::view::Retired {
            path: f.path.clone(),
            at_ms,
        })
    }));
    retired
}

/// `query` with the files it names made absolute, so that they are the same ones whatever the
/// working folder of a later refresh, and those files; none may hold credentials.
fn with_absolute_paths(name: &str, query: &Query) -> Result<(Query, Vec<String>)> {
    let mut query = query.clone();
    let mut unusable = None;
    let mut literals = Vec::new();
    let _ = datafusion::sql::sqlparser::ast::visit_relations_mut(&mut query, |relation| {
        use datafusion::sql::sqlparser::ast::ObjectNamePart;
        if let [ObjectNamePart::Identifier(ident)] = relation.0.as_mut_slice()
            && ident.quote_style == Some('\'')
        {
            match crate::storage::absolute_location(&ident.value) {
                Ok(absolute) => {
                    literals.push(absolute.clone());
                    ident.value = absolute;
                }
                Err(e) => unusable = Some(e),
            }
        }
        std::ops::ControlFlow::<()>::Continue(())
    });
    // `read_blob('photos/')` and the other functions that read files: their folder or glob too.
    let mut files = FilesOfFunctions::default();
    let _ = datafusion::sql::sqlparser::ast::VisitMut::visit(&mut query, &mut files);
    unusable = unusable.or(files.unusable);
    literals.extend(files.locations);
    if let Some(e) = unusable {
        return Err(e);
    }
    for literal in &literals {
        crate::view::check::without_credentials(name, literal)?;
    }
    Ok((query, literals))
}

/// The folders and globs of the functions that read files (`read_blob`, ...) in a query, made
/// absolute.
#[derive(Default)]
struct FilesOfFunctions {
    locations: Vec<String>,
    unusable: Option<crate::error::Error>,
}

impl datafusion::sql::sqlparser::ast::VisitorMut for FilesOfFunctions {
    type Break = ();

    fn pre_visit_table_factor(
        &mut self,
        factor: &mut datafusion::sql::sqlparser::ast::TableFactor,
    ) -> std::ops::ControlFlow<()> {
        use datafusion::sql::sqlparser::ast::{
            Expr, FunctionArg, FunctionArgExpr, ObjectNamePart, TableFactor, Value,
        };
        let TableFactor::Table {
            name,
            args: Some(args),
            ..
        } = factor
        else {
            return std::ops::ControlFlow::Continue(());
        };
        let is_files = matches!(name.0.as_slice(), [ObjectNamePart::Identifier(f)]
            if crate::blob::FUNCTIONS.iter().any(|n| f.value.eq_ignore_ascii_case(n)));
        if let (
            true,
            [
                FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::Value(value))),
                ..,
            ],
        ) = (is_files, args.args.as_mut_slice())
            && let Value::SingleQuotedString(location) = &mut value.value
        {
            match crate::storage::absolute_location(location) {
                Ok(absolute) => {
                    self.locations.push(absolute.clone());
                    *location = absolute;
                }
                Err(e) => self.unusable = Some(e),
            }
        }
        std::ops::ControlFlow::Continue(())
    }
}

/// The manifest of a new definition kept over `before`, the view's manifest now (`None` where
/// there is none, or it cannot be read though the view `exists`): its history carried over.
async fn replacing(
    mut new: Manifest,
    before: Option<&Manifest>,
    exists: bool,
    manifests: &crate::storage::Manifests,
) -> Result<Manifest> {
    if let Some(b) = before {
        new.created_ms = b.created_ms;
    }
    new.refreshed_ms = before.and_then(|b| b.refreshed_ms);
    new.current = before.and_then(|b| b.current.clone());
    // A rebuild for the former query is abandoned; one for this query goes on.
    new.pending = before
        .and_then(|b| b.pending.clone())
        .filter(|p| p.query == new.query);
    new.retired = match before {
        Some(b) => retire_abandoned(b, &new.query),
        // What an unreadable manifest held is unknown: every generation folder there is now is
        // the old view's, retired (a DROP removes them).
        None if exists => manifests
            .folders_under("data")
            .await?
            .into_iter()
            .map(|g| crate::view::Retired {
                path: format!("data/{g}"),
                at_ms: now_ms(),
            })
            .collect(),
        None => Vec::new(),
    };
    Ok(new)
}
