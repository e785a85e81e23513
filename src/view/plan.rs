//! What a refresh has to do, from the input files listed and the units a generation holds; and
//! how a committed unit changes the generation. No I/O here.

use std::collections::{BTreeMap, BTreeSet};

use super::{Generation, Input, Unit};

/// How much a refresh scores between two commits.
#[derive(Debug, Clone, Copy)]
pub struct CommitSize {
    pub files: usize,
    pub bytes: u64,
}

/// One commit's worth of work: input files to score, and the units their rows replace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Work {
    pub replaces: Vec<String>,
    pub inputs: Vec<Input>,
}

/// What a refresh finds and will do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// Input files seen for the first time, changed since they were scored, and gone.
    pub new: usize,
    pub changed: usize,
    pub removed: usize,
    pub work: Vec<Work>,
}

/// Compares the files `listed` with the units of `generation`. A unit with a changed or missing
/// input, or one of the `damaged` units (its output files are not all there), is replaced: its
/// inputs that are still there are scored again, together. Files no unit has are scored in
/// commits of at most `size`.
pub fn plan(
    generation: &Generation,
    listed: &[Input],
    size: CommitSize,
    damaged: &BTreeSet<String>,
) -> Changes {
    let now: BTreeMap<&str, &Input> = listed.iter().map(|i| (i.path.as_str(), i)).collect();
    let mut changes = Changes::default();
    let mut covered = BTreeSet::new();
    for unit in &generation.units {
        let mut stale = damaged.contains(&unit.id);
        let mut surviving = Vec::new();
        for input in &unit.inputs {
            covered.insert(input.path.as_str());
            match now.get(input.path.as_str()) {
                Some(listed) if *listed == input => surviving.push((*listed).clone()),
                Some(listed) => {
                    changes.changed += 1;
                    stale = true;
                    surviving.push((*listed).clone());
                }
                None => {
                    changes.removed += 1;
                    stale = true;
                }
            }
        }
        if stale {
            changes.work.push(Work {
                replaces: vec![unit.id.clone()],
                inputs: surviving,
            });
        }
    }
    let mut batch: Vec<Input> = Vec::new();
    let mut bytes = 0;
    for input in listed.iter().filter(|i| !covered.contains(i.path.as_str())) {
        changes.new += 1;
        if !batch.is_empty() && (batch.len() >= size.files || bytes + input.size > size.bytes) {
            changes.work.push(Work {
                replaces: Vec::new(),
                inputs: std::mem::take(&mut batch),
            });
            bytes = 0;
        }
        bytes += input.size;
        batch.push(input.clone());
    }
    if !batch.is_empty() {
        changes.work.push(Work {
            replaces: Vec::new(),
            inputs: batch,
        });
    }
    changes
}

/// Whether `work` was done meanwhile by another refresh: one of its inputs is in a unit that was
/// not in the generation this refresh started from (`known` units).
pub fn done_elsewhere(generation: &Generation, known: &BTreeSet<String>, work: &Work) -> bool {
    let paths: BTreeSet<&str> = work.inputs.iter().map(|i| i.path.as_str()).collect();
    generation
        .units
        .iter()
        .filter(|u| !known.contains(&u.id))
        .any(|u| u.inputs.iter().any(|i| paths.contains(i.path.as_str())))
}

/// The generation with the units `replaces` names taken out and `unit` (if any) added.
pub fn apply(generation: &mut Generation, replaces: &[String], unit: Option<Unit>) {
    generation.units.retain(|u| !replaces.contains(&u.id));
    generation.units.extend(unit);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(path: &str, version: &str) -> Input {
        Input {
            path: path.into(),
            size: 10,
            version: version.into(),
        }
    }

    fn unit(id: &str, inputs: &[Input]) -> Unit {
        Unit {
            id: id.into(),
            inputs: inputs.to_vec(),
            files: Vec::new(),
            rows: 0,
            error: None,
        }
    }

    fn generation(units: Vec<Unit>) -> Generation {
        Generation {
            id: "g".into(),
            query: String::new(),
            models: BTreeMap::new(),
            schema: String::new(),
            units,
        }
    }

    fn none() -> BTreeSet<String> {
        BTreeSet::new()
    }

    const SIZE: CommitSize = CommitSize {
        files: 2,
        bytes: 1 << 30,
    };

    #[test]
    fn new_files_are_scored_in_commits_of_the_size_asked() {
        let listed: Vec<Input> = ["a", "b", "c"].iter().map(|p| input(p, "1")).collect();
        let changes = plan(&generation(vec![]), &listed, SIZE, &none());
        assert_eq!(changes.new, 3);
        assert_eq!(changes.work.len(), 2);
        assert_eq!(changes.work[0].inputs.len(), 2);
        let bytes = CommitSize {
            files: 10,
            bytes: 15,
        };
        assert_eq!(
            plan(&generation(vec![]), &listed, bytes, &none())
                .work
                .len(),
            3
        );
    }

    #[test]
    fn a_changed_or_removed_file_replaces_its_unit_and_rescores_the_rest_of_it() {
        let g = generation(vec![
            unit("u1", &[input("a", "1"), input("b", "1")]),
            unit("u2", &[input("c", "1")]),
            unit("u3", &[input("d", "1")]),
        ]);
        let listed = vec![
            input("a", "1"),
            input("b", "2"),
            input("d", "1"),
            input("e", "1"),
        ];
        let changes = plan(&g, &listed, SIZE, &none());
        assert_eq!((changes.new, changes.changed, changes.removed), (1, 1, 1));
        assert_eq!(
            changes.work,
            vec![
                Work {
                    replaces: vec!["u1".into()],
                    inputs: vec![input("a", "1"), input("b", "2")]
                },
                Work {
                    replaces: vec!["u2".into()],
                    inputs: vec![]
                },
                Work {
                    replaces: vec![],
                    inputs: vec![input("e", "1")]
                },
            ]
        );
        // Nothing changed: nothing to do.
        let same = vec![
            input("a", "1"),
            input("b", "1"),
            input("c", "1"),
            input("d", "1"),
        ];
        assert_eq!(plan(&g, &same, SIZE, &none()), Changes::default());
    }

    #[test]
    fn work_done_by_another_refresh_is_recognized() {
        let known: BTreeSet<String> = ["u1".to_string()].into();
        let mut g = generation(vec![unit("u1", &[input("a", "1")])]);
        let work = Work {
            replaces: vec![],
            inputs: vec![input("b", "1")],
        };
        assert!(!done_elsewhere(&g, &known, &work));
        apply(&mut g, &[], Some(unit("other", &[input("b", "1")])));
        assert!(done_elsewhere(&g, &known, &work));
        apply(&mut g, &["other".into()], None);
        assert_eq!(g.units.len(), 1);
    }
}
