//! SentencePiece tokenisation of a GGUF vocabulary (`tokenizer.ggml.model` = `llama`), as
//! llama.cpp's `llm_tokenizer_spm` does it.
//!
//! The text is split into UTF-8 characters; every adjacent pair whose concatenation is a token
//! is a candidate merge, scored by that token's score; the best candidate (ties: the leftmost)
//! is merged and its new neighbours become candidates, until none is left. A final piece that is
//! a token is that token; one that is not (a character outside the vocabulary) becomes its bytes'
//! `<0xNN>` tokens. This is SentencePiece's own BPE encoding, which Hugging Face's converted
//! `tokenizer.json` files approximate with merges ordered by score; it is implemented here rather
//! than built as a `tokenizers` BPE so the ids are llama.cpp's by construction.
//!
//! The caller escapes spaces as `▁` and adds the space prefix (see [`super::gguf`]).

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

#[derive(Debug, Clone, Copy)]
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// The heap's top is the highest score, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// What the SPM merge needs of a vocabulary.
#[derive(Debug, Clone)]
pub(super) struct SpmModel {
    by_text: HashMap<String, u32>,
    scores: Vec<f32>,
    /// Byte → its `<0xNN>` token (or, failing that, the token whose text is that one byte,
    /// as llama.cpp falls back to).
    bytes: Box<[Option<u32>; 256]>,
    /// Used for a byte with no token at all.
    unk: Option<u32>,
}

impl SpmModel {
    pub fn new(by_text: HashMap<String, u32>, scores: Vec<f32>, unk: Option<u32>) -> SpmModel {
        let mut bytes = Box::new([None; 256]);
        for (b, slot) in bytes.iter_mut().enumerate() {
            *slot = by_text.get(&format!("<0x{b:02X}>")).copied().or_else(|| {
                let c = b as u8;
                c.is_ascii()
                    .then(|| by_text.get(&(c as char).to_string()).copied())
                    .flatten()
            });
        }
        SpmModel {
            by_text,
            scores,
            bytes,
            unk,
        }
    }

    fn score(&self, id: u32) -> f32 {
        self.scores.get(id as usize).copied().unwrap_or(0.0)
    }

    /// Appends the ids of `text` (spaces already escaped) to `out`.
    pub fn encode(&self, text: &str, out: &mut Vec<u32>) -> Result<(), String> {
        let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
        for (i, (start, c)) in text.char_indices().enumerate() {
            symbols.push(Symbol {
                start,
                len: c.len_utf8(),
                prev: i.checked_sub(1),
                next: None,
            });
            if i > 0 {
                symbols[i - 1].next = Some(i);
            }
        }
        if symbols.is_empty() {
            return Ok(());
        }
        let mut queue = BinaryHeap::new();
        for i in 1..symbols.len() {
            self.try_bigram(text, &symbols, i - 1, i, &mut queue);
        }
        while let Some(bigram) = queue.pop() {
            let (left, right) = (symbols[bigram.left], symbols[bigram.right]);
            // Stale: one side was merged away, or grew, since the pair was queued.
            if left.len == 0 || right.len == 0 || left.len + right.len != bigram.size {
                continue;
            }
            symbols[bigram.left].len += right.len;
            symbols[bigram.right].len = 0;
            symbols[bigram.left].next = right.next;
            if let Some(next) = right.next {
                symbols[next].prev = Some(bigram.left);
            }
            if let Some(prev) = left.prev {
                self.try_bigram(text, &symbols, prev, bigram.left, &mut queue);
            }
            if let Some(next) = right.next {
                self.try_bigram(text, &symbols, bigram.left, next, &mut queue);
            }
        }
        let mut at = Some(0);
        while let Some(i) = at {
            let s = symbols[i];
            let piece = &text[s.start..s.start + s.len];
            match self.by_text.get(piece) {
                Some(&id) => out.push(id),
                None => {
                    for &b in piece.as_bytes() {
                        match self.bytes[b as usize].or(self.unk) {
                            Some(id) => out.push(id),
                            None => {
                                return Err(format!(
                                    "the vocabulary has no token for byte 0x{b:02X} (of {piece:?}) \
                                     and no unknown token"
                                ))
                            }
                        }
                    }
                }
            }
            at = s.next;
        }
        Ok(())
    }

    fn try_bigram(
        &self,
        text: &str,
        symbols: &[Symbol],
        left: usize,
        right: usize,
        queue: &mut BinaryHeap<Bigram>,
    ) {
        let (l, r) = (symbols[left], symbols[right]);
        let merged = &text[l.start..r.start + r.len];
        if let Some(&id) = self.by_text.get(merged) {
            queue.push(Bigram {
                score: self.score(id),
                left,
                right,
                size: merged.len(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(tokens: &[(&str, f32)]) -> SpmModel {
        let mut by_text = HashMap::new();
        let mut scores = Vec::new();
        for (i, (t, s)) in tokens.iter().enumerate() {
            by_text.insert(t.to_string(), i as u32);
            scores.push(*s);
        }
        SpmModel::new(by_text, scores, Some(0))
    }

    fn encode(m: &SpmModel, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        m.encode(text, &mut out).expect("encodes");
        out
    }

    #[test]
    fn merges_by_score_not_by_position() {
        let m = model(&[
            ("<unk>", 0.0),
            ("a", -1.0),
            ("b", -1.0),
            ("c", -1.0),
            ("ab", -5.0),
            ("bc", -2.0),
            ("abc", -3.0),
        ]);
        // "bc" scores higher than "ab", so a + bc; then "abc" is a token: one piece.
        assert_eq!(encode(&m, "abc"), vec![6]);
        // "ab" + "c" would also make "abc", but "bc" merges first either way; "abcb": bc then
        // abc, leaving b.
        assert_eq!(encode(&m, "abcb"), vec![6, 2]);
    }

    #[test]
    fn ties_merge_leftmost_first() {
        let m = model(&[("<unk>", 0.0), ("a", -1.0), ("aa", -1.0)]);
        assert_eq!(encode(&m, "aaa"), vec![2, 1]);
    }

    #[test]
    fn unknown_characters_fall_back_to_bytes() {
        let mut tokens: Vec<(String, f32)> = vec![("<unk>".into(), 0.0), ("▁".into(), -1.0)];
        for b in 0..=255u8 {
            tokens.push((format!("<0x{b:02X}>"), 0.0));
        }
        let refs: Vec<(&str, f32)> = tokens.iter().map(|(t, s)| (t.as_str(), *s)).collect();
        let m = model(&refs);
        // é is C3 A9: ids 2 + 0xC3 and 2 + 0xA9.
        assert_eq!(encode(&m, "▁é"), vec![1, 2 + 0xC3, 2 + 0xA9]);
        let no_bytes = SpmModel::new(HashMap::new(), Vec::new(), None);
        assert!(no_bytes.encode("x", &mut Vec::new()).is_err());
    }
}
