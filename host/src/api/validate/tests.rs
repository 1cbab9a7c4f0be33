use super::*;
use serde_json::json;

fn validator() -> RequestValidator {
    RequestValidator::new().expect("the shipped schema compiles")
}

/// The `loc` paths and kinds of a rejected request.
fn rejected(v: Value) -> Vec<(String, String)> {
    match validator().validate(&v) {
        Err(ApiError::Validation(errors)) => errors
            .iter()
            .map(|e| (e.loc_path(), e.kind.clone()))
            .collect(),
        other => panic!("expected a 422 for {v}, got {other:?}"),
    }
}

fn ok(v: Value) -> SystemOneRequest {
    validator().validate(&v).expect("valid request")
}

#[test]
fn x_keep_alive_is_seconds_or_a_duration_and_anything_else_is_named() {
    let with = |keep: Value| {
        json!({"model": "m", "state": "s",
                   "questions": {"q": {"type": "noul", "instructions": "?"}},
                   "x_keep_alive": keep})
    };
    for (keep, seconds) in [
        (json!(0), 0.0),
        (json!(30), 30.0),
        (json!(1.5), 1.5),
        (json!("0"), 0.0),
        (json!("500ms"), 0.5),
        (json!("30s"), 30.0),
        (json!("5m"), 300.0),
        (json!("2h"), 7200.0),
    ] {
        let r = ok(with(keep.clone()));
        assert_eq!(
            r.keep_alive,
            Some(Duration::from_secs_f64(seconds)),
            "{keep}"
        );
        assert!(r.ignored_fields.is_empty(), "a known extension: {keep}");
    }
    for keep in [
        json!(-1),
        json!("-5m"),
        json!("5 minutes"),
        json!("5d"),
        json!(true),
        json!(null),
        json!([5]),
        json!(2_592_001),
        json!("721h"),
    ] {
        let errors = rejected(with(keep.clone()));
        assert!(
            errors.iter().any(|(loc, _)| loc == "body.x_keep_alive"),
            "{keep}: {errors:?}"
        );
    }
    assert_eq!(
        ok(with(json!("1s"))).keep_alive,
        Some(Duration::from_secs(1))
    );
    let absent = ok(json!({"model": "m", "state": "s",
                               "questions": {"q": {"type": "noul", "instructions": "?"}}}));
    assert_eq!(absent.keep_alive, None);
}

#[test]
fn all_three_kinds_become_typed_questions_in_order() {
    let r = ok(json!({
        "model": "jev-latest",
        "state": {"msg": "Zoë was charged twice", "n": 2.0},
        "questions": {
            "zz": {"type": "score", "instructions": "how bad?", "criteria": ["fine", {"level": "bad"}]},
            "é 😀 a long id with spaces": {"type": "noul", "criteria": {"true": "yes"}},
            "": {"type": "choice", "instructions": {"task": "route"}, "criteria": {"billing dept": null, "x": ["a"]}}
        },
        "x_seed": 7, "x_draws": 3
    }));
    assert_eq!(r.state, r#"{"msg": "Zoë was charged twice", "n": 2.0}"#);
    assert_eq!(
        r.options,
        ReadOptions {
            seed: Some(7),
            draws: Some(3),
            ..Default::default()
        }
    );
    let ids: Vec<&str> = r.questions.iter().map(|q| q.id.as_str()).collect();
    assert_eq!(ids, vec!["zz", "é 😀 a long id with spaces", ""]);
    assert_eq!(
        r.questions[0].question.kind,
        QuestionKind::Score {
            levels: vec!["fine".into(), r#"{"level": "bad"}"#.into()]
        }
    );
    assert_eq!(r.questions[0].legend_values.as_ref().map(Vec::len), Some(2));
    assert_eq!(
        r.questions[1].question.kind,
        QuestionKind::Noul {
            yes: Some("yes".into()),
            no: None
        }
    );
    assert_eq!(r.questions[1].question.instructions, "");
    assert_eq!(r.questions[2].question.instructions, r#"{"task": "route"}"#);
    match &r.questions[2].question.kind {
        QuestionKind::Choice { options } => {
            assert_eq!(options[0].name, "billing dept");
            assert_eq!(options[0].description, None);
            assert_eq!(options[1].description.as_deref(), Some(r#"["a"]"#));
        }
        other => panic!("not a choice: {other:?}"),
    }
}

#[test]
fn renaming_ids_gives_identical_questions() {
    let a = ok(
        json!({"model": "m", "state": "s", "questions": {"a": {"type": "noul", "instructions": "x?"}}}),
    );
    let b = ok(
        json!({"model": "m", "state": "s", "questions": {"zzz": {"type": "noul", "instructions": "x?"}}}),
    );
    assert_eq!(a.questions[0].question, b.questions[0].question);
}

#[test]
fn one_sided_absent_and_null_noul_criteria() {
    ok(
        json!({"model": "m", "state": "s", "questions": {"q": {"type": "noul", "criteria": {"false": "no"}}}}),
    );
    ok(
        json!({"model": "m", "state": "s", "questions": {"q": {"type": "noul", "instructions": "x?", "criteria": null}}}),
    );
    ok(
        json!({"model": "m", "state": "s", "questions": {"q": {"type": "noul", "instructions": "x?", "criteria": {"true": null}}}}),
    );
    assert_eq!(
        rejected(
            json!({"model": "m", "state": "s", "questions": {"q": {"type": "noul", "criteria": {"true": null}}}})
        ),
        vec![("body.questions.q".into(), "value_error".into())]
    );
    assert_eq!(
        rejected(json!({"model": "m", "state": "s", "questions": {"q": {"type": "noul"}}})),
        vec![("body.questions.q".into(), "value_error".into())]
    );
}

/// The rule is in the schema itself, so the OpenAPI document and `hunch schema` show it and a
/// client generating requests from them cannot build a noul the server refuses.
#[test]
fn the_schema_itself_says_a_noul_needs_instructions_or_a_criterion() {
    let schema: Value = serde_json::from_str(REQUEST_SCHEMA).unwrap();
    let plain = jsonschema::validator_for(&schema).unwrap();
    let request = |q: Value| json!({"model": "m", "state": "s", "questions": {"q": q}});
    for refused in [
        json!({"type": "noul"}),
        json!({"type": "noul", "instructions": null, "criteria": {"true": null, "false": null}}),
        json!({"type": "noul", "criteria": null}),
    ] {
        assert!(!plain.is_valid(&request(refused.clone())), "{refused}");
        match validator().validate(&request(refused)) {
            Err(ApiError::Validation(errors)) => {
                assert_eq!(errors.len(), 1);
                assert_eq!(errors[0].loc_path(), "body.questions.q");
                assert_eq!(errors[0].msg, NOUL_NEEDS_TEXT);
            }
            other => panic!("expected a 422, got {other:?}"),
        }
    }
    for accepted in [
        json!({"type": "noul", "instructions": ""}),
        json!({"type": "noul", "criteria": {"false": "no"}}),
        json!({"type": "noul", "instructions": null, "criteria": {"true": {"k": 1}}}),
    ] {
        assert!(plain.is_valid(&request(accepted.clone())), "{accepted}");
    }
}

#[test]
fn missing_fields_are_named() {
    assert_eq!(
        rejected(json!({"state": "s", "questions": {"q": {"type": "noul", "instructions": "?"}}})),
        vec![("body.model".into(), "missing".into())]
    );
    assert_eq!(
        rejected(json!({"model": "m", "questions": {"q": {"type": "noul", "instructions": "?"}}})),
        vec![("body.state".into(), "missing".into())]
    );
    assert_eq!(
        rejected(json!({"model": "m", "state": "s"})),
        vec![("body.questions".into(), "missing".into())]
    );
    assert_eq!(
        rejected(json!({"model": "m", "state": "s", "questions": {"q": {"type": "choice"}}})),
        vec![("body.questions.q.criteria".into(), "missing".into())]
    );
    assert_eq!(
        rejected(json!({"model": "m", "state": "s", "questions": {"q": {"instructions": "?"}}})),
        vec![("body.questions.q.type".into(), "missing".into())]
    );
}

#[test]
fn wrong_types_and_empty_maps_are_named() {
    assert_eq!(
        rejected(
            json!({"model": "m", "state": 5, "questions": {"q": {"type": "noul", "instructions": "?"}}})
        ),
        vec![("body.state".into(), "type_error".into())]
    );
    assert_eq!(
        rejected(json!({"model": "m", "state": "s", "questions": {}})),
        vec![("body.questions".into(), "too_short".into())]
    );
    assert_eq!(
        rejected(
            json!({"model": "m", "state": "s", "questions": {"q": {"type": "choice", "criteria": {}}}})
        ),
        vec![("body.questions.q.criteria".into(), "too_short".into())]
    );
    assert_eq!(
        rejected(
            json!({"model": "m", "state": "s", "questions": {"q": {"type": "score", "criteria": []}}})
        ),
        vec![("body.questions.q.criteria".into(), "too_short".into())]
    );
    assert_eq!(
        rejected(
            json!({"model": "m", "state": "s", "questions": {"q": {"type": "maybe", "instructions": "?"}}})
        ),
        vec![("body.questions.q.type".into(), "literal_error".into())]
    );
    assert_eq!(
        rejected(
            json!({"model": "m", "state": "s", "questions": {"7": {"type": "score", "criteria": ["a", null]}}})
        ),
        vec![("body.questions.7.criteria.1".into(), "type_error".into())]
    );
    assert_eq!(
        rejected(
            json!({"model": "m", "state": "s", "questions": {"q": {"type": "noul", "instructions": 3}}})
        ),
        vec![("body.questions.q.instructions".into(), "type_error".into())]
    );
    assert_eq!(
        rejected(
            json!({"model": "m", "state": "s", "questions": {"q": {"type": "noul", "instructions": "?", "criteria": {"maybe": "x"}}}})
        ),
        vec![(
            "body.questions.q.criteria.maybe".into(),
            "extra_forbidden".into()
        )]
    );
}

#[test]
fn option_and_level_limits() {
    let options: Map<String, Value> = (0..255)
        .map(|i| (format!("option number {i}"), Value::Null))
        .collect();
    ok(
        json!({"model": "m", "state": "s", "questions": {"q": {"type": "choice", "criteria": options}}}),
    );
    let options: Map<String, Value> = (0..256).map(|i| (format!("o{i}"), Value::Null)).collect();
    assert_eq!(
        rejected(
            json!({"model": "m", "state": "s", "questions": {"q": {"type": "choice", "criteria": options}}})
        ),
        vec![("body.questions.q.criteria".into(), "too_long".into())]
    );
    let levels: Vec<String> = (0..50).map(|i| format!("level {i}")).collect();
    ok(
        json!({"model": "m", "state": "s", "questions": {"q": {"type": "score", "criteria": levels}}}),
    );
    let levels: Vec<String> = (0..51).map(|i| format!("level {i}")).collect();
    assert_eq!(
        rejected(
            json!({"model": "m", "state": "s", "questions": {"q": {"type": "score", "criteria": levels}}})
        ),
        vec![("body.questions.q.criteria".into(), "too_long".into())]
    );
}

#[test]
fn box_questions_and_assets_are_refused_as_text_only() {
    assert_eq!(
        rejected(
            json!({"model": "m", "state": "s", "questions": {"where": {"type": "box", "instructions": "the dog"}}})
        ),
        vec![("body.questions.where.type".into(), "unsupported".into())]
    );
    assert_eq!(
        rejected(
            json!({"model": "m", "state": "s", "questions": {"q": {"type": "noul", "instructions": "?"}},
                            "assets": {"img": {"type": "image", "format": "png", "data_base64": "AA=="}}})
        ),
        vec![("body.assets".into(), "unsupported".into())]
    );
}

#[test]
fn extensions_are_checked() {
    let r = ok(
        json!({"model": "m", "state": "s", "questions": {"q": {"type": "noul", "instructions": "?"}}, "x_seed": 3.0, "x_draws": 2.0}),
    );
    assert_eq!(
        r.options,
        ReadOptions {
            seed: Some(3),
            draws: Some(2),
            ..Default::default()
        }
    );
    assert_eq!(r.x_questions, None);
    assert_eq!(
        rejected(
            json!({"model": "m", "state": "s", "questions": {"q": {"type": "noul", "instructions": "?"}}, "x_draws": 65})
        ),
        vec![("body.x_draws".into(), "less_than_equal".into())]
    );
    assert_eq!(
        rejected(
            json!({"model": "m", "state": "s", "questions": {"q": {"type": "noul", "instructions": "?"}}, "x_seed": 1.5})
        ),
        vec![("body.x_seed".into(), "type_error".into())]
    );
    assert_eq!(
        rejected(
            json!({"model": "m", "state": "s", "questions": {"q": {"type": "noul", "instructions": "?"}}, "x_draws": 0})
        ),
        vec![("body.x_draws".into(), "greater_than_equal".into())]
    );
    assert_eq!(
        rejected(
            json!({"model": "m", "state": "s", "questions": {"q": {"type": "noul", "instructions": "?"}}, "x_questions": "alone"})
        ),
        vec![("body.x_questions".into(), "literal_error".into())]
    );
    let joint = ok(
        json!({"model": "m", "state": "s", "questions": {"q": {"type": "noul", "instructions": "?"}}, "x_questions": "joint"}),
    );
    assert_eq!(joint.x_questions, Some(QuestionMode::Joint));
    assert_eq!((joint.x_prior, joint.x_order), (None, None));
    let remedies = ok(
        json!({"model": "m", "state": "s", "questions": {"q": {"type": "noul", "instructions": "?"}},
               "x_prior": "divide", "x_order": "cyclic_average"}),
    );
    assert_eq!(remedies.x_prior, Some(hunch_core::PriorMode::Divide));
    assert_eq!(remedies.x_order, Some(hunch_core::OrderMode::CyclicAverage));
    assert!(remedies.ignored_fields.is_empty());
    for (field, bad) in [("x_prior", json!("subtract")), ("x_order", json!(2))] {
        let mut body = json!({"model": "m", "state": "s", "questions": {"q": {"type": "noul", "instructions": "?"}}});
        body[field] = bad;
        let errors = rejected(body);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].0, format!("body.{field}"));
    }
}

#[test]
fn unknown_top_level_fields_are_ignored_and_named_but_not_inside_a_question() {
    let r = ok(
        json!({"model": "m", "state": "s", "x_trace_id": "abc", "x_sed": 1,
                          "questions": {"q": {"type": "noul", "instructions": "?"}}, "metadata": {"a": 1}}),
    );
    assert_eq!(r.ignored_fields, vec!["x_trace_id", "x_sed", "metadata"]);
    assert_eq!(r.options, ReadOptions::default());
    assert_eq!(
        rejected(
            json!({"model": "m", "state": "s", "questions": {"q": {"type": "noul", "instructions": "?", "weight": 2}}})
        ),
        vec![("body.questions.q.weight".into(), "extra_forbidden".into())]
    );
}

#[test]
fn broken_json_is_a_422_on_the_body() {
    match validator().parse(b"{\"model\": ") {
        Err(ApiError::Validation(e)) => assert_eq!(e[0].loc_path(), "body"),
        other => panic!("{other:?}"),
    }
    // NaN is not JSON: refused, never propagated.
    assert!(validator()
        .parse(b"{\"model\": \"m\", \"state\": NaN, \"questions\": {}}")
        .is_err());
}
