//! The dashboard at `/`: one static page, with a little JavaScript that
//! reads and acts through the JSON API (`/v1`), so it works on every engine
//! and needs no build step; it refreshes itself every two seconds.

use std::sync::Arc;

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

use crate::protocol::session::Shared;
use crate::store::Store;

/// The page, compiled in.
const PAGE: &str = include_str!("dashboard.html");

/// The dashboard's route.
pub fn routes<S: Store>() -> Router<Arc<Shared<S>>> {
    Router::new().route("/", get(page))
}

async fn page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            // The page holds no data; what it shows comes from the API.
            (header::CACHE_CONTROL, "no-cache"),
            // Never inside another site's page: its requests are the API's
            // own origin's, so a page that framed it could make a visitor
            // click its buttons (kick all) unawares.
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::CONTENT_SECURITY_POLICY, "frame-ancestors 'none'"),
        ],
        PAGE,
    )
}
