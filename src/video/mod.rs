//! Video as frames, for `read_frames` ([`crate::blob`]): a video decoded by ffmpeg (the static
//! build the PyPI wheel imageio-ffmpeg ships, fetched and pinned as ONNX Runtime is:
//! `ffmpeg.rs`) in a process of its own, one frame at a time (`decoder.rs`), sampled as the
//! statement asks ([`Sampling`]). Each frame comes as an image `predict` reads as it reads a
//! photo: PPM, its RGB pixels behind a header of a few bytes, never re-encoded.
//!
//! A video ffmpeg cannot open, or one that is damaged part of the way through, is the file's
//! [`Unreadable`]: its frames decoded before the damage are kept, and the error names the frame
//! it reached. A frame larger than [`MOST_PIXELS`] is refused by the decoder from the stream's
//! header, before it is decoded.

mod decoder;
mod ffmpeg;

pub use decoder::Decoder;

/// The most pixels of a frame: 8K (8192 x 4320) and a little more.
pub const MOST_PIXELS: u64 = 8192 * 4352;

/// Which frames of a video `read_frames` gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Sampling {
    /// Every frame.
    All,
    /// Frames 0, n, 2n, ...
    Every(u64),
    /// The first frame at or after each multiple of 1/fps seconds (fps in thousandths).
    Fps { millis: u64 },
    /// The key frames (I-frames) alone.
    Keyframes,
}

impl Sampling {
    /// The sampling an argument of `read_frames` names: `'fps=2'` (or a number alone),
    /// `'every_n_frames=30'`, `'keyframes_only'` or `'all'`.
    pub fn parse(text: &str) -> Result<Sampling, String> {
        let text = text.trim();
        let usage = "read_frames takes 'fps=N' (or N alone: frames a second), \
                     'every_n_frames=N', 'keyframes_only' or 'all'";
        let (key, value) = match text.split_once('=') {
            Some((k, v)) => (k.trim().to_ascii_lowercase(), Some(v.trim())),
            None if text.parse::<f64>().is_ok() => ("fps".to_string(), Some(text)),
            None => (text.to_ascii_lowercase(), None),
        };
        match (key.as_str(), value) {
            ("all", None) => Ok(Sampling::All),
            ("keyframes_only" | "keyframes", None) => Ok(Sampling::Keyframes),
            ("every_n_frames", Some(v)) => match v.parse::<u64>() {
                Ok(n) if n >= 1 => Ok(if n == 1 {
                    Sampling::All
                } else {
                    Sampling::Every(n)
                }),
                _ => Err(format!(
                    "every_n_frames is a whole number of at least 1, not '{v}'"
                )),
            },
            ("fps", Some(v)) => match v.parse::<f64>() {
                Ok(fps) if fps.is_finite() && (0.001..=1000.0).contains(&fps) => {
                    Ok(Sampling::Fps {
                        millis: (fps * 1000.0).round() as u64,
                    })
                }
                _ => Err(format!(
                    "fps is a number of frames a second from 0.001 to 1000, not '{v}'"
                )),
            },
            _ => Err(format!("{usage}, not '{text}'")),
        }
    }

    /// ffmpeg's `select` expression for it (commas escaped for a filter graph).
    fn select(self) -> String {
        match self {
            Sampling::All => "1".to_string(),
            Sampling::Every(n) => format!("not(mod(n\\,{n}))"),
            Sampling::Fps { millis } => {
                let fps = format!("{}/1000", millis);
                format!("isnan(prev_selected_t)+gt(floor(t*{fps})\\,floor(prev_selected_t*{fps}))")
            }
            Sampling::Keyframes => "eq(key\\,1)".to_string(),
        }
    }

    /// As `read_frames` is given it.
    pub fn shown(self) -> String {
        match self {
            Sampling::All => "all".to_string(),
            Sampling::Every(n) => format!("every_n_frames={n}"),
            Sampling::Fps { millis } => format!("fps={}", millis as f64 / 1000.0),
            Sampling::Keyframes => "keyframes_only".to_string(),
        }
    }
}

/// One frame of a video.
#[derive(Debug, Clone)]
pub struct Frame {
    /// Its number in the video, from 0, counting every frame decoded.
    pub index: u64,
    /// Its presentation time in seconds, as the container gives it (None where it gives none).
    pub pts: Option<f64>,
    pub width: u32,
    pub height: u32,
    /// The frame as PPM (P6): `P6\n<width> <height>\n255\n`, then its RGB pixels.
    pub image: Vec<u8>,
}

/// Why a video's frames cannot all be read: the file's own error.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Unreadable {
    #[error("ffmpeg cannot read it as a video: {0}")]
    NotAVideo(String),
    #[error("it has no video stream")]
    NoVideo,
    #[error("ffmpeg cannot decode its frames: {0}")]
    Undecodable(String),
    #[error("it is empty (0 bytes)")]
    Empty,
    #[error("it is damaged or cut short after frame {reached} ({given} frames given): {why}")]
    Damaged {
        /// The number of the last frame decoded (None: none was).
        reached: String,
        given: u64,
        why: String,
    },
    #[error("its frames are {width}x{height}, more than the {most} pixels a frame may have")]
    TooLarge { width: u32, height: u32, most: u64 },
    /// ffmpeg was ended from outside: the statement's error, not the file's.
    #[error("{0}")]
    Stopped(String),
}

/// The frames of the video `file` (opened for reading), decoded by ffmpeg in a process of its
/// own.
pub fn frames(file: std::fs::File, sampling: Sampling) -> crate::error::Result<Decoder> {
    Decoder::start(&ffmpeg::binary()?, file, sampling)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samplings_are_read_from_their_words() {
        assert_eq!(Sampling::parse("fps=2"), Ok(Sampling::Fps { millis: 2000 }));
        assert_eq!(Sampling::parse("0.5"), Ok(Sampling::Fps { millis: 500 }));
        assert_eq!(
            Sampling::parse("every_n_frames = 25"),
            Ok(Sampling::Every(25))
        );
        assert_eq!(Sampling::parse("every_n_frames=1"), Ok(Sampling::All));
        assert_eq!(Sampling::parse("KEYFRAMES_ONLY"), Ok(Sampling::Keyframes));
        // Nothing but a number reaches ffmpeg's filter graph: no filter, option or path.
        for bad in [
            "fps=0",
            "fps=-1",
            "fps=NaN",
            "fps=inf",
            "fps=1e300",
            "every_n_frames=0",
            "every_n_frames=-3",
            "sometimes",
            "fps",
            "fps=1,scale=2:2",
            "every_n_frames=2',movie=/etc/passwd",
            "fps=1\nshowinfo",
        ] {
            assert!(Sampling::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(Sampling::Fps { millis: 500 }.shown(), "fps=0.5");
    }
}
