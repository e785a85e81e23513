//! pdfium, the PDF library of Chromium, as `pypdfium2==5.15.2` ships it on PyPI: fetched once
//! into the cache as ONNX Runtime is (the wheel and the library each pinned by sha256), and
//! loaded once per process.
//!
//! pdfium keeps its state in globals and may be called by one thread at a time: a document is
//! read with the library locked. Every core reads PDFs through worker processes, each loading
//! it once (`worker.rs`); a program that starts none reads them here, one at a time.

use std::ffi::{c_char, c_int, c_ulong, c_ushort, c_void};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

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

// pdfium's error codes (fpdfview.h).
const FPDF_ERR_FILE: c_ulong = 2;
const FPDF_ERR_FORMAT: c_ulong = 3;
const FPDF_ERR_PASSWORD: c_ulong = 4;
const FPDF_ERR_SECURITY: c_ulong = 5;
const FPDF_ERR_PAGE: c_ulong = 6;

type Handle = *mut c_void;

/// The functions of the loaded library.
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

/// The library loaded, locked while a document is read.
pub(super) struct Pdfium {
    functions: Mutex<Functions>,
}

/// Per process: pdfium is loaded once, and never unloaded. A failed load keeps nothing, so
/// that the next statement tries again.
static LOADED: Mutex<Option<Arc<Pdfium>>> = Mutex::new(None);

/// The library, loaded (fetched and checked the first time).
pub(super) fn pdfium() -> crate::error::Result<Arc<Pdfium>> {
    let mut loaded = LOADED.lock();
    if let Some(pdfium) = loaded.as_ref() {
        return Ok(pdfium.clone());
    }
    let pdfium = Arc::new(
        Pdfium::open(&library()?)
            .map_err(|why| crate::error::Error::Library(format!("pdfium: {why}")))?,
    );
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
    // SAFETY: called once, before any other of its functions.
    unsafe { init() };
    // The library stays loaded for the life of the process: its functions are kept.
    std::mem::forget(library);
    Ok(functions)
}

impl Pdfium {
    /// The library at `path` (checked), loaded.
    pub(super) fn open(path: &Path) -> Result<Pdfium, String> {
        Ok(Pdfium {
            functions: Mutex::new(open(path)?),
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
        let functions = self.functions.lock();
        let document = Document::open(&functions, bytes)?;
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
}

/// A pdfium handle closed when it goes.
struct Closed<'a>(Handle, &'a unsafe extern "C" fn(Handle));

impl Drop for Closed<'_> {
    fn drop(&mut self) {
        // SAFETY: the handle was returned by the library whose close function this is, and is
        // closed once.
        unsafe { (self.1)(self.0) }
    }
}

/// A PDF opened by the library (whose lock is held while it is).
struct Document<'a> {
    f: &'a Functions,
    handle: Closed<'a>,
}

impl<'a> Document<'a> {
    /// The PDF `bytes` opened by the library `f`, or why it cannot be.
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
        // SAFETY: a document handle of this library.
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
            // SAFETY: a document handle of this library and a page index below its count.
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
            // SAFETY: a page handle of this library.
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
    // SAFETY (the calls below): a text handle of this library, and indices below its count.
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
