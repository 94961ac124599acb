//! The OpenAPI document at `GET /api/v1/openapi.json`, fetched from a running API: it is a
//! structurally valid OpenAPI 3 document, and it lists exactly the routes the router serves
//! (the drift check).
//!
//! "Served" is found by asking the router, not by reading the document: every path the
//! document names and every path literal in the API's sources (`daemon/src/api`,
//! `daemon/src/console`) is requested with each method; a method is served unless the
//! router answers 405 (known path, other method) or its fallback's 404 ("no such route").
//! A route added with a plain `.route(…)` instead of `routes!` is served but undocumented,
//! and fails the check; `drift_check_sees_an_undocumented_route` shows that it does.
//! The console (`/console/…`) is out of the document by design.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use dltsub_store::testing::TestBackend;
use reqwest::Method;
use serde_json::Value;
use support::{Api, TOKEN, api, api_serving};

const DOCUMENT: &str = "/api/v1/openapi.json";
/// The methods probed on every path (HEAD and OPTIONS are axum's own for every GET).
const METHODS: [&str; 5] = ["get", "post", "put", "patch", "delete"];
/// The operations of a path item, by the specification.
const OPERATIONS: [&str; 8] = [
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

async fn document(api: &Api) -> Value {
    let response = api
        .http
        .get(format!("{}{DOCUMENT}", api.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "application/json"
    );
    response.json().await.unwrap()
}

/// What is wrong with `doc` as an OpenAPI 3 document (empty when nothing).
fn structural_problems(doc: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let mut problem = |text: String| problems.push(text);
    match doc["openapi"].as_str() {
        Some(version) if version.starts_with("3.") => {}
        other => problem(format!("openapi is {other:?}, not 3.x")),
    }
    for key in ["title", "version"] {
        if !doc["info"][key].is_string() {
            problem(format!("info.{key} is missing"));
        }
    }
    let Some(paths) = doc["paths"].as_object().filter(|paths| !paths.is_empty()) else {
        problem("no paths".into());
        return problems;
    };
    let schemes = doc["components"]["securitySchemes"].as_object();
    let mut operation_ids = BTreeSet::new();
    for (path, item) in paths {
        if !path.starts_with('/') {
            problem(format!("path {path:?} does not start with /"));
        }
        let template_params: BTreeSet<String> = path
            .split('{')
            .skip(1)
            .filter_map(|rest| rest.split_once('}').map(|(name, _)| name.to_string()))
            .collect();
        let Some(item) = item.as_object() else {
            problem(format!("{path}: not an object"));
            continue;
        };
        for (method, operation) in item {
            if !OPERATIONS.contains(&method.as_str()) {
                if method != "parameters" && method != "summary" && method != "description" {
                    problem(format!("{path}: unexpected key {method:?}"));
                }
                continue;
            }
            let at = format!("{} {path}", method.to_uppercase());
            match operation["operationId"].as_str() {
                Some(id) if !operation_ids.insert(id.to_string()) => {
                    problem(format!("{at}: operationId {id:?} is not unique"))
                }
                Some(_) => {}
                None => problem(format!("{at}: no operationId")),
            }
            let mut path_params = BTreeSet::new();
            for parameter in operation["parameters"].as_array().into_iter().flatten() {
                let name = parameter["name"].as_str().unwrap_or_default();
                let location = parameter["in"].as_str().unwrap_or_default();
                if name.is_empty() || !["query", "header", "path", "cookie"].contains(&location) {
                    problem(format!("{at}: parameter {parameter}"));
                }
                if parameter["schema"].is_null() && parameter["content"].is_null() {
                    problem(format!("{at}: parameter {name} has no schema"));
                }
                if location == "path" {
                    if parameter["required"] != true {
                        problem(format!("{at}: path parameter {name} not required"));
                    }
                    path_params.insert(name.to_string());
                }
            }
            if path_params != template_params {
                problem(format!(
                    "{at}: path parameters {path_params:?} differ from the template's {template_params:?}"
                ));
            }
            if let Some(body) = operation.get("requestBody") {
                match body["content"].as_object() {
                    Some(content) if !content.is_empty() => {}
                    _ => problem(format!("{at}: requestBody without content")),
                }
            }
            let Some(responses) = operation["responses"]
                .as_object()
                .filter(|responses| !responses.is_empty())
            else {
                problem(format!("{at}: no responses"));
                continue;
            };
            for (status, response) in responses {
                let valid_status = status == "default"
                    || (status.len() == 3
                        && status.bytes().all(|b| b.is_ascii_digit())
                        && (b'1'..=b'5').contains(&status.as_bytes()[0]));
                if !valid_status {
                    problem(format!("{at}: response key {status:?}"));
                }
                if !response["description"].is_string() {
                    problem(format!("{at} {status}: no description"));
                }
            }
            for requirement in operation["security"].as_array().into_iter().flatten() {
                for scheme in requirement
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(k, _)| k)
                {
                    if !schemes.is_some_and(|schemes| schemes.contains_key(scheme)) {
                        problem(format!("{at}: security scheme {scheme:?} is not defined"));
                    }
                }
            }
        }
    }
    // Every $ref points at something in the document.
    let mut refs = Vec::new();
    collect_refs(doc, &mut refs);
    for reference in refs {
        let resolved = reference
            .strip_prefix('#')
            .and_then(|pointer| doc.pointer(pointer));
        if resolved.is_none() {
            problem(format!("$ref {reference:?} does not resolve"));
        }
    }
    problems
}

fn collect_refs(value: &Value, refs: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("$ref", Value::String(reference)) => refs.push(reference.clone()),
                    _ => collect_refs(value, refs),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| collect_refs(item, refs)),
        _ => {}
    }
}

/// `(METHOD, path template)` of every operation the document lists.
fn documented(doc: &Value) -> BTreeSet<(String, String)> {
    let mut operations = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            if OPERATIONS.contains(&method.as_str()) {
                operations.insert((method.to_uppercase(), path.clone()));
            }
        }
    }
    operations
}

/// Every string literal in the `.rs` files under `dir` that looks like a route path:
/// `/` followed by path characters and `{param}`s only.
fn path_literals(dir: &Path, found: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            path_literals(&path, found);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            for (start, _) in text.match_indices("\"/") {
                let rest = &text[start + 1..];
                let Some(end) = rest[1..].find('"') else {
                    continue;
                };
                let literal = &rest[..end + 1];
                let path_like = literal.len() > 1
                    && literal
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "/_-.{}".contains(c));
                if path_like {
                    found.insert(literal.to_string());
                }
            }
        }
    }
}

/// The routes the API at `api` serves among `candidates` (path templates), outside the
/// console, probed with every method of [`METHODS`].
async fn served(api: &Api, candidates: &BTreeSet<String>) -> BTreeSet<(String, String)> {
    let mut served = BTreeSet::new();
    for template in candidates {
        if template.starts_with("/console") {
            continue;
        }
        // Any text fills a parameter: the handlers refuse it with their own 4xx.
        let concrete: String = template
            .split('{')
            .enumerate()
            .map(|(i, part)| match (i, part.split_once('}')) {
                (0, _) | (_, None) => part.to_string(),
                (_, Some((_, rest))) => format!("probe{rest}"),
            })
            .collect();
        for method in METHODS {
            let method = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let response = api
                .http
                .request(method.clone(), format!("{}{concrete}", api.base))
                .bearer_auth(TOKEN)
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            let body: Value = response.json().await.unwrap_or(Value::Null);
            let router_miss = status == 405
                || (status == 404 && (body.is_null() || body["error"]["code"] == "not_found"));
            if !router_miss {
                served.insert((method.to_string(), template.clone()));
            }
        }
    }
    served
}

/// `served` and `documented`, each with what the other lacks.
fn differences(
    served: &BTreeSet<(String, String)>,
    documented: &BTreeSet<(String, String)>,
) -> BTreeMap<&'static str, Vec<(String, String)>> {
    let mut differences = BTreeMap::new();
    let undocumented: Vec<_> = served.difference(documented).cloned().collect();
    let unserved: Vec<_> = documented.difference(served).cloned().collect();
    if !undocumented.is_empty() {
        differences.insert("served but not documented", undocumented);
    }
    if !unserved.is_empty() {
        differences.insert("documented but not served", unserved);
    }
    differences
}

fn candidates(doc: &Value) -> BTreeSet<String> {
    let mut candidates: BTreeSet<String> =
        doc["paths"].as_object().unwrap().keys().cloned().collect();
    let sources = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    path_literals(&sources.join("api"), &mut candidates);
    path_literals(&sources.join("console"), &mut candidates);
    candidates
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn document_is_valid_openapi_3() {
    let api = api(TestBackend::Sqlite).await;
    let doc = document(&api).await;
    let problems = structural_problems(&doc);
    assert!(problems.is_empty(), "{problems:#?}");

    // What the document must say beyond its structure.
    let operation = |method: &str, path: &str| doc["paths"][path][method].clone();
    for (method, path) in [
        ("post", "/scabbard/{circuit}/{service}/batches"),
        ("post", "/batches"),
        ("post", "/api/v1/services/{service_id}/batches"),
    ] {
        let body = &operation(method, path)["requestBody"]["content"]["application/octet-stream"];
        assert_eq!(
            body["schema"]["$ref"], "#/components/schemas/BatchListBody",
            "{path}"
        );
    }
    assert_eq!(
        doc["components"]["schemas"]["BatchListBody"]["format"],
        "binary"
    );
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"],
        serde_json::json!({"type": "http", "scheme": "bearer"})
    );
    let guarded = operation("post", "/api/v1/services/{service_id}/pause");
    assert_eq!(guarded["security"], serde_json::json!([{"bearer": []}]));
    assert!(guarded["responses"]["401"].is_object());
    for (method, path) in [
        ("get", "/api/v1/services"),
        ("post", "/batches"),
        ("get", "/scabbard/{circuit}/{service}/batch_statuses"),
    ] {
        assert!(
            operation(method, path)["security"].is_null(),
            "{path} is open"
        );
    }
    let v1_error = &operation("get", "/api/v1/batches")["responses"]["400"]["content"]["application/json"]
        ["schema"];
    assert_eq!(v1_error["$ref"], "#/components/schemas/ErrorBody");
    let statuses = operation("get", "/api/v1/batches");
    let query: BTreeSet<&str> = statuses["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(query, BTreeSet::from(["ids", "service_id", "wait"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn document_lists_exactly_the_routes_served() {
    let api = api(TestBackend::Sqlite).await;
    let doc = document(&api).await;
    let documented = documented(&doc);
    let served = served(&api, &candidates(&doc)).await;
    let differences = differences(&served, &documented);
    assert!(differences.is_empty(), "{differences:#?}");
    // The candidates reached every part of the API (an empty probe would agree trivially).
    for route in [
        ("GET", "/healthz"),
        ("GET", "/readyz"),
        ("GET", DOCUMENT),
        ("POST", "/batches"),
        ("GET", "/batch_statuses"),
        ("POST", "/batch_statuses"),
        ("POST", "/scabbard/{circuit}/{service}/batches"),
        ("GET", "/scabbard/{circuit}/{service}/batch_statuses"),
        ("POST", "/api/v1/services/{service_id}/batches"),
        ("GET", "/api/v1/claims"),
    ] {
        assert!(
            served.contains(&(route.0.to_string(), route.1.to_string())),
            "{route:?} not served"
        );
    }
    assert_eq!(documented.len(), 21, "{documented:#?}");
}

/// The drift check fails when the router serves a route the document lacks: the real
/// router with one route added the plain axum way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_check_sees_an_undocumented_route() {
    let api = api_serving(TestBackend::Sqlite, Default::default(), |router| {
        axum::Router::new()
            .route(
                "/api/v1/undocumented/{id}",
                axum::routing::delete(|| async { "served" }),
            )
            .merge(router)
    })
    .await;
    let doc = document(&api).await;
    let mut candidates = candidates(&doc);
    candidates.insert("/api/v1/undocumented/{id}".into());
    let served = served(&api, &candidates).await;
    let differences = differences(&served, &documented(&doc));
    assert_eq!(
        differences,
        BTreeMap::from([(
            "served but not documented",
            vec![(
                "DELETE".to_string(),
                "/api/v1/undocumented/{id}".to_string()
            )]
        )])
    );
}

/// A request: method, path and optional (content type, body).
type Call = (Method, String, Option<(&'static str, Vec<u8>)>);

// Regression tests for what scripts/schemathesis found (each answered other than the document
// says before its fix).

/// A query string that does not parse (a parameter given twice) is refused in the route's
/// own JSON error format, not axum's `text/plain` "Failed to deserialize query string".
async fn unparsable_query_is_refused_as_json(backend: TestBackend) {
    let api = api(backend).await;
    let id = support::batch(1).header_signature;
    let cases: [Call; 5] = [
        (
            Method::GET,
            format!("/api/v1/batches?ids={id}&ids={id}"),
            None,
        ),
        (
            Method::POST,
            "/api/v1/services/c::s/batches?wait=1s&wait=1s".into(),
            Some((
                "application/octet-stream",
                support::list(vec![support::batch(1)]),
            )),
        ),
        (
            Method::GET,
            format!("/batch_statuses?id={id}&id={id}"),
            None,
        ),
        (
            Method::POST,
            "/batch_statuses?wait=1&wait=1".into(),
            Some(("application/json", format!("[\"{id}\"]").into_bytes())),
        ),
        (
            Method::GET,
            format!("/scabbard/c/s/batch_statuses?ids={id}&ids={id}"),
            None,
        ),
    ];
    for (method, path, body) in cases {
        let (status, body) = api.call(method, &path, Some(TOKEN), body).await;
        assert_eq!(status, 400, "{path}: {body}");
        if path.starts_with("/api/v1") {
            assert_eq!(body["error"]["field"], "query", "{path}: {body}");
        } else if path.starts_with("/scabbard") {
            assert_eq!(
                body,
                serde_json::json!({"code": "400", "message": "Invalid query"})
            );
        } else {
            assert_eq!(body["error"]["title"], "Invalid Query", "{path}: {body}");
        }
    }
    assert_eq!(api.store.count_rows_for_tests("batches").await, 0);
}

/// A path segment that is not UTF-8 once decoded is refused as JSON too.
async fn non_utf8_path_is_refused_as_json(backend: TestBackend) {
    let api = api(backend).await;
    let (status, body) = api.get("/api/v1/services/%FF").await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["field"], "path", "{body}");
    let (status, body) = api.get("/scabbard/%FF/s/batch_statuses?ids=a").await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["code"], "400", "{body}");
}

/// The JSON bodies of pin and max_in_flight must be objects: serde also reads a struct from
/// an array of its fields' values, so `[null, null]` cleared a pin and `[5]` set
/// max_in_flight, answering 200 to a body the document refuses.
async fn json_bodies_must_be_objects(backend: TestBackend) {
    let api = api(backend).await;
    let (status, _) = api
        .post(
            "/scabbard/c/s/batches",
            support::list(vec![support::batch(1)]),
        )
        .await;
    assert_eq!(status, 202);
    let post = |path: &'static str, body: &'static str| {
        api.call(
            Method::POST,
            path,
            Some(TOKEN),
            Some(("application/json", body.as_bytes().to_vec())),
        )
    };
    let (status, _) = post("/api/v1/services/c::s/pin", r#"{"pin_label": "gpu"}"#).await;
    assert_eq!(status, 200);
    let (status, body) = post("/api/v1/services/c::s/pin", "[null, null]").await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["field"], "body");
    let (status, body) = post("/api/v1/services/c::s/max_in_flight", "[5]").await;
    assert_eq!(status, 400, "{body}");
    let (_, service) = api.get("/api/v1/services/c::s").await;
    assert_eq!(service["max_in_flight"], 1, "{service}");
    let pins = api
        .store
        .scalar_i64_for_tests("(SELECT COUNT(*) FROM services WHERE pin_label = 'gpu')")
        .await;
    assert_eq!(pins, 1, "the refused body changed nothing");
}

dltsub_store::backend_tests!(
    unparsable_query_is_refused_as_json,
    non_utf8_path_is_refused_as_json,
    json_bodies_must_be_objects,
);
