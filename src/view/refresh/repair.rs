//! What a refresh repairs: files no manifest lists removed, units whose files are damaged found
//! again, and a rebuild checked to lose none of the inputs the view served.

use super::*;

impl Views<'_> {
    /// Removes files under the view's `data/` that the manifest `now` does not list: those it
    /// retired an hour ago or more (a reader of an older manifest has had that long), and those
    /// of units never committed (a refresh killed, or beaten to them) begun a day ago or more.
    /// A file of a unit still being scored, or of a unit just replaced, is never removed.
    pub(super) async fn remove_unlisted(
        &self,
        manifests: &Manifests,
        folder: &Url,
        (now_version, now): (u64, &Manifest),
    ) -> Result<()> {
        let listed: BTreeSet<&str> = now
            .current
            .iter()
            .chain(now.pending.iter())
            .flat_map(Generation::files)
            .map(|f| f.path.as_str())
            .collect();
        let retired: BTreeMap<&str, u64> = now
            .retired
            .iter()
            .map(|r| (r.path.as_str(), r.at_ms))
            .collect();
        // Files an older version still kept listed, which the newest neither lists nor retired:
        // dropped by a version written by hand (every commit retires what it drops). They go as
        // retired files do, an hour after they were last written.
        let mut dropped: BTreeSet<String> = BTreeSet::new();
        for version in manifests.versions().await? {
            // Only versions before the one this refresh ended at: a later one is another
            // refresh's commit, whose units `now` cannot know.
            if version >= now_version {
                break;
            }
            let Some(bytes) = manifests.read(version).await? else {
                continue;
            };
            let Ok(older) = Manifest::from_bytes(&bytes, "a view's manifest") else {
                continue;
            };
            dropped.extend(
                older
                    .current
                    .iter()
                    .chain(older.pending.iter())
                    .flat_map(Generation::files)
                    .map(|f| f.path.clone())
                    .filter(|p| !listed.contains(p.as_str()) && !retired.contains_key(p.as_str())),
            );
        }
        let view_prefix = crate::storage::object_path(folder)?;
        let data = view_prefix.clone().join("data");
        let now_ms = now_ms();
        for meta in manifests.files_under(&data).await? {
            let Some(path) = meta.location.prefix_match(&view_prefix) else {
                continue;
            };
            let parts: Vec<String> = path.map(|p| p.as_ref().to_string()).collect();
            let path = parts.join("/");
            if listed.contains(path.as_str()) {
                continue;
            }
            let written_ms = meta.last_modified.timestamp_millis() as u64;
            let removable = match retired.get(path.as_str()) {
                Some(at) => at + RETIRED_KEPT_MS <= now_ms,
                None if dropped.contains(&path) => written_ms + RETIRED_KEPT_MS <= now_ms,
                None => parts
                    .get(2)
                    .and_then(|unit| id_time(unit))
                    .is_some_and(|began| {
                        began + ABANDONED_AFTER_MS <= now_ms
                            && meta.last_modified.timestamp_millis() as u64 + RETIRED_KEPT_MS
                                <= now_ms
                    }),
            };
            if removable {
                manifests.delete(&meta.location).await?;
            }
        }
        Ok(())
    }
}

/// How long after it began a unit no manifest lists is taken for abandoned.
const ABANDONED_AFTER_MS: u64 = 24 * 3_600_000;

/// The generation `id` as the newest manifest has it.
pub(super) async fn target_now(manifests: &Manifests, id: &str) -> Result<Option<Generation>> {
    let Some((_, manifest)) = newest_view(manifests, "a view's manifest").await? else {
        return Ok(None);
    };
    Ok(manifest
        .current
        .into_iter()
        .chain(manifest.pending)
        .find(|g| g.id == id))
}

/// The units of `generation` with a file missing from the view's folder, or of another size
/// (one listing).
pub(super) async fn damaged_units(
    manifests: &Manifests,
    folder: &Url,
    generation: &Generation,
) -> Result<BTreeSet<String>> {
    if generation.units.iter().all(|u| u.files.is_empty()) {
        return Ok(BTreeSet::new());
    }
    let present = crate::view::files::present_files(manifests, folder).await?;
    Ok(generation
        .units
        .iter()
        .filter(|u| {
            u.files
                .iter()
                .any(|f| present.get(&f.path) != Some(&f.size))
        })
        .map(|u| u.id.clone())
        .collect())
}

/// The units of `rebuilt` that hold an error for a file `current` serves.
pub(super) fn served_but_failed(current: Option<&Generation>, rebuilt: &Generation) -> Vec<String> {
    let Some(current) = current else {
        return Vec::new();
    };
    if current.id == rebuilt.id {
        return Vec::new();
    }
    let served = served_inputs(current);
    rebuilt
        .units
        .iter()
        .filter(|u| u.error.is_some() && u.inputs.iter().any(|i| served.contains(i.path.as_str())))
        .map(|u| u.id.clone())
        .collect()
}

/// The input files whose rows `generation` serves.
pub(super) fn served_inputs(generation: &Generation) -> BTreeSet<&str> {
    generation
        .units
        .iter()
        .filter(|u| u.error.is_none())
        .flat_map(|u| u.inputs.iter().map(|i| i.path.as_str()))
        .collect()
}

/// A rebuild that could not read files the current generation serves would take their rows out
/// of the view: it stays pending (readers keep the current rows) and the refresh fails naming
/// them, until they can be read or are removed.
pub(super) fn check_rebuild_loses_nothing(
    name: &str,
    current: Option<&Generation>,
    rebuilt: Option<&Generation>,
) -> Result<()> {
    let (Some(current), Some(rebuilt)) = (current, rebuilt) else {
        return Ok(());
    };
    let served = served_inputs(current);
    let lost: Vec<String> = rebuilt
        .failed_inputs()
        .into_iter()
        .filter(|(path, _)| served.contains(path))
        .map(|(path, why)| format!("{path}: {why}"))
        .collect();
    if lost.is_empty() {
        return Ok(());
    }
    Err(Error::view(
        name,
        format!(
            "materialized view '{name}': its rebuild cannot read {} input file(s) whose rows the view \
         serves now, so it keeps its current rows ({}); fix or remove them and REFRESH again",
            lost.len(),
            lost.join("; ")
        ),
    ))
}
