//! The HTTP calls the end-to-end tests make again and again: post a JSON body, read a JSON or text
//! answer, read `/metrics`. A failure to send or to read a body is a broken test setup, so these
//! panic with what failed; statuses are returned for the test to check.

use reqwest::header::HeaderMap;
use reqwest::RequestBuilder;
use serde_json::Value;
use std::iter::Sum;
use std::str::FromStr;

/// Sends `request` and returns the status, the headers and the body as JSON (`Null` when the
/// body is not JSON).
pub async fn send_json(request: RequestBuilder) -> (u16, HeaderMap, Value) {
    let r = request.send().await.expect("the request is sent");
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    (status, headers, r.json().await.unwrap_or(Value::Null))
}

/// Posts `body` as JSON to `url` (the whole address) with `headers`; see [`send_json`].
pub async fn post_json(
    url: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> (u16, HeaderMap, Value) {
    let mut request = reqwest::Client::new().post(url).json(body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    send_json(request).await
}

/// Posts `body` to the System One endpoint of the server at `url` and returns the response.
pub async fn post_systemone(url: &str, body: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{url}/v1/systemone"))
        .json(body)
        .send()
        .await
        .expect("the request is sent")
}

/// Sends `request` and returns its body as JSON, whatever the status.
pub async fn json_of(request: RequestBuilder) -> Value {
    let r = request.send().await.expect("the request is sent");
    r.json().await.expect("a JSON body")
}

/// Sends `request` and returns its body as text, whatever the status.
pub async fn text_of(request: RequestBuilder) -> String {
    let r = request.send().await.expect("the request is sent");
    r.text().await.expect("a body")
}

/// GETs `url` and returns its body as JSON.
pub async fn get_json(url: &str) -> Value {
    json_of(reqwest::Client::new().get(url)).await
}

/// The Prometheus text of the server at `url`.
pub async fn metrics(url: &str) -> String {
    text_of(reqwest::Client::new().get(format!("{url}/metrics"))).await
}

/// The sum of the values of the metric lines of the server at `url` that start with
/// `line_prefix` (a name, or a name and the start of its labels); lines whose value does not
/// parse as `T` are skipped.
pub async fn metric<T: FromStr + Sum>(url: &str, line_prefix: &str) -> T {
    metric_in(&metrics(url).await, line_prefix)
}

/// [`metric`] over Prometheus text already read.
pub fn metric_in<T: FromStr + Sum>(text: &str, line_prefix: &str) -> T {
    text.lines()
        .filter(|l| l.starts_with(line_prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<T>().ok())
        .sum()
}

/// The entry `name` of the server at `url`'s `GET /v1/models` (panics, showing the list, when it
/// is not listed).
pub async fn listed_model(url: &str, name: &str) -> Value {
    let list = get_json(&format!("{url}/v1/models")).await;
    list["models"]
        .as_array()
        .and_then(|m| m.iter().find(|e| e["name"] == name).cloned())
        .unwrap_or_else(|| panic!("{name} is not listed: {list}"))
}
