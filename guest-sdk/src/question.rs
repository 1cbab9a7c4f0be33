//! Question builders: `noul("…")`, `choice("…", [("billing", "…"), …])`, `score("…", […])`.
//!
//! A question's `id` is the policy's own name for it (used to look its answer up). When a policy
//! gives none, the question is named by its position in its set ("0", "1", …).

/// Criteria of a yes/no question.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NoulCriteria {
    pub yes: Option<String>,
    pub no: Option<String>,
}

/// One option of a choice question.
#[derive(Debug, Clone, PartialEq)]
pub struct ChoiceOption {
    pub name: String,
    pub description: Option<String>,
}

impl From<&str> for ChoiceOption {
    fn from(name: &str) -> Self {
        ChoiceOption {
            name: name.to_string(),
            description: None,
        }
    }
}

impl From<String> for ChoiceOption {
    fn from(name: String) -> Self {
        ChoiceOption {
            name,
            description: None,
        }
    }
}

impl From<(&str, &str)> for ChoiceOption {
    fn from((name, description): (&str, &str)) -> Self {
        ChoiceOption {
            name: name.to_string(),
            description: Some(description.to_string()),
        }
    }
}

/// What kind of answer a question wants.
#[derive(Debug, Clone, PartialEq)]
pub enum QuestionKind {
    /// Yes/no; distribution `[p_yes, p_no]`.
    Noul(NoulCriteria),
    /// Named options; distribution in option order.
    Choice(Vec<ChoiceOption>),
    /// Ordered levels; distribution in level order.
    Score(Vec<String>),
}

/// A typed question.
#[derive(Debug, Clone, PartialEq)]
pub struct Question {
    pub id: Option<String>,
    pub instructions: String,
    pub kind: QuestionKind,
}

/// A yes/no question.
pub fn noul(instructions: impl Into<String>) -> Question {
    Question {
        id: None,
        instructions: instructions.into(),
        kind: QuestionKind::Noul(NoulCriteria::default()),
    }
}

/// A choice between named options: `choice("Which team?", [("billing", "invoices"), …])` or
/// `choice("Which team?", ["billing", "technical"])`.
pub fn choice<O: Into<ChoiceOption>>(
    instructions: impl Into<String>,
    options: impl IntoIterator<Item = O>,
) -> Question {
    Question {
        id: None,
        instructions: instructions.into(),
        kind: QuestionKind::Choice(options.into_iter().map(Into::into).collect()),
    }
}

/// A score over ordered levels: `score("How urgent?", ["low", "mid", "high"])`.
pub fn score<L: Into<String>>(
    instructions: impl Into<String>,
    levels: impl IntoIterator<Item = L>,
) -> Question {
    Question {
        id: None,
        instructions: instructions.into(),
        kind: QuestionKind::Score(levels.into_iter().map(Into::into).collect()),
    }
}

impl Question {
    /// Names the question; its answer is looked up by this id.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// For a noul: what makes the answer "yes". Ignored by other kinds.
    pub fn yes(mut self, criterion: impl Into<String>) -> Self {
        if let QuestionKind::Noul(c) = &mut self.kind {
            c.yes = Some(criterion.into());
        }
        self
    }

    /// For a noul: what makes the answer "no". Ignored by other kinds.
    pub fn no(mut self, criterion: impl Into<String>) -> Self {
        if let QuestionKind::Noul(c) = &mut self.kind {
            c.no = Some(criterion.into());
        }
        self
    }
}

/// One read: a state and the questions about it.
#[derive(Debug, Clone, PartialEq)]
pub struct QuestionSet {
    pub state: String,
    pub questions: Vec<Question>,
}

impl QuestionSet {
    /// A set about `state` (text; use [`crate::state_json`] for structured data).
    pub fn new(state: impl Into<String>) -> Self {
        QuestionSet {
            state: state.into(),
            questions: Vec::new(),
        }
    }

    /// Adds a question.
    pub fn ask(mut self, question: Question) -> Self {
        self.questions.push(question);
        self
    }

    /// The ids the host sees: the policy's own, or the position in the set.
    pub fn resolved_ids(&self) -> Vec<String> {
        self.questions
            .iter()
            .enumerate()
            .map(|(i, q)| q.id.clone().unwrap_or_else(|| i.to_string()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builders_make_the_three_kinds() {
        let q = noul("Is VAT charged?")
            .id("vat")
            .yes("a VAT line")
            .no("no VAT line");
        assert_eq!(q.id.as_deref(), Some("vat"));
        assert_eq!(
            q.kind,
            QuestionKind::Noul(NoulCriteria {
                yes: Some("a VAT line".into()),
                no: Some("no VAT line".into())
            })
        );
        let c = choice("Team?", [("billing", "money"), ("technical", "bugs")]);
        match &c.kind {
            QuestionKind::Choice(o) => {
                assert_eq!(o[1].name, "technical");
                assert_eq!(o[0].description.as_deref(), Some("money"));
            }
            other => panic!("{other:?}"),
        }
        let c = choice("Team?", ["a", "b"]);
        assert!(matches!(&c.kind, QuestionKind::Choice(o) if o[0].description.is_none()));
        let s = score("Urgency?", ["low", "mid", "high"]);
        assert!(matches!(&s.kind, QuestionKind::Score(l) if l.len() == 3));
        // Criteria make no sense for a score: ignored rather than silently changing its kind.
        assert_eq!(s.clone().yes("x"), s);
    }

    #[test]
    fn unnamed_questions_are_named_by_position() {
        let set = QuestionSet::new("s")
            .ask(noul("a"))
            .ask(noul("b").id("named"))
            .ask(noul("c"));
        assert_eq!(set.resolved_ids(), vec!["0", "named", "2"]);
    }
}
