//! Operator credentials: the admin token (and the origin's release key,
//! and the scraper's metrics token), compared in constant time so a timing
//! side channel reveals nothing.

use axum::http::{HeaderMap, StatusCode};
use subtle::ConstantTimeEq;

use super::error::ApiError;
use super::state::AppState;
use super::ticket::bearer;
use crate::config::Secret;

fn matches(given: &str, secret: &Secret) -> bool {
    given.as_bytes().ct_eq(secret.expose().as_bytes()).into()
}

fn unauthorized() -> ApiError {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "A valid token is required in Authorization: Bearer.",
    )
}

/// The admin token, for the admin API. With no token configured the admin
/// API does not exist (404), rather than being open.
pub(crate) fn require_admin(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(secret) = &state.settings.admin_token else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "The admin API is off: no admin token is configured.",
        ));
    };
    match bearer(headers) {
        Some(given) if matches(given, secret) => Ok(()),
        _ => Err(unauthorized()),
    }
}

/// The admin token or the release key, for `release`.
pub(crate) fn require_release_key(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let given = bearer(headers).ok_or_else(unauthorized)?;
    let accepted = [&state.settings.admin_token, &state.settings.release_key]
        .into_iter()
        .flatten()
        .any(|secret| matches(given, secret));
    if accepted {
        Ok(())
    } else {
        Err(unauthorized())
    }
}

/// The metrics token, for `/metrics`, when one is configured: the figures
/// name every room and how busy it is, which a deployment may not want
/// public.
pub(crate) fn require_metrics_token(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(secret) = &state.settings.metrics_token else {
        return Ok(());
    };
    match bearer(headers) {
        Some(given) if matches(given, secret) => Ok(()),
        _ => Err(unauthorized()),
    }
}
