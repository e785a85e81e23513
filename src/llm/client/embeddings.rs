//! Texts made vectors by an embedding endpoint (`/embeddings`): from the cache where it holds
//! them, the others sent in requests of a few texts, identical texts once.

use super::*;

impl EndpointModel {
    /// The vectors of `texts` from an embedding endpoint (`/embeddings`), each of the
    /// definition's `dimensions`, or why a text has none: from the cache where it holds them,
    /// the others sent in requests of [`EMBED_BATCH`] texts, identical texts once.
    pub async fn embed(
        &self,
        call: &Call<'_>,
        texts: &[&str],
    ) -> Result<Vec<Result<Vec<f32>, Unanswered>>, LlmError> {
        let dim = self.endpoint.dimensions.unwrap_or(0);
        let cache = self.cache.as_ref().filter(|_| call.cache != Mode::Off);
        let key_of = |text: &str| self.embedding_key(text);
        let mut found: HashMap<&str, Result<Vec<f32>, Unanswered>> = HashMap::new();
        let mut missing: Vec<&str> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for &text in texts {
            if !seen.insert(text) {
                continue;
            }
            let cached = match cache {
                Some(cache) => cache.get(&key_of(text)).await,
                None => None,
            };
            match cached.and_then(|raw| serde_json::from_str::<Vec<f32>>(&raw).ok()) {
                Some(vector) if vector.len() == dim && vector.iter().all(|x| x.is_finite()) => {
                    self.count(call, &Usage::cache_hit());
                    found.insert(text, Ok(vector));
                }
                _ => missing.push(text),
            }
        }
        // A text another batch of the statement is asking for is waited for, not sent again.
        let mut waiting = Vec::new();
        let mut claims = Claims {
            model: self,
            keys: Vec::new(),
        };
        {
            let mut memo = self.vector_memo();
            missing.retain(|text| {
                let memo_key = format!("{}/{}", call.statement, key_of(text));
                match memo.cells.get(&memo_key) {
                    Some(sender) => {
                        waiting.push((*text, sender.subscribe()));
                        false
                    }
                    None => {
                        memo.cells
                            .insert(memo_key.clone(), tokio::sync::watch::channel(None).0);
                        claims.keys.push((text.to_string(), memo_key));
                        true
                    }
                }
            });
        }
        let claims = &claims;
        let batches = missing.chunks(EMBED_BATCH).map(|batch| async move {
            let body = json!({"model": self.endpoint.model, "input": batch});
            let chars: usize = batch.iter().map(|t| t.len()).sum();
            let count = |raw: &str| {
                let said = serde_json::from_str::<Value>(raw)
                    .ok()
                    .and_then(|v| v.get("usage")?.get("prompt_tokens")?.as_u64());
                (said.unwrap_or((chars / 4 + 1) as u64), 0)
            };
            let answered = self
                .request(call, "embeddings", &body, (chars / 4 + 1) as f64, &count)
                .await?;
            let vectors = answered.and_then(|raw| vectors_of(&raw, batch.len(), dim));
            claims.answer(batch, &vectors, dim);
            // Kept as each request is answered: a statement stopped by its budget keeps what
            // it paid for.
            if let (Some(cache), Ok(vectors)) = (cache.filter(|_| call.cache == Mode::On), &vectors)
            {
                for (text, vector) in batch.iter().zip(vectors) {
                    if let Ok(vector) = vector
                        && let Ok(json) = serde_json::to_string(vector)
                    {
                        cache.put_soon(&key_of(text), json, None);
                    }
                }
            }
            Ok::<_, LlmError>((batch, vectors))
        });
        for (batch, vectors) in futures::future::try_join_all(batches).await? {
            match vectors {
                Ok(vectors) => {
                    for (text, vector) in batch.iter().zip(vectors) {
                        found.insert(text, vector);
                    }
                }
                Err(why) => {
                    for text in batch {
                        found.insert(text, Err(why.clone()));
                    }
                }
            }
        }
        for (text, mut answer) in waiting {
            let vector = match answer.wait_for(Option::is_some).await {
                Ok(vector) => vector.clone().unwrap_or(Err(Unanswered::NoAnswer)),
                Err(_) => Err(Unanswered::NotCompleted),
            };
            found.insert(text, vector);
        }
        spend::check(call.ledger, call.options)?;
        Ok(texts
            .iter()
            .map(|t| found.get(t).cloned().unwrap_or(Err(Unanswered::NoAnswer)))
            .collect())
    }
}

/// The `count` vectors of `dim` values an embeddings reply holds, in the order of its inputs
/// (its `data[i].index`), or why it does not.
fn vectors_of(
    raw: &str,
    count: usize,
    dim: usize,
) -> Result<Vec<Result<Vec<f32>, Unanswered>>, Unanswered> {
    let not = |what: &'static str| Unanswered::NotA {
        what,
        reply: excerpt(raw),
    };
    let json: Value = serde_json::from_str(raw).map_err(|_| not("JSON"))?;
    let data = json
        .get("data")
        .and_then(Value::as_array)
        .ok_or_else(|| not("a list of embeddings"))?;
    let mut out: Vec<Result<Vec<f32>, Unanswered>> = vec![Err(Unanswered::NoEmbedding); count];
    for (i, item) in data.iter().enumerate() {
        let index = match item.get("index") {
            None => i,
            Some(index) => index
                .as_u64()
                .map(|n| usize::try_from(n).unwrap_or(usize::MAX))
                .ok_or_else(|| not("one embedding per input, each with its index"))?,
        };
        let Some(slot) = out.get_mut(index) else {
            return Err(not("one embedding per input"));
        };
        let values: Option<Vec<f32>> = item
            .get("embedding")
            .and_then(Value::as_array)
            .and_then(|v| v.iter().map(|x| x.as_f64().map(|x| x as f32)).collect());
        *slot = match values {
            Some(v) if v.iter().any(|x| !x.is_finite()) => {
                Err(Unanswered::NotFloat32(excerpt(&item.to_string())))
            }
            Some(v) if v.len() == dim => Ok(v),
            Some(v) => Err(Unanswered::Dimensions {
                got: v.len(),
                dimensions: dim,
            }),
            None => Err(not("a list of numbers")),
        };
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_embeddings_reply_is_read_by_its_indexes_or_refused() {
        let reply = |items: &str| format!(r#"{{"data": [{items}]}}"#);
        let two = reply(r#"{"index": 1, "embedding": [3, 4]}, {"index": 0, "embedding": [1, 2]}"#);
        let vectors = vectors_of(&two, 2, 2).unwrap();
        assert_eq!(vectors[0], Ok(vec![1.0, 2.0]));
        assert_eq!(vectors[1], Ok(vec![3.0, 4.0]));
        for index in ["2.0", "\"1\"", "-1", "1e30"] {
            let bad = reply(&format!(r#"{{"index": {index}, "embedding": [1, 2]}}"#));
            assert!(vectors_of(&bad, 2, 2).is_err(), "{index}");
        }
        let far = reply(r#"{"index": 7, "embedding": [1, 2]}"#);
        assert!(vectors_of(&far, 2, 2).is_err());
        let huge = reply(r#"{"index": 0, "embedding": [1e39, 2]}"#);
        let vectors = vectors_of(&huge, 1, 2).unwrap();
        assert!(
            vectors[0]
                .as_ref()
                .unwrap_err()
                .to_string()
                .contains("float32"),
            "{vectors:?}"
        );
        let short = reply(r#"{"index": 0, "embedding": [1]}"#);
        let vectors = vectors_of(&short, 1, 2).unwrap();
        assert!(
            vectors[0]
                .as_ref()
                .unwrap_err()
                .to_string()
                .contains("'dimensions' is 2")
        );
    }
}
