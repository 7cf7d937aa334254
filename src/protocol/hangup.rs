//! Seeing a client hang up while its input is not being read.
//!
//! A connection blocked in `reserve` reads what its client pipelines behind
//! the reserve, up to a bound, and then stops reading until the reserve is
//! answered. The end of the client's input (its FIN) is then queued behind
//! bytes nobody reads, so reading cannot see it: a client that sent more
//! than the bound and left stayed a waiter for good, holding its buffers
//! and taking the next job of its tubes. beanstalkd watches a waiting
//! connection for the hang-up alone (`EPOLLRDHUP`); so does this.
//!
//! The socket is already registered with the runtime, for reading and
//! writing, and is not to be read here. A duplicate of its descriptor is
//! registered on its own: the kernel keeps a registration per descriptor,
//! so this one reports the hang-up (`EPOLLRDHUP`, or `EPOLLHUP` on a reset)
//! and can have its readiness cleared without touching the connection's.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Watches one socket for its peer's hang-up.
pub struct HangUp {
    fd: AsyncFd<OwnedFd>,
    /// The duplicate's place among the descriptors clients may hold.
    _file: OwnedSemaphorePermit,
}

impl HangUp {
    /// Starts watching `socket`, its duplicate taking one of `files` (the
    /// descriptors clients may hold); `None` if it cannot be (none left),
    /// in which case the hang-up is seen only once the input before it is
    /// read.
    pub fn watch(socket: BorrowedFd<'_>, files: &Arc<Semaphore>) -> Option<HangUp> {
        let file = files.clone().try_acquire_owned().ok()?;
        let fd = socket.try_clone_to_owned().ok()?;
        // SAFETY: the `OwnedFd` is moved into the `AsyncFd`, which owns it
        // until it is dropped, and always gives the same open descriptor.
        unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
            .ok()
            .map(|fd| HangUp { fd, _file: file })
    }

    /// Resolves once the peer has hung up (or the socket failed).
    pub async fn hung_up(&self) {
        loop {
            match self.fd.readable().await {
                Ok(mut ready) => {
                    if ready.ready().is_read_closed() {
                        return;
                    }
                    // More input, which the connection will read in its
                    // turn: wait for the next event. The registration is
                    // edge-triggered, so without this the same readiness
                    // would wake the loop again at once.
                    ready.clear_ready();
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    }
}

/// [`HangUp::hung_up`] of `watch`, or never without one.
pub async fn hung_up(watch: Option<&HangUp>) {
    match watch {
        Some(watch) => watch.hung_up().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;
    use tokio::net::{TcpListener, TcpStream};

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (client.expect("connect"), accepted.expect("accept").0)
    }

    /// Room for one descriptor.
    fn one() -> Arc<Semaphore> {
        Arc::new(Semaphore::new(1))
    }

    #[tokio::test]
    async fn a_watch_takes_a_descriptor_of_the_clients_budget() {
        let (_client, server) = pair().await;
        let files = one();
        let watch = HangUp::watch(server.as_fd(), &files).expect("a watch");
        assert_eq!(files.available_permits(), 0);
        assert!(
            HangUp::watch(server.as_fd(), &files).is_none(),
            "a second watch with no descriptor left"
        );
        drop(watch);
        assert_eq!(files.available_permits(), 1, "given back with the watch");
    }

    #[tokio::test]
    async fn a_hang_up_behind_unread_input_is_seen() {
        let (mut client, server) = pair().await;
        let watch = HangUp::watch(server.as_fd(), &one()).expect("a watch");
        client.write_all(&[b'x'; 100_000]).await.expect("write");
        let quiet = tokio::time::timeout(Duration::from_millis(200), watch.hung_up()).await;
        assert!(quiet.is_err(), "input alone is no hang-up");
        // The FIN comes behind the 100,000 bytes, none of them read.
        drop(client);
        tokio::time::timeout(Duration::from_secs(5), watch.hung_up())
            .await
            .expect("the hang-up seen though the input before it was never read");
    }

    #[tokio::test]
    async fn a_reset_with_the_buffers_full_is_seen() {
        let (mut client, server) = pair().await;
        let watch = HangUp::watch(server.as_fd(), &one()).expect("a watch");
        // Until the client can send no more: the server's receive buffer
        // and the client's send buffer are full, so a FIN could not be
        // sent; a client that leaves with unread input resets instead.
        let junk = vec![b'x'; 1 << 20];
        loop {
            let more = tokio::time::timeout(Duration::from_millis(300), client.write_all(&junk));
            if more.await.is_err() {
                break;
            }
        }
        client.set_zero_linger().expect("SO_LINGER 0");
        drop(client);
        tokio::time::timeout(Duration::from_secs(5), watch.hung_up())
            .await
            .expect("the reset seen");
    }

    #[tokio::test]
    async fn the_connections_own_reads_are_untouched() {
        use tokio::io::AsyncReadExt;
        let (mut client, mut server) = pair().await;
        let watch = HangUp::watch(server.as_fd(), &one()).expect("a watch");
        client.write_all(b"first").await.expect("write");
        // The watch sees the input and lets it be.
        let quiet = tokio::time::timeout(Duration::from_millis(100), watch.hung_up()).await;
        assert!(quiet.is_err());
        drop(watch);
        let mut got = [0u8; 5];
        tokio::time::timeout(Duration::from_secs(1), server.read_exact(&mut got))
            .await
            .expect("the connection still reads its input")
            .expect("read");
        assert_eq!(&got, b"first");
    }
}
