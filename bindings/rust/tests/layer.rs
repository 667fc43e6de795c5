//! The tracing bridge: tracing spans become session spans.
#![cfg(feature = "tracing")]
mod common;

use candle_trace::layer::TraceLayer;
use candle_trace::*;
use common::*;
use tracing_subscriber::prelude::*;

#[test]
fn tracing_spans_inside_the_measured_region_become_session_spans() {
    let dir = fresh_dir("layer");
    let path = dir.path().join("t.jsonl");
    let subscriber = tracing_subscriber::registry().with(TraceLayer::current());
    tracing::subscriber::with_default(subscriber, || {
        // Without a current session the layer records nothing.
        {
            let _ignored = tracing::info_span!("before").entered();
        }
        let session = Session::open(&path, Run::training("rust::layer", 1, "cpu")).unwrap();
        {
            let _m = session.measure("update").unwrap();
            let attn = tracing::trace_span!("attn");
            {
                let _a = attn.enter();
                let _mlp = tracing::trace_span!("mlp").entered();
            }
            let _again = attn.enter(); // a second enter is a second session span
        }
        session.finish().unwrap();
    });
    assert_valid_complete(&path);
    let l = lines(&path);
    let starts = of_kind(&l, "span_start");
    assert!(!starts.iter().any(|s| s["name"] == "before"));
    let attn: Vec<_> = starts.iter().filter(|s| s["name"] == "attn").collect();
    assert_eq!(attn.len(), 2);
    let update = span_named(&l, "update");
    let mlp = span_named(&l, "mlp");
    assert_eq!(attn[0]["parent_id"], update["id"]);
    assert_eq!(mlp["parent_id"], attn[0]["id"]);
}

#[test]
fn fixed_session_layer_records_without_a_measured_region_current() {
    let dir = fresh_dir("layer-fixed");
    let path = dir.path().join("t.jsonl");
    let session = Session::open(&path, Run::inference("rust::layer", 1, "cpu").measured_root()).unwrap();
    let subscriber = tracing_subscriber::registry().with(TraceLayer::for_session(&session));
    tracing::subscriber::with_default(subscriber, || {
        let _s = tracing::info_span!("decode").entered();
    });
    session.finish().unwrap();
    assert_valid_complete(&path);
    assert_eq!(span_named(&lines(&path), "decode")["parent_id"], "s1");
}
