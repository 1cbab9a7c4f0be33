//! A loaded policy version and its invocation: a fresh store per call, instantiated through the
//! version's `InstancePre`, run under the version's limits, every failure turned into a typed
//! [`InvokeError`].

use crate::calibration::file::Calibrations;
use crate::decision::event::{FailureKind, LimitHit};
use crate::policy::bindings::{types as wit, Policy, PolicyPre};
use crate::policy::calibration::{CalibrationConfig, PolicyCalibration};
use crate::policy::capabilities::{LogCapability, LogLine, ReadCapability, ReadRecord};
use crate::policy::limits::{Limit, LimitExceeded, Limits, MemoryLimiter};
use hunch_core::{AnswerSettings, QuestionMode, ReadErrorKind, Reader, Usage};
use serde::Serialize;
use serde_json::Value;
use std::sync::Arc;
use std::time::{Instant, SystemTime};
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Engine, Store, Trap};

/// Fuel between yields to tokio: small enough that a timeout interrupts a busy loop within a
/// millisecond or so, large enough that yielding costs nothing measurable.
const FUEL_YIELD_INTERVAL: u64 = 10_000_000;

/// The store's data: one field per capability plus the memory limiter.
pub struct InvocationState {
    pub read: ReadCapability,
    pub log: LogCapability,
    limiter: MemoryLimiter,
}

impl InvocationState {
    fn new(
        reader: Option<Arc<dyn Reader>>,
        answering: AnswerSettings,
        calibration: Option<Arc<Calibrations>>,
        limits: Limits,
        name: &str,
        version: &str,
    ) -> Self {
        InvocationState {
            read: ReadCapability::new(reader, limits)
                .with_answering(answering)
                .with_calibration(calibration),
            log: LogCapability::new(name, version, limits.max_log_lines),
            limiter: MemoryLimiter::new(limits.memory_bytes),
        }
    }
}

/// What a policy said about itself, with its schemas parsed.
#[derive(Debug, Clone, Serialize)]
pub struct Descriptor {
    pub name: String,
    pub version: String,
    pub description: String,
    pub input_schema: Value,
    pub output_schema: Value,
}

/// Why a version was refused at load.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LoadError {
    #[error("not a valid policy component: {0}")]
    Compile(String),
    #[error("the component does not fit the hunch:policy world: {0}")]
    Link(String),
    #[error("describe failed: {0}")]
    Describe(String),
    #[error("the {which} schema is not a valid JSON Schema: {message}")]
    Schema {
        which: &'static str,
        message: String,
    },
    #[error("invalid policy config: {0}")]
    Config(String),
    #[error("the policy's calibration: {0}")]
    Calibration(String),
    #[error("{0}")]
    Io(String),
}

impl From<crate::policy::calibration::CalibrationError> for LoadError {
    fn from(e: crate::policy::calibration::CalibrationError) -> Self {
        LoadError::Calibration(e.0)
    }
}

/// Why an invocation did not produce a decision.
#[derive(Debug, Clone, thiserror::Error)]
pub enum InvokeError {
    #[error("no policy named `{0}`")]
    NotFound(String),
    #[error("the input does not match the policy's input schema")]
    InvalidInput(Vec<String>),
    #[error(transparent)]
    Limit(LimitExceeded),
    #[error("policy trapped: {0}")]
    Trap(String),
    #[error("policy used a capability it was not granted: {0}")]
    Forbidden(String),
    #[error("policy declined: {0}")]
    Policy(PolicyFailure),
    #[error("policy output breaks its contract: {0}")]
    InvalidOutput(String),
    #[error("too many policy invocations at once; retry")]
    Busy,
    #[error("internal error: {0}")]
    Internal(String),
}

/// A `policy-error` returned by `decide`.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PolicyFailure {
    InvalidInput {
        message: String,
    },
    ReadFailed {
        read_error: ReadErrorKind,
        message: String,
    },
    Failed {
        message: String,
    },
}

impl std::fmt::Display for PolicyFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PolicyFailure::InvalidInput { message } => write!(f, "invalid input: {message}"),
            PolicyFailure::ReadFailed { message, .. } => write!(f, "a read failed: {message}"),
            PolicyFailure::Failed { message } => f.write_str(message),
        }
    }
}

impl From<wit::PolicyError> for PolicyFailure {
    fn from(e: wit::PolicyError) -> Self {
        match e {
            wit::PolicyError::InvalidInput(message) => PolicyFailure::InvalidInput { message },
            wit::PolicyError::ReadFailed(r) => PolicyFailure::ReadFailed {
                read_error: r.kind.into(),
                message: r.message,
            },
            wit::PolicyError::Failed(message) => PolicyFailure::Failed { message },
        }
    }
}

/// Where the time of an invocation went.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Timings {
    pub validate_ms: f64,
    pub instantiate_ms: f64,
    /// `decide`, reads included.
    pub run_ms: f64,
    pub read_ms: f64,
    pub total_ms: f64,
}

/// A decision and everything that went into it.
#[derive(Debug, Clone, Serialize)]
pub struct Invocation {
    pub output: Value,
    pub policy: String,
    pub version: String,
    pub reads: Vec<ReadRecord>,
    pub usage: Usage,
    pub fuel_used: u64,
    pub logs: Vec<LogLine>,
    pub timings: Timings,
    /// The id of the calibration the reads' answers were computed with (docs/calibration.md);
    /// absent when none was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calibration: Option<String>,
}

/// One compiled, validated version of a policy. Immutable: a reload builds a new one and swaps
/// the `Arc`, so an invocation holding this one finishes on it.
pub struct LoadedPolicy {
    pub name: String,
    /// Content hash of the `.wasm` (sha256, hex, first 16 chars).
    pub version: String,
    pub descriptor: Descriptor,
    pub limits: Limits,
    /// The reader this policy reads with (`None`: the server's default).
    pub reader: Option<String>,
    /// How this policy's reads ask their questions (`None`: the server's mode).
    pub questions: Option<QuestionMode>,
    pub loaded_at: SystemTime,
    pub wasm_bytes: usize,
    /// sha256 of the component, hex (decision events name it).
    pub sha256: String,
    /// Masking of this version's decision events.
    pub log: crate::decision::mask::PolicyLogConfig,
    /// How this version runs when it is a candidate.
    pub rollout: crate::policy::rollout::RolloutConfig,
    /// What its reads are calibrated with (`NAME.toml`'s `calibration`, else the server's).
    pub calibration: PolicyCalibration,
    /// The bundle revision this version came with (`None`: a directory or an HTTP deploy).
    /// Decision events and responses name it.
    pub bundle_revision: Option<String>,
    input_validator: jsonschema::Validator,
    output_validator: jsonschema::Validator,
    pre: PolicyPre<InvocationState>,
    engine: Engine,
}

impl std::fmt::Debug for LoadedPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedPolicy")
            .field("name", &self.name)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

/// Per-version configuration (from `NAME.toml` or an API deployment).
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// Reader (model) name; `None` reads with the server's default reader.
    #[serde(default)]
    pub reader: Option<String>,
    #[serde(default)]
    pub limits: Option<Limits>,
    /// `isolated` or `joint`; `None` reads in the server's `--questions` mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub questions: Option<QuestionMode>,
    /// `[decision_log]`: masking and dropping of this policy's decision events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision_log: Option<crate::decision::mask::PolicyLogConfig>,
    /// `[rollout]`: how a candidate version runs beside the active one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<crate::policy::rollout::RolloutConfig>,
    /// `calibration = "off"` or `[calibration] file = "…"`: what this version's reads are
    /// calibrated with instead of the server's `--calibration`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<CalibrationConfig>,
}

impl PolicyConfig {
    pub fn parse(toml_text: &str) -> Result<Self, LoadError> {
        let config: PolicyConfig =
            toml::from_str(toml_text).map_err(|e| LoadError::Config(e.to_string()))?;
        if let Some(log) = &config.decision_log {
            log.validate()
                .map_err(|e| LoadError::Config(e.to_string()))?;
        }
        if let Some(rollout) = &config.rollout {
            rollout
                .validate()
                .map_err(|e| LoadError::Config(e.to_string()))?;
        }
        Ok(config)
    }

    /// The configuration with a relative calibration file made relative to `dir` (where the
    /// `NAME.toml` lives).
    pub fn relative_to(mut self, dir: &std::path::Path) -> Self {
        self.calibration = self.calibration.map(|c| c.relative_to(dir));
        self
    }
}

/// The content hash that names a version.
pub fn content_hash(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(bytes);
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

fn schema_validator(
    which: &'static str,
    text: &str,
) -> Result<(Value, jsonschema::Validator), LoadError> {
    let value: Value = serde_json::from_str(text).map_err(|e| LoadError::Schema {
        which,
        message: format!("not JSON: {e}"),
    })?;
    let validator = jsonschema::validator_for(&value).map_err(|e| LoadError::Schema {
        which,
        message: e.to_string(),
    })?;
    Ok((value, validator))
}

/// Maps a wasmtime error from running guest code to the limit or trap that caused it.
fn classify(err: wasmtime::Error, limits: &Limits) -> InvokeError {
    if let Some(limit) = err.downcast_ref::<LimitExceeded>() {
        return InvokeError::Limit(limit.clone());
    }
    if let Some(trap) = err.downcast_ref::<Trap>() {
        return match trap {
            Trap::OutOfFuel => InvokeError::Limit(LimitExceeded::new(
                Limit::Fuel,
                limits.fuel,
                "the policy ran out of fuel (too much computation)",
            )),
            Trap::StackOverflow => InvokeError::Limit(LimitExceeded::new(
                Limit::Stack,
                crate::policy::engine::wasm_stack_bytes(),
                "the policy overflowed its wasm stack (recursion too deep)",
            )),
            // The wasm backtrace (function indices of a stripped binary) helps nobody here.
            other => InvokeError::Trap(other.to_string()),
        };
    }
    // Calls to imports outside the world hit the linker's stubs, whose message names the import.
    if let Some(stub) = err
        .chain()
        .map(|e| e.to_string())
        .find(|m| m.contains("unknown import"))
    {
        return InvokeError::Forbidden(stub);
    }
    InvokeError::Trap(format!("{err:#}"))
}

/// The panic message a guest logged just before trapping (the SDK's panic hook), if any.
fn panic_message(state: &InvocationState) -> Option<&str> {
    state
        .log
        .lines
        .iter()
        .rev()
        .find(|l| l.level == "error" && l.message.starts_with("panic: "))
        .map(|l| l.message.as_str())
}

impl LoadedPolicy {
    /// Compiles (blocking: call off the async runtime's workers), links and describes a version.
    pub fn load(
        engine: &Engine,
        name: &str,
        wasm: &[u8],
        config: PolicyConfig,
        ceiling: &Limits,
        runtime: &tokio::runtime::Handle,
    ) -> Result<LoadedPolicy, LoadError> {
        let version = content_hash(wasm);
        let calibration = PolicyCalibration::load(config.calibration.as_ref())?;
        let component =
            Component::new(engine, wasm).map_err(|e| LoadError::Compile(format!("{e:#}")))?;
        let mut linker: Linker<InvocationState> = Linker::new(engine);
        let link = |e: wasmtime::Error| LoadError::Link(format!("{e:#}"));
        crate::policy::bindings::hunch::policy::reader::add_to_linker::<_, HasSelf<ReadCapability>>(
            &mut linker,
            |s: &mut InvocationState| &mut s.read,
        )
        .map_err(link)?;
        crate::policy::bindings::hunch::policy::log::add_to_linker::<_, HasSelf<LogCapability>>(
            &mut linker,
            |s: &mut InvocationState| &mut s.log,
        )
        .map_err(link)?;
        // WASI and anything else the toolchain linked in but the world does not grant: present
        // (so the component instantiates) but trapping when called.
        linker
            .define_unknown_imports_as_traps(&component)
            .map_err(link)?;
        let instance_pre = linker.instantiate_pre(&component).map_err(link)?;
        let pre = PolicyPre::new(instance_pre).map_err(link)?;

        let limits = config.limits.unwrap_or_default().capped_by(ceiling);
        let described = runtime.block_on(async {
            let mut store = new_store(
                engine,
                None,
                AnswerSettings::default(),
                None,
                limits,
                name,
                &version,
            )?;
            let future = async {
                let bindings = pre.instantiate_async(&mut store).await?;
                bindings.call_describe(&mut store).await
            };
            match tokio::time::timeout(limits.timeout(), future).await {
                Ok(Ok(d)) => Ok(d),
                Ok(Err(e)) => Err(classify(e, &limits)),
                Err(_) => Err(InvokeError::Limit(LimitExceeded::new(
                    Limit::Timeout,
                    limits.timeout_ms,
                    "describe did not return in time",
                ))),
            }
        });
        let d = described.map_err(|e| LoadError::Describe(e.to_string()))?;
        let (input_schema, input_validator) = schema_validator("input", &d.input_schema)?;
        let (output_schema, output_validator) = schema_validator("output", &d.output_schema)?;
        Ok(LoadedPolicy {
            name: name.to_string(),
            version,
            descriptor: Descriptor {
                name: d.name,
                version: d.version,
                description: d.description,
                input_schema,
                output_schema,
            },
            limits,
            reader: config.reader.clone(),
            questions: config.questions,
            loaded_at: SystemTime::now(),
            wasm_bytes: wasm.len(),
            sha256: crate::decision::event::sha256_hex(wasm),
            log: config.decision_log.unwrap_or_default(),
            rollout: config.rollout.unwrap_or_default(),
            calibration,
            bundle_revision: None,
            input_validator,
            output_validator,
            pre,
            engine: engine.clone(),
        })
    }

    /// Checks `input` against the declared input schema (at most 16 messages).
    pub fn validate_input(&self, input: &Value) -> Result<(), InvokeError> {
        let errors: Vec<String> = self
            .input_validator
            .iter_errors(input)
            .take(16)
            .map(|e| format!("{}: {}", e.instance_path(), e))
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(InvokeError::InvalidInput(errors))
        }
    }

    /// Runs `decide` on `input` in a fresh store; reads use `answering`'s mode unless the
    /// policy's `NAME.toml` chose one, and its answer cache, and are calibrated with
    /// `calibration` (the caller resolves it: [`PolicyCalibration::reads_with`] the server's,
    /// or, replaying, what the record needs). The one way a policy runs: the server, `hunch
    /// policy run`, replay and shadow runs all come here with the answer settings and
    /// calibration they serve with (there is deliberately no variant that picks defaults).
    pub async fn invoke(
        &self,
        reader: Option<Arc<dyn Reader>>,
        mut answering: AnswerSettings,
        calibration: Option<Arc<Calibrations>>,
        input: &Value,
    ) -> Result<Invocation, InvokeError> {
        if let Some(mode) = self.questions {
            answering.questions = mode;
        }
        let started = Instant::now();
        self.validate_input(input)?;
        let input_text = input.to_string();
        let mut timings = Timings {
            validate_ms: ms(started),
            ..Timings::default()
        };
        let limits = self.limits;
        let calibration_id = calibration.as_ref().map(|c| c.id.clone());
        let mut store = new_store(
            &self.engine,
            reader,
            answering,
            calibration,
            limits,
            &self.name,
            &self.version,
        )
        .map_err(|e| InvokeError::Internal(e.to_string()))?;

        let instantiate_started = Instant::now();
        let bindings: Policy = self
            .pre
            .instantiate_async(&mut store)
            .await
            .map_err(|e| instantiate_error(e, &limits))?;
        timings.instantiate_ms = ms(instantiate_started);

        let run_started = Instant::now();
        let run = tokio::time::timeout(
            limits.timeout(),
            bindings.call_decide(&mut store, &input_text),
        )
        .await;
        timings.run_ms = ms(run_started);
        let returned = match run {
            Err(_) => {
                return Err(InvokeError::Limit(LimitExceeded::new(
                    Limit::Timeout,
                    limits.timeout_ms,
                    format!("decide did not return within {} ms", limits.timeout_ms),
                )))
            }
            Ok(Err(e)) => {
                let mut error = classify(e, &limits);
                if let (InvokeError::Trap(message), Some(panic)) =
                    (&mut error, panic_message(store.data()))
                {
                    message.push_str("; ");
                    message.push_str(panic);
                }
                return Err(error);
            }
            Ok(Ok(returned)) => returned,
        };
        let output_text = returned.map_err(|e| InvokeError::Policy(e.into()))?;
        if output_text.len() as u64 > limits.max_output_bytes {
            return Err(InvokeError::Limit(LimitExceeded::new(
                Limit::OutputSize,
                limits.max_output_bytes,
                format!("a decision of {} bytes", output_text.len()),
            )));
        }
        let output: Value = serde_json::from_str(&output_text)
            .map_err(|e| InvokeError::InvalidOutput(format!("not JSON: {e}")))?;
        if let Some(e) = self.output_validator.iter_errors(&output).next() {
            return Err(InvokeError::InvalidOutput(format!(
                "{}: {}",
                e.instance_path(),
                e
            )));
        }
        let fuel_used = limits.fuel.saturating_sub(store.get_fuel().unwrap_or(0));
        let state = store.into_data();
        timings.read_ms = state.read.read_ms;
        timings.total_ms = ms(started);
        Ok(Invocation {
            output,
            policy: self.name.clone(),
            version: self.version.clone(),
            reads: state.read.records,
            usage: state.read.usage,
            fuel_used,
            logs: state.log.lines,
            timings,
            calibration: calibration_id,
        })
    }
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

/// Instantiation fails for a full pool (the server is busy: retry) or for a guest whose start-up
/// breaks a limit.
fn instantiate_error(e: wasmtime::Error, limits: &Limits) -> InvokeError {
    if e.downcast_ref::<LimitExceeded>().is_some() || e.downcast_ref::<Trap>().is_some() {
        return classify(e, limits);
    }
    let message = format!("{e:#}");
    if message.contains("maximum concurrent") || message.contains("limit of") {
        InvokeError::Busy
    } else {
        InvokeError::Internal(message)
    }
}

fn new_store(
    engine: &Engine,
    reader: Option<Arc<dyn Reader>>,
    answering: AnswerSettings,
    calibration: Option<Arc<Calibrations>>,
    limits: Limits,
    name: &str,
    version: &str,
) -> Result<Store<InvocationState>, InvokeError> {
    let mut store = Store::new(
        engine,
        InvocationState::new(reader, answering, calibration, limits, name, version),
    );
    store.limiter(|s| &mut s.limiter);
    store
        .set_fuel(limits.fuel)
        .map_err(|e| InvokeError::Internal(e.to_string()))?;
    store
        .fuel_async_yield_interval(Some(FUEL_YIELD_INTERVAL))
        .map_err(|e| InvokeError::Internal(e.to_string()))?;
    Ok(store)
}

impl InvokeError {
    /// The kind clients see as `error_type`, and decision events record.
    pub fn kind(&self) -> FailureKind {
        match self {
            InvokeError::NotFound(_) => FailureKind::NotFound,
            InvokeError::InvalidInput(_) => FailureKind::InvalidInput,
            InvokeError::Limit(_) => FailureKind::LimitExceeded,
            InvokeError::Trap(_) => FailureKind::PolicyTrapped,
            InvokeError::Forbidden(_) => FailureKind::PolicyForbiddenCapability,
            // A read that was unavailable (a model loading, restarting, its queue full) is the
            // retryable case clients must recognise, so it is named as every other 503 is; the
            // body's `policy_error` still says the policy's read failed.
            InvokeError::Policy(PolicyFailure::ReadFailed {
                read_error: ReadErrorKind::Unavailable,
                ..
            }) => FailureKind::Unavailable,
            InvokeError::Policy(_) => FailureKind::PolicyDeclined,
            InvokeError::InvalidOutput(_) => FailureKind::PolicyInvalidOutput,
            InvokeError::Busy => FailureKind::Unavailable,
            InvokeError::Internal(_) => FailureKind::InternalError,
        }
    }

    /// The limit this failure ran into, as events record it.
    pub fn limit_hit(&self) -> Option<LimitHit> {
        match self {
            InvokeError::Limit(l) => Some(LimitHit {
                limit: l.limit,
                value: Some(l.limit_value),
            }),
            _ => None,
        }
    }

    /// The kind of the read error a policy returned (`policy-error::read-failed`), if it did.
    pub fn read_error_kind(&self) -> Option<ReadErrorKind> {
        match self {
            InvokeError::Policy(PolicyFailure::ReadFailed { read_error, .. }) => Some(*read_error),
            _ => None,
        }
    }
}
