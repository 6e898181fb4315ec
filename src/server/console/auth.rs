//! Who the console's visitor is (docs/console.md, "Signing in").
//!
//! As Jupyter does, `GET /console?token=T` checks `T` (the admin token, or a tenant's) and
//! answers a redirect to `/console` setting the cookie [`COOKIE`] (HttpOnly, SameSite=Strict):
//! the token leaves the address bar and the history, the page's script never sees it, and the
//! access log records routes, never queries (`api/access.rs`). A refused token is 401, and sets
//! nothing.
//!
//! The cookie stands for the bearer token only on a request carrying [`CONSOLE_HEADER`] and
//! no `Authorization` of its own ([`cookie_bearer`]): a page of another site can neither send
//! that header without a CORS preflight (never answered) nor make the browser send a
//! SameSite=Strict cookie, so a forged form or link does nothing. The cookie is then checked
//! as any bearer token is, on every call: a tenant's cookie sees what its token sees, no more.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::server::error::ApiError;
use crate::server::AppState;

/// The cookie holding the console's token.
pub(crate) const COOKIE: &str = "kernelbox_console";

/// The header the console's script sends on every API call; without it the cookie is ignored.
pub(crate) const CONSOLE_HEADER: &str = "x-kernelbox-console";

/// How long the cookie lasts, seconds (12 hours).
const COOKIE_MAX_AGE: u64 = 12 * 3600;

/// The query of `GET /console`.
#[derive(Debug, serde::Deserialize)]
pub(super) struct PageQuery {
    token: Option<String>,
}

/// `GET /console`: the page; with `?token=`, the token exchanged for the cookie.
pub(super) async fn page(
    State(state): State<AppState>,
    query: Result<Query<PageQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Response {
    let Some(token) = query.ok().and_then(|Query(q)| q.token) else {
        return super::index();
    };
    let token = token.trim();
    let valid = cookie_safe(token)
        && (state.admin_token_is(token) || state.tenants().authenticate(token).is_some());
    if !valid {
        state.metrics().rejected("unauthorized");
        return super::secured(
            "text/plain; charset=utf-8",
            (
                StatusCode::UNAUTHORIZED,
                "that token is refused: open /console?token=TOKEN with the admin token or a tenant's\n",
            ),
        );
    }
    let secure = match forwarded_https(&headers) {
        true => "; Secure",
        false => "",
    };
    let cookie = format!(
        "{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict; Max-Age={COOKIE_MAX_AGE}{secure}"
    );
    redirect_with(cookie)
}

/// `POST /console/logout` (with [`CONSOLE_HEADER`]): the cookie cleared.
pub(super) async fn logout(headers: HeaderMap) -> Response {
    if !headers.contains_key(CONSOLE_HEADER) {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "console_header_missing",
            format!("the console's own calls carry {CONSOLE_HEADER}"),
        )
        .into_response();
    }
    let mut response = StatusCode::NO_CONTENT.into_response();
    let cookie = format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0");
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

fn redirect_with(cookie: String) -> Response {
    let mut response = super::secured(
        "text/plain; charset=utf-8",
        (StatusCode::SEE_OTHER, "signed in: see /console\n"),
    );
    let headers = response.headers_mut();
    headers.insert(header::LOCATION, HeaderValue::from_static("/console"));
    match HeaderValue::from_str(&cookie) {
        Ok(value) => {
            headers.insert(header::SET_COOKIE, value);
        }
        Err(_) => return ApiError::unauthorized().into_response(),
    }
    response
}

/// True when a proxy in front says the browser came over HTTPS (the cookie is then `Secure`).
fn forwarded_https(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"https"))
}

/// True when `token` can be a cookie's value as it is (RFC 6265's cookie-octets).
fn cookie_safe(token: &str) -> bool {
    !token.is_empty()
        && token
            .bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'"' | b',' | b';' | b'\\'))
}

/// The console cookie's value in `headers`, if any.
fn cookie_token(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value)
        .filter(|value| cookie_safe(value))
}

/// The middleware: on a request with [`CONSOLE_HEADER`] and no `Authorization`, the console
/// cookie becomes its bearer token. Every other request is left as it came.
pub(super) async fn cookie_bearer(mut request: Request, next: Next) -> Response {
    let headers = request.headers();
    if headers.contains_key(CONSOLE_HEADER) && !headers.contains_key(header::AUTHORIZATION) {
        let bearer = cookie_token(headers)
            .and_then(|token| HeaderValue::from_str(&format!("Bearer {token}")).ok());
        if let Some(bearer) = bearer {
            request.headers_mut().insert(header::AUTHORIZATION, bearer);
        }
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cookie_is_read_only_by_its_name_and_only_when_safe() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; kernelbox_console=tok-1; b=2"),
        );
        assert_eq!(cookie_token(&headers), Some("tok-1"));
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("xkernelbox_console=tok"),
        );
        assert_eq!(cookie_token(&headers), None);
        assert!(!cookie_safe("a;b"));
        assert!(!cookie_safe("a b"));
        assert!(!cookie_safe(""));
        assert!(cookie_safe("tok-abc_123.XYZ"));
    }
}
