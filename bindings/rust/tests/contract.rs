//! Gradient contracts and what `finish` finds against them, on a real candle
//! model whose norm layer gets no gradient, judged by candle-graph.
mod common;

use candle_trace::*;
use common::*;

#[test]
fn a_prefix_naming_no_family_is_refused_at_open_with_its_status_and_message() {
    let dir = fresh_dir("contract-typo");
    let path = dir.path().join("t.jsonl");
    let contract =
        GradientContract::from_keys("vb", ["encoder.weight", "head.weight"]).frozen("enocder");
    let run = Run::training("rust::contract", 1, "cpu")
        .capture_contract(CaptureContract::new().gradient_contract(contract));
    let err = Session::open(&path, run).unwrap_err();
    assert_eq!(err.status(), Some(Status::InvalidArgument));
    assert_eq!(err.message(), "candle-trace: gradient contract: prefix \"enocder\" names no family of the manifest; its families are encoder, head");
    assert!(!path.exists(), "refused before the library opened anything");
}

#[test]
fn a_session_without_a_contract_finishes_clean() {
    let dir = fresh_dir("contract-none");
    let path = dir.path().join("t.jsonl");
    let session = Session::open(
        &path,
        Run::inference("rust::contract", 1, "cpu").measured_root(),
    )
    .unwrap();
    let done = session.finish().unwrap();
    assert!(done.is_clean(), "{done}");
    assert_eq!(done, path);
    assert_eq!(
        done.to_string(),
        format!("{}: complete, 0 finding(s)", path.display())
    );
}

#[cfg(feature = "candle")]
mod candle_model {
    use super::*;
    use candle_core::{DType, Device, Module, Tensor};
    use candle_nn::{linear, rms_norm, Linear, Optimizer, RmsNorm, VarBuilder, VarMap, SGD};
    use candle_trace::candle::{backward_step, gradient_contract};

    /// embed → RmsNorm → head. On a contiguous input candle_nn::RmsNorm runs
    /// `ops::rms_norm`, an op with no backward: the loss's gradient stops at
    /// it, so only `head` gets one (the llama2-c finding of issue 18).
    struct Model {
        embed: Linear,
        norm: RmsNorm,
        head: Linear,
    }

    fn model(varmap: &VarMap) -> Model {
        let vb = VarBuilder::from_varmap(varmap, DType::F32, &Device::Cpu);
        Model {
            embed: linear(4, 8, vb.pp("embed")).unwrap(),
            norm: rms_norm(8, 1e-5, vb.pp("norm")).unwrap(),
            head: linear(8, 2, vb.pp("head")).unwrap(),
        }
    }

    /// One captured update under the contract `build` makes of the VarMap's.
    fn capture(
        name: &str,
        build: impl FnOnce(GradientContract) -> GradientContract,
    ) -> (std::path::PathBuf, Completed, tempfile::TempDir) {
        let varmap = VarMap::new();
        let m = model(&varmap);
        let dir = fresh_dir(name);
        let path = dir.path().join("t.jsonl");
        let run = Run::training("rust::contract", 1, "cpu").capture_contract(
            CaptureContract::new().gradient_contract(build(gradient_contract("vb", &varmap))),
        );
        let session = Session::open(&path, run).unwrap();
        let x = Tensor::arange(0f32, 12.0, &Device::Cpu)
            .unwrap()
            .reshape((3, 4))
            .unwrap();
        let mut opt = SGD::new(varmap.all_vars(), 0.01).unwrap();
        {
            let _m = session.measure("train/update").unwrap();
            let h = m.embed.forward(&x).unwrap();
            assert!(h.is_contiguous());
            let loss = m
                .head
                .forward(&m.norm.forward(&h).unwrap())
                .unwrap()
                .sqr()
                .unwrap()
                .mean_all()
                .unwrap();
            let (_, facts) = backward_step(&session, &mut opt, &loss, "vb", &varmap).unwrap();
            let present: Vec<&str> = facts
                .iter()
                .filter(|(_, g)| matches!(g, Gradient::Present(_)))
                .map(|(k, _)| k.as_str())
                .collect();
            assert_eq!(
                present,
                ["head.bias", "head.weight"],
                "the norm stops the gradient"
            );
        }
        let done = session.finish().unwrap();
        (path, done, dir)
    }

    fn described(done: &Completed) -> Vec<(&'static str, Severity, String, Vec<String>)> {
        done.findings()
            .iter()
            .map(|f| {
                (
                    f.check,
                    f.severity,
                    f.family.clone().unwrap(),
                    f.parameters
                        .iter()
                        .map(|p| format!("{} {}", p.key, p.gradient.state_name()))
                        .collect(),
                )
            })
            .collect()
    }

    fn owned(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_default_contract_is_valid_and_notes_the_families_without_a_gradient() {
        let (path, done, _dir) = capture("contract-default", |c| c);
        assert_valid_complete(&path);
        let fams = &lines(&path)[0]["capture_contract"]["gradient_contract"]["families"];
        assert!(
            fams.as_array()
                .unwrap()
                .iter()
                .all(|f| f["expectation"] == "data_conditional" && f["min_present"] == 1),
            "{fams}"
        );
        assert_eq!(done.violations().count(), 0);
        assert_eq!(
            described(&done),
            vec![
                (
                    "gradient_family_without_gradient",
                    Severity::Note,
                    "embed".into(),
                    owned(&["embed.bias missing", "embed.weight missing"])
                ),
                (
                    "gradient_family_without_gradient",
                    Severity::Note,
                    "norm".into(),
                    owned(&["norm.weight missing"])
                ),
            ]
        );
    }

    #[test]
    fn an_all_active_contract_names_the_parameters_candle_graph_fails() {
        let (path, done, _dir) = capture("contract-active", GradientContract::all_active);
        assert_eq!(
            described(&done),
            vec![
                (
                    "gradient_active_family_below_minimum",
                    Severity::Violation,
                    "embed".into(),
                    owned(&["embed.bias missing", "embed.weight missing"])
                ),
                (
                    "gradient_active_family_below_minimum",
                    Severity::Violation,
                    "norm".into(),
                    owned(&["norm.weight missing"])
                ),
            ]
        );
        assert_eq!(
            done.findings()[1].message,
            "family norm is declared active (min_present 1) but 0 of its 1 parameters got a gradient; without one: norm.weight (missing)"
        );
        // The trace is complete; candle-graph reports the same families as errors.
        assert_eq!(lines(&path).last().unwrap()["outcome"], "complete");
        let (valid, summary, _) = common::summary(&path, true);
        assert!(!valid, "--require-valid refuses it");
        let errors: Vec<String> = summary["health"]["issues"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["severity"] == "error")
            .map(|i| {
                format!(
                    "{} {}",
                    i["code"].as_str().unwrap_or("?"),
                    i["message"].as_str().unwrap_or("?")
                )
            })
            .collect();
        assert_eq!(
            errors,
            [
                "gradient_active_family_below_minimum active gradient family \"embed\" has 0 present gradients; requires at least 2",
                "gradient_active_family_below_minimum active gradient family \"norm\" has 0 present gradients; requires at least 1",
            ]
        );
    }

    #[test]
    fn declared_families_are_quiet_and_the_trace_stays_valid() {
        let (path, done, _dir) = capture("contract-declared", |c| {
            c.active("head").frozen("embed").data_conditional("norm")
        });
        assert_valid_complete(&path);
        assert!(done.is_clean(), "{done}");
    }

    #[test]
    fn open_json_checks_the_contract_it_carries() {
        let varmap = VarMap::new();
        let _m = model(&varmap);
        let dir = fresh_dir("contract-json");
        let path = dir.path().join("t.jsonl");
        let run = Run::training("rust::contract", 1, "cpu")
            .measured_root()
            .capture_contract(
                CaptureContract::new()
                    .gradient_contract(gradient_contract("vb", &varmap).frozen("norm")),
            );
        let session = Session::open_json(&path, &run.to_json(), false).unwrap();
        for key in ["embed.bias", "embed.weight", "head.bias", "head.weight"] {
            session.gradient("vb", key, Gradient::Present(1.0)).unwrap();
        }
        session
            .gradient("vb", "norm.weight", Gradient::Zero)
            .unwrap();
        let done = session.finish().unwrap();
        let f = done.findings();
        assert_eq!(f.len(), 1, "{done}");
        assert_eq!(
            (f[0].check, f[0].message.as_str()),
            (
                "gradient_inactive_family_leakage",
                "family norm is declared inactive (frozen) but got gradients: norm.weight (zero)"
            )
        );
    }
}
