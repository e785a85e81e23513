//! A Word document's text: its body's paragraphs in order, those of its tables' cells among
//! them, a line each (what python-docx reads of each paragraph: text, tabs, line breaks).
//! Headers, footers, footnotes, drawings and field codes are left out.

use std::io::Read;

use quick_xml::events::Event;

use super::Unreadable;

/// The part of the package that holds the body.
const BODY: &str = "word/document.xml";

/// Elements whose content is not the body's text: field codes, drawings (their text boxes),
/// the fallback of content given twice, deleted text.
const SKIPPED: &[&[u8]] = &[
    b"instrText",
    b"delText",
    b"drawing",
    b"pict",
    b"object",
    b"Fallback",
];

/// The text of the DOCX `bytes`, whose body may unpack to `most` bytes.
pub(super) fn text(bytes: &[u8], most: usize) -> Result<String, Unreadable> {
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(bytes))
        .map_err(|e| Unreadable::Damaged(zip_error(&e)))?;
    let mut part = archive.by_name(BODY).map_err(|e| match e {
        zip::result::ZipError::FileNotFound => Unreadable::NotDocx,
        e => Unreadable::Damaged(zip_error(&e)),
    })?;
    // Read no more than the limit, whatever the archive claims (a ZIP bomb says little).
    let mut xml = Vec::new();
    (&mut part)
        .take(most as u64 + 1)
        .read_to_end(&mut xml)
        .map_err(|e| Unreadable::Damaged(format!("its {BODY} cannot be unpacked: {e}")))?;
    if xml.len() > most {
        return Err(Unreadable::TooLarge { most });
    }
    body_text(&xml)
}

fn zip_error(e: &zip::result::ZipError) -> String {
    use zip::result::ZipError;
    match e {
        ZipError::UnsupportedArchive(why) if why.contains("assword") => {
            "its parts are encrypted: it needs a password, which read_document does not take"
                .to_string()
        }
        ZipError::InvalidPassword => {
            "its parts are encrypted: it needs a password, which read_document does not take"
                .to_string()
        }
        ZipError::UnsupportedArchive(why) => {
            format!("its ZIP archive uses what read_document does not read ({why})")
        }
        ZipError::CompressionMethodNotSupported(method) => {
            format!(
                "its ZIP archive is compressed by a method read_document does not read ({method})"
            )
        }
        ZipError::Io(e) => format!("its ZIP archive cannot be unpacked ({e})"),
        _ => "it is not a readable ZIP archive: it is damaged or cut short".to_string(),
    }
}

/// The text of a `word/document.xml`.
pub(super) fn body_text(xml: &[u8]) -> Result<String, Unreadable> {
    let mut reader = quick_xml::Reader::from_reader(xml);
    let bad = |e: &dyn std::fmt::Display| Unreadable::BadXml(format!("{BODY}: {e}"));
    let mut buf = Vec::new();
    let mut out = String::new();
    // Paragraphs written, and whether one is open; within a run's text element or not; the
    // depth of a skipped element.
    let (mut paragraphs, mut in_paragraph, mut in_text) = (0usize, 0usize, false);
    let mut skipping = 0usize;
    loop {
        let event = reader.read_event_into(&mut buf).map_err(|e| bad(&e))?;
        match event {
            Event::Eof => break,
            Event::Start(e) => {
                let name = e.local_name();
                let name = name.as_ref();
                if skipping > 0 || SKIPPED.contains(&name) {
                    skipping += 1;
                } else if name == b"p" {
                    if in_paragraph == 0 {
                        if paragraphs > 0 {
                            out.push('\n');
                        }
                        paragraphs += 1;
                    }
                    in_paragraph += 1;
                } else if name == b"t" {
                    in_text = true;
                }
            }
            Event::End(e) => {
                if skipping > 0 {
                    skipping -= 1;
                    continue;
                }
                match e.local_name().as_ref() {
                    b"p" => in_paragraph = in_paragraph.saturating_sub(1),
                    b"t" => in_text = false,
                    _ => {}
                }
            }
            Event::Empty(e) if skipping == 0 && in_paragraph > 0 => {
                match e.local_name().as_ref() {
                    b"tab" | b"ptab" => out.push('\t'),
                    b"cr" => out.push('\n'),
                    b"noBreakHyphen" => out.push('-'),
                    b"br" => {
                        // A page or column break is no line of text.
                        let kind = e
                            .try_get_attribute("w:type")
                            .ok()
                            .flatten()
                            .map(|a| a.value.into_owned());
                        if kind.as_deref().is_none_or(|k| k == b"textWrapping") {
                            out.push('\n');
                        }
                    }
                    _ => {}
                }
            }
            Event::Empty(e) if skipping == 0 && e.local_name().as_ref() == b"p" => {
                if paragraphs > 0 {
                    out.push('\n');
                }
                paragraphs += 1;
            }
            Event::Text(e) if in_text && skipping == 0 => {
                out.push_str(&e.decode().map_err(|e| bad(&e))?);
            }
            Event::CData(e) if in_text && skipping == 0 => {
                out.push_str(&e.decode().map_err(|e| bad(&e))?);
            }
            Event::GeneralRef(e) if in_text && skipping == 0 => {
                if let Some(c) = e.resolve_char_ref().map_err(|e| bad(&e))? {
                    out.push(c);
                } else {
                    let name = e.decode().map_err(|e| bad(&e))?;
                    match quick_xml::escape::resolve_predefined_entity(&name) {
                        Some(s) => out.push_str(s),
                        None => return Err(bad(&format!("an unknown entity &{name};"))),
                    }
                }
            }
            _ => {}
        }
        buf.clear();
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paragraphs_tabs_breaks_and_tables_in_body_order() {
        let xml = br#"<?xml version="1.0"?><w:document xmlns:w="w"><w:body>
            <w:p><w:r><w:t>One</w:t><w:tab/><w:t xml:space="preserve"> &amp; two</w:t></w:r></w:p>
            <w:tbl><w:tr><w:tc><w:p><w:r><w:t>cell</w:t></w:r></w:p></w:tc></w:tr></w:tbl>
            <w:p/>
            <w:p><w:r><w:t>a</w:t><w:br/><w:t>b</w:t><w:br w:type="page"/>
              <w:fldChar/><w:instrText>PAGE</w:instrText><w:t>&#233;</w:t></w:r></w:p>
            </w:body></w:document>"#;
        assert_eq!(body_text(xml).unwrap(), "One\t & two\ncell\n\na\nbé");
    }

    #[test]
    fn malformed_xml_is_the_files_error() {
        let err = body_text(b"<w:document><w:p><w:t>x</w:p>").unwrap_err();
        assert!(matches!(err, Unreadable::BadXml(_)), "{err}");
    }
}
