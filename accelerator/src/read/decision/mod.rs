//! The decision-model read: llama.cpp's decision GGUFs of the label-logit types (`openjev`,
//! `lev`, `pplx-decider`, `nimble`), asked as llama-server asks them (docs/models.md, "Decision
//! models").
//!
//! Each question gets one prompt per variant: the model's own `systemone` template over the
//! question as raw JSON values (`id`, `type`, `instructions`, `state`, `options` with their
//! `key`, `description` and, for lev, pplx-decider and nimble, their `label`; for nimble also
//! `questions`, every question of the request), tokenised with the special tokens written in it
//! recognised and nothing added. One forward pass gives the next-token
//! logits at the prompt's last token; the logits of the question's labels, softmaxed at the
//! model's fitted temperature and averaged over the variants, are its distribution
//! ([`readout`]).
//!
//! What differs between the types ([`LabelSet`], [`Readout`]): openjev's labels are the letters
//! `A`–`Z` then `a`–`z` (each one token, or the model is refused at load) and its noul lists
//! `true` first; lev's and pplx-decider's are the codes `A`…`Z`, `AA`…`ZZ` that are one token,
//! at most 255, given to the template; lev asks a choice twice (the options reversed the second
//! time), reads a noul on a 9-point scale at its first nine labels, and sorts every object's
//! keys before rendering.
//!
//! The protocol carries the state, instructions and descriptions as text; structured values are
//! reconstructed from it as the chat read does (`logits::canonical::reconstruct`), with its one
//! ambiguity (a string whose text is a JSON object reads as the object). Question ids and the
//! request's other questions reach a read only through [`ReadRequest::asked`], which the host
//! sends only to a model whose template reads `id` (or a nimble one's, `questions`;
//! [`DecisionPlanner::reads_question_ids`]); such a model refuses a read without them. A template
//! of another type that reads `questions` is refused at load: llama-server gives it none.
//!
//! `kev` is read otherwise (`kev`, `pointer`): its template is given kev text, each option ends
//! with a marker token, and its scores are its pointer head's at those markers against the
//! prompt's last position, in place of label logits ([`DecisionPlan::markers`]); the softmax
//! and the rest are the same. So is `laya` (`laya`): an encoder's head scores each option at
//! the mask token that opens it, the prompt cut to the head's budget first.

mod kev;
mod laya;
mod pointer;
mod readout;
#[cfg(test)]
mod tests;

pub use kev::{KevSetupError, MARKER};
pub use laya::{fit as fit_laya_prompt, FittedPrompt, LayaLayoutError, MAX_OPTION_TOKENS};
pub use pointer::{PointerHead, PointerHeadError};
pub use readout::Readout;

use serde_json::{json, Map, Value};

use super::logits::canonical::reconstruct;
use super::logits::{PromptTokenizer, Scoring, ScoringSequence};
use crate::checkpoint::gguf::{DecisionKind, DecisionMetadata, LayaMetadata};
use crate::tokenizer::chat::JinjaTemplate;
use hunch_core::{
    AskedQuestion, LabelDistribution, QuestionId, QuestionKind, QuestionLimits, ReadError,
    ReadRequest, RequestQuestions,
};

/// llama-server's bounds on a score's levels.
const MAX_SCORE_LEVELS: usize = 10;
/// The most labels a lev or pplx-decider model takes (llama-server's cap).
const MAX_CODES: usize = 255;
/// lev's noul scale: 0 = certainly no … 8 = certainly yes.
pub const LEV_RATINGS: usize = 9;

/// Why a decision model cannot be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DecisionSetupError {
    #[error("decision label '{0}' is not a single token")]
    Label(String),
    #[error("the systemone template: {0}")]
    Template(String),
    #[error(
        "the systemone template reads `{0}`, which llama-server gives only to a nimble model's \
         template"
    )]
    ReadsUnknown(&'static str),
    #[error(
        "a lev model needs {LEV_RATINGS} single-token labels for its noul scale, this one has {0}"
    )]
    TooFewLabels(usize),
    #[error(transparent)]
    Kev(#[from] KevSetupError),
    #[error("the systemone template: {0}")]
    Laya(#[from] LayaLayoutError),
}

/// The labels a model answers with, as token ids and (for lev and pplx-decider) their texts.
#[derive(Debug, Clone, PartialEq)]
pub struct LabelSet {
    pub ids: Vec<u32>,
    /// The label the template is given for each option position; empty where the template is
    /// given none (openjev).
    pub texts: Vec<String>,
}

impl LabelSet {
    /// The labels of `kind` under `tokenizer`, as llama-server picks them.
    pub fn new<T: PromptTokenizer>(
        kind: DecisionKind,
        tokenizer: &T,
    ) -> Result<LabelSet, DecisionSetupError> {
        let single = |text: &str| -> Option<u32> {
            match tokenizer.encode(text).ok()?.as_slice() {
                [id] => Some(*id),
                _ => None,
            }
        };
        match kind {
            DecisionKind::Openjev => {
                let ids = ('A'..='Z')
                    .chain('a'..='z')
                    .map(|c| single(&c.to_string()).ok_or(DecisionSetupError::Label(c.into())))
                    .collect::<Result<_, _>>()?;
                Ok(LabelSet {
                    ids,
                    texts: Vec::new(),
                })
            }
            // kev and laya read no labels: their options are read at their markers.
            DecisionKind::Kev | DecisionKind::Laya => Ok(LabelSet {
                ids: Vec::new(),
                texts: Vec::new(),
            }),
            DecisionKind::Lev | DecisionKind::PplxDecider | DecisionKind::Nimble => {
                let letters = ('A'..='Z').map(String::from);
                let pairs = ('A'..='Z').flat_map(|a| ('A'..='Z').map(move |b| format!("{a}{b}")));
                let mut set = LabelSet {
                    ids: Vec::new(),
                    texts: Vec::new(),
                };
                for code in letters.chain(pairs) {
                    if set.ids.len() == MAX_CODES {
                        break;
                    }
                    if let Some(id) = single(&code) {
                        set.ids.push(id);
                        set.texts.push(code);
                    }
                }
                if kind == DecisionKind::Lev && set.ids.len() < LEV_RATINGS {
                    return Err(DecisionSetupError::TooFewLabels(set.ids.len()));
                }
                Ok(set)
            }
        }
    }
}

/// Plans decision reads for one model. Built once per model.
pub struct DecisionPlanner<T: PromptTokenizer> {
    tokenizer: T,
    kind: DecisionKind,
    template: JinjaTemplate,
    metadata: DecisionMetadata,
    labels: LabelSet,
    max_prompt_tokens: usize,
    /// kev: the option marker's token id and, once the engine gives it, the pointer head.
    marker: Option<u32>,
    head: Option<PointerHead>,
    /// laya: the prompt's special tokens and the head's budget.
    laya: Option<LayaMetadata>,
    /// The template reads `id`, or (nimble) `questions`.
    reads_question_ids: bool,
}

/// The sequences of one request and how their label logits become each question's
/// distribution.
#[derive(Debug, Clone, PartialEq)]
pub struct DecisionPlan {
    /// Every question's variants, question by question.
    pub sequences: Vec<ScoringSequence>,
    /// One per question, in request order: which sequences are its variants.
    pub readouts: Vec<Readout>,
    /// kev and laya: each sequence's marker positions, one per option in the order given to
    /// the template, where its scores are read (kev: with the last position); `None` for the
    /// label types.
    pub markers: Option<Vec<Vec<usize>>>,
}

impl DecisionPlan {
    /// Each question's distribution from its sequences' label logits (one list per sequence, in
    /// the order of [`sequences`](Self::sequences)).
    pub fn distributions(&self, logits: &[Vec<f32>]) -> Result<Vec<LabelDistribution>, ReadError> {
        distributions(&self.readouts, logits)
    }
}

/// Each readout's distribution from the label logits of every sequence of its plan.
pub fn distributions(
    readouts: &[Readout],
    logits: &[Vec<f32>],
) -> Result<Vec<LabelDistribution>, ReadError> {
    let needed = readouts.last().map_or(0, |r| r.sequences.end);
    if logits.len() != needed {
        return Err(ReadError::internal(format!(
            "{} label logit lists for {needed} sequences",
            logits.len()
        )));
    }
    readouts
        .iter()
        .map(|r| r.distribution(&logits[r.sequences.clone()]))
        .collect()
}

impl<T: PromptTokenizer> DecisionPlanner<T> {
    /// A planner for the decision model `metadata` describes, over its `tokenizer`.
    pub fn new(
        tokenizer: T,
        metadata: DecisionMetadata,
        origin: &str,
        max_prompt_tokens: usize,
    ) -> Result<Self, DecisionSetupError> {
        let template = JinjaTemplate::compile(&metadata.template, origin)
            .map_err(|e| DecisionSetupError::Template(e.to_string()))?;
        let nimble = metadata.kind == DecisionKind::Nimble;
        if !nimble && template.reads("questions") {
            return Err(DecisionSetupError::ReadsUnknown("questions"));
        }
        let reads_question_ids = template.reads("id") || (nimble && template.reads("questions"));
        let labels = LabelSet::new(metadata.kind, &tokenizer)?;
        let marker = match metadata.kind {
            DecisionKind::Kev => Some(kev::marker_token(&tokenizer)?),
            DecisionKind::Laya => metadata.laya.as_ref().map(|l| l.mask),
            _ => None,
        };
        let laya = metadata.laya.clone();
        if metadata.kind == DecisionKind::Laya && laya.is_none() {
            return Err(DecisionSetupError::Laya(LayaLayoutError(
                "no mask token, separator or budget given".into(),
            )));
        }
        let planner = DecisionPlanner {
            tokenizer,
            kind: metadata.kind,
            template,
            metadata,
            labels,
            max_prompt_tokens,
            marker,
            head: None,
            laya,
            reads_question_ids,
        };
        // A template that cannot render a plain question is refused now, not on every read.
        let question = hunch_core::Question {
            instructions: "instructions".into(),
            kind: QuestionKind::Choice {
                options: ["a", "b"]
                    .map(|name| hunch_core::ChoiceOption {
                        name: name.into(),
                        description: None,
                    })
                    .into(),
            },
        };
        let probe = ReadRequest {
            state: "state".into(),
            questions: vec![question.clone()],
            options: Default::default(),
            asked: Some(RequestQuestions::new(
                vec![AskedQuestion {
                    id: QuestionId("question".into()),
                    question,
                }],
                vec![0],
            )),
        };
        let text = planner
            .render(&probe, 0, 0)
            .map_err(|e| DecisionSetupError::Template(e.to_string()))?;
        if let Some(marker) = planner.marker {
            // A kev template must end each option with one marker, a laya one open each
            // option with one between its separators (llama-server checks every prompt): one
            // that does not is refused now.
            let tokens = planner
                .tokenizer
                .encode(&text)
                .map_err(DecisionSetupError::Template)?;
            match &planner.laya {
                Some(laya) => {
                    laya::fit(&tokens, 2, marker, laya.sep, laya.max_head_tokens)?;
                }
                None => {
                    kev::layout(&tokens, marker, 2)?;
                }
            }
        }
        Ok(planner)
    }

    /// The planner with a kev model's pointer head, which its reads need.
    pub fn with_pointer_head(mut self, head: PointerHead) -> Self {
        self.head = Some(head);
        self
    }

    /// A kev model's pointer head, once given.
    pub fn pointer_head(&self) -> Option<&PointerHead> {
        self.head.as_ref()
    }

    pub fn tokenizer(&self) -> &T {
        &self.tokenizer
    }

    pub fn kind(&self) -> DecisionKind {
        self.kind
    }

    /// Whether the prompt names questions by the caller's ids (the template reads `id`, or a
    /// nimble template `questions`): its reads need [`ReadRequest::asked`], and its answers
    /// depend on the ids and the request's other questions.
    pub fn reads_question_ids(&self) -> bool {
        self.reads_question_ids
    }

    /// The labels the model answers with, in option order.
    pub fn labels(&self) -> &LabelSet {
        &self.labels
    }

    /// How many options and levels a question may have: as many as the model has labels, a
    /// score at most llama-server's 10 levels.
    pub fn question_limits(&self) -> QuestionLimits {
        let labels = match self.kind {
            // kev and laya read at markers: llama-server's 255 options.
            DecisionKind::Kev | DecisionKind::Laya => MAX_CODES,
            _ => self.labels.ids.len(),
        };
        QuestionLimits {
            max_choice_options: labels,
            max_score_levels: labels.min(MAX_SCORE_LEVELS),
        }
    }

    /// One sequence per question and variant.
    pub fn plan(&self, request: &ReadRequest) -> Result<DecisionPlan, ReadError> {
        self.check_asked(request)?;
        let limits = self.question_limits();
        let mut sequences = Vec::new();
        let mut markers = Vec::new();
        let mut readouts = Vec::with_capacity(request.questions.len());
        for (index, question) in request.questions.iter().enumerate() {
            question
                .validate(&limits)
                .map_err(|e| ReadError::InvalidQuestion {
                    question: index,
                    message: e.to_string(),
                })?;
            if !carries_content(&reconstruct(&question.instructions)) {
                // A decision model's template has no fallback for missing instructions (lev's
                // converter leaves that rule to the server), so the question is refused as
                // llama-server refuses it.
                return Err(ReadError::InvalidQuestion {
                    question: index,
                    message: "a decision model needs instructions with content: a non-empty \
                              string, object or array"
                        .into(),
                });
            }
            let readout = Readout::new(self.kind, question, &self.metadata.temperatures);
            let first = sequences.len();
            for variant in 0..readout.variants() {
                let text = self.render(request, index, variant)?;
                let mut tokens = self
                    .tokenizer
                    .encode(&text)
                    .map_err(|e| ReadError::internal(format!("tokenizer: {e}")))?;
                if let (Some(laya), Some(marker)) = (&self.laya, self.marker) {
                    // Cut to the head's budget; the state is not cut, so the limit applies
                    // to what is left.
                    let fitted = laya::fit(
                        &tokens,
                        readout.outputs(),
                        marker,
                        laya.sep,
                        laya.max_head_tokens,
                    )
                    .map_err(|e| ReadError::internal(format!("question {index}: {e}")))?;
                    tokens = fitted.tokens;
                    markers.push(fitted.markers);
                }
                if tokens.len() > self.max_prompt_tokens {
                    return Err(ReadError::TooLarge {
                        message: format!(
                            "question {index}: the prompt is {} tokens, this model reads at most \
                             {}",
                            tokens.len(),
                            self.max_prompt_tokens
                        ),
                    });
                }
                let labels = match self.marker {
                    // laya: its markers are read above.
                    Some(_) if self.laya.is_some() => Vec::new(),
                    // kev: read at one marker per option, no labels.
                    Some(marker) => {
                        let at = kev::layout(&tokens, marker, readout.outputs())
                            .map_err(|e| ReadError::internal(format!("question {index}: {e}")))?;
                        markers.push(at);
                        Vec::new()
                    }
                    None => self.labels.ids[..readout.outputs()].to_vec(),
                };
                sequences.push(ScoringSequence {
                    question: index,
                    tokens,
                    labels,
                    scoring: nominal_scoring(&question.kind),
                });
            }
            readouts.push(readout.over(first..sequences.len()));
        }
        Ok(DecisionPlan {
            sequences,
            readouts,
            markers: self.marker.map(|_| markers),
        })
    }

    /// A model whose prompt names questions by id refuses a read that does not carry them (a
    /// host that predates [`ReadRequest::asked`]), or one whose ids do not cover its questions,
    /// rather than answer a prompt without them.
    fn check_asked(&self, request: &ReadRequest) -> Result<(), ReadError> {
        if !self.reads_question_ids {
            return Ok(());
        }
        let refuse = |message: String| {
            Err(ReadError::InvalidQuestion {
                question: 0,
                message,
            })
        };
        let Some(asked) = &request.asked else {
            return refuse(format!(
                "this {} decision model's prompt names each question by its id and lists the \
                 request's questions, and the read carries neither (`asked`, sent by hosts \
                 that serve nimble models): upgrade the host that sent it",
                self.kind.name()
            ));
        };
        if asked.positions.len() != request.questions.len()
            || asked.positions.iter().any(|&p| p >= asked.questions.len())
        {
            return refuse(format!(
                "the read's `asked` places {} questions among {}, and the read has {}",
                asked.positions.len(),
                asked.questions.len(),
                request.questions.len()
            ));
        }
        Ok(())
    }

    /// The prompt of question `index`'s `variant` (1: the options reversed).
    pub fn render(
        &self,
        request: &ReadRequest,
        index: usize,
        variant: usize,
    ) -> Result<String, ReadError> {
        let question = &request.questions[index];
        let mut options = self.options(&question.kind);
        if variant == 1 {
            options.reverse();
        }
        // In llama-server's order: the template's `tojson` writes keys as given.
        let mut input = Map::new();
        if let Some(id) = request.asked.as_ref().and_then(|a| a.id(index)) {
            input.insert("id".into(), Value::String(id.as_str().to_string()));
        }
        input.insert("type".into(), type_name(&question.kind).into());
        input.insert("instructions".into(), reconstruct(&question.instructions));
        input.insert("state".into(), reconstruct(&request.state));
        input.insert("options".into(), self.labelled(options));
        if self.kind == DecisionKind::Nimble {
            // Every question of the request, each with its options as first given.
            let questions = request.asked.iter().flat_map(|a| &a.questions).map(|q| {
                json!({
                    "id": q.id.as_str(),
                    "type": type_name(&q.question.kind),
                    "instructions": reconstruct(&q.question.instructions),
                    "options": self.labelled(self.options(&q.question.kind)),
                })
            });
            input.insert("questions".into(), Value::Array(questions.collect()));
        }
        let mut input = Value::Object(input);
        if self.kind == DecisionKind::Lev {
            // lev was trained on prompts whose objects have their keys sorted.
            input = sorted_keys(input);
        }
        if self.kind == DecisionKind::Kev {
            // kev's template takes text only.
            kev::as_text(&mut input);
        }
        if let Some(laya) = &self.laya {
            // Only the template's masks may be markers.
            laya::without_marker_text(&mut input, &laya.mask_text);
        }
        input["images"] = json!([]);
        self.template
            .render(&input)
            .map_err(|e| ReadError::internal(e.to_string()))
    }

    /// `options` as the template is given them: `key`, `description` and, where the model has
    /// label texts, the `label` of each position.
    fn labelled(&self, options: Vec<(String, Value)>) -> Value {
        options
            .into_iter()
            .enumerate()
            .map(|(i, (key, description))| {
                let mut option = Map::new();
                option.insert("key".into(), Value::String(key));
                option.insert("description".into(), description);
                if let Some(label) = self.labels.texts.get(i) {
                    option.insert("label".into(), Value::String(label.clone()));
                }
                Value::Object(option)
            })
            .collect()
    }

    /// The options as llama-server lists them: a choice's in the request's order, a score's
    /// levels keyed `0`…, a noul's `false` then `true` (openjev: `true` first).
    fn options(&self, kind: &QuestionKind) -> Vec<(String, Value)> {
        let text = |t: &Option<String>| t.as_deref().map_or(Value::Null, reconstruct);
        match kind {
            QuestionKind::Choice { options } => options
                .iter()
                .map(|o| (o.name.clone(), text(&o.description)))
                .collect(),
            QuestionKind::Score { levels } => levels
                .iter()
                .enumerate()
                .map(|(i, level)| (i.to_string(), reconstruct(level)))
                .collect(),
            QuestionKind::Noul { yes, no } => {
                let mut pair = vec![
                    ("false".to_string(), text(no)),
                    ("true".to_string(), text(yes)),
                ];
                if self.kind == DecisionKind::Openjev {
                    pair.reverse();
                }
                pair
            }
        }
    }
}

fn type_name(kind: &QuestionKind) -> &'static str {
    match kind {
        QuestionKind::Noul { .. } => "noul",
        QuestionKind::Choice { .. } => "choice",
        QuestionKind::Score { .. } => "score",
    }
}

/// The chat read's scoring of the same kind: only a label for the sequence here (the decision
/// plan computes distributions itself, [`DecisionPlan::distributions`]).
fn nominal_scoring(kind: &QuestionKind) -> Scoring {
    match kind {
        QuestionKind::Noul { .. } => Scoring::Noul,
        QuestionKind::Choice { .. } => Scoring::Choice,
        QuestionKind::Score { .. } => Scoring::Score,
    }
}

/// Whether instructions say something: a non-empty string, object or array.
fn carries_content(value: &Value) -> bool {
    match value {
        Value::String(s) => !s.is_empty(),
        Value::Object(map) => !map.is_empty(),
        Value::Array(items) => !items.is_empty(),
        _ => false,
    }
}

/// `value` with every object's keys sorted, recursively.
fn sorted_keys(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k, sorted_keys(v)))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted_keys).collect()),
        other => other,
    }
}
