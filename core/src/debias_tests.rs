use super::*;
use crate::question::ChoiceOption;
use crate::reader::ReaderLimits;
use std::sync::Mutex;

/// A reader with a position bias: at position `j` of a question's shown options the model's
/// probability is `bias[j] · evidence(option)`, renormalised, where the evidence for an option
/// is 4 when the state names it and 1 otherwise (so about "N/A" it is the bias alone). A noul
/// reads `[yes, no]` as `[0.8·e, 0.2]` with `e` 4 when the state says "yes".
struct Biased {
    bias: Vec<f64>,
    asked: Mutex<Vec<ReadRequest>>,
}

impl Biased {
    fn new(bias: &[f64]) -> Self {
        Biased {
            bias: bias.to_vec(),
            asked: Mutex::new(Vec::new()),
        }
    }

    fn asked(&self) -> Vec<ReadRequest> {
        self.asked.lock().unwrap().clone()
    }
}

fn evidence(state: &str, name: &str) -> f64 {
    if state.split(' ').any(|w| w == name) {
        4.0
    } else {
        1.0
    }
}

#[async_trait::async_trait]
impl Reader for Biased {
    fn model_name(&self) -> &str {
        "biased"
    }

    async fn read(&self, request: ReadRequest) -> Result<ReadOutcome, ReadError> {
        self.asked.lock().unwrap().push(request.clone());
        let distributions = request
            .questions
            .iter()
            .map(|q| {
                let p = match &q.kind {
                    QuestionKind::Choice { options } => options
                        .iter()
                        .enumerate()
                        .map(|(j, o)| self.bias[j] * evidence(&request.state, &o.name))
                        .collect(),
                    QuestionKind::Score { levels } => levels
                        .iter()
                        .enumerate()
                        .map(|(j, l)| self.bias[j] * evidence(&request.state, l))
                        .collect(),
                    QuestionKind::Noul { .. } => {
                        vec![0.8 * evidence(&request.state, "yes"), 0.2]
                    }
                };
                LabelDistribution(normalised(p))
            })
            .collect();
        Ok(ReadOutcome {
            distributions,
            usage: Usage {
                input_tokens: 10,
                output_tokens: 1,
            },
            stats: ReadStats {
                reads: 1,
                ..ReadStats::default()
            },
        })
    }

    fn info(&self) -> ReaderInfo {
        ReaderInfo {
            limits: ReaderLimits::default(),
            fingerprint: Some("biased".into()),
            kind: None,
        }
    }
}

fn choice(names: &[&str]) -> Question {
    Question {
        instructions: "which?".into(),
        kind: QuestionKind::Choice {
            options: names
                .iter()
                .map(|n| ChoiceOption {
                    name: n.to_string(),
                    description: None,
                })
                .collect(),
        },
    }
}

fn noul() -> Question {
    Question {
        instructions: "yes?".into(),
        kind: QuestionKind::Noul {
            yes: None,
            no: None,
        },
    }
}

fn request(
    state: &str,
    questions: Vec<Question>,
    prior: PriorMode,
    order: OrderMode,
) -> ReadRequest {
    ReadRequest {
        state: state.into(),
        questions,
        options: crate::ReadOptions {
            questions: QuestionMode::Isolated,
            prior,
            order,
            ..Default::default()
        },
        asked: None,
    }
}

fn close(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-12)
}

#[tokio::test]
async fn a_biased_readers_prior_is_divided_out_exactly() {
    let inner = Arc::new(Biased::new(&[0.7, 0.2, 0.1]));
    let reader = DebiasingReader::new(inner.clone());
    let q = choice(&["red", "green", "blue"]);
    // Raw: the first position wins although the state names "blue".
    let raw = reader
        .read(request(
            "it is blue",
            vec![q.clone()],
            PriorMode::None,
            OrderMode::AsGiven,
        ))
        .await
        .unwrap();
    assert!(raw.distributions[0].0[0] > raw.distributions[0].0[2]);
    let fixed = reader
        .read(request(
            "it is blue",
            vec![q.clone()],
            PriorMode::Divide,
            OrderMode::AsGiven,
        ))
        .await
        .unwrap();
    // The evidence alone: [1, 1, 4] / 6.
    assert!(close(
        &fixed.distributions[0].0,
        &[1.0 / 6.0, 1.0 / 6.0, 4.0 / 6.0]
    ));
    let asked = inner.asked();
    assert_eq!(
        asked.len(),
        3,
        "one read passed through, then the state and the prior"
    );
    assert_eq!(asked[2].state, PRIOR_STATE);
    // The model's reader never sees the remedies.
    assert!(asked
        .iter()
        .all(|r| r.options.prior.is_none() && r.options.order.is_as_given()));
    // The costs of both reads are counted.
    assert_eq!(fixed.usage.input_tokens, 20);
    assert_eq!(fixed.stats.reads, 2);
}

#[tokio::test]
async fn a_nouls_prior_is_divided_out_as_odds() {
    let reader = DebiasingReader::new(Arc::new(Biased::new(&[])));
    // About "N/A" the model says yes at 0.8; about a state with no evidence the same: corrected
    // to an even answer. With evidence (odds ×4) the corrected answer is 4 : 1.
    let even = reader
        .read(request(
            "nothing here",
            vec![noul()],
            PriorMode::Divide,
            OrderMode::ReversedAverage,
        ))
        .await
        .unwrap();
    assert!(close(&even.distributions[0].0, &[0.5, 0.5]));
    let yes = reader
        .read(request(
            "say yes",
            vec![noul()],
            PriorMode::Divide,
            OrderMode::AsGiven,
        ))
        .await
        .unwrap();
    assert!(close(&yes.distributions[0].0, &[0.8, 0.2]));
}

#[tokio::test]
async fn reversed_averaging_maps_each_read_back_to_its_options_names() {
    let inner = Arc::new(Biased::new(&[0.6, 0.3, 0.1]));
    let reader = DebiasingReader::new(inner.clone());
    let q = choice(&["red", "green", "blue"]);
    let out = reader
        .read(request(
            "nothing",
            vec![q],
            PriorMode::None,
            OrderMode::ReversedAverage,
        ))
        .await
        .unwrap();
    // As given red is at position 0 (0.6), reversed at position 2 (0.1): the mean 0.35 is red's,
    // and blue gets the mirror image; green stays in the middle both times.
    assert!(close(&out.distributions[0].0, &[0.35, 0.3, 0.35]));
    let asked = inner.asked();
    assert_eq!(
        asked.len(),
        1,
        "both orders of an isolated question in one read"
    );
    let QuestionKind::Choice { options } = &asked[0].questions[1].kind else {
        panic!("not a choice");
    };
    let names: Vec<&str> = options.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, ["blue", "green", "red"]);
}

#[tokio::test]
async fn cyclic_averaging_of_a_position_only_reader_is_uniform_and_bounded() {
    let inner = Arc::new(Biased::new(&[0.5, 0.25, 0.15, 0.1]));
    let reader = DebiasingReader::new(inner.clone());
    let q = choice(&["a", "b", "c", "d"]);
    let out = reader
        .read(request(
            "none",
            vec![q],
            PriorMode::None,
            OrderMode::CyclicAverage,
        ))
        .await
        .unwrap();
    // Every option sat at every position once: the bias averages out.
    assert!(close(&out.distributions[0].0, &[0.25; 4]));
    assert_eq!(inner.asked()[0].questions.len(), 4);
    // Ten options read in four shifts, spread evenly (0, 2, 5, 7), never ten.
    let ten = choice(&["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"]);
    let shifts: Vec<usize> = orders(&ten, OrderMode::CyclicAverage)
        .iter()
        .map(|o| o[0])
        .collect();
    assert_eq!(shifts, [0, 2, 5, 7]);
    assert_eq!(orders(&noul(), OrderMode::CyclicAverage).len(), 1);
}

#[tokio::test]
async fn both_remedies_together_divide_each_order_by_its_own_prior() {
    let inner = Arc::new(Biased::new(&[0.7, 0.2, 0.1]));
    let reader = DebiasingReader::new(inner.clone());
    let q = choice(&["red", "green", "blue"]);
    let out = reader
        .read(request(
            "it is green",
            vec![q, noul()],
            PriorMode::Divide,
            OrderMode::ReversedAverage,
        ))
        .await
        .unwrap();
    assert!(close(
        &out.distributions[0].0,
        &[1.0 / 6.0, 4.0 / 6.0, 1.0 / 6.0]
    ));
    assert!(close(&out.distributions[1].0, &[0.5, 0.5]));
    // Isolated: one read about the state and one about "N/A", each with 3 questions.
    let asked = inner.asked();
    assert_eq!(asked.len(), 2);
    assert!(asked.iter().all(|r| r.questions.len() == 3));
}

#[tokio::test]
async fn joint_reads_list_each_question_once_per_prompt() {
    let inner = Arc::new(Biased::new(&[0.7, 0.2, 0.1]));
    let reader = DebiasingReader::new(inner.clone());
    let mut r = request(
        "it is red",
        vec![choice(&["red", "green", "blue"]), noul()],
        PriorMode::None,
        OrderMode::ReversedAverage,
    );
    r.options.questions = QuestionMode::Joint;
    reader.read(r).await.unwrap();
    let sizes: Vec<usize> = inner.asked().iter().map(|r| r.questions.len()).collect();
    // The given order with both questions, then the reversed choice alone.
    assert_eq!(sizes, [2, 1]);
}

/// Refuses the reversed copy of a choice (its options start with "blue").
struct RefusesReversed;

#[async_trait::async_trait]
impl Reader for RefusesReversed {
    fn model_name(&self) -> &str {
        "refuses"
    }
    async fn read(&self, request: ReadRequest) -> Result<ReadOutcome, ReadError> {
        let at = request.questions.iter().position(
            |q| matches!(&q.kind, QuestionKind::Choice { options } if options[0].name == "blue"),
        );
        match at {
            Some(question) => Err(ReadError::InvalidQuestion {
                question,
                message: "no".into(),
            }),
            None => Err(ReadError::internal("unexpected")),
        }
    }
    fn info(&self) -> ReaderInfo {
        ReaderInfo::unknown()
    }
}

#[tokio::test]
async fn an_error_about_an_extra_read_names_the_requests_question() {
    let reader = DebiasingReader::new(Arc::new(RefusesReversed));
    let err = reader
        .read(request(
            "s",
            vec![noul(), choice(&["red", "green", "blue"])],
            PriorMode::None,
            OrderMode::ReversedAverage,
        ))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ReadError::InvalidQuestion { question: 1, .. }),
        "{err:?}"
    );
}

#[test]
fn modes_parse_their_names_and_refuse_others_by_name() {
    assert_eq!("divide".parse::<PriorMode>(), Ok(PriorMode::Divide));
    assert_eq!(
        "cyclic_average".parse::<OrderMode>(),
        Ok(OrderMode::CyclicAverage)
    );
    let err = "reverse".parse::<OrderMode>().unwrap_err().to_string();
    assert!(
        err.contains("`reverse`") && err.contains("`reversed_average`"),
        "{err}"
    );
    // Absent from a read request's JSON when off, so the sidecar's wire is unchanged.
    let text = serde_json::to_string(&crate::ReadOptions::default()).unwrap();
    assert!(!text.contains("prior") && !text.contains("order"), "{text}");
}

/// A remedy's extra reads carry the caller's ids, each read's positions naming the question it
/// asks (in whatever order), so a model that reads ids is asked about the right question.
#[tokio::test]
async fn every_extra_read_names_its_question_by_the_callers_id() {
    let inner = Arc::new(Biased::new(&[0.7, 0.2, 0.1]));
    let reader = DebiasingReader::new(inner.clone());
    let questions = vec![choice(&["red", "green", "blue"]), noul()];
    let ids = ["colour", "ok"];
    let mut asked = request(
        "red",
        questions.clone(),
        PriorMode::Divide,
        OrderMode::ReversedAverage,
    );
    asked.asked = Some(crate::RequestQuestions::new(
        ids.iter()
            .zip(&questions)
            .map(|(id, q)| crate::AskedQuestion {
                id: crate::QuestionId(id.to_string()),
                question: q.clone(),
            })
            .collect(),
        vec![0, 1],
    ));
    reader.read(asked).await.unwrap();
    let reads = inner.asked();
    assert!(reads.len() >= 2, "a read about the state and one about N/A");
    for read in reads {
        let asked = read.asked.as_ref().expect("asked kept");
        assert_eq!(asked.questions.len(), 2, "the whole request, always");
        assert_eq!(asked.positions.len(), read.questions.len());
        for (i, q) in read.questions.iter().enumerate() {
            let id = asked.id(i).expect("an id").as_str();
            let kind_matches = matches!(
                (&q.kind, id),
                (QuestionKind::Choice { .. }, "colour") | (QuestionKind::Noul { .. }, "ok")
            );
            assert!(kind_matches, "question {i} of a read named {id}");
        }
    }
}
