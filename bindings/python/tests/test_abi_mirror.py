"""The ctypes declarations mirror include/candle_trace.h exactly: struct fields (names,
types, order), enum values, flags and the ABI version are parsed from the header and
compared, so the two cannot drift apart."""

from __future__ import annotations

import ctypes
import re

from conftest import REPO

from candle_trace import _lib

HEADER = (REPO / "include" / "candle_trace.h").read_text()
# Strip comments so field lines parse cleanly.
CODE = re.sub(r"/\*.*?\*/", "", HEADER, flags=re.S)
CODE = re.sub(r"//[^\n]*", "", CODE)

C_TYPES = {
    "uint32_t": ctypes.c_uint32, "int32_t": ctypes.c_int32, "uint64_t": ctypes.c_uint64,
    "int64_t": ctypes.c_int64, "size_t": ctypes.c_size_t, "double": ctypes.c_double,
}


def header_structs() -> dict:
    out = {}
    for m in re.finditer(r"typedef struct (\w+) \{(.*?)\} (\w+);", CODE, re.S):
        fields = []
        for decl in m.group(2).split(";"):
            decl = " ".join(decl.split())
            if decl:
                ctype, name = decl.rsplit(" ", 1)
                while name.startswith("*"):
                    ctype, name = ctype + " *", name[1:]
                fields.append((name, ctype.replace(" *", "*").replace("* ", "*")))
        out[m.group(3)] = fields
    return out


def header_enums() -> dict:
    out = {}
    for m in re.finditer(r"typedef enum (\w+) \{(.*?)\} (\w+);", CODE, re.S):
        vals = {}
        for item in m.group(2).split(","):
            item = item.strip()
            if item:
                k, v = item.split("=")
                vals[k.strip()] = int(v)
        out[m.group(3)] = vals
    return out


def ctypes_of(ctype: str, enums: dict):
    """The ctypes type a header field type must be declared as."""
    ctype = ctype.strip()
    if ctype in ("const char*", "char*"):
        return ctypes.c_char_p
    if ctype == "const char*const*":
        return ctypes.POINTER(ctypes.c_char_p)
    if ctype.endswith("*"):
        base = ctype[:-1].replace("const ", "").strip()
        return ctypes.POINTER(C_TYPES[base])
    if ctype in enums:
        return ctypes.c_int
    return C_TYPES[ctype]


def test_structs_match_header():
    enums = header_enums()
    structs = header_structs()
    assert set(structs) == set(_lib.STRUCTS), "a struct was added or removed in the header"
    for cname, fields in structs.items():
        py = _lib.STRUCTS[cname]
        assert [f for f, _ in py._fields_] == [f for f, _ in fields], cname
        for (fname, ctype), (_, pytype) in zip(fields, py._fields_):
            assert pytype == ctypes_of(ctype, enums), f"{cname}.{fname}: {ctype} vs {pytype}"


def test_enums_match_header():
    enums = header_enums()
    assert set(enums) == set(_lib.ENUMS)
    for cname, values in enums.items():
        assert {m.name: int(m) for m in _lib.ENUMS[cname]} == values, cname


def test_defines_match_header():
    defines = {m.group(1): m.group(2) for m in
               re.finditer(r"#define (CT_\w+)\s+(\S.*?)\s*$", CODE, re.M)}
    assert int(defines.pop("CT_ABI_VERSION")) == _lib.CT_ABI_VERSION
    assert int(defines.pop("CT_DEFAULT_FLUSH_INTERVAL_MS")) == _lib.CT_DEFAULT_FLUSH_INTERVAL_MS
    for name, expr in defines.items():
        m = re.fullmatch(r"\(1u << (\d+)\)", expr)
        assert m, f"{name}: unexpected define {expr}"
        assert getattr(_lib, name) == 1 << int(m.group(1)), name


def test_every_function_declared():
    names = set(re.findall(r"^\w[\w *]*?\b(ct_\w+)\(", CODE, re.M))
    assert names == set(_lib.PROTOTYPES)
    lib = _lib.load()
    assert lib.c.ct_abi_version() == _lib.CT_ABI_VERSION


def test_observer_cpp_structs_match_the_header():
    """candle_trace/torch/_observer.cpp declares the records it writes (ct_op, ct_memory)
    itself, to build without the header: same fields, same order. (Enums declared as
    ct_* in the header are plain int there, which has the same size.)"""
    src = (REPO / "bindings" / "python" / "candle_trace" / "torch" / "_observer.cpp").read_text()
    src = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
    src = re.sub(r"//[^\n]*", "", src)
    header = header_structs()
    seen = 0
    for m in re.finditer(r"typedef struct (\w+) \{(.*?)\} (\w+);", src, re.S):
        names = [" ".join(d.split()).rsplit(" ", 1)[1].lstrip("*")
                 for d in m.group(2).split(";") if d.strip()]
        assert names == [n for n, _ in header[m.group(3)]], m.group(3)
        seen += 1
    assert seen == 2
