//! A video decoded by ffmpeg in a process of its own: its sampled frames as RGB on standard
//! output, and on standard error (by two `showinfo` filters, before and after the `select` that
//! samples) each frame's number, time and size, read by a thread of this process.
//!
//! ffmpeg runs with its own memory limit ([`MEMORY`]), in a process group of its own (a Ctrl-C
//! at the terminal is the statement's to answer), ends when this process does, and is killed
//! when its frames are no longer wanted. It reads the one file opened for it (as a descriptor),
//! and only as a container of video (`-format_whitelist`): a playlist that names other files or
//! URLs is refused.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc;

use parking_lot::Mutex;

use super::{Frame, MOST_PIXELS, Sampling, Unreadable};
use crate::error::{Error, Result};

/// The address space ffmpeg may take (threads' stacks and arenas included).
const MEMORY: u64 = 6 << 30;

/// The containers ffmpeg may read a video from (its demuxers' names).
const CONTAINERS: &str = "mov,mp4,m4a,3gp,3g2,mj2,matroska,webm,avi,mpegts,flv,ivf,mpeg,\
                          mpegvideo,m4v,h264,hevc,obu,asf,ogg,nut,yuv4mpegpipe";

/// The descriptor ffmpeg reads the video from: the file opened (and checked) here, so that
/// ffmpeg reads what was listed, never another file a name leads to by then.
const VIDEO_FD: i32 = 3;

/// The longest line of ffmpeg's log kept whole (the rest of a longer one is skipped).
const LONGEST_LINE: usize = 16 << 10;

/// What ffmpeg's log says of one frame given.
#[derive(Debug)]
struct Given {
    index: u64,
    pts: Option<f64>,
    width: u32,
    height: u32,
}

/// What ffmpeg's log said of errors.
#[derive(Debug, Default)]
struct Log {
    /// Its first error and last three.
    said: Vec<String>,
    /// Whether it could not open the file (as a video it reads).
    unopened: bool,
}

/// The frames of one video, as ffmpeg decodes them.
pub struct Decoder {
    child: Child,
    stdout: ChildStdout,
    given: mpsc::Receiver<Given>,
    /// ffmpeg's errors, for the message of a video that fails.
    errors: Arc<Mutex<Log>>,
    /// Frames given so far, and the number of the last.
    count: u64,
    last: Option<u64>,
    done: bool,
}

impl Decoder {
    /// Starts `ffmpeg` on the video at `path`.
    pub(super) fn start(
        ffmpeg: &Path,
        video: std::fs::File,
        sampling: Sampling,
    ) -> Result<Decoder> {
        use std::os::fd::AsRawFd;
        let mut command = Command::new(ffmpeg);
        command
            .args(["-hide_banner", "-nostdin", "-nostats"])
            .args(["-loglevel", "+level+verbose", "-xerror"])
            .args(["-protocol_whitelist", "fd", "-format_whitelist", CONTAINERS])
            // Frames as they are stored (not turned by the display matrix), as PyAV gives them.
            .args([
                "-max_pixels",
                &MOST_PIXELS.to_string(),
                "-copyts",
                "-noautorotate",
            ])
            .args(["-fd", &VIDEO_FD.to_string(), "-i", "fd:"])
            .args(["-map", "0:v:0", "-an", "-sn", "-dn", "-vf"])
            .arg(format!(
                "showinfo=checksum=0,select='{}',showinfo=checksum=0",
                sampling.select()
            ))
            // Each frame at its own size where the size changes within the video.
            .args([
                "-noautoscale",
                "-fps_mode",
                "passthrough",
                "-pix_fmt",
                "rgb24",
            ])
            .args(["-f", "rawvideo", "pipe:1"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let fd = video.as_raw_fd();
        // SAFETY: between fork and exec only async-signal-safe calls, on valid arguments.
        unsafe {
            use std::os::unix::process::CommandExt;
            command.pre_exec(move || {
                // The video as the descriptor ffmpeg is told of, left open across exec.
                if fd == VIDEO_FD {
                    libc::fcntl(fd, libc::F_SETFD, 0);
                } else if libc::dup2(fd, VIDEO_FD) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let limit = libc::rlimit {
                    rlim_cur: MEMORY,
                    rlim_max: MEMORY,
                };
                libc::setrlimit(libc::RLIMIT_AS, &limit);
                libc::setpgid(0, 0);
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = spawn(&mut command)
            .map_err(|e| Error::io(format!("starting ffmpeg ({})", ffmpeg.display()), e))?;
        // ffmpeg has its own descriptor of the video now.
        drop(video);
        let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
            let _ = child.kill();
            return Err(Error::Library("ffmpeg started without its pipes".into()));
        };
        larger_pipe(&stdout);
        let (send, given) = mpsc::channel();
        let errors = Arc::new(Mutex::new(Log::default()));
        let log_errors = errors.clone();
        std::thread::Builder::new()
            .name("ffmpeg log".into())
            .spawn(move || read_log(stderr, send, &log_errors))
            .map_err(|e| Error::io("starting a thread for ffmpeg's log", e))?;
        Ok(Decoder {
            child,
            stdout,
            given,
            errors,
            count: 0,
            last: None,
            done: false,
        })
    }

    /// The next frame, None after the last; an error ends the frames.
    pub fn next_frame(&mut self) -> Option<std::result::Result<Frame, Unreadable>> {
        if self.done {
            return None;
        }
        let Ok(given) = self.given.recv() else {
            self.done = true;
            return self.ended().err().map(Err);
        };
        if u64::from(given.width) * u64::from(given.height) > MOST_PIXELS {
            self.done = true;
            return Some(Err(Unreadable::TooLarge {
                width: given.width,
                height: given.height,
                most: MOST_PIXELS,
            }));
        }
        let header = format!("P6\n{} {}\n255\n", given.width, given.height);
        let pixels = given.width as usize * given.height as usize * 3;
        let mut image = Vec::with_capacity(header.len() + pixels);
        image.extend_from_slice(header.as_bytes());
        image.resize(header.len() + pixels, 0);
        if let Err(e) = self.stdout.read_exact(&mut image[header.len()..]) {
            self.done = true;
            let why = self
                .ended()
                .err()
                .unwrap_or_else(|| self.damaged(e.to_string()));
            return Some(Err(why));
        }
        self.count += 1;
        self.last = Some(given.index);
        Some(Ok(Frame {
            index: given.index,
            pts: given.pts,
            width: given.width,
            height: given.height,
            image,
        }))
    }

    /// How ffmpeg ended: Ok where it decoded the whole video.
    fn ended(&mut self) -> std::result::Result<(), Unreadable> {
        let status = match self.child.wait() {
            Ok(status) => status,
            Err(e) => return Err(self.damaged(e.to_string())),
        };
        if status.success() {
            return Ok(());
        }
        let (errors, unopened) = {
            let log = self.errors.lock();
            (log.said.clone(), log.unopened)
        };
        let said = errors.join("; ");
        if let Some(signal) = std::os::unix::process::ExitStatusExt::signal(&status) {
            return Err(Unreadable::Stopped(format!(
                "ffmpeg was ended by signal {signal} (from outside batchinfer, or out of \
                 memory){}",
                if said.is_empty() {
                    String::new()
                } else {
                    format!(": {said}")
                }
            )));
        }
        if said.contains("matches no streams") {
            return Err(Unreadable::NoVideo);
        }
        if self.count == 0 && unopened {
            return Err(Unreadable::NotAVideo(opening_error(&errors)));
        }
        if self.count == 0 {
            return Err(Unreadable::Undecodable(if said.is_empty() {
                format!("ffmpeg ended with {status}")
            } else {
                said
            }));
        }
        Err(self.damaged(if said.is_empty() {
            format!("ffmpeg ended with {status}")
        } else {
            said
        }))
    }

    fn damaged(&self, why: String) -> Unreadable {
        Unreadable::Damaged {
            reached: self
                .last
                .map_or_else(|| "none (no frame decoded)".to_string(), |n| n.to_string()),
            given: self.count,
            why,
        }
    }
}

impl Drop for Decoder {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// Starts `command`, again where the program was written a moment ago (another thread's fork
/// may hold it open for writing for as long as it takes to exec).
fn spawn(command: &mut Command) -> std::io::Result<Child> {
    let mut tries = 0;
    loop {
        match command.spawn() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 20 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            other => return other,
        }
    }
}

/// A pipe of 1 MiB: a frame is passed in a few writes, not hundreds.
fn larger_pipe(stdout: &ChildStdout) {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid descriptor; the call fails harmlessly where the size is not allowed.
    unsafe { libc::fcntl(stdout.as_raw_fd(), libc::F_SETPIPE_SZ, 1 << 20) };
}

/// The message of the first error ffmpeg gave opening a file.
fn opening_error(errors: &[String]) -> String {
    errors
        .first()
        .cloned()
        .unwrap_or_else(|| "it is not a video".to_string())
}

/// Reads ffmpeg's log: each frame given is sent, each error kept (the last few).
fn read_log(stderr: std::process::ChildStderr, send: mpsc::Sender<Given>, errors: &Mutex<Log>) {
    let mut reader = BufReader::with_capacity(64 << 10, stderr);
    let mut line = Vec::new();
    // The frames the first showinfo saw (its own count starts again where the filters are
    // set up again, as for a change of size), and the time base of the second.
    let mut decoded: Option<u64> = None;
    let mut time_base: Option<(i64, i64)> = None;
    loop {
        line.clear();
        match read_line(&mut reader, &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let text = String::from_utf8_lossy(&line);
        let text = text.trim_end();
        if text.starts_with("[Parsed_showinfo_0 ") {
            if field(text, " n:").is_some() {
                decoded = Some(decoded.map_or(0, |n| n + 1));
            }
        } else if text.starts_with("[Parsed_showinfo_2 ") {
            if let Some(tb) = text.split("config in time_base: ").nth(1) {
                time_base = tb
                    .split(',')
                    .next()
                    .and_then(|tb| tb.split_once('/'))
                    .and_then(|(a, b)| Some((a.trim().parse().ok()?, b.trim().parse().ok()?)))
                    .filter(|(_, den): &(i64, i64)| *den != 0);
            } else if let (Some(size), Some(index)) = (field(text, " s:"), decoded)
                && field(text, " n:").is_some()
            {
                let Some((width, height)) = size
                    .split_once('x')
                    .and_then(|(w, h)| Some((w.parse().ok()?, h.parse().ok()?)))
                else {
                    continue;
                };
                let pts = field(text, " pts:")
                    .and_then(|p| p.parse::<i64>().ok())
                    .zip(time_base)
                    .map(|(pts, (num, den))| pts as f64 * num as f64 / den as f64);
                if send
                    .send(Given {
                        index,
                        pts,
                        width,
                        height,
                    })
                    .is_err()
                {
                    return;
                }
            }
        } else if let Some(at) = text.find("[error] ").or_else(|| text.find("[fatal] ")) {
            let said = text[at + 8..].trim();
            if said.starts_with("Error opening input") {
                errors.lock().unopened = true;
            }
            let said = said.strip_prefix("Error opening input: ").unwrap_or(said);
            // What ffmpeg says of its own threads and files, after the cause.
            let echo = [
                "Task finished",
                "Terminating thread",
                "Error opening input file",
            ];
            if !said.is_empty() && !echo.iter().any(|e| said.starts_with(e)) {
                let errors = &mut errors.lock().said;
                if errors.len() >= 4 {
                    errors.remove(1);
                }
                errors.push(said.chars().take(300).collect());
            }
        }
    }
}

/// One line of `reader` into `line` (at most [`LONGEST_LINE`] bytes of it kept); 0 at the end.
fn read_line(reader: &mut impl BufRead, line: &mut Vec<u8>) -> std::io::Result<usize> {
    let mut read = 0;
    loop {
        let available = reader.fill_buf()?;
        if available.is_empty() {
            return Ok(read);
        }
        let (part, ended) = match available.iter().position(|b| *b == b'\n') {
            Some(end) => (&available[..end + 1], true),
            None => (available, false),
        };
        let room = LONGEST_LINE.saturating_sub(line.len());
        line.extend_from_slice(&part[..part.len().min(room)]);
        let used = part.len();
        reader.consume(used);
        read += used;
        if ended {
            return Ok(read);
        }
    }
}

/// The value after `key` in a showinfo line (`n:   3` gives `3`).
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let after = &line[line.find(key)? + key.len()..];
    after.split_whitespace().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn showinfo_fields_are_read() {
        let line = "[Parsed_showinfo_2 @ 0x7f] [info] n:  12 pts:  10240 pts_time:0.8 \
                    duration: 512 fmt:yuv420p cl:left sar:1/1 s:640x272 i:P iskey:0 type:P";
        assert_eq!(field(line, " n:"), Some("12"));
        assert_eq!(field(line, " pts:"), Some("10240"));
        assert_eq!(field(line, " s:"), Some("640x272"));
        let mut long = b"x".repeat(LONGEST_LINE * 3);
        long.extend_from_slice(b"\nnext\n");
        let mut reader = std::io::Cursor::new(long);
        let mut line = Vec::new();
        assert_eq!(
            read_line(&mut reader, &mut line).unwrap(),
            LONGEST_LINE * 3 + 1
        );
        assert_eq!(line.len(), LONGEST_LINE);
        line.clear();
        read_line(&mut reader, &mut line).unwrap();
        assert_eq!(line, b"next\n");
    }
}
