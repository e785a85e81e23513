//! `batchinfer refresh VIEW`: a materialized view refreshed once, every so often (`--every`), or
//! as soon as its input files change (`--watch`, looking every `--poll`).
//!
//! One refresh runs at a time: a tick that comes while one is running is skipped, and said so.
//! SIGINT and SIGTERM stop the loop; a refresh in flight is abandoned, which loses nothing: each
//! commit it made is whole, and what it had not committed was never seen
//! ([`crate::storage::Manifests`]). A failed refresh (a storage error, a server down) is
//! reported and tried again with backoff; the loop goes on.

use std::time::{Duration, Instant, SystemTime};

use super::Refreshed;
use crate::error::{Error, Result};
use crate::message::display_error;
use crate::signals::{heed, stop_signal};

/// When a view is refreshed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schedule {
    Once,
    /// A refresh at start, then one each period.
    Every(Duration),
    /// A refresh each poll that finds something new; quiet when nothing changed.
    Watch(Duration),
}

/// The longest wait before a failed refresh is tried again.
const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// Refreshes view `name` (`refresh`) as `schedule` says, printing one summary line per refresh
/// and what `reported` says after each, until it is done (once) or stopped.
pub async fn refresh_view(
    name: &str,
    schedule: Schedule,
    refresh: impl AsyncFn() -> Result<Refreshed>,
    reported: impl AsyncFn(),
) -> Result<()> {
    // One listener for the whole loop: a signal that comes between two waits is not missed.
    let stop = std::pin::pin!(stop_signal());
    let mut stop = Stop(stop);
    let period = match schedule {
        Schedule::Once => {
            let refreshed = stop.until(refresh()).await.map_err(Error::Cancelled)??;
            println!("{}", summary(&refreshed, None));
            reported().await;
            return Ok(());
        }
        Schedule::Every(period) | Schedule::Watch(period) => period,
    };
    let mut failures = 0u32;
    let mut next = Instant::now();
    let mut first = true;
    loop {
        let started = Instant::now();
        let Ok(result) = stop.until(refresh()).await else {
            eprintln!("stopped: the refresh in flight was abandoned; every commit it made stays");
            return Ok(());
        };
        let wait = match result {
            Ok(refreshed) => {
                failures = 0;
                reported().await;
                let skipped = advance(&mut next, period);
                let found = refreshed.new + refreshed.changed + refreshed.removed > 0;
                if first || found || matches!(schedule, Schedule::Every(_)) {
                    println!("{}", summary(&refreshed, Some(next)));
                }
                if skipped > 0 {
                    eprintln!(
                        "skipped {skipped} tick(s): the refresh took {:.1} s, longer than the \
                         {} between ticks",
                        started.elapsed().as_secs_f64(),
                        show_duration(period)
                    );
                }
                next.saturating_duration_since(Instant::now())
            }
            Err(e) => {
                failures += 1;
                let backoff = backoff(failures);
                eprintln!(
                    "refresh of '{name}' failed ({failures} in a row): {}; trying again in {}",
                    display_error(&e),
                    show_duration(backoff)
                );
                next = Instant::now() + backoff;
                backoff
            }
        };
        first = false;
        if stop
            .until(async {
                tokio::time::sleep(wait).await;
                Ok(())
            })
            .await
            .is_err()
        {
            eprintln!("stopped");
            return Ok(());
        }
    }
}

/// Moves `next` to the first tick after now; the ticks skipped on the way.
fn advance(next: &mut Instant, period: Duration) -> u32 {
    let mut skipped = 0;
    *next += period;
    while *next <= Instant::now() {
        *next += period;
        skipped += 1;
    }
    skipped
}

/// The wait after `failures` failed refreshes in a row: 1, 2, 4, ... seconds, whatever the
/// period, so that a poll of a second does not retry a failing store every second.
fn backoff(failures: u32) -> Duration {
    Duration::from_secs(1u64 << (failures - 1).min(16)).min(MAX_BACKOFF)
}

/// The first SIGINT or SIGTERM, listened for from when the loop starts.
struct Stop<F>(std::pin::Pin<F>);

impl<F: std::ops::DerefMut<Target: Future<Output = &'static str>>> Stop<F> {
    /// `work`, unless a stop signal comes first (then it is dropped: abandoned) or stops it
    /// (a model's calls stop between micro-batches at a signal: [`crate::stop`]).
    async fn until<T>(
        &mut self,
        work: impl Future<Output = Result<T>>,
    ) -> std::result::Result<Result<T>, &'static str> {
        let signal = tokio::select! {
            done = work => match done {
                Err(Error::Cancelled(signal)) => signal,
                done => return Ok(done),
            },
            signal = self.0.as_mut() => signal,
        };
        heed();
        crate::storage::discards_done().await;
        Err(signal)
    }
}

/// One line of what a refresh did.
pub fn summary(r: &Refreshed, next: Option<Instant>) -> String {
    let mut line = format!(
        "refresh {}: {} new, {} changed, {} removed input file(s); {} row(s) scored in {:.3} s; \
         the view has {} row(s) from {} file(s)",
        r.view, r.new, r.changed, r.removed, r.rows_scored, r.seconds, r.view_rows, r.view_files
    );
    if r.rebuilt {
        line.push_str("; rebuilt (its query or a model changed)");
    }
    if !r.llm.is_empty() {
        line.push_str("; ");
        line.push_str(&r.llm.described());
    }
    if !r.failed.is_empty() {
        line.push_str(&format!(
            "; {} input file(s) left out for errors (SHOW MATERIALIZED VIEWS lists them)",
            r.failed.len()
        ));
    }
    if let Some(next) = next {
        let at = SystemTime::now() + next.saturating_duration_since(Instant::now());
        line.push_str(&format!("; next at {}", clock(at)));
    }
    line
}

/// `at` as a date and time in UTC: a refresh every 10 days says which day.
fn clock(at: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(at)
        .format("%Y-%m-%d %H:%M:%S UTC")
        .to_string()
}

/// A duration as it was written: `90s`, `15m`, `2h`, `500ms`.
fn show_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// A duration that `--every` or `--debounce` cannot take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DurationError {
    #[error("'{text}' is not a duration such as 30s, 15m, 2h or 1500ms: {reason}")]
    NotADuration { text: String, reason: String },
    #[error("'{0}' must be from 100ms to 366d")]
    OutOfRange(String),
}

/// Parses `500ms`, `30s`, `15m`, `2h`, `1d`, `1h 30m` (humantime's durations; a bare number:
/// seconds); from 100 ms to 366 days.
pub fn parse_duration(text: &str) -> std::result::Result<Duration, DurationError> {
    let text = text.trim();
    let written = match text.bytes().all(|b| b.is_ascii_digit()) && !text.is_empty() {
        true => format!("{text}s"),
        false => text.to_string(),
    };
    let d = humantime::parse_duration(&written).map_err(|e| DurationError::NotADuration {
        text: text.to_string(),
        reason: e.to_string(),
    })?;
    match d {
        d if (Duration::from_millis(100)..=Duration::from_secs(366 * 86_400)).contains(&d) => Ok(d),
        _ => Err(DurationError::OutOfRange(text.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_written() {
        assert_eq!(parse_duration("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert!(parse_duration("0s").is_err());
        assert_eq!(parse_duration("5 minutes"), Ok(Duration::from_secs(300)));
        assert!(parse_duration("5 fortnights").is_err());
        assert!(parse_duration("99999999999999999999d").is_err());
        assert_eq!(show_duration(Duration::from_secs(900)), "15m");
        assert_eq!(
            clock(SystemTime::UNIX_EPOCH + Duration::from_secs(3_723)),
            "1970-01-01 01:02:03 UTC"
        );
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5_400)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1_500)));
        let e = parse_duration("soon").unwrap_err().to_string();
        assert!(e.contains("'soon' is not a duration such as 30s"), "{e}");
    }
}
