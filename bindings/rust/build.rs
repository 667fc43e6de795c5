//! Finds or builds libcandle_trace and links it into this crate.
//!
//! In this order:
//!
//! 1. `CANDLE_TRACE_LIB_DIR`: a folder holding `libcandle_trace.a` (linked
//!    statically; `make archive` in the repository makes `build/libcandle_trace.a`)
//!    or else `libcandle_trace.so` (linked dynamically: a dependent's binary then
//!    needs that folder on its rpath or `LD_LIBRARY_PATH`, which cargo cannot
//!    hand on from here; this crate's own tests, examples and benches get the
//!    rpath).
//! 2. Else the repository this crate sits in (two levels up: `go.mod`,
//!    `cmd/libtrace`): `go build -buildmode=c-archive` into `OUT_DIR`, linked
//!    statically. Go's build cache makes a rebuild with unchanged sources take
//!    about a second.
//! 3. Else an error saying what is missing.
//!
//! Static is the default because it is the only way a dependent crate's binary
//! runs without an rpath or environment: link-search paths and libraries reach
//! the final link of every dependent, link arguments (an rpath) do not. The Go
//! runtime inside the archive needs libpthread, libdl and libm, which are
//! linked with it. The shared library's linker version script (which hides
//! every symbol but `ct_*`) has no static counterpart; it is not needed here, as
//! an executable exports none of its symbols (see README.md).
//!
//! Dependents' build scripts get the folder as `DEP_CANDLE_TRACE_LIB_DIR` and
//! the link kind (`static` or `dylib`) as `DEP_CANDLE_TRACE_LINK` (this crate
//! declares `links = "candle_trace"`).
use std::env;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

const ARCHIVE_FILE: &str = "libcandle_trace.a";
const SHARED_FILE: &str = "libcandle_trace.so";
/// The Go packages and files the library is built from (for rerun-if-changed).
const GO_INPUTS: &[&str] = &["go.mod", "go.sum", "cmd/libtrace", "internal", "include"];

/// Why the library could not be found or built; printed by cargo as the build
/// script's error.
struct BuildError(String);

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

// `main` returning Err prints the Debug form: make that the plain message.
impl fmt::Debug for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How the library is linked.
enum Link {
    Static,
    Dynamic,
}

fn main() -> Result<(), BuildError> {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=CANDLE_TRACE_LIB_DIR");
    println!("cargo:rerun-if-env-changed=GO");

    let manifest =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let repo = manifest.join("../..");

    let (dir, link) = match env::var_os("CANDLE_TRACE_LIB_DIR") {
        Some(d) if !d.is_empty() => from_lib_dir(PathBuf::from(d))?,
        _ => {
            let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
            build_archive(&repo, &out)?;
            (out, Link::Static)
        }
    };
    let dir = dir.canonicalize().unwrap_or(dir);

    println!("cargo:rustc-link-search=native={}", dir.display());
    match link {
        Link::Static => {
            println!("cargo:rustc-link-lib=static=candle_trace");
            // What the Go runtime in the archive calls (threads, dlopen of NVML and
            // libcupti, math); glibc >= 2.34 has the first two in libc itself.
            for lib in ["pthread", "dl", "m"] {
                println!("cargo:rustc-link-lib=dylib={lib}");
            }
            println!("cargo:link=static");
        }
        Link::Dynamic => {
            println!("cargo:rustc-link-lib=dylib=candle_trace");
            // Tests, examples and benches of this package find the library where
            // it was linked from; dependents' binaries do not get this.
            println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
            println!("cargo:link=dylib");
        }
    }
    // For dependents' build scripts: DEP_CANDLE_TRACE_LIB_DIR.
    println!("cargo:lib_dir={}", dir.display());
    // The header the ABI test checks against.
    let header = repo.join("include/candle_trace.h");
    println!(
        "cargo:rustc-env=CANDLE_TRACE_HEADER={}",
        header.canonicalize().unwrap_or(header).display()
    );
    Ok(())
}

/// The library in `CANDLE_TRACE_LIB_DIR`: the archive if there is one, else the
/// shared library.
fn from_lib_dir(dir: PathBuf) -> Result<(PathBuf, Link), BuildError> {
    println!(
        "cargo:rerun-if-changed={}",
        dir.join(ARCHIVE_FILE).display()
    );
    println!("cargo:rerun-if-changed={}", dir.join(SHARED_FILE).display());
    if dir.join(ARCHIVE_FILE).is_file() {
        Ok((dir, Link::Static))
    } else if dir.join(SHARED_FILE).is_file() {
        Ok((dir, Link::Dynamic))
    } else {
        Err(BuildError(format!(
            "candle-trace: CANDLE_TRACE_LIB_DIR={} holds neither {ARCHIVE_FILE} nor {SHARED_FILE} \
             (make archive or make lib in the candle-trace repository builds them into build/)",
            dir.display()
        )))
    }
}

/// `go build -buildmode=c-archive` of the repository's cmd/libtrace into `out`.
fn build_archive(repo: &Path, out: &Path) -> Result<(), BuildError> {
    let go_mod = repo.join("go.mod");
    if !go_mod.is_file() || !repo.join("cmd/libtrace").is_dir() {
        return Err(BuildError(format!(
            "candle-trace: no library to link: CANDLE_TRACE_LIB_DIR is not set and {} is not \
             the candle-trace repository (no go.mod and cmd/libtrace there) to build it from. \
             Build this crate from a checkout of the repository (with Go installed), or set \
             CANDLE_TRACE_LIB_DIR to a folder holding {ARCHIVE_FILE} or {SHARED_FILE}",
            repo.display()
        )));
    }
    for input in GO_INPUTS {
        println!("cargo:rerun-if-changed={}", repo.join(input).display());
    }
    let need = required_go_version(&go_mod);
    let go = env::var("GO").unwrap_or_else(|_| "go".into());
    let version = match Command::new(&go).args(["env", "GOVERSION"]).output() {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
        _ => {
            return Err(BuildError(format!(
                "go not found: building libcandle_trace needs Go >= {need} (https://go.dev/dl; \
                 or set GO to its path), or set CANDLE_TRACE_LIB_DIR to a folder holding \
                 {ARCHIVE_FILE} or {SHARED_FILE}"
            )))
        }
    };
    if version_numbers(&version) < version_numbers(&need) {
        return Err(BuildError(format!(
            "{go} is {version}: building libcandle_trace needs Go >= {need} (https://go.dev/dl)"
        )));
    }
    let archive = out.join(ARCHIVE_FILE);
    let mut cmd = Command::new(&go);
    cmd.args(["build", "-buildmode=c-archive", "-o"])
        .arg(&archive)
        .arg("./cmd/libtrace")
        .current_dir(repo)
        .env("CGO_ENABLED", "1");
    // The Makefile's flags: the same cache entries as `make lib`, and go-nvml's
    // deprecation warnings (theirs) left out.
    if env::var_os("CGO_CFLAGS").is_none() {
        cmd.env("CGO_CFLAGS", "-O2 -g -Wno-deprecated-declarations");
    }
    let output = cmd
        .output()
        .map_err(|e| BuildError(format!("candle-trace: could not run {go}: {e}")))?;
    if !output.status.success() || !archive.is_file() {
        return Err(BuildError(format!(
            "candle-trace: `{go} build -buildmode=c-archive -o {} ./cmd/libtrace` in {} failed ({}):\n{}",
            archive.display(),
            repo.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    Ok(())
}

/// The version go.mod's `go` line asks for ("1.26").
fn required_go_version(go_mod: &Path) -> String {
    std::fs::read_to_string(go_mod)
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|line| line.strip_prefix("go ").map(|v| v.trim().to_string()))
        })
        .unwrap_or_else(|| "1.26".into())
}

/// Major and minor of "go1.26.8" or "1.26".
fn version_numbers(text: &str) -> Vec<u32> {
    text.trim_start_matches("go")
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .take(2)
        .filter_map(|s| s.parse().ok())
        .collect()
}
