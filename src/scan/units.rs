//! What each partition reads: row groups, or row ranges of them, dealt by rows.

use std::ops::Range;

/// Rows `rows` of row group `row_group` of file `file`.
#[derive(Debug, Clone)]
pub(crate) struct Unit {
    pub(crate) file: usize,
    pub(crate) row_group: usize,
    pub(crate) rows: Range<usize>,
    /// All rows of the row group.
    pub(crate) group_rows: usize,
    /// Whether the row group may be split into row ranges: reading a range that starts inside
    /// it skips the rows before, and arrow-rs's skip fails on some valid DELTA_BINARY_PACKED
    /// columns ("delta*n overflow in skip"), so a row group with delta-encoded columns is read
    /// whole, by one partition.
    pub(crate) splittable: bool,
}

/// With fewer row groups than partitions, each is split into row ranges (of at least a batch)
/// so that every partition has rows to read.
pub(crate) fn split_for(units: Vec<Unit>, partitions: usize, batch_size: usize) -> Vec<Unit> {
    if units.is_empty() || units.len() >= partitions {
        return units;
    }
    let pieces = partitions.div_ceil(units.len());
    let mut out = Vec::with_capacity(units.len() * pieces);
    for unit in units {
        if !unit.splittable {
            out.push(unit);
            continue;
        }
        let len = unit.rows.len().div_ceil(pieces).max(batch_size);
        let mut start = unit.rows.start;
        while start < unit.rows.end {
            let end = (start + len).min(unit.rows.end);
            out.push(Unit {
                rows: start..end,
                ..unit.clone()
            });
            start = end;
        }
    }
    out
}

/// `units` in order, in `partitions` consecutive runs of about equal rows.
pub(crate) fn deal(units: Vec<Unit>, partitions: usize) -> Vec<Vec<Unit>> {
    let total: usize = units.iter().map(|u| u.rows.len()).sum();
    let mut out: Vec<Vec<Unit>> = vec![Vec::new(); partitions];
    let mut done = 0;
    for unit in units {
        // The partition whose share of the rows holds this unit's middle row.
        let middle = done + unit.rows.len() / 2;
        let p = (middle * partitions / total.max(1)).min(partitions - 1);
        done += unit.rows.len();
        out[p].push(unit);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn units(rows: &[usize]) -> Vec<Unit> {
        rows.iter()
            .enumerate()
            .map(|(g, &n)| Unit {
                file: 0,
                row_group: g,
                rows: 0..n,
                group_rows: n,
                splittable: true,
            })
            .collect()
    }

    fn covered(units: &[Unit]) -> Vec<(usize, Range<usize>)> {
        units
            .iter()
            .map(|u| (u.row_group, u.rows.clone()))
            .collect()
    }

    #[test]
    fn one_row_group_is_split_across_the_partitions() {
        let split = split_for(units(&[1_000_000]), 2, 8192);
        assert_eq!(
            covered(&split),
            vec![(0, 0..500_000), (0, 500_000..1_000_000)]
        );
        let dealt = deal(split, 2);
        assert_eq!(dealt[0].len(), 1);
        assert_eq!(dealt[1].len(), 1);
    }

    #[test]
    fn small_row_groups_are_not_split_below_a_batch() {
        let split = split_for(units(&[10_000]), 4, 8192);
        assert_eq!(covered(&split), vec![(0, 0..8192), (0, 8192..10_000)]);
    }

    #[test]
    fn enough_row_groups_are_dealt_whole_by_rows() {
        let split = split_for(units(&[100, 100, 100, 700]), 2, 10);
        assert_eq!(split.len(), 4);
        let dealt = deal(split, 2);
        let rows: Vec<usize> = dealt
            .iter()
            .map(|p| p.iter().map(|u| u.rows.len()).sum())
            .collect();
        assert_eq!(rows, vec![300, 700]);
        // Every row group exactly once, in order.
        let all: Vec<usize> = dealt.iter().flatten().map(|u| u.row_group).collect();
        assert_eq!(all, vec![0, 1, 2, 3]);
    }
}
