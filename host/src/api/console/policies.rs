//! `/console/policies`: every policy with its active version (digest, loaded at), its candidate
//! and rollout mode (shadow sample, canary share), the shadow agreement so far, its limits, its
//! recent failures by kind (from the kept decisions), and the promote and roll back actions,
//! which run the registry's own operations (the same as `POST /v1/policies/NAME/promote`).

use super::html::{csrf_field, layout, unix_ms, Text};
use super::session::Viewer;
use super::{check_csrf, html_response, refusal, AppState};
use crate::policy::registry::PolicySummary;
use crate::policy::rollout::AgreementSummary;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use std::collections::BTreeMap;
use std::fmt::Write;

/// Failures by kind among the kept decisions of each policy.
fn recent_failures(state: &AppState) -> BTreeMap<String, BTreeMap<String, u64>> {
    let mut out: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    if let Some(ring) = state.decisions.recent() {
        for k in ring.after(0) {
            if let (Some(p), Some(err)) = (&k.event.policy, &k.event.error) {
                *out.entry(p.name.clone())
                    .or_default()
                    .entry(err.kind.to_string())
                    .or_default() += 1;
            }
        }
    }
    out
}

fn agreement_html(a: &AgreementSummary) -> String {
    let rate = a
        .rate
        .map_or("–".to_string(), |r| format!("{:.1}%", 100.0 * r));
    format!(
        "<table class=\"kv\"><tr><th>shadow agreement</th><td><b class=\"agreement\">{rate}</b> of {} \
({} agree, {} disagree, {} candidate errors, {} skipped)</td></tr>\
<tr><th>decided by</th><td>active {}, candidate {}</td></tr></table>",
        a.shadowed, a.agree, a.disagree, a.candidate_error, a.shadow_skipped, a.decided_by_active, a.decided_by_candidate
    )
}

fn policy_html(
    s: &PolicySummary,
    agreement: &AgreementSummary,
    failures: Option<&BTreeMap<String, u64>>,
    viewer: &Viewer,
    bundle_owned: bool,
    out: &mut String,
) {
    let _ = write!(
        out,
        "<section class=\"policy\" data-policy=\"{name}\"><h2>{name} <small>{}</small></h2><p>{}</p>\
<table class=\"kv\"><tr><th>active version</th><td><code class=\"version\">{}</code> {}</td></tr>\
<tr><th>loaded at</th><td>{}</td></tr><tr><th>reader</th><td>{}</td></tr>\
<tr><th>mode</th><td class=\"mode\">{}</td></tr>",
        Text(s.declared_version.as_deref().unwrap_or("")),
        Text(s.description.as_deref().unwrap_or("")),
        Text(s.version.as_deref().unwrap_or("none loaded")),
        s.wasm_bytes
            .map_or(String::new(), |b| format!("<small>{}</small>", super::html::bytes(b as u64))),
        s.loaded_at_ms.map_or("–".into(), unix_ms),
        Text(s.reader.as_deref().unwrap_or("the default model")),
        Text(s.mode),
        name = Text(&s.name),
    );
    match &s.candidate {
        Some(c) => {
            let share = match c.rollout.mode.as_str() {
                "shadow" => format!(
                    "shadow, sample {:.0}%",
                    100.0 * c.rollout.sample.unwrap_or(1.0)
                ),
                "canary" => format!(
                    "canary, {:.1}% of route keys",
                    c.rollout.percent.unwrap_or(0.0)
                ),
                other => other.to_string(),
            };
            let _ = write!(
                out,
                "<tr><th>candidate</th><td><code class=\"candidate\">{}</code> {} · {} · loaded {}</td></tr>",
                Text(&c.version),
                Text(&c.declared_version),
                Text(&share),
                unix_ms(c.loaded_at_ms)
            );
        }
        None => out.push_str("<tr><th>candidate</th><td>none</td></tr>"),
    }
    let _ = write!(
        out,
        "<tr><th>previous (rollback)</th><td>{}</td></tr><tr><th>calibration</th><td>{}</td></tr>",
        s.previous_version
            .as_ref()
            .map_or("none".into(), |v| format!("<code>{}</code>", Text(v))),
        s.calibration.as_ref().map_or("–".into(), |c| format!(
            "{} {}",
            Text(c.source),
            c.id.as_ref().map_or(String::new(), |id| format!(
                "<code>{}</code>",
                Text(&id[..id.len().min(12)])
            ))
        )),
    );
    if let Some(l) = &s.limits {
        let _ = write!(
            out,
            "<tr><th>limits</th><td>{} ms, {} fuel, {} memory, {} reads, {} questions, {} output</td></tr>",
            l.timeout_ms,
            l.fuel,
            super::html::bytes(l.memory_bytes),
            l.max_reads,
            l.max_questions,
            super::html::bytes(l.max_output_bytes)
        );
    }
    if let Some(r) = s.last_reload.as_ref().filter(|r| !r.ok) {
        let _ = write!(
            out,
            "<tr><th>last reload</th><td class=\"error\">refused at {}: {}</td></tr>",
            unix_ms(r.at_ms),
            Text(r.error.as_deref().unwrap_or(""))
        );
    }
    let failures_text = match failures {
        None => "none among the kept decisions".to_string(),
        Some(f) => f
            .iter()
            .map(|(kind, n)| format!("{kind} {n}"))
            .collect::<Vec<_>>()
            .join(", "),
    };
    let _ = write!(
        out,
        "<tr><th>recent failures</th><td class=\"failures\">{}</td></tr></table>",
        Text(&failures_text)
    );
    if s.candidate.is_some() || agreement.shadowed > 0 {
        out.push_str(&agreement_html(agreement));
    }
    if viewer.role.can_act() && !bundle_owned {
        out.push_str("<div class=\"actions\">");
        if s.candidate.is_some() {
            let _ = write!(
                out,
                "<form method=\"post\" action=\"/console/policies/{}/promote\" data-confirm=\"Promote the candidate of {} to active?\">{}\
<button type=\"submit\" class=\"primary\">Promote candidate</button></form>",
                Text(&s.name),
                Text(&s.name),
                csrf_field(viewer)
            );
        }
        if s.previous_version.is_some() {
            let _ = write!(
                out,
                "<form method=\"post\" action=\"/console/policies/{}/rollback\" data-confirm=\"Roll {} back to its previous version?\">{}\
<button type=\"submit\">Roll back</button></form>",
                Text(&s.name),
                Text(&s.name),
                csrf_field(viewer)
            );
        }
        out.push_str("</div>");
    }
    out.push_str("</section>");
}

pub async fn page(State(state): State<AppState>, Extension(viewer): Extension<Viewer>) -> Response {
    let mut body = String::new();
    match state.console.policies() {
        None => body.push_str("<p>This server runs no policy engine.</p>"),
        Some(sources) => {
            let registry = &sources.registry;
            let summaries = registry.summaries();
            let bundle_owned = registry.is_bundle_owned();
            if bundle_owned {
                body.push_str("<p class=\"note\">A policy bundle owns these policies: promote and roll back by publishing a new bundle revision.</p>");
            } else if !viewer.role.can_act() {
                body.push_str(
                    "<p class=\"muted\">Promote and roll back need a login with the admin key.</p>",
                );
            }
            if summaries.is_empty() {
                body.push_str("<p>No policy is deployed. Put components in the <code>--policies</code> directory or deploy one with <code>PUT /v1/policies/NAME</code>.</p>");
            }
            let failures = recent_failures(&state);
            for s in &summaries {
                let agreement = registry.rollouts().summary(&s.name);
                policy_html(
                    s,
                    &agreement,
                    failures.get(&s.name),
                    &viewer,
                    bundle_owned,
                    &mut body,
                );
            }
        }
    }
    let flash = state.console.sessions.take_flash(&viewer);
    html_response(layout(
        "Policies",
        "/console/policies",
        &viewer,
        flash.as_deref(),
        &body,
    ))
}

#[derive(Debug, serde::Deserialize)]
pub struct ActionForm {
    pub csrf: Option<String>,
}

#[derive(Clone, Copy)]
enum Action {
    Promote,
    Rollback,
}

async fn act(
    state: AppState,
    viewer: Viewer,
    name: String,
    form: ActionForm,
    action: Action,
) -> Response {
    if let Err(refused) = check_csrf(&viewer, form.csrf.as_deref()) {
        return refused;
    }
    if !viewer.role.can_act() {
        return refusal(
            StatusCode::FORBIDDEN,
            "Promote and roll back need a login with the admin key (--admin-key).",
        );
    }
    let Some(sources) = state.console.policies() else {
        return refusal(StatusCode::NOT_FOUND, "This server runs no policy engine.");
    };
    let registry = &sources.registry;
    let outcome = match action {
        Action::Promote => registry.promote(&name).await,
        Action::Rollback => registry.rollback(&name).await,
    };
    let message = match (&outcome, action) {
        (Ok(v), Action::Promote) => {
            tracing::info!(policy = %name, version = %v.version, "promoted from the console");
            format!("Promoted {name}: version {} is active.", v.version)
        }
        (Ok(v), Action::Rollback) => {
            tracing::info!(policy = %name, version = %v.version, "rolled back from the console");
            format!("Rolled {name} back: version {} is active.", v.version)
        }
        (Err(e), _) => format!("{name}: {e}"),
    };
    state.console.sessions.flash(&viewer, message);
    Redirect::to("/console/policies").into_response()
}

pub async fn promote(
    State(state): State<AppState>,
    Extension(viewer): Extension<Viewer>,
    Path(name): Path<String>,
    Form(form): Form<ActionForm>,
) -> Response {
    act(state, viewer, name, form, Action::Promote).await
}

pub async fn rollback(
    State(state): State<AppState>,
    Extension(viewer): Extension<Viewer>,
    Path(name): Path<String>,
    Form(form): Form<ActionForm>,
) -> Response {
    act(state, viewer, name, form, Action::Rollback).await
}
