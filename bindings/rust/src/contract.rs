//! The gradient contract of a capture, its builders, and the check `finish`
//! makes of the recorded gradients against it.
//!
//! A contract says which gradients the captured update reports (the
//! manifest: every `(root, key)` exactly once) and what each family of
//! parameters is expected to do. candle-graph judges the trace by it.
//!
//! The default ([`GradientContract::from_keys`], `candle::gradient_contract`)
//! claims only what a profiler can know: every parameter is reported once
//! and no gradient is non-finite. Whether a family gets a gradient in one
//! update depends on the model and the data (a layer not called, a branch
//! not taken, an op whose backward candle skips: `candle_nn::RmsNorm` on a
//! contiguous input gets none), so every family defaults to
//! `data_conditional` with `min_present` 1, which candle-graph never fails
//! for absence. What the user knows ("this family must learn", "that one is
//! frozen") is declared with [`GradientContract::all_active`],
//! [`active`](GradientContract::active), [`frozen`](GradientContract::frozen)
//! or [`data_conditional`](GradientContract::data_conditional); a violated
//! claim is a [`Finding`] of `finish`, and candle-graph reports it as the
//! health error it is. A defaulted family that got no gradient at all is a
//! [`Severity::Note`]: allowed, and often the model bug worth seeing.
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::finding::{Finding, ParameterState, Severity};
use crate::session::Gradient;

/// What a gradient family is expected to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Expectation {
    /// At least `min_present` members get a present (finite, non-zero) gradient.
    Active,
    /// No member gets a gradient (frozen); `min_present` is 0.
    Inactive,
    /// Either no member gets a present gradient, or at least `min_present` do.
    DataConditional,
}

impl Expectation {
    /// The trace spelling.
    pub fn name(self) -> &'static str {
        match self {
            Expectation::Active => "active",
            Expectation::Inactive => "inactive",
            Expectation::DataConditional => "data_conditional",
        }
    }
}

/// One expected gradient of a [`GradientContract`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpectedGradient {
    /// The parameter collection, e.g. a `VarMap`'s name.
    pub root: String,
    /// The parameter's key in it, e.g. `fc1.weight`.
    pub key: String,
    /// The family the parameter belongs to.
    pub family: String,
}

/// One family of a [`GradientContract`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GradientFamily {
    /// Its name (members name it in [`ExpectedGradient::family`]).
    pub family: String,
    /// What it is expected to do.
    pub expectation: Expectation,
    /// How many members must get a present gradient (see [`Expectation`]).
    pub min_present: u64,
}

/// The exact, ordered manifest of gradients a capture reports, and its
/// families. The library computes `manifest_sha256` at open.
///
/// ```
/// use candle_trace::{Expectation, GradientContract};
/// let c = GradientContract::from_keys("vb", ["encoder.0.weight", "encoder.0.bias", "norm.weight", "head.weight"])
///     .all_active()             // every parameter must get a gradient ...
///     .frozen("encoder");       // ... but the encoder is frozen
/// assert_eq!(c.expectation_of("encoder.0"), Some((Expectation::Inactive, 0)));
/// assert_eq!(c.expectation_of("head"), Some((Expectation::Active, 1)));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GradientContract {
    /// The manifest, in report order.
    pub expected: Vec<ExpectedGradient>,
    /// Every family of the manifest, declared once.
    pub families: Vec<GradientFamily>,
    /// Families whose expectation the binding chose (no finding claims the
    /// user said so).
    #[serde(skip)]
    defaulted: BTreeSet<String>,
    /// Prefixes given to a builder that matched no family (refused at open).
    #[serde(skip)]
    unmatched: Vec<String>,
}

impl GradientContract {
    /// An empty contract (add members with [`expect`](Self::expect)).
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `(root, key)` to the manifest, as a member of `family`.
    pub fn expect(
        mut self,
        root: impl Into<String>,
        key: impl Into<String>,
        family: impl Into<String>,
    ) -> Self {
        self.expected.push(ExpectedGradient {
            root: root.into(),
            key: key.into(),
            family: family.into(),
        });
        self
    }

    /// Declares a family's expectation, or redeclares it in place.
    pub fn family(
        mut self,
        family: impl Into<String>,
        expectation: Expectation,
        min_present: u64,
    ) -> Self {
        let family = family.into();
        self.defaulted.remove(&family);
        match self.families.iter_mut().find(|f| f.family == family) {
            Some(f) => (f.expectation, f.min_present) = (expectation, min_present),
            None => self.families.push(GradientFamily {
                family,
                expectation,
                min_present,
            }),
        }
        self
    }

    /// Declares every family named by `expected` but not declared yet as
    /// `data_conditional` with `min_present` 1: the default (module docs).
    pub fn with_default_families(mut self) -> Self {
        let mut seen: BTreeSet<String> = self.families.iter().map(|f| f.family.clone()).collect();
        for e in &self.expected {
            if seen.insert(e.family.clone()) {
                self.families.push(GradientFamily {
                    family: e.family.clone(),
                    expectation: Expectation::DataConditional,
                    min_present: 1,
                });
                self.defaulted.insert(e.family.clone());
            }
        }
        self
    }

    /// A contract over `keys` under `root`, in the given order, each in the
    /// family [`family_of`] gives it (`fc1.weight` → `fc1`), every family
    /// with the default expectation (`data_conditional`, `min_present` 1).
    pub fn from_keys<I, K>(root: &str, keys: I) -> Self
    where
        I: IntoIterator<Item = K>,
        K: AsRef<str>,
    {
        let mut c = Self::new();
        for k in keys {
            let k = k.as_ref();
            c = c.expect(root, k, family_of(k));
        }
        c.with_default_families()
    }

    /// Every family `active` with `min_present` = its member count: every
    /// parameter must get a present gradient. Declares families not declared
    /// yet too.
    pub fn all_active(self) -> Self {
        let c = self.with_default_families();
        let names: Vec<String> = c.families.iter().map(|f| f.family.clone()).collect();
        names.into_iter().fold(c, |c, f| {
            let n = c.members(&f);
            c.family(f, Expectation::Active, n)
        })
    }

    /// The families under `prefix` (the family `prefix` itself and every
    /// `prefix.*`: `encoder` covers `encoder.layers.0`, not `encoder2`)
    /// `active` with `min_present` = their member count. A prefix naming no
    /// family of the manifest so far is refused by `Session::open`.
    pub fn active(self, prefix: &str) -> Self {
        self.declare_under(prefix, Expectation::Active)
    }

    /// The families under `prefix` (as in [`active`](Self::active)) frozen:
    /// `inactive`, no member may get a gradient (not even a zero one).
    pub fn frozen(self, prefix: &str) -> Self {
        self.declare_under(prefix, Expectation::Inactive)
    }

    /// The families under `prefix` (as in [`active`](Self::active))
    /// `data_conditional` with `min_present` 1, declared by you: no
    /// [`Severity::Note`] when they get no gradient.
    pub fn data_conditional(self, prefix: &str) -> Self {
        self.declare_under(prefix, Expectation::DataConditional)
    }

    fn declare_under(self, prefix: &str, expectation: Expectation) -> Self {
        let mut c = self.with_default_families();
        let names: Vec<String> = c
            .families
            .iter()
            .filter(|f| under(&f.family, prefix))
            .map(|f| f.family.clone())
            .collect();
        if names.is_empty() {
            c.unmatched.push(prefix.to_string());
            return c;
        }
        for f in names {
            let n = match expectation {
                Expectation::Active => c.members(&f),
                Expectation::Inactive => 0,
                Expectation::DataConditional => 1,
            };
            c = c.family(f, expectation, n);
        }
        c
    }

    /// How many parameters of the manifest are in `family`.
    pub fn members(&self, family: &str) -> u64 {
        self.expected.iter().filter(|e| e.family == family).count() as u64
    }

    /// The declared expectation and `min_present` of `family`.
    pub fn expectation_of(&self, family: &str) -> Option<(Expectation, u64)> {
        self.families
            .iter()
            .find(|f| f.family == family)
            .map(|f| (f.expectation, f.min_present))
    }

    /// Refuses what the builders could not say at once: a prefix that named
    /// no family (a typo would otherwise declare nothing).
    pub(crate) fn check_builders(&self) -> Result<()> {
        if self.unmatched.is_empty() {
            return Ok(());
        }
        let families: BTreeSet<&str> = self.families.iter().map(|f| f.family.as_str()).collect();
        let known: Vec<&str> = families.into_iter().collect();
        Err(Error::invalid(format!(
            "gradient contract: prefix {} names no family of the manifest; its families are {}",
            self.unmatched
                .iter()
                .map(|p| format!("{p:?}"))
                .collect::<Vec<_>>()
                .join(", "),
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        )))
    }

    /// What the recorded gradients (`(root, key)` → fact) break of this
    /// contract, by candle-graph's family rules, one finding per family with
    /// the parameters that explain it; then a note per defaulted family that
    /// got no present gradient. Families in declaration order.
    pub(crate) fn findings(&self, recorded: &BTreeMap<(String, String), Gradient>) -> Vec<Finding> {
        let mut out = Vec::new();
        for fam in &self.families {
            let members: Vec<ParameterState> = self
                .expected
                .iter()
                .filter(|e| e.family == fam.family)
                .filter_map(|e| {
                    recorded
                        .get(&(e.root.clone(), e.key.clone()))
                        .map(|g| ParameterState {
                            root: e.root.clone(),
                            key: e.key.clone(),
                            gradient: *g,
                        })
                })
                .collect();
            let present = members
                .iter()
                .filter(|p| matches!(p.gradient, Gradient::Present(_)))
                .count() as u64;
            let pick = |keep: &dyn Fn(&Gradient) -> bool| {
                members
                    .iter()
                    .filter(|p| keep(&p.gradient))
                    .cloned()
                    .collect::<Vec<_>>()
            };
            let non_finite = pick(&|g| *g == Gradient::NonFinite);
            let any_non_finite = !non_finite.is_empty();
            if any_non_finite {
                let message = format!(
                    "family {}: non-finite gradient in {}",
                    fam.family,
                    list(&non_finite)
                );
                out.push(Finding::gradient(
                    "gradient_family_non_finite",
                    Severity::Violation,
                    fam,
                    message,
                    non_finite,
                ));
            }
            let defaulted = self.defaulted.contains(&fam.family);
            match fam.expectation {
                // Below the minimum: always for active, once attached for conditional.
                Expectation::Active | Expectation::DataConditional
                    if present < fam.min_present
                        && (fam.expectation == Expectation::Active || present > 0) =>
                {
                    let (check, only) = match fam.expectation {
                        Expectation::Active => ("gradient_active_family_below_minimum", ""),
                        _ => ("gradient_conditional_family_below_minimum", "only "),
                    };
                    let without = pick(&|g| !matches!(g, Gradient::Present(_)));
                    out.push(Finding::gradient(
                        check,
                        Severity::Violation,
                        fam,
                        format!(
                            "family {} is declared {} (min_present {}) but {only}{present} of its {} parameters got a gradient; without one: {}",
                            fam.family,
                            fam.expectation.name(),
                            fam.min_present,
                            members.len(),
                            list(&without)
                        ),
                        without,
                    ));
                }
                Expectation::Inactive => {
                    let leaked = pick(&|g| *g != Gradient::Missing);
                    if !leaked.is_empty() {
                        let message = format!(
                            "family {} is declared inactive (frozen) but got gradients: {}",
                            fam.family,
                            list(&leaked)
                        );
                        out.push(Finding::gradient(
                            "gradient_inactive_family_leakage",
                            Severity::Violation,
                            fam,
                            message,
                            leaked,
                        ));
                    }
                }
                Expectation::DataConditional
                    if present == 0 && defaulted && !members.is_empty() && !any_non_finite =>
                {
                    out.push(Finding::gradient(
                        "gradient_family_without_gradient",
                        Severity::Note,
                        fam,
                        format!(
                            "family {} got no gradient ({}); its expectation defaulted to data_conditional, which allows that: declare it active if it should learn, frozen if it should not",
                            fam.family,
                            list(&members)
                        ),
                        members.clone(),
                    ));
                }
                _ => {}
            }
        }
        out
    }
}

/// Whether `family` is `prefix` or below it (`prefix.…`); `""` covers all.
fn under(family: &str, prefix: &str) -> bool {
    prefix.is_empty()
        || family == prefix
        || (family.len() > prefix.len()
            && family.starts_with(prefix)
            && family.as_bytes()[prefix.len()] == b'.')
}

fn list(ps: &[ParameterState]) -> String {
    ps.iter()
        .map(|p| format!("{} ({})", p.key, p.gradient.state_name()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The family of a parameter key: the key without its last `.`-component
/// (`encoder.layers.0.weight` → `encoder.layers.0`), or the key itself.
pub fn family_of(key: &str) -> &str {
    match key.rfind('.') {
        Some(i) if i > 0 => &key[..i],
        _ => key,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(items: &[(&str, Gradient)]) -> BTreeMap<(String, String), Gradient> {
        items
            .iter()
            .map(|(k, g)| (("vb".to_string(), k.to_string()), *g))
            .collect()
    }

    const KEYS: [&str; 5] = [
        "enc.0.weight",
        "enc.0.bias",
        "enc.1.weight",
        "norm.weight",
        "head.weight",
    ];

    #[test]
    fn builders_declare_the_families_they_name() {
        type Case = (
            &'static str,
            GradientContract,
            Vec<(&'static str, Expectation, u64)>,
        );
        let cases: Vec<Case> = vec![
            (
                "default",
                GradientContract::from_keys("vb", KEYS),
                vec![
                    ("enc.0", Expectation::DataConditional, 1),
                    ("enc.1", Expectation::DataConditional, 1),
                    ("norm", Expectation::DataConditional, 1),
                ],
            ),
            (
                "all active",
                GradientContract::from_keys("vb", KEYS).all_active(),
                vec![
                    ("enc.0", Expectation::Active, 2),
                    ("head", Expectation::Active, 1),
                ],
            ),
            (
                "prefix active",
                GradientContract::from_keys("vb", KEYS).active("enc"),
                vec![
                    ("enc.0", Expectation::Active, 2),
                    ("enc.1", Expectation::Active, 1),
                    ("norm", Expectation::DataConditional, 1),
                ],
            ),
            (
                "frozen",
                GradientContract::from_keys("vb", KEYS)
                    .all_active()
                    .frozen("enc.1"),
                vec![
                    ("enc.1", Expectation::Inactive, 0),
                    ("enc.0", Expectation::Active, 2),
                ],
            ),
            (
                "conditional",
                GradientContract::from_keys("vb", KEYS)
                    .all_active()
                    .data_conditional("norm"),
                vec![("norm", Expectation::DataConditional, 1)],
            ),
        ];
        for (name, c, want) in cases {
            assert!(c.check_builders().is_ok(), "{name}");
            assert_eq!(c.families.len(), 4, "{name}: one declaration per family");
            for (fam, exp, n) in want {
                assert_eq!(c.expectation_of(fam), Some((exp, n)), "{name}: {fam}");
            }
        }
    }

    #[test]
    fn a_prefix_is_whole_components_and_a_typo_is_refused() {
        let c = GradientContract::from_keys("vb", ["enc.weight", "enc2.weight"]).frozen("enc");
        assert_eq!(c.expectation_of("enc"), Some((Expectation::Inactive, 0)));
        assert_eq!(
            c.expectation_of("enc2"),
            Some((Expectation::DataConditional, 1))
        );
        let err = GradientContract::from_keys("vb", ["enc.weight"])
            .active("encoder")
            .check_builders()
            .unwrap_err();
        assert_eq!(err.to_string(), "candle-trace: gradient contract: prefix \"encoder\" names no family of the manifest; its families are enc [CT_ERR_INVALID_ARGUMENT]");
    }

    #[test]
    fn findings_follow_candle_graphs_family_rules() {
        let p = Gradient::Present(1.0);
        let m = Gradient::Missing;
        // enc.0 half present, enc.1 zero, norm missing, head present
        let r = rec(&[
            ("enc.0.weight", p),
            ("enc.0.bias", m),
            ("enc.1.weight", Gradient::Zero),
            ("norm.weight", m),
            ("head.weight", p),
        ]);
        type Want = (&'static str, &'static str, Severity, Vec<&'static str>);
        let cases: Vec<(&str, GradientContract, Vec<Want>)> = vec![
            (
                "default: notes for defaulted families without a gradient",
                GradientContract::from_keys("vb", KEYS),
                vec![
                    (
                        "gradient_family_without_gradient",
                        "enc.1",
                        Severity::Note,
                        vec!["enc.1.weight"],
                    ),
                    (
                        "gradient_family_without_gradient",
                        "norm",
                        Severity::Note,
                        vec!["norm.weight"],
                    ),
                ],
            ),
            (
                "all active",
                GradientContract::from_keys("vb", KEYS).all_active(),
                vec![
                    (
                        "gradient_active_family_below_minimum",
                        "enc.0",
                        Severity::Violation,
                        vec!["enc.0.bias"],
                    ),
                    (
                        "gradient_active_family_below_minimum",
                        "enc.1",
                        Severity::Violation,
                        vec!["enc.1.weight"],
                    ),
                    (
                        "gradient_active_family_below_minimum",
                        "norm",
                        Severity::Violation,
                        vec!["norm.weight"],
                    ),
                ],
            ),
            (
                "frozen leaks a zero gradient; declared conditional is quiet",
                GradientContract::from_keys("vb", KEYS)
                    .frozen("enc")
                    .data_conditional("norm"),
                vec![
                    (
                        "gradient_inactive_family_leakage",
                        "enc.0",
                        Severity::Violation,
                        vec!["enc.0.weight"],
                    ),
                    (
                        "gradient_inactive_family_leakage",
                        "enc.1",
                        Severity::Violation,
                        vec!["enc.1.weight"],
                    ),
                ],
            ),
            (
                "conditional below its minimum",
                GradientContract::from_keys("vb", KEYS).family(
                    "enc.0",
                    Expectation::DataConditional,
                    2,
                ),
                vec![
                    (
                        "gradient_conditional_family_below_minimum",
                        "enc.0",
                        Severity::Violation,
                        vec!["enc.0.bias"],
                    ),
                    (
                        "gradient_family_without_gradient",
                        "enc.1",
                        Severity::Note,
                        vec!["enc.1.weight"],
                    ),
                    (
                        "gradient_family_without_gradient",
                        "norm",
                        Severity::Note,
                        vec!["norm.weight"],
                    ),
                ],
            ),
        ];
        for (name, c, want) in cases {
            let got: Vec<_> = c
                .findings(&r)
                .into_iter()
                .map(|f| {
                    (
                        f.check,
                        f.family.clone().unwrap(),
                        f.severity,
                        f.parameters
                            .iter()
                            .map(|p| p.key.clone())
                            .collect::<Vec<_>>(),
                    )
                })
                .collect();
            let want: Vec<_> = want
                .into_iter()
                .map(|(c, f, s, ps)| {
                    (
                        c,
                        f.to_string(),
                        s,
                        ps.into_iter().map(String::from).collect::<Vec<_>>(),
                    )
                })
                .collect();
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn a_non_finite_gradient_is_a_violation_under_any_expectation() {
        let r = rec(&[("head.weight", Gradient::NonFinite)]);
        let f = GradientContract::from_keys("vb", ["head.weight"]).findings(&r);
        assert_eq!(
            f.len(),
            1,
            "the non-finite finding alone, no note besides: {f:?}"
        );
        assert_eq!(
            (f[0].check, f[0].severity),
            ("gradient_family_non_finite", Severity::Violation)
        );
        assert_eq!(
            f[0].message,
            "family head: non-finite gradient in head.weight (non_finite)"
        );
    }
}
