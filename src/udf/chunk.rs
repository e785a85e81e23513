//! `chunk(text, 'model', max_tokens [, overlap])`: a text cut into chunks that each fit a text
//! model, at its own tokenizer, for `unnest` to make a row of each.
//!
//! ```sql
//! SELECT filename, page, c.text AS text, c.char_start AS char_start, c.char_end AS char_end
//! FROM (SELECT filename, page, unnest(chunk(text, 'minilm', 128, 16)) AS c
//!       FROM read_document('manuals/'));
//! ```
//! Each chunk, encoded as the model encodes it (its special tokens counted), has at most
//! `max_tokens` tokens, so `embed` reads all of it. A chunk ends where the text is best cut
//! within its second half: at a paragraph's end, else a sentence's, else a line's, else between
//! words, else between tokens. The next begins `overlap` tokens before the end (at a word's
//! start where there is one among them). `char_start` and `char_end` are the chunk's place in
//! the text, in characters from 0, the end not included: `substr(text, char_start + 1,
//! char_end - char_start)` is the chunk. NULL text gives NULL; text of white space alone, no
//! chunks. A text longer than 1 MiB is first cut into pieces at paragraph ends (else line ends,
//! else white space), each chunked alone, so that its tokens are never all held at once.

use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, AsArray, Int32Builder, Int64Builder, ListBuilder, StringBuilder, StructBuilder,
};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Fields};
use datafusion::common::{ScalarValue, exec_err, plan_err};
use datafusion::error::Result;
use datafusion::logical_expr::{
    ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDFImpl, Signature, Volatility,
};
use tokenizers::Tokenizer;

use crate::model::ModelRegistry;

const USAGE: &str = "chunk(text, 'model', max_tokens [, overlap]): the model's name and the \
                     numbers as literals, as in chunk(text, 'minilm', 256, 32)";

/// The `chunk` scalar function over a [`ModelRegistry`].
#[derive(Debug)]
pub struct ChunkUdf {
    signature: Signature,
    registry: Arc<ModelRegistry>,
}

impl ChunkUdf {
    pub fn new(registry: Arc<ModelRegistry>) -> Self {
        ChunkUdf {
            signature: Signature::one_of(
                vec![
                    datafusion::logical_expr::TypeSignature::Any(3),
                    datafusion::logical_expr::TypeSignature::Any(4),
                ],
                Volatility::Immutable,
            ),
            registry,
        }
    }

    /// The tokenizer of the model `name` (without truncation), the most tokens it reads, and
    /// the tokens it adds to every text.
    fn tokenizer(
        &self,
        name: &str,
        config: Option<&datafusion::config::ConfigOptions>,
    ) -> Result<(Tokenizer, usize, usize)> {
        if self.registry.endpoint_if(name, config)?.is_some() {
            return plan_err!(
                "chunk: model '{name}' is an endpoint model; chunk cuts at the tokenizer of a \
                 text model (a model folder with tokenizer.json)"
            );
        }
        let model = self
            .registry
            .resolve(name, super::device_of(config), config)?;
        let Some(text) = model.text.as_ref() else {
            return plan_err!(
                "chunk: model '{name}' is not a text model: chunk cuts at the tokenizer of a \
                 model folder with tokenizer.json"
            );
        };
        let mut tokenizer = text.tokenizer.clone();
        tokenizer
            .with_truncation(None)
            .map_err(|e| tokenizer_error(name, e))?;
        let specials = tokenizer
            .encode("", true)
            .map_err(|e| tokenizer_error(name, e))?
            .len();
        Ok((tokenizer, text.max_tokens, specials))
    }
}

super::same_registry_identity!(ChunkUdf);

fn tokenizer_error(model: &str, e: impl std::fmt::Display) -> datafusion::error::DataFusionError {
    datafusion::error::DataFusionError::Execution(format!(
        "chunk: the tokenizer of model '{model}' failed: {e}"
    ))
}

/// The fields of a chunk.
fn chunk_fields() -> Fields {
    Fields::from(vec![
        Field::new("text", DataType::Utf8, false),
        Field::new("char_start", DataType::Int64, false),
        Field::new("char_end", DataType::Int64, false),
        Field::new("tokens", DataType::Int32, false),
    ])
}

fn whole(arg: Option<&ScalarValue>, what: &str) -> Result<Option<i64>> {
    match arg {
        None => Ok(None),
        Some(value) if value.data_type().is_integer() => match value.cast_to(&DataType::Int64)? {
            ScalarValue::Int64(Some(n)) => Ok(Some(n)),
            _ => plan_err!("chunk: {what} must not be NULL. {USAGE}"),
        },
        Some(_) => plan_err!("chunk: {what} must be a whole number. {USAGE}"),
    }
}

/// How a call cuts: checked against the model.
#[derive(Debug, Clone, Copy)]
struct Cut {
    max_tokens: usize,
    overlap: usize,
    specials: usize,
}

impl ChunkUdf {
    /// The model's tokenizer and how the call `args` cuts with it.
    fn plan(
        &self,
        args: &[Option<&ScalarValue>],
        config: Option<&datafusion::config::ConfigOptions>,
    ) -> Result<(String, Tokenizer, Cut)> {
        let Some(name) = super::string_literal(args.get(1).copied().flatten()) else {
            return plan_err!("chunk: the second argument must be the model's name. {USAGE}");
        };
        let Some(max_tokens) = whole(args.get(2).copied().flatten(), "max_tokens")? else {
            return plan_err!("chunk: max_tokens must be a literal whole number. {USAGE}");
        };
        let overlap = match args.get(3) {
            Some(arg) => match whole(arg.as_ref().copied(), "overlap")? {
                Some(n) => n,
                None => return plan_err!("chunk: overlap must be a literal whole number. {USAGE}"),
            },
            None => 0,
        };
        let (tokenizer, model_most, specials) = self.tokenizer(&name, config)?;
        let asked = max_tokens;
        let max_tokens = usize::try_from(max_tokens).unwrap_or(0);
        if max_tokens <= specials || max_tokens > model_most {
            return plan_err!(
                "chunk: max_tokens {asked} for model '{name}' must be from {} to {model_most} \
                 (the model reads {model_most} tokens, {specials} of them its own)",
                specials + 1
            );
        }
        let room = max_tokens - specials;
        let overlap = match usize::try_from(overlap) {
            Ok(overlap) if overlap < room => overlap,
            _ => {
                return plan_err!(
                    "chunk: overlap {overlap} must be from 0 to {} (less than the {room} tokens a \
                     chunk of at most {max_tokens} holds besides the model's own)",
                    room - 1
                );
            }
        };
        Ok((
            name,
            tokenizer,
            Cut {
                max_tokens,
                overlap,
                specials,
            },
        ))
    }
}

impl ScalarUDFImpl for ChunkUdf {
    fn name(&self) -> &str {
        "chunk"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        exec_err!("chunk: the result type is given by return_field_from_args")
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let text_type = args.arg_fields[0].data_type();
        if !matches!(
            text_type,
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Null
        ) {
            return plan_err!("chunk: the first argument must be text, got {text_type}. {USAGE}");
        }
        self.plan(args.scalar_arguments, None)?;
        Ok(Arc::new(Field::new(
            self.name(),
            DataType::List(Arc::new(Field::new_list_field(
                DataType::Struct(chunk_fields()),
                true,
            ))),
            true,
        )))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let scalars: Vec<Option<&ScalarValue>> = args
            .args
            .iter()
            .map(|a| match a {
                ColumnarValue::Scalar(s) => Some(s),
                ColumnarValue::Array(_) => None,
            })
            .collect();
        let (name, tokenizer, cut) = self.plan(&scalars, Some(&args.config_options))?;
        let rows = args.number_rows;
        let texts = cast(&args.args[0].to_array(rows)?, &DataType::Utf8)?;
        let texts = texts.as_string::<i32>();
        let stop = crate::statement_context::StatementContext::of(Some(&args.config_options))
            .map(|s| s.stop());
        let mut list =
            ListBuilder::new(StructBuilder::from_fields(chunk_fields(), 0)).with_field(Arc::new(
                Field::new_list_field(DataType::Struct(chunk_fields()), true),
            ));
        for text in texts.iter() {
            let Some(text) = text else {
                list.append_null();
                continue;
            };
            if let Some(stop) = &stop {
                stop.check()?;
            }
            let chunks = chunks(&tokenizer, text, cut).map_err(|e| tokenizer_error(&name, e))?;
            let entries = list.values();
            for chunk in chunks {
                entries
                    .field_builder::<StringBuilder>(0)
                    .expect("text")
                    .append_value(&text[chunk.bytes.clone()]);
                entries
                    .field_builder::<Int64Builder>(1)
                    .expect("char_start")
                    .append_value(chunk.chars.start as i64);
                entries
                    .field_builder::<Int64Builder>(2)
                    .expect("char_end")
                    .append_value(chunk.chars.end as i64);
                entries
                    .field_builder::<Int32Builder>(3)
                    .expect("tokens")
                    .append_value(i32::try_from(chunk.tokens).unwrap_or(i32::MAX));
                entries.append(true);
            }
            list.append(true);
        }
        let array: ArrayRef = Arc::new(list.finish());
        Ok(ColumnarValue::Array(array))
    }
}

/// A chunk of a text: its bytes and characters in the text, and its tokens as the model
/// encodes it.
#[derive(Debug, Clone, PartialEq)]
struct Chunk {
    bytes: std::ops::Range<usize>,
    chars: std::ops::Range<usize>,
    tokens: usize,
}

/// How good a place between two tokens is to end a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Place {
    Token,
    Word,
    Line,
    Sentence,
    Paragraph,
}

/// How good a place it is to cut `text` at byte `at`, between the token ending at `before` and
/// the one beginning at `at`.
fn place(text: &str, before: usize, at: usize) -> Place {
    let gap = &text[before..at];
    // The next token's own leading white space (a byte-level BPE's tokens hold it).
    let next: String = text[at..]
        .chars()
        .take(8)
        .take_while(|c| c.is_whitespace())
        .collect();
    let lines = gap.matches('\n').count() + next.matches('\n').count();
    if lines >= 2 {
        return Place::Paragraph;
    }
    let space_after = !gap.is_empty() || !next.is_empty();
    // The last character before, past a few closing quotes and brackets.
    let last = text[..before]
        .chars()
        .rev()
        .take(8)
        .find(|c| !matches!(c, '"' | '\'' | ')' | ']' | '”' | '’' | '»'));
    let ends_sentence =
        last.is_some_and(|c| matches!(c, '.' | '!' | '?' | '…' | '。' | '！' | '？'));
    let full_width = text[..before].ends_with(['。', '！', '？']);
    if ends_sentence && (space_after || full_width) {
        return Place::Sentence;
    }
    if lines == 1 {
        return Place::Line;
    }
    if space_after {
        return Place::Word;
    }
    Place::Token
}

/// The most text tokenized at once, in bytes: a longer text is cut into pieces first, each
/// at its last paragraph end (else line end, else white space) within this, and each piece
/// chunked alone, so that a text's tokens are never all held at once.
const PIECE: usize = 1 << 20;

/// `text` cut into chunks as `cut` says ([the module's](self) rules).
fn chunks(tokenizer: &Tokenizer, text: &str, cut: Cut) -> tokenizers::Result<Vec<Chunk>> {
    let mut chunks: Vec<Chunk> = Vec::new();
    let mut chars = CharCount::new(text);
    let mut start = 0;
    while start < text.len() {
        let end = piece_end(text, start);
        chunk_piece(tokenizer, text, start..end, cut, &mut chars, &mut chunks)?;
        start = end;
    }
    Ok(chunks)
}

/// Where the piece of `text` from `start` ends: at most [`PIECE`] bytes on.
fn piece_end(text: &str, start: usize) -> usize {
    let mut limit = (start + PIECE).min(text.len());
    if limit == text.len() {
        return limit;
    }
    while !text.is_char_boundary(limit) {
        limit -= 1;
    }
    let window = &text[start..limit];
    let at = window
        .rfind("\n\n")
        .map(|at| at + 2)
        .or_else(|| window.rfind('\n').map(|at| at + 1))
        .or_else(|| {
            window
                .rfind(char::is_whitespace)
                .map(|at| at + window[at..].chars().next().map_or(1, char::len_utf8))
        })
        .filter(|&at| at > 0)
        .unwrap_or(window.len());
    start + at
}

/// The chunks of the bytes `piece` of `text`, added to `chunks`.
fn chunk_piece(
    tokenizer: &Tokenizer,
    text: &str,
    piece: std::ops::Range<usize>,
    cut: Cut,
    chars: &mut CharCount<'_>,
    chunks: &mut Vec<Chunk>,
) -> tokenizers::Result<()> {
    let base = piece.start;
    let piece_text = &text[piece.clone()];
    let encoding = tokenizer.encode(piece_text, false)?;
    // Each token's bytes in the text; tokens that stand for none (added by the tokenizer) are
    // left out.
    let spans: Vec<(usize, usize)> = encoding
        .get_offsets()
        .iter()
        .copied()
        .filter(|(s, e)| e > s && *e <= piece_text.len())
        .map(|(s, e)| (base + s, base + e))
        .collect();
    drop(encoding);
    let n = spans.len();
    // Whether a chunk may end before token k: not within a character that the tokenizer made
    // several tokens of (a Hangul syllable decomposed), whose tokens share its bytes.
    let between = |k: usize| k >= n || spans[k - 1].1 <= spans[k].0;
    let room = cut.max_tokens - cut.specials;
    let mut first = 0;
    while first < n {
        let most = (first + room).min(n);
        // The chunk's tokens are first..end.
        let mut end = if most == n {
            n
        } else {
            let half = (first + room.div_ceil(2)).max(first + 1);
            // The last of the best places: the longest chunk that ends there; where the second
            // half has none (tokens of one character), the last place before it.
            (half..=most)
                .filter(|&k| between(k))
                .max_by_key(|&k| place(text, spans[k - 1].1, spans[k].0))
                .or_else(|| (first + 1..half).rev().find(|&k| between(k)))
                .unwrap_or(most)
        };
        // Encoded alone, a chunk can take more tokens than it did within the text: cut it
        // shorter until it fits.
        let (bytes, tokens) = loop {
            let bytes = spans[first].0..spans[end - 1].1;
            let tokens = tokenizer.encode(&text[bytes.clone()], true)?.len();
            if tokens <= cut.max_tokens || end == first + 1 {
                break (bytes, tokens);
            }
            end = (end - (tokens - cut.max_tokens)).max(first + 1);
            end = (first + 1..=end).rev().find(|&k| between(k)).unwrap_or(end);
        };
        if tokens > cut.max_tokens {
            return Err(format!(
                "a single token at character {} encodes to {tokens} tokens, more than {}",
                chars.at(bytes.start),
                cut.max_tokens
            )
            .into());
        }
        let chars_of = chars.at(bytes.start)..chars.at(bytes.end);
        chunks.push(Chunk {
            bytes,
            chars: chars_of,
            tokens,
        });
        if end == n {
            break;
        }
        // The next chunk begins `overlap` tokens back, at a word's start where there is one.
        let back = end.saturating_sub(cut.overlap).max(first + 1);
        first = (back..end)
            .find(|&k| between(k) && place(text, spans[k - 1].1, spans[k].0) >= Place::Word)
            .or_else(|| (back..=end).find(|&k| between(k)))
            .unwrap_or(end);
    }
    Ok(())
}

/// Characters counted up to a byte of a text, from the last byte asked, forward or back (each
/// text read about once however many chunks it has).
struct CharCount<'a> {
    text: &'a str,
    byte: usize,
    chars: usize,
}

impl<'a> CharCount<'a> {
    fn new(text: &'a str) -> Self {
        CharCount {
            text,
            byte: 0,
            chars: 0,
        }
    }

    /// The characters before byte `at` (a character boundary).
    fn at(&mut self, at: usize) -> usize {
        if at < self.byte {
            self.chars -= self.text[at..self.byte].chars().count();
        } else {
            self.chars += self.text[self.byte..at].chars().count();
        }
        self.byte = at;
        self.chars
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A word-level tokenizer (a token per word or punctuation mark) with `[CLS]` and `[SEP]`
    /// added, as BERT's.
    fn words() -> Tokenizer {
        let json = r#"{
          "version": "1.0",
          "added_tokens": [],
          "normalizer": null,
          "pre_tokenizer": {"type": "BertPreTokenizer"},
          "post_processor": {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
            "pair": [], "special_tokens": {
              "[CLS]": {"id": "[CLS]", "ids": [1], "tokens": ["[CLS]"]},
              "[SEP]": {"id": "[SEP]", "ids": [2], "tokens": ["[SEP]"]}}},
          "decoder": null,
          "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2},
                    "unk_token": "[UNK]"}
        }"#;
        Tokenizer::from_bytes(json.as_bytes()).unwrap()
    }

    fn cut(text: &str, max_tokens: usize, overlap: usize) -> Vec<String> {
        let cut = Cut {
            max_tokens,
            overlap,
            specials: 2,
        };
        chunks(&words(), text, cut)
            .unwrap()
            .into_iter()
            .map(|c| {
                let chars: String = text
                    .chars()
                    .skip(c.chars.start)
                    .take(c.chars.len())
                    .collect();
                assert_eq!(chars, text[c.bytes.clone()]);
                assert!(c.tokens <= max_tokens, "{c:?}");
                chars
            })
            .collect()
    }

    #[test]
    fn a_chunk_ends_at_a_paragraph_then_a_sentence() {
        let text = "One two three.\n\nFour five six. Seven eight nine ten";
        assert_eq!(
            cut(text, 8, 0),
            ["One two three.", "Four five six.", "Seven eight nine ten"]
        );
        // 3 tokens a chunk: the best place in each chunk's second half.
        assert_eq!(
            cut(text, 5, 0),
            [
                "One two",
                "three.",
                "Four five",
                "six.",
                "Seven eight nine",
                "ten"
            ]
        );
    }

    #[test]
    fn a_long_text_is_cut_into_pieces_at_paragraphs_and_offsets_stay_right() {
        let paragraph = "Ünï wörd. ".repeat(5000) + "\n\n";
        let text = paragraph.repeat(40);
        assert!(text.len() > 2 * PIECE);
        let end = piece_end(&text, 0);
        assert!(end <= PIECE && text[..end].ends_with("\n\n"), "{end}");
        let cut = Cut {
            max_tokens: 50,
            overlap: 5,
            specials: 2,
        };
        let all = chunks(&words(), &text, cut).unwrap();
        let chars: Vec<char> = text.chars().collect();
        for chunk in &all {
            let of: String = chars[chunk.chars.clone()].iter().collect();
            assert_eq!(of, text[chunk.bytes.clone()]);
        }
        // The text ends ". \n\n": the last chunk at its last full stop.
        assert_eq!(all.last().unwrap().chars.end, chars.len() - 3);
    }

    #[test]
    fn a_character_made_several_tokens_is_never_cut() {
        // Three tokens of one character, as a tokenizer that decomposes Hangul gives them.
        let text = "가 나 다 라 마 바 사 아";
        let mut spans = Vec::new();
        for (at, c) in text.char_indices().filter(|(_, c)| !c.is_whitespace()) {
            spans.extend([(at, at + c.len_utf8()); 3]);
        }
        let n = spans.len();
        let between = |k: usize| k >= n || spans[k - 1].1 <= spans[k].0;
        assert!(!between(1) && !between(2) && between(3));
    }

    #[test]
    fn a_run_of_closing_brackets_is_read_in_linear_time() {
        let text = ")".repeat(200_000);
        let started = std::time::Instant::now();
        let cut = Cut {
            max_tokens: 16,
            overlap: 2,
            specials: 2,
        };
        let all = chunks(&words(), &text, cut).unwrap();
        assert!(!all.is_empty());
        assert!(started.elapsed().as_secs() < 30, "{:?}", started.elapsed());
    }

    #[test]
    fn overlap_begins_at_a_word() {
        let text = "a b c d e f g h";
        assert_eq!(cut(text, 6, 2), ["a b c d", "c d e f", "e f g h"]);
    }

    #[test]
    fn empty_and_white_text_have_no_chunks_and_offsets_count_characters() {
        assert!(cut("", 8, 0).is_empty());
        assert!(cut(" \n\t ", 8, 0).is_empty());
        let text = "Ünïcödé wörds hére. Änd möre";
        let all = chunks(
            &words(),
            text,
            Cut {
                max_tokens: 5,
                overlap: 0,
                specials: 2,
            },
        )
        .unwrap();
        assert_eq!(all[0].chars, 0..13);
        assert_eq!(all[1].chars, 14..19);
        assert_eq!(cut(text, 5, 0), ["Ünïcödé wörds", "hére.", "Änd möre"]);
    }
}
