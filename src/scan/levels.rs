//! The repetition and definition levels of full lists, checked where they lie in each page and
//! cut off, so that the values read as those of a flat column.

use std::ops::Range;

use datafusion::parquet::basic::{Encoding, PageType};
use datafusion::parquet::column::page::{Page, PageMetadata, PageReader};
use datafusion::parquet::errors::{ParquetError, Result as ParquetResult};

/// The pages of a list leaf as the pages of a flat column of its values, for lists that are all
/// full (`size` values, no NULLs): each data page's repetition and definition levels are checked
/// where they lie, run by run, without decoding them into memory, and cut off. A page that breaks
/// the promise is an error (the footer's statistics said there were no NULLs).
pub(super) struct FullListPages<R: PageReader> {
    pub(super) inner: R,
    pub(super) size: usize,
    pub(super) max_def: i16,
    pub(super) def_width: u8,
    /// Levels of the column chunk before the next page (lists need not start on a page).
    pub(super) position: usize,
    /// For each offset into a list, the 8 repetition levels from there as one bit-packed byte.
    pub(super) expected: Vec<u8>,
}

impl<R: PageReader> FullListPages<R> {
    pub(super) fn new(inner: R, size: usize, max_def: i16) -> Self {
        let expected = (0..size)
            .map(|offset| {
                (0..8).fold(0u8, |byte, bit| {
                    byte | (u8::from((offset + bit) % size != 0) << bit)
                })
            })
            .collect();
        Self {
            inner,
            size,
            max_def,
            def_width: (16 - (max_def as u16).leading_zeros()) as u8,
            position: 0,
            expected,
        }
    }

    fn broken(&self) -> ParquetError {
        ParquetError::General(format!(
            "a list column has NULL or short lists although the file's statistics count no \
             NULLs (expected lists of {} values); read it with SET batchinfer.streaming_scan = \
             false",
            self.size
        ))
    }

    /// Whether `reps` (bit width 1) are those of full lists for `n` levels from `self.position`.
    fn full_reps(&self, reps: &[u8], n: usize) -> bool {
        let size = self.size;
        let start = self.position;
        hybrid_runs(
            reps,
            n,
            1,
            |at, count, value| {
                let offset = (start + at) % size;
                match value {
                    0 => (offset == 0 && count == 1) || size == 1,
                    1 => offset != 0 && offset + count <= size,
                    _ => false,
                }
            },
            |at, bytes, count| {
                bytes.iter().enumerate().all(|(j, &byte)| {
                    let bits = (count - 8 * j).min(8);
                    let mask = ((1u16 << bits) - 1) as u8;
                    (byte ^ self.expected[(start + at + 8 * j) % size]) & mask == 0
                })
            },
        )
    }

    /// Whether `defs` are all the maximum definition level, for `n` levels.
    fn full_defs(&self, defs: &[u8], n: usize) -> bool {
        let (max, width) = (self.max_def as u64, self.def_width as usize);
        hybrid_runs(
            defs,
            n,
            self.def_width,
            |_, _, value| value == max,
            |_, bytes, count| {
                (0..count).all(|i| {
                    let bit = i * width;
                    let mut value = 0u64;
                    for b in 0..width {
                        let at = bit + b;
                        value |= u64::from((bytes[at / 8] >> (at % 8)) & 1) << b;
                    }
                    value == max
                })
            },
        )
    }

    fn flatten(&mut self, page: Page) -> ParquetResult<Page> {
        let page = match page {
            Page::DataPage {
                buf,
                num_values,
                encoding,
                def_level_encoding,
                rep_level_encoding,
                ..
            } => {
                let n = num_values as usize;
                if def_level_encoding != Encoding::RLE || rep_level_encoding != Encoding::RLE {
                    return Err(self.broken());
                }
                let (reps, after_reps) = length_prefixed(&buf, 0).ok_or_else(|| self.broken())?;
                let (defs, values) =
                    length_prefixed(&buf, after_reps).ok_or_else(|| self.broken())?;
                if !self.full_reps(&buf[reps], n) || !self.full_defs(&buf[defs], n) {
                    return Err(self.broken());
                }
                self.position += n;
                Page::DataPage {
                    buf: buf.slice(values..),
                    num_values,
                    encoding,
                    def_level_encoding: Encoding::RLE,
                    rep_level_encoding: Encoding::RLE,
                    statistics: None,
                }
            }
            Page::DataPageV2 {
                buf,
                num_values,
                encoding,
                num_nulls,
                def_levels_byte_len,
                rep_levels_byte_len,
                is_compressed,
                ..
            } => {
                let n = num_values as usize;
                let reps = rep_levels_byte_len as usize;
                let defs = reps + def_levels_byte_len as usize;
                if num_nulls != 0
                    || defs > buf.len()
                    || !self.full_reps(&buf[..reps], n)
                    || !self.full_defs(&buf[reps..defs], n)
                {
                    return Err(self.broken());
                }
                self.position += n;
                Page::DataPageV2 {
                    buf: buf.slice(defs..),
                    num_values,
                    encoding,
                    num_nulls: 0,
                    num_rows: num_values,
                    def_levels_byte_len: 0,
                    rep_levels_byte_len: 0,
                    is_compressed,
                    statistics: None,
                }
            }
            dictionary => dictionary,
        };
        Ok(page)
    }
}

/// The byte range of a level stream that starts at `at` with its 4-byte length, and where the
/// next part of the page starts.
pub(super) fn length_prefixed(buf: &[u8], at: usize) -> Option<(Range<usize>, usize)> {
    let len = u32::from_le_bytes(buf.get(at..at + 4)?.try_into().ok()?) as usize;
    let end = (at + 4).checked_add(len).filter(|&end| end <= buf.len())?;
    Some((at + 4..end, end))
}

/// Walks the runs of an RLE/bit-packed hybrid stream of `n` values of `width` bits: `run(at,
/// count, value)` for a repeated run, `packed(at, bytes, count)` for bit-packed values (`count`
/// of them in `bytes`, padding excluded); true when the stream holds `n` values and every run
/// passes.
///
/// The `parquet` crate's own `RleDecoder` cannot serve here: it is public only behind the crate's
/// `experimental` feature (an unstable API), and it yields values, not the byte positions of the
/// runs, which are what a page is cut at.
pub(super) fn hybrid_runs(
    data: &[u8],
    n: usize,
    width: u8,
    run: impl Fn(usize, usize, u64) -> bool,
    packed: impl Fn(usize, &[u8], usize) -> bool,
) -> bool {
    let width = width as usize;
    let value_bytes = width.div_ceil(8);
    let (mut at, mut i) = (0usize, 0usize);
    while at < n {
        // ULEB128 header.
        let mut header = 0u64;
        let mut shift = 0;
        loop {
            let Some(&byte) = data.get(i) else {
                return false;
            };
            i += 1;
            header |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                break;
            }
            shift += 7;
            if shift > 56 {
                return false;
            }
        }
        let count = (header >> 1) as usize;
        if count == 0 {
            return false;
        }
        if header & 1 == 1 {
            let values = count * 8;
            let Some(bytes) = data.get(i..i + count * width) else {
                return false;
            };
            i += count * width;
            let used = values.min(n - at);
            if !packed(at, &bytes[..(used * width).div_ceil(8)], used) {
                return false;
            }
            at += used;
        } else {
            let Some(bytes) = data.get(i..i + value_bytes) else {
                return false;
            };
            i += value_bytes;
            let value = bytes
                .iter()
                .rev()
                .fold(0u64, |v, &b| (v << 8) | u64::from(b));
            if at + count > n || !run(at, count, value) {
                return false;
            }
            at += count;
        }
    }
    true
}

impl<R: PageReader> Iterator for FullListPages<R> {
    type Item = ParquetResult<Page>;

    fn next(&mut self) -> Option<Self::Item> {
        self.get_next_page().transpose()
    }
}

impl<R: PageReader> FullListPages<R> {
    /// Passes over data pages that hold no value (writers make them: pyarrow with small pages
    /// and one row per write). The column goes on in the next page, but a column reader that met
    /// an empty page would take it for the end of the column.
    fn skip_empty_pages(&mut self) -> ParquetResult<()> {
        while let Some(m) = self.inner.peek_next_page()?
            && !m.is_dict
            && m.num_levels == Some(0)
        {
            self.inner.skip_next_page()?;
        }
        Ok(())
    }
}

impl<R: PageReader> PageReader for FullListPages<R> {
    fn get_next_page(&mut self) -> ParquetResult<Option<Page>> {
        loop {
            match self.inner.get_next_page()? {
                None => return Ok(None),
                Some(page)
                    if page.page_type() != PageType::DICTIONARY_PAGE && page.num_values() == 0 => {}
                Some(page) => return self.flatten(page).map(Some),
            }
        }
    }

    fn peek_next_page(&mut self) -> ParquetResult<Option<PageMetadata>> {
        self.skip_empty_pages()?;
        // One value per level: as many rows of the flat column as levels.
        Ok(self.inner.peek_next_page()?.map(|m| PageMetadata {
            num_rows: if m.is_dict { m.num_rows } else { m.num_levels },
            ..m
        }))
    }

    fn skip_next_page(&mut self) -> ParquetResult<()> {
        self.skip_empty_pages()?;
        if let Some(m) = self.inner.peek_next_page()?
            && !m.is_dict
        {
            self.position += m.num_levels.ok_or_else(|| self.broken())?;
        }
        self.inner.skip_next_page()
    }

    fn at_record_boundary(&mut self) -> ParquetResult<bool> {
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A page reader with no pages: the level checks need only the lists' shape.
    struct NoPages;

    impl Iterator for NoPages {
        type Item = ParquetResult<Page>;
        fn next(&mut self) -> Option<Self::Item> {
            None
        }
    }

    impl PageReader for NoPages {
        fn get_next_page(&mut self) -> ParquetResult<Option<Page>> {
            Ok(None)
        }
        fn peek_next_page(&mut self) -> ParquetResult<Option<PageMetadata>> {
            Ok(None)
        }
        fn skip_next_page(&mut self) -> ParquetResult<()> {
            Ok(())
        }
    }

    #[test]
    fn repetition_levels_of_full_lists_pass_and_short_lists_do_not() {
        let lists_of_3 = FullListPages::new(NoPages, 3, 1);
        // One bit-packed group (header 3), levels read from the lowest bit.
        // [0,1,1, 0,1,1]: two lists of 3.
        assert!(lists_of_3.full_reps(&[3, 0b0011_0110], 6));
        // [0,1, 0,1,1,1]: a list of 2, then one of 4.
        assert!(!lists_of_3.full_reps(&[3, 0b0011_1010], 6));
        // Repeated runs: 0 once, 1 twice (header count << 1), then a list of 3 as a run of 1s
        // that is one too long.
        assert!(lists_of_3.full_reps(&[2, 0, 4, 1, 2, 0, 4, 1], 6));
        assert!(!lists_of_3.full_reps(&[2, 0, 6, 1, 2, 0, 2, 1], 6));
        // The stream must hold all the levels.
        assert!(!lists_of_3.full_reps(&[2, 0, 4, 1], 6));
        // A page that starts inside a list.
        let mut later = FullListPages::new(NoPages, 3, 1);
        later.position = 1;
        assert!(later.full_reps(&[4, 1, 2, 0, 4, 1], 5));
        assert!(!later.full_reps(&[2, 0, 4, 1], 3));
        // Lists of one value: every level is 0.
        assert!(FullListPages::new(NoPages, 1, 1).full_reps(&[10, 0], 5));
    }

    #[test]
    fn definition_levels_must_all_be_the_maximum() {
        // Nullable list of nullable items: levels up to 3, 2 bits each.
        let pages = FullListPages::new(NoPages, 2, 3);
        assert!(pages.full_defs(&[12, 3], 6));
        assert!(!pages.full_defs(&[12, 2], 6));
        // Bit-packed: four 3s then four 2s, 2 bits each.
        assert!(pages.full_defs(&[3, 0xff, 0xff], 8));
        assert!(!pages.full_defs(&[3, 0xff, 0xaa], 8));
        // Padding past the last level is not looked at.
        assert!(pages.full_defs(&[3, 0xff, 0x00], 4));
    }
}
