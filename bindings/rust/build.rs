//! Links libcandle_trace.so.
//!
//! Where from: `CANDLE_TRACE_LIB_DIR` when set, else the repository's `build/`
//! (two levels above this crate). When the library is missing from the
//! repository's `build/`, `make lib` is run in the repository root to build it
//! (Go is needed for that). An rpath to the folder is emitted for this crate's
//! own tests, examples and benches, so they run without LD_LIBRARY_PATH.
//!
//! Crates that depend on this one get the folder as `DEP_CANDLE_TRACE_LIB_DIR`
//! in their build scripts (this crate declares `links = "candle_trace"`); a
//! binary of theirs needs `cargo:rustc-link-arg=-Wl,-rpath,<that folder>` in
//! its build.rs, or LD_LIBRARY_PATH, to find the library at run time.
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const LIB_FILE: &str = "libcandle_trace.so";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=CANDLE_TRACE_LIB_DIR");

    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let repo = manifest.join("../..");

    let dir = match env::var_os("CANDLE_TRACE_LIB_DIR") {
        Some(d) if !d.is_empty() => {
            let d = PathBuf::from(d);
            if !d.join(LIB_FILE).is_file() {
                panic!(
                    "candle-trace: CANDLE_TRACE_LIB_DIR={} holds no {LIB_FILE}",
                    d.display()
                );
            }
            d
        }
        _ => {
            let d = repo.join("build");
            if !d.join(LIB_FILE).is_file() {
                build_with_make(&repo);
            }
            if !d.join(LIB_FILE).is_file() {
                panic!(
                    "candle-trace: {} is missing and `make lib` in {} did not make it; \
                     build it (go build -buildmode=c-shared -o build/{LIB_FILE} ./cmd/libtrace) \
                     or set CANDLE_TRACE_LIB_DIR",
                    d.join(LIB_FILE).display(),
                    repo.display()
                );
            }
            d
        }
    };
    let dir = dir.canonicalize().unwrap_or(dir);

    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-lib=dylib=candle_trace");
    // Tests, examples, benches and binaries of this package find the library
    // where it was linked from.
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    // For dependents' build scripts: DEP_CANDLE_TRACE_LIB_DIR.
    println!("cargo:lib_dir={}", dir.display());
    // The header the ABI test checks against.
    println!(
        "cargo:rustc-env=CANDLE_TRACE_HEADER={}",
        repo.join("include/candle_trace.h").canonicalize().unwrap_or_else(|_| repo.join("include/candle_trace.h")).display()
    );
}

fn build_with_make(repo: &Path) {
    if !repo.join("Makefile").is_file() {
        return;
    }
    println!("cargo:warning=candle-trace: {LIB_FILE} missing; running `make lib` in {}", repo.display());
    match Command::new(env::var("MAKE").unwrap_or_else(|_| "make".into()))
        .arg("lib")
        .current_dir(repo)
        // cargo's jobserver flags are not for make's Go build.
        .env_remove("MAKEFLAGS")
        .env_remove("MFLAGS")
        .env_remove("CARGO_MAKEFLAGS")
        .status()
    {
        Ok(s) if s.success() => {}
        Ok(s) => println!("cargo:warning=candle-trace: `make lib` failed ({s})"),
        Err(e) => println!("cargo:warning=candle-trace: could not run make: {e}"),
    }
}
