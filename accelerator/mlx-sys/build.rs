//! Builds the mlx-c bindings against a prebuilt MLX taken from MLX's PyPI wheels.
//!
//! Why not upstream's build script: it builds MLX from GitHub with CMake (no network here) and
//! links macOS frameworks unconditionally. See `docs/mlx-on-linux.md` for the whole story.
//!
//! Steps:
//! 1. find the unpacked wheel: `MLX_DIR`, else `<workspace>/.mlx/<backend>/`, else download the
//!    wheel with pip (or take `HUNCH_MLX_WHEEL`) and unpack it there;
//! 2. find mlx-c's sources: `MLX_C_DIR`, else the published `mlx-sys` 0.7.0 crate (which carries
//!    them), downloaded through a throw-away manifest and `cargo metadata`;
//! 3. check that the wheel's MLX is the version mlx-c was written for;
//! 4. generate the bindings with bindgen, as upstream does (first, so that a missing libclang
//!    fails fast);
//! 5. compile mlx-c with `cc` and link `libmlx`.

use std::{
    env, fs,
    path::{Path, PathBuf},
    process::Command,
};

/// The MLX version the mlx-c sources of `mlx-sys` 0.7.0 were written for (their CMake `GIT_TAG`).
/// The pin lives in the file `MLX_VERSION` (read by `scripts/fetch-mlx.sh` too); the crate gets it
/// as `mlx_sys::MLX_VERSION`.
const MLX_VERSION: &str = include_str!("MLX_VERSION").trim_ascii();
/// The published crate that carries those mlx-c sources in `src/mlx-c`.
const MLX_C_CARRIER: &str = "=0.7.0";

/// Which prebuilt MLX to link: one PyPI wheel per backend.
#[derive(Clone, Copy, Debug)]
enum Backend {
    Cpu,
    Cuda12,
    Cuda13,
    Metal,
}

impl Backend {
    fn from_env() -> Backend {
        let target_os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
        match env::var("HUNCH_MLX_BACKEND").ok().as_deref() {
            Some("cpu") => Backend::Cpu,
            Some("cuda12") | Some("cuda-12") => Backend::Cuda12,
            Some("cuda13") | Some("cuda-13") | Some("cuda") => Backend::Cuda13,
            Some("metal") => Backend::Metal,
            Some(other) => fail(&format!(
                "HUNCH_MLX_BACKEND={other} is not known; use cpu, cuda13, cuda12 or metal"
            )),
            None if target_os == "macos" => Backend::Metal,
            None => Backend::Cpu,
        }
    }

    /// Directory name under `<workspace>/.mlx/`.
    fn dir_name(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Cuda12 => "cuda12",
            Backend::Cuda13 => "cuda13",
            Backend::Metal => "metal",
        }
    }

    /// The PyPI distribution holding `libmlx` for this backend.
    fn wheel(self) -> &'static str {
        match self {
            Backend::Cpu => "mlx-cpu",
            Backend::Cuda12 => "mlx-cuda-12",
            Backend::Cuda13 => "mlx-cuda-13",
            Backend::Metal => "mlx-metal",
        }
    }
}

fn fail(message: &str) -> ! {
    // A panic in a build script prints the message under "failed to run custom build command".
    panic!("\n\nmlx-sys: {message}\n\n");
}

fn main() {
    for var in [
        "MLX_DIR",
        "MLX_C_DIR",
        "HUNCH_MLX_BACKEND",
        "HUNCH_MLX_WHEEL",
        "HUNCH_PYTHON",
        "LIBCLANG_PATH",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=MLX_VERSION");
    println!("cargo:rustc-env=MLX_SYS_MLX_VERSION={MLX_VERSION}");
    println!("cargo:rerun-if-changed=shim");

    let backend = Backend::from_env();
    let mlx_root = locate_mlx(backend);
    let include_dir = mlx_root.join("mlx").join("include");
    let lib_dir = mlx_root.join("mlx").join("lib");
    check_mlx_version(&include_dir);

    let mlx_c_root = locate_mlx_c();
    check_mlx_c_tag(&mlx_c_root);

    // Bindings first: a missing libclang then fails in seconds, not after the C++ build.
    generate_bindings(&mlx_c_root);
    compile_mlx_c(&mlx_c_root, &include_dir);
    link_mlx(backend, &lib_dir);

    // Dependents read these as DEP_MLX_LIB_DIR, DEP_MLX_INCLUDE, DEP_MLX_VERSION, DEP_MLX_ROOT; a
    // binary's build script turns DEP_MLX_LIB_DIR into an rpath (a dependency's link args never
    // reach the final binary).
    println!("cargo:lib_dir={}", lib_dir.display());
    println!("cargo:include={}", include_dir.display());
    println!("cargo:root={}", mlx_root.display());
    println!("cargo:version={MLX_VERSION}");
    println!("cargo:backend={}", backend.dir_name());
}

/// The Cargo workspace root: the nearest ancestor whose Cargo.toml has a `[workspace]` table.
fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let mut dir = manifest.as_path();
    while let Some(parent) = dir.parent() {
        let toml = parent.join("Cargo.toml");
        if fs::read_to_string(&toml).is_ok_and(|text| text.contains("[workspace]")) {
            return parent.to_path_buf();
        }
        dir = parent;
    }
    manifest
}

fn locate_mlx(backend: Backend) -> PathBuf {
    if let Some(dir) = env::var_os("MLX_DIR") {
        let dir = PathBuf::from(dir);
        if !dir.join("mlx/include/mlx/mlx.h").is_file() {
            fail(&format!(
                "MLX_DIR={} does not look like an unpacked MLX wheel (no mlx/include/mlx/mlx.h). \
                 Unset it to let the build fetch {}=={MLX_VERSION}, or run scripts/fetch-mlx.sh.",
                dir.display(),
                backend.wheel()
            ));
        }
        return dir;
    }
    let mlx_home = workspace_root().join(".mlx");
    let dir = mlx_home.join(backend.dir_name());
    println!("cargo:rerun-if-changed={}", dir.display());
    if dir.join("mlx/include/mlx/mlx.h").is_file() {
        return dir;
    }
    fetch_wheel(backend, &mlx_home, &dir);
    dir
}

/// Downloads (unless `HUNCH_MLX_WHEEL` names one) and unpacks the backend's wheel into `dest`,
/// keeping the wheel's layout: `libmlx.so` finds its bundled BLAS through `$ORIGIN/../../*.libs`.
fn fetch_wheel(backend: Backend, mlx_home: &Path, dest: &Path) {
    let python = env::var("HUNCH_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let wheel_dir = mlx_home.join("wheels");
    let wheel = match env::var_os("HUNCH_MLX_WHEEL") {
        Some(wheel) => PathBuf::from(wheel),
        None => {
            let prefix = format!("{}-{MLX_VERSION}-", backend.wheel().replace('-', "_"));
            let cached = find_wheel(&wheel_dir, &prefix);
            match cached {
                Some(wheel) => wheel,
                None => {
                    let _ = fs::create_dir_all(&wheel_dir);
                    let spec = format!("{}=={MLX_VERSION}", backend.wheel());
                    let status = Command::new(&python)
                        .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:"])
                        .arg("-d")
                        .arg(&wheel_dir)
                        .arg(&spec)
                        .status();
                    if !matches!(status, Ok(s) if s.success()) {
                        fail(&format!(
                            "could not download {spec} with `{python} -m pip download`. Either \
                             make PyPI reachable, set HUNCH_MLX_WHEEL to a downloaded wheel, or \
                             set MLX_DIR to an unpacked one (scripts/fetch-mlx.sh does this)."
                        ));
                    }
                    find_wheel(&wheel_dir, &prefix).unwrap_or_else(|| {
                        fail(&format!(
                            "pip reported success but no {prefix}*.whl is in {}",
                            wheel_dir.display()
                        ))
                    })
                }
            }
        }
    };
    // Unpack next to the destination and rename, so two builds racing here never see half a tree.
    let staging = mlx_home.join(format!(
        ".unpack-{}-{}",
        backend.dir_name(),
        std::process::id()
    ));
    let _ = fs::remove_dir_all(&staging);
    let status = Command::new(&python)
        .args([
            "-c",
            "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])",
        ])
        .arg(&wheel)
        .arg(&staging)
        .status();
    if !matches!(status, Ok(s) if s.success()) {
        fail(&format!(
            "could not unpack {} with {python}'s zipfile",
            wheel.display()
        ));
    }
    // zipfile drops the executable bits; the shared libraries only need to be readable.
    if fs::rename(&staging, dest).is_err() {
        // Another build won the race; use its tree.
        let _ = fs::remove_dir_all(&staging);
    }
    if !dest.join("mlx/include/mlx/mlx.h").is_file() {
        fail(&format!(
            "{} has no mlx/include/mlx/mlx.h after unpacking {}",
            dest.display(),
            wheel.display()
        ));
    }
}

fn find_wheel(dir: &Path, prefix: &str) -> Option<PathBuf> {
    fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix) && n.ends_with(".whl"))
        })
}

/// Reads MLX_VERSION_{MAJOR,MINOR,PATCH} from the wheel's headers.
fn check_mlx_version(include_dir: &Path) {
    let header = include_dir.join("mlx/version.h");
    let text = fs::read_to_string(&header)
        .unwrap_or_else(|e| fail(&format!("cannot read {}: {e}", header.display())));
    let part = |name: &str| {
        text.lines()
            .find_map(|line| {
                line.trim()
                    .strip_prefix(&format!("#define MLX_VERSION_{name} "))
            })
            .map(|v| v.trim().to_owned())
            .unwrap_or_else(|| "?".to_owned())
    };
    let found = format!("{}.{}.{}", part("MAJOR"), part("MINOR"), part("PATCH"));
    if found != MLX_VERSION {
        fail(&format!(
            "the MLX in {} is version {found}, but the mlx-c sources of mlx-sys 0.7.0 are \
             written for MLX {MLX_VERSION} (later MLX changed the gather_qmm signature). Use the \
             {MLX_VERSION} wheel: remove the directory (or unset MLX_DIR) and rebuild, or run \
             scripts/fetch-mlx.sh.",
            include_dir.display()
        ));
    }
}

fn check_mlx_c_tag(mlx_c_root: &Path) {
    let cmake = fs::read_to_string(mlx_c_root.join("CMakeLists.txt")).unwrap_or_default();
    let tag = cmake
        .lines()
        .find_map(|line| line.trim().strip_prefix("GIT_TAG v"))
        .map(|t| t.trim_end_matches(')').trim().to_owned());
    if tag.as_deref() != Some(MLX_VERSION) {
        fail(&format!(
            "mlx-c in {} pins MLX {}, but this build links MLX {MLX_VERSION}; point MLX_C_DIR at \
             the mlx-c of mlx-sys 0.7.0",
            mlx_c_root.display(),
            tag.as_deref().unwrap_or("(unknown)")
        ));
    }
}

/// Finds the mlx-c sources. The `[patch.crates-io]` that puts this crate in place also stops
/// Cargo from downloading the real `mlx-sys` for the workspace, so a separate one-dependency
/// manifest (never built) asks `cargo metadata` to fetch it and say where it lives.
fn locate_mlx_c() -> PathBuf {
    if let Some(dir) = env::var_os("MLX_C_DIR") {
        return PathBuf::from(dir);
    }
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap_or_default());
    let probe = out_dir.join("mlx-c-carrier");
    let _ = fs::create_dir_all(probe.join("src"));
    let manifest = format!(
        "[package]\nname = \"mlx-c-carrier\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\n\
         [dependencies]\nmlx-sys = \"{MLX_C_CARRIER}\"\n\n# its own workspace: never part of the \
         one being built\n[workspace]\n"
    );
    let written = fs::write(probe.join("Cargo.toml"), manifest)
        .and_then(|_| fs::write(probe.join("src/lib.rs"), ""));
    if let Err(e) = written {
        fail(&format!("cannot write {}: {e}", probe.display()));
    }
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        .args(["metadata", "--format-version", "1"])
        .current_dir(&probe)
        .output();
    let output = match output {
        Ok(o) if o.status.success() => o,
        Ok(o) => fail(&format!(
            "`cargo metadata` could not fetch mlx-sys {MLX_C_CARRIER} (which carries mlx-c): {}\n\
             Make crates.io reachable once, or set MLX_C_DIR to an mlx-c checkout at the tag for \
             MLX {MLX_VERSION}.",
            String::from_utf8_lossy(&o.stderr)
        )),
        Err(e) => fail(&format!("cannot run cargo metadata: {e}")),
    };
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| fail(&format!("cargo metadata printed no JSON: {e}")));
    let manifest_path = metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == "mlx-sys")
        .and_then(|p| p["manifest_path"].as_str())
        .unwrap_or_else(|| fail("cargo metadata did not list mlx-sys"));
    let root = Path::new(manifest_path)
        .parent()
        .unwrap_or(Path::new("."))
        .join("src/mlx-c");
    if !root.join("mlx/c/mlx.h").is_file() {
        fail(&format!("{} holds no mlx-c sources", root.display()));
    }
    root
}

fn compile_mlx_c(mlx_c_root: &Path, include_dir: &Path) {
    let shim = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap_or_default()).join("shim");
    let src_dir = mlx_c_root.join("mlx/c");
    let mut sources: Vec<PathBuf> = fs::read_dir(&src_dir)
        .unwrap_or_else(|e| fail(&format!("cannot list {}: {e}", src_dir.display())))
        .flatten()
        .map(|e| e.path())
        // object.cpp is commented out of mlx-c's own CMakeLists.txt as well.
        .filter(|p| p.extension().is_some_and(|x| x == "cpp"))
        .filter(|p| p.file_name().is_some_and(|n| n != "object.cpp"))
        .collect();
    sources.sort();
    // One translation unit that includes every source (an amalgamation, as SQLite ships): each
    // mlx-c file includes MLX's C++ headers, and parsing them once instead of 26 times cuts the
    // C++ compile from ~40 to ~10 CPU seconds, a part of a fresh machine's first build
    // (docs/benchmarks.md, "First answer"). The sources are pinned (mlx-sys 0.7.0) and share no
    // file-local names, so the single unit compiles to the same functions.
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap_or_else(|_| fail("OUT_DIR is not set")));
    let unity = out_dir.join("mlx_c_all.cpp");
    let text: String = sources
        .iter()
        .map(|p| format!("#include \"{}\"\n", p.display()))
        .collect();
    if fs::read_to_string(&unity).ok().as_deref() != Some(text.as_str()) {
        fs::write(&unity, &text)
            .unwrap_or_else(|e| fail(&format!("cannot write {}: {e}", unity.display())));
    }

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++20")
        .include(mlx_c_root)
        .include(include_dir)
        .flag("-include")
        .flag(shim.join("hunch_mlx_shim.h").to_string_lossy().as_ref())
        .warnings(false)
        .file(&unity)
        // Our own helper over the same private API (graph size, for the benchmarks).
        .file(shim.join("hunch_graph.cpp"));
    // Optimise even in dev builds: these are thin wrappers, and it is a one-off cost.
    build.opt_level(2);
    build.compile("mlxc");
}

fn link_mlx(backend: Backend, lib_dir: &Path) {
    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    println!("cargo:rustc-link-lib=dylib=mlx");
    if matches!(backend, Backend::Metal) {
        // The macOS wheel's libmlx uses Metal, Foundation and Accelerate, as upstream links.
        println!("cargo:rustc-link-lib=c++");
        println!("cargo:rustc-link-lib=framework=Metal");
        println!("cargo:rustc-link-lib=framework=Foundation");
        println!("cargo:rustc-link-lib=framework=Accelerate");
    }
}

fn generate_bindings(mlx_c_root: &Path) {
    let shim = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap_or_default()).join("shim");
    let mut headers: Vec<PathBuf> = fs::read_dir(mlx_c_root.join("mlx/c"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "h"))
        .collect();
    headers.sort();
    let builder = headers.iter().fold(
        bindgen::Builder::default()
            .rust_target(
                "1.73.0"
                    .parse()
                    .unwrap_or_else(|_| fail("bindgen rejects Rust target 1.73.0")),
            )
            .clang_arg(format!("-I{}", mlx_c_root.display()))
            .clang_arg("-include")
            .clang_arg(
                shim.join("hunch_bindgen_shim.h")
                    .to_string_lossy()
                    .into_owned(),
            )
            // Same as upstream: bindgen's `c_ulong` sizes trip rustc's
            // suspicious_runtime_symbol_definitions lint.
            .blocklist_function("malloc")
            .blocklist_function("realloc"),
        |b, h| b.header(h.to_string_lossy()),
    );
    // bindgen panics when it cannot load libclang; turn that into instructions.
    let generated =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || builder.generate()));
    let bindings = match generated {
        Ok(Ok(bindings)) => bindings,
        Ok(Err(e)) => fail(&format!("bindgen failed on the mlx-c headers: {e}")),
        Err(_) => fail(
            "bindgen could not load libclang. Install it (Debian/Ubuntu: \
             `apt-get install libclang-dev`) or set LIBCLANG_PATH to the directory holding \
             libclang.so",
        ),
    };
    let out = PathBuf::from(env::var("OUT_DIR").unwrap_or_default()).join("bindings.rs");
    if let Err(e) = bindings.write_to_file(&out) {
        fail(&format!("cannot write {}: {e}", out.display()));
    }
}
