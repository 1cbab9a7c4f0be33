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

/// Why `HUNCH_CPU_ISA` cannot be honoured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IsaError {
    /// The value asked for, as given.
    pub value: String,
    /// Whether it names a copy at all (else this CPU lacks it).
    pub known: bool,
}

impl fmt::Display for IsaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = ALL.iter().map(|i| i.flag()).collect();
        let runs: Vec<&str> = available().iter().map(|i| i.flag()).collect();
        if self.known {
            write!(f, "{ISA_VARIABLE}={:?}: this CPU cannot run it", self.value)?;
        } else {
            write!(
                f,
                "{ISA_VARIABLE}={:?} is not an instruction set; use one of {}",
                self.value,
                names.join(", ")
            )?;
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

/// The copy `wanted` names (a [`QuantIsa::flag`], any case; empty or absent: the best this
/// CPU runs), or why not.
pub fn choose(wanted: Option<&str>) -> Result<QuantIsa, IsaError> {
    let best = *available().last().unwrap_or(&QuantIsa::Portable);
    let Some(value) = wanted.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(best);
    };
    let lower = value.to_ascii_lowercase();
    let isa = ALL
        .into_iter()
        .find(|i| i.flag() == lower)
        .ok_or_else(|| IsaError {
            value: value.to_owned(),
            known: false,
        })?;
    if !isa.detected() {
        return Err(IsaError {
            value: value.to_owned(),
            known: true,
        });
    }
    Ok(isa)
}

/// The copy this process runs: [`choose`] of `HUNCH_CPU_ISA`, read once. A process that serves
/// products calls it at start and stops on an error (the sidecar does).
pub fn configured() -> Result<QuantIsa, IsaError> {
    static CHOSEN: OnceLock<Result<QuantIsa, IsaError>> = OnceLock::new();
    CHOSEN
        .get_or_init(|| {
            let value = std::env::var_os(ISA_VARIABLE).map(|v| v.to_string_lossy().into_owned());
            choose(value.as_deref())
        })
        .clone()
}

/// The integer products' copy in this process ([`configured`]); where `HUNCH_CPU_ISA` is not
/// one this CPU runs, the portable copy (correct everywhere; the sidecar refuses to start
/// before it gets here).
pub fn quant_isa() -> QuantIsa {
    configured().unwrap_or(QuantIsa::Portable)
}
