use std::collections::BTreeMap;

use super::*;
use crate::checkpoint::gguf::{DecisionKind, DecisionMetadata};
use hunch_core::{ChoiceOption, Question, QuestionKind, ReadRequest};

/// One id per character (its code point): every single letter is one token, no pair is.
struct CharTokenizer;

impl PromptTokenizer for CharTokenizer {
    fn render_chat(&self, _system: &str, _user: &str) -> Result<String, String> {
        Err("no chat template".into())
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        Ok(text.chars().map(u32::from).collect())
    }

    fn bos_for(&self, _rendered: &str) -> Option<u32> {
        None
    }
}

/// The options as the template sees them, one line each, then the state.
const TEMPLATE: &str = "{{ type }}|{{ instructions }}|{% for o in options %}[{{ o.label }}:{{ o.key }}={{ o.description if o.description is string else o.description | tojson }}]{% endfor %}|{{ state if state is string else state | tojson }}";

fn metadata(kind: DecisionKind, template: &str, temperatures: &[(&str, f32)]) -> DecisionMetadata {
    DecisionMetadata {
        kind,
        template: template.into(),
        temperatures: temperatures
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect::<BTreeMap<_, _>>(),
        laya: None,
    }
}

fn planner(kind: DecisionKind) -> DecisionPlanner<CharTokenizer> {
    DecisionPlanner::new(CharTokenizer, metadata(kind, TEMPLATE, &[]), "test", 10_000)
        .expect("planner")
}

fn choice(names: &[&str]) -> Question {
    Question {
        instructions: "Which?".into(),
        kind: QuestionKind::Choice {
            options: names
                .iter()
                .map(|n| ChoiceOption {
                    name: n.to_string(),
                    description: Some(format!("about {n}")),
                })
                .collect(),
        },
    }
}

fn noul() -> Question {
    Question {
        instructions: "Is it?".into(),
        kind: QuestionKind::Noul {
            yes: Some("it is".into()),
            no: None,
        },
    }
}

fn request(state: &str, questions: Vec<Question>) -> ReadRequest {
    ReadRequest {
        state: state.into(),
        questions,
        options: Default::default(),
        asked: None,
    }
}

/// `request` as a host sends it: the caller's ids beside the questions, every question read.
fn asked(state: &str, questions: &[(&str, Question)]) -> ReadRequest {
    let all: Vec<AskedQuestion> = questions
        .iter()
        .map(|(id, q)| AskedQuestion {
            id: QuestionId(id.to_string()),
            question: q.clone(),
        })
        .collect();
    ReadRequest {
        asked: Some(RequestQuestions::new(all, (0..questions.len()).collect())),
        ..request(state, questions.iter().map(|(_, q)| q.clone()).collect())
    }
}

#[test]
fn openjev_lists_true_first_and_gives_the_template_no_labels() {
    let p = planner(DecisionKind::Openjev);
    assert_eq!(p.question_limits().max_choice_options, 52);
    assert_eq!(p.question_limits().max_score_levels, 10);
    let text = p.render(&request("s", vec![noul()]), 0, 0).expect("render");
    assert_eq!(text, "noul|Is it?|[:true=it is][:false=null]|s");
    let plan = p.plan(&request("s", vec![noul()])).expect("plan");
    assert_eq!(plan.sequences.len(), 1);
    assert_eq!(
        plan.sequences[0].labels,
        vec![u32::from('A'), u32::from('B')]
    );
    // `true` is the first label: its logit is P(true)'s.
    let d = plan.distributions(&[vec![1.0, 0.0]]).expect("distribution");
    let e = 1f64.exp();
    assert!((d[0].0[0] - e / (e + 1.0)).abs() < 1e-12);
}

#[test]
fn lev_asks_a_choice_twice_the_second_time_reversed_with_labels_by_position() {
    let p = planner(DecisionKind::Lev);
    // Single letters only under this tokenizer.
    assert_eq!(p.question_limits().max_choice_options, 26);
    let r = request(
        r#"{"b": 1, "a": {"d": 2, "c": 3}}"#,
        vec![choice(&["x", "y", "z"])],
    );
    let first = p.render(&r, 0, 0).expect("first");
    let second = p.render(&r, 0, 1).expect("second");
    // lev sorts every object's keys, the state's too.
    assert_eq!(
        first,
        r#"choice|Which?|[A:x=about x][B:y=about y][C:z=about z]|{"a": {"c": 3, "d": 2}, "b": 1}"#
    );
    assert_eq!(
        second,
        r#"choice|Which?|[A:z=about z][B:y=about y][C:x=about x]|{"a": {"c": 3, "d": 2}, "b": 1}"#
    );
    let plan = p.plan(&r).expect("plan");
    assert_eq!(plan.sequences.len(), 2);
    // Variant one says x (label A); variant two says x too (its label C): both put mass on x.
    let d = plan
        .distributions(&[vec![3.0, 0.0, 0.0], vec![0.0, 0.0, 3.0]])
        .expect("distribution");
    let p0 = 3f64.exp() / (3f64.exp() + 2.0);
    assert!((d[0].0[0] - p0).abs() < 1e-12, "{:?}", d[0].0);
    assert!((d[0].0[1] - d[0].0[2]).abs() < 1e-12);
}

#[test]
fn other_types_keep_the_requests_key_order() {
    let p = planner(DecisionKind::PplxDecider);
    let r = request(r#"{"b": 1, "a": 2}"#, vec![choice(&["x", "y"])]);
    let text = p.render(&r, 0, 0).expect("render");
    assert!(text.ends_with(r#"|{"b": 1, "a": 2}"#), "{text}");
    assert_eq!(p.plan(&r).expect("plan").sequences.len(), 1);
}

#[test]
fn lev_reads_a_noul_on_its_nine_point_scale() {
    let p = planner(DecisionKind::Lev);
    let plan = p.plan(&request("s", vec![noul()])).expect("plan");
    assert_eq!(plan.sequences[0].labels.len(), LEV_RATINGS);
    // All the mass on rating 6 of 0..=8: P(true) = 6/8.
    let mut logits = vec![-1e4f32; LEV_RATINGS];
    logits[6] = 0.0;
    let d = plan.distributions(&[logits]).expect("distribution");
    assert!((d[0].0[0] - 0.75).abs() < 1e-9, "{:?}", d[0].0);
}

#[test]
fn temperatures_go_by_type_and_bucket_then_type_then_one() {
    let temps = [("choice.3_5", 2.0f32), ("choice", 4.0), ("noul.small", 0.5)];
    let q3 = choice(&["a", "b", "c"]);
    let q6 = choice(&["a", "b", "c", "d", "e", "f"]);
    let table: BTreeMap<String, f32> = temps.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    assert_eq!(
        Readout::new(DecisionKind::PplxDecider, &q3, &table).temperature,
        2.0
    );
    assert_eq!(
        Readout::new(DecisionKind::PplxDecider, &q6, &table).temperature,
        4.0
    );
    assert_eq!(
        Readout::new(DecisionKind::PplxDecider, &noul(), &table).temperature,
        1.0
    );
    // lev's buckets are its own.
    assert_eq!(
        Readout::new(DecisionKind::Lev, &noul(), &table).temperature,
        0.5
    );
    assert_eq!(
        Readout::new(DecisionKind::Lev, &q3, &table).temperature,
        4.0
    );
    // A temperature of 2 halves the logits.
    let table: BTreeMap<String, f32> = [("choice".to_string(), 2.0)].into();
    let r = Readout::new(DecisionKind::PplxDecider, &choice(&["a", "b"]), &table).over(0..1);
    let d = r.distribution(&[vec![2.0, 0.0]]).expect("distribution");
    let e = 1f64.exp();
    assert!((d.0[0] - e / (e + 1.0)).abs() < 1e-12);
}

#[test]
fn limits_and_bad_templates_are_refused_by_name() {
    let p = planner(DecisionKind::PplxDecider);
    let too_many: Vec<String> = (0..27).map(|i| format!("o{i}")).collect();
    let names: Vec<&str> = too_many.iter().map(String::as_str).collect();
    let err = p
        .plan(&request("s", vec![choice(&names)]))
        .expect_err("27 options");
    assert!(
        matches!(err, ReadError::InvalidQuestion { question: 0, .. }),
        "{err:?}"
    );

    for empty in ["", "{}", "[]"] {
        let mut q = noul();
        q.instructions = empty.into();
        let err = p
            .plan(&request("s", vec![q]))
            .expect_err("empty instructions");
        assert!(
            err.to_string().contains("instructions with content"),
            "{empty:?}: {err}"
        );
    }

    // llama-server gives `questions` to a nimble template only.
    let reads_questions = metadata(DecisionKind::Openjev, "{{ questions }}: {{ state }}", &[]);
    let err = DecisionPlanner::new(CharTokenizer, reads_questions, "t", 100)
        .err()
        .expect("questions");
    assert!(
        err.to_string().contains("`questions`") && err.to_string().contains("nimble"),
        "{err}"
    );
    let broken = metadata(DecisionKind::Openjev, "{% for o in options %}", &[]);
    let err = DecisionPlanner::new(CharTokenizer, broken, "t", 100)
        .err()
        .expect("broken");
    assert!(matches!(err, DecisionSetupError::Template(_)), "{err}");
    let raises = metadata(DecisionKind::Openjev, "{{ raise_exception('no') }}", &[]);
    let err = DecisionPlanner::new(CharTokenizer, raises, "t", 100)
        .err()
        .expect("raises");
    assert!(err.to_string().contains("raise_exception"), "{err}");

    let short = DecisionPlanner::new(
        CharTokenizer,
        metadata(DecisionKind::Openjev, TEMPLATE, &[]),
        "t",
        10,
    )
    .expect("planner");
    let err = short
        .plan(&request("s", vec![noul()]))
        .expect_err("too long");
    assert!(matches!(err, ReadError::TooLarge { .. }), "{err:?}");
}

/// A tokenizer under which a letter is two tokens cannot serve openjev, whose labels are
/// single letters.
#[test]
fn a_label_that_is_not_one_token_refuses_the_model() {
    struct Doubled;
    impl PromptTokenizer for Doubled {
        fn render_chat(&self, _: &str, _: &str) -> Result<String, String> {
            Err("none".into())
        }
        fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
            Ok(text.chars().flat_map(|c| [u32::from(c), 0]).collect())
        }
        fn bos_for(&self, _: &str) -> Option<u32> {
            None
        }
    }
    let err = DecisionPlanner::new(
        Doubled,
        metadata(DecisionKind::Openjev, TEMPLATE, &[]),
        "t",
        100,
    )
    .err()
    .expect("refused");
    assert_eq!(err.to_string(), "decision label 'A' is not a single token");
    let err = DecisionPlanner::new(
        Doubled,
        metadata(DecisionKind::Lev, TEMPLATE, &[]),
        "t",
        100,
    )
    .err()
    .expect("refused");
    assert!(matches!(err, DecisionSetupError::TooFewLabels(0)), "{err}");
}

/// A nimble prompt names its question by id and lists every question of the request, each with
/// its options as first given and labelled by position, as llama-server renders it.
#[test]
fn nimble_names_the_question_and_lists_the_whole_request() {
    const NIMBLE: &str = "{{ id }}|{{ type }}|{% for q in questions %}<{{ q.id }}:{{ q.type }}:{{ q.instructions }}:{% for o in q.options %}{{ o.label }}={{ o.key }},{% endfor %}>{% endfor %}|{% for o in options %}{{ o.label }}{% endfor %}|{{ questions | tojson }}";
    let p = DecisionPlanner::new(
        CharTokenizer,
        metadata(DecisionKind::Nimble, NIMBLE, &[]),
        "t",
        10_000,
    )
    .expect("planner");
    assert!(p.reads_question_ids());
    assert_eq!(p.question_limits().max_choice_options, 26);
    let r = asked("s", &[("size", choice(&["s", "m"])), ("ok", noul())]);
    let text = p.render(&r, 1, 0).expect("render");
    let (head, json) = text.rsplit_once('|').expect("json");
    assert_eq!(
        head,
        "ok|noul|<size:choice:Which?:A=s,B=m,><ok:noul:Is it?:A=false,B=true,>|AB"
    );
    // llama-server's keys, in its order.
    assert!(
        json.starts_with(r#"[{"id": "size", "type": "choice", "instructions": "Which?", "options": [{"key": "s", "description": "about s", "label": "A"}"#),
        "{json}"
    );
    // One prompt a question, the noul's labels false then true.
    let plan = p.plan(&r).expect("plan");
    assert_eq!(plan.sequences.len(), 2);
    assert_eq!(
        plan.sequences[1].labels,
        vec![u32::from('A'), u32::from('B')]
    );
    let d = plan
        .distributions(&[vec![0.0, 0.0], vec![0.0, 1.0]])
        .expect("distributions");
    let e = 1f64.exp();
    assert!(
        (d[1].0[0] - e / (e + 1.0)).abs() < 1e-12,
        "P(true) {:?}",
        d[1]
    );

    // A subset read (the host's cache or a remedy) still lists the whole request.
    let one = ReadRequest {
        questions: vec![noul()],
        asked: r.asked_for(&[1]),
        ..r.clone()
    };
    assert_eq!(p.render(&one, 0, 0).expect("subset"), text);

    // A read without ids (a host that predates them) is refused, naming what is missing.
    let err = p.plan(&request("s", vec![noul()])).expect_err("no ids");
    assert!(
        matches!(&err, ReadError::InvalidQuestion { message, .. } if message.contains("`asked`")),
        "{err}"
    );
    let wrong = ReadRequest {
        asked: r.asked_for(&[0]),
        ..r.clone()
    };
    assert!(
        p.plan(&wrong).is_err(),
        "positions that do not cover the read"
    );
}

/// A template that reads no id is rendered as before, with or without ids, and needs none.
#[test]
fn templates_that_read_no_id_do_not_depend_on_ids() {
    let p = planner(DecisionKind::PplxDecider);
    assert!(!p.reads_question_ids());
    let plain = request("s", vec![noul()]);
    let with_ids = asked("s", &[("renamed", noul())]);
    assert_eq!(p.render(&plain, 0, 0), p.render(&with_ids, 0, 0));
    assert!(p.plan(&plain).is_ok());
    // Any type's template may read `id` (llama-server gives it to every one); its reads then
    // need ids.
    let reads_id = DecisionPlanner::new(
        CharTokenizer,
        metadata(DecisionKind::Openjev, "{{ id }}: {{ state }}", &[]),
        "t",
        100,
    )
    .expect("id");
    assert!(reads_id.reads_question_ids());
    assert_eq!(
        reads_id
            .render(&asked("s", &[("q7", noul())]), 0, 0)
            .expect("render"),
        "q7: s"
    );
    assert!(reads_id.plan(&plain).is_err());
}
