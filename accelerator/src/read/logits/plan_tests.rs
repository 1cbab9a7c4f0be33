//! The planner against a test-double tokenizer: character-level, two special tokens, and a
//! configurable list of multi-character tokens matched greedily (longest first), which is how
//! labels are made to merge with the prompt or to be single tokens.

use super::*;
use crate::read::logits::labels::unfiltered_choice_labels;
use crate::read::logits::prompt::v1_messages;
use hunch_core::{ChoiceOption, Question, QuestionKind, QuestionMode, ReadOptions};
use std::cell::Cell;

const SPECIALS: [(&str, u32); 2] = [("<|im_start|>", 1), ("<|im_end|>", 2)];
const BOS: u32 = 0;

#[derive(Clone, Copy, PartialEq)]
enum Template {
    /// `<|im_start|>role\n…<|im_end|>\n` turns and an open `<|im_start|>assistant\n`.
    Chat,
    /// The user text left inside the open assistant turn, so the text before the prefill is the
    /// request's own: the probe cannot vouch for a request's boundary.
    UserInOpenTurn,
}

struct FakeTokenizer {
    template: Template,
    /// Multi-character tokens with their ids, matched longest first.
    merges: Vec<(String, u32)>,
    /// Whether `last_special_end` answers (the fast path) or not (every label checked in full).
    reports_specials: bool,
    encodes: Cell<usize>,
}

impl FakeTokenizer {
    fn new(merges: &[(&str, u32)]) -> Self {
        let mut merges: Vec<(String, u32)> =
            merges.iter().map(|(s, id)| (s.to_string(), *id)).collect();
        merges.sort_by_key(|(s, _)| std::cmp::Reverse(s.chars().count()));
        FakeTokenizer {
            template: Template::Chat,
            merges,
            reports_specials: true,
            encodes: Cell::new(0),
        }
    }

    fn plain() -> Self {
        Self::new(&[])
    }

    /// Every upper-case letter pair a single token (ids from 5000).
    fn with_pairs() -> Self {
        let pairs = unfiltered_choice_labels(400).split_off(52);
        let owned: Vec<(String, u32)> = pairs
            .into_iter()
            .enumerate()
            .map(|(i, p)| (p, 5000 + i as u32))
            .collect();
        let refs: Vec<(&str, u32)> = owned.iter().map(|(s, id)| (s.as_str(), *id)).collect();
        Self::new(&refs)
    }

    fn segment(&self, text: &str, out: &mut Vec<u32>) {
        let mut rest = text;
        while let Some(c) = rest.chars().next() {
            match self
                .merges
                .iter()
                .find(|(m, _)| rest.starts_with(m.as_str()))
            {
                Some((m, id)) => {
                    out.push(*id);
                    rest = &rest[m.len()..];
                }
                None => {
                    out.push(1000 + c as u32);
                    rest = &rest[c.len_utf8()..];
                }
            }
        }
    }

    fn next_special(text: &str) -> Option<(usize, &'static str, u32)> {
        SPECIALS
            .iter()
            .filter_map(|(s, id)| text.find(s).map(|at| (at, *s, *id)))
            .min_by_key(|(at, _, _)| *at)
    }
}

impl PromptTokenizer for FakeTokenizer {
    fn render_chat(&self, system: &str, user: &str) -> Result<String, String> {
        Ok(match self.template {
            Template::Chat => format!(
                "<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
            ),
            Template::UserInOpenTurn => {
                format!("<|im_start|>system\n{system}<|im_end|>\n<|im_start|>assistant\n{user}")
            }
        })
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        self.encodes.set(self.encodes.get() + 1);
        let mut out = Vec::new();
        let mut rest = text;
        while let Some((at, special, id)) = Self::next_special(rest) {
            self.segment(&rest[..at], &mut out);
            out.push(id);
            rest = &rest[at + special.len()..];
        }
        self.segment(rest, &mut out);
        Ok(out)
    }

    fn bos_for(&self, _rendered: &str) -> Option<u32> {
        Some(BOS)
    }

    fn last_special_end(&self, text: &str) -> Option<usize> {
        if !self.reports_specials {
            return None;
        }
        SPECIALS
            .iter()
            .filter_map(|(s, _)| text.rfind(s).map(|at| at + s.len()))
            .max()
    }
}

fn id(c: char) -> u32 {
    1000 + c as u32
}

fn choice(instructions: &str, n: usize) -> Question {
    Question {
        instructions: instructions.into(),
        kind: QuestionKind::Choice {
            options: (0..n)
                .map(|i| ChoiceOption {
                    name: format!("option {i}"),
                    description: None,
                })
                .collect(),
        },
    }
}

fn score(n: usize) -> Question {
    Question {
        instructions: "How much?".into(),
        kind: QuestionKind::Score {
            levels: (0..n).map(|i| format!("level {i}")).collect(),
        },
    }
}

fn noul(instructions: &str) -> Question {
    Question {
        instructions: instructions.into(),
        kind: QuestionKind::Noul {
            yes: None,
            no: None,
        },
    }
}

fn request(questions: Vec<Question>, mode: QuestionMode) -> ReadRequest {
    ReadRequest {
        state: "The bicycle is red.".into(),
        questions,
        options: ReadOptions {
            questions: mode,
            ..ReadOptions::default()
        },
        asked: None,
    }
}

fn planner(tokenizer: FakeTokenizer) -> LogitPlanner<FakeTokenizer> {
    LogitPlanner::new(tokenizer, 100_000).unwrap()
}

fn invalid_message(result: Result<LogitPlan, ReadError>, question: usize) -> String {
    match result {
        Err(ReadError::InvalidQuestion {
            question: q,
            message,
        }) if q == question => message,
        other => panic!("expected question {question} to be invalid, got {other:?}"),
    }
}

#[test]
fn sequences_are_the_v1_texts_through_the_template() {
    let planner = planner(FakeTokenizer::plain());
    let req = request(
        vec![choice("What color?", 2), score(3), noul("Red?")],
        QuestionMode::Joint,
    );
    let plan = planner.plan(&req).unwrap();
    let texts = v1_messages(&req);
    assert_eq!(plan.sequences.len(), 3);
    for (i, (seq, (system, user, prefill))) in plan.sequences.iter().zip(&texts).enumerate() {
        let tok = planner.tokenizer();
        let rendered = tok.render_chat(system, user).unwrap();
        let mut expected = vec![BOS];
        expected.extend(tok.encode(&format!("{rendered}{prefill}")).unwrap());
        assert_eq!(seq.question, i);
        assert_eq!(seq.tokens, expected);
    }
    assert_eq!(plan.sequences[0].labels, vec![id('A'), id('B')]);
    assert_eq!(plan.sequences[0].scoring, Scoring::Choice);
    assert_eq!(plan.sequences[1].labels, vec![id('0'), id('1'), id('2')]);
    assert_eq!(plan.sequences[1].scoring, Scoring::Score);
    let digits: Vec<u32> = ('1'..='9').map(id).collect();
    assert_eq!(plan.sequences[2].labels, digits);
    assert_eq!(plan.sequences[2].scoring, Scoring::Noul);
    // The letter prefill ends in a quote, the digit prefill in a space.
    assert_eq!(plan.sequences[0].tokens.last(), Some(&id('"')));
    assert_eq!(plan.sequences[1].tokens.last(), Some(&id(' ')));
}

#[test]
fn isolated_sequences_do_not_depend_on_the_other_questions() {
    let planner = planner(FakeTokenizer::plain());
    let questions = vec![choice("What color?", 2), score(3), noul("Red?")];
    let isolated = planner
        .plan(&request(questions.clone(), QuestionMode::Isolated))
        .unwrap();
    let joint = planner
        .plan(&request(questions.clone(), QuestionMode::Joint))
        .unwrap();
    for (i, q) in questions.iter().enumerate() {
        let alone = planner
            .plan(&request(vec![q.clone()], QuestionMode::Isolated))
            .unwrap();
        assert_eq!(isolated.sequences[i].tokens, alone.sequences[0].tokens);
        assert_eq!(isolated.sequences[i].labels, alone.sequences[0].labels);
        // Joint briefings list all three, so they are longer than isolated ones.
        assert!(joint.sequences[i].tokens.len() > isolated.sequences[i].tokens.len());
    }
    // A one-question request reads the same either way.
    let one = vec![noul("Red?")];
    assert_eq!(
        planner
            .plan(&request(one.clone(), QuestionMode::Joint))
            .unwrap(),
        planner.plan(&request(one, QuestionMode::Isolated)).unwrap()
    );
}

#[test]
fn draws_and_seed_change_nothing() {
    let planner = planner(FakeTokenizer::plain());
    let plain = request(vec![choice("c", 3), noul("n")], QuestionMode::Isolated);
    let mut seeded = plain.clone();
    seeded.options.seed = Some(7);
    seeded.options.draws = Some(5);
    assert_eq!(
        planner.plan(&plain).unwrap(),
        planner.plan(&seeded).unwrap()
    );
}

#[test]
fn a_label_that_merges_with_the_prompt_shrinks_the_limits() {
    // `"Q` is one token: after the letter prefill, `Q` merges with the quote.
    let planner = planner(FakeTokenizer::new(&[("\"Q", 900)]));
    let limits = planner.question_limits();
    assert_eq!(limits.max_choice_options, 16, "A–P only");
    // Digits are unaffected; scores past ten levels take the letters A–P.
    assert_eq!(limits.max_score_levels, 16);
    assert!(planner
        .plan(&request(vec![choice("c", 16)], QuestionMode::Isolated))
        .is_ok());
    let message = invalid_message(
        planner.plan(&request(
            vec![noul("n"), choice("c", 17)],
            QuestionMode::Isolated,
        )),
        1,
    );
    assert!(message.contains("17"), "{message}");
}

#[test]
fn a_digit_that_is_not_one_token_refuses_nouls_and_caps_scores() {
    // ` 5` is one token: after the digit prefill's space, `5` merges with it.
    let planner = planner(FakeTokenizer::new(&[(" 5", 901)]));
    assert_eq!(planner.question_limits().max_score_levels, 5);
    assert!(planner
        .plan(&request(vec![score(5)], QuestionMode::Joint))
        .is_ok());
    let message = invalid_message(
        planner.plan(&request(vec![noul("n")], QuestionMode::Joint)),
        0,
    );
    assert!(
        message.contains("`5`") && message.contains("merges"),
        "{message}"
    );
    assert!(
        message.contains("[1032]") && message.contains("[901]"),
        "{message}"
    );
}

#[test]
fn the_boundary_is_checked_on_the_request_when_the_probe_cannot_vouch() {
    // The user text sits directly before the prefill, and `]{"answer": "A` is one token: it
    // fires after a choice's options array, never after the probe's noul text.
    let mut tok = FakeTokenizer::new(&[("]{\"answer\": \"A", 902)]);
    tok.template = Template::UserInOpenTurn;
    let planner = planner(tok);
    assert_eq!(planner.question_limits().max_choice_options, 52);
    let message = invalid_message(
        planner.plan(&request(vec![choice("c", 2)], QuestionMode::Isolated)),
        0,
    );
    assert!(
        message.contains("`A`") && message.contains("[902]"),
        "{message}"
    );
    // A noul's user text ends in a full stop: its digits check out on its own prompt.
    let plan = planner
        .plan(&request(vec![noul("n")], QuestionMode::Isolated))
        .unwrap();
    assert_eq!(
        plan.sequences[0].labels,
        ('1'..='9').map(id).collect::<Vec<_>>()
    );
}

#[test]
fn the_fast_path_encodes_each_prompt_once_and_agrees_with_the_full_check() {
    let questions = vec![choice("c", 255), score(11), noul("n"), choice("d", 3)];
    let fast = planner(FakeTokenizer::with_pairs());
    fast.tokenizer().encodes.set(0);
    let plan = fast
        .plan(&request(questions.clone(), QuestionMode::Joint))
        .unwrap();
    assert_eq!(fast.tokenizer().encodes.get(), questions.len());

    let mut slow_tok = FakeTokenizer::with_pairs();
    slow_tok.reports_specials = false;
    let slow = planner(slow_tok);
    slow.tokenizer().encodes.set(0);
    let checked = slow
        .plan(&request(questions.clone(), QuestionMode::Joint))
        .unwrap();
    assert_eq!(plan, checked);
    assert_eq!(
        slow.tokenizer().encodes.get(),
        questions.len() + 255 + 11 + 9 + 3
    );
}

#[test]
fn choices_of_255_options_use_the_extra_labels() {
    let planner = planner(FakeTokenizer::with_pairs());
    assert_eq!(planner.question_limits().max_choice_options, 255);
    assert_eq!(planner.question_limits().max_score_levels, 50);
    let labels = planner.choice_labels();
    assert_eq!(labels.len(), 255);
    assert_eq!((&*labels[50], &*labels[51], &*labels[52]), ("y", "z", "AA"));
    assert_eq!(&*labels[254], "HU");

    let req = request(vec![choice("c", 255)], QuestionMode::Isolated);
    let seq = &planner.plan(&req).unwrap().sequences[0];
    assert_eq!(seq.labels.len(), 255);
    assert_eq!(seq.labels[0], id('A'));
    assert_eq!(seq.labels[50], id('y'));
    assert_eq!(seq.labels[52], 5000);
    let mut distinct = seq.labels.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), 255);
    // The prompt names the extra labels in the options table.
    let (_, user, _) = &v1_messages(&req)[0];
    assert!(user.contains("{\"answer\":\"option 254\",\"description\":null,\"label\":\"HU\"}]"));

    // Without multi-character tokens only `y` and `z` extend v1's letters.
    let plain = super::LogitPlanner::new(FakeTokenizer::plain(), 100_000).unwrap();
    assert_eq!(plain.question_limits().max_choice_options, 52);
    let message = invalid_message(
        plain.plan(&request(vec![choice("c", 53)], QuestionMode::Joint)),
        0,
    );
    assert!(message.contains("52"), "{message}");
}

#[test]
fn labels_that_share_a_token_are_skipped() {
    // `AA` and `AB` are the same token: `AB` cannot be told apart, so the table skips it.
    let planner = planner(FakeTokenizer::new(&[
        ("AA", 5000),
        ("AB", 5000),
        ("AC", 5001),
    ]));
    let labels = planner.choice_labels();
    assert_eq!(labels.len(), 54);
    assert_eq!((&*labels[52], &*labels[53]), ("AA", "AC"));
}

#[test]
fn scores_beyond_fifty_levels_are_refused() {
    let planner = planner(FakeTokenizer::with_pairs());
    assert!(planner
        .plan(&request(vec![score(50)], QuestionMode::Joint))
        .is_ok());
    let message = invalid_message(
        planner.plan(&request(vec![score(51)], QuestionMode::Joint)),
        0,
    );
    assert!(message.contains("51"), "{message}");
    let seq = &planner
        .plan(&request(vec![score(11)], QuestionMode::Joint))
        .unwrap()
        .sequences[0];
    assert_eq!(seq.labels[10], id('K'));
    assert_eq!(seq.tokens.last(), Some(&id('"')));
}

#[test]
fn a_prompt_longer_than_the_limit_is_too_large() {
    let tok = FakeTokenizer::plain();
    let req = request(vec![noul("n")], QuestionMode::Isolated);
    let length = planner(FakeTokenizer::plain())
        .plan(&req)
        .unwrap()
        .sequences[0]
        .tokens
        .len();
    let exact = LogitPlanner::new(tok, length).unwrap();
    assert!(exact.plan(&req).is_ok());
    let short = LogitPlanner::new(FakeTokenizer::plain(), length - 1).unwrap();
    match short.plan(&req) {
        Err(ReadError::TooLarge { message }) => {
            assert!(message.contains(&length.to_string()), "{message}")
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
}

#[test]
fn distributions_come_from_the_label_logits() {
    let planner = planner(FakeTokenizer::plain());
    let plan = planner
        .plan(&request(
            vec![choice("c", 2), noul("n")],
            QuestionMode::Joint,
        ))
        .unwrap();
    let d = plan.sequences[0].distribution(&[3.0, 1.0]).unwrap();
    assert!((d.0[0] - 0.8807970779778823).abs() < 1e-12);
    assert!(plan.sequences[0].distribution(&[3.0]).is_err());
    let mut logits = [0.0f32; 9];
    logits[8] = 50.0;
    let d = plan.sequences[1].distribution(&logits).unwrap();
    assert!((d.0[0] - 0.99).abs() < 1e-9);
}
