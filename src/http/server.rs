//! The HTTP server: actix-web's app on actix's HTTP/1 service, assembled here rather than
//! by `HttpServer` so every connection's bytes pass through the request deadline
//! (`deadline::Bounded`), which `HttpServer` has no place for. Otherwise it is what
//! `HttpServer` builds: the same listening socket, graceful shutdown, and actix's head
//! timeout, keep-alive and disconnect timeout.

use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use actix_http::error::DispatchError;
use actix_http::{HttpServiceBuilder, KeepAlive};
use actix_service::{fn_service, map_config, IntoServiceFactory, ServiceFactoryExt};
use actix_web::dev::{AppConfig, Extensions, Server};
use actix_web::rt::net::TcpStream;
use actix_web::{web, App};

use super::arrival::TrackArrival;
use super::deadline::Bounded;
use super::AppState;

/// Connections waiting to be accepted (those past a full worker wait here too): as
/// `HttpServer`.
const BACKLOG: i32 = 1024;

/// How long a connection closed after an answer is given to leave: as `HttpServer`.
const DISCONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// After a stop, how long in-flight requests are given to finish.
const SHUTDOWN_TIMEOUT_S: u64 = 10;

/// How the server bounds its connections.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// A request, head and body, arrives within this long of its first byte; a connection
    /// that sends nothing is answered 408 and closed after as long.
    pub request_timeout: Duration,
    /// An idle keep-alive connection is closed after this long; zero: no keep-alive.
    pub keep_alive: Duration,
    /// Connections each worker holds at most.
    pub per_worker: usize,
}

/// A socket listening on `addr` as `HttpServer::bind` makes it.
pub fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    Ok(socket.into())
}

/// The service on `listener` with `workers` workers (the caller runs it); `data`'s
/// metrics count every answer and every connection closed for a late request.
pub fn serve(
    listener: TcpListener,
    workers: usize,
    bounds: Bounds,
    data: web::Data<AppState>,
) -> std::io::Result<Server> {
    let addr = listener.local_addr()?;
    let late_requests = data.metrics.late_requests();
    let builder = Server::build()
        .workers(workers)
        .max_concurrent_connections(bounds.per_worker)
        .shutdown_timeout(SHUTDOWN_TIMEOUT_S);
    let shutdown = builder.graceful_shutdown_signal();
    let keep_alive = if bounds.keep_alive.is_zero() {
        KeepAlive::Disabled
    } else {
        KeepAlive::Timeout(bounds.keep_alive)
    };
    let server = builder.listen("vigia-http", listener, move || {
        let app = App::new()
            .app_data(data.clone())
            .wrap(super::answers::CountAnswers::new(data.metrics.clone()))
            .wrap(TrackArrival)
            .configure(super::configure)
            .into_factory()
            .map_err(|err| err.error_response());
        let shutdown = shutdown.clone();
        let http = HttpServiceBuilder::<Bounded<TcpStream>, _>::default()
            .keep_alive(keep_alive)
            .client_request_timeout(bounds.request_timeout)
            .client_disconnect_timeout(DISCONNECT_TIMEOUT)
            .local_addr(addr)
            .graceful_shutdown_signal(move || {
                let shutdown = shutdown.clone();
                async move { shutdown.notified().await }
            })
            .on_connect_ext(|io: &Bounded<TcpStream>, data: &mut Extensions| {
                data.insert(io.arrival());
            })
            // The app's host and address are only used to build URLs, which no route does.
            .h1(map_config(app, |_| AppConfig::default()));
        let late_requests = late_requests.clone();
        fn_service(move |io: TcpStream| {
            let peer = io.peer_addr().ok();
            let io = Bounded::new(io, bounds.request_timeout, late_requests.clone());
            std::future::ready(Ok::<_, DispatchError>((io, peer)))
        })
        .and_then(http)
    })?;
    Ok(server.run())
}
