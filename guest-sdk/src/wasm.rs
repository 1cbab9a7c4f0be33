//! The component glue: WIT bindings, the host's `read`/`log` imports as a [`Host`], and the
//! conversions between the SDK's types and the generated ones. Only built for wasm32.

pub use wit_bindgen;

/// Generated from `wit/policy.wit`. The export macro is public so `export_policy!` can use it from
/// a policy crate, which does not depend on wit-bindgen itself (hence `runtime_path`).
pub mod bindings {
    wit_bindgen::generate!({
        path: "../wit",
        world: "policy",
        pub_export_macro: true,
        export_macro_name: "__export_policy_world",
        default_bindings_module: "::hunch_guest_sdk::wasm::bindings",
        runtime_path: "::hunch_guest_sdk::wasm::wit_bindgen::rt",
    });
}

use crate::answer::{Answer, AnswerValue, Answers, ChoiceAnswer, ScoreAnswer};
use crate::policy::{decide_json, Host, Level, Policy, PolicyError, ReadError, ReadErrorKind};
use crate::prob::Prob;
use crate::question::{QuestionKind, QuestionSet};
use bindings::hunch::policy::{log, reader, types as wit};

fn wit_questions(set: &QuestionSet) -> Vec<wit::Question> {
    set.questions
        .iter()
        .zip(set.resolved_ids())
        .map(|(q, id)| wit::Question {
            id,
            instructions: q.instructions.clone(),
            kind: match &q.kind {
                QuestionKind::Noul(c) => wit::QuestionKind::Noul(wit::NoulCriteria {
                    yes: c.yes.clone(),
                    no: c.no.clone(),
                }),
                QuestionKind::Choice(options) => wit::QuestionKind::Choice(
                    options
                        .iter()
                        .map(|o| wit::ChoiceOption {
                            name: o.name.clone(),
                            description: o.description.clone(),
                        })
                        .collect(),
                ),
                QuestionKind::Score(levels) => wit::QuestionKind::Score(levels.clone()),
            },
        })
        .collect()
}

fn from_wit_answers(set: &QuestionSet, a: wit::Answers) -> Answers {
    let answers = a
        .answers
        .into_iter()
        .zip(set.questions.iter())
        .map(|(answer, question)| {
            let value = match answer.value {
                wit::AnswerValue::Noul(p) => AnswerValue::Noul(Prob::clamped(p)),
                wit::AnswerValue::Choice(c) => {
                    let names: Vec<String> = match &question.kind {
                        QuestionKind::Choice(o) => o.iter().map(|o| o.name.clone()).collect(),
                        _ => Vec::new(),
                    };
                    AnswerValue::Choice(ChoiceAnswer {
                        choice: c.choice,
                        confidence: c.confidence,
                        probabilities: names
                            .into_iter()
                            .zip(answer.distribution.iter().copied())
                            .collect(),
                    })
                }
                wit::AnswerValue::Score(s) => AnswerValue::Score(ScoreAnswer {
                    score: s.score,
                    confidence: s.confidence,
                    probabilities: answer.distribution.clone(),
                }),
            };
            Answer {
                id: answer.id,
                distribution: answer.distribution,
                value,
            }
        })
        .collect();
    Answers {
        answers,
        input_tokens: a.input_tokens,
        output_tokens: a.output_tokens,
    }
}

fn from_wit_error(e: wit::ReadError) -> ReadError {
    ReadError {
        kind: match e.kind {
            wit::ReadErrorKind::InvalidQuestion => ReadErrorKind::InvalidQuestion,
            wit::ReadErrorKind::TooLarge => ReadErrorKind::TooLarge,
            wit::ReadErrorKind::Unavailable => ReadErrorKind::Unavailable,
            wit::ReadErrorKind::Timeout => ReadErrorKind::Timeout,
            wit::ReadErrorKind::Rejected => ReadErrorKind::Rejected,
            wit::ReadErrorKind::Internal => ReadErrorKind::Internal,
        },
        message: e.message,
        question: e.question,
    }
}

fn to_wit_error(e: ReadError) -> wit::ReadError {
    wit::ReadError {
        kind: match e.kind {
            ReadErrorKind::InvalidQuestion => wit::ReadErrorKind::InvalidQuestion,
            ReadErrorKind::TooLarge => wit::ReadErrorKind::TooLarge,
            ReadErrorKind::Unavailable => wit::ReadErrorKind::Unavailable,
            ReadErrorKind::Timeout => wit::ReadErrorKind::Timeout,
            ReadErrorKind::Rejected => wit::ReadErrorKind::Rejected,
            ReadErrorKind::Internal => wit::ReadErrorKind::Internal,
        },
        message: e.message,
        question: e.question,
    }
}

/// The real host: the component's imports.
pub struct WitHost;

impl Host for WitHost {
    fn read(&mut self, set: &QuestionSet) -> Result<Answers, ReadError> {
        reader::read(&set.state, &wit_questions(set))
            .map(|a| from_wit_answers(set, a))
            .map_err(from_wit_error)
    }

    fn read_batch(&mut self, sets: &[QuestionSet]) -> Vec<Result<Answers, ReadError>> {
        let wit_sets: Vec<wit::QuestionSet> = sets
            .iter()
            .map(|s| wit::QuestionSet {
                state: s.state.clone(),
                questions: wit_questions(s),
            })
            .collect();
        reader::read_batch(&wit_sets)
            .into_iter()
            .zip(sets)
            .map(|(r, set)| r.map(|a| from_wit_answers(set, a)).map_err(from_wit_error))
            .collect()
    }

    fn log(&mut self, level: Level, message: &str) {
        let level = match level {
            Level::Debug => log::Level::Debug,
            Level::Info => log::Level::Info,
            Level::Warn => log::Level::Warn,
            Level::Error => log::Level::Error,
        };
        log::log(level, message);
    }
}

/// Panics go to the host log (the default hook writes to WASI stderr, which the host does not
/// grant, so the report would say "forbidden capability" instead of the panic). The panic then
/// aborts: a trap, reported with this message.
fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            log::log(log::Level::Error, &format!("panic: {info}"));
        }));
    });
}

#[doc(hidden)]
pub fn describe<P: Policy>() -> wit::Descriptor {
    install_panic_hook();
    let d = P::describe();
    wit::Descriptor {
        name: d.name,
        version: d.version,
        description: d.description,
        input_schema: d.input_schema.to_string(),
        output_schema: d.output_schema.to_string(),
    }
}

#[doc(hidden)]
pub fn decide<P: Policy>(input: &str) -> Result<String, wit::PolicyError> {
    install_panic_hook();
    decide_json::<P>(input, &mut WitHost).map_err(|e| match e {
        PolicyError::InvalidInput(m) => wit::PolicyError::InvalidInput(m),
        PolicyError::ReadFailed(e) => wit::PolicyError::ReadFailed(to_wit_error(e)),
        PolicyError::Failed(m) => wit::PolicyError::Failed(m),
    })
}
