//! What an endpoint answers: a chat completion read from its JSON, capped in size, and the
//! key blanked in it should a server echo it.

use super::*;

/// A chat completion as the endpoint gave it.
#[derive(Debug)]
pub struct Reply {
    /// The text of the first choice.
    pub content: Option<String>,
    /// What the model said instead of answering (OpenAI's `refusal`).
    pub refusal: Option<String>,
    /// Why it stopped: `stop`, or `length` when `max_tokens` cut it.
    pub finish_reason: Option<String>,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// Whether the prompt's tokens are to be estimated (the server's reply had no usable
    /// `usage`).
    pub estimated: bool,
    /// The reply's body as sent, which the cache keeps.
    pub raw: String,
}

/// The most tokens one reply is counted for, whatever its `usage` says.
pub(super) const MAX_TOKENS_A_REPLY: u64 = 1 << 40;

impl Reply {
    /// The reply in `raw`, a chat completion's body.
    pub fn parse(raw: String) -> Result<Reply, Unanswered> {
        let json: Value = serde_json::from_str(&raw).map_err(|_| Unanswered::NotA {
            what: "a chat completion",
            reply: excerpt(&raw),
        })?;
        let choice = json
            .get("choices")
            .and_then(|c| c.get(0))
            .ok_or_else(|| Unanswered::NoChoice(excerpt(&raw)))?;
        let message = choice.get("message");
        let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
        // A server that says nothing of its tokens is charged an estimate (a token per four
        // characters of the reply; the prompt's is added by the caller), so that budgets hold.
        let content = text(message.and_then(|m| m.get("content")));
        // A count that is not a whole number of tokens (negative, fractional, 1e300, text) is
        // no count: the estimate is charged, as for a reply without usage, never nothing.
        let usage = json.get("usage").filter(|u| u.is_object());
        let said = |key: &str| {
            usage
                .and_then(|u| u.get(key))
                .and_then(Value::as_u64)
                .map(|n| n.min(MAX_TOKENS_A_REPLY))
        };
        let (prompt, completion) = (said("prompt_tokens"), said("completion_tokens"));
        let completion_estimate = content.as_ref().map_or(0, |c| c.len() as u64 / 4 + 1);
        Ok(Reply {
            content,
            refusal: text(message.and_then(|m| m.get("refusal"))),
            finish_reason: text(choice.get("finish_reason")),
            prompt_tokens: prompt.unwrap_or(0),
            completion_tokens: completion.unwrap_or(completion_estimate),
            estimated: prompt.is_none(),
            raw,
        })
    }
}

impl Reply {
    /// The reply with the strings parsed out of it blanked of `key` too
    /// ([`crate::llm::redact`]).
    pub(super) fn scrubbed(mut self, key: Option<&str>) -> Reply {
        let Some(key) = key.filter(|k| !k.is_empty()) else {
            return self;
        };
        let blank = |text: &mut Option<String>| {
            if let Some(t) = text.take() {
                *text = Some(crate::llm::redact::redact(t, key));
            }
        };
        blank(&mut self.content);
        blank(&mut self.refusal);
        self.raw = crate::llm::redact::redact(std::mem::take(&mut self.raw), key);
        self
    }
}

/// A row's answer: the reply, or why there is none (the row's error).
pub type Outcome = Result<Arc<Reply>, Unanswered>;

/// Why a row has no answer from an endpoint: the row's error (the statement goes on).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Unanswered {
    /// The request failed, as the endpoint or the connection said (tried as often as the model
    /// allows), its key blanked.
    #[error("{0}")]
    Failed(String),
    #[error("the endpoint's reply is not {what}: {reply}")]
    NotA { what: &'static str, reply: String },
    #[error("the endpoint's reply holds no choice: {0}")]
    NoChoice(String),
    #[error("the model refused: {0}")]
    Refused(String),
    #[error("the reply was cut at max_tokens ({max_tokens}) before it ended: {text}")]
    Cut { max_tokens: u32, text: String },
    #[error("the reply holds no text: {0}")]
    NoText(String),
    #[error("the reply has no embedding for it")]
    NoEmbedding,
    #[error("the endpoint's vector holds a value a float32 cannot hold: {0}")]
    NotFloat32(String),
    #[error("the endpoint's vector has {got} values, and the model's 'dimensions' is {dimensions}")]
    Dimensions { got: usize, dimensions: usize },
    #[error("no answer")]
    NoAnswer,
    #[error("the request for this text was not completed")]
    NotCompleted,
}

/// `text` without the key, should a server have echoed it: as it is, JSON-escaped (`\/`,
/// `\uXXXX`, any of its characters), URL-encoded (`%XX`), or in base64 (standard or URL-safe,
/// with or without padding).
pub fn scrub(text: String, api_key: Option<&str>) -> String {
    match api_key {
        Some(key) if !key.is_empty() => crate::llm::redact::redact(text, key),
        _ => text,
    }
}

/// The body of `response` as text, read up to [`MAX_REPLY`] bytes (`None` past that).
pub(super) async fn read_capped(
    mut response: reqwest::Response,
) -> Result<Option<String>, reqwest::Error> {
    if response
        .content_length()
        .is_some_and(|n| n > MAX_REPLY as u64)
    {
        return Ok(None);
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        if body.len() + chunk.len() > MAX_REPLY {
            return Ok(None);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Some(String::from_utf8_lossy(&body).into_owned()))
}
