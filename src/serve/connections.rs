//! The connections the server takes: at most [`max_connections`] at once (the others closed as
//! they come, before they cost a file for long), each closed when it has not begun to speak
//! within [`FIRST_BYTES_WITHIN`], and the listener waiting a moment when accepting fails (out of
//! files) instead of spinning.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::transport::server::{Connected, TcpConnectInfo};

/// How long a new connection has to send its first bytes (HTTP/2's preface, or TLS's hello).
pub const FIRST_BYTES_WITHIN: Duration = Duration::from_secs(10);

/// The bytes that count as having begun: HTTP/2's connection preface is 24.
const FIRST_BYTES: usize = 24;

/// How long the listener waits after accepting failed.
const AFTER_FAILED_ACCEPT: Duration = Duration::from_millis(100);

/// Connections at once: what the process's open-file limit leaves after the files statements
/// need, at most 10,000. The soft limit is raised to the hard one first.
pub fn max_connections() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the one struct given.
    let soft = unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 256;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit.rlim_cur = limit.rlim_max;
            }
        }
        limit.rlim_cur
    };
    let soft = usize::try_from(soft).unwrap_or(usize::MAX);
    (soft / 2).clamp(16, 10_000)
}

/// The accepted connections, as tonic takes them.
pub fn accepted(
    listener: TcpListener,
    most: usize,
) -> impl futures::Stream<Item = io::Result<Connection>> {
    let open = Arc::new(Semaphore::new(most));
    futures::stream::unfold((listener, open), |(listener, open)| async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let Ok(permit) = open.clone().try_acquire_owned() else {
                        // Past the limit: closed at once.
                        drop(stream);
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    let connection = Connection {
                        stream,
                        first_bytes: Some(Box::pin(tokio::time::sleep(FIRST_BYTES_WITHIN))),
                        seen: 0,
                        _open: permit,
                    };
                    return Some((Ok(connection), (listener, open)));
                }
                Err(e) => {
                    // Out of files, most likely: a pause, not a loop at full speed.
                    tokio::time::sleep(AFTER_FAILED_ACCEPT).await;
                    return Some((Err(e), (listener, open)));
                }
            }
        }
    })
}

/// An accepted connection (see the module's text).
pub struct Connection {
    stream: TcpStream,
    /// Until it has sent [`FIRST_BYTES`].
    first_bytes: Option<Pin<Box<tokio::time::Sleep>>>,
    seen: usize,
    _open: OwnedSemaphorePermit,
}

impl AsyncRead for Connection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                this.seen += buf.filled().len() - before;
                if this.seen >= FIRST_BYTES {
                    this.first_bytes = None;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => {
                let late = this
                    .first_bytes
                    .as_mut()
                    .is_some_and(|deadline| deadline.as_mut().poll(cx).is_ready());
                if late {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client sent nothing in time",
                    )));
                }
                Poll::Pending
            }
            failed => failed,
        }
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

impl Connected for Connection {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}
