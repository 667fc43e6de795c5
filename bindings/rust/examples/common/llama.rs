//! The llama2-c-style model of the `train_llama` example, shared with its
//! test and benchmark: the shape of candle's llama2-c training example
//! (`candle-transformers`' `llama2_c::Llama`, AdamW, cross-entropy on
//! synthetic tokens), its size a parameter ([`Config`]).
//!
//! As in the real `Llama`, the model is no `candle_nn::Module` and its
//! submodules are private, so no wrapper can be put around them from
//! outside: the model's code names its ops with [`trace_op`] and
//! [`TraceOps`] (names precomputed, so an untraced forward allocates nothing
//! more), and the captured update takes the heap with
//! [`candle_trace::heap::HeapCapture`] (the binary installs
//! `TracingAllocator`).
//!
//! The model finding the trace shows: `candle_nn::RmsNorm` runs a fused op
//! without backward on contiguous input (`apply_op2_no_bwd`), so the gradient
//! stops at the final norm and only `lm_head.weight` gets one, as in the real
//! example. The default gradient contract (every family `data_conditional`)
//! keeps the trace valid, and `finish()` reports the finding: a note per
//! family that got no gradient.
//!
//! Everything random comes from one splitmix64 stream seeded with 0: weights
//! ~ U(-1/sqrt(in), 1/sqrt(in)) (norm weights 1), then tokens uniform in the
//! vocabulary, `batch` rows of `seq_len + 1` per update (inputs and targets
//! shifted by one).
#![allow(dead_code)]
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, IndexOp, Tensor, D};
use candle_nn::{
    embedding, linear_no_bias, rms_norm, AdamW, Embedding, Linear, Optimizer, ParamsAdamW, RmsNorm,
    VarBuilder, VarMap,
};
use candle_trace::candle::{
    backward_step, capture_contract, named_vars, phase, trace_op, TraceOps,
};
use candle_trace::heap::{HeapCapture, HeapSummary};
use candle_trace::{Finding, Level, Run, Session, Step};

#[path = "rng.rs"]
mod rng;
pub use rng::Rng;

pub const ROOT: &str = "llama";
pub const UPDATE: &str = "train/update";
pub const LABELS: [&str; 3] = ["train/forward", "train/backward", "train/optimizer"];
pub const CAPTURE_STEP: u64 = 3;
pub const LR: f64 = 1e-3;
/// The family of the one parameter a gradient reaches (in the bench's
/// candle-graph contract).
pub const HEAD_FAMILY: &str = "lm_head";
/// The family of the parameters behind `candle_nn::RmsNorm`.
pub const DETACHED_FAMILY: &str = "behind_rms_norm";

/// The model's size, as llama2-c's `Config`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Config {
    pub dim: usize,
    pub hidden_dim: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub vocab_size: usize,
    pub seq_len: usize,
    pub norm_eps: f64,
}

impl Config {
    /// llama2-c's `Config::tiny_15m` (15 M parameters).
    pub fn tiny_15m() -> Config {
        Config {
            dim: 288,
            hidden_dim: 768,
            n_layers: 6,
            n_heads: 6,
            n_kv_heads: 6,
            vocab_size: 32000,
            seq_len: 256,
            norm_eps: 1e-5,
        }
    }
    /// The benchmark's: tiny_15m's layers, a 4096-token vocabulary and 64
    /// positions (4.8 M parameters).
    pub fn small() -> Config {
        Config {
            vocab_size: 4096,
            seq_len: 64,
            ..Config::tiny_15m()
        }
    }
    /// The tests': 2 layers of 32 with grouped KV heads (4 query heads, 2 KV
    /// heads), vocabulary 64, 16 positions.
    pub fn test() -> Config {
        Config {
            dim: 32,
            hidden_dim: 64,
            n_layers: 2,
            n_heads: 4,
            n_kv_heads: 2,
            vocab_size: 64,
            seq_len: 16,
            norm_eps: 1e-5,
        }
    }
    /// `test`, `small` or `15m`.
    pub fn named(name: &str) -> Option<Config> {
        match name {
            "test" => Some(Config::test()),
            "small" => Some(Config::small()),
            "15m" => Some(Config::tiny_15m()),
            _ => None,
        }
    }
    pub fn head_dim(&self) -> usize {
        self.dim / self.n_heads
    }
}

/// RoPE tables: cos and sin of shape (seq_len, 1, head_dim/2, 1), to
/// broadcast over (batch, seq, heads, head_dim/2, 2).
struct Rope {
    cos: Tensor,
    sin: Tensor,
}

impl Rope {
    fn new(cfg: &Config, dev: &Device) -> candle_core::Result<Rope> {
        let half = cfg.head_dim() / 2;
        let theta: Vec<f32> = (0..half)
            .map(|i| 1.0 / 10000f32.powf(2.0 * i as f32 / cfg.head_dim() as f32))
            .collect();
        let theta = Tensor::new(theta, dev)?.reshape((1, half))?;
        let pos = Tensor::arange(0u32, cfg.seq_len as u32, dev)?
            .to_dtype(DType::F32)?
            .reshape((cfg.seq_len, 1))?;
        let freqs = pos.matmul(&theta)?.reshape((cfg.seq_len, 1, half, 1))?;
        Ok(Rope {
            cos: freqs.cos()?,
            sin: freqs.sin()?,
        })
    }

    /// Rotates interleaved pairs of x (batch, seq, heads, head_dim), as
    /// llama2_c's `apply_rotary_emb` does (differentiable ops only).
    fn apply(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let (b, seq, h, hd) = x.dims4()?;
        let (cos, sin) = (self.cos.i(..seq)?, self.sin.i(..seq)?);
        let x = x.reshape((b, seq, h, hd / 2, 2))?;
        let x0 = x.narrow(D::Minus1, 0, 1)?;
        let x1 = x.narrow(D::Minus1, 1, 1)?;
        let d0 = (x0.broadcast_mul(&cos)? - x1.broadcast_mul(&sin)?)?;
        let d1 = (x0.broadcast_mul(&sin)? + x1.broadcast_mul(&cos)?)?;
        Tensor::cat(&[&d0, &d1], D::Minus1)?.reshape((b, seq, h, hd))
    }
}

/// Op names of one block, built once.
struct Names {
    rms_1: String,
    q: String,
    k: String,
    v: String,
    rope_q: String,
    rope_k: String,
    scores: String,
    softmax: String,
    attend: String,
    o: String,
    rms_2: String,
    gate: String,
    up: String,
    swiglu: String,
    down: String,
}

impl Names {
    fn new(prefix: &str) -> Names {
        let n = |s: &str| format!("{prefix}.{s}");
        Names {
            rms_1: n("input_layernorm"),
            q: n("self_attn.q_proj"),
            k: n("self_attn.k_proj"),
            v: n("self_attn.v_proj"),
            rope_q: n("self_attn.rope_q"),
            rope_k: n("self_attn.rope_k"),
            scores: n("self_attn.scores"),
            softmax: n("self_attn.softmax"),
            attend: n("self_attn.attend"),
            o: n("self_attn.o_proj"),
            rms_2: n("post_attention_layernorm"),
            gate: n("mlp.gate_proj"),
            up: n("mlp.up_proj"),
            swiglu: n("mlp.swiglu"),
            down: n("mlp.down_proj"),
        }
    }
}

struct Block {
    rms_1: RmsNorm,
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    rms_2: RmsNorm,
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
    names: Names,
}

/// Repeats each KV head for its group of query heads: (b, kv, seq, hd) →
/// (b, kv * n_rep, seq, hd).
fn repeat_kv(x: Tensor, n_rep: usize) -> candle_core::Result<Tensor> {
    if n_rep == 1 {
        return Ok(x);
    }
    let (b, kv, seq, hd) = x.dims4()?;
    Tensor::cat(&vec![&x; n_rep], 2)?.reshape((b, kv * n_rep, seq, hd))
}

impl Block {
    fn new(cfg: &Config, vb: VarBuilder, prefix: &str) -> candle_core::Result<Block> {
        let (dim, kv_dim) = (cfg.dim, cfg.n_kv_heads * cfg.head_dim());
        let at = vb.pp("self_attn");
        let mlp = vb.pp("mlp");
        Ok(Block {
            rms_1: rms_norm(dim, cfg.norm_eps, vb.pp("input_layernorm"))?,
            q_proj: linear_no_bias(dim, dim, at.pp("q_proj"))?,
            k_proj: linear_no_bias(dim, kv_dim, at.pp("k_proj"))?,
            v_proj: linear_no_bias(dim, kv_dim, at.pp("v_proj"))?,
            o_proj: linear_no_bias(dim, dim, at.pp("o_proj"))?,
            rms_2: rms_norm(dim, cfg.norm_eps, vb.pp("post_attention_layernorm"))?,
            gate_proj: linear_no_bias(dim, cfg.hidden_dim, mlp.pp("gate_proj"))?,
            up_proj: linear_no_bias(dim, cfg.hidden_dim, mlp.pp("up_proj"))?,
            down_proj: linear_no_bias(cfg.hidden_dim, dim, mlp.pp("down_proj"))?,
            names: Names::new(prefix),
        })
    }

    fn forward(
        &self,
        x: &Tensor,
        cfg: &Config,
        rope: &Rope,
        mask: &Tensor,
    ) -> candle_core::Result<Tensor> {
        let n = &self.names;
        let (b, seq, dim) = x.dims3()?;
        let (h, kv, hd) = (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim());
        // Attention.
        let xs = x.traced_apply(&n.rms_1, &self.rms_1)?;
        let q = xs
            .traced_apply(&n.q, &self.q_proj)?
            .reshape((b, seq, h, hd))?;
        let k = xs
            .traced_apply(&n.k, &self.k_proj)?
            .reshape((b, seq, kv, hd))?;
        let v = xs
            .traced_apply(&n.v, &self.v_proj)?
            .reshape((b, seq, kv, hd))?;
        let q = q
            .traced(&n.rope_q, |q| rope.apply(q))?
            .transpose(1, 2)?
            .contiguous()?;
        let k = k
            .traced(&n.rope_k, |k| rope.apply(k))?
            .transpose(1, 2)?
            .contiguous()?;
        let v = v.transpose(1, 2)?.contiguous()?;
        let (k, v) = (repeat_kv(k, h / kv)?, repeat_kv(v, h / kv)?);
        let kt = k.t()?;
        let att = trace_op(&n.scores, &[&q, &kt], || {
            q.matmul(&kt)? / (hd as f64).sqrt()
        })?;
        let att = mask.broadcast_as(att.shape())?.where_cond(
            &Tensor::new(f32::NEG_INFINITY, x.device())?.broadcast_as(att.shape())?,
            &att,
        )?;
        let att = att.traced_softmax(&n.softmax, D::Minus1)?;
        let y = att
            .traced_matmul(&n.attend, &v)?
            .transpose(1, 2)?
            .reshape((b, seq, dim))?;
        let x = (y.traced_apply(&n.o, &self.o_proj)? + x)?;
        // SwiGLU MLP.
        let xs = x.traced_apply(&n.rms_2, &self.rms_2)?;
        let gate = xs.traced_apply(&n.gate, &self.gate_proj)?;
        let up = xs.traced_apply(&n.up, &self.up_proj)?;
        let act = trace_op(&n.swiglu, &[&gate, &up], || {
            candle_nn::ops::silu(&gate)? * &up
        })?;
        act.traced_apply(&n.down, &self.down_proj)? + x
    }
}

/// llama2-c's `Llama` in shape: token embedding, blocks, final RmsNorm, LM
/// head. No `Module`: `forward` is its own, its parts private.
pub struct Llama {
    cfg: Config,
    wte: Embedding,
    blocks: Vec<Block>,
    ln_f: RmsNorm,
    lm_head: Linear,
    rope: Rope,
    mask: Tensor,
}

impl Llama {
    pub fn new(cfg: Config, vb: VarBuilder) -> candle_core::Result<Llama> {
        let dev = vb.device().clone();
        let m = vb.pp("model");
        let blocks = (0..cfg.n_layers)
            .map(|i| {
                Block::new(
                    &cfg,
                    m.pp(format!("layers.{i}")),
                    &format!("model.layers.{i}"),
                )
            })
            .collect::<candle_core::Result<_>>()?;
        let mask: Vec<u8> = (0..cfg.seq_len)
            .flat_map(|i| (0..cfg.seq_len).map(move |j| u8::from(j > i)))
            .collect();
        Ok(Llama {
            wte: embedding(cfg.vocab_size, cfg.dim, m.pp("embed_tokens"))?,
            blocks,
            ln_f: rms_norm(cfg.dim, cfg.norm_eps, m.pp("norm"))?,
            lm_head: linear_no_bias(cfg.dim, cfg.vocab_size, vb.pp("lm_head"))?,
            rope: Rope::new(&cfg, &dev)?,
            mask: Tensor::from_vec(mask, (cfg.seq_len, cfg.seq_len), &dev)?,
            cfg,
        })
    }

    /// Logits (batch, seq, vocab) of tokens (batch, seq).
    pub fn forward(&self, tokens: &Tensor) -> candle_core::Result<Tensor> {
        let (_, seq) = tokens.dims2()?;
        let mask = self.mask.i((..seq, ..seq))?;
        let mut x = tokens.traced_apply("model.embed_tokens", &self.wte)?;
        for block in &self.blocks {
            x = block.forward(&x, &self.cfg, &self.rope, &mask)?;
        }
        x.traced_apply("model.norm", &self.ln_f)?
            .traced_apply("lm_head", &self.lm_head)
    }
}

pub struct Setup {
    pub cfg: Config,
    pub batch: usize,
    pub device: Device,
    pub varmap: VarMap,
    pub model: Llama,
    pub opt: AdamW,
    pub rng: Rng,
}

/// The model of `cfg`, its weights drawn from the stream, and AdamW (lr
/// 1e-3, candle's other defaults) over all its variables.
pub fn setup(cfg: Config, batch: usize) -> candle_core::Result<Setup> {
    let device = Device::Cpu;
    let mut varmap = VarMap::new();
    let model = Llama::new(cfg, VarBuilder::from_varmap(&varmap, DType::F32, &device))?;
    let mut rng = Rng::new(0);
    for (name, var) in named_vars(&varmap) {
        if name.ends_with("norm.weight") {
            continue;
        }
        let dims = var.dims().to_vec();
        let scale = 1.0 / (*dims.last().unwrap_or(&1) as f32).sqrt();
        let v: Vec<f32> = (0..var.elem_count())
            .map(|_| rng.uniform() * scale)
            .collect();
        varmap.set_one(&name, &Tensor::from_vec(v, dims, &device)?)?;
    }
    let opt = AdamW::new(
        varmap.all_vars(),
        ParamsAdamW {
            lr: LR,
            ..ParamsAdamW::default()
        },
    )?;
    Ok(Setup {
        cfg,
        batch,
        device,
        varmap,
        model,
        opt,
        rng,
    })
}

/// The next synthetic batch: tokens (batch, seq_len) and their successors,
/// both u32.
pub fn batch(s: &mut Setup) -> candle_core::Result<(Tensor, Tensor)> {
    let (b, seq) = (s.batch, s.cfg.seq_len);
    let v: Vec<u32> = (0..b * (seq + 1))
        .map(|_| (s.rng.next_u64() % s.cfg.vocab_size as u64) as u32)
        .collect();
    let all = Tensor::from_vec(v, (b, seq + 1), &s.device)?;
    Ok((all.narrow(1, 0, seq)?, all.narrow(1, 1, seq)?))
}

fn loss_of(logits: &Tensor, y: &Tensor) -> candle_core::Result<Tensor> {
    candle_nn::loss::cross_entropy(&logits.flatten_to(1)?, &y.flatten_to(1)?)
}

/// One plain update, untraced: the same arithmetic as the captured one.
pub fn plain_update(s: &mut Setup, x: &Tensor, y: &Tensor) -> candle_core::Result<f32> {
    let loss = loss_of(&s.model.forward(x)?, y)?;
    s.opt.backward_step(&loss)?;
    loss.to_scalar::<f32>()
}

pub fn run_description(s: &Setup) -> Run {
    let c = &s.cfg;
    Run::training("llama2_c::train", CAPTURE_STEP, "cpu")
        .tag("example", "rust")
        .tag(
            "model",
            format!(
                "llama2-c dim {} hidden {} layers {} heads {}/{} vocab {} seq {}",
                c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size, c.seq_len
            ),
        )
        .tag("batch", s.batch.to_string())
        .capture_contract(
            capture_contract(ROOT, &s.varmap)
                .logical_memory(Level::Partial)
                .required_labels(LABELS),
        )
}

/// What one captured update gave.
#[derive(Debug, Clone, Copy)]
pub struct Captured {
    pub loss: f32,
    pub heap: HeapSummary,
}

/// The captured update: the measured region `train/update` holding the heap
/// capture and the three phases — `train/forward` (the model's op spans, the
/// logits' stats, the loss), `train/backward`, the gradient facts and
/// `train/optimizer` ([`backward_step`]).
pub fn captured_update(
    session: &Session,
    s: &mut Setup,
    x: &Tensor,
    y: &Tensor,
) -> candle_trace::Result<Captured> {
    let update = session.measure(UPDATE)?;
    let heap = HeapCapture::start(session, &update)?;
    let loss = {
        let fwd = phase(session, LABELS[0], Step::Forward)?;
        let logits = s.model.forward(x)?;
        let loss = loss_of(&logits, y)?;
        session.record_tensor_stats(&fwd, "logits", &logits)?;
        let value = loss.to_scalar::<f32>()?;
        session.scalar(&fwd, "loss", value as f64)?;
        (loss, value)
    };
    backward_step(session, &mut s.opt, &loss.0, ROOT, &s.varmap)?;
    let heap = heap.finish()?;
    update.end()?;
    Ok(Captured { loss: loss.1, heap })
}

/// What [`train`] gave: the trace, the capture's heap summary, what
/// `finish()` found, and every update's loss.
#[derive(Debug)]
pub struct Trained {
    pub path: PathBuf,
    pub heap: HeapSummary,
    pub findings: Vec<Finding>,
    pub losses: Vec<f32>,
}

/// Trains `steps` updates of `cfg` at `batch` and captures update 3 into
/// `out`.
pub fn train(
    out: &Path,
    cfg: Config,
    batch_size: usize,
    steps: u64,
) -> candle_trace::Result<Trained> {
    assert!(steps >= CAPTURE_STEP);
    let mut s = setup(cfg, batch_size)?;
    let mut losses = Vec::new();
    let mut written = None;
    for step in 1..=steps {
        let (x, y) = batch(&mut s)?;
        if step == CAPTURE_STEP {
            let session = Session::open(out, run_description(&s))?;
            let c = captured_update(&session, &mut s, &x, &y)?;
            losses.push(c.loss);
            let (path, findings) = session.finish()?.into_parts();
            written = Some((path, c.heap, findings));
        } else {
            losses.push(plain_update(&mut s, &x, &y)?);
        }
    }
    let (path, heap, findings) = written.expect("capture step reached");
    Ok(Trained {
        path,
        heap,
        findings,
        losses,
    })
}
