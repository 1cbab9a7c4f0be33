//! Which BLAS serves MLX's CPU matmuls, chosen when the process starts rather than when it was
//! linked (docs/mlx-on-linux.md, "Speed on the CPU").
//!
//! MLX's CPU wheel links the reference BLAS it bundles (~5 GFLOP/s in float32). `libmlx` calls
//! `cblas_sgemm` (and `cblas_dgemm`, `cblas_cgemm`) through the dynamic linker's global lookup,
//! which searches the executable first. This module defines those three functions in every
//! binary that links it (the binary's build script exports them with `--export-dynamic-symbol`)
//! and forwards each call to the implementation chosen once per process:
//!
//! * [`BlasChoice::OpenBlas`]: `libopenblas.so.0` opened privately (`RTLD_LOCAL`), so nothing
//!   else in the process changes;
//! * [`BlasChoice::Reference`]: whatever the dynamic linker would have used without us, found
//!   with `RTLD_NEXT` — the wheel's bundled reference BLAS;
//! * [`BlasChoice::Auto`] (the default): OpenBLAS when the system has it, else the reference.
//!
//! The choice is `HUNCH_BLAS` unless the program calls [`select`] before the first matmul (the
//! sidecar's `--blas` flag, tests that check bits). A binary therefore starts on a machine
//! without OpenBLAS and falls back to the wheel's BLAS, and one binary serves both: the test
//! suite pins the reference BLAS (row-independent, so batching is bit-exact) while the sidecar
//! runs on OpenBLAS.

use std::fmt;
use std::str::FromStr;
use std::sync::{Mutex, OnceLock};

/// The BLAS a process asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BlasChoice {
    /// OpenBLAS when it can be loaded, else the reference BLAS.
    #[default]
    Auto,
    /// OpenBLAS, or an error.
    OpenBlas,
    /// The BLAS the MLX wheel bundles: slow, but every output element is the same sequential
    /// sum over `k` whatever the matrix shape, so batched answers are bit-exact.
    Reference,
}

impl FromStr for BlasChoice {
    type Err = BlasError;

    fn from_str(s: &str) -> Result<Self, BlasError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(BlasChoice::Auto),
            "openblas" => Ok(BlasChoice::OpenBlas),
            "reference" | "wheel" | "bundled" => Ok(BlasChoice::Reference),
            _ => Err(BlasError::Unknown(s.to_owned())),
        }
    }
}

impl fmt::Display for BlasChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BlasChoice::Auto => "auto",
            BlasChoice::OpenBlas => "openblas",
            BlasChoice::Reference => "reference",
        })
    }
}

/// The BLAS actually serving this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActiveBlas {
    OpenBlas,
    /// The wheel's bundled BLAS (or, where calls are not routed through this module — not
    /// Linux, or a binary that does not export the symbols — whatever `libmlx` linked).
    Reference,
}

impl ActiveBlas {
    pub fn name(self) -> &'static str {
        match self {
            ActiveBlas::OpenBlas => "openblas",
            ActiveBlas::Reference => "reference",
        }
    }

    fn satisfies(self, choice: BlasChoice) -> bool {
        match choice {
            BlasChoice::Auto => true,
            BlasChoice::OpenBlas => self == ActiveBlas::OpenBlas,
            BlasChoice::Reference => self == ActiveBlas::Reference,
        }
    }
}

impl fmt::Display for ActiveBlas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a BLAS could not be chosen.
#[derive(Debug, thiserror::Error)]
pub enum BlasError {
    #[error("{0:?} is not a BLAS choice; use auto, openblas or reference")]
    Unknown(String),
    #[error(
        "OpenBLAS asked for but not loadable ({0}); install it (Debian/Ubuntu: apt-get install \
         libopenblas0-pthread) or use the reference BLAS"
    )]
    OpenBlasMissing(String),
    #[error(
        "OpenBLAS asked for, but this binary does not route MLX's BLAS calls (its build script \
         must export cblas_sgemm; see docs/mlx-on-linux.md)"
    )]
    NotRouted,
    #[error("the {active} BLAS already serves this process; {wanted} cannot be chosen now")]
    AlreadyActive {
        active: ActiveBlas,
        wanted: BlasChoice,
    },
    #[error("no cblas_sgemm is reachable from this process (BLAS calls are not routed here)")]
    NoSgemm,
    #[error("sgemm: {0}")]
    Gemm(&'static str),
}

/// The choice named by `HUNCH_BLAS` (unset: [`BlasChoice::Auto`]).
pub fn choice_from_env() -> Result<BlasChoice, BlasError> {
    match std::env::var("HUNCH_BLAS") {
        Ok(value) => value.parse(),
        Err(_) => Ok(BlasChoice::Auto),
    }
}

static ACTIVE: OnceLock<ActiveBlas> = OnceLock::new();
static CHOOSING: Mutex<()> = Mutex::new(());

/// Chooses the BLAS for this process. Call it before the first matmul; once one serves the
/// process, a choice it does not satisfy is an error (the process-wide choice cannot change
/// under MLX's feet).
pub fn select(choice: BlasChoice) -> Result<ActiveBlas, BlasError> {
    let _guard = CHOOSING.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&active) = ACTIVE.get() {
        return if active.satisfies(choice) {
            Ok(active)
        } else {
            Err(BlasError::AlreadyActive {
                active,
                wanted: choice,
            })
        };
    }
    let active = routing::install(choice)?;
    let _ = ACTIVE.set(active);
    Ok(active)
}

/// Every BLAS library this process has mapped (its path, from Linux `/proc/self/maps`; empty
/// where that cannot be read): what [`active`] chose, and what else the binary and MLX brought
/// (the wheel's reference BLAS is always mapped). `accel-bench` records it, and the sidecar
/// reports it in `/health` (`ModelInfo::blas_libraries`) for the benchmarks that run it.
pub fn mapped_libraries() -> Vec<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    blas_paths(&maps)
}

/// The paths in `maps` (the text of a `/proc/PID/maps`) whose file names say BLAS or LAPACK,
/// sorted, each once.
fn blas_paths(maps: &str) -> Vec<String> {
    let mut libs: Vec<String> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| {
            let base = p.rsplit('/').next().unwrap_or("").to_lowercase();
            ["blas", "lapack", "mkl", "accelerate"]
                .iter()
                .any(|t| base.contains(t))
        })
        .map(str::to_owned)
        .collect();
    libs.sort();
    libs.dedup();
    libs
}

/// The BLAS serving this process, chosen from `HUNCH_BLAS` now if nothing was chosen yet (an
/// unusable setting falls back to the reference BLAS, with a warning).
pub fn active() -> ActiveBlas {
    if let Some(&active) = ACTIVE.get() {
        return active;
    }
    let choice = choice_from_env().unwrap_or_else(|e| {
        tracing::warn!(error = %e, "HUNCH_BLAS ignored");
        BlasChoice::Auto
    });
    select(choice).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "using the reference BLAS");
        select(BlasChoice::Reference).unwrap_or(ActiveBlas::Reference)
    })
}

/// Asks OpenBLAS for its AVX-512 (SkylakeX) kernels where the CPU has AVX-512 F, CD, BW, DQ and
/// VL and nobody chose a core (`OPENBLAS_CORETYPE` unset). OpenBLAS 0.3.21 (Debian 12) does not
/// know newer Xeons and falls back to its SSE3 "Prescott" kernels there, which made a float32
/// product ~3x slower (docs/benchmarks.md); on the CPUs it does know, the float32 kernels it
/// would pick with AVX-512 are these. Call before any thread starts and before the first BLAS
/// call (it sets an environment variable the library reads when it loads).
pub fn prefer_avx512_openblas() {
    #[cfg(target_arch = "x86_64")]
    {
        let avx512 = std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512cd")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512dq")
            && std::is_x86_feature_detected!("avx512vl");
        if avx512 && std::env::var_os("OPENBLAS_CORETYPE").is_none() {
            // Only sound before other threads run (the caller's contract: start of `main`).
            std::env::set_var("OPENBLAS_CORETYPE", "SKYLAKEX");
        }
    }
}

/// Sets how many threads the chosen BLAS runs its products on (OpenBLAS; the reference BLAS
/// has one): whether it could. Used where other code owns the cores between BLAS calls
/// (docs/logit-read.md, "Kernels": OpenBLAS's idle workers spin for a while after each call,
/// and took a quarter of a 1B read's CPU from the integer products).
pub fn set_threads(threads: usize) -> bool {
    routing::set_threads(threads)
}

/// Whether [`sgemm`] can run in this process (the chosen BLAS has a `cblas_sgemm`).
pub fn sgemm_available() -> bool {
    routing::sgemm_function().is_some()
}

/// `c = alpha · a · op(b) + beta · c` in float32, row-major, through the BLAS this process chose
/// (the one MLX's own products use, so both paths run the same kernels and threads). `a` is
/// `[m, k]` with row stride `lda`; `b` is `[n, k]` (`trans_b`: the product is `a · bᵀ`, the
/// layout of a `[out, in]` weight) or `[k, n]`, with row stride `ldb`; `c` is `[m, n]` with row
/// stride `ldc`. Every extent is checked against the slices before the call, so a wrong shape
/// is an error, never a read or write out of bounds.
pub fn sgemm(
    trans_b: bool,
    (m, n, k): (usize, usize, usize),
    alpha: f32,
    (a, lda): (&[f32], usize),
    (b, ldb): (&[f32], usize),
    beta: f32,
    (c, ldc): (&mut [f32], usize),
) -> Result<(), BlasError> {
    // Whether a `rows × cols` matrix with row stride `ld` fits in `len` values (CBLAS also
    // wants `ld ≥ max(1, cols)`).
    fn fits(len: usize, rows: usize, cols: usize, ld: usize) -> bool {
        ld >= cols.max(1)
            && (rows - 1)
                .checked_mul(ld)
                .and_then(|x| x.checked_add(cols))
                .is_some_and(|end| end <= len)
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    let (b_rows, b_cols) = if trans_b { (n, k) } else { (k, n) };
    if !fits(a.len(), m, k, lda) {
        return Err(BlasError::Gemm("a is shorter than its shape and stride"));
    }
    if b_rows > 0 && !fits(b.len(), b_rows, b_cols, ldb) {
        return Err(BlasError::Gemm("b is shorter than its shape and stride"));
    }
    if !fits(c.len(), m, n, ldc) {
        return Err(BlasError::Gemm("c is shorter than its shape and stride"));
    }
    let int = |v: usize| i32::try_from(v).map_err(|_| BlasError::Gemm("a dimension exceeds i32"));
    let (mi, ni, ki) = (int(m)?, int(n)?, int(k)?);
    let (lda, ldb, ldc) = (int(lda)?, int(ldb)?, int(ldc)?);
    let f = routing::sgemm_function().ok_or(BlasError::NoSgemm)?;
    // CBLAS enums: 101 row-major, 111 no transpose, 112 transpose.
    let trans_b = if trans_b { 112 } else { 111 };
    // SAFETY: the extents of a, b and c were checked against their slices above, `c` is
    // borrowed mutably (so it aliases neither input), and the function is a CBLAS `sgemm`.
    unsafe {
        f(
            101,
            111,
            trans_b,
            mi,
            ni,
            ki,
            alpha,
            a.as_ptr(),
            lda,
            b.as_ptr(),
            ldb,
            beta,
            c.as_mut_ptr(),
            ldc,
        );
    }
    Ok(())
}

#[cfg(target_os = "linux")]
mod routing {
    //! The exported `cblas_*` entry points and their targets.

    use super::{ActiveBlas, BlasChoice, BlasError};
    use std::ffi::{c_int, c_void, CStr};
    use std::sync::OnceLock;

    /// Defines one exported CBLAS `?gemm` entry point and the type of its target: the
    /// three differ only in the scalar and pointer types.
    macro_rules! gemm {
        ($name:ident, $field:ident, $alias:ident, $scalar:ty, $input:ty, $output:ty) => {
            pub(super) type $alias = unsafe extern "C" fn(
                c_int,
                c_int,
                c_int,
                c_int,
                c_int,
                c_int,
                $scalar,
                $input,
                c_int,
                $input,
                c_int,
                $scalar,
                $output,
                c_int,
            );

            /// # Safety
            /// The CBLAS contract: valid matrices of the given shapes and leading dimensions.
            #[no_mangle]
            pub unsafe extern "C" fn $name(
                order: c_int,
                trans_a: c_int,
                trans_b: c_int,
                m: c_int,
                n: c_int,
                k: c_int,
                alpha: $scalar,
                a: $input,
                lda: c_int,
                b: $input,
                ldb: c_int,
                beta: $scalar,
                c: $output,
                ldc: c_int,
            ) {
                match table().$field {
                    Some(f) => f(
                        order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
                    ),
                    None => missing(stringify!($name)),
                }
            }
        };
    }

    gemm!(cblas_sgemm, sgemm, Sgemm, f32, *const f32, *mut f32);
    gemm!(cblas_dgemm, dgemm, Dgemm, f64, *const f64, *mut f64);
    gemm!(
        cblas_cgemm,
        cgemm,
        Cgemm,
        *const c_void,
        *const c_void,
        *mut c_void
    );

    struct Table {
        sgemm: Option<Sgemm>,
        dgemm: Option<Dgemm>,
        cgemm: Option<Cgemm>,
        /// OpenBLAS's `openblas_set_num_threads` (none for the reference BLAS).
        set_threads: Option<unsafe extern "C" fn(i32)>,
    }

    static TABLE: OnceLock<Table> = OnceLock::new();

    /// Where `libopenblas.so.0` is looked for: the loader's search path first, then Debian's and
    /// Fedora's alternatives directories.
    const OPENBLAS: [&CStr; 4] = [
        c"libopenblas.so.0",
        c"/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
        c"/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
        c"/usr/lib64/libopenblas.so.0",
    ];

    /// The chosen BLAS's `cblas_sgemm`, choosing the BLAS now if nothing did yet.
    pub(super) fn sgemm_function() -> Option<Sgemm> {
        table().sgemm
    }

    /// Sets the chosen BLAS's threads where it has the call; whether it did.
    pub(super) fn set_threads(threads: usize) -> bool {
        match table().set_threads {
            Some(set) => {
                // SAFETY: OpenBLAS's `openblas_set_num_threads(int)`, callable at any time.
                unsafe { set(threads.clamp(1, i32::MAX as usize) as i32) };
                true
            }
            None => false,
        }
    }

    fn table() -> &'static Table {
        match TABLE.get() {
            Some(table) => table,
            None => {
                // A matmul before anyone chose: choose from the environment now.
                super::active();
                TABLE.get().unwrap_or_else(|| {
                    // install() sets TABLE before active() returns; unreachable.
                    std::process::abort()
                })
            }
        }
    }

    unsafe fn symbol<T>(handle: *mut c_void, name: &CStr) -> Option<T> {
        let ptr = libc::dlsym(handle, name.as_ptr());
        // SAFETY: the caller names a function of type T; a non-null symbol is its address.
        (!ptr.is_null()).then(|| std::mem::transmute_copy::<*mut c_void, T>(&ptr))
    }

    fn open_openblas() -> Result<Table, BlasError> {
        let mut errors = Vec::new();
        for path in OPENBLAS {
            // SAFETY: dlopen with a NUL-terminated path; RTLD_LOCAL keeps its symbols out of the
            // global lookup, so only calls routed here reach it.
            let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            if handle.is_null() {
                errors.push(path.to_string_lossy().into_owned());
                continue;
            }
            // SAFETY: OpenBLAS's cblas functions have exactly these C signatures (LP64 build).
            let table = unsafe {
                Table {
                    sgemm: symbol(handle, c"cblas_sgemm"),
                    dgemm: symbol(handle, c"cblas_dgemm"),
                    cgemm: symbol(handle, c"cblas_cgemm"),
                    set_threads: symbol(handle, c"openblas_set_num_threads"),
                }
            };
            if table.sgemm.is_some() {
                return Ok(table);
            }
            errors.push(format!("{} has no cblas_sgemm", path.to_string_lossy()));
        }
        Err(BlasError::OpenBlasMissing(format!(
            "tried {}",
            errors.join(", ")
        )))
    }

    fn reference() -> Table {
        // SAFETY: RTLD_NEXT finds the next definition after this executable in the global
        // lookup order: the BLAS libmlx was linked against.
        unsafe {
            Table {
                sgemm: symbol(libc::RTLD_NEXT, c"cblas_sgemm"),
                dgemm: symbol(libc::RTLD_NEXT, c"cblas_dgemm"),
                cgemm: symbol(libc::RTLD_NEXT, c"cblas_cgemm"),
                set_threads: None,
            }
        }
    }

    /// Whether libmlx's `cblas_sgemm` calls reach [`cblas_sgemm`] below: the global lookup
    /// finds this binary's definition first.
    fn routed() -> bool {
        // SAFETY: dlsym on the global scope with a NUL-terminated name.
        let global = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"cblas_sgemm".as_ptr()) };
        global as usize == cblas_sgemm as *const () as usize
    }

    pub(super) fn install(choice: BlasChoice) -> Result<ActiveBlas, BlasError> {
        let routed = routed();
        let (table, active) = match choice {
            BlasChoice::Reference => (reference(), ActiveBlas::Reference),
            BlasChoice::OpenBlas if !routed => return Err(BlasError::NotRouted),
            BlasChoice::OpenBlas => (open_openblas()?, ActiveBlas::OpenBlas),
            BlasChoice::Auto => match open_openblas() {
                Ok(table) if routed => (table, ActiveBlas::OpenBlas),
                Ok(_) => (reference(), ActiveBlas::Reference),
                Err(why) => {
                    tracing::info!(%why, "OpenBLAS not found: MLX runs on the wheel's reference BLAS");
                    (reference(), ActiveBlas::Reference)
                }
            },
        };
        let _ = TABLE.set(table);
        Ok(active)
    }

    fn missing(name: &str) -> ! {
        eprintln!("hunch: MLX called {name}, which no BLAS in this process provides");
        std::process::abort()
    }
}

#[cfg(not(target_os = "linux"))]
mod routing {
    //! Elsewhere MLX's calls are not routed (macOS links Accelerate through libmlx's own
    //! two-level namespace): whatever libmlx linked serves them.

    use super::{ActiveBlas, BlasChoice, BlasError};

    pub(super) fn install(choice: BlasChoice) -> Result<ActiveBlas, BlasError> {
        match choice {
            BlasChoice::OpenBlas => Err(BlasError::NotRouted),
            _ => Ok(ActiveBlas::Reference),
        }
    }

    /// A CBLAS `sgemm`'s signature.
    pub(super) type Sgemm = unsafe extern "C" fn(
        i32,
        i32,
        i32,
        i32,
        i32,
        i32,
        f32,
        *const f32,
        i32,
        *const f32,
        i32,
        f32,
        *mut f32,
        i32,
    );

    /// No routed BLAS here: the native kernels are not offered (MLX serves every product).
    pub(super) fn sgemm_function() -> Option<Sgemm> {
        None
    }

    pub(super) fn set_threads(_threads: usize) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_blas_libraries_of_a_maps_file_are_listed_once_each_and_nothing_else() {
        let maps = "\
7f00-7f10 r-xp 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libopenblas.so.0
7f10-7f20 r--p 00010000 08:01 1 /usr/lib/x86_64-linux-gnu/libopenblas.so.0
7f20-7f30 r-xp 00000000 08:01 2 /opt/mlx/lib/liblapack-86b2c207.so.3
7f30-7f40 r-xp 00000000 08:01 3 /usr/lib/libc.so.6
7f40-7f50 rw-p 00000000 00:00 0
7f50-7f60 r-xp 00000000 08:01 4 /blas/not-a-blas-dir/libm.so.6
";
        assert_eq!(
            blas_paths(maps),
            [
                "/opt/mlx/lib/liblapack-86b2c207.so.3",
                "/usr/lib/x86_64-linux-gnu/libopenblas.so.0"
            ]
        );
    }

    #[test]
    fn choices_parse_and_print_back() {
        for choice in [
            BlasChoice::Auto,
            BlasChoice::OpenBlas,
            BlasChoice::Reference,
        ] {
            assert_eq!(choice.to_string().parse::<BlasChoice>().ok(), Some(choice));
        }
        assert_eq!("".parse::<BlasChoice>().ok(), Some(BlasChoice::Auto));
        assert!(matches!(
            "mkl".parse::<BlasChoice>(),
            Err(BlasError::Unknown(s)) if s == "mkl"
        ));
    }

    #[test]
    fn an_active_blas_satisfies_auto_and_itself_only() {
        assert!(ActiveBlas::OpenBlas.satisfies(BlasChoice::Auto));
        assert!(ActiveBlas::OpenBlas.satisfies(BlasChoice::OpenBlas));
        assert!(!ActiveBlas::OpenBlas.satisfies(BlasChoice::Reference));
        assert!(!ActiveBlas::Reference.satisfies(BlasChoice::OpenBlas));
    }
}
