//! Documents as text, for `read_document` ([`crate::blob`]): a PDF a row per page (its text
//! layer, as pdfium reads it: `pdfium.rs`), and a row for each Word document (`docx.rs`), web
//! page (`html.rs`), Markdown or plain text file.
//!
//! What a file is comes from its content (`%PDF-`, a ZIP archive), then from its name (`.html`,
//! `.htm`, `.xhtml`); any other UTF-8 file is text, read as it is. A file that cannot be read as
//! the document it is (damaged, encrypted, not a document at all) is that file's
//! [`Unreadable`], never the statement's: `read_document` gives it a row with the reason.

mod docx;
mod html;
mod pdfium;

/// The most pages a PDF may declare: a file that says it has more is refused, not read.
pub const MOST_PAGES: usize = 100_000;

/// The most text a document may have (and a Word document's body unpack to), in bytes: a
/// record batch holds one such document.
pub const MOST_TEXT: usize = 256 << 20;

/// One page of a document: the whole of a document that has no pages.
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    pub text: String,
    /// Whether the page has a text layer: false for a PDF page that is a scanned image alone
    /// (its text is empty; OCR would read it).
    pub has_text: bool,
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
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Unreadable {
    #[error("the PDF is encrypted: it needs a password, which read_document does not take")]
    Encrypted,
    #[error("{0}")]
    Damaged(String),
    #[error("page {page} of the PDF cannot be read (damaged)")]
    Page { page: usize },
    #[error("the PDF says it has {pages} pages, more than the {most} a document may have")]
    TooManyPages { pages: usize, most: usize },
    #[error("a ZIP archive without word/document.xml is not a Word document (DOCX)")]
    NotDocx,
    #[error("its XML is malformed: {0}")]
    BadXml(String),
    #[error("its text is more than {most} bytes, the most a document may have (unpacked)")]
    TooLarge { most: usize },
    #[error(
        "not a document read_document reads (PDF, DOCX, HTML, Markdown or UTF-8 text): it begins \
         with bytes {0}; read it with read_blob"
    )]
    NotADocument(String),
}

/// What the file `name` with content `bytes` is, or why it is no document.
pub fn kind(name: &str, bytes: &[u8]) -> Result<Kind, Unreadable> {
    let head = &bytes[..bytes.len().min(1024)];
    if head.windows(5).any(|w| w == b"%PDF-") {
        return Ok(Kind::Pdf);
    }
    if bytes.starts_with(b"PK\x03\x04") {
        return Ok(Kind::Docx);
    }
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Err(Unreadable::NotADocument(begins(bytes)));
    };
    let extension = name
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
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
    let whole = |text: String| {
        vec![Page {
            text,
            has_text: true,
        }]
    };
    Ok(match kind(name, bytes) {
        Err(e) => Err(e),
        Ok(Kind::Pdf) => pdfium::pdfium()?.pages(bytes, MOST_PAGES, MOST_TEXT),
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
        assert_eq!(kind("a.txt", b"junk %PDF-1.7").unwrap(), Kind::Pdf);
        assert_eq!(kind("a.pdf", b"PK\x03\x04rest").unwrap(), Kind::Docx);
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
