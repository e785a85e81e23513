//! Where a location points: a path or a URL, read as DataFusion reads it.

use url::Url;

use crate::error::{Error, Result};

/// A location as DataFusion reads one (`ListingTableUrl::parse`), so that batchinfer and
/// DataFusion never disagree on where a path points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// An absolute path, or one that does not parse as a URL (relative to the working directory).
    Path(std::path::PathBuf),
    /// Anything else that parses as a URL, whatever the case of its scheme: `s3://b/k`,
    /// `S3://b/k`, `file:///a/my%20dir/`, `file:/a` (but also `a:b.parquet`, whose scheme is `a`).
    Url(Url),
}

/// Reads `location` as DataFusion does (see [`Location`]).
pub fn parse_location(location: &str) -> Result<Location> {
    if !std::path::Path::new(location).is_absolute() {
        match Url::parse(location) {
            // `file:a.db` is the URL of `/a.db`, which its writer hardly meant (SQLite reads
            // it as `a.db` of the working folder): neither is guessed.
            Ok(url)
                if url.scheme() == "file"
                    && !location[url.scheme().len() + 1..].starts_with('/') =>
            {
                return Err(Error::location(
                    blank_passwords(location),
                    format!(
                        "'{}' is a file: URL without a path from the root, which would name '{}'; \
                     write a path ('{}') or file:///{}",
                        blank_passwords(location),
                        url.path(),
                        &location[5..],
                        url.path().trim_start_matches('/')
                    ),
                ));
            }
            Ok(url) => return Ok(Location::Url(url)),
            Err(url::ParseError::RelativeUrlWithoutBase) => {}
            Err(e) => {
                return Err(Error::location(
                    blank_passwords(location),
                    format!("'{location}' is not a valid URL: {e}"),
                ));
            }
        }
    }
    Ok(Location::Path(location.into()))
}

/// The URL schemes batchinfer has stores for.
const SCHEMES: &str = "local paths and file://, s3://, gs://, az://, abfss:// and https:// URLs";

/// The error for a URL whose scheme batchinfer has no store for.
pub(super) fn no_store_for(url: &Url) -> Error {
    Error::location(
        blank_passwords(url.as_str()),
        format!(
            "'{}' is a URL with the scheme '{}:', which batchinfer has no store for (it reads and \
         writes {SCHEMES}); a local file whose name has a ':' is written with './' before it",
            blank_passwords(url.as_str()),
            url.scheme()
        ),
    )
}

/// Whether `location` names an object store rather than a local file or folder (a URL of
/// another scheme than `file:` counts: its use is then an error naming the scheme).
pub fn is_object_store_url(location: &str) -> bool {
    matches!(parse_location(location), Ok(Location::Url(url)) if url.scheme() != "file")
}

/// The local path `location` names, if it names one: a path as written, or a `file:` URL's path
/// (decoded: `file:///a/my%20dir/` is the folder `my dir`).
pub fn local_path(location: &str) -> Result<Option<std::path::PathBuf>> {
    match parse_location(location)? {
        Location::Path(path) => Ok(Some(path)),
        Location::Url(url) if url.scheme() == "file" => {
            url.to_file_path().map(Some).map_err(|()| {
                Error::location(
                    blank_passwords(location),
                    format!("'{location}' is not a usable local path"),
                )
            })
        }
        Location::Url(_) => Ok(None),
    }
}

/// A location as a URL, as DataFusion reads it (see [`Location`]): a URL as it is, a path made
/// absolute as a `file://` URL.
pub fn location_url(location: &str) -> Result<Url> {
    let path = match parse_location(location)? {
        Location::Url(url) => return Ok(url),
        Location::Path(path) => path,
    };
    let absolute =
        std::path::absolute(&path).map_err(|e| Error::io(format!("resolving {location}"), e))?;
    let mut url = Url::from_file_path(&absolute).map_err(|()| {
        Error::location(
            blank_passwords(location),
            format!("'{location}' is not a usable path"),
        )
    })?;
    if location.ends_with('/') && !url.path().ends_with('/') {
        url.set_path(&format!("{}/", url.path()));
    }
    Ok(url)
}

/// A location that names the same files from any working folder: a URL as it is, a path made
/// absolute (a trailing `/` and glob characters kept).
pub fn absolute_location(location: &str) -> Result<String> {
    match parse_location(location)? {
        Location::Url(_) => Ok(location.to_string()),
        Location::Path(path) => {
            let absolute = std::path::absolute(&path)
                .map_err(|e| Error::io(format!("resolving {location}"), e))?;
            let mut text = absolute.to_string_lossy().into_owned();
            if location.ends_with('/') && !text.ends_with('/') {
                text.push('/');
            }
            Ok(text)
        }
    }
}

/// `url` as a folder: its path ends with `/`, so that what is joined to it goes inside it.
pub fn folder_url(mut url: Url) -> Url {
    if !url.path().ends_with('/') {
        url.set_path(&format!("{}/", url.path()));
    }
    url
}

/// [`location_url`] of a location that names a folder.
pub fn folder_location(location: &str) -> Result<Url> {
    location_url(location).map(folder_url)
}

/// Refuses a write target that is a path with glob characters (`*`, `?`, `[`): DataFusion reads
/// such a path as a pattern and writes into the folder before it, not to the name given. (In a
/// URL they are plain characters, `%2A` and the like.)
pub fn check_write_target(target: &str) -> Result<()> {
    if let Location::Url(_) = parse_location(target)? {
        return check_url_target(target);
    }
    match target.chars().find(|c| matches!(c, '*' | '?' | '[')) {
        Some(c) => Err(Error::location(
            blank_passwords(target),
            format!(
                "'{target}' has the glob character '{c}': a write goes to a file or folder named \
             plainly (DataFusion would read it as a pattern and write beside it)"
            ),
        )),
        None => Ok(()),
    }
}

/// A URL write target is named plainly too: a URL's path is normalized as it is parsed (`a/../b`
/// is `b`, and so is `a/%2e%2e/b`), so a `.` or `..` segment, written or escaped, would write
/// elsewhere than the text says; an escaped `/`, `\`, glob character or control character would
/// make a key no plain name makes. Each is refused, naming the segment.
fn check_url_target(target: &str) -> Result<()> {
    let Some((scheme, after_scheme)) = target.split_once(':') else {
        return Ok(());
    };
    let file = scheme.eq_ignore_ascii_case("file");
    // `file:/a/b` has no authority; `s3://bucket/key` and `file:///a` have one.
    let path = match after_scheme.strip_prefix("//") {
        Some(rest) => rest.split_once('/').map_or("", |(_, path)| path),
        None => after_scheme,
    };
    let path = path.split(['?', '#']).next().unwrap_or("");
    // Escaped, these make an object key no plain name makes (in a local file's name, `#`,
    // `?` and the like are only characters).
    let unplain: &[u8] = if file { b"/" } else { b"/\\*?[#" };
    for segment in path.split('/') {
        let decoded = percent_decoded(segment);
        // The URL parser drops tabs and line breaks, and reads `\` as `/` in file URLs.
        let literal = segment
            .chars()
            .any(|c| c.is_control() || (file && c == '\\'));
        let plain = !literal
            && match decoded.as_slice() {
                b"." | b".." => false,
                bytes => {
                    !(segment.contains('%')
                        && bytes
                            .iter()
                            .any(|b| b.is_ascii_control() || unplain.contains(b)))
                }
            };
        if !plain {
            return Err(Error::location(
                blank_passwords(target),
                format!(
                    "'{}' has the path segment '{}', which names another place than it reads (a \
                 '.' or '..' segment, or an escaped '/', '\\', '*', '?', '[', '#' or control \
                 character): a write target is named plainly",
                    blank_passwords(target),
                    segment.escape_default()
                ),
            ));
        }
    }
    Ok(())
}

/// `text` with its `%XX` escapes decoded (an escape that is not one stays as it is).
fn percent_decoded(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && let (Some(high), Some(low)) = (
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            )
        {
            out.push((high * 16 + low) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    out
}

/// A location as a person (and DataFusion) writes it: a local path for a `file:` URL, the URL
/// otherwise.
pub fn display_location(url: &Url) -> String {
    match url.to_file_path() {
        Ok(path) if url.scheme() == "file" => {
            let mut text = path.display().to_string();
            if url.path().ends_with('/') && !text.ends_with('/') {
                text.push('/');
            }
            text
        }
        _ => url.to_string(),
    }
}

/// Whether a scan reads its files from the local file system (rather than an object store).
pub fn is_local_store(url: &datafusion::execution::object_store::ObjectStoreUrl) -> bool {
    url.as_str() == "file:///"
}

/// The file an object of the local file system's store is.
pub fn local_file(location: &object_store::path::Path) -> Option<std::path::PathBuf> {
    object_store::local::LocalFileSystem::new()
        .path_to_filesystem(location)
        .ok()
}

/// What changes when a file is written again: for a local file its identity and its modification
/// and change times (a rewrite that keeps the size and puts the modification time back still
/// changes the change time, which no one can set); elsewhere its ETag, else when it was written.
pub fn file_version(local: bool, meta: &object_store::ObjectMeta) -> String {
    use std::os::unix::fs::MetadataExt;
    if local
        && let Some(path) = local_file(&meta.location)
        && let Ok(m) = std::fs::metadata(&path)
    {
        return format!(
            "{:x}-{:x}.{:x}-{:x}.{:x}-{:x}",
            m.ino(),
            m.mtime(),
            m.mtime_nsec(),
            m.ctime(),
            m.ctime_nsec(),
            m.len()
        );
    }
    meta.e_tag
        .clone()
        .unwrap_or_else(|| meta.last_modified.timestamp_millis().to_string())
}

/// The path of an object within its bucket.
pub fn object_path(url: &Url) -> Result<object_store::path::Path> {
    if url.query().is_some() || url.fragment().is_some() {
        return Err(Error::location(
            blank_passwords(url.as_str()),
            format!(
                "'{}' has a query or a fragment ('?' or '#'), which no store reads; a file or key \
             with one of these characters is written with it encoded (%3F, %23)",
                blank_passwords(url.as_str())
            ),
        ));
    }
    if url.scheme() == "file" && !matches!(url.host_str(), None | Some("") | Some("localhost")) {
        return Err(Error::location(
            blank_passwords(url.as_str()),
            format!(
                "'{url}' names the machine '{}': a file: URL names a file of this machine \
             (file:///path)",
                url.host_str().unwrap_or_default()
            ),
        ));
    }
    object_store::path::Path::from_url_path(url.path()).map_err(|e| {
        Error::location(
            blank_passwords(url.as_str()),
            format!("'{url}' is not a usable object path: {e}"),
        )
    })
}

/// `text` with the password of every URL in it (`scheme://user:password@host`) and its query
/// (`?sig=...`: a SAS token, a signed URL's signature) blanked: for messages that quote what was
/// given, whatever part of them it is.
pub fn blank_passwords(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    let ends_url = |c: char| c == '\'' || c == '"' || c.is_whitespace();
    while let Some(at) = rest.find("://") {
        let (before, after) = rest.split_at(at + 3);
        out.push_str(before);
        // The authority: up to the path, a quote or a space.
        let end = after
            .find(|c: char| matches!(c, '/' | '?' | '#') || ends_url(c))
            .unwrap_or(after.len());
        let authority = &after[..end];
        match authority
            .rfind('@')
            .and_then(|a| Some((a, authority[..a].find(':')?)))
        {
            Some((at, colon)) => {
                out.push_str(&authority[..=colon]);
                out.push_str("REDACTED");
                out.push_str(&authority[at..]);
            }
            None => out.push_str(authority),
        }
        // The path, its query and fragment blanked (a token may be in either).
        let tail = &after[end..];
        let url_end = tail.find(ends_url).unwrap_or(tail.len());
        let (url, after_url) = tail.split_at(url_end);
        let path_end = url.find(['?', '#']).unwrap_or(url.len());
        out.push_str(&url[..path_end]);
        let (query, fragment) = match url[path_end..].split_once('#') {
            Some((query, fragment)) => (query, Some(fragment)),
            None => (&url[path_end..], None),
        };
        if query.len() > 1 {
            out.push_str("?REDACTED");
        }
        if fragment.is_some_and(|f| !f.is_empty()) {
            out.push_str("#REDACTED");
        }
        rest = after_url;
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::{blank_passwords, check_write_target};

    #[test]
    fn url_write_targets_are_named_plainly() {
        for target in [
            "s3://b/deep/%2e%2e/%2e%2e/%2e%2e/top.parquet",
            "s3://b/a/../b.parquet",
            "s3://b/a/./b.parquet",
            "s3://b/q%3Fx.parquet",
            "s3://b/q%2Fx.parquet",
            "s3://b/x%00.parquet",
            "s3://b/%2E%2E/x.parquet",
            "gs://b/x%5B1%5D.parquet",
            "file:/tmp/out/../../etc/x.parquet",
            "s3://b/a/.\t./x.parquet",
            "file:///tmp/a/..\\x.parquet",
        ] {
            let e = check_write_target(target).unwrap_err().to_string();
            assert!(e.contains("path segment"), "{target}: {e}");
            assert!(!e.contains('\0'), "{target}: {e}");
        }
        for target in [
            "s3://b/out/scores.parquet",
            "s3://b/out/",
            "s3://b/my%20dir/x.parquet",
            "az://c/a.b/c..d.parquet",
            "file:///data/run%231/",
            "file:/data/out.parquet",
        ] {
            check_write_target(target).unwrap();
        }
    }

    #[test]
    fn passwords_in_urls_are_blanked_wherever_they_are() {
        assert_eq!(
            blank_passwords("cannot read s3://u:s3cret@b/x.parquet: 'https://a:b:c@h:99999/x'"),
            "cannot read s3://u:REDACTED@b/x.parquet: 'https://a:REDACTED@h:99999/x'"
        );
        assert_eq!(blank_passwords("s3://bucket/k@v:1"), "s3://bucket/k@v:1");
        assert_eq!(
            blank_passwords("read 'az://c/k.parquet?sv=1&sig=S3CRET' and https://h/x?a=b#f"),
            "read 'az://c/k.parquet?REDACTED' and https://h/x?REDACTED#REDACTED"
        );
        assert_eq!(
            blank_passwords("https://h?sig=S3CRET and https://h?x=a:b@c or https://h/#token=T0KEN"),
            "https://h?REDACTED and https://h?REDACTED or https://h/#REDACTED"
        );
        assert_eq!(
            blank_passwords("http://user@h/ and ://"),
            "http://user@h/ and ://"
        );
    }
}
