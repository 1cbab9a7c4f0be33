//! Puts the directory of `libmlx` on the rpath of every binary this package links (tests,
//! benches, bins): a dependency's own link arguments never reach the final binary.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_MLX_LIB_DIR");
    // What the sidecar's model fingerprint names as its backend (answers differ across them).
    for (dep, env) in [
        ("DEP_MLX_BACKEND", "HUNCH_BUILT_MLX_BACKEND"),
        ("DEP_MLX_VERSION", "HUNCH_BUILT_MLX_VERSION"),
        ("DEP_MLX_OPENBLAS", "HUNCH_BUILT_OPENBLAS"),
    ] {
        println!("cargo:rerun-if-env-changed={dep}");
        if let Ok(value) = std::env::var(dep) {
            println!("cargo:rustc-env={env}={value}");
        }
    }
    println!("cargo:rerun-if-env-changed=DEP_MLX_OPENBLAS");
    // With HUNCH_OPENBLAS set, mlx-sys exports the library: list it as a direct dependency of
    // every binary (even though the binary references none of its symbols, hence
    // --no-as-needed), so MLX's BLAS calls resolve to it rather than the wheel's reference BLAS.
    if let Ok(openblas) = std::env::var("DEP_MLX_OPENBLAS") {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
        println!("cargo:rustc-link-arg={openblas}");
        println!("cargo:rustc-link-arg=-Wl,--as-needed");
    }
    if let Ok(dir) = std::env::var("DEP_MLX_LIB_DIR") {
        if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("macos") {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        } else {
            // --enable-new-dtags would write RUNPATH, which does not apply to libmlx's own
            // dependencies; plain RPATH is what we want, and libmlx finds its BLAS by $ORIGIN.
            println!("cargo:rustc-link-arg=-Wl,--disable-new-dtags,-rpath,{dir}");
        }
    }
}
