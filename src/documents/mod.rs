//! Documents as text, for `read_document` ([`crate::blob`]): a PDF a row per page (its text
//! layer, as pdfium reads it: `pdfium.rs`), and a row for each Word document (`docx.rs`), web
//! page (`html.rs`), Markdown or plain text file.
//!
//! What a file is comes from its content (`%PDF-`, a ZIP archive), then from its name (`.html`,
//! `.htm`, `.xhtml`); any other UTF-8 file is text, read as it is ([`kind`]). PDFs are read by
//! worker processes (`worker.rs`), so that pdfium failing on one fails that file alone. A file
//! that cannot be read as the document it is (damaged, encrypted, not a document at all) is that
//! file's [`Unreadable`], never the statement's: `read_document` gives it a row with the reason.

mod docx;
mod html;
mod pdfium;
pub mod worker;

/// The most pages a PDF may declare: a file that says it has more is refused, not read.
pub const MOST_PAGES: usize = 100_000;

/// The most text a document may have (and a Word document's body unpack to), in bytes: a
/// record batch holds one such document.
pub const MOST_TEXT: usize = 256 << 20;

/// One page of a document: the whole of a document that has no pages.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Page {
    pub text: String,
    /// Whether the page has a text layer: false for a PDF page that is a scanned image alone
    /// (its text is empty; OCR would read it).
    pub has_text: bool,
    /// Why the page could not be read (damaged), where it could not: the document's other
    /// pages are read.
    pub error: Option<Unreadable>,
}

impl Page {
    /// A page of `text`.
    pub fn of(text: String) -> Self {
        Page {
            text,
            has_text: true,
            error: None,
        }
    }
}

/// What a document is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Pdf,
    Docx,
    Html,
    Text,
}

/// Why a file cannot be read as a document: the file's own error.
#[derive(Debug, Clone, PartialEq, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub enum Unreadable {
    #[error("the PDF is encrypted: it needs a password, which read_document does not take")]
    Encrypted,
    #[error("{0}")]
    Damaged(String),
    #[error("page {page} of the PDF cannot be read (damaged); its other pages are read")]
    Page { page: usize },
    #[error("the PDF says it has {pages} pages, more than the {most} a document may have")]
    TooManyPages { pages: usize, most: usize },
    #[error("a ZIP archive without word/document.xml is not a Word document (DOCX)")]
    NotDocx,
    #[error("it is named .{extension} but is not {what}: {begins}")]
    Misnamed {
        extension: String,
        what: String,
        begins: String,
    },
    #[error(
        "it is not UTF-8 text (byte {at} is not): read_document reads PDF, DOCX, HTML, Markdown \
         and UTF-8 text; read it with read_blob"
    )]
    NotUtf8 { at: usize },
    #[error("its XML is malformed: {0}")]
    BadXml(String),
    #[error("its text is more than {} MiB, the most a document may have", most >> 20)]
    TooLarge { most: usize },
    #[error(
        "not a document read_document reads (PDF, DOCX, HTML, Markdown or UTF-8 text): it begins \
         with bytes {0}; read it with read_blob"
    )]
    NotADocument(String),
}

/// Names of files that are text, whatever they begin with.
const TEXT_NAMES: &[&str] = &[
    "txt", "md", "markdown", "rst", "html", "htm", "xhtml", "csv", "json",
];

/// What the file `name` with content `bytes` is, or why it is no document: a PDF begins with
/// `%PDF-` (or has it in its first KiB, as readers allow, unless its name says it is text), a
/// DOCX is a ZIP archive; a file named `.pdf` or `.docx` must be one.
pub fn kind(name: &str, bytes: &[u8]) -> Result<Kind, Unreadable> {
    let extension = name
        .rsplit('/')
        .next()
        .and_then(|file| file.rsplit_once('.'))
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    let text_named = TEXT_NAMES.contains(&extension.as_str());
    let head = &bytes[..bytes.len().min(1024)];
    let trimmed = head
        .strip_prefix(b"\xef\xbb\xbf")
        .unwrap_or(head)
        .trim_ascii_start();
    if trimmed.starts_with(b"%PDF-") || (!text_named && head.windows(5).any(|w| w == b"%PDF-")) {
        return Ok(Kind::Pdf);
    }
    if bytes.starts_with(b"PK\x03\x04") && !text_named {
        return Ok(Kind::Docx);
    }
    let misnamed = |what: &str| Unreadable::Misnamed {
        extension: extension.clone(),
        what: what.to_string(),
        begins: if bytes.is_empty() {
            "it is empty".to_string()
        } else {
            format!("it begins with bytes {}", begins(bytes))
        },
    };
    match extension.as_str() {
        "pdf" => return Err(misnamed("a PDF")),
        "docx" => return Err(misnamed("a Word document (a ZIP archive)")),
        _ => {}
    }
    let text = match std::str::from_utf8(bytes) {
        Ok(text) => text,
        // Text that goes wrong after its first bytes: where it does.
        Err(e) if e.valid_up_to() >= 8 || text_named => {
            return Err(Unreadable::NotUtf8 {
                at: e.valid_up_to(),
            });
        }
        Err(_) => return Err(Unreadable::NotADocument(begins(bytes))),
    };
    let start = text
        .trim_start_matches('\u{feff}')
        .trim_start()
        .get(..14)
        .unwrap_or_default()
        .to_ascii_lowercase();
    if matches!(extension.as_str(), "html" | "htm" | "xhtml")
        || start.starts_with("<!doctype html")
        || start.starts_with("<html")
    {
        return Ok(Kind::Html);
    }
    Ok(Kind::Text)
}

/// The pages of the document `name` whose content is `bytes`: `Ok(Err(..))` where the file
/// cannot be read as one, `Err` where pdfium, which reads PDFs, cannot be loaded.
pub fn pages(name: &str, bytes: &[u8]) -> crate::error::Result<Result<Vec<Page>, Unreadable>> {
    let whole = |text: String| vec![Page::of(text)];
    Ok(match kind(name, bytes) {
        Err(e) => Err(e),
        Ok(Kind::Pdf) => worker::pages(bytes, MOST_PAGES, MOST_TEXT)?,
        Ok(Kind::Docx) => docx::text(bytes, MOST_TEXT).map(whole),
        Ok(_) if bytes.len() > MOST_TEXT => Err(Unreadable::TooLarge { most: MOST_TEXT }),
        Ok(Kind::Html) => Ok(whole(html::text(utf8(bytes)))),
        Ok(Kind::Text) => Ok(whole(
            utf8(bytes).trim_start_matches('\u{feff}').to_string(),
        )),
    })
}

/// `bytes`, which [`kind`] found are UTF-8.
fn utf8(bytes: &[u8]) -> &str {
    std::str::from_utf8(bytes).unwrap_or_default()
}

/// The first bytes of a file, shown.
fn begins(bytes: &[u8]) -> String {
    bytes[..bytes.len().min(8)]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_what_its_content_says_then_its_name() {
        assert_eq!(kind("a.bin", b"junk %PDF-1.7").unwrap(), Kind::Pdf);
        assert_eq!(kind("a.txt", b"%PDF-1.7").unwrap(), Kind::Pdf);
        assert_eq!(kind("notes.md", b"see %PDF-1.7").unwrap(), Kind::Text);
        assert_eq!(kind("a.zip", b"PK\x03\x04rest").unwrap(), Kind::Docx);
        assert_eq!(kind("a.txt", b"PK\x03\x04rest").unwrap(), Kind::Text);
        let empty = kind("dir.d/empty.pdf", b"").unwrap_err().to_string();
        assert!(
            empty.contains(".pdf but is not a PDF: it is empty"),
            "{empty}"
        );
        let late = kind("a.md", b"# Title\n\xff").unwrap_err().to_string();
        assert!(late.contains("byte 8 is not"), "{late}");
        assert_eq!(kind("a.md", b"# Title\n").unwrap(), Kind::Text);
        assert_eq!(kind("page.HTM", b"<p>x").unwrap(), Kind::Html);
        assert_eq!(kind("page", b"\n <!DOCTYPE html><p>x").unwrap(), Kind::Html);
        let err = kind("a.bin", b"\xff\xd8\xff\xe0rest").unwrap_err();
        assert!(err.to_string().contains("ff d8 ff e0"), "{err}");
    }

    #[test]
    fn a_zip_bomb_is_refused_at_the_limit() {
        use std::io::Write;
        let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        zip.start_file("word/document.xml", options).unwrap();
        let chunk = vec![b' '; 1 << 20];
        for _ in 0..8 {
            zip.write_all(&chunk).unwrap();
        }
        let bytes = zip.finish().unwrap().into_inner();
        let err = docx::text(&bytes, 4 << 20).unwrap_err();
        assert!(matches!(err, Unreadable::TooLarge { .. }), "{err}");
    }
}
