//! Chat templates for checkpoints that carry none (base models' GGUFs, some converted folders),
//! chosen by name as llama.cpp's `--chat-template` and Ollama's `TEMPLATE` let users choose one
//! (docs/logit-read.md, "Tokenizers and chat templates"). Each is the family's published
//! template reduced to what a read renders — system and user turns, the generation prompt —
//! with the same markers and whitespace:
//!
//! - `chatml`: `<|im_start|>role\n…<|im_end|>\n` (Qwen2/2.5, Qwen3, SmolLM2);
//! - `llama3`: the BOS, then `<|start_header_id|>role<|end_header_id|>\n\n…<|eot_id|>`, each
//!   content trimmed (Llama 3.x);
//! - `gemma`: the BOS, `<start_of_turn>user\n…<end_of_turn>\n` with the system message put in
//!   front of the first user turn, the assistant called `model` (Gemma 2 and 3).

/// A built-in template: its name, the special tokens it writes (which the tokenizer must have,
/// or the prompts it renders would be spelt out as plain text), and its Jinja source.
pub struct Builtin {
    pub name: &'static str,
    pub markers: &'static [&'static str],
    pub source: &'static str,
}

pub const BUILTINS: [Builtin; 3] = [
    Builtin {
        name: "chatml",
        markers: &["<|im_start|>", "<|im_end|>"],
        source: "{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + \
                 message['content'] + '<|im_end|>' + '\\n' }}{%- endfor %}{%- if \
                 add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}",
    },
    Builtin {
        name: "llama3",
        markers: &["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        source: "{{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + \
                 message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + \
                 '<|eot_id|>' }}{%- endfor %}{%- if add_generation_prompt %}{{- \
                 '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}",
    },
    Builtin {
        name: "gemma",
        markers: &["<start_of_turn>", "<end_of_turn>"],
        source: "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}{%- set \
                 first_user_prefix = messages[0]['content'] + '\\n\\n' -%}{%- set loop_messages = \
                 messages[1:] -%}{%- else -%}{%- set first_user_prefix = '' -%}{%- set \
                 loop_messages = messages -%}{%- endif -%}{%- for message in loop_messages \
                 -%}{%- if message['role'] == 'assistant' -%}{%- set role = 'model' -%}{%- else \
                 -%}{%- set role = message['role'] -%}{%- endif -%}{{ '<start_of_turn>' + role + \
                 '\\n' + (first_user_prefix if loop.first else '') }}{{ message['content'] | trim \
                 }}{{ '<end_of_turn>\\n' }}{%- endfor -%}{%- if add_generation_prompt -%}{{ \
                 '<start_of_turn>model\\n' }}{%- endif -%}",
    },
];

/// The built-in template called `name`.
pub fn builtin(name: &str) -> Option<&'static Builtin> {
    BUILTINS.iter().find(|b| b.name == name)
}

/// The built-in names, for messages.
pub fn names() -> String {
    BUILTINS
        .iter()
        .map(|b| b.name)
        .collect::<Vec<_>>()
        .join(", ")
}
