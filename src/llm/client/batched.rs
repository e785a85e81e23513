//! A request in batch mode ([`crate::llm::batch`]): submitted with those asked at once, its
//! answer awaited (for at most `batchinfer.llm_batch_wait`), charged at the batch price.

use super::*;
use crate::llm::batch::{Answer, Place, Progress, SUBMISSIONS, api::Provider};

impl EndpointModel {
    /// Whether the requests of `call` go to the provider's Batch API: the statement's
    /// `batchinfer.llm_batch`, else the definition's `batch`. Batch mode keeps its batches and
    /// their answers in the warehouse's cache: without one it is refused.
    pub fn batch_mode(&self, call: &Call<'_>) -> Result<bool, LlmError> {
        let on = call
            .options
            .and_then(|o| o.llm_batch)
            .or(self.endpoint.batch)
            .unwrap_or(false);
        if !on || self.endpoint.kind != crate::llm::Kind::Chat {
            return Ok(false);
        }
        if call.on_cluster {
            return Err(LlmError::Request {
                model: self.name.clone(),
                problem: "batch mode runs in one process, not on a cluster (--remote): run the \
                          statement without --remote, or SET batchinfer.llm_batch = 'off'"
                    .into(),
            });
        }
        if self.cache.is_none() || call.cache != Mode::On {
            return Err(LlmError::Request {
                model: self.name.clone(),
                problem: "batch mode keeps its batches and their answers in the warehouse's LLM \
                          cache: run it with a warehouse and batchinfer.cache = 'on' (or SET \
                          batchinfer.llm_batch = 'off')"
                    .into(),
            });
        }
        Ok(true)
    }

    /// The answer to `body` (cache key `key`) from a batch: the reply's body, or why the row has
    /// none. `Err`: the statement stops (its budget, no key, its wait past
    /// `batchinfer.llm_batch_wait`).
    pub(super) async fn batched(
        &self,
        call: &Call<'_>,
        key: &str,
        body: &Value,
    ) -> Result<Result<String, Unanswered>, LlmError> {
        let Some(cache) = self.cache.clone() else {
            return Err(LlmError::Call("batch mode without a cache".into()));
        };
        let api_key = self.api_key()?;
        let place = Place {
            provider: Provider {
                http: self.http.clone(),
                base: self.endpoint.endpoint.clone(),
                api_key: api_key.clone(),
            },
            records: cache.batch_records(&self.endpoint.endpoint, &self.endpoint.model),
            cache: cache.clone(),
            endpoint: self.endpoint.endpoint.clone(),
        };
        let wait = call
            .options
            .and_then(|o| o.llm_batch_wait)
            .map(Duration::from_secs_f64);
        // The batches that ended since the statement began (or before this process), taken
        // now: the statement pays for those nobody was waiting for.
        let taken = self
            .batches
            .resume(&place, call.statement)
            .await
            .map_err(|why| LlmError::Request {
                model: self.name.clone(),
                problem: format!("{why}: nothing is submitted until they can be"),
            })?;
        for (_, raw) in taken {
            self.charge_batched(call, None, &raw);
        }
        // At most what the request costs, held against the statement's budgets from its
        // submission (it is paid whatever the statement does next) until it is charged.
        let (input, output) = self.endpoint.batch_prices();
        let (prompt, _) = self
            .calibrated_prompt_tokens(self.prompt_estimate(body))
            .await;
        let most = u64::from(self.endpoint.max_tokens);
        let _reserved = spend::reserve(
            call.ledger,
            call.options,
            prompt + most,
            (prompt as f64 * input + most as f64 * output) / 1e6,
        )?;
        // Submitted and not answered: in flight, as the statement's budget says when it stops.
        let _in_flight = spend::sending(call.ledger);
        let mut last = String::new();
        for _ in 0..SUBMISSIONS {
            spend::check(call.ledger, call.options)?;
            if let Some(raw) = cache.get(key).await {
                if self.batches.take_uncharged(key) {
                    self.charge_batched(call, Some(body), &raw);
                } else {
                    self.count(call, &Usage::cache_hit());
                }
                return Ok(Ok(raw));
            }
            let mut progress = self.batches.progress(&place, key, body);
            // A statement never stops before its requests are in a batch.
            let submitted = progress
                .wait_for(|p| !matches!(p, Progress::Queued))
                .await
                .map(|p| p.clone());
            let done = match submitted {
                Ok(Progress::Submitted(batch)) => {
                    let until = progress.wait_for(|p| matches!(p, Progress::Done(_)));
                    let ended = match wait {
                        None => until.await.map(|p| p.clone()),
                        Some(wait) => match tokio::time::timeout(wait, until).await {
                            Ok(ended) => ended.map(|p| p.clone()),
                            Err(_) => {
                                return Err(LlmError::Request {
                                    model: self.name.clone(),
                                    problem: format!(
                                        "its batch {batch} has not ended within \
                                         batchinfer.llm_batch_wait = '{}': the statement stops \
                                         and writes nothing; the batch goes on at the endpoint, \
                                         and the statement run again takes its answers without \
                                         submitting its requests again",
                                        humantime::format_duration(wait)
                                    ),
                                });
                            }
                        },
                    };
                    ended.ok()
                }
                other => other.ok(),
            };
            match done {
                Some(Progress::Done(Answer::Reply(raw))) => {
                    self.charge_batched(call, Some(body), &raw);
                    return Ok(Ok(raw));
                }
                Some(Progress::Done(Answer::Stop(why))) => {
                    return Err(LlmError::Request {
                        model: self.name.clone(),
                        problem: why,
                    });
                }
                Some(Progress::Done(Answer::Again(why))) => last = why,
                Some(Progress::Done(Answer::Failed(why))) => {
                    return Ok(Err(Unanswered::Failed(why)));
                }
                _ => {
                    return Err(LlmError::Request {
                        model: self.name.clone(),
                        problem: "the task following its batch ended without an answer: the \
                                  statement stops, and its batch (recorded) is read again by the \
                                  next"
                            .into(),
                    });
                }
            }
        }
        Ok(Err(Unanswered::Failed(format!(
            "{last} (submitted {SUBMISSIONS} times)"
        ))))
    }

    /// The keys of the requests the warehouse's records say are in batches (submitted, not yet
    /// taken), read without changing anything; none where the model has no cache.
    pub async fn recorded_batch_keys(&self) -> std::collections::HashSet<String> {
        let Some(cache) = &self.cache else {
            return Default::default();
        };
        let records = cache.batch_records(&self.endpoint.endpoint, &self.endpoint.model);
        records
            .all()
            .await
            .unwrap_or_default()
            .into_iter()
            .flat_map(|r| r.keys)
            .collect()
    }

    /// The claim of the request `key` ([`Cache::claim`]); in batch mode, waited for no longer
    /// than the statement waits for its batches (another process's batch may take hours).
    pub(super) async fn claimed(
        &self,
        call: &Call<'_>,
        cache: &Cache,
        key: &str,
        batch: bool,
    ) -> Result<cache::Claim, LlmError> {
        let wait = call
            .options
            .and_then(|o| o.llm_batch_wait)
            .map(Duration::from_secs_f64)
            .filter(|_| batch);
        let Some(wait) = wait else {
            return Ok(cache.claim(key).await);
        };
        // Taking a claim no one holds takes a moment: never less than that.
        let wait = wait.max(Duration::from_secs(5));
        tokio::time::timeout(wait, cache.claim(key))
            .await
            .map_err(|_| LlmError::Request {
                model: self.name.clone(),
                problem: format!(
                    "another process is asking the same requests (in its batch) and has not been \
                     answered within batchinfer.llm_batch_wait = '{}': the statement stops and \
                     writes nothing; run it again later",
                    humantime::format_duration(wait)
                ),
            })
    }

    /// A batch's reply charged to the statement at the batch prices.
    /// `body`: the request, where this statement has it (None: an answer it collected for
    /// another), whose estimate the calibration learns from.
    pub(super) fn charge_batched(&self, call: &Call<'_>, body: Option<&Value>, raw: &str) {
        let estimated = body.map_or(0, |b| self.prompt_estimate(b));
        let (prompt, completion) = match Reply::parse(raw.to_string()) {
            Ok(reply) if !reply.estimated => {
                if body.is_some() {
                    self.calibrate(call, estimated, reply.prompt_tokens);
                }
                (reply.prompt_tokens, reply.completion_tokens)
            }
            Ok(reply) => (estimated + 1, reply.completion_tokens),
            Err(_) => (estimated + 1, raw.len() as u64 / 4),
        };
        let (input, output) = self.endpoint.batch_prices();
        self.count(
            call,
            &Usage {
                requests: 1,
                prompt_tokens: prompt,
                completion_tokens: completion,
                cost: (prompt as f64 * input + completion as f64 * output) / 1e6,
                ..Usage::default()
            },
        );
    }
}
