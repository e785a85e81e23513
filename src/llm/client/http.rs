//! A request sent until it is answered: past the model's requests at once and its pace, tried
//! again as the failure says (with backoff, or when the server says), the rate limits a server
//! reports honoured.

use super::*;

impl EndpointModel {
    /// `body` sent to `{endpoint}/{path}` until it is answered, past the model's requests at
    /// once and its pace (`reserve`: the tokens it may take), tried again as the failure says;
    /// the reply's body, its tokens (as `count` reads them) charged to the statement, or why
    /// there is none (the rows' error). `Err`: the statement stops (its budget, no key).
    pub(super) async fn request(
        &self,
        call: &Call<'_>,
        path: &str,
        body: &Value,
        reserve: f64,
        count: &(dyn Fn(&str) -> (u64, u64) + Sync),
    ) -> Result<Result<String, Unanswered>, LlmError> {
        spend::check(call.ledger, call.options)?;
        let api_key = self.api_key()?;
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| LlmError::Call("the model's requests were closed".into()))?;
        let mut attempt: u32 = 0;
        loop {
            self.pace.take(reserve).await;
            spend::check(call.ledger, call.options)?;
            self.count(
                call,
                &Usage {
                    requests: 1,
                    ..Usage::default()
                },
            );
            let timeout = Duration::from_secs_f64(self.endpoint.timeout);
            let sent = self.send(path, body, api_key.as_deref());
            let in_flight = spend::sending(call.ledger);
            let verdict = match tokio::time::timeout(timeout, sent).await {
                Ok(verdict) => verdict,
                Err(_) => Verdict::Retry {
                    why: format!("no reply within {} s ('timeout')", self.endpoint.timeout),
                    after: None,
                    slow_down: false,
                },
            };
            drop(in_flight);
            match verdict {
                Verdict::Body(raw) => {
                    let (prompt, completion) = count(&raw);
                    let (prompt, completion) = (
                        prompt.min(MAX_TOKENS_A_REPLY),
                        completion.min(MAX_TOKENS_A_REPLY),
                    );
                    self.pace
                        .settle(reserve, prompt.saturating_add(completion) as f64);
                    let cost = (prompt as f64 * self.endpoint.input_price_per_million
                        + completion as f64 * self.endpoint.output_price_per_million)
                        / 1e6;
                    let done = Usage {
                        prompt_tokens: prompt,
                        completion_tokens: completion,
                        cost,
                        ..Usage::default()
                    };
                    self.count(call, &done);
                    return Ok(Ok(raw));
                }
                Verdict::Final(why) => {
                    return Ok(Err(Unanswered::Failed(scrub(why, api_key.as_deref()))));
                }
                Verdict::Retry {
                    why,
                    after,
                    slow_down,
                } => {
                    if attempt >= self.endpoint.max_retries {
                        let tries = attempt + 1;
                        return Ok(Err(Unanswered::Failed(scrub(
                            format!(
                                "{why} (tried {tries} time{}; 'max_retries' is {})",
                                if tries == 1 { "" } else { "s" },
                                self.endpoint.max_retries
                            ),
                            api_key.as_deref(),
                        ))));
                    }
                    attempt += 1;
                    self.count(
                        call,
                        &Usage {
                            retries: 1,
                            ..Usage::default()
                        },
                    );
                    // A server's Retry-After is honoured up to a minute a try.
                    let wait = backoff(attempt).max(after.unwrap_or_default().min(MAX_WAIT));
                    if slow_down {
                        // A rate limit is the model's, not the request's: every request of it
                        // waits.
                        self.pace.pause(wait);
                    }
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    /// One try of `body` at `{endpoint}/{path}`.
    pub(super) async fn send(&self, path: &str, body: &Value, api_key: Option<&str>) -> Verdict {
        let url = format!("{}/{path}", self.endpoint.endpoint);
        let mut request = self.http.post(&url).json(body);
        if let Some(key) = api_key {
            request = request.bearer_auth(key);
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(e) => return transport(e),
        };
        let status = response.status();
        let headers = response.headers().clone();
        self.honour_rate_limits(&headers);
        let text = match read_capped(response).await {
            // A server that echoes the key gets it blanked before anything keeps or shows it.
            Ok(Some(text)) => scrub(text, api_key),
            Ok(None) => {
                return Verdict::Final(format!(
                    "the endpoint's reply ({status}) is larger than {} MiB",
                    MAX_REPLY >> 20
                ));
            }
            Err(e) => return transport(e),
        };
        if status.is_success() {
            return Verdict::Body(text);
        }
        let error = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v.get("error").cloned());
        let said = error
            .as_ref()
            .and_then(|e| e.get("message").and_then(Value::as_str).or(e.as_str()))
            .map_or_else(|| excerpt(text.trim()), excerpt);
        let code = error
            .as_ref()
            .and_then(|e| e.get("code").or(e.get("type")))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let why = format!("the endpoint answered {status}: {said}");
        let retry_after = headers
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(header_duration);
        match status.as_u16() {
            429 if code == "insufficient_quota" => Verdict::Final(why),
            429 => Verdict::Retry {
                why,
                after: retry_after,
                slow_down: true,
            },
            408 | 409 | 425 | 500..=599 => Verdict::Retry {
                why,
                after: retry_after,
                slow_down: status.as_u16() == 503,
            },
            _ => Verdict::Final(why),
        }
    }

    /// A server that says its requests or tokens are used up until a reset holds every request
    /// of the model until then.
    pub(super) fn honour_rate_limits(&self, headers: &reqwest::header::HeaderMap) {
        for kind in ["requests", "tokens"] {
            let get = |name: String| headers.get(name).and_then(|v| v.to_str().ok());
            let remaining = get(format!("x-ratelimit-remaining-{kind}"));
            if remaining.and_then(|r| r.trim().parse::<f64>().ok()) == Some(0.0)
                && let Some(reset) =
                    get(format!("x-ratelimit-reset-{kind}")).and_then(header_duration)
            {
                self.pace.pause(reset);
            }
        }
    }
}

/// A request that did not reach the server or got no whole reply: tried again, except for one
/// that could not be built.
pub(super) fn transport(e: reqwest::Error) -> Verdict {
    let why = format!("the request failed: {}", crate::message::with_causes(&e));
    if e.is_builder() {
        Verdict::Final(why)
    } else {
        Verdict::Retry {
            why,
            after: None,
            slow_down: false,
        }
    }
}

/// The wait before try `attempt` (1, 2, ...): half a second doubled each time up to 30 s, times
/// a random factor between 0.5 and 1 so that requests failed together do not come back
/// together.
pub(super) fn backoff(attempt: u32) -> Duration {
    let base = (0.5 * 2f64.powi(attempt.saturating_sub(1).min(16) as i32)).min(30.0);
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let jitter = 0.5 + 0.5 * (random as f64 / u64::MAX as f64);
    Duration::from_secs_f64(base * jitter)
}
