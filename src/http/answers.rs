//! Counts every HTTP answer by route and status in `vigia_http_responses_total`, so the
//! requests that never reach a decision (400, 401, 404, 405, 413, 415) are seen too. The
//! route is the matched pattern (`/v1/trust/{user_id}`, not the user), which keeps the
//! series few; an unknown path is `unmatched`.
//!
//! A middleware of its own rather than `middleware::from_fn`, which boxes the rest of the
//! chain and its future on every request, while `match_pattern` matches the path against
//! the routes once more and allocates the answer. Here a route without parameters is found
//! by comparing the path with [`super::ROUTES`], the future is a plain struct, and the
//! counters are the worker's own. (`benches/ab.sh`, embedded store: the service with this
//! middleware answers within the noise of one with none, 18.0–18.3 against 17.9–18.2 µs
//! CPU per check; `from_fn` cost up to ~1 µs more.)

use std::borrow::Cow;
use std::future::{ready, Future, Ready};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use actix_web::dev::{forward_ready, Service, ServiceRequest, ServiceResponse, Transform};
use actix_web::Error;
use pin_project_lite::pin_project;

use crate::metrics::Metrics;

/// The middleware (`App::wrap(CountAnswers::new(metrics))`).
pub struct CountAnswers {
    metrics: Rc<Metrics>,
}

impl CountAnswers {
    pub fn new(metrics: Metrics) -> Self {
        CountAnswers {
            metrics: Rc::new(metrics),
        }
    }
}

impl<S, B> Transform<S, ServiceRequest> for CountAnswers
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error>,
{
    type Response = ServiceResponse<B>;
    type Error = Error;
    type Transform = CountAnswersService<S>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(CountAnswersService {
            service,
            metrics: self.metrics.clone(),
        }))
    }
}

/// [`CountAnswers`] around the app's routes, one per worker.
pub struct CountAnswersService<S> {
    service: S,
    metrics: Rc<Metrics>,
}

impl<S, B> Service<ServiceRequest> for CountAnswersService<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error>,
{
    type Response = ServiceResponse<B>;
    type Error = Error;
    type Future = Counted<S::Future>;

    forward_ready!(service);

    fn call(&self, req: ServiceRequest) -> Self::Future {
        let route = route(&req);
        Counted {
            answer: self.service.call(req),
            metrics: self.metrics.clone(),
            route,
        }
    }
}

/// The route label of `req`: a route without parameters is its own path, found without
/// matching; the others (and unknown paths) ask the router.
fn route(req: &ServiceRequest) -> Cow<'static, str> {
    let path = req.path();
    match super::ROUTES
        .iter()
        .find(|(_, pattern)| *pattern == path && !pattern.contains('{'))
    {
        Some((_, pattern)) => Cow::Borrowed(pattern),
        None => req
            .match_pattern()
            .map_or(Cow::Borrowed("unmatched"), Cow::Owned),
    }
}

pin_project! {
    /// The routes' answer, counted when it is ready.
    pub struct Counted<F> {
        #[pin]
        answer: F,
        metrics: Rc<Metrics>,
        route: Cow<'static, str>,
    }
}

impl<F, B> Future for Counted<F>
where
    F: Future<Output = Result<ServiceResponse<B>, Error>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let answer = std::task::ready!(this.answer.poll(cx));
        let status = match &answer {
            Ok(res) => res.status(),
            Err(e) => e.as_response_error().status_code(),
        };
        this.metrics.http_answer(this.route, status.as_u16());
        Poll::Ready(answer)
    }
}
