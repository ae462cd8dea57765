//! Tells a connection's request deadline (`http::deadline`) when each request has arrived:
//! at once for a request without a body, at the end of its body otherwise, and in any case
//! once it is answered. One middleware, so every route (and the 404 of no route) is under
//! the same deadline.
//!
//! A request's time ends where its bytes end, not where its answer is made: a check that
//! waits on a stalled store is the scene's `on_store_error` to decide, never a closed
//! connection.

use std::future::{ready, Future, Ready};
use std::pin::Pin;
use std::task::{Context, Poll};

use actix_web::dev::{forward_ready, Payload, Service, ServiceRequest, ServiceResponse, Transform};
use actix_web::error::PayloadError;
use actix_web::web::Bytes;
use actix_web::{Error, HttpMessage};
use futures::Stream;
use pin_project_lite::pin_project;

use super::deadline::Arrival;

/// The middleware (`App::wrap(TrackArrival)`). A no-op on a connection without a deadline
/// (a test server's).
pub struct TrackArrival;

impl<S, B> Transform<S, ServiceRequest> for TrackArrival
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error>,
{
    type Response = ServiceResponse<B>;
    type Error = Error;
    type Transform = TrackArrivalService<S>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(TrackArrivalService { service }))
    }
}

/// [`TrackArrival`] around the app's routes, one per worker.
pub struct TrackArrivalService<S> {
    service: S,
}

impl<S, B> Service<ServiceRequest> for TrackArrivalService<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error>,
{
    type Response = ServiceResponse<B>;
    type Error = Error;
    type Future = Answered<S::Future>;

    forward_ready!(service);

    fn call(&self, mut req: ServiceRequest) -> Self::Future {
        let arrival = req.conn_data::<Arrival>().cloned();
        if let Some(arrival) = &arrival {
            match req.take_payload() {
                Payload::None => arrival.arrived(),
                payload => req.set_payload(Payload::Stream {
                    payload: Box::pin(Arriving {
                        payload,
                        arrival: arrival.clone(),
                    }),
                }),
            }
        }
        Answered {
            answer: self.service.call(req),
            arrival,
        }
    }
}

pin_project! {
    /// A request's body, telling its connection when it has all come.
    struct Arriving {
        #[pin]
        payload: Payload,
        arrival: Arrival,
    }
}

impl Stream for Arriving {
    type Item = Result<Bytes, PayloadError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.project();
        let next = std::task::ready!(this.payload.poll_next(cx));
        if next.is_none() {
            this.arrival.arrived();
        }
        Poll::Ready(next)
    }
}

pin_project! {
    /// The routes' answer; once it is made, whatever of the body was not read is actix's
    /// to close on, and the next byte starts the next request.
    pub struct Answered<F> {
        #[pin]
        answer: F,
        arrival: Option<Arrival>,
    }
}

impl<F: Future> Future for Answered<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let answer = std::task::ready!(this.answer.poll(cx));
        if let Some(arrival) = this.arrival {
            arrival.arrived();
        }
        Poll::Ready(answer)
    }
}
