use super::*;
use serde_json::json;
use std::path::PathBuf;

const GEMMA_LIKE: &str = "{{ bos_token }}{% for m in messages %}<|turn>{{ m.role }}\n{{ m.content | trim }}<turn|>\n{% endfor %}{% if add_generation_prompt %}<|turn>model\n{% endif %}";
/// Gemma 2's refusal of a system turn.
const NO_SYSTEM: &str = "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for m in messages %}<|turn>{{ m.role }}\n{{ m.content }}<turn|>\n{% endfor %}{{ '<|turn>model\\n' }}";

/// A folder with the tiny Gemma-style tokenizer.json and `config` as tokenizer_config.json.
fn folder(config: Option<serde_json::Value>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let json = crate::tokenizer::tiny::tiny_tokenizer_json(512).expect("tiny tokenizer");
    std::fs::write(dir.path().join("tokenizer.json"), json.to_string()).expect("write");
    if let Some(config) = config {
        std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string())
            .expect("write");
    }
    dir
}

fn write(dir: &tempfile::TempDir, name: &str, text: &str) {
    std::fs::write(dir.path().join(name), text).expect("write");
}

#[test]
fn is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<ChatTokenizer>();
}

#[test]
fn folder_template_tokens_and_bos() {
    let dir = folder(Some(json!({
        "chat_template": [
            {"name": "tool_use", "template": "tools"},
            {"name": "default", "template": GEMMA_LIKE}
        ],
        "bos_token": {"content": "<bos>", "special": true},
        "eos_token": "<eos>",
    })));
    let t = ChatTokenizer::from_dir(dir.path()).expect("loads");
    let rendered = t
        .render(&[ChatMessage::new("user", " Hi \u{1f}")])
        .expect("renders");
    assert_eq!(rendered, "<bos><|turn>user\nHi<turn|>\n<|turn>model\n");
    // The post-processor adds <bos>; the template already wrote it.
    assert_eq!(t.bos_for(&rendered), None);
    assert_eq!(t.bos_for("<|turn>user"), Some(2));
    assert_eq!(t.eos_id(), Some(1));
    assert_eq!(t.token_to_id("<|turn>"), Some(105));
    assert_eq!(t.vocab_size(), 512);
    let ids = t.encode(&rendered).expect("encodes");
    assert_eq!(&ids[..2], &[2, 105]);
    assert_eq!(t.decode(&ids).expect("decodes"), rendered);
}

#[test]
fn jinja_file_wins_and_add_bos_token_false_wins() {
    let dir = folder(Some(json!({
        "chat_template": "from config",
        "bos_token": "<bos>",
        "add_bos_token": false,
    })));
    write(
        &dir,
        "chat_template.json",
        &json!({"chat_template": "from json"}).to_string(),
    );
    let t = ChatTokenizer::from_dir(dir.path()).expect("loads");
    assert_eq!(t.render(&[]).expect("renders"), "from json");
    write(&dir, "chat_template.jinja", "from jinja\n");
    let t = ChatTokenizer::from_dir(dir.path()).expect("loads");
    assert_eq!(t.render(&[]).expect("renders"), "from jinja");
    assert_eq!(t.bos_for("x"), None);
}

#[test]
fn special_tokens_map_overrides_config() {
    let dir = folder(Some(
        json!({"chat_template": "{{ eos_token }}", "eos_token": "<eos>"}),
    ));
    write(
        &dir,
        "special_tokens_map.json",
        &json!({"eos_token": {"content": "<turn|>"}}).to_string(),
    );
    let t = ChatTokenizer::from_dir(dir.path()).expect("loads");
    assert_eq!(t.render(&[]).expect("renders"), "<turn|>");
    assert_eq!(t.eos_id(), Some(106));
}

#[test]
fn system_refusal_folds_the_system_text_into_the_user_message() {
    let dir = folder(Some(
        json!({"chat_template": NO_SYSTEM, "bos_token": "<bos>"}),
    ));
    let t = ChatTokenizer::from_dir(dir.path()).expect("loads");
    let rendered = t.render_system_user("Be brief.", "Why?").expect("renders");
    assert_eq!(
        rendered,
        "<bos><|turn>user\nBe brief.\n\nWhy?<turn|>\n<|turn>model\n"
    );
    let e = t
        .render(&[ChatMessage::new("system", "s")])
        .expect_err("raises");
    assert!(e.to_string().contains("System role not supported"), "{e}");
}

#[test]
fn last_special_end_matches_the_split_encode_makes() {
    let dir = folder(None);
    let t = ChatTokenizer::from_dir(dir.path()).expect("loads");
    let text = "<|turn>user\nhi there<turn|>\n<|turn>model\n{\"answer\": ";
    let cut = t.last_special_end(text).expect("has specials");
    assert_eq!(&text[..cut], "<|turn>user\nhi there<turn|>\n<|turn>");
    let whole = t.encode(text).expect("encodes");
    let mut parts = t.encode(&text[..cut]).expect("encodes");
    parts.extend(t.encode(&text[cut..]).expect("encodes"));
    assert_eq!(parts, whole);
    assert_eq!(t.last_special_end("no specials"), None);
}

#[test]
fn folder_errors_name_what_is_wrong() {
    let missing = ChatTokenizer::from_dir(&PathBuf::from("/nonexistent/model"))
        .err()
        .expect("refused");
    assert!(
        missing.to_string().contains("/nonexistent/model"),
        "{missing}"
    );

    let empty = tempfile::tempdir().expect("tempdir");
    let e = ChatTokenizer::from_dir(empty.path())
        .err()
        .expect("refused");
    assert!(
        matches!(e, ChatTokenizerError::NoTokenizerJson { .. }),
        "{e}"
    );

    let dir = folder(None);
    write(&dir, "tokenizer_config.json", "{ not json");
    let e = ChatTokenizer::from_dir(dir.path()).err().expect("refused");
    assert!(e.to_string().contains("tokenizer_config.json"), "{e}");

    let dir = folder(Some(
        json!({"chat_template": [{"name": "rag", "template": "x"}]}),
    ));
    let e = ChatTokenizer::from_dir(dir.path()).err().expect("refused");
    assert!(e.to_string().contains("\"default\""), "{e}");

    let dir = folder(Some(json!({"chat_template": 7})));
    let e = ChatTokenizer::from_dir(dir.path()).err().expect("refused");
    assert!(e.to_string().contains("chat_template is a number"), "{e}");

    let dir = folder(Some(json!({"add_bos_token": true})));
    let e = ChatTokenizer::from_dir(dir.path()).err().expect("refused");
    assert!(e.to_string().contains("bos_token"), "{e}");

    let dir = folder(Some(json!({"chat_template": "{% if %}"})));
    let e = ChatTokenizer::from_dir(dir.path()).err().expect("refused");
    assert!(matches!(e, ChatTokenizerError::Template { .. }), "{e}");

    write(&dir, "tokenizer.json", "{}");
    let e = ChatTokenizer::from_dir(dir.path()).err().expect("refused");
    assert!(e.to_string().contains("tokenizer.json"), "{e}");
}

#[test]
fn no_template_is_an_error_at_render_only() {
    let dir = folder(None);
    let t = ChatTokenizer::from_dir(dir.path()).expect("loads");
    let e = t.render(&[]).expect_err("no template");
    assert!(matches!(e, ChatTokenizerError::NoTemplate { .. }), "{e}");
    assert!(t.render_system_user("s", "u").is_err());
}
