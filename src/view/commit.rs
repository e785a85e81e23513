//! A refresh's commits: which generation it adds to, and each unit committed as a new manifest
//! version on top of whatever other statements committed meanwhile.
//!
//! The rules that keep two statements from undoing each other: a refresh adds only to the
//! generation it began with; it installs a new (pending) generation only for the view's query
//! as it is now, and not over one being built for the same query and models; it makes a pending
//! generation current only if that generation is still the pending one. A CREATE OR REPLACE of
//! the view drops a pending generation of the former query, so a refresh of that query stops.

use std::collections::{BTreeMap, BTreeSet};

use object_store::path::Path;
use url::Url;

use super::plan::{Work, apply, done_elsewhere};
use super::{Generation, Manifest, Retired, Unit, new_id, now_ms};
use crate::error::{Error, Result};
use crate::storage::Manifests;

/// Which generation a refresh adds to.
#[derive(Debug)]
pub struct Target {
    pub id: String,
    /// Not yet in any manifest: installed as the pending generation by the first commit.
    pub new: Option<Generation>,
    /// Pending when the refresh began: made current when complete.
    pub pending: bool,
    /// The units it had when the refresh began, and those this refresh committed since.
    pub known: BTreeSet<String>,
    /// A pending generation this refresh found that is not for its query and models (a model
    /// changed back): dropped by its first commit.
    pub stale_pending: Option<String>,
}

/// How long a retired file is remembered (and kept): longer than any read of the manifest that
/// still listed it.
pub const RETIRED_KEPT_MS: u64 = 3_600_000;

/// How many times a commit tries again when another statement committed first.
const COMMIT_TRIES: usize = 64;

/// The generation a refresh of `manifest` adds to: the current one while the query and the
/// models' bytes (`models`) are the same, else a pending one (continued if a killed refresh
/// began it, else new, with rows of `schema`).
pub fn choose_target(
    manifest: &Manifest,
    models: &BTreeMap<String, String>,
    schema: &datafusion::arrow::datatypes::Schema,
) -> Result<Target> {
    let same = |g: &&Generation| g.query == manifest.query && g.models == *models;
    let known = |g: &Generation| g.units.iter().map(|u| u.id.clone()).collect();
    if let Some(current) = manifest.current.as_ref().filter(same) {
        return Ok(Target {
            id: current.id.clone(),
            new: None,
            pending: false,
            known: known(current),
            stale_pending: manifest.pending.as_ref().map(|p| p.id.clone()),
        });
    }
    if let Some(pending) = manifest.pending.as_ref().filter(same) {
        return Ok(Target {
            id: pending.id.clone(),
            new: None,
            pending: true,
            known: known(pending),
            stale_pending: None,
        });
    }
    let generation = Generation {
        id: new_id("g"),
        query: manifest.query.clone(),
        models: models.clone(),
        schema: super::encode_schema(schema)?,
        units: Vec::new(),
    };
    Ok(Target {
        id: generation.id.clone(),
        new: Some(generation),
        pending: true,
        known: BTreeSet::new(),
        stale_pending: None,
    })
}

/// Commits one unit (`unit`, replacing the units `work` replaces) as a new manifest version; with
/// `promote`, makes the target generation current. `false` where another refresh had scored
/// these inputs first.
pub async fn commit(
    manifests: &Manifests,
    target: &mut Target,
    work: &Work,
    unit: Option<Unit>,
    promote: bool,
) -> Result<bool> {
    for _ in 0..COMMIT_TRIES {
        let Some((version, bytes)) = manifests.latest().await? else {
            return Err(Error::view(
                String::new(),
                "the materialized view was dropped while it was refreshed",
            ));
        };
        let mut manifest = Manifest::from_bytes(&bytes, "a view's manifest")?;
        if manifest.dropped {
            return Err(Error::view(
                manifest.name.clone(),
                "the materialized view was dropped while it was refreshed",
            ));
        }
        let view = manifest.name.clone();
        let redefined = || {
            Error::view(
                view.clone(),
                format!(
                    "materialized view '{view}' was redefined or rebuilt by another statement while \
                 this refresh ran; what it committed before stays, the rest was not kept: run \
                 REFRESH again"
                ),
            )
        };
        take_on_new(&mut manifest, target).map_err(|e| e.unwrap_or_else(redefined))?;
        let is_current = manifest.current.as_ref().is_some_and(|g| g.id == target.id);
        let query = manifest.query.clone();
        let Some(generation) = manifest.generation_mut(&target.id) else {
            return Err(redefined());
        };
        if generation.query != query {
            return Err(redefined());
        }
        if let Some(unit) = &unit
            && generation.units.iter().any(|u| u.id == unit.id)
        {
            // This very commit landed (the store answered its retry as a conflict).
            target.known.insert(unit.id.clone());
            return Ok(true);
        }
        if done_elsewhere(generation, &target.known, work) {
            return Ok(false);
        }
        let retired: Vec<String> = generation
            .units
            .iter()
            .filter(|u| work.replaces.contains(&u.id))
            .flat_map(|u| u.files.iter().map(|f| f.path.clone()))
            .collect();
        apply(generation, &work.replaces, unit.clone());
        retire(&mut manifest, target, retired, promote && !is_current);
        if manifests.create(version + 1, manifest.to_bytes()?).await? {
            target.new = None;
            target.stale_pending = None;
            if let Some(unit) = unit {
                target.known.insert(unit.id);
            }
            target.known.retain(|id| !work.replaces.contains(id));
            return Ok(true);
        }
    }
    Err(Error::view(
        String::new(),
        "the materialized view's manifest kept changing (other statements committed meanwhile); \
         run REFRESH again",
    ))
}

/// A new generation for `target` made the manifest's pending one, unless the view was redefined
/// meanwhile (`Err(None)`) or another refresh is rebuilding it for the same query and models.
fn take_on_new(manifest: &mut Manifest, target: &Target) -> std::result::Result<(), Option<Error>> {
    if let Some(new) = &target.new
        && manifest.generation_mut(&target.id).is_none()
    {
        if new.query != manifest.query {
            return Err(None);
        }
        if let Some(p) = &manifest.pending
            && p.query == new.query
            && p.models == new.models
        {
            return Err(Some(Error::view(
                manifest.name.clone(),
                format!(
                    "materialized view '{}' is being rebuilt by another refresh; run REFRESH \
                 again when it is done",
                    manifest.name
                ),
            )));
        }
        manifest.pending = Some(new.clone());
    }
    Ok(())
}

/// Retires the files of replaced units (`retired`), those of the current generation when the
/// pending one is promoted, and those of a pending generation gone stale; the manifest is
/// stamped as refreshed now.
fn retire(manifest: &mut Manifest, target: &Target, mut retired: Vec<String>, promote: bool) {
    let now = now_ms();
    if promote {
        retired.extend(
            manifest
                .current
                .iter()
                .flat_map(|g| g.files().map(|f| f.path.clone())),
        );
        manifest.current = manifest.pending.take();
    }
    let stale = |p: &Generation| {
        p.query != manifest.query || target.stale_pending.as_deref() == Some(p.id.as_str())
    };
    if manifest.pending.as_ref().is_some_and(stale) {
        retired.extend(
            manifest
                .pending
                .iter()
                .flat_map(|g| g.files().map(|f| f.path.clone())),
        );
        manifest.pending = None;
    }
    manifest.retired.retain(|r| r.at_ms + RETIRED_KEPT_MS > now);
    manifest
        .retired
        .extend(retired.into_iter().map(|path| Retired { path, at_ms: now }));
    manifest.refreshed_ms = Some(now);
}

/// Deletes the files of a unit that was not committed.
pub async fn remove_files(manifests: &Manifests, folder: &Url, unit: &Unit) -> Result<()> {
    let prefix = crate::storage::object_path(folder)?;
    for file in &unit.files {
        let path = Path::parse(format!("{prefix}/{}", file.path))
            .map_err(|e| Error::Internal(e.to_string()))?;
        manifests.delete(&path).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::storage::CommitStore;
    use crate::view::{FORMAT, Input};

    fn manifests(dir: &std::path::Path) -> Manifests {
        let folder = Path::from_filesystem_path(dir).unwrap();
        Manifests::new(Arc::new(CommitStore::local()), folder)
    }

    fn manifest(query: &str, current: Option<Generation>) -> Manifest {
        Manifest {
            format: FORMAT,
            name: "v".into(),
            query: query.into(),
            source: String::new(),
            source_table: None,
            created_ms: 0,
            refreshed_ms: None,
            current,
            pending: None,
            retired: Vec::new(),
            dropped: false,
            settings: Default::default(),
        }
    }

    fn unit(id: &str, path: &str) -> Unit {
        Unit {
            id: id.into(),
            inputs: vec![Input {
                path: path.into(),
                size: 1,
                version: "1".into(),
            }],
            files: vec![super::super::OutputFile {
                path: format!("data/{id}.parquet"),
                size: 1,
            }],
            rows: 1,
            error: None,
        }
    }

    async fn latest(m: &Manifests) -> Manifest {
        let (_, bytes) = m.latest().await.unwrap().unwrap();
        Manifest::from_bytes(&bytes, "test").unwrap()
    }

    fn work(path: &str, replaces: &[&str]) -> Work {
        Work {
            replaces: replaces.iter().map(|r| r.to_string()).collect(),
            inputs: vec![Input {
                path: path.into(),
                size: 1,
                version: "1".into(),
            }],
        }
    }

    #[tokio::test]
    async fn a_rebuild_is_made_current_once_and_a_redefinition_stops_it() {
        let dir = tempfile::tempdir().unwrap();
        let m = manifests(dir.path());
        let schema = datafusion::arrow::datatypes::Schema::empty();
        assert!(
            m.create(1, manifest("q", None).to_bytes().unwrap())
                .await
                .unwrap()
        );
        let start = latest(&m).await;
        // Two refreshes of the same new generation: the first installs it, the second is told.
        let mut a = choose_target(&start, &BTreeMap::new(), &schema).unwrap();
        let mut b = choose_target(&start, &BTreeMap::new(), &schema).unwrap();
        assert!(
            commit(&m, &mut a, &work("x", &[]), Some(unit("u1", "x")), false)
                .await
                .unwrap()
        );
        let err = commit(&m, &mut b, &work("y", &[]), Some(unit("u2", "y")), false).await;
        assert!(err.unwrap_err().to_string().contains("being rebuilt"));
        // Its own unit, committed but answered as a conflict, is not taken for another's.
        assert!(
            commit(&m, &mut a, &work("x", &[]), Some(unit("u1", "x")), false)
                .await
                .unwrap()
        );
        assert_eq!(latest(&m).await.pending.unwrap().units.len(), 1);
        // Made current; promoting again (another refresh of it) leaves it current.
        let nothing = Work {
            replaces: vec![],
            inputs: vec![],
        };
        commit(&m, &mut a, &nothing, None, true).await.unwrap();
        let now = latest(&m).await;
        assert_eq!(now.current.as_ref().unwrap().units.len(), 1);
        let mut again = Target {
            id: a.id.clone(),
            new: None,
            pending: true,
            known: Default::default(),
            stale_pending: None,
        };
        commit(&m, &mut again, &nothing, None, true).await.unwrap();
        assert!(
            latest(&m).await.current.is_some(),
            "a second promote keeps the current rows"
        );
        // A unit replaced: its files are retired, not forgotten.
        let mut c = choose_target(&latest(&m).await, &BTreeMap::new(), &schema).unwrap();
        commit(
            &m,
            &mut c,
            &work("x", &["u1"]),
            Some(unit("u3", "x")),
            false,
        )
        .await
        .unwrap();
        let now = latest(&m).await;
        assert_eq!(now.retired.len(), 1);
        assert_eq!(now.retired[0].path, "data/u1.parquet");
        redefinition_and_drop_stop_a_refresh(&m, &mut c).await;
    }

    /// Redefined: a refresh of the former query stops at its next commit; dropped, likewise.
    async fn redefinition_and_drop_stop_a_refresh(m: &Manifests, c: &mut Target) {
        let schema = datafusion::arrow::datatypes::Schema::empty();
        let mut redefined = latest(m).await;
        redefined.query = "q2".into();
        let (v, _) = m.latest().await.unwrap().unwrap();
        assert!(
            m.create(v + 1, redefined.to_bytes().unwrap())
                .await
                .unwrap()
        );
        let err = commit(m, c, &work("z", &[]), Some(unit("u4", "z")), false).await;
        assert!(err.unwrap_err().to_string().contains("redefined"));
        // A version behind the newest is never created.
        assert!(!m.create(2, b"{}".to_vec()).await.unwrap());
        // Dropped: the drop is the newest version, and a refresh that read the view before it
        // cannot commit after it.
        let (v, _) = m.latest().await.unwrap().unwrap();
        let mut before_drop = choose_target(&latest(m).await, &BTreeMap::new(), &schema).unwrap();
        let dropped = Manifest::dropped("v").to_bytes().unwrap();
        assert!(m.create(v + 1, dropped).await.unwrap());
        let err = commit(
            m,
            &mut before_drop,
            &work("w", &[]),
            Some(unit("u5", "w")),
            false,
        )
        .await;
        assert!(err.unwrap_err().to_string().contains("dropped"));
    }
}
