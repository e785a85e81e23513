//! Pacing an endpoint model's requests: `requests_per_minute` and `tokens_per_minute` as token
//! buckets holding at most one second's worth (a burst of rate/60), and a pause of the whole
//! model that a 429, a `Retry-After` or a server's `x-ratelimit-*` headers ask for. Shared by
//! every request of the model in the process.

use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// One bucket: `level` units now, refilled at `rate` per second up to `capacity`.
#[derive(Debug)]
struct Bucket {
    rate: f64,
    capacity: f64,
    level: f64,
    at: Instant,
}

impl Bucket {
    fn per_minute(rate: f64) -> Bucket {
        let capacity = (rate / 60.0).max(1.0);
        Bucket {
            rate: rate / 60.0,
            capacity,
            level: capacity,
            at: Instant::now(),
        }
    }

    fn refill(&mut self, now: Instant) {
        let seconds = now.saturating_duration_since(self.at).as_secs_f64();
        self.level = (self.level + seconds * self.rate).min(self.capacity);
        self.at = now;
    }

    /// How long until `need` may be taken (a need past the capacity waits for a full bucket,
    /// and leaves it below zero).
    fn wait_for(&self, need: f64) -> Duration {
        let need = need.min(self.capacity);
        if self.level >= need {
            Duration::ZERO
        } else {
            // A day at most, whatever the rate.
            Duration::from_secs_f64(((need - self.level) / self.rate).min(86_400.0))
        }
    }
}

#[derive(Debug)]
struct State {
    requests: Option<Bucket>,
    tokens: Option<Bucket>,
    paused_until: Option<Instant>,
}

/// The longest a server's word holds the model: a rate-limit window is a minute.
const MAX_PAUSE: Duration = Duration::from_secs(60);

/// The pace of one endpoint model.
#[derive(Debug)]
pub struct Pace {
    state: Mutex<State>,
}

impl Pace {
    pub fn new(requests_per_minute: Option<f64>, tokens_per_minute: Option<f64>) -> Pace {
        Pace {
            state: Mutex::new(State {
                requests: requests_per_minute.map(Bucket::per_minute),
                tokens: tokens_per_minute.map(Bucket::per_minute),
                paused_until: None,
            }),
        }
    }

    fn state(&self) -> parking_lot::MutexGuard<'_, State> {
        self.state.lock()
    }

    /// Waits until one request reserving `tokens` may go, and takes them.
    pub async fn take(&self, tokens: f64) {
        loop {
            let wait = {
                let mut state = self.state();
                let now = Instant::now();
                let paused = state
                    .paused_until
                    .map_or(Duration::ZERO, |until| until.saturating_duration_since(now));
                let mut wait = paused;
                if let Some(bucket) = state.requests.as_mut() {
                    bucket.refill(now);
                    wait = wait.max(bucket.wait_for(1.0));
                }
                if let Some(bucket) = state.tokens.as_mut() {
                    bucket.refill(now);
                    wait = wait.max(bucket.wait_for(tokens));
                }
                if wait.is_zero() {
                    if let Some(bucket) = state.requests.as_mut() {
                        bucket.level -= 1.0;
                    }
                    if let Some(bucket) = state.tokens.as_mut() {
                        bucket.level -= tokens;
                    }
                    return;
                }
                wait
            };
            tokio::time::sleep(wait.max(Duration::from_millis(1))).await;
        }
    }

    /// A request that reserved `reserved` tokens used `used`: the difference given back, or
    /// taken.
    pub fn settle(&self, reserved: f64, used: f64) {
        let mut state = self.state();
        if let Some(bucket) = state.tokens.as_mut() {
            bucket.refill(Instant::now());
            bucket.level = (bucket.level + reserved - used).min(bucket.capacity);
        }
    }

    /// Holds every request of the model for `how_long` (a 429, a reset the server announced).
    pub fn pause(&self, how_long: Duration) {
        let until = Instant::now() + how_long.min(MAX_PAUSE);
        let mut state = self.state();
        if state.paused_until.is_none_or(|before| before < until) {
            state.paused_until = Some(until);
        }
    }
}

/// A duration as rate-limit headers give it: `Retry-After: 7` (seconds), `x-ratelimit-reset-*:
/// 1s`, `6m0s`, `20ms`, `0.5s`.
pub fn header_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    // Past a day is taken as a day: a server's number is not trusted to fit a duration.
    const DAY: f64 = 86_400.0;
    if let Ok(seconds) = text.parse::<f64>() {
        return (seconds.is_finite() && seconds >= 0.0)
            .then(|| Duration::from_secs_f64(seconds.min(DAY)));
    }
    let mut total = 0.0;
    let mut number = String::new();
    let mut chars = text.chars().peekable();
    let mut any = false;
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() || c == '.' {
            number.push(c);
            continue;
        }
        let value: f64 = number.parse().ok()?;
        number.clear();
        let unit = match c {
            'h' => 3600.0,
            'm' if chars.peek() == Some(&'s') => {
                chars.next();
                0.001
            }
            'm' => 60.0,
            's' => 1.0,
            _ => return None,
        };
        total += value * unit;
        any = true;
    }
    (any && number.is_empty() && total.is_finite()).then(|| Duration::from_secs_f64(total.min(DAY)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_durations() {
        assert_eq!(header_duration("7"), Some(Duration::from_secs(7)));
        assert_eq!(header_duration("1s"), Some(Duration::from_secs(1)));
        assert_eq!(header_duration("6m0s"), Some(Duration::from_secs(360)));
        assert_eq!(header_duration("20ms"), Some(Duration::from_millis(20)));
        assert_eq!(header_duration("0.5s"), Some(Duration::from_millis(500)));
        assert_eq!(header_duration("soon"), None);
        assert_eq!(header_duration("5x"), None);
        assert_eq!(header_duration("-1"), None);
        assert_eq!(header_duration("1e300"), Some(Duration::from_secs(86_400)));
        assert_eq!(
            header_duration("99999999999999h"),
            Some(Duration::from_secs(86_400))
        );
        assert_eq!(header_duration("NaN"), None);
    }

    #[tokio::test]
    async fn a_bucket_holds_one_seconds_worth() {
        let pace = Pace::new(Some(600.0), None);
        let start = Instant::now();
        for _ in 0..30 {
            pace.take(0.0).await;
        }
        // Ten at once, then ten a second: 20 more take 2 s.
        let waited = start.elapsed().as_secs_f64();
        assert!((1.8..=2.6).contains(&waited), "{waited}");
    }
}
