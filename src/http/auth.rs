//! Who may call what. `/v1/check` needs `Authorization: Bearer <check_token>` when one is
//! configured; the admin surface (`/v1/refund`, and later `/v1/events`, `/v1/admin/*`) needs
//! `Bearer <admin_token>`, and with no admin token configured answers loopback peers only.
//!
//! Refunds and trust events hand quota back: forging them is an abuser's first move, so
//! the admin surface is never open to the network by default. Tokens are compared in
//! constant time so response timing leaks nothing about them. A proxy on the same host
//! makes every peer look local: behind one, set `admin_token`.

use std::net::SocketAddr;

use actix_web::HttpRequest;
use subtle::ConstantTimeEq;

use super::errors::ApiError;

/// Whether `/v1/check` is open to the network: the node listens on an address other than
/// loopback (`0.0.0.0` in the container image) and has no check token. Then anyone who
/// reaches the port may check — learn which users, devices and addresses are limited, or
/// spend a user's quota with checks of their own — so the service warns at start.
pub fn check_open_to_network(listening: &SocketAddr, check_token: &str) -> bool {
    !listening.ip().is_loopback() && check_token.is_empty()
}

/// The bearer token of a request, if it carries one.
fn bearer(req: &HttpRequest) -> Option<&str> {
    req.headers()
        .get(actix_web::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

/// The password of HTTP Basic credentials, if the request carries them (the user name
/// is ignored: the ops page asks for the admin token as the password).
fn basic_password(req: &HttpRequest) -> Option<String> {
    use base64::Engine as _;
    let encoded = req
        .headers()
        .get(actix_web::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Basic ")?
        .trim();
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()?;
    let credentials = String::from_utf8(decoded).ok()?;
    let (_user, password) = credentials.split_once(':')?;
    Some(password.to_owned())
}

/// Constant-time equality (the length of the expected token may leak, its content not).
fn same(given: &str, expected: &str) -> bool {
    given.as_bytes().ct_eq(expected.as_bytes()).into()
}

/// The admin rule, on its inputs.
pub fn admin_allowed(peer: Option<SocketAddr>, bearer: Option<&str>, token: &str) -> bool {
    if token.is_empty() {
        return peer.is_some_and(|p| p.ip().to_canonical().is_loopback());
    }
    bearer.is_some_and(|b| same(b, token))
}

/// The check rule, on its inputs.
pub fn check_allowed(bearer: Option<&str>, token: &str) -> bool {
    token.is_empty() || bearer.is_some_and(|b| same(b, token))
}

/// `Ok` when the request may use the admin surface.
pub fn require_admin(req: &HttpRequest, token: &str) -> Result<(), ApiError> {
    if admin_allowed(req.peer_addr(), bearer(req), token) {
        Ok(())
    } else {
        Err(ApiError::Unauthorized)
    }
}

/// `Ok` when the request may see the ops page and its data: the admin rule, with the
/// token given as a bearer token or as the password of HTTP Basic credentials (what a
/// browser sends after prompting). The 401 asks the browser to prompt.
pub fn require_admin_browser(req: &HttpRequest, token: &str) -> Result<(), ApiError> {
    let given = bearer(req)
        .map(str::to_owned)
        .or_else(|| basic_password(req));
    if admin_allowed(req.peer_addr(), given.as_deref(), token) {
        Ok(())
    } else {
        Err(ApiError::BrowserUnauthorized)
    }
}

/// `Ok` when the request may call `/v1/check`.
pub fn require_check(req: &HttpRequest, token: &str) -> Result<(), ApiError> {
    if check_allowed(bearer(req), token) {
        Ok(())
    } else {
        Err(ApiError::Unauthorized)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(s: &str) -> Option<SocketAddr> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn a_check_without_a_token_is_open_beyond_loopback_only() {
        let at = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert!(check_open_to_network(&at("0.0.0.0:8080"), ""));
        assert!(check_open_to_network(&at("[::]:8080"), ""));
        assert!(check_open_to_network(&at("10.0.0.7:8080"), ""));
        assert!(!check_open_to_network(&at("127.0.0.1:8080"), ""));
        assert!(!check_open_to_network(&at("[::1]:8080"), ""));
        assert!(!check_open_to_network(&at("0.0.0.0:8080"), "chk"));
    }

    #[test]
    fn without_an_admin_token_only_loopback_peers_are_admins() {
        assert!(admin_allowed(peer("127.0.0.1:5000"), None, ""));
        assert!(admin_allowed(peer("[::1]:5000"), None, ""));
        assert!(admin_allowed(peer("[::ffff:127.0.0.1]:5000"), None, ""));
        assert!(!admin_allowed(peer("10.0.0.7:5000"), None, ""));
        assert!(!admin_allowed(
            peer("[2001:db8::1]:5000"),
            Some("anything"),
            ""
        ));
        assert!(!admin_allowed(None, None, ""));
    }

    #[test]
    fn with_an_admin_token_only_the_token_counts() {
        assert!(admin_allowed(
            peer("10.0.0.7:5000"),
            Some("s3cret"),
            "s3cret"
        ));
        assert!(!admin_allowed(peer("127.0.0.1:5000"), None, "s3cret"));
        assert!(!admin_allowed(
            peer("127.0.0.1:5000"),
            Some("s3cre"),
            "s3cret"
        ));
        assert!(!admin_allowed(
            peer("127.0.0.1:5000"),
            Some("s3cret2"),
            "s3cret"
        ));
    }

    #[test]
    fn the_check_token_is_optional_until_set() {
        assert!(check_allowed(None, ""));
        assert!(check_allowed(Some("x"), ""));
        assert!(check_allowed(Some("t"), "t"));
        assert!(!check_allowed(None, "t"));
        assert!(!check_allowed(Some("u"), "t"));
    }
}
