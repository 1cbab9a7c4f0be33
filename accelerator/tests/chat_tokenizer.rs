//! Chat tokenizers against their references: ids from llama.cpp or transformers and chat
//! templates rendered by transformers' `apply_chat_template`, written by
//! `tests/data/chat/make_tokenizer_goldens.py` into `tests/data/chat/tokenizer_goldens.json`.
//!
//! The SmolLM2 part needs the real GGUF: `HUNCH_SMOLLM2_GGUF`, or the default model cache that
//! `scripts/setup.sh` fills; without it that test says so and passes.

use hunch_accelerator::checkpoint::gguf::GgufFile;
use hunch_accelerator::read::logits::plan::label_tables;
use hunch_accelerator::read::logits::PromptTokenizer;
use hunch_accelerator::tokenizer::chat::{ChatMessage, ChatTokenizer, ChatTokenizerError};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/chat")
}

fn goldens() -> Value {
    let path = data().join("tokenizer_goldens.json");
    let text = std::fs::read_to_string(&path).expect("goldens");
    serde_json::from_str(&text).expect("goldens parse")
}

fn gguf(path: &Path) -> ChatTokenizer {
    let file = GgufFile::open(path).expect("opens");
    ChatTokenizer::from_gguf(&file).expect("tokenizer loads")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("ids")
        .iter()
        .map(|i| i.as_u64().expect("id") as u32)
        .collect()
}

fn messages(v: &Value) -> Vec<ChatMessage> {
    v.as_array()
        .expect("messages")
        .iter()
        .map(|m| {
            ChatMessage::new(
                m["role"].as_str().expect("role"),
                m["content"].as_str().expect("content"),
            )
        })
        .collect()
}

/// Everything one vocabulary's goldens say.
fn check(name: &str, t: &ChatTokenizer, g: &Value) {
    assert_eq!(
        t.vocab_size() as u64,
        g["vocab_size"].as_u64().expect("size"),
        "{name}"
    );
    let mut wrong = Vec::new();
    for case in g["texts"].as_array().expect("texts") {
        let text = case["text"].as_str().expect("text");
        let got = t.encode(text).expect("encodes");
        if got != ids(&case["ids"]) {
            wrong.push(format!(
                "{text:?}:\n  want {:?}\n  got  {got:?}",
                ids(&case["ids"])
            ));
        }
        let back = t.decode(&got).expect("decodes");
        assert_eq!(back, text, "{name}: decode(encode({text:?}))");
    }
    assert!(
        wrong.is_empty(),
        "{name}: ids differ for\n{}",
        wrong.join("\n")
    );

    for chat in g["chats"].as_array().expect("chats") {
        let rendered = t.render(&messages(&chat["messages"])).expect("renders");
        assert_eq!(
            rendered,
            chat["rendered"].as_str().expect("rendered"),
            "{name}"
        );
        assert_eq!(
            t.encode(&rendered).expect("encodes"),
            ids(&chat["ids"]),
            "{name}"
        );
        // The label read appends a prefill and cuts after the last special token: encoding the
        // two sides apart must give the whole.
        for prefill in ["{\"answer\": \"", "{\"answer\": "] {
            let text = format!("{rendered}{prefill}");
            let cut = t
                .last_special_end(&text)
                .expect("the template writes special tokens");
            let mut parts = t.encode(&text[..cut]).expect("encodes");
            parts.extend(t.encode(&text[cut..]).expect("encodes"));
            assert_eq!(
                parts,
                t.encode(&text).expect("encodes"),
                "{name}: cut at {cut}"
            );
        }
    }

    // The probe shape the read renders: one system and one user message.
    let first = &g["chats"][0];
    let msgs = messages(&first["messages"]);
    assert_eq!(msgs[0].role, "system");
    let rendered = t
        .render_chat(&msgs[0].content, &msgs[1].content)
        .expect("renders");
    assert_eq!(
        rendered,
        first["rendered"].as_str().expect("rendered"),
        "{name}"
    );

    let bos = ids(&g["bos"]);
    assert_eq!(t.bos_for("plain text"), bos.first().copied(), "{name}: BOS");
    if let Some(&bos) = bos.first() {
        let text = t.decode(&[bos]).expect("decodes");
        assert_eq!(
            t.bos_for(&format!("{text}rest")),
            None,
            "{name}: BOS already written"
        );
    }
    label_tables(t).expect("label tables");
}

#[test]
fn tiny_spm_gguf_matches_its_references() {
    let g = goldens();
    let t = gguf(&data().join("tiny-spm/tiny-spm.gguf"));
    check("tiny-spm gguf", &t, &g["tiny_spm_gguf"]);
    assert_eq!(t.eos_id(), t.token_to_id("<eos>"));
    assert_eq!(t.token_to_id("<start_of_turn>"), Some(4));
}

#[test]
fn tiny_spm_folder_matches_transformers() {
    let g = goldens();
    let t = ChatTokenizer::from_dir(&data().join("tiny-spm/hf")).expect("loads");
    check("tiny-spm hf", &t, &g["tiny_spm_hf"]);
    assert_eq!(t.eos_id(), t.token_to_id("<eos>"));
}

#[test]
fn tiny_bpe_ggufs_and_folder_match_their_references() {
    let g = goldens();
    let t = ChatTokenizer::from_dir(&data().join("tiny-bpe/hf")).expect("loads");
    check("tiny-bpe hf", &t, &g["tiny_bpe"]["hf"]);
    for pre in ["qwen2", "llama-bpe"] {
        let t = gguf(&data().join(format!("tiny-bpe/tiny-bpe-{pre}.gguf")));
        check(&format!("tiny-bpe {pre}"), &t, &g["tiny_bpe"][pre]);
    }
}

fn smollm2_path() -> Option<PathBuf> {
    let path = match std::env::var_os("HUNCH_SMOLLM2_GGUF") {
        Some(p) => PathBuf::from(p),
        None => {
            let cache = std::env::var_os("HUNCH_MODELS_CACHE")
                .map(PathBuf::from)
                .or_else(|| {
                    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/hunch/models"))
                })?;
            cache.join("SmolLM2-135M-Instruct.Q4_1.gguf")
        }
    };
    path.is_file().then_some(path)
}

#[test]
fn smollm2_gguf_matches_llama_cpp_and_transformers() {
    let Some(path) = smollm2_path() else {
        eprintln!(
            "skipping: SmolLM2-135M-Instruct.Q4_1.gguf not found (set HUNCH_SMOLLM2_GGUF or run \
             scripts/fetch-default-model.sh)"
        );
        return;
    };
    let g = goldens();
    let t = gguf(&path);
    check("smollm2", &t, &g["smollm2"]);
    assert_eq!(t.token_to_id("<|im_end|>"), Some(2));
    assert_eq!(t.eos_id(), Some(2));
    assert_eq!(t.bos_for("<|im_start|>"), None, "SmolLM2 adds no BOS");
    // Every v1 label and every extra choice label is one token at SmolLM2's answer boundary.
    let limits = label_tables(&t).expect("label tables").limits();
    assert_eq!(
        (limits.max_choice_options, limits.max_score_levels),
        (255, 50)
    );
}

#[test]
fn a_gguf_without_a_tokenizer_is_refused_by_key() {
    let file = GgufFile::open(&data().join("bad/no-tokenizer.gguf")).expect("opens");
    let e = ChatTokenizer::from_gguf(&file).err().expect("refused");
    let message = e.to_string();
    assert!(
        message.contains("no-tokenizer.gguf")
            && message.contains("tokenizer.ggml.model")
            && message.contains("no tokenizer"),
        "{message}"
    );
}

#[test]
fn an_unknown_pre_tokenizer_is_refused_by_name() {
    let file = GgufFile::open(&data().join("bad/unknown-pre.gguf")).expect("opens");
    let e = ChatTokenizer::from_gguf(&file).err().expect("refused");
    assert!(matches!(e, ChatTokenizerError::UnknownPre { .. }), "{e}");
    let message = e.to_string();
    assert!(
        message.contains("\"brand-new-pre\"")
            && message.contains("smollm")
            && message.contains("qwen2")
            && message.contains("unknown-pre.gguf"),
        "{message}"
    );
}

#[test]
fn a_folder_without_tokenizer_json_is_refused() {
    let e = ChatTokenizer::from_dir(&data().join("bad"))
        .err()
        .expect("refused");
    assert!(
        matches!(e, ChatTokenizerError::NoTokenizerJson { .. }),
        "{e}"
    );
    assert!(e.to_string().contains("tokenizer.json"), "{e}");
}

/// A checkpoint without a chat template (a base model's) is refused saying how to give one; a
/// built-in renders as the family's own template does; one whose markers the tokenizer lacks,
/// or a file that is not there, is refused by name.
#[test]
fn a_template_can_be_given_where_the_checkpoint_has_none() {
    let dir = tempfile::tempdir().expect("tempdir");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/causal/tiny-qwen2");
    let folder = dir.path().join("base");
    std::fs::create_dir(&folder).expect("mkdir");
    std::fs::copy(source.join("tokenizer.json"), folder.join("tokenizer.json")).expect("copy");
    let mut config: Value = serde_json::from_str(
        &std::fs::read_to_string(source.join("tokenizer_config.json")).expect("config"),
    )
    .expect("json");
    config
        .as_object_mut()
        .expect("object")
        .remove("chat_template");
    std::fs::write(folder.join("tokenizer_config.json"), config.to_string()).expect("write");

    let bare = ChatTokenizer::from_dir(&folder).expect("loads");
    assert!(!bare.has_template());
    let message = bare.no_template_error().to_string();
    assert!(
        message.contains("chat_template") && message.contains("chatml"),
        "{message}"
    );

    // The tiny models' own template is ChatML: the built-in renders the same text.
    let own = ChatTokenizer::from_dir(&source).expect("own");
    let given = ChatTokenizer::from_dir(&folder)
        .expect("loads")
        .with_template("chatml")
        .expect("chatml");
    let messages = [
        ChatMessage::new("system", "Answer with JSON."),
        ChatMessage::new("user", "Is the door open?"),
    ];
    assert_eq!(
        given.render(&messages).expect("given"),
        own.render(&messages).expect("own")
    );

    let err = ChatTokenizer::from_dir(&folder)
        .expect("loads")
        .with_template("llama3")
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("<|start_header_id|>"), "{err}");
    let err = ChatTokenizer::from_dir(&folder)
        .expect("loads")
        .with_template("/no/such/template.jinja")
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains("/no/such/template.jinja") && err.contains("gemma"),
        "{err}"
    );
}
