//! The requests the benchmark sends: long question lists and states cut from fixed sentences.

use hunch_core::{Question, QuestionKind, ReadOptions, ReadRequest};
use hunch_e2e::bench::option;

/// Sentences the long prompt's instructions and states are cut from.
pub(crate) const FILLER: &[&str] = &[
    "Consider the whole conversation, not only the last message, and weigh what the customer \
     actually asks for over the words they happen to use.",
    "When the message quotes an earlier reply from our team, judge the customer's own words and \
     ignore the quoted part.",
    "Messages written in a hurry often leave out details; do not penalise missing punctuation, \
     spelling mistakes or an informal tone.",
    "If two readings are equally plausible, prefer the one that would lead to the safer outcome \
     for the customer.",
    "Amounts, dates and order numbers mentioned in the message are reliable; claims about what \
     another department said are not.",
    "A polite message can still be urgent, and an angry message is not urgent by itself.",
    "Treat screenshots described in words as if they were attached, and treat links as \
     unverified.",
    "The customer may write in the first or the third person, for example on behalf of a family \
     member or a colleague.",
    "Do not infer anything from the customer's name, location or the time the message was sent.",
    "Answer from the message as written; do not assume facts about the account that the message \
     does not state.",
];

pub(crate) const TICKET: &str =
    "I was charged twice for my subscription this month and the second charge \
is still pending on my card.";

/// `len` characters (cut at a word boundary) of the filler text, starting at sentence `offset`.
pub(crate) fn filler(offset: usize, len: usize) -> String {
    let mut text = String::new();
    let mut i = offset;
    while text.len() < len + 200 {
        if !text.is_empty() {
            text.push(' ');
        }
        text.push_str(FILLER[i % FILLER.len()]);
        i += 1;
    }
    let cut = text[..len.min(text.len())].rfind(' ').unwrap_or(0).min(len);
    text.truncate(cut);
    text
}

/// The short core of each long-prompt question: (instructions, choice options or none = noul).
pub(crate) fn long_question_core(i: usize) -> (&'static str, Option<[&'static str; 3]>) {
    const CORES: &[(&str, Option<[&str; 3]>)] = &[
        ("Is the customer asking for a refund?", None),
        (
            "Which team should handle this ticket?",
            Some(["billing", "technical", "sales"]),
        ),
        (
            "Does the customer mention a specific amount of money?",
            None,
        ),
        (
            "What is the customer's overall mood?",
            Some(["calm", "frustrated", "angry"]),
        ),
        ("Is the customer threatening to cancel?", None),
        (
            "Which channel should we reply on?",
            Some(["email", "phone", "chat"]),
        ),
        (
            "Does the message contain personal data we must redact?",
            None,
        ),
        (
            "How long has the problem lasted?",
            Some(["today", "this week", "longer"]),
        ),
        ("Has the customer already contacted us about this?", None),
        (
            "What does the customer want first?",
            Some(["money back", "an answer", "a fix"]),
        ),
        ("Is a manager's approval needed?", None),
        (
            "Which product is concerned?",
            Some(["subscription", "hardware", "add-on"]),
        ),
    ];
    CORES[i % CORES.len()]
}

/// The long question list of cache sample `sample`: `count` nouls and 3-option choices, each with
/// `filler_chars` characters of guidance. The first question starts with the sample number, so two
/// samples share no prompt chunk.
pub(crate) fn long_questions(sample: &str, count: usize, filler_chars: usize) -> Vec<Question> {
    (0..count)
        .map(|i| {
            let (core, options) = long_question_core(i);
            let head = if i == 0 {
                format!("Sample {sample}. ")
            } else {
                String::new()
            };
            let instructions = format!("{head}{core} {}", filler(i, filler_chars));
            let kind = match options {
                None => QuestionKind::Noul {
                    yes: None,
                    no: None,
                },
                Some(names) => QuestionKind::Choice {
                    options: names.iter().map(|n| option(n, None)).collect(),
                },
            };
            Question { instructions, kind }
        })
        .collect()
}

/// A state of the long-prompt part, unique from its first character on.
pub(crate) fn long_state(n: usize, filler_chars: usize) -> String {
    format!(
        "{n} is this ticket's number. {TICKET} {}",
        filler(n, filler_chars)
    )
}

/// Filler characters per question and per state at scale 1 (≈1.5k tokens for a
/// character-level tokenizer such as the random checkpoints' and 12 questions).
pub(crate) const QUESTION_FILLER: f64 = 20.0;
pub(crate) const STATE_FILLER: f64 = 250.0;

pub(crate) fn long_request(
    sample: &str,
    state: usize,
    questions: usize,
    scale: f64,
) -> ReadRequest {
    let q_chars = (QUESTION_FILLER * scale * 12.0 / questions as f64).round() as usize;
    let s_chars = (STATE_FILLER * scale).round() as usize;
    ReadRequest {
        state: long_state(state, s_chars),
        questions: long_questions(sample, questions, q_chars),
        options: ReadOptions::default(),
        asked: None,
    }
}
