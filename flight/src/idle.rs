//! Connections that never start talking are closed.
//!
//! hyper's HTTP/2 server waits for a client's connection preface without a time limit, and
//! its keep-alive pings only begin once the preface is in. So a connection that sends
//! nothing, or a few bytes, held a file descriptor for as long as the client liked: with
//! the server limited to 1,024 descriptors, 1,100 such connections made every new call
//! fail with UNAVAILABLE. [`FirstWords`] fails the first reads of a connection that has not
//! sent [`FIRST_BYTES`] within its time, and the server then drops it. Written by hand: a
//! deadline on the first bytes of a stream is a few lines, and neither tonic nor hyper
//! offers one for HTTP/2.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

/// How long a new connection has to send its first [`FIRST_BYTES`].
pub(crate) const GREETING_TIMEOUT: Duration = Duration::from_secs(10);

/// The bytes after which a connection has started talking: HTTP/2's client preface
/// (`PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`) is 24 bytes, and so is less than any TLS hello.
pub(crate) const FIRST_BYTES: usize = 24;

/// A connection whose reads fail with `TimedOut` if it has not sent [`FIRST_BYTES`] by its
/// deadline.
pub(crate) struct FirstWords<IO> {
    io: IO,
    /// Until the first bytes are in: how many came, and when time is up.
    waiting: Option<(usize, Pin<Box<tokio::time::Sleep>>)>,
}

impl<IO> FirstWords<IO> {
    /// `io`, which must send its first bytes `within` this time.
    pub(crate) fn new(io: IO, within: Duration) -> Self {
        FirstWords {
            io,
            waiting: Some((0, Box::pin(tokio::time::sleep(within)))),
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for FirstWords<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        let read = Pin::new(&mut this.io).poll_read(cx, buf);
        let Some((got, deadline)) = &mut this.waiting else {
            return read;
        };
        if let Poll::Ready(Ok(())) = read {
            *got += buf.filled().len() - before;
            if *got >= FIRST_BYTES {
                this.waiting = None;
            }
            return read;
        }
        if read.is_pending() && deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the connection sent no request in time",
            )));
        }
        read
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for FirstWords<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl<IO: Connected> Connected for FirstWords<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    /// A client socket and the server's side of it, watched for `within`.
    async fn pair(within: Duration) -> (TcpStream, FirstWords<TcpStream>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        (client, FirstWords::new(server, within))
    }

    #[tokio::test]
    async fn silence_and_a_few_bytes_time_out_and_a_preface_does_not() {
        let within = Duration::from_millis(200);
        let mut buf = [0u8; 64];

        let (_silent, mut server) = pair(within).await;
        let err = server.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);

        let (mut few, mut server) = pair(within).await;
        few.write_all(b"PRI * ").await.unwrap();
        assert_eq!(server.read(&mut buf).await.unwrap(), 6);
        let err = server.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);

        let (mut talker, mut server) = pair(within).await;
        talker
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .unwrap();
        let mut preface = [0u8; FIRST_BYTES];
        server.read_exact(&mut preface).await.unwrap();
        // Started: later silence is the protocol's business (keep-alive pings).
        let later = tokio::time::timeout(3 * within, server.read(&mut buf)).await;
        assert!(later.is_err(), "a talking connection was cut: {later:?}");
        talker.write_all(b"more").await.unwrap();
        assert_eq!(server.read(&mut buf).await.unwrap(), 4);
    }
}
