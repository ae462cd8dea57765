//! The request deadline: a request, its head and its body, arrives within
//! `[http] request_timeout_ms` of its first byte, or its connection is closed.
//!
//! actix bounds only the head of a connection's first request (`client_request_timeout`):
//! a body sent a byte at a time, or the head of a keep-alive connection's next request
//! trickled in, held the connection and its file for as long as the client liked, and
//! enough such clients ran the process out of files. So the deadline lives on the
//! connection's bytes ([`Bounded`], under the HTTP codec), which see every request's first
//! byte; `http::arrival` tells it when a request has arrived whole or been answered, so a
//! slow answer (a stalled store) never counts against the client.
//!
//! A late request's connection is dropped, not answered: the client is sending too slowly
//! to be waited for, and an answer would keep its file open while it lingers.

use std::cell::Cell;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use prometheus::IntCounter;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{sleep_until, Instant, Sleep};

/// When the request being received on one connection is due: shared by the connection's
/// bytes ([`Bounded`]) and its requests (`http::arrival`, through the connection's data).
#[derive(Clone)]
pub struct Arrival(Rc<Due>);

struct Due {
    timeout: Duration,
    /// `Some` from a request's first byte until it has arrived whole (or been answered).
    at: Cell<Option<Instant>>,
}

impl Arrival {
    fn new(timeout: Duration) -> Arrival {
        Arrival(Rc::new(Due {
            timeout,
            at: Cell::new(None),
        }))
    }

    /// Bytes came in: unless a request is already being received, they start one.
    fn bytes_in(&self) {
        if self.0.at.get().is_none() {
            self.0.at.set(Some(Instant::now() + self.0.timeout));
        }
    }

    /// The request being received has arrived whole (or been answered): the connection
    /// owes nothing until its next byte.
    pub fn arrived(&self) {
        self.0.at.set(None);
    }

    fn due(&self) -> Option<Instant> {
        self.0.at.get()
    }
}

/// A connection's bytes, closed (every read and write fails) once a request is late.
pub struct Bounded<T> {
    io: T,
    arrival: Arrival,
    /// Wakes the connection at the deadline, so a client that sends nothing more is still
    /// closed; made at the first request.
    timer: Option<Pin<Box<Sleep>>>,
    late: bool,
    /// `vigia_http_late_requests_total`.
    late_requests: IntCounter,
}

impl<T> Bounded<T> {
    /// `io` whose requests must each arrive within `timeout` of their first byte; a
    /// connection closed for a late one counts in `late_requests`.
    pub fn new(io: T, timeout: Duration, late_requests: IntCounter) -> Bounded<T> {
        Bounded {
            io,
            arrival: Arrival::new(timeout),
            timer: None,
            late: false,
            late_requests,
        }
    }

    /// The handle the connection's requests report their arrival on.
    pub fn arrival(&self) -> Arrival {
        self.arrival.clone()
    }

    /// An error once the request being received is late; otherwise arms the wake-up for
    /// its deadline on this task.
    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if self.late {
            return Err(late());
        }
        let Some(due) = self.arrival.due() else {
            return Ok(());
        };
        let timer = self.timer.get_or_insert_with(|| Box::pin(sleep_until(due)));
        if timer.deadline() != due {
            timer.as_mut().reset(due);
        }
        if timer.as_mut().poll(cx).is_ready() {
            self.late = true;
            self.late_requests.inc();
            return Err(late());
        }
        Ok(())
    }
}

fn late() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "the request did not arrive within http.request_timeout_ms",
    )
}

impl<T: AsyncRead + Unpin> AsyncRead for Bounded<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check(cx)?;
        let before = buf.filled().len();
        std::task::ready!(Pin::new(&mut this.io).poll_read(cx, buf))?;
        if buf.filled().len() > before && this.arrival.due().is_none() {
            this.arrival.bytes_in();
            this.check(cx)?;
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Bounded<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.check(cx)?;
        Pin::new(&mut this.io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check(cx)?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.check(cx)?;
        Pin::new(&mut this.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const TIMEOUT: Duration = Duration::from_millis(300);
    /// What a busy test machine may add to a deadline before the read fails.
    const MARGIN: Duration = Duration::from_secs(2);

    fn counter() -> IntCounter {
        IntCounter::new("late", "late").expect("counter")
    }

    /// A request that does not arrive in time fails the connection's next read, even
    /// while the client sends nothing; one that arrived leaves it open however long the
    /// client then waits.
    #[tokio::test]
    async fn a_late_request_closes_its_connection_and_an_arrived_one_does_not() {
        let (client, server) = tokio::io::duplex(64);
        let late = counter();
        let mut conn = Bounded::new(server, TIMEOUT, late.clone());
        let arrival = conn.arrival();
        let (mut client_reads, mut client_writes) = tokio::io::split(client);

        client_writes
            .write_all(b"GET / HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 64];
        let n = conn.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"GET / HTTP/1.1\r\n\r\n");
        arrival.arrived();
        // Idle after an arrived request, past the deadline: still open (keep-alive is
        // actix's to bound).
        let idle = tokio::time::timeout(TIMEOUT * 3, conn.read(&mut buf)).await;
        assert!(idle.is_err(), "an idle connection was closed: {idle:?}");
        conn.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await.unwrap();
        assert!(client_reads.read(&mut buf).await.unwrap() > 0);

        // The next request's head starts, then nothing more comes.
        client_writes
            .write_all(b"POST /v1/check HTTP/1.1\r\n")
            .await
            .unwrap();
        let started = Instant::now();
        assert!(conn.read(&mut buf).await.unwrap() > 0);
        let err = conn.read(&mut buf).await.unwrap_err();
        let waited = started.elapsed();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(waited >= TIMEOUT && waited < TIMEOUT + MARGIN, "{waited:?}");
        assert_eq!(late.get(), 1);
        // Closed for good: writes fail too.
        let err = conn.write_all(b"late").await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    }

    /// Bytes that trickle in keep the first byte's deadline: they do not extend it.
    #[tokio::test]
    async fn a_trickle_does_not_extend_the_deadline() {
        let (mut client, server) = tokio::io::duplex(64);
        let mut conn = Bounded::new(server, TIMEOUT, counter());
        let started = Instant::now();
        let reader = async {
            let mut buf = [0u8; 8];
            loop {
                if let Err(e) = conn.read(&mut buf).await {
                    return e;
                }
            }
        };
        let writer = async {
            loop {
                if client.write_all(b"x").await.is_err() {
                    return;
                }
                tokio::time::sleep(TIMEOUT / 6).await;
            }
        };
        let err = tokio::select! {
            e = reader => e,
            () = writer => panic!("the writer stopped first"),
        };
        let waited = started.elapsed();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(waited >= TIMEOUT && waited < TIMEOUT + MARGIN, "{waited:?}");
    }
}
