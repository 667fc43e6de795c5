//! candle-transformers' `with_tracing` order, in a process of its own (no
//! subscriber existed before): the model's spans are made when it is built,
//! then the subscriber with the layer is installed, then the spans are
//! entered. They belong to no subscriber, nothing can record them, and
//! `finish` says so instead of returning a quietly empty trace.
#![cfg(feature = "tracing")]
mod common;

use candle_trace::layer::TraceLayer;
use candle_trace::*;
use common::*;
use tracing_subscriber::prelude::*;

/// with_tracing's `Linear`: its span is made with the layer.
struct Linear {
    span: tracing::Span,
}

impl Linear {
    fn new() -> Linear {
        Linear {
            span: tracing::span!(tracing::Level::TRACE, "linear"),
        }
    }
    fn forward(&self) {
        let _enter = self.span.enter();
    }
}

#[test]
fn a_subscriber_installed_after_the_model_is_built_is_a_finding() {
    let dir = fresh_dir("layer-order");
    let model: Vec<Linear> = (0..15).map(|_| Linear::new()).collect(); // 1. built
    let subscriber = tracing_subscriber::registry().with(TraceLayer::current()); // 2. installed
    tracing::subscriber::with_default(subscriber, || {
        let late = dir.path().join("late.jsonl");
        let session = Session::open(&late, Run::training("rust::layer_order", 1, "cpu")).unwrap();
        {
            let _m = session.measure("train/update").unwrap();
            model.iter().for_each(Linear::forward); // 3. entered
        }
        let done = session.finish().unwrap();
        assert_valid_complete(&late);
        let starts = of_kind(&lines(&late), "span_start").len();
        assert_eq!(
            starts, 2,
            "root and measured region only: the model's spans cannot be recorded"
        );
        let checks: Vec<(&str, Severity)> = done
            .findings()
            .iter()
            .map(|f| (f.check, f.severity))
            .collect();
        assert_eq!(checks, [("tracing_layer_recorded_nothing", Severity::Note)]);
        assert!(done.findings()[0]
            .message
            .contains("install the subscriber before building the model"));

        // Built again now that the subscriber is installed: every span is
        // recorded, told apart, and finish has nothing to say.
        let model: Vec<Linear> = (0..15).map(|_| Linear::new()).collect();
        let early = dir.path().join("early.jsonl");
        let session = Session::open(&early, Run::training("rust::layer_order", 1, "cpu")).unwrap();
        {
            let _m = session.measure("train/update").unwrap();
            model.iter().for_each(Linear::forward);
        }
        let done = session.finish().unwrap();
        assert_valid_complete(&early);
        let l = lines(&early);
        let names: Vec<&str> = of_kind(&l, "span_start")
            .iter()
            .skip(2)
            .map(|s| s["name"].as_str().unwrap())
            .collect();
        let want: Vec<String> = (0..15)
            .map(|i| {
                if i == 0 {
                    "linear".to_string()
                } else {
                    format!("linear#{i}")
                }
            })
            .collect();
        assert_eq!(names, want);
        assert!(done.is_clean(), "{done}");
    });
}
