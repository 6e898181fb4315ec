//! The operator's console (`serve --console`, docs/console.md): one page of plain HTML, CSS
//! and JavaScript embedded in the binary, which shows the fleet through the documented API
//! (`/v1/whoami`, `/v1/admin/...`, `/v1/kernels`, `/v1/nodes`, `/v1/usage`, and what happened
//! lately: `/v1/events`, `.../sessions/{session}/events`, `/v1/audit`, `/v1/egress/refusals`)
//! and acts through it (end a session, drain a node, reload the configuration). The page holds
//! no secret: the token is exchanged for an HttpOnly cookie, which the API reads only on
//! requests carrying the console's own header (`auth.rs`).
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | [`mount`]: the console's routes and headers (a strict Content-Security-Policy) |
//! | `auth.rs` | `/console?token=` exchanged for a cookie; the cookie as the bearer token of the page's API calls, CSRF-safe |
//! | `assets/` | `index.html`, `app.js`, `app.css`: the page, served as they are |
//!
//! What it makes the host hold: nothing per visitor (the cookie is the token itself, kept by
//! the browser); the page refreshes one round at a time (at most nine API calls), 5 s after the
//! previous round ended, each call bounded as the API's are.

mod auth;

use axum::http::{header, HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use super::AppState;

/// The console's Content-Security-Policy: its own scripts, styles and API only; no inline
/// script or style, no frame, no form posting elsewhere.
pub(crate) const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'self'; \
     frame-ancestors 'none'";

const INDEX: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");

/// `router` with the console's routes, and its cookie read as the bearer token of the API's
/// calls that carry the console's header (`auth.rs`).
pub(super) fn mount(router: Router<AppState>) -> Router<AppState> {
    router
        .route("/console", get(auth::page))
        .route("/console/", get(auth::page))
        .route("/console/app.js", get(app_js))
        .route("/console/app.css", get(app_css))
        .route("/console/logout", post(auth::logout))
        .layer(axum::middleware::from_fn(auth::cookie_bearer))
}

/// The headers every console answer carries.
fn secured(content_type: &'static str, body: impl IntoResponse) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_TYPE, content_type),
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
        (
            HeaderName::from_static("cross-origin-opener-policy"),
            "same-origin",
        ),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// The page itself (the same for every caller: what it shows comes from the API).
fn index() -> Response {
    secured("text/html; charset=utf-8", INDEX)
}

async fn app_js() -> Response {
    secured("text/javascript; charset=utf-8", APP_JS)
}

async fn app_css() -> Response {
    secured("text/css; charset=utf-8", APP_CSS)
}
