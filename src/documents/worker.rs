//! PDFs read in worker processes: pdfium is a large C++ library over hostile input, and a PDF
//! can make it allocate without bound (forms that draw each other, streams that inflate to
//! gigabytes) or abort. Each worker is this program started again ([`serve`]), one per core,
//! each under a memory limit; a worker that dies or overruns fails the document it read, as
//! that file's error, and the next document starts another. The statement, a view's refresh and
//! a server go on.
//!
//! A program that can start its workers says how once ([`started_by`]): the command line, the
//! server and Python do. Without that (a program embedding the library), PDFs are read within
//! the process.
//!
//! The protocol, over the worker's standard input and output: a request is the header's five
//! little-endian u64s (the first page and the end of the run of pages asked for, the most pages
//! and the most text a document may have, the PDF's length) and the PDF; the answer is a u64
//! length and that many bytes of JSON: the document's pages and the run's text, or why not.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::ops::Range;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::{Page, Unreadable};

/// The address space a worker may have: pdfium's own, the document's and its text.
pub const WORKER_MEMORY: u64 = 2 << 30;

/// How long a worker may take over a run of pages: this, and [`PAGE_TIME`] a page.
const RUN_TIME: Duration = Duration::from_secs(30);

/// How long a worker may take a page, on average over a run.
const PAGE_TIME: Duration = Duration::from_secs(1);

/// How long a document may take, all its runs together.
const DOCUMENT_TIME: Duration = Duration::from_secs(600);

/// The pages a worker reads of a document, at the least, where others are free.
const RUN: usize = 32;

/// The most workers: one per core, up to this.
const MOST_WORKERS: usize = 16;

/// What a worker answers: the document's pages, and the text of those asked for.
type Answer = Result<(usize, Vec<Page>), Unreadable>;

/// Per process: how this program starts a worker (set once, at its start), and its workers.
static COMMAND: Mutex<Option<Vec<OsString>>> = Mutex::new(None);
static WORKERS: Mutex<Option<Arc<Workers>>> = Mutex::new(None);

/// Says how this program starts a PDF worker: a program and its arguments that end in
/// [`serve`]. Called once, at the program's start.
pub fn started_by(command: Vec<OsString>) {
    *COMMAND.lock() = Some(command);
}

/// Stops this process's workers and waits for them: at its end, so that what they used is
/// counted as the program's.
pub fn stop() {
    let Some(workers) = WORKERS.lock().take() else {
        return;
    };
    for slot in &workers.slots {
        slot.lock().take();
    }
}

/// The pages of the PDF `bytes`, read by workers where this program starts them (several at
/// once for a long document), else within the process.
pub(super) fn pages(
    bytes: &[u8],
    most_pages: usize,
    most_text: usize,
) -> crate::error::Result<Result<Vec<Page>, Unreadable>> {
    let Some(command) = COMMAND.lock().clone() else {
        let read = super::pdfium::pdfium()?.run(bytes, 0..usize::MAX, most_pages, most_text);
        return Ok(read.map(|(_, pages)| pages));
    };
    let workers = {
        let mut workers = WORKERS.lock();
        match workers.as_ref() {
            Some(workers) => workers.clone(),
            None => {
                // pdfium is fetched and checked here, once, before a worker loads it.
                let library = super::pdfium::library()?;
                workers
                    .insert(Arc::new(Workers::new(command, library)))
                    .clone()
            }
        }
    };
    workers.pages(bytes, most_pages, most_text)
}

/// The workers of this process, started when first needed.
struct Workers {
    command: Vec<OsString>,
    library: std::path::PathBuf,
    slots: Vec<Mutex<Option<Worker>>>,
    next: AtomicUsize,
}

/// A worker process, its pipes.
struct Worker {
    child: Child,
    input: ChildStdin,
    output: ChildStdout,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Workers {
    fn new(command: Vec<OsString>, library: std::path::PathBuf) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Workers {
            command,
            library,
            slots: (0..cores.clamp(1, MOST_WORKERS))
                .map(|_| Mutex::new(None))
                .collect(),
            next: AtomicUsize::new(0),
        }
    }

    /// The first slot free, or (all busy) the next in turn, once it is.
    fn slot(&self) -> parking_lot::MutexGuard<'_, Option<Worker>> {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let n = self.slots.len();
        (0..n)
            .find_map(|k| self.slots[(start + k) % n].try_lock())
            .unwrap_or_else(|| self.slots[start % n].lock())
    }

    fn pages(
        &self,
        bytes: &[u8],
        most_pages: usize,
        most_text: usize,
    ) -> crate::error::Result<Result<Vec<Page>, Unreadable>> {
        let deadline = Instant::now() + DOCUMENT_TIME;
        let mut first = self.slot();
        let asked = Asked {
            bytes,
            most_pages,
            most_text,
            deadline,
        };
        let (count, mut pages) = match self.ask(&mut first, &asked, 0..RUN)? {
            Ok(answer) => answer,
            Err(why) => return Ok(Err(why)),
        };
        if count <= RUN {
            return Ok(Ok(pages));
        }
        // Workers free now help, each a run of the rest; none is waited for (one another
        // document holds may wait for this one's).
        let wanted = (count - RUN)
            .div_ceil(RUN)
            .min(self.slots.len())
            .saturating_sub(1);
        let mut helpers: Vec<_> = self
            .slots
            .iter()
            .filter_map(|slot| slot.try_lock())
            .take(wanted)
            .collect();
        let runs = helpers.len() + 1;
        let run =
            |k: usize| (RUN + (count - RUN) * k / runs)..(RUN + (count - RUN) * (k + 1) / runs);
        let answers: Vec<crate::error::Result<Answer>> = std::thread::scope(|scope| {
            let others: Vec<_> = helpers
                .iter_mut()
                .enumerate()
                .map(|(k, helper)| {
                    let helper: &mut Option<Worker> = helper;
                    let asked = &asked;
                    scope.spawn(move || self.ask(helper, asked, run(k + 1)))
                })
                .collect();
            let mut answers = vec![self.ask(&mut first, &asked, run(0))];
            answers.extend(others.into_iter().map(|other| {
                other.join().unwrap_or_else(|_| {
                    Err(crate::error::Error::Internal(
                        "a thread asking a PDF worker panicked".into(),
                    ))
                })
            }));
            answers
        });
        let mut total: usize = pages.iter().map(|p| p.text.len()).sum();
        for answer in answers {
            match answer? {
                Ok((_, part)) => {
                    total += part.iter().map(|p| p.text.len()).sum::<usize>();
                    if total > most_text {
                        return Ok(Err(Unreadable::TooLarge { most: most_text }));
                    }
                    pages.extend(part);
                }
                Err(why) => return Ok(Err(why)),
            }
        }
        Ok(Ok(pages))
    }

    /// The pages `run` of the document `asked`, asked of the worker in `slot` (started where
    /// there is none): `Err` where no worker can be started or one was stopped from outside
    /// (killed: the statement may be run again), the file's own error where the worker failed
    /// on it (it is then stopped, and the next request starts another).
    fn ask(
        &self,
        slot: &mut Option<Worker>,
        asked: &Asked<'_>,
        run: Range<usize>,
    ) -> crate::error::Result<Answer> {
        if slot.is_none() {
            *slot = Some(self.start()?);
        }
        let worker = slot.as_mut().expect("started");
        let pages = u32::try_from(run.len()).unwrap_or(u32::MAX);
        let deadline =
            (Instant::now() + RUN_TIME + PAGE_TIME.saturating_mul(pages)).min(asked.deadline);
        match exchange(worker, asked, run, deadline) {
            Ok(answer) => Ok(answer),
            Err(failure) => {
                // Whatever it was doing, it is done: the next request starts another.
                let signal = slot.take().and_then(|mut worker| {
                    let _ = worker.child.kill();
                    let status = worker.child.wait().ok()?;
                    std::os::unix::process::ExitStatusExt::signal(&status)
                });
                match failure {
                    Failure::Late => Ok(Err(Unreadable::Damaged(format!(
                        "pdfium took too long over it, and was stopped (a document may take \
                         {} s, a run of its pages {} s and {} s a page)",
                        DOCUMENT_TIME.as_secs(),
                        RUN_TIME.as_secs(),
                        PAGE_TIME.as_secs()
                    )))),
                    // Killed or stopped from outside (the system short of memory, a person):
                    // no fault of the file's.
                    Failure::Died(_)
                        if matches!(
                            signal,
                            Some(libc::SIGKILL | libc::SIGTERM | libc::SIGINT | libc::SIGHUP)
                        ) =>
                    {
                        Err(crate::error::Error::Library(format!(
                            "pdfium: a worker reading PDFs was ended from outside (signal {}); \
                             run the statement again",
                            signal.unwrap_or_default()
                        )))
                    }
                    Failure::Died(_) => Ok(Err(Unreadable::Damaged(format!(
                        "pdfium failed on it: it needed more than {} MiB of memory, or crashed{}",
                        WORKER_MEMORY >> 20,
                        signal
                            .map(|signal| format!(" (signal {signal})"))
                            .unwrap_or_default()
                    )))),
                }
            }
        }
    }

    fn start(&self) -> crate::error::Result<Worker> {
        let failed = |e: std::io::Error| {
            crate::error::Error::Library(format!(
                "pdfium: a worker process to read PDFs cannot be started ({}): {e}",
                self.command[0].to_string_lossy()
            ))
        };
        let mut child = Command::new(&self.command[0])
            .args(&self.command[1..])
            .env(LIBRARY_VARIABLE, &self.library)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(failed)?;
        let (input, output) = (child.stdin.take(), child.stdout.take());
        if let Some(input) = &input {
            use std::os::fd::AsRawFd;
            // Writes that would block wait in `poll`, by a deadline ([`write_by`]).
            // SAFETY: flags of a pipe this process owns.
            unsafe {
                let fd = input.as_raw_fd();
                let flags = libc::fcntl(fd, libc::F_GETFL);
                libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
            }
        }
        match (input, output) {
            (Some(input), Some(output)) => Ok(Worker {
                child,
                input,
                output,
            }),
            _ => Err(failed(std::io::Error::other("its pipes are missing"))),
        }
    }
}

/// A document asked of workers, and by when it must be read.
struct Asked<'a> {
    bytes: &'a [u8],
    most_pages: usize,
    most_text: usize,
    deadline: Instant,
}

/// The variable that gives a worker the checked library's path.
const LIBRARY_VARIABLE: &str = "BATCHINFER_PDFIUM_LIBRARY";

/// Why a worker gave no answer.
enum Failure {
    Late,
    Died(#[allow(dead_code)] String),
}

/// One request to `worker`, and its answer, by `deadline`.
fn exchange(
    worker: &mut Worker,
    asked: &Asked<'_>,
    run: Range<usize>,
    deadline: Instant,
) -> Result<Answer, Failure> {
    let header = [
        run.start,
        run.end,
        asked.most_pages,
        asked.most_text,
        asked.bytes.len(),
    ]
    .map(|n| (n as u64).to_le_bytes())
    .concat();
    write_by(&mut worker.input, &header, deadline)?;
    write_by(&mut worker.input, asked.bytes, deadline)?;
    let mut length = [0u8; 8];
    read_by(&mut worker.output, &mut length, deadline)?;
    let length = u64::from_le_bytes(length);
    // An answer is the run's text, at most the document's, as JSON (escaped, up to 6 bytes a
    // byte).
    if length
        > (asked.most_text as u64)
            .saturating_mul(6)
            .saturating_add(1 << 20)
    {
        return Err(Failure::Died(format!("it answered {length} bytes")));
    }
    let mut answer = vec![0u8; length as usize];
    read_by(&mut worker.output, &mut answer, deadline)?;
    serde_json::from_slice(&answer).map_err(|e| Failure::Died(e.to_string()))
}

/// Waits until `fd` is ready for `events`, before `deadline`.
fn ready(fd: std::os::fd::RawFd, events: libc::c_short, deadline: Instant) -> Result<(), Failure> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Failure::Late);
        }
        let mut poll = libc::pollfd {
            fd,
            events,
            revents: 0,
        };
        // SAFETY: one pollfd, of a pipe the worker's handle owns, for the call's length.
        let ready = unsafe { libc::poll(&mut poll, 1, c_int_millis(left)) };
        if ready < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(Failure::Died(e.to_string()));
        }
        if ready > 0 {
            return Ok(());
        }
    }
}

/// Writes `bytes` to `input` (whose pipe does not block) before `deadline`.
fn write_by(input: &mut ChildStdin, bytes: &[u8], deadline: Instant) -> Result<(), Failure> {
    use std::os::fd::AsRawFd;
    let mut written = 0;
    while written < bytes.len() {
        ready(input.as_raw_fd(), libc::POLLOUT, deadline)?;
        match input.write(&bytes[written..]) {
            Ok(0) => return Err(Failure::Died("its input closed".into())),
            Ok(n) => written += n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock
                ) => {}
            Err(e) => return Err(Failure::Died(e.to_string())),
        }
    }
    Ok(())
}

/// Fills `buffer` from `output` before `deadline`.
fn read_by(output: &mut ChildStdout, buffer: &mut [u8], deadline: Instant) -> Result<(), Failure> {
    use std::os::fd::AsRawFd;
    let mut filled = 0;
    while filled < buffer.len() {
        ready(output.as_raw_fd(), libc::POLLIN, deadline)?;
        match output.read(&mut buffer[filled..]) {
            Ok(0) => return Err(Failure::Died("it ended".into())),
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Failure::Died(e.to_string())),
        }
    }
    Ok(())
}

fn c_int_millis(d: Duration) -> libc::c_int {
    libc::c_int::try_from(d.as_millis().max(1)).unwrap_or(libc::c_int::MAX)
}

/// A worker: reads requests from standard input and answers on standard output until its
/// input ends, under the memory limit [`WORKER_MEMORY`]. The program that started it gave it
/// the checked library.
pub fn serve() -> std::process::ExitCode {
    let limit = libc::rlimit {
        rlim_cur: WORKER_MEMORY,
        rlim_max: WORKER_MEMORY,
    };
    // SAFETY: sets this process's own limit from a valid struct.
    unsafe { libc::setrlimit(libc::RLIMIT_AS, &limit) };
    // A worker whose program is gone (killed) ends, whatever pdfium is doing.
    // SAFETY: no argument.
    let parent = unsafe { libc::getppid() };
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(Duration::from_millis(500));
            // SAFETY: no argument; `_exit` ends the process without running anything more.
            if unsafe { libc::getppid() } != parent {
                unsafe { libc::_exit(1) };
            }
        }
    });
    let Some(library) = std::env::var_os(LIBRARY_VARIABLE) else {
        eprintln!("a PDF worker is started by batchinfer, which names the library");
        return std::process::ExitCode::FAILURE;
    };
    let pdfium = match super::pdfium::Pdfium::open(std::path::Path::new(&library)) {
        Ok(pdfium) => pdfium,
        Err(e) => {
            eprintln!("{e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let (mut input, mut output) = (std::io::stdin().lock(), std::io::stdout().lock());
    loop {
        let mut header = [0u8; 40];
        if input.read_exact(&mut header).is_err() {
            return std::process::ExitCode::SUCCESS;
        }
        let field = |k: usize| {
            let mut n = [0u8; 8];
            n.copy_from_slice(&header[k * 8..k * 8 + 8]);
            usize::try_from(u64::from_le_bytes(n)).unwrap_or(usize::MAX)
        };
        let (run, most_pages, most_text, length) =
            (field(0)..field(1), field(2), field(3), field(4));
        let mut bytes = Vec::new();
        if (&mut input)
            .take(length as u64)
            .read_to_end(&mut bytes)
            .is_err()
            || bytes.len() != length
        {
            return std::process::ExitCode::FAILURE;
        }
        let answer: Answer = pdfium.run(&bytes, run, most_pages, most_text);
        drop(bytes);
        let Ok(json) = serde_json::to_vec(&answer) else {
            return std::process::ExitCode::FAILURE;
        };
        let sent = output
            .write_all(&(json.len() as u64).to_le_bytes())
            .and_then(|()| output.write_all(&json))
            .and_then(|()| output.flush());
        if sent.is_err() {
            return std::process::ExitCode::FAILURE;
        }
    }
}
