//! An endpoint's key kept out of everything batchinfer keeps or shows. A server may echo the key
//! it was sent (in an error message, a debug field, a reply): raw, or escaped as JSON
//! (`\/`, `\u0073`, for any of its characters), URL-encoded (`%73`), or as base64. Every such
//! form is blanked in the reply's text before it is parsed, cached, written or said, and in the
//! strings parsed out of it.

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};

/// What a key is replaced with.
pub const REDACTED: &str = "<redacted>";

/// `text` with every form of `key` (see the module's text) replaced by [`REDACTED`].
pub fn redact(text: String, key: &str) -> String {
    if key.is_empty() {
        return text;
    }
    let bytes = text.as_bytes();
    let key_bytes = key.as_bytes();
    let mut out: Option<String> = None;
    let (mut i, mut kept) = (0, 0);
    while i < bytes.len() {
        match spelled_at(bytes, i, key_bytes) {
            Some(end) => {
                let out = out.get_or_insert_with(|| String::with_capacity(text.len()));
                out.push_str(&text[kept..i]);
                out.push_str(REDACTED);
                (i, kept) = (end, end);
            }
            None => i += 1,
        }
    }
    let mut text = match out {
        Some(mut out) => {
            out.push_str(&text[kept..]);
            out
        }
        None => text,
    };
    // The base64 forms, the longest (padded) first.
    let mut encoded: Vec<String> = [STANDARD, URL_SAFE, STANDARD_NO_PAD, URL_SAFE_NO_PAD]
        .iter()
        .map(|engine| engine.encode(key_bytes))
        .collect();
    encoded.sort_by_key(|e| std::cmp::Reverse(e.len()));
    encoded.dedup();
    for form in encoded {
        if text.contains(&form) {
            text = text.replace(&form, REDACTED);
        }
    }
    text
}

/// Where `key` ends in `text` when it starts at `at`, each of its bytes as itself or escaped.
fn spelled_at(text: &[u8], at: usize, key: &[u8]) -> Option<usize> {
    key.iter().try_fold(at, |i, &k| byte_at(text, i, k))
}

/// Where the byte `k` ends in `text` when it starts at `i`: as itself, `\/` (for `/`), a JSON
/// escape `\uXXXX` or a short one (`\"`, `\\`, `\n`, ...), or `%XX`.
fn byte_at(text: &[u8], i: usize, k: u8) -> Option<usize> {
    let rest = text.get(i..)?;
    let hex = |digits: &[u8]| {
        std::str::from_utf8(digits)
            .ok()
            .and_then(|d| u32::from_str_radix(d, 16).ok())
    };
    match rest {
        [first, ..] if *first == k => Some(i + 1),
        [b'\\', b'u', a, b, c, d, ..] if hex(&[*a, *b, *c, *d]) == Some(u32::from(k)) => {
            Some(i + 6)
        }
        [b'\\', escaped, ..] if short_escape(*escaped) == Some(k) => Some(i + 2),
        [b'%', a, b, ..] if hex(&[*a, *b]) == Some(u32::from(k)) => Some(i + 3),
        _ => None,
    }
}

/// The byte JSON's short escape `\c` stands for.
fn short_escape(c: u8) -> Option<u8> {
    Some(match c {
        b'/' => b'/',
        b'"' => b'"',
        b'\\' => b'\\',
        b'b' => 0x08,
        b'f' => 0x0c,
        b'n' => b'\n',
        b'r' => b'\r',
        b't' => b'\t',
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "sk-test/Abc+123=xyz";

    #[test]
    fn every_spelling_of_the_key_is_blanked() {
        let json_escaped = serde_json::to_string(KEY).unwrap();
        let slash_escaped = KEY.replace('/', "\\/");
        let unicode: String = KEY
            .chars()
            .map(|c| format!("\\u{:04x}", c as u32))
            .collect();
        let mixed = "sk\\u002dtest\\/Abc+123=x\\u0079z";
        let url: String = KEY.bytes().map(|b| format!("%{b:02X}")).collect();
        let url_lower = "sk-test%2fAbc%2B123%3dxyz";
        for form in [
            KEY.to_string(),
            json_escaped.trim_matches('"').to_string(),
            slash_escaped,
            unicode,
            mixed.to_string(),
            url,
            url_lower.to_string(),
            STANDARD.encode(KEY),
            URL_SAFE_NO_PAD.encode(KEY),
        ] {
            let text = format!(r#"{{"error": "bad key {form} given"}}"#);
            let blanked = redact(text.clone(), KEY);
            assert_eq!(
                blanked, r#"{"error": "bad key <redacted> given"}"#,
                "{form} in {text}"
            );
        }
        // Decoded after, nothing of it is left.
        let reply = format!(r#"{{"m": "{}"}}"#, "sk\\u002dtest\\/Abc+123=x\\u0079z");
        let parsed: serde_json::Value = serde_json::from_str(&redact(reply, KEY)).unwrap();
        assert!(!parsed.to_string().contains(KEY));
        assert_eq!(redact("nothing here".into(), KEY), "nothing here");
        assert_eq!(redact("sk-test/Abc".into(), KEY), "sk-test/Abc");
    }
}
