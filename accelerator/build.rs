//! Link arguments for every binary this package links (tests, benches, bins): a dependency's own
//! link arguments never reach the final binary.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_MLX_LIB_DIR");
    // What the sidecar's model fingerprint names as its backend (answers differ across them).
    for (dep, env) in [
        ("DEP_MLX_BACKEND", "HUNCH_BUILT_MLX_BACKEND"),
        ("DEP_MLX_VERSION", "HUNCH_BUILT_MLX_VERSION"),
    ] {
        println!("cargo:rerun-if-env-changed={dep}");
        if let Ok(value) = std::env::var(dep) {
            println!("cargo:rustc-env={env}={value}");
        }
    }
    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if target_os == "linux" {
        // `hunch_accelerator::blas` defines MLX's BLAS entry points and routes them to the BLAS
        // chosen at start-up (OpenBLAS by default). They must be in the binary's dynamic symbol
        // table so that libmlx's calls find them before the wheel's own BLAS.
        for symbol in ["cblas_sgemm", "cblas_dgemm", "cblas_cgemm"] {
            println!("cargo:rustc-link-arg=-Wl,--export-dynamic-symbol={symbol}");
        }
    }
    println!("cargo:rerun-if-env-changed=DEP_MLX_BACKEND");
    if std::env::var("DEP_MLX_BACKEND").is_ok_and(|b| b.starts_with("cuda")) {
        // The CUDA wheel's libmlx needs the CUDA runtime, cuBLAS, cuDNN, NCCL and the driver,
        // which the GPU machine provides at run time. Linking needs none of them: leave their
        // symbols to the run-time loader (docs/mlx-on-linux.md, "Building for CUDA").
        println!("cargo:rustc-link-arg=-Wl,--allow-shlib-undefined");
    }
    if let Ok(dir) = std::env::var("DEP_MLX_LIB_DIR") {
        if target_os == "macos" {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        } else {
            // --enable-new-dtags would write RUNPATH, which does not apply to libmlx's own
            // dependencies; plain RPATH is what we want, and libmlx finds its BLAS by $ORIGIN.
            println!("cargo:rustc-link-arg=-Wl,--disable-new-dtags,-rpath,{dir}");
        }
    }
}
