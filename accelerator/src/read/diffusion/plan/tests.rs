use super::*;
use crate::tokenizer::tiny::tiny_tokenizer;
use crate::tokenizer::{render_chat, Tokenizer};
use hunch_core::ChoiceOption;

fn planner(vocab: usize, cap: usize, max_prompt: usize) -> Planner<Tokenizer> {
    let tok = tiny_tokenizer(vocab).expect("tiny tokenizer");
    Planner::new(
        tok,
        PlanSettings {
            canvas_cap: cap,
            max_prompt_tokens: max_prompt,
        },
    )
    .expect("planner")
}

fn noul(text: &str) -> Question {
    Question {
        instructions: text.into(),
        kind: QuestionKind::Noul {
            yes: None,
            no: Some("  not at all ".into()),
        },
    }
}

fn choice(n: usize) -> Question {
    Question {
        instructions: "Which team?".into(),
        kind: QuestionKind::Choice {
            options: (0..n)
                .map(|i| ChoiceOption {
                    name: format!("team {i}"),
                    description: if i == 0 { Some("first".into()) } else { None },
                })
                .collect(),
        },
    }
}

fn score(n: usize) -> Question {
    Question {
        instructions: "How urgent?".into(),
        kind: QuestionKind::Score {
            levels: (0..n).map(|i| format!("level {i}")).collect(),
        },
    }
}

#[test]
fn quickstart_plan_has_the_reference_prompt_canvas_and_slots() {
    let p = planner(2048, 64, 12_288);
    let tok = p.tokenizer();
    let questions = vec![choice(3), score(3), noul(" Is it urgent? ")];
    let plan = p
        .plan("  The app crashes when I pay.\n", &questions)
        .unwrap();
    assert_eq!(plan.reads.len(), 1);
    assert_eq!(plan.format, super::AnswerFormat::Lines);
    let read = &plan.reads[0];
    assert!(read
        .system
        .contains("\nQuestion q1: Which team?\n  A: team 0 (first)\n  B: team 1\n  C: team 2\n"));
    assert!(read
        .system
        .contains("\nQuestion q2: How urgent?\n  1: level 0\n  2: level 1\n  3: level 2\n"));
    assert!(read
        .system
        .contains("\nQuestion q3: Is it urgent?\n  yes\n  no: not at all\n"));
    // The prompt is the chat format of the system text and the stripped state.
    let expected = tok
        .encode(&render_chat(&read.system, "The app crashes when I pay."))
        .unwrap();
    assert_eq!(read.prompt_ids, expected);
    // Canvas: head, "q1: A\nq2: 1\nq3: yes", turn close, pads to a multiple of 16.
    let mut template = tok.encode(super::EMPTY_THOUGHT).unwrap();
    template.extend(tok.encode("q1: A\nq2: 1\nq3: yes").unwrap());
    assert_eq!(read.canvas[..template.len()], template[..]);
    assert_eq!(read.canvas[template.len()], tok.special().turn_close);
    assert_eq!(read.rows, template.len() + 1);
    assert_eq!(read.canvas.len() % CANVAS_STEP, 0);
    assert!(read.canvas[read.rows..]
        .iter()
        .all(|&t| t == tok.special().pad));
    // Each slot holds the in-context label tokens.
    let id = |t: &str| tok.token_id(t).unwrap();
    assert_eq!(read.slots[0].label_ids, vec![id("▁A"), id("▁B"), id("▁C")]);
    assert_eq!(read.slots[1].label_ids, vec![id("▁1"), id("▁2"), id("▁3")]);
    assert_eq!(read.slots[2].label_ids, vec![id("▁yes"), id("▁no")]);
    for slot in &read.slots {
        assert_eq!(read.canvas[slot.position], slot.label_ids[0]);
    }
    assert_eq!(
        plan.usage(),
        hunch_core::Usage {
            input_tokens: read.prompt_ids.len() as u64,
            output_tokens: read.rows as u64
        }
    );
}

#[test]
fn long_lists_use_indexed_answers_and_split_into_reads_listing_only_their_questions() {
    let p = planner(2048, 32, 12_288);
    let questions: Vec<Question> = (0..14).map(|i| noul(&format!("statement {i}"))).collect();
    let plan = p.plan("state", &questions).unwrap();
    assert_eq!(plan.format, super::AnswerFormat::Indexed);
    assert!(
        plan.reads.len() > 1,
        "a 32-token canvas cannot hold 14 questions"
    );
    let mut next = 1;
    for read in &plan.reads {
        assert!(read.canvas.len() <= 32);
        for (k, &q) in read.questions.iter().enumerate() {
            assert_eq!(q, next - 1);
            assert!(read
                .system
                .contains(&format!("Question q{next}: statement {q}\n")));
            let _ = k;
            next += 1;
        }
        // Only its own questions.
        assert_eq!(
            read.system.matches("Question q").count(),
            read.questions.len()
        );
    }
    assert_eq!(next, 15);
}

#[test]
fn an_isolated_plan_is_the_one_question_plan_of_each_question() {
    let p = planner(2048, 64, 12_288);
    let questions = vec![choice(3), choice(1), score(3), noul("x"), noul("x")];
    let plan = p
        .plan_mode("the state", &questions, QuestionMode::Isolated)
        .unwrap();
    assert_eq!(plan.forced, vec![1]);
    assert_eq!(plan.reads.len(), 4);
    let mut usage = hunch_core::Usage::default();
    for (read, index) in plan.reads.iter().zip([0usize, 2, 3, 4]) {
        let alone = p
            .plan("the state", std::slice::from_ref(&questions[index]))
            .unwrap();
        let mut expected = alone.reads[0].clone();
        expected.questions = vec![index];
        assert_eq!(read, &expected, "question {index}");
        assert_eq!(read.seed_group, 0);
        usage.input_tokens += alone.usage().input_tokens;
        usage.output_tokens += alone.usage().output_tokens;
    }
    // Two identical questions are two identical reads, whatever their place.
    assert_eq!(plan.reads[2].prompt_ids, plan.reads[3].prompt_ids);
    assert_eq!(plan.usage(), usage);
    // A limit still names the question by its index in the request.
    let err = p
        .plan_mode("s", &[noul("a"), score(11)], QuestionMode::Isolated)
        .unwrap_err();
    assert!(matches!(err, PlanError::Question { question: 1, .. }));
    // Joint is the reference plan.
    assert_eq!(
        p.plan_mode("s", &questions, QuestionMode::Joint).unwrap(),
        p.plan("s", &questions).unwrap()
    );
}

#[test]
fn forced_questions_take_no_id_and_no_read() {
    let p = planner(2048, 64, 12_288);
    let plan = p.plan("s", &[choice(1), noul("x"), score(1)]).unwrap();
    assert_eq!(plan.forced, vec![0, 2]);
    assert_eq!(plan.reads[0].questions, vec![1]);
    assert!(plan.reads[0].system.contains("Question q1: x"));
    let none = p.plan("s", &[choice(1)]).unwrap();
    assert!(none.reads.is_empty());
    assert_eq!(none.usage(), hunch_core::Usage::default());
}

#[test]
fn limits_name_the_question() {
    let p = planner(2048, 64, 12_288);
    assert!(
        p.choice_labels().len() >= 255,
        "2048-id tiny vocab has every label"
    );
    let err = p.plan("s", &[noul("a"), choice(256)]).unwrap_err();
    assert!(
        matches!(err, PlanError::Question { question: 1, .. }),
        "{err:?}"
    );
    let err = p.plan("s", &[score(11)]).unwrap_err();
    assert!(
        matches!(err, PlanError::Question { question: 0, .. }),
        "{err:?}"
    );
    let small = planner(512, 64, 12_288);
    let limit = small.choice_labels().len();
    let err = small.plan("s", &[choice(limit + 1)]).unwrap_err();
    assert!(
        matches!(err, PlanError::Question { question: 0, ref message } if message.contains(&limit.to_string()))
    );
    assert!(small.plan("s", &[choice(limit)]).is_ok());
}

#[test]
fn long_prompts_are_refused_before_any_read() {
    let p = planner(2048, 64, 100);
    let err = p.plan(&"word ".repeat(200), &[noul("x")]).unwrap_err();
    assert!(matches!(err, PlanError::PromptTooLong { max: 100, .. }));
    assert!(err.to_string().starts_with("Prompt too long:"));
}

#[test]
fn choice_labels_are_the_reference_order_and_distinct_tokens() {
    let p = planner(2048, 64, 12_288);
    let labels = p.choice_labels();
    assert_eq!(labels.len(), 255);
    assert_eq!(labels[0], "A");
    assert_eq!(labels[26], "a");
    assert_eq!(labels[52], "AA");
    let plan = p.plan("s", &[choice(255)]).unwrap();
    let ids = &plan.reads[0].slots[0].label_ids;
    let mut unique = ids.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), 255);
}
