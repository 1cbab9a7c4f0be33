//! The text of a read: the system prompt that lists the questions, and the answer text the canvas
//! is seeded with. Byte for byte the reference's (oMLX's port of djev), because the decision
//! checkpoints were trained and calibrated on exactly this format.

/// The first line of every system prompt.
pub const SYSTEM_PREAMBLE: &str = "Answer a fixed set of questions about the state the user \
provides. Each question lists its allowed answers; reply with exactly one label per question.\n";

/// The empty thought block every canvas opens with. The chat template already ends the prompt
/// with it; the reference repeats it at the head of the canvas and the checkpoints were
/// calibrated that way, so it stays (see docs/read.md).
pub const EMPTY_THOUGHT: &str = "<|channel>thought\n<channel|>";

/// The token that closes the model's turn on the canvas.
pub const TURN_CLOSE: &str = "<turn|>";

/// Up to this many read questions use [`AnswerFormat::Lines`]; longer lists use `Indexed`.
pub const LINES_MAX_QUESTIONS: usize = 10;

/// How the answer template lays out the labels. Chosen once per request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerFormat {
    /// `q1: A\nq2: yes` — one line per question.
    Lines,
    /// `q1A q2yes` — fewer tokens per question, so long lists need fewer reads.
    Indexed,
}

impl AnswerFormat {
    pub fn for_question_count(count: usize) -> Self {
        if count <= LINES_MAX_QUESTIONS {
            AnswerFormat::Lines
        } else {
            AnswerFormat::Indexed
        }
    }

    fn join(self) -> &'static str {
        match self {
            AnswerFormat::Lines => "\n",
            AnswerFormat::Indexed => " ",
        }
    }

    fn lead(self, id: &str) -> String {
        match self {
            AnswerFormat::Lines => format!("{id}: "),
            AnswerFormat::Indexed => id.to_string(),
        }
    }

    fn instruction(self) -> &'static str {
        match self {
            AnswerFormat::Lines => {
                "Reply with one line per question, in this order, formatted as \"id: label\"."
            }
            AnswerFormat::Indexed => {
                "Reply on one line with each question's id immediately followed by its label, \
separated by single spaces."
            }
        }
    }
}

/// What kind of question a prompt line block is for; decides how option lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineStyle {
    Noul,
    Choice,
    Score,
}

/// A question as the prompt presents it.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptQuestion {
    /// Internal id, `q1…` in request order over the questions that need a read.
    pub id: String,
    /// Stripped instructions text.
    pub instructions: String,
    pub style: LineStyle,
    /// The single-token labels, in option order.
    pub labels: Vec<String>,
    /// `(name, description)` per label: for a choice the option name and its description, for a
    /// score the level text as the description, for a noul `("yes"|"no", criterion)`.
    pub options: Vec<(String, String)>,
}

/// The system prompt of one read: the preamble, only this read's questions, and the format
/// instruction.
pub fn system_text(questions: &[&PromptQuestion], format: AnswerFormat) -> String {
    let mut text = String::from(SYSTEM_PREAMBLE);
    for q in questions {
        text.push_str(&format!("\nQuestion {}: {}\n", q.id, q.instructions));
        for ((name, description), label) in q.options.iter().zip(&q.labels) {
            let line = match q.style {
                LineStyle::Choice if description.is_empty() => format!("  {label}: {name}\n"),
                LineStyle::Choice => format!("  {label}: {name} ({description})\n"),
                LineStyle::Score => format!("  {label}: {description}\n"),
                LineStyle::Noul if description.is_empty() => format!("  {label}\n"),
                LineStyle::Noul => format!("  {label}: {description}\n"),
            };
            text.push_str(&line);
        }
    }
    text.push('\n');
    text.push_str(format.instruction());
    text
}

/// The answer text with label `choices[i]` for question `i` (indices into each question's
/// labels).
pub fn answer_text(
    questions: &[&PromptQuestion],
    choices: &[usize],
    format: AnswerFormat,
) -> String {
    questions
        .iter()
        .zip(choices)
        .map(|(q, &label)| format!("{}{}", format.lead(&q.id), q.labels[label]))
        .collect::<Vec<_>>()
        .join(format.join())
}

/// Python's `str.strip()` with no argument (the reference strips every text it renders). The same
/// rule as Jinja's `| trim` in the chat template, so it is defined once, in the tokenizer.
pub use crate::tokenizer::jinja_trim as python_strip;

/// Score labels: `1`…`9` for up to nine levels, else letters from `A`; answers index from 0.
pub fn score_labels(levels: usize) -> Vec<String> {
    if levels <= 9 {
        (1..=levels).map(|l| l.to_string()).collect()
    } else {
        (0..levels)
            .map(|l| char::from(b'A' + l as u8).to_string())
            .collect()
    }
}

/// Choice label candidates in the reference's order: `A`…`Z`, `a`…`z`, then `AA`…`ZZ`. The
/// planner keeps those that stay one distinct token after `"q1: "`.
pub fn choice_label_candidates() -> Vec<String> {
    let upper: Vec<char> = ('A'..='Z').collect();
    let mut out: Vec<String> = upper.iter().map(|c| c.to_string()).collect();
    out.extend(('a'..='z').map(|c| c.to_string()));
    for a in &upper {
        for b in &upper {
            out.push(format!("{a}{b}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quickstart() -> Vec<PromptQuestion> {
        vec![
            PromptQuestion {
                id: "q1".into(),
                instructions: "Which team should handle this".into(),
                style: LineStyle::Choice,
                labels: vec!["A".into(), "B".into(), "C".into()],
                options: vec![
                    ("billing".into(), "Payment or subscription issues".into()),
                    (
                        "technical".into(),
                        "Bugs, errors, or product not working".into(),
                    ),
                    ("sales".into(), String::new()),
                ],
            },
            PromptQuestion {
                id: "q2".into(),
                instructions: "How frustrated the customer appears".into(),
                style: LineStyle::Score,
                labels: score_labels(3),
                options: vec![
                    ("0".into(), "Calm, just stating facts".into()),
                    ("1".into(), "Mildly annoyed".into()),
                    ("2".into(), "Very frustrated or angry".into()),
                ],
            },
            PromptQuestion {
                id: "q3".into(),
                instructions: "The message conveys urgency or time-sensitivity".into(),
                style: LineStyle::Noul,
                labels: vec!["yes".into(), "no".into()],
                options: vec![
                    ("yes".into(), String::new()),
                    ("no".into(), "Not urgent".into()),
                ],
            },
        ]
    }

    #[test]
    fn system_text_is_byte_for_byte_the_reference_format() {
        let qs = quickstart();
        let refs: Vec<&PromptQuestion> = qs.iter().collect();
        let text = system_text(&refs, AnswerFormat::Lines);
        let expected = concat!(
            "Answer a fixed set of questions about the state the user provides. Each question ",
            "lists its allowed answers; reply with exactly one label per question.\n",
            "\nQuestion q1: Which team should handle this\n",
            "  A: billing (Payment or subscription issues)\n",
            "  B: technical (Bugs, errors, or product not working)\n",
            "  C: sales\n",
            "\nQuestion q2: How frustrated the customer appears\n",
            "  1: Calm, just stating facts\n",
            "  2: Mildly annoyed\n",
            "  3: Very frustrated or angry\n",
            "\nQuestion q3: The message conveys urgency or time-sensitivity\n",
            "  yes\n",
            "  no: Not urgent\n",
            "\nReply with one line per question, in this order, formatted as \"id: label\"."
        );
        assert_eq!(text, expected);
    }

    #[test]
    fn answer_text_in_both_formats() {
        let qs = quickstart();
        let refs: Vec<&PromptQuestion> = qs.iter().collect();
        assert_eq!(
            answer_text(&refs, &[0, 0, 0], AnswerFormat::Lines),
            "q1: A\nq2: 1\nq3: yes"
        );
        assert_eq!(
            answer_text(&refs, &[2, 1, 1], AnswerFormat::Indexed),
            "q1C q22 q3no"
        );
        assert!(system_text(&refs, AnswerFormat::Indexed).ends_with(
            "\nReply on one line with each question's id immediately followed by its label, separated by single spaces."
        ));
    }

    #[test]
    fn labels_follow_the_reference_pools() {
        assert_eq!(score_labels(3), ["1", "2", "3"]);
        assert_eq!(score_labels(9).last().map(String::as_str), Some("9"));
        assert_eq!(
            score_labels(10),
            ["A", "B", "C", "D", "E", "F", "G", "H", "I", "J"]
        );
        let c = choice_label_candidates();
        assert_eq!(c.len(), 26 + 26 + 676);
        assert_eq!(
            (
                c[0].as_str(),
                c[26].as_str(),
                c[52].as_str(),
                c[53].as_str()
            ),
            ("A", "a", "AA", "AB")
        );
    }

    #[test]
    fn strip_matches_python() {
        assert_eq!(python_strip("  hi\n\t"), "hi");
        assert_eq!(python_strip("\u{1c}x\u{1f}\u{a0}"), "x");
        assert_eq!(python_strip("\u{200b}x"), "\u{200b}x"); // zero-width space is not isspace()
    }
}
