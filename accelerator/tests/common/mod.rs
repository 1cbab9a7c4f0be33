//! What the decision-model parity tests share. Each test binary uses part of it.
#![allow(dead_code)]

use hunch_accelerator::engine::CausalEngineOptions;
use hunch_accelerator::model::causal::cpu::kernels::quant::Precision;
use hunch_accelerator::model::causal::CausalKernels;
use serde_json::Value;

/// The setups a marker read (kev, laya) is checked on: the default (the native path,
/// activations rounded to 16 bits), the native path rounding them to 8 bits as llama.cpp does,
/// and MLX's operations throughout.
pub fn setups() -> [(&'static str, CausalEngineOptions); 3] {
    [
        ("native", CausalEngineOptions::default()),
        (
            "native, 8-bit activations",
            CausalEngineOptions {
                activations: Precision::Coarse,
                ..CausalEngineOptions::default()
            },
        ),
        (
            "mlx",
            CausalEngineOptions {
                kernels: CausalKernels::Mlx,
                ..CausalEngineOptions::default()
            },
        ),
    ]
}

/// The same answer: the same choice where llama.cpp's is clear, every number within tolerance
/// (a probability within `probability_tolerance`, a score or confidence within ten times it).
pub fn compare_answers(ours: &Value, theirs: &Value, name: &str, probability_tolerance: f64) {
    assert_eq!(ours["type"], theirs["type"], "{name}");
    let (Some(a), Some(b)) = (ours.as_object(), theirs.as_object()) else {
        panic!("{name}: answers are not objects")
    };
    for (key, expected) in b {
        let got = &a[key];
        match (got, expected) {
            (Value::Number(x), Value::Number(y)) => {
                let (x, y) = (
                    x.as_f64().unwrap_or(f64::NAN),
                    y.as_f64().unwrap_or(f64::NAN),
                );
                // A confidence or a score spreads a probability's difference over the options.
                assert!(
                    (x - y).abs() <= 10.0 * probability_tolerance,
                    "{name}: {key} {x} vs {y}"
                );
            }
            (Value::Object(x), Value::Object(y)) => {
                assert_eq!(
                    x.keys().collect::<Vec<_>>(),
                    y.keys().collect::<Vec<_>>(),
                    "{name}: {key}"
                );
                for (k, v) in y {
                    let (p, q) = (x[k].as_f64().unwrap_or(f64::NAN), v.as_f64().unwrap_or(0.0));
                    assert!(
                        (p - q).abs() <= probability_tolerance,
                        "{name}: {k} {p} vs {q}"
                    );
                }
            }
            (Value::String(x), Value::String(y)) if key == "choice" && x != y => {
                let p = |v: &Value| v["probabilities"].as_object().cloned().unwrap_or_default();
                let theirs = p(theirs);
                let margin = theirs[y].as_f64().unwrap_or(0.0) - theirs[x].as_f64().unwrap_or(0.0);
                assert!(margin <= 2.0 * probability_tolerance, "{name}: {x} vs {y}");
            }
            _ => assert_eq!(got, expected, "{name}: {key}"),
        }
    }
}

/// A read's label distributions and the answers made from them against llama.cpp's, question by
/// question (`expected`: each question's distribution and answer, in order); the largest
/// probability difference.
pub fn compare_read(
    name: &str,
    request: &hunch_core::ReadRequest,
    distributions: &[hunch_core::LabelDistribution],
    expected: &[(&[f64], &Value)],
    probability_tolerance: f64,
) -> f64 {
    let mut worst = 0f64;
    for (q, (distribution, theirs)) in expected.iter().enumerate() {
        let ours = &distributions[q].0;
        assert_eq!(ours.len(), distribution.len(), "{name}: q{q}");
        for (a, b) in ours.iter().zip(distribution.iter()) {
            worst = worst.max((a - b).abs());
            assert!(
                (a - b).abs() <= probability_tolerance,
                "{name}: q{q} distribution {ours:?} against llama.cpp's {distribution:?}"
            );
        }
        let answer =
            hunch_core::Answer::from_distribution(&request.questions[q], &distributions[q])
                .expect("answer");
        let answer = serde_json::to_value(answer).expect("json");
        compare_answers(
            &answer,
            theirs,
            &format!("{name}: q{q}"),
            probability_tolerance,
        );
    }
    worst
}
