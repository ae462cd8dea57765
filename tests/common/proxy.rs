//! A TCP proxy to put between vigia and a redis-server, to break the network on purpose:
//! [`TcpProxy::sever`] cuts every live connection (mid-request, both ways),
//! [`TcpProxy::blackhole`] makes the link hang (a partition: connections are accepted, bytes
//! are held, nothing arrives and nothing is refused) and [`TcpProxy::abandon`] turns the
//! connections open now into zombies (open, silent forever) while new ones work.
//!
//! The proxy runs on its own thread with its own single-threaded tokio runtime, so it
//! works from any test (an `#[actix_web::test]`, a `#[tokio::test]`, a plain `#[test]`)
//! and keeps forwarding while the test's own runtime is blocked. Its controls are plain
//! method calls, usable from any thread; they take effect on the proxy's thread a moment
//! (well under a millisecond, unless the machine is loaded) after the call returns.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};

/// A running proxy from `127.0.0.1:<port()>` to `127.0.0.1:<upstream_port>`. Stops (and
/// closes every connection) on drop.
pub struct TcpProxy {
    port: u16,
    control: Arc<Control>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// What the test thread and the proxy's tasks share.
struct Control {
    /// Bumped by `sever`: every connection alive at that moment closes both its sockets.
    severs: watch::Sender<u64>,
    /// Whether bytes may move; see [`Link`].
    link: watch::Sender<Link>,
    /// Client connections accepted so far (a reconnecting client shows here).
    accepted: AtomicUsize,
}

impl TcpProxy {
    /// Listens on a free local port and forwards each connection to `upstream_port`.
    pub fn start(upstream_port: u16) -> TcpProxy {
        // Bound here, on the caller's thread, so the port is known (and listening) as soon
        // as `start` returns.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("proxy: bind");
        listener.set_nonblocking(true).expect("proxy: nonblocking");
        let port = listener.local_addr().expect("proxy: local addr").port();
        let control = Arc::new(Control {
            severs: watch::channel(0).0,
            link: watch::channel(Link::default()).0,
            accepted: AtomicUsize::new(0),
        });
        let (shutdown, stopped) = oneshot::channel();
        let ctl = control.clone();
        let thread = std::thread::Builder::new()
            .name(format!("tcp-proxy-{port}"))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("proxy runtime");
                rt.block_on(accept_loop(listener, upstream_port, ctl, stopped));
                // Dropping the runtime drops every connection task, closing its sockets.
            })
            .expect("proxy thread");
        TcpProxy {
            port,
            control,
            shutdown: Some(shutdown),
            thread: Some(thread),
        }
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`: the URL to give vigia instead of the server's.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Closes every live connection, both sides, whatever is in flight (bytes already read
    /// from one side and not yet written to the other are lost). New connections are
    /// still accepted and forwarded.
    pub fn sever(&self) {
        self.control.severs.send_modify(|n| *n += 1);
    }

    /// `true`: the link hangs. Connections stay open and new ones are accepted, but no
    /// byte is forwarded either way (nor is the upstream dialled) until `blackhole(false)`,
    /// which delivers whatever was held, like a healed partition.
    pub fn blackhole(&self, on: bool) {
        self.control.link.send_if_modified(|l| {
            let changed = l.blackhole != on;
            l.blackhole = on;
            changed
        });
    }

    /// Every connection open now is lost for good: it stays open (no FIN, no RST) but never
    /// moves another byte, like a connection a firewall or NAT forgot, or one to an address
    /// that failed over. Connections accepted from now on are forwarded as usual (once
    /// the link is not blackholed). A client only gets out by reconnecting on its own.
    pub fn abandon(&self) {
        self.control.link.send_modify(|l| l.abandoned += 1);
    }

    /// Client connections accepted since the start.
    pub fn accepted(&self) -> usize {
        self.control.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The state of the link, which every connection's pumps watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Link {
    /// While true, no byte moves either way and no new connection reaches the upstream;
    /// everything waits, in the kernel's buffers, for the link to heal.
    blackhole: bool,
    /// Bumped by `abandon`: a connection accepted under an older value never moves a
    /// byte again (it is not closed either).
    abandoned: u64,
}

impl Link {
    /// Whether a connection accepted under `born` (the `abandoned` value then) may move bytes.
    fn up_for(&self, born: u64) -> bool {
        !self.blackhole && self.abandoned == born
    }
}

/// Accepts until told to stop; one task per connection.
async fn accept_loop(
    listener: std::net::TcpListener,
    upstream_port: u16,
    control: Arc<Control>,
    mut stopped: oneshot::Receiver<()>,
) {
    let listener = TcpListener::from_std(listener).expect("proxy: listener");
    let upstream = SocketAddr::from(([127, 0, 0, 1], upstream_port));
    loop {
        tokio::select! {
            _ = &mut stopped => return,
            accepted = listener.accept() => {
                let Ok((client, _)) = accepted else { continue };
                control.accepted.fetch_add(1, Ordering::SeqCst);
                let _ = client.set_nodelay(true);
                tokio::spawn(connection(client, upstream, control.clone()));
            }
        }
    }
}

/// One proxied connection: held while blackholed, then dialled upstream and pumped both
/// ways until either side closes or the next `sever`.
async fn connection(client: TcpStream, upstream: SocketAddr, control: Arc<Control>) {
    let mut severs = control.severs.subscribe();
    severs.borrow_and_update();
    let link = control.link.subscribe();
    let born = link.borrow().abandoned;
    let forward = async move {
        wait_link_up(&mut link.clone(), born).await;
        // Upstream gone (killed): close the client side, as a refused dial would look
        // to a client connecting to the server directly.
        let Ok(server) = TcpStream::connect(upstream).await else {
            return;
        };
        let _ = server.set_nodelay(true);
        let (client_r, client_w) = client.into_split();
        let (server_r, server_w) = server.into_split();
        tokio::join!(
            pump(client_r, server_w, link.clone(), born),
            pump(server_r, client_w, link, born),
        );
    };
    tokio::select! {
        // A sever drops the `forward` future, and with it both sockets: the client and the
        // server each see their connection closed.
        _ = severs.changed() => {}
        _ = forward => {}
    }
}

/// Copies bytes one way, pausing while the link is down for this connection (`born`: the
/// `abandoned` value when it was accepted). Ends on EOF or an error, passing the EOF on
/// (half-close) so the other direction can finish.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut link: watch::Receiver<Link>,
    born: u64,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        wait_link_up(&mut link, born).await;
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            },
            // The link changed while waiting to read: look again before taking any bytes.
            _ = link.changed() => continue,
        };
        // Down between the read and the write: hold these bytes too.
        wait_link_up(&mut link, born).await;
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// Returns once the link is up for a connection born under `born` (at once when it is);
/// never, for an abandoned one.
async fn wait_link_up(link: &mut watch::Receiver<Link>, born: u64) {
    while !link.borrow_and_update().up_for(born) {
        if link.changed().await.is_err() {
            // The proxy is stopping: hold until the runtime drops this task.
            std::future::pending::<()>().await;
        }
    }
}
