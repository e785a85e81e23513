//! A web page's text, as a reader sees it: the text of its body, a paragraph for each block
//! (headings, paragraphs, list items, table rows), without its head, scripts, styles, forms or
//! the boilerplate around its content (`nav`, `header`, `footer`, `aside`); runs of spaces
//! between words made one, as a browser shows them, but within `pre`.

/// Elements left out with all they hold.
const LEFT_OUT: &[&str] = &[
    "head", "script", "style", "noscript", "noframes", "template", "nav", "header", "footer",
    "aside", "svg", "iframe", "object", "form", "button", "select", "textarea", "canvas", "math",
];

/// Elements whose content is text a parser does not read as tags.
const RAW: &[&str] = &["script", "style", "textarea", "title", "noframes"];

/// Elements that end a paragraph where they begin and end.
const BLOCKS: &[&str] = &[
    "p",
    "div",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "section",
    "article",
    "main",
    "blockquote",
    "pre",
    "ul",
    "ol",
    "dl",
    "table",
    "figure",
    "hr",
    "address",
    "body",
    "details",
    "summary",
    "fieldset",
    "caption",
    "thead",
    "tbody",
    "tfoot",
];

/// Elements that end a line.
const LINES: &[&str] = &["br", "li", "tr", "dt", "dd", "figcaption", "option"];

/// Elements that never hold anything (no end tag follows).
const VOID: &[&str] = &[
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source",
    "track", "wbr",
];

/// The text of the HTML `html`.
pub(super) fn text(html: &str) -> String {
    let mut out = Writer::default();
    let mut rest = html;
    // The element left out now open, and how many of its name are open within it; depth
    // within `pre`.
    let mut left_out: Option<(String, usize)> = None;
    let mut pre = 0usize;
    while !rest.is_empty() {
        let Some(lt) = rest.find('<') else {
            if left_out.is_none() {
                out.text(rest, pre > 0);
            }
            break;
        };
        if left_out.is_none() {
            out.text(&rest[..lt], pre > 0);
        }
        rest = &rest[lt..];
        if let Some(after) = rest.strip_prefix("<!--") {
            rest = after.find("-->").map_or("", |end| &after[end + 3..]);
            continue;
        }
        if rest.starts_with("<!") || rest.starts_with("<?") {
            rest = rest.find('>').map_or("", |end| &rest[end + 1..]);
            continue;
        }
        let tag = match Tag::parse(rest) {
            Parsed::Tag(tag) => tag,
            Parsed::NoTag => {
                // A '<' that begins no tag is text.
                if left_out.is_none() {
                    out.text("<", pre > 0);
                }
                rest = &rest[1..];
                continue;
            }
            // A tag the file ends within holds the rest (as HTML's parsing has it).
            Parsed::Unended => break,
        };
        rest = &rest[tag.length..];
        let name = tag.name.as_str();
        if !tag.closing && RAW.contains(&name) {
            // Its content, to its end tag, is not read as tags.
            let end = find_end_tag(rest, name);
            if name == "title" || left_out.is_some() || LEFT_OUT.contains(&name) {
                rest = &rest[end.1..];
                continue;
            }
            out.text(&rest[..end.0], pre > 0);
            rest = &rest[end.1..];
            continue;
        }
        if let Some((open, depth)) = &mut left_out {
            if name == open.as_str() {
                if tag.closing {
                    *depth -= 1;
                    if *depth == 0 {
                        left_out = None;
                    }
                } else if !tag.self_closing && !VOID.contains(&name) {
                    *depth += 1;
                }
            }
            continue;
        }
        if !tag.closing && LEFT_OUT.contains(&name) && !tag.self_closing && !VOID.contains(&name) {
            left_out = Some((name.to_string(), 1));
            continue;
        }
        if name == "pre" {
            pre = if tag.closing {
                pre.saturating_sub(1)
            } else {
                pre + 1
            };
        }
        if BLOCKS.contains(&name) {
            out.paragraph();
        } else if LINES.contains(&name) && !(tag.closing && name == "br") {
            out.line();
        } else if matches!(name, "td" | "th") && !tag.closing {
            out.space();
        }
    }
    out.finish()
}

/// Where the end tag of `name` begins in `rest`, and where it ends (the end of `rest` where
/// there is none).
fn find_end_tag(rest: &str, name: &str) -> (usize, usize) {
    let bytes = rest.as_bytes();
    let mut from = 0;
    while let Some(at) = rest[from..].find("</") {
        let start = from + at;
        let after = &bytes[start + 2..];
        if after.len() >= name.len()
            && after[..name.len()].eq_ignore_ascii_case(name.as_bytes())
            && after
                .get(name.len())
                .is_none_or(|c| *c == b'>' || c.is_ascii_whitespace() || *c == b'/')
        {
            let end = rest[start..]
                .find('>')
                .map_or(rest.len(), |e| start + e + 1);
            return (start, end);
        }
        from = start + 2;
    }
    (rest.len(), rest.len())
}

/// What a '<' begins.
enum Parsed {
    Tag(Tag),
    /// Not a tag: the '<' is text.
    NoTag,
    /// A tag the file ends within.
    Unended,
}

/// A tag: its name (lower case), whether it ends an element, and how long it is.
struct Tag {
    name: String,
    closing: bool,
    self_closing: bool,
    length: usize,
}

impl Tag {
    fn parse(s: &str) -> Parsed {
        let bytes = s.as_bytes();
        let closing = bytes.get(1) == Some(&b'/');
        let start = if closing { 2 } else { 1 };
        if !bytes.get(start).is_some_and(u8::is_ascii_alphabetic) {
            return Parsed::NoTag;
        }
        let name_end = bytes[start..]
            .iter()
            .position(|b| !(b.is_ascii_alphanumeric() || *b == b'-' || *b == b':'))
            .map_or(bytes.len(), |p| start + p);
        // The tag ends at the first '>' outside a quoted attribute value.
        let mut quote = None;
        let mut end = None;
        for (i, b) in bytes.iter().enumerate().skip(name_end) {
            match (quote, b) {
                (None, b'"' | b'\'') => quote = Some(*b),
                (Some(q), _) if *b == q => quote = None,
                (None, b'>') => {
                    end = Some(i);
                    break;
                }
                _ => {}
            }
        }
        let Some(end) = end else {
            return Parsed::Unended;
        };
        Parsed::Tag(Tag {
            name: s[start..name_end].to_ascii_lowercase(),
            closing,
            self_closing: end > 0 && bytes[end - 1] == b'/',
            length: end + 1,
        })
    }
}

/// The text written so far: words, the spaces between them, line and paragraph ends.
#[derive(Default)]
struct Writer {
    out: String,
    /// A break owed before the next text: 0 none, 1 a space, 2 a line, 3 a paragraph.
    owed: u8,
}

impl Writer {
    fn text(&mut self, raw: &str, pre: bool) {
        let decoded = decode_entities(raw);
        if pre {
            if !decoded.is_empty() {
                self.pay();
                self.out.push_str(&decoded);
            }
            return;
        }
        let starts_blank = decoded.starts_with(|c: char| c.is_whitespace() && c != '\u{a0}');
        let ends_blank = decoded.ends_with(|c: char| c.is_whitespace() && c != '\u{a0}');
        let mut words = decoded
            .split(|c: char| c.is_whitespace() && c != '\u{a0}')
            .filter(|w| !w.is_empty())
            .peekable();
        if words.peek().is_none() {
            if !decoded.is_empty() {
                self.space();
            }
            return;
        }
        if starts_blank {
            self.space();
        }
        let mut first = true;
        for word in words {
            if !first {
                self.out.push(' ');
            }
            first = false;
            self.pay();
            self.out.push_str(&word.replace('\u{a0}', " "));
        }
        if ends_blank {
            self.space();
        }
    }

    fn pay(&mut self) {
        if !self.out.is_empty() {
            match self.owed {
                1 => self.out.push(' '),
                2 => self.out.push('\n'),
                3 => self.out.push_str("\n\n"),
                _ => {}
            }
        }
        self.owed = 0;
    }

    fn space(&mut self) {
        self.owed = self.owed.max(1);
    }

    fn line(&mut self) {
        self.owed = self.owed.max(2);
    }

    fn paragraph(&mut self) {
        self.owed = 3;
    }

    fn finish(self) -> String {
        self.out
    }
}

/// `s` with its character references decoded (the common named ones, and every numbered one).
fn decode_entities(s: &str) -> String {
    if !s.contains('&') {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        let end = rest[1..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '#'))
            .map_or(rest.len(), |e| e + 1);
        let name = &rest[1..end];
        let decoded = if let Some(number) = name.strip_prefix('#') {
            let value = match number.strip_prefix(['x', 'X']) {
                Some(hex) => u32::from_str_radix(hex, 16).ok(),
                None => number.parse().ok(),
            };
            value.map(|v| char::from_u32(v).unwrap_or('\u{fffd}').to_string())
        } else {
            named(name)
        };
        match decoded {
            Some(text) => {
                out.push_str(&text);
                rest = &rest[end..];
                rest = rest.strip_prefix(';').unwrap_or(rest);
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

fn named(name: &str) -> Option<String> {
    let name = match name {
        "AMP" | "LT" | "GT" | "QUOT" => name.to_ascii_lowercase(),
        _ => name.to_string(),
    };
    NAMED
        .iter()
        .find(|(n, _)| *n == name)
        .and_then(|(_, code)| char::from_u32(*code))
        .map(String::from)
}

/// HTML 4's named characters and XML's `&apos;` (HTML 5 keeps them all; its others are rare in
/// pages).
const NAMED: &[(&str, u32)] = &[
    ("apos", 0x27),
    ("quot", 0x22),
    ("amp", 0x26),
    ("lt", 0x3c),
    ("gt", 0x3e),
    ("nbsp", 0xa0),
    ("iexcl", 0xa1),
    ("cent", 0xa2),
    ("pound", 0xa3),
    ("curren", 0xa4),
    ("yen", 0xa5),
    ("brvbar", 0xa6),
    ("sect", 0xa7),
    ("uml", 0xa8),
    ("copy", 0xa9),
    ("ordf", 0xaa),
    ("laquo", 0xab),
    ("not", 0xac),
    ("shy", 0xad),
    ("reg", 0xae),
    ("macr", 0xaf),
    ("deg", 0xb0),
    ("plusmn", 0xb1),
    ("sup2", 0xb2),
    ("sup3", 0xb3),
    ("acute", 0xb4),
    ("micro", 0xb5),
    ("para", 0xb6),
    ("middot", 0xb7),
    ("cedil", 0xb8),
    ("sup1", 0xb9),
    ("ordm", 0xba),
    ("raquo", 0xbb),
    ("frac14", 0xbc),
    ("frac12", 0xbd),
    ("frac34", 0xbe),
    ("iquest", 0xbf),
    ("Agrave", 0xc0),
    ("Aacute", 0xc1),
    ("Acirc", 0xc2),
    ("Atilde", 0xc3),
    ("Auml", 0xc4),
    ("Aring", 0xc5),
    ("AElig", 0xc6),
    ("Ccedil", 0xc7),
    ("Egrave", 0xc8),
    ("Eacute", 0xc9),
    ("Ecirc", 0xca),
    ("Euml", 0xcb),
    ("Igrave", 0xcc),
    ("Iacute", 0xcd),
    ("Icirc", 0xce),
    ("Iuml", 0xcf),
    ("ETH", 0xd0),
    ("Ntilde", 0xd1),
    ("Ograve", 0xd2),
    ("Oacute", 0xd3),
    ("Ocirc", 0xd4),
    ("Otilde", 0xd5),
    ("Ouml", 0xd6),
    ("times", 0xd7),
    ("Oslash", 0xd8),
    ("Ugrave", 0xd9),
    ("Uacute", 0xda),
    ("Ucirc", 0xdb),
    ("Uuml", 0xdc),
    ("Yacute", 0xdd),
    ("THORN", 0xde),
    ("szlig", 0xdf),
    ("agrave", 0xe0),
    ("aacute", 0xe1),
    ("acirc", 0xe2),
    ("atilde", 0xe3),
    ("auml", 0xe4),
    ("aring", 0xe5),
    ("aelig", 0xe6),
    ("ccedil", 0xe7),
    ("egrave", 0xe8),
    ("eacute", 0xe9),
    ("ecirc", 0xea),
    ("euml", 0xeb),
    ("igrave", 0xec),
    ("iacute", 0xed),
    ("icirc", 0xee),
    ("iuml", 0xef),
    ("eth", 0xf0),
    ("ntilde", 0xf1),
    ("ograve", 0xf2),
    ("oacute", 0xf3),
    ("ocirc", 0xf4),
    ("otilde", 0xf5),
    ("ouml", 0xf6),
    ("divide", 0xf7),
    ("oslash", 0xf8),
    ("ugrave", 0xf9),
    ("uacute", 0xfa),
    ("ucirc", 0xfb),
    ("uuml", 0xfc),
    ("yacute", 0xfd),
    ("thorn", 0xfe),
    ("yuml", 0xff),
    ("OElig", 0x152),
    ("oelig", 0x153),
    ("Scaron", 0x160),
    ("scaron", 0x161),
    ("Yuml", 0x178),
    ("fnof", 0x192),
    ("circ", 0x2c6),
    ("tilde", 0x2dc),
    ("Alpha", 0x391),
    ("Beta", 0x392),
    ("Gamma", 0x393),
    ("Delta", 0x394),
    ("Epsilon", 0x395),
    ("Zeta", 0x396),
    ("Eta", 0x397),
    ("Theta", 0x398),
    ("Iota", 0x399),
    ("Kappa", 0x39a),
    ("Lambda", 0x39b),
    ("Mu", 0x39c),
    ("Nu", 0x39d),
    ("Xi", 0x39e),
    ("Omicron", 0x39f),
    ("Pi", 0x3a0),
    ("Rho", 0x3a1),
    ("Sigma", 0x3a3),
    ("Tau", 0x3a4),
    ("Upsilon", 0x3a5),
    ("Phi", 0x3a6),
    ("Chi", 0x3a7),
    ("Psi", 0x3a8),
    ("Omega", 0x3a9),
    ("alpha", 0x3b1),
    ("beta", 0x3b2),
    ("gamma", 0x3b3),
    ("delta", 0x3b4),
    ("epsilon", 0x3b5),
    ("zeta", 0x3b6),
    ("eta", 0x3b7),
    ("theta", 0x3b8),
    ("iota", 0x3b9),
    ("kappa", 0x3ba),
    ("lambda", 0x3bb),
    ("mu", 0x3bc),
    ("nu", 0x3bd),
    ("xi", 0x3be),
    ("omicron", 0x3bf),
    ("pi", 0x3c0),
    ("rho", 0x3c1),
    ("sigmaf", 0x3c2),
    ("sigma", 0x3c3),
    ("tau", 0x3c4),
    ("upsilon", 0x3c5),
    ("phi", 0x3c6),
    ("chi", 0x3c7),
    ("psi", 0x3c8),
    ("omega", 0x3c9),
    ("thetasym", 0x3d1),
    ("upsih", 0x3d2),
    ("piv", 0x3d6),
    ("ensp", 0x2002),
    ("emsp", 0x2003),
    ("thinsp", 0x2009),
    ("zwnj", 0x200c),
    ("zwj", 0x200d),
    ("lrm", 0x200e),
    ("rlm", 0x200f),
    ("ndash", 0x2013),
    ("mdash", 0x2014),
    ("lsquo", 0x2018),
    ("rsquo", 0x2019),
    ("sbquo", 0x201a),
    ("ldquo", 0x201c),
    ("rdquo", 0x201d),
    ("bdquo", 0x201e),
    ("dagger", 0x2020),
    ("Dagger", 0x2021),
    ("bull", 0x2022),
    ("hellip", 0x2026),
    ("permil", 0x2030),
    ("prime", 0x2032),
    ("Prime", 0x2033),
    ("lsaquo", 0x2039),
    ("rsaquo", 0x203a),
    ("oline", 0x203e),
    ("frasl", 0x2044),
    ("euro", 0x20ac),
    ("image", 0x2111),
    ("weierp", 0x2118),
    ("real", 0x211c),
    ("trade", 0x2122),
    ("alefsym", 0x2135),
    ("larr", 0x2190),
    ("uarr", 0x2191),
    ("rarr", 0x2192),
    ("darr", 0x2193),
    ("harr", 0x2194),
    ("crarr", 0x21b5),
    ("lArr", 0x21d0),
    ("uArr", 0x21d1),
    ("rArr", 0x21d2),
    ("dArr", 0x21d3),
    ("hArr", 0x21d4),
    ("forall", 0x2200),
    ("part", 0x2202),
    ("exist", 0x2203),
    ("empty", 0x2205),
    ("nabla", 0x2207),
    ("isin", 0x2208),
    ("notin", 0x2209),
    ("ni", 0x220b),
    ("prod", 0x220f),
    ("sum", 0x2211),
    ("minus", 0x2212),
    ("lowast", 0x2217),
    ("radic", 0x221a),
    ("prop", 0x221d),
    ("infin", 0x221e),
    ("ang", 0x2220),
    ("and", 0x2227),
    ("or", 0x2228),
    ("cap", 0x2229),
    ("cup", 0x222a),
    ("int", 0x222b),
    ("there4", 0x2234),
    ("sim", 0x223c),
    ("cong", 0x2245),
    ("asymp", 0x2248),
    ("ne", 0x2260),
    ("equiv", 0x2261),
    ("le", 0x2264),
    ("ge", 0x2265),
    ("sub", 0x2282),
    ("sup", 0x2283),
    ("nsub", 0x2284),
    ("sube", 0x2286),
    ("supe", 0x2287),
    ("oplus", 0x2295),
    ("otimes", 0x2297),
    ("perp", 0x22a5),
    ("sdot", 0x22c5),
    ("lceil", 0x2308),
    ("rceil", 0x2309),
    ("lfloor", 0x230a),
    ("rfloor", 0x230b),
    ("lang", 0x2329),
    ("rang", 0x232a),
    ("loz", 0x25ca),
    ("spades", 0x2660),
    ("clubs", 0x2663),
    ("hearts", 0x2665),
    ("diams", 0x2666),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_text_without_scripts_styles_or_boilerplate() {
        let html = r#"<!DOCTYPE html><html><head><title>T</title><style>p{x:1}</style></head>
            <body><nav><a href="/">Home</a> <a href="/b">Blog</a></nav>
            <header><h1>Site</h1></header>
            <main><h1>Caf&eacute; &amp; co</h1>
            <p>First   line,
               still the <b>first</b> paragraph.<br>Next line &#x263A; &copy;</p>
            <script>if (a < b) { document.write("</p>x") }</script>
            <ul><li>one</li><li>two</li></ul>
            <pre>  keep
  this</pre>
            <table><tr><td>a</td><td>b</td></tr><tr><td>c</td></tr></table>
            <!-- a comment --></main><footer>(c) 2026</footer></body></html>"#;
        assert_eq!(
            text(html),
            "Café & co\n\nFirst line, still the first paragraph.\nNext line ☺ ©\n\none\ntwo\
             \n\n  keep\n  this\n\na b\nc"
        );
    }

    #[test]
    fn text_that_only_looks_like_tags() {
        assert_eq!(text("a < b and c <3 d"), "a < b and c <3 d");
        assert_eq!(text("x <!-- never closed"), "x");
        // A tag the file ends within holds the rest, as a browser reads it.
        assert_eq!(text("<p>x</p><a title=\"y>z"), "x");
    }

    #[test]
    fn hostile_pages_are_read_in_linear_time_and_memory() {
        let started = std::time::Instant::now();
        for html in [
            "<a".repeat(1 << 18),
            "<title>x</title>y ".repeat(1 << 16),
            "<b title=\"".repeat(1 << 17),
            "<nav>".repeat(1 << 18) + "x",
        ] {
            let _ = text(&html);
        }
        assert!(started.elapsed().as_secs() < 20, "{:?}", started.elapsed());
        assert_eq!(
            text(&("<nav>".repeat(1000) + &"</nav>".repeat(1000) + "after")),
            "after"
        );
    }
}
