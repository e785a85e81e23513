//! pdfium, the PDF library of Chromium, as `pypdfium2==5.15.2` ships it on PyPI: fetched once
//! into the cache as ONNX Runtime is (the wheel and the library each pinned by sha256), and
//! loaded a few times over.
//!
//! pdfium keeps its state in globals and may be called by one thread at a time. So that every
//! core reads PDFs, the library is loaded once per core, each load a copy of the checked file
//! under a name of its own (`dlopen` gives a path it has not seen a new copy of the library,
//! with globals of its own), and a document is read by one copy, locked while it reads; a long
//! document by several at once, each opening it and reading a run of its pages.

use std::ffi::{c_char, c_int, c_ulong, c_ushort, c_void};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use crate::runtime::{Wheel, cached_library};

use super::{Page, Unreadable};

const WHEELS: &[Wheel] = &[
    Wheel {
        package: "pdfium (pypdfium2 5.15.2)",
        folder: "pypdfium2_raw",
        hint: HINT,
        os: "linux",
        arch: "x86_64",
        url: "c8/e5/2e668bc1bc6fe22f9006694b5571a2dd2c9b874d6a21d16ee839c8f7f6ea/pypdfium2-5.15.2-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        sha256: "dc31aea5b0fb9fefc9b537a65f4113980b2c40798445736a7e6565bc85161e37",
        library: "libpdfium.so",
        members: &[(
            "libpdfium.so",
            "c76dc0f7839644bfa7c3e3107a6068df714e339c861bb7d4519907b821d427f9",
        )],
    },
    Wheel {
        package: "pdfium (pypdfium2 5.15.2)",
        folder: "pypdfium2_raw",
        hint: HINT,
        os: "linux",
        arch: "aarch64",
        url: "03/1f/7a18e64c50049dce8512239bcdb9f8469d0a0c352dd42ae85b6b01d143f8/pypdfium2-5.15.2-py3-none-manylinux_2_17_aarch64.manylinux2014_aarch64.whl",
        sha256: "dd46e93c0c3a73f6cea8489baff6d77a5d0759dd53fbbce0aeb49c91830176fc",
        library: "libpdfium.so",
        members: &[(
            "libpdfium.so",
            "4378615ad9710397c96c112611be9018629bbfe38805d91a2663a534b99c28ca",
        )],
    },
    Wheel {
        package: "pdfium (pypdfium2 5.15.2)",
        folder: "pypdfium2_raw",
        hint: HINT,
        os: "macos",
        arch: "aarch64",
        url: "e7/bb/bf88a781a53c905022b25b2d1fb742c908f86b8076403471f626cc41a508/pypdfium2-5.15.2-py3-none-macosx_13_0_arm64.whl",
        sha256: "e71fe832e94421ac3c28d6a6ed4a9e61f22417089652d339f391c4ffc2a44c35",
        library: "libpdfium.dylib",
        members: &[(
            "libpdfium.dylib",
            "5574cd4164a1317bc6b2f3168a4f433ca84561aa1b33f570422ce20f199d3765",
        )],
    },
];

const HINT: &str = "read_document fetches pdfium from PyPI once; where this machine cannot reach \
                    files.pythonhosted.org, copy the cache folder pdfium-5.15.2 (under \
                    BATCHINFER_CACHE_DIR, else ~/.cache/batchinfer) from a machine that did";

const FOLDER: &str = "pdfium-5.15.2";

/// The copies of the library loaded at most: one per core, up to this.
const MOST_COPIES: usize = 16;

// pdfium's error codes (fpdfview.h).
const FPDF_ERR_FILE: c_ulong = 2;
const FPDF_ERR_FORMAT: c_ulong = 3;
const FPDF_ERR_PASSWORD: c_ulong = 4;
const FPDF_ERR_SECURITY: c_ulong = 5;
const FPDF_ERR_PAGE: c_ulong = 6;

type Handle = *mut c_void;

/// The functions of one loaded copy of the library.
struct Functions {
    load_document: unsafe extern "C" fn(*const c_void, usize, *const c_char) -> Handle,
    last_error: unsafe extern "C" fn() -> c_ulong,
    page_count: unsafe extern "C" fn(Handle) -> c_int,
    load_page: unsafe extern "C" fn(Handle, c_int) -> Handle,
    close_page: unsafe extern "C" fn(Handle),
    close_document: unsafe extern "C" fn(Handle),
    load_text: unsafe extern "C" fn(Handle) -> Handle,
    close_text: unsafe extern "C" fn(Handle),
    count_chars: unsafe extern "C" fn(Handle) -> c_int,
    text_index: unsafe extern "C" fn(Handle, c_int) -> c_int,
    get_text: unsafe extern "C" fn(Handle, c_int, c_int, *mut c_ushort) -> c_int,
}

/// One loaded copy, kept for the life of the process; its lock is held while a document is read.
struct Copy {
    functions: Mutex<Functions>,
}

/// The copies loaded, and which to try first.
pub(super) struct Pdfium {
    copies: Vec<Copy>,
    next: AtomicUsize,
}

/// Per process: pdfium's libraries are loaded once, and never unloaded. A failed load keeps
/// nothing, so that the next statement tries again.
static LOADED: Mutex<Option<Arc<Pdfium>>> = Mutex::new(None);

/// The library, loaded (fetched the first time).
pub(super) fn pdfium() -> crate::error::Result<Arc<Pdfium>> {
    let mut loaded = LOADED.lock();
    if let Some(pdfium) = loaded.as_ref() {
        return Ok(pdfium.clone());
    }
    let pdfium = Arc::new(load()?);
    *loaded = Some(pdfium.clone());
    Ok(pdfium)
}

/// The wheel of this machine's system and processor.
fn wheel() -> crate::error::Result<&'static Wheel> {
    let (os, arch) = (std::env::consts::OS, std::env::consts::ARCH);
    WHEELS
        .iter()
        .find(|w| w.os == os && w.arch == arch)
        .ok_or_else(|| {
            crate::error::Error::Library(format!(
                "pdfium: batchinfer has no pinned pdfium for {os}/{arch}, so read_document \
                 cannot read PDFs here (DOCX, HTML, Markdown and text it reads)"
            ))
        })
}

/// The pinned library, fetched the first time and checked.
pub(super) fn library() -> crate::error::Result<PathBuf> {
    cached_library(wheel()?, &[], FOLDER)
}

fn load() -> crate::error::Result<Pdfium> {
    let failed = |why: String| crate::error::Error::Library(format!("pdfium: {why}"));
    let wheel = wheel()?;
    let library = cached_library(wheel, &[], FOLDER)?;
    let pinned = wheel.members[0].1;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // Each copy checked and loaded on a thread of its own: the start costs one check.
    let loaded: Vec<Result<Functions, String>> = std::thread::scope(|scope| {
        let loads: Vec<_> = (0..cores.clamp(1, MOST_COPIES))
            .map(|i| {
                let library = &library;
                scope.spawn(move || {
                    let path = copy_of(library, i, pinned).map_err(|e| e.to_string())?;
                    open(&path)
                })
            })
            .collect();
        loads
            .into_iter()
            .map(|load| {
                load.join()
                    .unwrap_or_else(|_| Err("loading a copy of it panicked".to_string()))
            })
            .collect()
    });
    let mut copies = Vec::new();
    for functions in loaded {
        copies.push(Copy {
            functions: Mutex::new(functions.map_err(failed)?),
        });
    }
    Ok(Pdfium {
        copies,
        next: AtomicUsize::new(0),
    })
}

/// The `i`th copy of the checked `library`, beside it: made (through a temporary name and a
/// rename) where it is not there or not the pinned file.
fn copy_of(library: &Path, i: usize, pinned: &str) -> std::io::Result<PathBuf> {
    if i == 0 {
        return Ok(library.to_path_buf());
    }
    let name = library
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let copy = library.with_file_name(format!("copy-{i}-{name}"));
    let digest = |path: &Path| -> std::io::Result<String> {
        Ok(hex::encode(Sha256::digest(std::fs::read(path)?)))
    };
    if digest(&copy).ok().as_deref() == Some(pinned) {
        return Ok(copy);
    }
    let tmp = library.with_file_name(format!(".partial-{}-{i}-{name}", std::process::id()));
    std::fs::copy(library, &tmp)?;
    std::fs::rename(&tmp, &copy)?;
    if digest(&copy)? != pinned {
        return Err(std::io::Error::other(format!(
            "{} is not the pinned library after it was copied",
            copy.display()
        )));
    }
    Ok(copy)
}

/// Loads the library at `path` and initializes it.
fn open(path: &Path) -> Result<Functions, String> {
    // SAFETY: the file is the pinned pdfium (checked above), whose initializers are safe to run.
    let library = unsafe { libloading::Library::new(path) }
        .map_err(|e| format!("{} cannot be loaded: {e}", path.display()))?;
    macro_rules! function {
        ($name:literal) => {
            // SAFETY: the symbol has the signature of pdfium's public header (fpdfview.h,
            // fpdf_text.h) that the field it is stored in declares.
            *unsafe { library.get(concat!($name, "\0").as_bytes()) }
                .map_err(|e| format!("{} has no {}: {e}", path.display(), $name))?
        };
    }
    let init: unsafe extern "C" fn() = function!("FPDF_InitLibrary");
    let functions = Functions {
        load_document: function!("FPDF_LoadMemDocument64"),
        last_error: function!("FPDF_GetLastError"),
        page_count: function!("FPDF_GetPageCount"),
        load_page: function!("FPDF_LoadPage"),
        close_page: function!("FPDF_ClosePage"),
        close_document: function!("FPDF_CloseDocument"),
        load_text: function!("FPDFText_LoadPage"),
        close_text: function!("FPDFText_ClosePage"),
        count_chars: function!("FPDFText_CountChars"),
        text_index: function!("FPDFText_GetTextIndexFromCharIndex"),
        get_text: function!("FPDFText_GetText"),
    };
    // SAFETY: called once for this copy, before any other of its functions.
    unsafe { init() };
    // The copy stays loaded for the life of the process: its functions are kept.
    std::mem::forget(library);
    Ok(functions)
}

impl Pdfium {
    /// The library at `path` (checked by the program that named it), loaded once: a worker's.
    pub(super) fn open_one(path: &Path) -> Result<Pdfium, String> {
        Ok(Pdfium {
            copies: vec![Copy {
                functions: Mutex::new(open(path)?),
            }],
            next: AtomicUsize::new(0),
        })
    }

    /// How many pages the PDF `bytes` has, and the text of those of `run` (cut to them).
    pub(super) fn run(
        &self,
        bytes: &[u8],
        run: std::ops::Range<usize>,
        most_pages: usize,
        most_text: usize,
    ) -> Result<(usize, Vec<Page>), Unreadable> {
        let copy = self.copy();
        let document = Document::open(&copy, bytes)?;
        let count = document.pages();
        if count > most_pages {
            return Err(Unreadable::TooManyPages {
                pages: count,
                most: most_pages,
            });
        }
        let run = run.start.min(count)..run.end.min(count);
        Ok((count, document.read(run, most_text)?))
    }

    /// The first copy of the library free, or (all busy) the next in turn, once it is.
    fn copy(&self) -> parking_lot::MutexGuard<'_, Functions> {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let n = self.copies.len();
        (0..n)
            .find_map(|k| self.copies[(start + k) % n].functions.try_lock())
            .unwrap_or_else(|| self.copies[start % n].functions.lock())
    }

    /// The text of each page of the PDF `bytes`, in pdfium's reading order. A document of more
    /// than [`RUN`] pages is read in runs of pages by as many copies as are free (each opens
    /// it), so that a long document is read on every core.
    pub(super) fn pages(
        &self,
        bytes: &[u8],
        most_pages: usize,
        most_text: usize,
    ) -> Result<Vec<Page>, Unreadable> {
        let first = self.copy();
        let document = Document::open(&first, bytes)?;
        let count = document.pages();
        if count > most_pages {
            return Err(Unreadable::TooManyPages {
                pages: count,
                most: most_pages,
            });
        }
        // Copies free now help, each a run of pages; none is waited for (a copy another
        // document holds may wait for this one's).
        let wanted = count.div_ceil(RUN).min(self.copies.len()).saturating_sub(1);
        let helpers: Vec<parking_lot::MutexGuard<'_, Functions>> = self
            .copies
            .iter()
            .filter_map(|copy| copy.functions.try_lock())
            .take(wanted)
            .collect();
        if helpers.is_empty() {
            return document.read(0..count, most_text);
        }
        // Runs of pages as even as they can be, the first read by the copy at hand.
        let runs = helpers.len() + 1;
        let run = |k: usize| (count * k / runs)..(count * (k + 1) / runs);
        let parts: Vec<Result<Vec<Page>, Unreadable>> = std::thread::scope(|scope| {
            let others: Vec<_> = helpers
                .iter()
                .enumerate()
                .map(|(k, helper)| {
                    let f: &Functions = helper;
                    scope.spawn(move || Document::open(f, bytes)?.read(run(k + 1), most_text))
                })
                .collect();
            let mut parts = vec![document.read(run(0), most_text)];
            parts.extend(others.into_iter().map(|other| {
                other
                    .join()
                    .unwrap_or_else(|_| Err(Unreadable::Damaged("pdfium failed reading it".into())))
            }));
            parts
        });
        let mut pages = Vec::with_capacity(count);
        let mut total = 0usize;
        for part in parts {
            let part = part?;
            total += part.iter().map(|p| p.text.len()).sum::<usize>();
            if total > most_text {
                return Err(Unreadable::TooLarge { most: most_text });
            }
            pages.extend(part);
        }
        Ok(pages)
    }
}

/// The pages a copy of the library reads of a document, at the least, where others are free.
const RUN: usize = 32;

/// A pdfium handle closed when it goes.
struct Closed<'a>(Handle, &'a unsafe extern "C" fn(Handle));

impl Drop for Closed<'_> {
    fn drop(&mut self) {
        // SAFETY: the handle was returned by the copy whose close function this is, and is
        // closed once.
        unsafe { (self.1)(self.0) }
    }
}

/// A PDF opened by one copy of the library (whose lock is held while it is).
struct Document<'a> {
    f: &'a Functions,
    handle: Closed<'a>,
}

impl<'a> Document<'a> {
    /// The PDF `bytes` opened by the copy `f`, or why it cannot be.
    fn open(f: &'a Functions, bytes: &'a [u8]) -> Result<Self, Unreadable> {
        // SAFETY: `bytes` outlives the document, closed when it goes (before the borrow ends);
        // no password.
        let document =
            unsafe { (f.load_document)(bytes.as_ptr().cast(), bytes.len(), std::ptr::null()) };
        if document.is_null() {
            // SAFETY: no argument; reads the error of the call above, on this thread.
            return Err(match unsafe { (f.last_error)() } {
                FPDF_ERR_PASSWORD => Unreadable::Encrypted,
                FPDF_ERR_SECURITY => {
                    Unreadable::Damaged("its security handler is not supported".into())
                }
                FPDF_ERR_FORMAT | FPDF_ERR_FILE => {
                    Unreadable::Damaged("it is damaged or not a PDF".into())
                }
                FPDF_ERR_PAGE => Unreadable::Damaged("its pages cannot be found".into()),
                _ => Unreadable::Damaged("pdfium cannot open it".into()),
            });
        }
        Ok(Document {
            f,
            handle: Closed(document, &f.close_document),
        })
    }

    /// The pages it says it has.
    fn pages(&self) -> usize {
        // SAFETY: a document handle of this copy.
        let count = unsafe { (self.f.page_count)(self.handle.0) };
        usize::try_from(count).unwrap_or(0)
    }

    /// The text of the pages `range` (below [`Document::pages`]), at most `most_text` bytes.
    fn read(
        &self,
        range: std::ops::Range<usize>,
        most_text: usize,
    ) -> Result<Vec<Page>, Unreadable> {
        let f = self.f;
        let mut pages = Vec::with_capacity(range.len().min(4096));
        // The text so far, in bytes: more than `most_text` and the document is refused.
        let mut total = 0usize;
        for index in range {
            // SAFETY: a document handle of this copy and a page index below its count.
            let page = unsafe { (f.load_page)(self.handle.0, index as c_int) };
            let damaged = || Page {
                text: String::new(),
                has_text: false,
                error: Some(Unreadable::Page { page: index + 1 }),
            };
            if page.is_null() {
                pages.push(damaged());
                continue;
            }
            let page = Closed(page, &f.close_page);
            // SAFETY: a page handle of this copy.
            let text = unsafe { (f.load_text)(page.0) };
            if text.is_null() {
                pages.push(damaged());
                continue;
            }
            let text = Closed(text, &f.close_text);
            let page = page_text(f, text.0, most_text - total)
                .ok_or(Unreadable::TooLarge { most: most_text })?;
            total += page.text.len();
            if total > most_text {
                return Err(Unreadable::TooLarge { most: most_text });
            }
            pages.push(page);
        }
        Ok(pages)
    }
}

/// The text of a page's text handle, as pypdfium2's `get_text_range()` reads it: the chars from
/// the first to the last pdfium gives text for, as UTF-16 (an unpaired surrogate left out);
/// None where it has more than `most` chars.
fn page_text(f: &Functions, text: Handle, most: usize) -> Option<Page> {
    // SAFETY (the calls below): a text handle of this copy, and indices below its count.
    let chars = unsafe { (f.count_chars)(text) };
    if chars <= 0 {
        return Some(Page {
            text: String::new(),
            has_text: false,
            error: None,
        });
    }
    if usize::try_from(chars).unwrap_or(usize::MAX) > most {
        return None;
    }
    let index_of = |c: c_int| unsafe { (f.text_index)(text, c) };
    let Some(first) = (0..chars).find(|&c| index_of(c) != -1) else {
        return Some(Page::of(String::new()));
    };
    let last = (first..chars)
        .rev()
        .find(|&c| index_of(c) != -1)
        .unwrap_or(first);
    let (t_first, t_last) = (index_of(first), index_of(last));
    // pdfium asks for room for `count` chars and the terminator; pypdfium2 for the text range's
    // (chars pdfium inserts, such as line ends, make it longer): the larger of the two.
    let count = last - first + 1;
    let room = usize::try_from((t_last - t_first + 2).max(count + 1)).unwrap_or(1);
    let mut buffer = vec![0u16; room];
    // SAFETY: the buffer has the room pdfium's header asks for, and more.
    let written = unsafe { (f.get_text)(text, first, count, buffer.as_mut_ptr()) };
    let written = usize::try_from(written).unwrap_or(0).min(room);
    let units = &buffer[..written.saturating_sub(1)];
    Some(Page::of(
        char::decode_utf16(units.iter().copied())
            .filter_map(Result::ok)
            .collect(),
    ))
}
