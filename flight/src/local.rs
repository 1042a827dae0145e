//! Connections from this host get a send buffer that keeps their bytes in cache.
//!
//! Over loopback a message is copied twice, by the server into its socket and by the
//! client out of its own, on the same machine. Left to grow (to 4 MiB, the usual
//! `tcp_wmem` ceiling), the send buffer let the server write megabytes ahead of the reader,
//! whose copy then read them back from memory instead of cache. A fixed 512 KiB (the kernel
//! doubles it) keeps the two copies close: four pyarrow clients pulling over loopback got
//! 1.23x the bytes per second (median of 6 alternated pairs, each pair ≥ 1.16x), with 16%
//! less server CPU and 24% less client CPU a pull, and one client 1.12x. 256 KiB gained
//! less (1.01–1.09x), 128 KiB lost (0.89x), 1 MiB and 2 MiB gained 1.14x and 1.05x.
//!
//! A connection from another host keeps the kernel's autotuning: its buffer must cover the
//! link's bandwidth-delay product, which a fixed 512 KiB would cap (at 1 ms round trips,
//! to about 4 Gbit/s).

use std::net::SocketAddr;

use tokio::net::TcpStream;

/// The send buffer asked for on a connection from this host, in bytes.
pub(crate) const LOCAL_SEND_BUFFER: usize = 512 << 10;

/// Sets `stream`'s send buffer to [`LOCAL_SEND_BUFFER`] when its peer is on this host.
/// Best effort: a socket that refuses keeps the kernel's buffer, which only costs speed.
pub(crate) fn fit_send_buffer(stream: &TcpStream) {
    if let (Ok(peer), Ok(local)) = (stream.peer_addr(), stream.local_addr())
        && same_host(peer, local)
    {
        let _ = socket2::SockRef::from(stream).set_send_buffer_size(LOCAL_SEND_BUFFER);
    }
}

/// Whether a connection from `peer` to `local` stays on this host: a loopback peer (an
/// IPv4 one written as IPv6 too), or one that dialled this host's own address, which
/// Linux also carries over loopback.
fn same_host(peer: SocketAddr, local: SocketAddr) -> bool {
    let ip = peer.ip().to_canonical();
    ip.is_loopback() || ip == local.ip().to_canonical()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_and_own_address_peers_are_on_this_host() {
        let at = |s: &str| s.parse::<SocketAddr>().unwrap();
        let local = at("10.0.0.5:7000");
        for peer in [
            "127.0.0.1:5000",
            "127.1.2.3:5000",
            "[::1]:5000",
            "[::ffff:127.0.0.1]:5000",
        ] {
            assert!(same_host(at(peer), local), "{peer}");
        }
        assert!(same_host(at("10.0.0.5:5000"), local));
        assert!(same_host(at("[::ffff:10.0.0.5]:5000"), local));
        for peer in ["10.0.0.6:5000", "[2001:db8::1]:5000", "192.168.1.5:5000"] {
            assert!(!same_host(at(peer), local), "{peer}");
        }
    }

    /// An accepted loopback connection gets the buffer (Linux reports twice the size asked
    /// for, its bookkeeping included).
    #[tokio::test]
    async fn a_loopback_connection_gets_the_local_send_buffer() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dial = TcpStream::connect(listener.local_addr().unwrap());
        let ((accepted, _), _dialled) =
            tokio::join!(async { listener.accept().await.unwrap() }, async {
                dial.await.unwrap()
            });
        fit_send_buffer(&accepted);
        let size = socket2::SockRef::from(&accepted)
            .send_buffer_size()
            .unwrap();
        assert!(
            (LOCAL_SEND_BUFFER..=2 * LOCAL_SEND_BUFFER).contains(&size),
            "{size}"
        );
    }
}
