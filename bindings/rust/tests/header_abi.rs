//! The FFI module cannot drift from include/candle_trace.h: this test parses
//! the header (structs, enums, #defines, functions), compiles a C probe of it
//! with `cc` (or $CC) that prints every size, alignment, offset and value the
//! C compiler gives, and compares all of it with the tables `ffi` generates
//! from its own declarations.
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use candle_trace::ffi;

fn header_path() -> PathBuf {
    PathBuf::from(env!("CANDLE_TRACE_HEADER"))
}

/// Removes /* */ and // comments.
fn strip_comments(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let b = src.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && i + 1 < b.len() && b[i + 1] == b'*' {
            i += 2;
            while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                i += 1;
            }
            i += 2;
            out.push(' ');
        } else if b[i] == b'/' && i + 1 < b.len() && b[i + 1] == b'/' {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

fn last_ident(decl: &str) -> String {
    let decl = decl.split('[').next().unwrap();
    let ident: String = decl
        .chars()
        .rev()
        .skip_while(|c| !(c.is_alphanumeric() || *c == '_'))
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    ident.chars().rev().collect()
}

#[derive(Debug, Default)]
struct Header {
    /// struct name -> field names in order
    structs: Vec<(String, Vec<String>)>,
    /// enum type -> member names (values come from the probe)
    enums: Vec<(String, Vec<String>)>,
    defines: Vec<String>,
    /// function name -> parameter names
    functions: Vec<(String, Vec<String>)>,
    typedefs: Vec<String>,
}

fn parse_header(src: &str) -> Header {
    let mut h = Header::default();
    // #defines with a value (the include guard has none).
    for line in src.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("#define") {
            let mut parts = rest.split_whitespace();
            let name = parts.next().unwrap().to_string();
            if parts.next().is_some() {
                h.defines.push(name);
            }
        }
    }
    let code = strip_comments(src);
    let code: String = code
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    let mut rest = code.as_str();
    while let Some(pos) = rest.find("typedef") {
        rest = &rest[pos + "typedef".len()..];
        let head = rest.trim_start();
        if let Some(after) = head
            .strip_prefix("enum")
            .or_else(|| head.strip_prefix("struct"))
        {
            let is_enum = head.starts_with("enum");
            let open = after.find('{').unwrap();
            let name = after[..open].trim().to_string();
            let close = after.find('}').unwrap();
            let body = &after[open + 1..close];
            if is_enum {
                let members = body
                    .split(',')
                    .map(|m| m.split('=').next().unwrap().trim().to_string())
                    .filter(|m| !m.is_empty())
                    .collect();
                h.enums.push((name, members));
            } else {
                let fields = body
                    .split(';')
                    .map(|f| f.trim())
                    .filter(|f| !f.is_empty())
                    .map(last_ident)
                    .collect();
                h.structs.push((name, fields));
            }
            rest = &after[close..];
        } else {
            let end = head.find(';').unwrap();
            h.typedefs.push(last_ident(&head[..end]));
        }
    }
    // Function prototypes: `... ct_name(params);` at top level.
    let flat = code.replace('\n', " ");
    let mut i = 0;
    while let Some(p) = flat[i..].find("ct_") {
        let start = i + p;
        i = start + 3;
        if start > 0 {
            let prev = flat.as_bytes()[start - 1];
            if prev.is_ascii_alphanumeric() || prev == b'_' {
                continue;
            }
        }
        let name: String = flat[start..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let after = flat[start + name.len()..].trim_start();
        if !after.starts_with('(') {
            continue;
        }
        let close = after.find(')').unwrap();
        if !after[close + 1..].trim_start().starts_with(';') {
            continue;
        }
        let params = &after[1..close];
        let names = if params.trim() == "void" {
            vec![]
        } else {
            params.split(',').map(last_ident).collect()
        };
        if !h.functions.iter().any(|(n, _)| *n == name) {
            h.functions.push((name, names));
        }
    }
    h
}

/// Compiles and runs a C probe printing `key value` lines.
fn probe(h: &Header) -> BTreeMap<String, i64> {
    let header = header_path();
    let mut c = String::from("#include <stdio.h>\n#include <stddef.h>\n#include <stdalign.h>\n#include \"candle_trace.h\"\n#define P(k, v) printf(\"%s %lld\\n\", k, (long long)(v))\nint main(void) {\n");
    for (s, fields) in &h.structs {
        c += &format!("P(\"sizeof {s}\", sizeof({s}));\nP(\"alignof {s}\", alignof({s}));\n");
        for f in fields {
            c += &format!("P(\"offsetof {s}.{f}\", offsetof({s}, {f}));\nP(\"sizeof {s}.{f}\", sizeof((({s} *)0)->{f}));\n");
        }
    }
    for (e, members) in &h.enums {
        c += &format!("P(\"sizeof {e}\", sizeof({e}));\n");
        for m in members {
            c += &format!("P(\"value {m}\", {m});\n");
        }
    }
    for d in &h.defines {
        c += &format!("P(\"value {d}\", {d});\n");
    }
    for t in &h.typedefs {
        c += &format!("P(\"sizeof {t}\", sizeof({t}));\n");
    }
    c += "return 0;\n}\n";
    let dir = std::env::temp_dir().join(format!("candle-trace-abi-probe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("probe.c");
    let exe = dir.join("probe");
    std::fs::write(&src, c).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Werror", "-I"])
        .arg(header.parent().unwrap())
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cc}: {e}"));
    assert!(
        out.status.success(),
        "probe did not compile:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().unwrap();
    assert!(run.status.success());
    let _ = std::fs::remove_dir_all(&dir);
    String::from_utf8(run.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect()
}

#[test]
fn ffi_matches_header() {
    let src = std::fs::read_to_string(header_path()).unwrap();
    let h = parse_header(&src);
    assert!(
        h.structs.len() >= 6 && h.enums.len() >= 6 && h.functions.len() >= 20,
        "parser found too little: {h:#?}"
    );
    let c = probe(&h);
    let mut problems = Vec::new();

    // Structs: same set, same fields in the same order, same layout.
    let header_structs: Vec<&str> = h.structs.iter().map(|(n, _)| n.as_str()).collect();
    let rust_structs: Vec<&str> = ffi::STRUCTS.iter().map(|s| s.name).collect();
    if header_structs != rust_structs {
        problems.push(format!(
            "structs: header {header_structs:?}, ffi {rust_structs:?}"
        ));
    }
    for (name, fields) in &h.structs {
        let Some(rs) = ffi::STRUCTS.iter().find(|s| s.name == name) else {
            continue;
        };
        let rfields: Vec<&str> = rs.fields.iter().map(|f| f.name).collect();
        if *fields != rfields {
            problems.push(format!(
                "{name}: header fields {fields:?}, ffi fields {rfields:?}"
            ));
            continue;
        }
        for (k, r) in [("sizeof", rs.size), ("alignof", rs.align)] {
            let cv = c[&format!("{k} {name}")];
            if cv != r as i64 {
                problems.push(format!("{k}({name}): C {cv}, Rust {r}"));
            }
        }
        for f in rs.fields {
            for (k, r) in [("offsetof", f.offset), ("sizeof", f.size)] {
                let cv = c[&format!("{k} {name}.{}", f.name)];
                if cv != r as i64 {
                    problems.push(format!("{k}({name}.{}): C {cv}, Rust {r}", f.name));
                }
            }
        }
    }

    // Enums and #defines: same names, same values; enums are 4 bytes (u32 here).
    let mut header_consts: Vec<(String, String)> = Vec::new();
    for (e, members) in &h.enums {
        if c[&format!("sizeof {e}")] != 4 {
            problems.push(format!(
                "sizeof({e}) is {}, ffi declares it u32",
                c[&format!("sizeof {e}")]
            ));
        }
        for m in members {
            header_consts.push((m.clone(), e.clone()));
        }
    }
    for d in &h.defines {
        header_consts.push((d.clone(), "#define".into()));
    }
    for (name, group) in &header_consts {
        match ffi::CONSTANTS.iter().find(|k| k.name == name) {
            None => problems.push(format!("{name} ({group}) is missing from ffi")),
            Some(k) => {
                if k.group != group {
                    problems.push(format!(
                        "{name}: header group {group}, ffi group {}",
                        k.group
                    ));
                }
                let cv = c[&format!("value {name}")];
                if cv != k.value {
                    problems.push(format!("{name}: C {cv}, Rust {}", k.value));
                }
            }
        }
    }
    for k in ffi::CONSTANTS {
        if !header_consts.iter().any(|(n, _)| n == k.name) {
            problems.push(format!("{} is in ffi but not in the header", k.name));
        }
    }

    // Scalar typedefs.
    for (t, size) in [("ct_session", 8), ("ct_span", 8)] {
        if c.get(&format!("sizeof {t}")) != Some(&size) {
            problems.push(format!(
                "sizeof({t}) is {:?}, ffi declares u64",
                c.get(&format!("sizeof {t}"))
            ));
        }
    }

    // Functions: same set, same parameter names in the same order.
    let mut header_fns = h.functions.clone();
    header_fns.sort();
    let mut rust_fns: Vec<(String, Vec<String>)> = ffi::FUNCTIONS
        .iter()
        .map(|f| {
            (
                f.name.to_string(),
                f.params.iter().map(|p| p.to_string()).collect(),
            )
        })
        .collect();
    rust_fns.sort();
    for (name, params) in &header_fns {
        match rust_fns.iter().find(|(n, _)| n == name) {
            None => problems.push(format!("function {name} is missing from ffi")),
            Some((_, rp)) if rp != params => problems.push(format!(
                "{name}: header params {params:?}, ffi params {rp:?}"
            )),
            _ => {}
        }
    }
    for (name, _) in &rust_fns {
        if !header_fns.iter().any(|(n, _)| n == name) {
            problems.push(format!("function {name} is in ffi but not in the header"));
        }
    }

    assert!(
        problems.is_empty(),
        "ffi.rs and include/candle_trace.h differ:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn abi_version_of_loaded_library() {
    candle_trace::check_abi().expect("the loaded library's ABI version is the binding's");
    assert!(!candle_trace::library_version().is_empty());
}
