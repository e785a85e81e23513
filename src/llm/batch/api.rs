//! OpenAI's Batch API as batchinfer speaks it: a JSONL file of requests uploaded
//! (`POST /files`, purpose `batch`), a batch made of it (`POST /batches`, its `metadata` naming
//! the warehouse's record), its state read (`GET /batches/{id}`, and `GET /batches` to find one
//! by its record), and its output and error files read (`GET /files/{id}/content`).

use std::time::Duration;

use serde_json::{Value, json};

use crate::llm::client::scrub;
use crate::llm::output::excerpt;

/// The largest file of a batch's results read.
const MAX_RESULTS: usize = 512 << 20;

/// The tries of a request of the protocol (not of a batch) before it is given up.
const TRIES: u32 = 6;

/// The endpoint a model's batches are made at, as a task that outlives any statement holds it.
#[derive(Clone)]
pub struct Provider {
    pub http: reqwest::Client,
    /// Up to `/v1`.
    pub base: String,
    pub api_key: Option<String>,
}

/// A batch's state as the provider reports it.
#[derive(Debug, Clone)]
pub struct State {
    pub status: String,
    pub input_file_id: Option<String>,
    pub output_file_id: Option<String>,
    pub error_file_id: Option<String>,
}

impl State {
    /// Whether the batch is over: completed, failed, expired or cancelled.
    pub fn is_over(&self) -> bool {
        matches!(
            self.status.as_str(),
            "completed" | "failed" | "expired" | "cancelled"
        )
    }
}

/// Why a request of the protocol failed: worth trying again, or not.
#[derive(Debug)]
pub enum Failure {
    Again(String),
    Final(String),
}

impl Failure {
    pub fn why(&self) -> &str {
        match self {
            Failure::Again(why) | Failure::Final(why) => why,
        }
    }
}

impl Provider {
    fn url(&self, path: &str) -> String {
        format!("{}/{path}", self.base)
    }

    fn with_key(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.api_key {
            Some(key) => request.bearer_auth(key),
            None => request,
        }
    }

    /// One try of `request`: its body (at most `cap` bytes), or why not.
    async fn once(&self, request: reqwest::RequestBuilder, cap: usize) -> Result<Vec<u8>, Failure> {
        let key = self.api_key.as_deref();
        let response = self
            .with_key(request)
            .timeout(Duration::from_secs(600))
            .send()
            .await
            .map_err(|e| {
                Failure::Again(scrub(
                    format!("the request failed: {}", crate::message::with_causes(&e)),
                    key,
                ))
            })?;
        let status = response.status();
        let mut body = Vec::new();
        let mut response = response;
        while let Some(chunk) = response.chunk().await.map_err(|e| {
            Failure::Again(scrub(
                format!("the reply was cut: {}", crate::message::with_causes(&e)),
                key,
            ))
        })? {
            if body.len() + chunk.len() > cap {
                return Err(Failure::Final(format!(
                    "the endpoint's reply is larger than {} MiB",
                    cap >> 20
                )));
            }
            body.extend_from_slice(&chunk);
        }
        if status.is_success() {
            return Ok(body);
        }
        let text = String::from_utf8_lossy(&body);
        let why = scrub(
            format!("the endpoint answered {status}: {}", excerpt(text.trim())),
            key,
        );
        match status.as_u16() {
            408 | 409 | 425 | 429 | 500..=599 => Err(Failure::Again(why)),
            _ => Err(Failure::Final(why)),
        }
    }

    /// `request` (made again for each try) until it succeeds, a final failure, or [`TRIES`].
    async fn tried(
        &self,
        make: impl Fn() -> reqwest::RequestBuilder,
        cap: usize,
    ) -> Result<Vec<u8>, Failure> {
        let mut attempt = 0;
        loop {
            match self.once(make(), cap).await {
                Err(Failure::Again(why)) if attempt + 1 < TRIES => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(500 << attempt.min(6))).await;
                    let _ = why;
                }
                done => return done,
            }
        }
    }

    /// `text` with the key blanked, should a server echo it.
    fn scrubbed(&self, text: String) -> String {
        scrub(text, self.api_key.as_deref())
    }

    fn json(&self, body: Vec<u8>) -> Result<Value, Failure> {
        serde_json::from_slice(&body).map_err(|_| {
            Failure::Final(self.scrubbed(format!(
                "the endpoint's reply is not JSON: {}",
                excerpt(&String::from_utf8_lossy(&body))
            )))
        })
    }

    /// Uploads `jsonl` as a file for a batch; its id.
    pub async fn upload(&self, jsonl: &[u8]) -> Result<String, Failure> {
        let boundary = format!("batchinfer-{}", uuid::Uuid::new_v4().simple());
        let mut body = Vec::with_capacity(jsonl.len() + 512);
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n\
                 --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; \
                 filename=\"batchinfer.jsonl\"\r\nContent-Type: application/jsonl\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(jsonl);
        body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        let body = bytes::Bytes::from(body);
        let reply = self
            .tried(
                || {
                    self.http
                        .post(self.url("files"))
                        .header(
                            reqwest::header::CONTENT_TYPE,
                            format!("multipart/form-data; boundary={boundary}"),
                        )
                        .body(body.clone())
                },
                1 << 20,
            )
            .await?;
        id_of(&self.json(reply)?, "file").map_err(|e| Failure::Final(self.scrubbed(e)))
    }

    /// Makes a batch of the file `input_file_id`, its metadata naming `record`; its id. One try
    /// only: a request that fails may have made the batch, which [`Provider::find`] looks for
    /// before another is made.
    pub async fn create(&self, input_file_id: &str, record: &str) -> Result<String, Failure> {
        let request = json!({
            "input_file_id": input_file_id,
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
            "metadata": {"batchinfer_record": record},
        });
        let reply = self
            .once(self.http.post(self.url("batches")).json(&request), 1 << 20)
            .await?;
        id_of(&self.json(reply)?, "batch").map_err(|e| Failure::Final(self.scrubbed(e)))
    }

    /// The batch whose metadata names `record`, among the provider's latest 1,000: None only
    /// where the provider's whole list was read without it.
    pub async fn find(&self, record: &str) -> Result<Option<String>, Failure> {
        let mut after: Option<String> = None;
        for _ in 0..10 {
            let mut url = self.url("batches?limit=100");
            if let Some(after) = &after {
                url.push_str(&format!("&after={}", url_part(after)));
            }
            let page = self.json(self.tried(|| self.http.get(&url), 16 << 20).await?)?;
            let data = page["data"].as_array().cloned().unwrap_or_default();
            for batch in &data {
                if batch["metadata"]["batchinfer_record"].as_str() == Some(record) {
                    return Ok(batch["id"].as_str().map(str::to_string));
                }
            }
            if page["has_more"].as_bool() != Some(true) {
                return Ok(None);
            }
            after = data
                .last()
                .and_then(|b| b["id"].as_str())
                .map(str::to_string);
            if after.is_none() {
                return Err(Failure::Again(
                    "the endpoint's list of batches says it has more, and names no last one".into(),
                ));
            }
        }
        // Not among the latest 1,000: it may be older, so it is not known to be missing.
        Err(Failure::Again(
            "the batch is not among the endpoint's latest 1,000".into(),
        ))
    }

    /// The batch `id`'s state (one try).
    pub async fn state(&self, id: &str) -> Result<State, Failure> {
        let url = self.url(&format!("batches/{}", url_part(id)));
        let batch = self.json(self.once(self.http.get(&url), 1 << 20).await?)?;
        let text = |key: &str| batch[key].as_str().map(str::to_string);
        Ok(State {
            status: text("status").ok_or_else(|| {
                Failure::Final(self.scrubbed(format!(
                    "the batch {id} has no status: {}",
                    excerpt(&batch.to_string())
                )))
            })?,
            input_file_id: text("input_file_id"),
            output_file_id: text("output_file_id"),
            error_file_id: text("error_file_id"),
        })
    }

    /// The content of the file `id`.
    pub async fn content(&self, id: &str) -> Result<Vec<u8>, Failure> {
        let url = self.url(&format!("files/{}/content", url_part(id)));
        self.tried(|| self.http.get(&url), MAX_RESULTS).await
    }
}

/// A provider's id as a part of a URL: letters, digits, `-` and `_` only.
fn url_part(id: &str) -> String {
    id.chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
        .collect()
}

/// The `id` of a reply describing a `what`, or why there is none (to be scrubbed).
fn id_of(reply: &Value, what: &str) -> Result<String, String> {
    reply["id"]
        .as_str()
        .filter(|id| !id.is_empty() && id.len() <= 200 && url_part(id) == *id)
        .map(str::to_string)
        .ok_or_else(|| {
            format!(
                "the endpoint's reply names no {what}: {}",
                excerpt(&reply.to_string())
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A provider's ids become parts of URLs: anything but letters, digits, `-` and `_` is
    /// dropped, and an id that holds any is refused.
    #[test]
    fn hostile_ids_never_reach_a_url() {
        assert_eq!(url_part("../../files/x?y=1#z"), "filesxy1z");
        assert_eq!(url_part("batch_abc-1"), "batch_abc-1");
        for hostile in ["../etc", "a/b", "id?x=1", "", "a b", "é"] {
            assert!(
                id_of(&json!({"id": hostile}), "batch").is_err(),
                "{hostile}"
            );
        }
        assert!(id_of(&json!({"id": "x".repeat(201)}), "batch").is_err());
        assert_eq!(
            id_of(&json!({"id": "batch_1"}), "batch").unwrap(),
            "batch_1"
        );
    }
}
