//! Helpers shared by the integration tests.
#![allow(dead_code)]
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The reference reader: $CANDLE_GRAPH, else <repo>/build/tools/bin/candle-graph
/// (`make tools` installs it).
pub fn candle_graph() -> PathBuf {
    if let Some(p) = std::env::var_os("CANDLE_GRAPH").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../build/tools/bin/candle-graph");
    assert!(
        p.is_file(),
        "candle-graph not found at {} (run `make tools` in the repo root or set CANDLE_GRAPH)",
        p.display()
    );
    p
}

/// A fresh folder for one test's trace.
pub fn fresh_dir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("ct-rust-{name}-"))
        .tempdir()
        .unwrap()
}

/// Copies the trace alone into a fresh folder and runs
/// `candle-graph summary trace.jsonl [--require-valid]` there. Returns the
/// exit success and the parsed summary (Null when stdout is not JSON).
pub fn summary(trace: &Path, require_valid: bool) -> (bool, Value, String) {
    let dir = fresh_dir("judge");
    std::fs::copy(trace, dir.path().join("trace.jsonl")).unwrap();
    let mut cmd = Command::new(candle_graph());
    cmd.current_dir(dir.path()).args(["summary", "trace.jsonl"]);
    if require_valid {
        cmd.arg("--require-valid");
    }
    let out = cmd.output().expect("run candle-graph");
    let json = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (
        out.status.success(),
        json,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Asserts the trace is structurally valid and complete (`--require-valid` exits 0).
pub fn assert_valid_complete(trace: &Path) -> Value {
    let (ok, json, stderr) = summary(trace, true);
    assert!(
        ok,
        "candle-graph --require-valid refused {}: {stderr}\nhealth: {}",
        trace.display(),
        json["health"]
    );
    assert_eq!(json["health"]["structurally_valid"], Value::Bool(true));
    assert_eq!(json["health"]["capture_complete"], Value::Bool(true));
    json
}

/// The trace's lines, parsed.
pub fn lines(trace: &Path) -> Vec<Value> {
    std::fs::read_to_string(trace)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Lines of one kind.
pub fn of_kind<'a>(lines: &'a [Value], kind: &str) -> Vec<&'a Value> {
    lines.iter().filter(|l| l["kind"] == kind).collect()
}

/// The span_start line named `name` (the only one).
pub fn span_named<'a>(lines: &'a [Value], name: &str) -> &'a Value {
    let v: Vec<_> = lines
        .iter()
        .filter(|l| l["kind"] == "span_start" && l["name"] == name)
        .collect();
    assert_eq!(v.len(), 1, "spans named {name}: {v:?}");
    v[0]
}
