//! `/console/calibration`: the calibrations in use — the server's (`--calibration`) and each
//! policy version's own — drawn from the very file they were loaded from, with the sections
//! `hunch calibrate --report` draws (`calibration::report`): per question its temperature, the
//! reliability diagrams before and after, ECE and the other metrics, and the cut-points.

use super::html::{layout, Text};
use super::session::Viewer;
use super::{html_response, AppState};
use crate::calibration::file::Calibrations;
use crate::calibration::report::{metrics_table, question_section};
use crate::policy::calibration::PolicyCalibration;
use axum::extract::State;
use axum::response::Response;
use axum::Extension;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Arc;

/// One calibration's sections: its id, who uses it, its overall numbers, each question.
fn calibration_html(c: &Calibrations, users: &[String], out: &mut String) {
    let file = &c.file;
    let _ = write!(
        out,
        "<section class=\"calibration\"><h2>Calibration <code>{}</code></h2><p>Used by {}. \
{} questions fitted, {} refused; measured on {} held-out folds, ECE over {} bins ({}).</p>",
        Text(&c.id[..c.id.len().min(16)]),
        Text(&users.join(", ")),
        file.questions.len(),
        file.refused.len(),
        file.folds,
        file.ece_bins,
        Text(&file.ece_binning),
    );
    if let Some(all) = &file.overall {
        let _ = write!(
            out,
            "<h3>All questions ({} labels)</h3>{}",
            all.labels,
            metrics_table(&all.before, &all.after)
        );
    }
    for q in &file.questions {
        // The report's own section: its text is escaped there.
        question_section(out, q);
    }
    out.push_str("</section>");
}

pub async fn page(State(state): State<AppState>, Extension(viewer): Extension<Viewer>) -> Response {
    // Each calibration once, with everyone who uses it.
    let mut in_use: BTreeMap<String, (Arc<Calibrations>, Vec<String>)> = BTreeMap::new();
    let mut add = |c: Arc<Calibrations>, user: String| {
        in_use
            .entry(c.id.clone())
            .or_insert_with(|| (c.clone(), Vec::new()))
            .1
            .push(user);
    };
    if let Some(c) = state.calibration.current() {
        add(
            c,
            "the server (--calibration): /v1/systemone and policies without their own".into(),
        );
    }
    if let Some(sources) = state.console.policies() {
        for (name, version) in sources.registry.versions() {
            match &version.calibration {
                PolicyCalibration::File { calibrations, .. }
                | PolicyCalibration::Bundled { calibrations, .. } => {
                    add(
                        calibrations.clone(),
                        format!("policy {name} version {}", version.version),
                    );
                }
                PolicyCalibration::Server | PolicyCalibration::Off => {}
            }
        }
    }
    let mut body = String::new();
    if in_use.is_empty() {
        body.push_str(
            "<p>No calibration is in use: answers are the model's raw distributions. Fit one from \
labelled decisions with <code>hunch calibrate</code> and serve it with <code>--calibration FILE</code> \
(docs/calibration.md).</p>",
        );
    }
    for (c, users) in in_use.values() {
        calibration_html(c, users, &mut body);
    }
    let flash = state.console.sessions.take_flash(&viewer);
    html_response(layout(
        "Calibration",
        "/console/calibration",
        &viewer,
        flash.as_deref(),
        &body,
    ))
}
