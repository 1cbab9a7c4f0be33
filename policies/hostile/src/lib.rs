//! A policy that attacks its host on request, for the runtime's limit tests — one component
//! with a mode switch, so the tests build one crate instead of seven. `{"attack": "none"}`
//! echoes its input, which the hot-reload tests use.

use hunch_guest_sdk::prelude::*;
use serde_json::{json, Value};
use std::hint::black_box;

pub struct Hostile;

fn recurse(depth: u64) -> u64 {
    // black_box keeps the compiler from turning the recursion into a loop.
    if black_box(depth) == 0 {
        0
    } else {
        1 + black_box(recurse(depth - 1))
    }
}

impl Policy for Hostile {
    type Input = Value;
    type Output = Value;

    fn describe() -> Describe {
        Describe::new(
            "hostile",
            env!("CARGO_PKG_VERSION"),
            "Misbehaves on purpose (tests only).",
        )
        .input_schema(json!({
            "type": "object",
            "required": ["attack"],
            "properties": {"attack": {"enum": [
                "none", "loop", "memory", "recursion", "output", "trap", "reads", "batch",
                "env", "file", "clock", "bad_output"
            ]}}
        }))
        .output_schema(json!({"type": "object"}))
    }

    fn decide(input: Value, host: &mut dyn Host) -> Result<Value, PolicyError> {
        let attack = input["attack"].as_str().unwrap_or("none");
        match attack {
            "loop" => {
                let mut i: u64 = 0;
                loop {
                    i = black_box(i.wrapping_add(1));
                }
            }
            "memory" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![1u8; 1 << 20]);
                    black_box(&hoard);
                }
            }
            "recursion" => Ok(json!({ "depth": recurse(u64::MAX) })),
            "output" => {
                let bytes = input["bytes"].as_u64().unwrap_or(8 << 20) as usize;
                Ok(Value::String("x".repeat(bytes)))
            }
            "trap" => {
                let v: Vec<u8> = Vec::new();
                // An out-of-bounds index panics, and panics abort: a wasm trap.
                Ok(json!(v[black_box(3)]))
            }
            "reads" => {
                let mut total = 0.0;
                for i in 0..10_000 {
                    let set = QuestionSet::new(format!("state {i}")).ask(noul("Is it so?").id("q"));
                    total += host.read(&set)?.noul("q")?.value();
                }
                Ok(json!({ "total": total }))
            }
            "batch" => {
                let sets: Vec<QuestionSet> = (0..3)
                    .map(|i| QuestionSet::new(format!("part {i}")).ask(noul("Is it so?").id("q")))
                    .collect();
                let mut ps = Vec::new();
                for r in host.read_batch(&sets) {
                    ps.push(r?.noul("q")?.value());
                }
                Ok(json!({ "p": ps }))
            }
            "env" => Ok(json!({ "home": std::env::var("HOME").ok() })),
            "file" => Ok(json!({ "passwd": std::fs::read_to_string("/etc/passwd").ok() })),
            "clock" => Ok(json!({ "now": format!("{:?}", std::time::SystemTime::now()) })),
            "bad_output" => Ok(Value::Null),
            _ => {
                host.log(Level::Info, "echo");
                Ok(json!({ "echo": input }))
            }
        }
    }
}

export_policy!(Hostile);
