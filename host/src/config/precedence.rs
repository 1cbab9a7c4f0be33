//! The precedence of every setting, checked over the whole settings table ([`SETTINGS`] and the
//! decision log's [`decision_log::SETTINGS`]): the flag wins over its variable, the variable over
//! the file's key, the key over the default, and a boolean set `false` by a higher source turns a
//! lower source's `true` off. A setting without a case here fails the test, so a new setting
//! cannot skip the rule.
//!
//! Each case resolves whole [`Settings`] (through `Settings::resolve`, as `hunch serve` does) and
//! compares them: "the flag wins" means the settings with all three sources equal the settings
//! with the flag alone. That checks the merge and every use of the merged value at once.

use super::{decision_log, ServeArgs, Settings, SETTINGS};
use clap::Parser;

/// `hunch serve`'s flags alone.
#[derive(Debug, Parser)]
struct Serve {
    #[command(flatten)]
    args: ServeArgs,
}

/// Three values of one setting, one per source, each as that source writes it: a flag's
/// arguments, a variable's value, a TOML value (for the setting's key). Adjacent ones differ.
struct Values {
    file: &'static str,
    env: &'static str,
    flag: &'static [&'static str],
}

/// One setting's case: its flag (the [`SETTINGS`] row), the flags every run of it also gets (what
/// the setting needs to be in effect, e.g. a bundle URL for the bundle's poll), and its values.
struct Case {
    flag: &'static str,
    context: &'static [&'static str],
    values: &'static [Values],
}

const fn v(file: &'static str, env: &'static str, flag: &'static [&'static str]) -> Values {
    Values { file, env, flag }
}

/// On, off, on: the variable turns the file's `true` off; then off, on, off: the flag turns the
/// variable's `true` off.
macro_rules! switch {
    ($flag:literal) => {
        &[
            v("true", "false", &[concat!($flag, "=true")]),
            v("false", "true", &[concat!($flag, "=false")]),
        ]
    };
}

const UNSIGNED_BUNDLE: &[&str] = &[
    "--bundle-url",
    "http://b/p.tar.gz",
    "--bundle-allow-unsigned",
];
const LOG_FILE: &[&str] = &["--decision-log", "/ctx/decisions.ndjson"];

const CASES: &[Case] = &[
    Case {
        flag: "--listen",
        context: &[],
        values: &[v("\"0.0.0.0:1\"", "0.0.0.0:2", &["--listen", "0.0.0.0:3"])],
    },
    Case {
        flag: "--model",
        context: &[],
        values: &[v(
            "[{ name = \"f\", path = \"/f/m\" }]",
            "e=/e/m",
            &["--model", "l=/l/m"],
        )],
    },
    Case {
        flag: "--accelerator",
        context: &[],
        values: &[v(
            "[{ name = \"f\", url = \"http://f:1\" }]",
            "e=http://e:1",
            &["--accelerator", "l=http://l:1"],
        )],
    },
    Case {
        flag: "--upstream",
        context: &[],
        values: &[v(
            "[{ name = \"f\", url = \"http://f:1\" }]",
            "e=http://e:1",
            &["--upstream", "l=http://l:1"],
        )],
    },
    Case {
        // Only an upstream without a key of its own shows which key is in effect.
        flag: "--upstream-key",
        context: &["--upstream", "u=http://u:1"],
        values: &[v("\"f\"", "e", &["--upstream-key", "l"])],
    },
    Case {
        flag: "--upstream-ca-file",
        context: &[],
        values: &[v("\"/f.pem\"", "/e.pem", &["--upstream-ca-file", "/l.pem"])],
    },
    Case {
        flag: "--api-key",
        context: &[],
        values: &[v("[\"f\"]", "e", &["--api-key", "l"])],
    },
    Case {
        flag: "--alias",
        context: &[],
        values: &[v("{ a = \"f\" }", "a=e", &["--alias", "a=l"])],
    },
    Case {
        flag: "--chat-template",
        context: &[],
        values: &[v(
            "{ a = \"chatml\" }",
            "a=gemma",
            &["--chat-template", "a=llama3"],
        )],
    },
    Case {
        flag: "--accelerator-bin",
        context: &[],
        values: &[v("\"/f/bin\"", "/e/bin", &["--accelerator-bin", "/l/bin"])],
    },
    Case {
        flag: "--sidecar-arg",
        context: &[],
        values: &[v("[\"--f\"]", "--e", &["--sidecar-arg=--l"])],
    },
    Case {
        flag: "--memory-limit",
        context: &[],
        values: &[v("\"1G\"", "2G", &["--memory-limit", "3G"])],
    },
    Case {
        flag: "--cpu-isa",
        context: &[],
        values: &[v("\"portable\"", "avx2", &["--cpu-isa", "neon"])],
    },
    Case {
        flag: "--models-dir",
        context: &[],
        values: &[v("[\"/f/m\"]", "/e/m", &["--models-dir", "/l/m"])],
    },
    Case {
        flag: "--memory-budget",
        context: &[],
        values: &[v("\"1G\"", "2G", &["--memory-budget", "3G"])],
    },
    Case {
        flag: "--model-ttl",
        context: &[],
        values: &[v("\"1m\"", "2m", &["--model-ttl", "3m"])],
    },
    Case {
        flag: "--max-body-bytes",
        context: &[],
        values: &[v("1000", "2000", &["--max-body-bytes", "3000"])],
    },
    Case {
        flag: "--request-timeout",
        context: &[],
        values: &[v("10", "20", &["--request-timeout", "30"])],
    },
    Case {
        flag: "--max-concurrent-reads",
        context: &[],
        values: &[v("1", "2", &["--max-concurrent-reads", "3"])],
    },
    Case {
        flag: "--max-queued-reads",
        context: &[],
        values: &[v("1", "2", &["--max-queued-reads", "3"])],
    },
    Case {
        flag: "--shutdown-grace",
        context: &[],
        values: &[v("1", "2", &["--shutdown-grace", "3"])],
    },
    Case {
        flag: "--drain-delay",
        context: &[],
        values: &[v("1", "2", &["--drain-delay", "3"])],
    },
    Case {
        flag: "--no-demo",
        context: &[],
        values: switch!("--no-demo"),
    },
    Case {
        flag: "--demo",
        context: &[],
        values: switch!("--demo"),
    },
    Case {
        flag: "--default-model",
        context: &[],
        values: &[v(
            "\"/f/m.gguf\"",
            "/e/m.gguf",
            &["--default-model", "/l/m.gguf"],
        )],
    },
    Case {
        flag: "--policies",
        context: &[],
        values: &[v("\"/f/p\"", "/e/p", &["--policies", "/l/p"])],
    },
    Case {
        flag: "--calibration",
        context: &[],
        values: &[v(
            "\"/f/c.json\"",
            "/e/c.json",
            &["--calibration", "/l/c.json"],
        )],
    },
    Case {
        flag: "--quality-dir",
        context: &[],
        values: &[v("\"/f/q\"", "/e/q", &["--quality-dir", "/l/q"])],
    },
    Case {
        flag: "--admin-key",
        context: &[],
        values: &[v("\"f\"", "e", &["--admin-key", "l"])],
    },
    Case {
        flag: "--console-decisions",
        context: &[],
        values: &[v("1", "2", &["--console-decisions", "3"])],
    },
    Case {
        flag: "--questions",
        context: &[],
        values: &[v("\"joint\"", "isolated", &["--questions", "joint"])],
    },
    Case {
        flag: "--prior",
        context: &[],
        values: &[v("\"divide\"", "none", &["--prior", "divide"])],
    },
    Case {
        flag: "--order",
        context: &[],
        values: &[v(
            "\"cyclic_average\"",
            "reversed_average",
            &["--order", "cyclic_average"],
        )],
    },
    Case {
        flag: "--answer-cache-mb",
        context: &[],
        values: &[v("1", "2", &["--answer-cache-mb", "3"])],
    },
    Case {
        flag: "--policy-pool",
        context: &[],
        values: &[v("4", "5", &["--policy-pool", "6"])],
    },
    Case {
        flag: "--policy-shadow-runs",
        context: &[],
        values: &[v("1", "2", &["--policy-shadow-runs", "3"])],
    },
    Case {
        flag: "--policy-max-memory",
        context: &[],
        values: &[v("\"1M\"", "2M", &["--policy-max-memory", "3M"])],
    },
    Case {
        flag: "--policy-max-stack",
        context: &[],
        values: &[v("\"1M\"", "2M", &["--policy-max-stack", "3M"])],
    },
    Case {
        flag: "--policy-max-fuel",
        context: &[],
        values: &[v("1000", "2000", &["--policy-max-fuel", "3000"])],
    },
    Case {
        flag: "--bundle-url",
        context: &["--bundle-allow-unsigned"],
        values: &[v(
            "\"http://f/p.tar.gz\"",
            "http://e/p.tar.gz",
            &["--bundle-url", "http://l/p.tar.gz"],
        )],
    },
    Case {
        flag: "--bundle-public-key",
        context: UNSIGNED_BUNDLE,
        values: &[v(
            "\"/f.pem\"",
            "/e.pem",
            &["--bundle-public-key", "/l.pem"],
        )],
    },
    Case {
        flag: "--bundle-poll",
        context: UNSIGNED_BUNDLE,
        values: &[v("\"1s\"", "2s", &["--bundle-poll", "3s"])],
    },
    Case {
        flag: "--bundle-dir",
        context: UNSIGNED_BUNDLE,
        values: &[v("\"/f/b\"", "/e/b", &["--bundle-dir", "/l/b"])],
    },
    Case {
        flag: "--bundle-stale-after",
        context: UNSIGNED_BUNDLE,
        values: &[v("\"1m\"", "2m", &["--bundle-stale-after", "3m"])],
    },
    Case {
        // With a key, so that turning it off still leaves a bundle that may be served.
        flag: "--bundle-allow-unsigned",
        context: &[
            "--bundle-url",
            "http://b/p.tar.gz",
            "--bundle-public-key",
            "/k.pem",
        ],
        values: switch!("--bundle-allow-unsigned"),
    },
    Case {
        flag: "--decision-log",
        context: &[],
        values: &[v(
            "\"/f.ndjson\"",
            "/e.ndjson",
            &["--decision-log", "/l.ndjson"],
        )],
    },
    Case {
        flag: "--decision-log-max-bytes",
        context: &[],
        values: &[v("1000", "2000", &["--decision-log-max-bytes", "3000"])],
    },
    Case {
        flag: "--decision-log-rotate-seconds",
        context: &[],
        values: &[v("1", "2", &["--decision-log-rotate-seconds", "3"])],
    },
    Case {
        flag: "--decision-log-keep",
        context: &[],
        values: &[v("1", "2", &["--decision-log-keep", "3"])],
    },
    Case {
        flag: "--decision-log-required",
        context: LOG_FILE,
        values: switch!("--decision-log-required"),
    },
    Case {
        flag: "--decision-log-omit-state",
        context: &[],
        values: switch!("--decision-log-omit-state"),
    },
    Case {
        flag: "--decision-log-url",
        context: &[],
        values: &[v(
            "\"http://f/\"",
            "http://e/",
            &["--decision-log-url", "http://l/"],
        )],
    },
    Case {
        flag: "--decision-log-url-key",
        context: &[],
        values: &[v("\"f\"", "e", &["--decision-log-url-key", "l"])],
    },
    Case {
        flag: "--decision-log-batch-bytes",
        context: &[],
        values: &[v("1000", "2000", &["--decision-log-batch-bytes", "3000"])],
    },
    Case {
        flag: "--decision-log-buffer",
        context: &[],
        values: &[v("1", "2", &["--decision-log-buffer", "3"])],
    },
    Case {
        flag: "--decision-log-buffer-bytes",
        context: &[],
        values: &[v("1000", "2000", &["--decision-log-buffer-bytes", "3000"])],
    },
    Case {
        flag: "--decision-log-write-timeout",
        context: &[],
        values: &[v("1", "2", &["--decision-log-write-timeout", "3"])],
    },
    Case {
        flag: "--decision-log-fsync",
        context: LOG_FILE,
        values: &[
            v("\"always\"", "off", &["--decision-log-fsync", "always"]),
            v("\"off\"", "always", &["--decision-log-fsync", "off"]),
        ],
    },
    Case {
        flag: "--decision-log-spool",
        context: &["--decision-log-url", "http://c/"],
        values: &[v("\"/f/s\"", "/e/s", &["--decision-log-spool", "/l/s"])],
    },
    Case {
        flag: "--decision-log-spool-bytes",
        context: &[],
        values: &[v("1000", "2000", &["--decision-log-spool-bytes", "3000"])],
    },
];

/// The settings `hunch serve` resolves from these flags, this one variable and a file holding
/// only `toml` (no file when `None`), as text to compare: `Settings` is compared whole.
fn resolved(flags: &[&str], var: Option<(&str, &str)>, toml: Option<String>) -> String {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut argv = vec!["hunch-serve".to_string()];
    if let Some(toml) = &toml {
        let path = dir.path().join("hunch.toml");
        std::fs::write(&path, toml).expect("write the file");
        argv.push("--config".into());
        argv.push(path.to_string_lossy().into_owned());
    }
    argv.extend(flags.iter().map(|f| f.to_string()));
    let args = Serve::try_parse_from(&argv)
        .unwrap_or_else(|e| panic!("{argv:?}: {e}"))
        .args;
    let lookup = |name: &str| {
        var.filter(|(n, _)| *n == name)
            .map(|(_, value)| value.to_string())
    };
    let settings = Settings::resolve(&args, &lookup)
        .unwrap_or_else(|e| panic!("{argv:?} with {var:?} and {toml:?}: {e}"));
    format!("{settings:?}")
}

#[test]
fn every_flag_wins_over_its_variable_which_wins_over_its_key_for_every_setting() {
    let table: Vec<_> = SETTINGS.iter().chain(decision_log::SETTINGS).collect();
    for case in CASES {
        assert!(
            table.iter().any(|(flag, _, _)| *flag == case.flag),
            "{} has a case but is not in SETTINGS",
            case.flag
        );
    }
    for (flag, env, key) in table {
        let case = CASES
            .iter()
            .find(|c| c.flag == *flag)
            .unwrap_or_else(|| panic!("{flag} has no precedence case in config/precedence.rs"));
        let context = case.context;
        let with = |extra: &[&'static str]| [context, extra].concat();
        let nothing = resolved(context, None, None);
        for (n, values) in case.values.iter().enumerate() {
            let file = Some(format!("{key} = {}\n", values.file));
            let var = Some((*env, values.env));
            let file_only = resolved(context, None, file.clone());
            let env_only = resolved(context, var, None);
            let flag_only = resolved(&with(values.flag), None, None);
            if n == 0 {
                assert_ne!(file_only, nothing, "{key} in the file sets nothing");
            }
            assert_ne!(
                file_only, env_only,
                "{key} and {env} give the same settings"
            );
            assert_ne!(
                env_only, flag_only,
                "{env} and {flag} give the same settings"
            );
            assert_eq!(
                resolved(context, var, file.clone()),
                env_only,
                "{env}={} does not win over {key} = {}",
                values.env,
                values.file
            );
            assert_eq!(
                resolved(&with(values.flag), var, file),
                flag_only,
                "{:?} does not win over {env}={} and {key} = {}",
                values.flag,
                values.env,
                values.file
            );
        }
    }
}
