//! The static files of the visitor pages, built into the binary.
//!
//! Embedding them means one binary is the whole deployment and a page can
//! never meet a script from another release. Each file gets an ETag from its
//! content, and pages link to it with that tag in the query (see [`url`]), so
//! browsers may cache for an hour and still pick up a new release at once.

use std::sync::LazyLock;

use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

/// One embedded file.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

const FILES: &[Asset] = &[
    Asset {
        name: "queue.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../../static/queue.js"),
    },
    Asset {
        name: "pow.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../../static/pow.js"),
    },
    Asset {
        name: "pow-worker.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../../static/pow-worker.js"),
    },
    Asset {
        name: "narabu-sw.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../../static/narabu-sw.js"),
    },
    Asset {
        name: "narabu.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("../../static/narabu.css"),
    },
    Asset {
        name: "admin.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../../static/admin.js"),
    },
    Asset {
        name: "admin.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("../../static/admin.css"),
    },
];

/// The first 16 hex digits of each file's SHA-256, in the order of `FILES`,
/// computed once on first use.
static TAGS: LazyLock<Vec<String>> = LazyLock::new(|| {
    FILES
        .iter()
        .map(|file| hex::encode(&Sha256::digest(file.body)[..8]))
        .collect()
});

/// Where [`serve`] is routed: every embedded file; anything else is 404.
pub(crate) const PATH: &str = "/static/{file}";

/// The address pages use for an embedded file, with its content tag in the
/// query so a new release is never served from a stale cache. An unknown
/// name yields the bare path (and a 404 when fetched).
pub(crate) fn url(name: &str) -> String {
    match find(name) {
        Some(index) => format!("/static/{name}?v={}", TAGS[index]),
        None => format!("/static/{name}"),
    }
}

fn find(name: &str) -> Option<usize> {
    FILES.iter().position(|file| file.name == name)
}

/// The pages' scripts and styles
#[utoipa::path(
    get,
    path = "/static/{file}",
    tag = "visitors",
    params(("file" = String, Path, description = "A file name, such as `queue.js`.")),
    responses(
        (status = 200, description = "The file.", content(
            (String = "text/javascript"),
            (String = "text/css"),
        )),
        (status = 304, description = "Not modified since the ETag sent in `If-None-Match`."),
        (status = 404, description = "No such file."),
    ),
)]
pub(crate) async fn serve(Path(name): Path<String>, headers: HeaderMap) -> Response {
    let Some(index) = find(&name) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let file = &FILES[index];
    let etag = format!("\"{}\"", TAGS[index]);
    let etag = HeaderValue::from_str(&etag).unwrap_or(HeaderValue::from_static("\"\""));
    let cache = [
        (header::ETAG, etag.clone()),
        (
            header::CACHE_CONTROL,
            HeaderValue::from_static("public, max-age=3600"),
        ),
    ];
    if if_none_match(&headers, &etag) {
        return (StatusCode::NOT_MODIFIED, cache).into_response();
    }
    (
        cache,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static(file.content_type),
            ),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
        ],
        file.body,
    )
        .into_response()
}

/// Whether `If-None-Match` names this ETag (or `*`); weak tags match too, as
/// RFC 9110 asks for this header.
fn if_none_match(headers: &HeaderMap, etag: &HeaderValue) -> bool {
    let Ok(etag) = etag.to_str() else {
        return false;
    };
    headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(str::trim)
        .any(|tag| tag == "*" || tag.trim_start_matches("W/") == etag)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    async fn get(path: &str, if_none_match: Option<&str>) -> Response {
        let mut request = Request::get(path);
        if let Some(tag) = if_none_match {
            request = request.header(header::IF_NONE_MATCH, tag);
        }
        axum::Router::new()
            .route(PATH, axum::routing::get(serve))
            .oneshot(request.body(Body::empty()).unwrap())
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn serves_each_file_with_its_type_and_caching() {
        for (path, content_type, file) in [
            (
                "/static/queue.js",
                "text/javascript; charset=utf-8",
                &include_bytes!("../../static/queue.js")[..],
            ),
            (
                "/static/narabu.css",
                "text/css; charset=utf-8",
                &include_bytes!("../../static/narabu.css")[..],
            ),
        ] {
            let response = get(path, None).await;
            assert_eq!(response.status(), StatusCode::OK, "{path}");
            let headers = response.headers().clone();
            assert_eq!(headers[header::CONTENT_TYPE], content_type);
            assert_eq!(headers[header::CACHE_CONTROL], "public, max-age=3600");
            assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
            let etag = headers[header::ETAG].to_str().unwrap().to_owned();
            assert!(etag.starts_with('"') && etag.ends_with('"') && etag.len() == 18);
            let body = response.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(&body[..], file);

            let name = path.trim_start_matches("/static/");
            assert_eq!(url(name), format!("{path}?v={}", etag.trim_matches('"')));

            for tag in [
                etag.clone(),
                format!("W/{etag}"),
                format!("\"x\", {etag}"),
                "*".into(),
            ] {
                let response = get(path, Some(&tag)).await;
                assert_eq!(response.status(), StatusCode::NOT_MODIFIED, "{tag}");
                assert_eq!(response.headers()[header::ETAG], etag.as_str());
            }
            let response = get(path, Some("\"stale\"")).await;
            assert_eq!(response.status(), StatusCode::OK);
        }
    }

    #[tokio::test]
    async fn unknown_files_are_not_found() {
        for path in [
            "/static/nope.js",
            "/static/",
            "/static/..%2FCargo.toml",
            "/static/queue.js/x",
            "/static/QUEUE.JS",
        ] {
            assert_eq!(
                get(path, None).await.status(),
                StatusCode::NOT_FOUND,
                "{path}"
            );
        }
        assert_eq!(url("nope.js"), "/static/nope.js");
    }
}
