//! A GGUF vocabulary's token kinds and the split of text at special tokens, as llama.cpp's
//! `tokenizer_st_partition` does it before tokenising the stretches between them.
//!
//! llama.cpp treats every control, user-defined and unknown token as special: with
//! `parse_special`, each occurrence of one in the text becomes that token, and the text between
//! them is tokenised fragment by fragment. It takes the special tokens longest first and splits
//! every remaining text fragment at each (non-overlapping, leftmost-first) occurrence of the
//! current one. [`Specials::partition`] gives the same split without rescanning the text once
//! per special token (Gemma's vocabularies have thousands): it finds every occurrence with a
//! trie, then accepts them in llama.cpp's order, an occurrence only where its bytes are still
//! unclaimed text. Among specials of equal length llama.cpp's order is its sort's (unspecified);
//! here it is by id, which matters only for two equally long specials that overlap in the text.

use std::collections::HashMap;
use std::ops::Range;

/// `tokenizer.ggml.token_type`, llama.cpp's `llama_token_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TokenKind {
    Undefined,
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl TokenKind {
    pub fn from_gguf(t: i32) -> TokenKind {
        match t {
            1 => TokenKind::Normal,
            2 => TokenKind::Unknown,
            3 => TokenKind::Control,
            4 => TokenKind::UserDefined,
            5 => TokenKind::Unused,
            6 => TokenKind::Byte,
            _ => TokenKind::Undefined,
        }
    }

    /// Matched in text before tokenising (llama.cpp's special-token cache).
    pub fn is_special(self) -> bool {
        matches!(
            self,
            TokenKind::Control | TokenKind::UserDefined | TokenKind::Unknown
        )
    }
}

/// Token texts llama.cpp makes control tokens whatever the file says (its end-of-generation,
/// end-of-turn and fill-in-the-middle detection by text), so they are special in text too.
pub(super) const FORCED_CONTROL: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "<|fim_prefix|>",
    "<|fim_suffix|>",
    "<|fim_middle|>",
    "<|fim_pad|>",
    "<|fim_repo|>",
    "<|repo_name|>",
    "<|file_sep|>",
];

/// One piece of partitioned text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Fragment {
    /// Text to tokenise, as a byte range of the input.
    Text(Range<usize>),
    /// A special token and where its text was.
    Special(u32, Range<usize>),
}

#[derive(Debug, Default, Clone)]
struct Node {
    /// Sorted by byte.
    children: Vec<(u8, u32)>,
    token: Option<u32>,
}

/// The special tokens of a vocabulary, in a trie over their texts.
#[derive(Debug, Clone)]
pub(super) struct Specials {
    nodes: Vec<Node>,
    /// Root children by first byte (the root has many; deeper nodes few).
    root: Box<[u32; 256]>,
    /// Token id → its rank in llama.cpp's order (longer first, then by id).
    rank: HashMap<u32, usize>,
    /// Token id → text length in bytes.
    len: HashMap<u32, usize>,
}

impl Specials {
    /// `specials`: (id, text) of every special token; empty texts are skipped.
    pub fn new<'a>(specials: impl IntoIterator<Item = (u32, &'a str)>) -> Specials {
        let mut nodes = vec![Node::default()];
        let mut list: Vec<(u32, usize)> = Vec::new();
        for (id, text) in specials {
            if text.is_empty() {
                continue;
            }
            let mut at = 0usize;
            for &b in text.as_bytes() {
                at = match nodes[at].children.binary_search_by_key(&b, |c| c.0) {
                    Ok(i) => nodes[at].children[i].1 as usize,
                    Err(i) => {
                        let next = nodes.len();
                        nodes.push(Node::default());
                        nodes[at].children.insert(i, (b, next as u32));
                        next
                    }
                };
            }
            if nodes[at].token.is_none() {
                nodes[at].token = Some(id);
                list.push((id, text.len()));
            }
        }
        let mut root = Box::new([0u32; 256]);
        for &(b, child) in &nodes[0].children {
            root[b as usize] = child;
        }
        list.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let rank = list
            .iter()
            .enumerate()
            .map(|(r, &(id, _))| (id, r))
            .collect();
        let len = list.into_iter().collect();
        Specials {
            nodes,
            root,
            rank,
            len,
        }
    }

    /// Every occurrence of every special token in `text`: (rank, start, id).
    fn occurrences(&self, text: &str) -> Vec<(usize, usize, u32)> {
        let bytes = text.as_bytes();
        let mut found = Vec::new();
        for (start, &first) in bytes.iter().enumerate() {
            let mut at = self.root[first as usize] as usize;
            let mut pos = start + 1;
            while at != 0 {
                if let Some(id) = self.nodes[at].token {
                    found.push((self.rank[&id], start, id));
                }
                let Some(&b) = bytes.get(pos) else { break };
                at = match self.nodes[at].children.binary_search_by_key(&b, |c| c.0) {
                    Ok(i) => self.nodes[at].children[i].1 as usize,
                    Err(_) => 0,
                };
                pos += 1;
            }
        }
        found
    }

    /// `text` split into text fragments and special tokens, in order.
    pub fn partition(&self, text: &str) -> Vec<Fragment> {
        if text.is_empty() {
            return Vec::new();
        }
        let mut occurrences = self.occurrences(text);
        if occurrences.is_empty() {
            return vec![Fragment::Text(0..text.len())];
        }
        occurrences.sort_unstable();
        let mut claimed = vec![false; text.len()];
        let mut accepted: Vec<(usize, u32)> = Vec::new();
        for (_, start, id) in occurrences {
            let end = start + self.len[&id];
            if claimed[start..end].iter().any(|&c| c) {
                continue;
            }
            claimed[start..end].iter_mut().for_each(|c| *c = true);
            accepted.push((start, id));
        }
        accepted.sort_unstable();
        let mut out = Vec::with_capacity(2 * accepted.len() + 1);
        let mut at = 0;
        for (start, id) in accepted {
            if start > at {
                out.push(Fragment::Text(at..start));
            }
            let end = start + self.len[&id];
            out.push(Fragment::Special(id, start..end));
            at = end;
        }
        if at < text.len() {
            out.push(Fragment::Text(at..text.len()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Fragment::{Special, Text};

    #[test]
    fn splits_at_every_special() {
        let s = Specials::new([(1, "<|im_start|>"), (2, "<|im_end|>"), (3, "<s>")]);
        let text = "<|im_start|>user\nhi<|im_end|><s><s>x";
        assert_eq!(
            s.partition(text),
            vec![
                Special(1, 0..12),
                Text(12..19),
                Special(2, 19..29),
                Special(3, 29..32),
                Special(3, 32..35),
                Text(35..36),
            ]
        );
        assert_eq!(s.partition("plain"), vec![Text(0..5)]);
        assert_eq!(s.partition(""), vec![]);
    }

    #[test]
    fn longer_specials_win_wherever_they_are() {
        // llama.cpp takes "abc" before "ab" and "bcd": in "abcd", "abc" is matched although
        // "ab" starts at the same place and "bcd" ends later.
        let s = Specials::new([(7, "ab"), (8, "abc"), (9, "bcd")]);
        assert_eq!(s.partition("abcd"), vec![Special(8, 0..3), Text(3..4)]);
        // "abbcd" has no "abc": "bcd" is taken next, then "ab" in what is left.
        assert_eq!(
            s.partition("abbcd"),
            vec![Special(7, 0..2), Special(9, 2..5)]
        );
        // Non-overlapping, leftmost first, for one token.
        let aa = Specials::new([(1, "aa")]);
        assert_eq!(aa.partition("aaa"), vec![Special(1, 0..2), Text(2..3)]);
    }

    #[test]
    fn multibyte_texts() {
        let s = Specials::new([(5, "<｜end▁of▁sentence｜>"), (6, "\n\n")]);
        let text = "é\n\n\n<｜end▁of▁sentence｜>ü";
        let parts = s.partition(text);
        assert_eq!(parts[0], Text(0..2));
        assert_eq!(parts[1], Special(6, 2..4));
        assert_eq!(parts[2], Text(4..5));
        assert!(matches!(parts[3], Special(5, _)));
        assert_eq!(parts.last(), Some(&Text(text.len() - 2..text.len())));
    }
}
