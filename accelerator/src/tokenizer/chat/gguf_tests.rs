use super::*;

/// GPT-2's byte alphabet, in byte order.
fn byte_chars() -> Vec<String> {
    (0u8..=255)
        .map(|b| {
            let printable = (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
            if printable {
                char::from(b).to_string()
            } else {
                let index = (0u8..b)
                    .filter(|&c| {
                        !((0x21..=0x7e).contains(&c) || (0xa1..=0xac).contains(&c) || c >= 0xae)
                    })
                    .count() as u32;
                char::from_u32(0x100 + index)
                    .map(String::from)
                    .unwrap_or_default()
            }
        })
        .collect()
}

/// A byte-level BPE: three control tokens, the 256 byte characters, then merged tokens.
fn bpe_vocab() -> (Vec<String>, Vec<i32>, Vec<&'static str>) {
    let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        .map(String::from)
        .to_vec();
    let mut types = vec![3, 3, 3];
    tokens.extend(byte_chars());
    types.extend(std::iter::repeat_n(1, 256));
    for t in [
        "he", "ll", "llo", "hello", "Ġhello", "12", "Ġw", "or", "ld", "orld", "Ġworld",
    ] {
        tokens.push(t.into());
        types.push(1);
    }
    let merges = vec![
        "h e", "l l", "ll o", "he llo", "Ġ hello", "1 2", "Ġ w", "o r", "l d", "or ld", "Ġw orld",
    ];
    (tokens, types, merges)
}

fn bpe(pre: &str) -> GgufTokenizer {
    let (tokens, types, merges) = bpe_vocab();
    GgufTokenizer::new(
        Path::new("t.gguf"),
        &GgufVocab {
            model: "gpt2",
            pre: Some(pre),
            tokens: tokens.iter().map(String::as_str).collect(),
            types: Some(types),
            scores: None,
            merges: Some(merges),
            add_space_prefix: None,
            unk: None,
        },
    )
    .expect("builds")
}

fn id(t: &GgufTokenizer, text: &str) -> u32 {
    t.token_to_id(text).expect("in vocabulary")
}

#[test]
fn byte_alphabet_round_trips() {
    for (b, c) in byte_chars().iter().enumerate() {
        let mut chars = c.chars();
        let ch = chars.next().expect("one char");
        assert_eq!(byte_of_char(ch), Some(b as u8), "{c:?}");
    }
    assert_eq!(byte_of_char('Ġ'), Some(b' '));
    assert_eq!(byte_of_char('Ċ'), Some(b'\n'));
    assert_eq!(byte_of_char('\u{3000}'), None);
}

#[test]
fn bpe_merges_between_specials() {
    let t = bpe("gpt-2");
    let (ids, last) = t
        .encode("<|im_start|>hello world<|im_end|>12")
        .expect("encodes");
    assert_eq!(
        ids,
        vec![1, id(&t, "hello"), id(&t, "Ġworld"), 2, id(&t, "12")]
    );
    assert_eq!(last, Some("<|im_start|>hello world<|im_end|>".len()));
    assert_eq!(t.last_special_end("a<|im_end|>b"), Some(11));
    assert_eq!(t.last_special_end("plain"), None);
    assert_eq!(
        t.decode(&ids).expect("decodes"),
        "<|im_start|>hello world<|im_end|>12"
    );
}

#[test]
fn smollm_splits_digits_gpt2_does_not() {
    let digits = bpe("smollm");
    let ids = digits.encode("12").expect("encodes").0;
    assert_eq!(ids, vec![id(&digits, "1"), id(&digits, "2")]);
    let gpt2 = bpe("gpt-2");
    assert_eq!(gpt2.encode("12").expect("encodes").0, vec![id(&gpt2, "12")]);
    // Bytes outside the merges stay bytes, and decode back to the text.
    let text = "é 🤖\n\t x";
    let ids = gpt2.encode(text).expect("encodes").0;
    assert_eq!(gpt2.decode(&ids).expect("decodes"), text);
}

#[test]
fn unknown_pre_is_refused_by_name() {
    let (tokens, types, merges) = bpe_vocab();
    let e = GgufTokenizer::new(
        Path::new("m.gguf"),
        &GgufVocab {
            model: "gpt2",
            pre: Some("brand-new"),
            tokens: tokens.iter().map(String::as_str).collect(),
            types: Some(types),
            scores: None,
            merges: Some(merges),
            add_space_prefix: None,
            unk: None,
        },
    )
    .err()
    .expect("refused");
    let message = e.to_string();
    assert!(
        message.contains("\"brand-new\"")
            && message.contains("smollm")
            && message.contains("m.gguf"),
        "{message}"
    );
}

#[test]
fn broken_vocabularies_name_the_key() {
    let base = |model: &'static str| GgufVocab {
        model,
        pre: Some("gpt-2"),
        tokens: vec!["a", "b", "ab"],
        types: None,
        scores: None,
        merges: Some(vec!["a b"]),
        add_space_prefix: None,
        unk: None,
    };
    let message = |v: GgufVocab<'_>| {
        GgufTokenizer::new(Path::new("m.gguf"), &v)
            .err()
            .expect("refused")
            .to_string()
    };
    let mut dup = base("gpt2");
    dup.tokens = vec!["a", "b", "a"];
    assert!(message(dup).contains("tokenizer.ggml.tokens"));
    let mut short = base("gpt2");
    short.types = Some(vec![1]);
    assert!(message(short).contains("tokenizer.ggml.token_type"));
    let mut no_merges = base("gpt2");
    no_merges.merges = None;
    assert!(message(no_merges).contains("tokenizer.ggml.merges"));
    let mut bad_merge = base("gpt2");
    bad_merge.merges = Some(vec!["ab"]);
    assert!(message(bad_merge).contains("merge 0"));
    assert!(message(base("bert")).contains("\"bert\""));
}

/// A SentencePiece vocabulary in llama.cpp's layout.
fn spm(add_space_prefix: Option<bool>) -> GgufTokenizer {
    let mut tokens: Vec<String> = ["<unk>", "<s>", "</s>", "<start_of_turn>", "<note>"]
        .map(String::from)
        .to_vec();
    let mut types = vec![2, 3, 3, 3, 4];
    let mut scores = vec![0.0; 5];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    for (t, s) in [
        ("▁", -1.0),
        ("a", -2.0),
        ("b", -2.0),
        ("▁a", -3.0),
        ("ab", -4.0),
        ("▁ab", -5.0),
        ("▁b", -6.0),
    ] {
        tokens.push(t.into());
        types.push(1);
        scores.push(s);
    }
    GgufTokenizer::new(
        Path::new("s.gguf"),
        &GgufVocab {
            model: "llama",
            pre: None,
            tokens: tokens.iter().map(String::as_str).collect(),
            types: Some(types),
            scores: Some(scores),
            merges: None,
            add_space_prefix,
            unk: Some(0),
        },
    )
    .expect("builds")
}

#[test]
fn spm_space_prefix_at_start_and_after_specials() {
    let t = spm(None);
    let ids = t.encode("ab b<start_of_turn>ab").expect("encodes").0;
    // " ab b" → ▁ab ▁b; after the special another ▁ prefix: ▁ab.
    assert_eq!(ids, vec![id(&t, "▁ab"), id(&t, "▁b"), 3, id(&t, "▁ab")]);
    // llama.cpp's detokenize drops the first token's prefix space only.
    assert_eq!(t.decode(&ids).expect("decodes"), "ab b<start_of_turn> ab");
    // User-defined tokens are special in text too.
    assert_eq!(t.encode("<note>").expect("encodes").0, vec![4]);
}

#[test]
fn spm_without_space_prefix_and_with_bytes() {
    let t = spm(Some(false));
    let ids = t.encode("ab é").expect("encodes").0;
    assert_eq!(
        ids,
        vec![
            id(&t, "ab"),
            id(&t, "▁"),
            id(&t, "<0xC3>"),
            id(&t, "<0xA9>")
        ]
    );
    assert_eq!(t.decode(&ids).expect("decodes"), "ab é");
    assert!(t.decode(&[9999]).is_err());
}
