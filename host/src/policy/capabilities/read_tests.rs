//! The tests of `read.rs`.

use super::*;
use crate::policy::testing::InstantReader;

fn q(id: &str, kind: wit::QuestionKind) -> wit::Question {
    wit::Question {
        id: id.into(),
        instructions: "?".into(),
        kind,
    }
}

fn noul(id: &str) -> wit::Question {
    q(
        id,
        wit::QuestionKind::Noul(wit::NoulCriteria {
            yes: None,
            no: None,
        }),
    )
}

fn set(questions: Vec<wit::Question>) -> wit::QuestionSet {
    wit::QuestionSet {
        state: "s".into(),
        questions,
    }
}

fn cap(limits: Limits) -> ReadCapability {
    ReadCapability::new(Some(Arc::new(InstantReader::uniform())), limits)
}

#[tokio::test]
async fn answers_come_from_the_core_math_in_question_order() {
    let mut c = cap(Limits::default());
    let options = vec![
        wit::ChoiceOption {
            name: "a".into(),
            description: None,
        },
        wit::ChoiceOption {
            name: "b".into(),
            description: None,
        },
    ];
    let out = c
        .read_sets(vec![set(vec![
            noul("x"),
            q("only", wit::QuestionKind::Score(vec!["one".into()])),
            q("c", wit::QuestionKind::Choice(options)),
        ])])
        .await
        .unwrap();
    let answers = out[0].as_ref().unwrap();
    assert_eq!(answers.answers.len(), 3);
    assert!(matches!(answers.answers[0].value, wit::AnswerValue::Noul(p) if p == 0.5));
    // A one-level score is certain and was not sent to the reader.
    assert!(matches!(&answers.answers[1].value, wit::AnswerValue::Score(s) if s.confidence == 1.0));
    assert!(matches!(&answers.answers[2].value, wit::AnswerValue::Choice(ch) if ch.choice == "a"));
    assert_eq!(c.records.len(), 1);
    assert_eq!(c.records[0].questions.len(), 3);
}

#[tokio::test]
async fn malformed_questions_are_read_errors_not_traps() {
    let mut c = cap(Limits::default());
    let dup = vec![
        wit::ChoiceOption {
            name: "a".into(),
            description: None,
        },
        wit::ChoiceOption {
            name: "a".into(),
            description: None,
        },
    ];
    let out = c
        .read_sets(vec![set(vec![
            noul("ok"),
            q("d", wit::QuestionKind::Choice(dup)),
        ])])
        .await
        .unwrap();
    let err = out[0].as_ref().unwrap_err();
    assert_eq!(err.kind, wit::ReadErrorKind::InvalidQuestion);
    assert_eq!(err.question, Some(1));
}

#[tokio::test]
async fn the_read_limit_traps_with_its_name_and_reads_nothing() {
    let mut c = cap(Limits {
        max_reads: 2,
        ..Limits::default()
    });
    let err = c
        .read_sets(vec![set(vec![noul("a")]); 3])
        .await
        .unwrap_err();
    let limit = err.downcast_ref::<LimitExceeded>().unwrap();
    assert_eq!(limit.limit, Limit::Reads);
    assert!(c.records.is_empty());
    assert!(c.read_sets(vec![set(vec![noul("a")]); 2]).await.is_ok());
}

#[tokio::test]
async fn the_question_limit_counts_over_reads() {
    let mut c = cap(Limits {
        max_questions: 3,
        ..Limits::default()
    });
    c.read_sets(vec![set(vec![noul("a"), noul("b")])])
        .await
        .unwrap();
    let err = c
        .read_sets(vec![set(vec![noul("c"), noul("d")])])
        .await
        .unwrap_err();
    assert_eq!(
        err.downcast_ref::<LimitExceeded>().unwrap().limit,
        Limit::Questions
    );
}

/// A reader that refuses a question by its index among those it was sent, or has limits.
struct Strict {
    blame: Option<usize>,
    limits: hunch_core::ReaderLimits,
    asked: std::sync::Mutex<Vec<hunch_core::ReadRequest>>,
}

impl Strict {
    fn new() -> Self {
        Strict {
            blame: None,
            limits: Default::default(),
            asked: Default::default(),
        }
    }
}

#[async_trait::async_trait]
impl Reader for Strict {
    fn model_name(&self) -> &str {
        "strict"
    }
    async fn read(
        &self,
        request: hunch_core::ReadRequest,
    ) -> Result<hunch_core::ReadOutcome, ReadError> {
        self.asked.lock().unwrap().push(request.clone());
        if let Some(question) = self.blame {
            return Err(ReadError::InvalidQuestion {
                question,
                message: "labels do not share one slot".into(),
            });
        }
        Ok(hunch_core::ReadOutcome {
            distributions: request
                .questions
                .iter()
                .map(|q| {
                    let n = q.label_count();
                    hunch_core::LabelDistribution(vec![1.0 / n as f64; n])
                })
                .collect(),
            usage: Usage::default(),
            stats: Default::default(),
        })
    }
    fn info(&self) -> hunch_core::ReaderInfo {
        hunch_core::ReaderInfo {
            limits: self.limits,
            ..hunch_core::ReaderInfo::unknown()
        }
    }
}

fn with(reader: Strict) -> (ReadCapability, Arc<Strict>) {
    let reader = Arc::new(reader);
    (
        ReadCapability::new(Some(reader.clone()), Limits::default()),
        reader,
    )
}

#[tokio::test]
async fn a_refused_question_is_named_by_its_index_in_the_policys_set() {
    // The reader is sent [b, c] (the one-level score needs no read) and refuses its second.
    let (mut c, _) = with(Strict {
        blame: Some(1),
        ..Strict::new()
    });
    let out = c
        .read_sets(vec![set(vec![
            q("only", wit::QuestionKind::Score(vec!["one".into()])),
            noul("b"),
            noul("c"),
        ])])
        .await
        .unwrap();
    let err = out[0].as_ref().unwrap_err();
    assert_eq!(err.kind, wit::ReadErrorKind::InvalidQuestion);
    assert_eq!(err.question, Some(2), "c is the set's question 2");
}

#[tokio::test]
async fn option_and_level_limits_hold_for_policies() {
    let (mut c, reader) = with(Strict::new());
    let options: Vec<wit::ChoiceOption> = (0..256)
        .map(|i| wit::ChoiceOption {
            name: format!("o{i}"),
            description: None,
        })
        .collect();
    let levels: Vec<String> = (0..51).map(|i| i.to_string()).collect();
    let out = c
        .read_sets(vec![
            set(vec![
                noul("a"),
                q("wide", wit::QuestionKind::Choice(options)),
            ]),
            set(vec![q("deep", wit::QuestionKind::Score(levels))]),
        ])
        .await
        .unwrap();
    assert_eq!(out[0].as_ref().unwrap_err().question, Some(1));
    assert_eq!(out[1].as_ref().unwrap_err().question, Some(0));
    assert!(
        reader.asked.lock().unwrap().is_empty(),
        "refused before any read"
    );
}

#[tokio::test]
async fn a_read_over_the_readers_size_limit_is_too_large_and_never_sent() {
    let (mut c, reader) = with(Strict {
        limits: hunch_core::ReaderLimits {
            max_request_bytes: Some(1 << 20),
            ..Default::default()
        },
        ..Strict::new()
    });
    // A 2 MiB question (the policy's state limit does not cover questions).
    let mut huge = noul("a");
    huge.instructions = "x".repeat(2 << 20);
    let out = c.read_sets(vec![set(vec![huge])]).await.unwrap();
    assert_eq!(
        out[0].as_ref().unwrap_err().kind,
        wit::ReadErrorKind::TooLarge
    );
    assert!(reader.asked.lock().unwrap().is_empty());
}

#[tokio::test]
async fn reads_use_the_configured_question_mode() {
    let (c, reader) = with(Strict::new());
    let mut c = c.with_answering(AnswerSettings {
        questions: hunch_core::QuestionMode::Joint,
        ..AnswerSettings::default()
    });
    c.read_sets(vec![set(vec![noul("a")])]).await.unwrap();
    let (mut d, isolated) = with(Strict::new());
    d.read_sets(vec![set(vec![noul("a")])]).await.unwrap();
    assert_eq!(
        reader.asked.lock().unwrap()[0].options.questions,
        hunch_core::QuestionMode::Joint
    );
    assert_eq!(
        isolated.asked.lock().unwrap()[0].options.questions,
        hunch_core::QuestionMode::Isolated
    );
}

/// A reader answering every question with the same two-label distribution.
struct Fixed(Vec<f64>);

#[async_trait::async_trait]
impl Reader for Fixed {
    fn model_name(&self) -> &str {
        "fixed"
    }
    async fn read(
        &self,
        request: hunch_core::ReadRequest,
    ) -> Result<hunch_core::ReadOutcome, ReadError> {
        Ok(hunch_core::ReadOutcome {
            distributions: request
                .questions
                .iter()
                .map(|_| hunch_core::LabelDistribution(self.0.clone()))
                .collect(),
            usage: Usage::default(),
            stats: Default::default(),
        })
    }
    fn info(&self) -> hunch_core::ReaderInfo {
        // A fingerprint, so the answer cache may keep its answers.
        hunch_core::ReaderInfo {
            fingerprint: Some("fixed".into()),
            ..hunch_core::ReaderInfo::unknown()
        }
    }
}

#[tokio::test]
async fn a_calibration_changes_the_answers_it_covers_exactly_as_the_offline_math() {
    let metrics =
        serde_json::json!({"nll": 0.0, "brier": 0.0, "ece": 0.0, "accuracy": 0.0, "bins": []});
    let file = serde_json::json!({
        "format": crate::calibration::file::FORMAT, "folds": 5, "ece_bins": 10,
        "ece_binning": "", "min_labels": 30,
        "questions": [{"key": "", "ids": [], "question": to_core(&noul("a")),
            "temperature": 2.5, "labels": 0, "fold_temperatures": [],
            "before": metrics, "after": metrics}]
    });
    let c = Calibrations::from_bytes(&serde_json::to_vec(&file).unwrap()).unwrap();
    let offline = c
        .for_question(&to_core(&noul("a")))
        .unwrap()
        .apply(&[0.9, 0.1]);
    // The answer cache below the calibration, as the server builds it: the second read is
    // a cache hit and must be calibrated exactly like the first.
    let cache = Arc::new(hunch_core::AnswerCache::new(1 << 20));
    let settings = AnswerSettings {
        questions: hunch_core::QuestionMode::Isolated,
        cache: Some(cache.clone()),
        ..AnswerSettings::default()
    };
    let reader = settings.reader(Arc::new(Fixed(vec![0.9, 0.1])));
    let calibration = Arc::new(c);
    let mut other = noul("b");
    other.instructions = "another question".into();
    let mut runs = Vec::new();
    for _ in 0..2 {
        let mut cap = ReadCapability::new(Some(reader.clone()), Limits::default())
            .with_answering(settings.clone())
            .with_calibration(Some(calibration.clone()));
        runs.push(
            cap.read_sets(vec![set(vec![noul("a"), other.clone()])])
                .await
                .unwrap(),
        );
    }
    assert!(cache.stats().hits > 0, "the second run came from the cache");
    let nouls = |run: &Vec<Result<wit::Answers, wit::ReadError>>| -> Vec<u64> {
        run[0]
            .as_ref()
            .unwrap()
            .answers
            .iter()
            .map(|a| match a.value {
                wit::AnswerValue::Noul(p) => p.to_bits(),
                _ => panic!("a noul"),
            })
            .collect()
    };
    assert_eq!(
        nouls(&runs[0]),
        nouls(&runs[1]),
        "a cached answer is calibrated like a read one"
    );
    let answers = &runs[1][0].as_ref().unwrap().answers;
    let p = |i: usize| match answers[i].value {
        wit::AnswerValue::Noul(p) => p,
        _ => panic!("a noul"),
    };
    let expected = match hunch_core::Answer::from_distribution(
        &to_core(&noul("a")),
        &hunch_core::LabelDistribution(offline),
    )
    .unwrap()
    {
        Answer::Noul { noul } => noul,
        other => panic!("{other:?}"),
    };
    assert_eq!(p(0).to_bits(), expected.to_bits());
    assert_ne!(p(0), 0.9);
    assert_eq!(
        p(1),
        0.9,
        "a question the calibration does not cover stays raw"
    );
}

/// The decision's record names each read's questions by the ids the policy gave them, for
/// concurrent sets, with and without a calibration between the policy and the recorder.
#[tokio::test]
async fn recorded_reads_carry_the_policys_question_ids() {
    use crate::decision::recorder::{ReadLog, RecordingReader};
    let file = serde_json::json!({
        "format": crate::calibration::file::FORMAT, "folds": 5, "ece_bins": 10,
        "ece_binning": "", "min_labels": 30, "questions": []
    });
    let calibration = Calibrations::from_bytes(&serde_json::to_vec(&file).unwrap()).unwrap();
    for calibration in [None, Some(Arc::new(calibration))] {
        let log = ReadLog::default();
        let recording = RecordingReader::new(Arc::new(Fixed(vec![0.6, 0.4])), log.clone(), true);
        let mut c = ReadCapability::new(Some(Arc::new(recording)), Limits::default())
            .with_calibration(calibration);
        let mut other = noul("spam");
        other.instructions = "spam?".into();
        let mut second = set(vec![noul("urgent-again")]);
        second.state = "t".into();
        c.read_sets(vec![
            set(vec![
                noul("urgent"),
                q("sure", wit::QuestionKind::Score(vec!["one".into()])),
                other,
            ]),
            second,
        ])
        .await
        .unwrap();
        let reads = log.lock().unwrap().clone();
        let mut named: Vec<Vec<&str>> = reads
            .iter()
            .map(|r| r.question_ids.iter().map(|i| i.as_str()).collect())
            .collect();
        named.sort();
        // The one-level score needed no read.
        assert_eq!(named, [vec!["urgent", "spam"], vec!["urgent-again"]]);
    }
}

#[tokio::test]
async fn without_a_reader_reads_are_unavailable() {
    let mut c = ReadCapability::new(None, Limits::default());
    let out = c.read_sets(vec![set(vec![noul("a")])]).await.unwrap();
    assert_eq!(
        out[0].as_ref().unwrap_err().kind,
        wit::ReadErrorKind::Unavailable
    );
}
