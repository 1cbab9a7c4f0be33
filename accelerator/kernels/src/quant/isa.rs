//! [`QuantIsa`]: which copy of the integer kernel runs in this process. Chosen at run time from
//! what the CPU reports (never from the compile-time target), the best one unless
//! `HUNCH_CPU_ISA` names another (docs/logit-read.md, "Kernels").

use std::fmt;
use std::sync::OnceLock;

/// The variable that picks a copy by its [`QuantIsa::flag`] instead of the best one detected.
pub const ISA_VARIABLE: &str = "HUNCH_CPU_ISA";

/// A copy of the integer kernel (every one gives the portable copy's bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantIsa {
    /// One scalar at a time: correct everywhere, and far too slow to serve a model.
    Portable,
    /// x86-64 with AVX2 and FMA: `vpmaddubsw` + `vpmaddwd`, 32 byte products per pair.
    Avx2,
    /// x86-64 with AVX-VNNI (256-bit VEX `vpdpbusd`), AVX2 and FMA: 32 byte products per
    /// instruction.
    AvxVnni,
    /// x86-64 with AVX-512 F, BW and VNNI: 64 byte products per instruction.
    Avx512Vnni,
    /// aarch64 with NEON alone: products widened to 16 bits (`smull`-style), summed pairwise.
    Neon,
    /// aarch64 with the dot-product extension (`sdot`): 16 byte products per instruction.
    Dotprod,
    /// aarch64 with the int8 matrix extension (`usdot`, unsigned by signed): 16 byte products
    /// per instruction, no correction for unsigned codes.
    I8mm,
}

/// Every copy, weakest first on each architecture.
const ALL: [QuantIsa; 7] = [
    QuantIsa::Portable,
    QuantIsa::Avx2,
    QuantIsa::AvxVnni,
    QuantIsa::Avx512Vnni,
    QuantIsa::Neon,
    QuantIsa::Dotprod,
    QuantIsa::I8mm,
];

impl QuantIsa {
    /// How it is named in the model's fingerprint.
    pub fn name(self) -> &'static str {
        match self {
            QuantIsa::Portable => "int8-portable",
            QuantIsa::Avx2 => "int8-avx2",
            QuantIsa::AvxVnni => "int8-avxvnni",
            QuantIsa::Avx512Vnni => "int8-avx512vnni",
            QuantIsa::Neon => "int8-neon",
            QuantIsa::Dotprod => "int8-dotprod",
            QuantIsa::I8mm => "int8-i8mm",
        }
    }

    /// How `HUNCH_CPU_ISA` names it.
    pub fn flag(self) -> &'static str {
        self.name().trim_start_matches("int8-")
    }

    /// Whether this CPU runs it (checked at run time; `Portable` always).
    pub fn detected(self) -> bool {
        match self {
            QuantIsa::Portable => true,
            #[cfg(target_arch = "x86_64")]
            QuantIsa::Avx2 => {
                std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
            }
            #[cfg(target_arch = "x86_64")]
            QuantIsa::AvxVnni => {
                QuantIsa::Avx2.detected() && std::is_x86_feature_detected!("avxvnni")
            }
            #[cfg(target_arch = "x86_64")]
            QuantIsa::Avx512Vnni => {
                std::is_x86_feature_detected!("avx512f")
                    && std::is_x86_feature_detected!("avx512bw")
                    && std::is_x86_feature_detected!("avx512vnni")
                    && std::is_x86_feature_detected!("fma")
            }
            #[cfg(target_arch = "aarch64")]
            QuantIsa::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[cfg(target_arch = "aarch64")]
            QuantIsa::Dotprod => {
                QuantIsa::Neon.detected() && std::arch::is_aarch64_feature_detected!("dotprod")
            }
            #[cfg(target_arch = "aarch64")]
            QuantIsa::I8mm => {
                QuantIsa::Neon.detected() && std::arch::is_aarch64_feature_detected!("i8mm")
            }
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }
}

impl fmt::Display for QuantIsa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.flag())
    }
}

/// The copies this CPU runs, weakest first (the portable one always).
pub fn available() -> &'static [QuantIsa] {
    static AVAILABLE: OnceLock<Vec<QuantIsa>> = OnceLock::new();
    AVAILABLE.get_or_init(|| ALL.into_iter().filter(|isa| isa.detected()).collect())
}

/// The CPU features the choice looks at that this CPU reports (for messages).
pub fn cpu_features() -> Vec<&'static str> {
    #[allow(unused_mut)]
    let mut found = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! x86 {
            ($($f:tt),*) => {$(
                if std::is_x86_feature_detected!($f) {
                    found.push($f);
                }
            )*};
        }
        x86!(
            "avx2",
            "fma",
            "avxvnni",
            "avx512f",
            "avx512bw",
            "avx512vnni"
        );
    }
    #[cfg(target_arch = "aarch64")]
    {
        macro_rules! arm {
            ($($f:tt),*) => {$(
                if std::arch::is_aarch64_feature_detected!($f) {
                    found.push($f);
                }
            )*};
        }
        arm!("neon", "dotprod", "i8mm");
    }
    if found.is_empty() {
        found.push("none of the SIMD features used here");
    }
    found
}

/// Why a requested copy cannot be honoured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IsaError {
    /// The value asked for, as given.
    pub value: String,
    pub problem: IsaProblem,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IsaProblem {
    /// It names no copy.
    Unknown,
    /// This CPU cannot run the copy it names.
    Lacking,
    /// This process already runs another copy (chosen before [`configure`] was called).
    AlreadyChosen(QuantIsa),
}

impl fmt::Display for IsaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = ALL.iter().map(|i| i.flag()).collect();
        let runs: Vec<&str> = available().iter().map(|i| i.flag()).collect();
        match self.problem {
            IsaProblem::Lacking => write!(f, "{}: this CPU cannot run it", Asked(&self.value))?,
            IsaProblem::Unknown => write!(
                f,
                "{} names none; use auto or one of {}",
                Asked(&self.value),
                names.join(", ")
            )?,
            IsaProblem::AlreadyChosen(running) => {
                return write!(
                    f,
                    "{} asked for after the integer products chose {running}",
                    Asked(&self.value)
                )
            }
        }
        write!(
            f,
            " (this CPU reports {}; it runs {})",
            cpu_features().join(" "),
            runs.join(", ")
        )
    }
}

impl std::error::Error for IsaError {}

/// A value as the messages quote it, with where it comes from.
struct Asked<'a>(&'a str);

impl fmt::Display for Asked<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "instruction set {:?} (--cpu-isa, {ISA_VARIABLE})",
            self.0
        )
    }
}

/// The copy `wanted` names (a [`QuantIsa::flag`], any case; `auto`, empty or absent: the best
/// this CPU runs), or why not.
pub fn choose(wanted: Option<&str>) -> Result<QuantIsa, IsaError> {
    let best = *available().last().unwrap_or(&QuantIsa::Portable);
    let Some(value) = wanted
        .map(str::trim)
        .filter(|v| !v.is_empty() && !v.eq_ignore_ascii_case("auto"))
    else {
        return Ok(best);
    };
    let lower = value.to_ascii_lowercase();
    let error = |problem| IsaError {
        value: value.to_owned(),
        problem,
    };
    let isa = ALL
        .into_iter()
        .find(|i| i.flag() == lower)
        .ok_or_else(|| error(IsaProblem::Unknown))?;
    if !isa.detected() {
        return Err(error(IsaProblem::Lacking));
    }
    Ok(isa)
}

/// The choice of this process, made once: by [`configure`], or else from `HUNCH_CPU_ISA` on
/// first use.
static CHOSEN: OnceLock<Result<QuantIsa, IsaError>> = OnceLock::new();

/// The copy this process runs: [`configure`]'s choice, else [`choose`] of `HUNCH_CPU_ISA` (read
/// once). A process that serves products calls it (or [`configure`]) at start and stops on an
/// error (the sidecar does).
pub fn configured() -> Result<QuantIsa, IsaError> {
    CHOSEN
        .get_or_init(|| {
            let value = std::env::var_os(ISA_VARIABLE).map(|v| v.to_string_lossy().into_owned());
            choose(value.as_deref())
        })
        .clone()
}

/// Chooses the copy this process runs from `wanted` rather than the environment (the sidecar's
/// `--cpu-isa`, whose default is `HUNCH_CPU_ISA`), before any product. An error where `wanted`
/// cannot be run, or where another copy was chosen already.
pub fn configure(wanted: Option<&str>) -> Result<QuantIsa, IsaError> {
    let asked = choose(wanted);
    let kept = CHOSEN.get_or_init(|| asked.clone()).clone();
    match (asked, kept) {
        (Ok(asked), Ok(kept)) if asked != kept => Err(IsaError {
            value: wanted.unwrap_or_default().to_owned(),
            problem: IsaProblem::AlreadyChosen(kept),
        }),
        (asked, _) => asked,
    }
}

/// The integer products' copy in this process ([`configured`]); where the copy asked for is
/// not one this CPU runs, the portable copy (correct everywhere; the sidecar refuses to start
/// before it gets here).
pub fn quant_isa() -> QuantIsa {
    configured().unwrap_or(QuantIsa::Portable)
}
